# sync twin: src/taskq_sync/backends/__init__.py
