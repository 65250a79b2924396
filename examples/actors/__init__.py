"""A toy fleet organised by feature domain, one runnable module per domain.

Each module's docstring names the feature and what to observe. Run one with
``python -m examples.actors.basic`` (the embedded SQLite file ``./taskq.db`` by default;
``--database-url`` or ``TASKQ_DATABASE_URL`` for Postgres, ``TASKQ_REDIS_URL`` to add
Redis): it enqueues its jobs, drains them with a real worker in the same process and
prints what the store recorded. ``examples/actors/README.md`` lists them all.
"""
