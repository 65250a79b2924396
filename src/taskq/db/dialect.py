"""The few places where Postgres and SQLite differ, isolated in one module.

Everything else in taskq builds the same SQLAlchemy Core statements for both engines.
Here: URL normalisation, engine options, the SQLite connection setup (WAL, busy timeout,
``BEGIN IMMEDIATE``, the rollback of a connection the pool closes mid-transaction), the
Postgres idle-connection ping, the store's clock, upserts, advisory locks and the
translation of driver errors into taskq's (:func:`translate_error`: a missing table is
:class:`~taskq.exceptions.SchemaNotReady`, an unreachable store
:class:`~taskq.exceptions.StoreUnavailable`).
"""

from __future__ import annotations

import re
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

import aiosqlite
import psycopg
import structlog
from sqlalchemy import Engine, Float, event, func, literal, literal_column, select, text
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import URL, ExceptionContext, make_url
from sqlalchemy.exc import DBAPIError, DisconnectionError
from sqlalchemy.pool import ConnectionPoolEntry, StaticPool
from sqlalchemy.sql.elements import ColumnElement

from taskq._compat import aiosqlite as compat_aiosqlite
from taskq._compat import sqlalchemy as compat_sqlalchemy
from taskq.exceptions import SchemaNotReady, StoreUnavailable, TaskQError
from taskq.settings import TaskQSettings

__all__ = [
    "IDLE_PING_AFTER_S",
    "IDLE_SINCE_OVERRIDE",
    "READONLY_OPTION",
    "Traits",
    "advisory_xact_lock",
    "async_url",
    "engine_options",
    "insert",
    "install_postgres_hooks",
    "install_sqlite_hooks",
    "is_postgres",
    "is_sqlite",
    "now",
    "now_plus",
    "schema_translate_map",
    "sync_url",
    "traits",
    "translate_error",
]

_log = structlog.get_logger("taskq.db")

READONLY_OPTION: Final = "taskq_readonly"
"""Execution option: on SQLite, begin a deferred (read) transaction instead of IMMEDIATE."""

_PG_DRIVER: Final = "postgresql+psycopg"

IDLE_PING_AFTER_S: Final = 10.0
"""A pooled Postgres connection idle at least this long is pinged before it is handed out."""

_IDLE_SINCE: Final = "taskq_idle_since"

IDLE_SINCE_OVERRIDE: Final = "taskq_idle_since_override"
"""Key of a connection's ``info``: when it really went idle, if that was before its checkin.

A connection that taskq kept checked out while idle (the plain enqueue's held
connections, ``taskq.backends.sql``) sets it before returning to the pool, so the idle
ping at the next checkout counts the time it sat unused outside the pool too."""


def _url(url: str | URL) -> URL:
    return make_url(url) if isinstance(url, str) else url


def is_postgres(url: str | URL) -> bool:
    """True when ``url`` names a PostgreSQL database."""
    return _url(url).get_backend_name() == "postgresql"


def is_sqlite(url: str | URL) -> bool:
    """True when ``url`` names a SQLite database."""
    return _url(url).get_backend_name() == "sqlite"


def _check_backend(u: URL) -> None:
    if u.get_backend_name() not in ("postgresql", "sqlite"):
        raise ValueError(
            f"unsupported database URL {u.render_as_string(hide_password=True)!r}: "
            "taskq runs on postgresql:// or sqlite://"
        )


def async_url(url: str | URL) -> URL:
    """The URL for the asyncio engine: psycopg 3 for Postgres, aiosqlite for SQLite.

    A plain ``postgresql://`` means ``postgresql+psycopg://``.
    """
    u = _url(url)
    _check_backend(u)
    if is_postgres(u):
        return u.set(drivername=_PG_DRIVER)
    return u.set(drivername="sqlite+aiosqlite")


def sync_url(url: str | URL) -> URL:
    """The URL for the blocking engine: psycopg 3 for Postgres, pysqlite for SQLite."""
    u = _url(url)
    _check_backend(u)
    if is_postgres(u):
        return u.set(drivername=_PG_DRIVER)
    return u.set(drivername="sqlite+pysqlite")


@dataclass(frozen=True, slots=True)
class Traits:
    """What an engine can do. Services ask about abilities here, never about engine names."""

    notify: bool
    """``LISTEN/NOTIFY`` wakes workers when a job is enqueued (otherwise they poll)."""
    document_batches: bool
    """One statement carries many rows as one JSON document (``jsonb_to_recordset``)."""
    autocommit_statements: bool
    """A one-statement operation may run in autocommit on the driver connection; row locks
    taken inside the statement serialise it. (SQLite needs ``BEGIN IMMEDIATE`` instead.)"""
    insert_chunk: int
    """Rows per multi-row ``INSERT``, under the engine's bind-parameter limit."""


