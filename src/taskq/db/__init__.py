# sync twin: src/taskq_sync/db/__init__.py
