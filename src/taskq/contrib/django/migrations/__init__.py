"""Django migrations of the ``taskq`` app: they run taskq's own schema migrations."""