_TRAITS: Final = {
    "postgresql": Traits(
        notify=True, document_batches=True, autocommit_statements=True, insert_chunk=1000
    ),
    "sqlite": Traits(
        notify=False, document_batches=False, autocommit_statements=False, insert_chunk=400
    ),
}


def traits(dialect_name: str) -> Traits:
    """The :class:`Traits` of the engine whose SQLAlchemy dialect is ``dialect_name``."""
    return _TRAITS[dialect_name]


def schema_translate_map(url: str | URL, schema: str) -> dict[str | None, str | None]:
    """Where unqualified taskq tables live: ``schema`` on Postgres; SQLite has no schemas."""
    return {None: schema} if is_postgres(url) else {}


def _sqlite_memory(u: URL) -> bool:
    return u.database in (None, "", ":memory:") or "mode=memory" in str(u)


def engine_options(url: str | URL, settings: TaskQSettings) -> dict[str, Any]:
    """Keyword arguments for ``create_engine``/``create_async_engine`` on this URL."""
    u = _url(url)
    translate = schema_translate_map(u, settings.schema_name)
    options: dict[str, Any] = {"execution_options": {"schema_translate_map": translate}}
    if is_postgres(u):
        # No pool_pre_ping: it costs a round trip on every checkout, doubling the cost of
        # a one-statement enqueue. install_postgres_hooks pings only idle connections.
        options.update(pool_size=settings.pool_size, max_overflow=settings.pool_size)
    elif _sqlite_memory(u):
        options.update(poolclass=StaticPool, connect_args={"check_same_thread": False})
    else:
        # Keep connections open: opening one (and, under aiosqlite, its thread) plus the
        # PRAGMAs of install_sqlite_hooks costs more than an enqueue; with NullPool a
        # single enqueue ran at ~80/s, pooled at ~700/s. Pooled connections hold no lock or
        # read snapshot between transactions (the pool rolls back on return), so keeping
        # them open changes nothing for other processes on the file. No overflow limit:
        # like NullPool, a burst never waits for a pooled connection (a checkout that
        # waited on the pool while the holders wait on the write lock could stall).
        options.update(
            pool_size=settings.pool_size,
            max_overflow=-1,
            connect_args={"check_same_thread": False},
        )
    return options


def install_sqlite_hooks(engine: Engine, busy_timeout_ms: int) -> None:
    """Make a SQLite engine safe for several writers: WAL, busy timeout, BEGIN IMMEDIATE.

    The driver's own transaction handling is switched off so that SQLAlchemy's ``begin``
    event can issue ``BEGIN IMMEDIATE``: the write lock is taken at the start of the
    transaction, so two writers never deadlock upgrading a read lock. Connections marked
    with the :data:`READONLY_OPTION` execution option begin a deferred transaction.

    A connection the pool closes in the middle of a transaction gives the write lock back
    at once (:func:`_install_sqlite_release`).
    """

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: ConnectionPoolEntry) -> None:
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
        cursor.execute("PRAGMA journal_mode = WAL")
        cursor.execute("PRAGMA synchronous = NORMAL")
        cursor.execute("PRAGMA foreign_keys = ON")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        readonly = conn.get_execution_options().get(READONLY_OPTION, False)
        conn.exec_driver_sql("BEGIN" if readonly else "BEGIN IMMEDIATE")

    _install_sqlite_release(engine)


def _install_sqlite_release(engine: Engine) -> None:
    """Roll back, before the pool closes it, a SQLite connection still in a transaction.

    Why: a task cancelled while aiosqlite runs one of its statements (a caller's
    ``asyncio.timeout`` around an enqueue, the worker cancelling a job that awaits a
    SQL rate limit) makes SQLAlchemy invalidate the connection and close it, without
    closing the statement's cursor (it treats the cancellation as a disconnect). A
    row-returning statement (``INSERT ... RETURNING``, a ``SELECT``) is then left with
    its rows unread: the adapter's execute ran, its fetch never did. Since Python 3.11,
    ``sqlite3``'s ``close()`` does not finalise such a statement; the connection stays
    open behind it (``sqlite3_close_v2``'s "zombie") and SQLite ends its transaction
    only when it really closes, when the garbage collector frees the cursor. Until then
    the ``BEGIN IMMEDIATE`` transaction kept the database's write lock, and every other
    writer waited out the busy timeout (30 s) or failed with "database is locked". The
    same close of a connection with a result left unread (``Connection.invalidate()``)
    did the same on the blocking engine.

    What: on such an exit exception (``CancelledError``, ``KeyboardInterrupt``), the
    statement's cursor is closed (``handle_error``); whenever the pool closes a
    connection (``close``, ``close_detached``: invalidation, termination, recycling,
    disposal, garbage collection), its open transaction is rolled back first. On aiosqlite
    both run on the connection's own thread, queued ahead of the close SQLAlchemy queues
    there next, so they wait for a statement still running rather than racing it, and
    the event loop never waits for them. Nothing here raises: a failure is logged, and
    the close goes on as before.
    """

    @event.listens_for(engine, "handle_error")
    def _on_error(context: ExceptionContext) -> None:
        if isinstance(context.original_exception, Exception):
            return  # an ordinary error: SQLAlchemy closes the cursor itself
        # Not context.cursor: SQLAlchemy 2.1.9 never sets that slot (reading it raises).
        _close_cursor(getattr(context.execution_context, "cursor", None))

    @event.listens_for(engine, "close")
    def _on_close(dbapi_connection: Any, _record: ConnectionPoolEntry) -> None:
        _roll_back_before_close(dbapi_connection)

    @event.listens_for(engine, "close_detached")
    def _on_close_detached(dbapi_connection: Any) -> None:
        _roll_back_before_close(dbapi_connection)


