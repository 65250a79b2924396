"""The only places taskq reaches into another library's private attributes.

One module per library, each for something that library offers no public route to, with
a version guard (the versions its internals were checked against), a fallback to the
public path for any other version, and a test that fails when the library changes
(``tests/unit/test_compat.py``, ``tests/integration/ratelimit/test_redis_hot_path.py``). Everything else in taskq uses public APIs only
(``tests/unit/test_no_private_access.py`` checks it).

- :mod:`taskq._compat.aiosqlite`: a call queued on a connection's thread without waiting.
- :mod:`taskq._compat.sqlalchemy`: the driver cursor under SQLAlchemy's asyncio adapter.
- :mod:`taskq._compat.redis`: an asyncio command written without redis-py's per-write task.
"""
