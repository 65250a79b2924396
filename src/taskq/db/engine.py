# sync twin: src/taskq_sync/db/engine.py
"""Engines and transactions for the job store.

One URL serves both worlds: ``make_engine`` gives an ``AsyncEngine`` here and an
``Engine`` in ``taskq_sync`` (psycopg 3 drives both on Postgres; aiosqlite and pysqlite
on SQLite). ``transaction`` is the one way taskq opens a unit of work: it takes the
SQLite write lock up front and turns "table missing" into ``SchemaNotReady``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from sqlalchemy.engine import URL
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from taskq._acompat import ASYNC
from taskq.db.dialect import (
    READONLY_OPTION,
    async_url,
    engine_options,
    install_postgres_hooks,
    install_sqlite_hooks,
    is_sqlite,
    translate_error,
)
from taskq.settings import TaskQSettings

__all__ = ["make_engine", "transaction"]


def make_engine(
    url: str | URL | None = None, *, settings: TaskQSettings | None = None
) -> AsyncEngine:
    """Create an engine for ``url`` (default: ``TASKQ_DATABASE_URL`` or the embedded SQLite).

    The caller owns the engine and disposes of it.
    """
    settings = settings or TaskQSettings.load()
    raw = url if url is not None else settings.effective_database_url
    full_url = async_url(raw)
    engine = create_async_engine(full_url, **engine_options(full_url, settings))
    if is_sqlite(full_url):
        if ASYNC:
            install_sqlite_hooks(engine.sync_engine, settings.sqlite_busy_timeout_ms)
        else:
            install_sqlite_hooks(engine, settings.sqlite_busy_timeout_ms)
    elif ASYNC:
        install_postgres_hooks(engine.sync_engine)
    else:
        install_postgres_hooks(engine)
    return engine


@asynccontextmanager
async def transaction(
    engine: AsyncEngine, *, readonly: bool = False
) -> AsyncIterator[AsyncConnection]:
    """Open a connection in a transaction that commits on success and rolls back on error.

    ``readonly=True`` lets SQLite begin a deferred transaction so readers do not queue
    behind the write lock. Driver errors for a missing table surface as ``SchemaNotReady``.
    """
    bound = engine.execution_options(**{READONLY_OPTION: True}) if readonly else engine
    try:
        async with bound.begin() as conn:
            yield conn
    except DBAPIError as exc:
        translated = translate_error(exc)
        if translated is exc:
            raise
        raise translated from exc