def _close_cursor(cursor: Any) -> None:
    """Close the driver cursor of a statement an exit exception abandoned.

    pysqlite's cursor is closed here (the exception was raised on its thread, after the
    statement returned); aiosqlite's on the connection's thread (the statement may still
    be running there), without waiting. Closed, it no longer keeps a closed connection
    alive. Where ``taskq._compat`` cannot queue it, SQLAlchemy's own ``close()`` closes
    it after the statement in flight (the cancelled call then ends with it).
    """
    try:
        if isinstance(cursor, sqlite3.Cursor):
            cursor.close()
            return
        driver_cursor = compat_sqlalchemy.driver_cursor(cursor)
        if isinstance(driver_cursor, aiosqlite.Cursor):
            parts = compat_aiosqlite.cursor_parts(driver_cursor)
            if parts is not None:
                driver, sqlite_cursor = parts
                if compat_aiosqlite.call_soon(driver, _logged(lambda _c: sqlite_cursor.close())):
                    return
        if cursor is not None:
            cursor.close()
    except Exception as exc:  # never replace the exit exception in flight
        _log.warning("sqlite-cursor-close-failed", error=repr(exc))


def _roll_back_before_close(dbapi_connection: Any) -> None:
    """Roll back the transaction of a SQLite connection the pool is about to close.

    pysqlite: here. aiosqlite: on the connection's thread, ahead of the close, without
    waiting (``taskq._compat.aiosqlite``); where that cannot be queued, through
    SQLAlchemy's public ``AdaptedConnection.run_async``, which waits for the statement
    in flight first.
    """
    try:
        if isinstance(dbapi_connection, sqlite3.Connection):
            _roll_back(dbapi_connection)
            return
        driver = getattr(dbapi_connection, "driver_connection", None)
        queued = isinstance(driver, aiosqlite.Connection) and compat_aiosqlite.call_soon(
            driver, _logged(_roll_back)
        )
        if isinstance(driver, aiosqlite.Connection) and not queued:
            dbapi_connection.run_async(_roll_back_driver)
    except Exception as exc:  # the close must go on whatever happens here
        _log.warning("sqlite-rollback-before-close-failed", error=repr(exc))


async def _roll_back_driver(driver: aiosqlite.Connection) -> None:
    """End the aiosqlite connection's transaction (a no-op without one)."""
    await driver.rollback()


def _roll_back(connection: sqlite3.Connection) -> None:
    """End ``connection``'s transaction, if it has one; log (never raise) a failure."""
    try:
        if connection.in_transaction:
            connection.rollback()
    except Exception as exc:
        _log.warning("sqlite-rollback-before-close-failed", error=repr(exc))


def _logged(call: Callable[[sqlite3.Connection], object]) -> Callable[[sqlite3.Connection], None]:
    """``call``, reporting a failure in the log: on aiosqlite's thread nobody sees it raise."""

    def run(connection: sqlite3.Connection) -> None:
        try:
            call(connection)
        except Exception as exc:
            _log.warning("sqlite-release-on-close-failed", error=repr(exc))

    return run


