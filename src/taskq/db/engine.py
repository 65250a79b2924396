# sync twin: src/taskq_sync/db/engine.py
"""Engines and transactions for the job store.

One URL serves both worlds: ``make_engine`` gives an ``AsyncEngine`` here and an
``Engine`` in ``taskq_sync`` (psycopg 3 drives both on Postgres; aiosqlite and pysqlite
on SQLite). ``transaction`` is the one way taskq opens a unit of work: it takes the
SQLite write lock up front and turns "table missing" into ``SchemaNotReady``.

An engine or connection the user made carries no schema map: ``with_schema`` gives
taskq's view of such an engine (the same pool, the tables' schema mapped from settings or
an explicit ``schema=``), and ``on_schema`` runs taskq's statements on a caller's
connection under the map, restoring the connection's own options afterwards.
"""

from __future__ import annotations

import weakref
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

from sqlalchemy.engine import URL
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from taskq._acompat import ASYNC
from taskq.constants import SCHEMA_NAME_RE
from taskq.db.dialect import (
    READONLY_OPTION,
    async_url,
    engine_options,
    install_postgres_hooks,
    install_sqlite_hooks,
    is_sqlite,
    schema_translate_map,
    translate_error,
)
from taskq.db.fork import track_engine
from taskq.settings import TaskQSettings

__all__ = ["make_engine", "on_schema", "schema_map", "transaction", "with_schema"]


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
    track_engine(engine)  # a forked child gets a fresh pool (taskq.db.fork)
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


_TRANSLATE = "schema_translate_map"
_FROM_ENV = object()
"""The key of the view made with the environment's settings (no ``schema``, no ``settings``)."""
_BOUND: weakref.WeakKeyDictionary[AsyncEngine, dict[object, AsyncEngine | None]] = (
    weakref.WeakKeyDictionary()
)
"""Each engine's schema-bound views by schema, made once (``None``: the engine itself).
``execution_options`` builds a new engine proxy per call, and callers such as the
rate-limit primitives key their caches on the engine they are handed."""


def schema_map(
    engine: AsyncEngine, *, schema: str | None = None, settings: TaskQSettings | None = None
) -> Mapping[str | None, str | None]:
    """The ``schema_translate_map`` taskq's tables need on ``engine``.

    ``schema``, else ``settings.schema_name``, else the map the engine already carries
    (one from :func:`make_engine`, or one its owner set), else ``TASKQ_SCHEMA_NAME`` from
    the environment. SQLite has no schemas: an empty map.
    """
    if schema is None and settings is None:
        existing = engine.get_execution_options().get(_TRANSLATE)
        if existing is not None:
            return dict(existing)
    name = schema if schema is not None else (settings or TaskQSettings.load()).schema_name
    return schema_translate_map(engine.url, name)


def with_schema(
    engine: AsyncEngine, *, schema: str | None = None, settings: TaskQSettings | None = None
) -> AsyncEngine:
    """``engine`` as taskq uses it: its tables in ``schema`` (see :func:`schema_map`).

    The engine itself when it already maps them there (any engine :func:`make_engine`
    made with the same settings); otherwise a view of it with the map added through
    ``execution_options`` (same pool, same dialect; the user's engine is unchanged).
    Made once per engine and schema, so calling it on every operation is cheap. Works
    on an engine the user created with ``create_async_engine`` (``create_engine`` in
    ``taskq_sync``).
    """
    if schema is not None and (SCHEMA_NAME_RE.fullmatch(schema) is None or len(schema) > 63):
        raise ValueError(f"invalid schema name {schema!r}: must match {SCHEMA_NAME_RE.pattern}")
    key: object = (
        schema
        if schema is not None
        else (settings.schema_name if settings is not None else _FROM_ENV)
    )
    views = _BOUND.get(engine)
    if views is not None and key in views:
        found = views[key]
        return engine if found is None else found
    translate = schema_map(engine, schema=schema, settings=settings)
    current = engine.get_execution_options().get(_TRANSLATE)
    bound: AsyncEngine | None = None
    if dict(current or {}) != dict(translate):
        bound = engine.execution_options(**{_TRANSLATE: dict(translate)})
    _BOUND.setdefault(engine, {})[key] = bound
    return engine if bound is None else bound


@asynccontextmanager
async def on_schema(
    conn: AsyncConnection, translate: Mapping[str | None, str | None]
) -> AsyncIterator[AsyncConnection]:
    """Run taskq's statements on the caller's ``conn`` with taskq's schema map.

    A connection's execution options are changed in place (SQLAlchemy 2), so the map is
    set for the block and the connection's own value put back after it: the caller's
    statements keep whatever map (or none) they had. Nothing else of the connection
    (its transaction, its session state) is touched.
    """
    before: Any = _connection_options(conn).get(_TRANSLATE)
    if dict(before or {}) == dict(translate):
        yield conn
        return
    await conn.execution_options(**{_TRANSLATE: dict(translate)})
    try:
        yield conn
    finally:
        await conn.execution_options(**{_TRANSLATE: before})


def _connection_options(conn: AsyncConnection) -> Mapping[str, Any]:
    """The execution options set on ``conn`` (on its sync ``Connection`` in asyncio)."""
    if ASYNC:
        sync_conn = conn.sync_connection
        return sync_conn.get_execution_options() if sync_conn is not None else {}
    else:
        return conn.get_execution_options()