def install_postgres_hooks(engine: Engine) -> None:
    """Ping a pooled Postgres connection at checkout only if it sat idle >= ``IDLE_PING_AFTER_S``.

    ``pool_pre_ping`` would ping on every checkout: one extra round trip per enqueue. The
    connections that are likely dead are the ones that sat unused (server restart, idle
    timeouts in a proxy or firewall), so those are pinged and, if dead, silently replaced
    (``DisconnectionError`` makes the pool reconnect). A connection that dies while in
    busy use is found by the statement that uses it: SQLAlchemy then invalidates the
    whole pool, and the caller sees the error unless it can retry safely (the plain
    enqueue can; see ``SqlBackend._enqueue_plain``). A connection returned with
    :data:`IDLE_SINCE_OVERRIDE` in its ``info`` counts as idle since that time.
    """
    dialect = engine.dialect

    @event.listens_for(engine, "checkin")
    def _on_checkin(_dbapi_connection: Any, record: ConnectionPoolEntry) -> None:
        since = record.info.pop(IDLE_SINCE_OVERRIDE, None)
        record.info[_IDLE_SINCE] = since if since is not None else time.monotonic()

    @event.listens_for(engine, "checkout")
    def _on_checkout(dbapi_connection: Any, record: ConnectionPoolEntry, _proxy: Any) -> None:
        since = record.info.get(_IDLE_SINCE)
        if since is None or time.monotonic() - since < IDLE_PING_AFTER_S:
            return
        try:
            dialect.do_ping(dbapi_connection)
        except dialect.loaded_dbapi.Error as exc:
            if dialect.is_disconnect(exc, dbapi_connection, None):
                raise DisconnectionError(str(exc)) from exc
            raise


def now(dialect_name: str) -> ColumnElement[Any]:
    """The store's clock as a SQL expression (Postgres ``clock_timestamp()``)."""
    if dialect_name == "postgresql":
        return func.clock_timestamp()
    return func.strftime("%Y-%m-%d %H:%M:%f", "now")


def now_plus(dialect_name: str, seconds: ColumnElement[Any] | float) -> ColumnElement[Any]:
    """The store's clock plus ``seconds`` (a float or a float SQL expression; may be negative)."""
    secs = literal(seconds, Float()) if isinstance(seconds, int | float) else seconds
    if dialect_name == "postgresql":
        zero: ColumnElement[Any] = literal_column("0")
        return func.clock_timestamp() + func.make_interval(zero, zero, zero, zero, zero, zero, secs)
    return func.strftime("%Y-%m-%d %H:%M:%f", "now", func.printf("%+.6f seconds", secs))


def insert(dialect_name: str, table: Any) -> Any:
    """An INSERT that supports ``on_conflict_do_update`` / ``on_conflict_do_nothing``."""
    if dialect_name == "postgresql":
        return postgresql.insert(table)
    return sqlite.insert(table)


def advisory_xact_lock(dialect_name: str, key: str) -> Any | None:
    """A transaction-scoped advisory lock on ``key``; ``None`` on SQLite.

    SQLite needs none: ``BEGIN IMMEDIATE`` already serialises every writer.
    """
    if dialect_name != "postgresql":
        return None
    return select(func.pg_advisory_xact_lock(func.hashtextextended(key, literal_column("0"))))


def set_local_search_path(schema: str) -> Any:
    """``search_path`` for the current transaction (used by migrations for reflection)."""
    return text("SELECT set_config('search_path', :path, true)").bindparams(path=schema)


_SQLITE_MISSING = re.compile(r"no such table: (?:\w+\.)?(\w+)")
_PG_MISSING = re.compile(r'relation "(?:[^"]+\.)?([^"]+)" does not exist')


_PG_UNAVAILABLE_STATES = frozenset({"57P01", "57P02", "57P03"})
"""Admin shutdown, crash shutdown, cannot connect now (besides class 08, connection errors)."""


def translate_error(exc: BaseException) -> BaseException:
    """The one place driver errors become taskq's: a missing table is
    :class:`SchemaNotReady`, a store that cannot be reached or dropped the connection is
    :class:`StoreUnavailable`; anything else is returned as it is.

    The storage layer's exits (:func:`taskq.db.engine.transaction`, the SQL backend and
    the SQL rate-limit statements) raise what this returns, chained to the driver error.
    """
    if not isinstance(exc, DBAPIError):
        return exc
    orig = exc.orig
    message = str(orig)
    sqlstate = getattr(orig, "sqlstate", None)
    match = _PG_MISSING.search(message) if sqlstate == "42P01" else _SQLITE_MISSING.search(message)
    error: TaskQError
    if match is not None:
        error = SchemaNotReady(match.group(1))
    elif _unavailable(exc, sqlstate):
        error = StoreUnavailable(message.strip() or type(orig).__name__)
    else:
        return exc
    error.__cause__ = exc
    return error


def _unavailable(exc: DBAPIError, sqlstate: object) -> bool:
    """Whether ``exc`` says the store is out of reach rather than refusing the statement."""
    if exc.connection_invalidated:  # SQLAlchemy saw a disconnect (and recycled the pool)
        return True
    orig = exc.orig
    if isinstance(sqlstate, str):
        return sqlstate.startswith("08") or sqlstate in _PG_UNAVAILABLE_STATES
    if isinstance(orig, psycopg.OperationalError):
        return True  # no SQLSTATE: the connection itself failed (refused, closed, lost)
    return isinstance(orig, sqlite3.OperationalError) and "unable to open" in str(orig)
