# sync twin: src/taskq_sync/ratelimit/_sql.py
"""The ``"postgres"`` rate-limit backend, which also runs on SQLite.

On Postgres a token-bucket or GCRA acquire is ONE statement on an autocommit connection
(:func:`taskq.db.queries.ratelimit.tb_take_pg`): the row lock it takes serialises
concurrent acquirers, the maths runs in SQL on ``clock_timestamp()``, there is no
``BEGIN``/``COMMIT`` round trip, and the commit does not wait for a WAL flush (see the
builders for why that is safe for rate-limit state). Everything else (SQLite, the sliding-window log, refunds)
is one transaction: upsert-and-lock the bucket row (reading the store's clock in the same
statement), decide with :mod:`taskq.ratelimit._algorithms`, write back. SQLite serialises
on its write lock (``BEGIN IMMEDIATE``). GCRA keeps its theoretical arrival time as whole
microseconds in ``tat`` plus the remainder (in ``1/limit`` microseconds) in ``tokens``.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import psycopg
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.util import greenlet_spawn

from taskq._acompat import ASYNC
from taskq._ids import new_request_id
from taskq.db.dialect import traits, translate_error
from taskq.db.engine import transaction
from taskq.db.queries import ratelimit as q
from taskq.ratelimit._algorithms import (
    from_us,
    gcra_step,
    log_decide,
    tb_step,
    to_us,
)

__all__ = [
    "PgAutocommit",
    "sql_gcra",
    "sql_log",
    "sql_log_refund",
    "sql_now_us",
    "sql_publish",
    "sql_read",
    "sql_reset",
    "sql_token_bucket",
    "sql_token_bucket_refund",
]


async def _lock_row(
    conn: AsyncConnection,
    name: str,
    *,
    kind: str,
    capacity: float,
    refill_per_second: float,
    window_s: float | None,
) -> tuple[float | None, datetime | None, datetime, int]:
    """Lock (creating on first use) the row: ``(tokens, tat, updated_at, now_us)``.

    State stored under another kind (the name was reused for another algorithm) reads as
    fresh.
    """
    stmt = q.bucket_lock_upsert(conn.dialect.name)
    params = q.bucket_lock_params(
        name,
        kind=kind,
        capacity=capacity,
        refill_per_second=refill_per_second,
        window_s=window_s,
    )
    row = (await conn.execute(stmt, params)).one()
    if row.kind != kind:
        return None, None, row.updated_at, to_us(row.db_now)
    return row.tokens, row.tat, row.updated_at, to_us(row.db_now)


def _gcra_state(tokens: float | None, tat: datetime | None) -> tuple[int, int] | None:
    return None if tat is None or tokens is None else (to_us(tat), int(tokens))


class PgAutocommit:
    """The autocommit view of one engine, kept by a primitive across calls.

    ``engine.execution_options(isolation_level="AUTOCOMMIT")`` builds a new engine
    proxy (tens of microseconds), so each primitive keeps the one it made for the last
    engine it was given. Connections still come from (and go back to) the engine's pool
    on every call, with the pool's own checks.
    """

    __slots__ = ("_statements", "autocommit", "engine")

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine
        self.autocommit = engine.execution_options(isolation_level="AUTOCOMMIT")
        self._statements: dict[Any, tuple[str, dict[str, Any]]] = {}

    def statement(self, builder: Any, params: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        """``builder``'s SQL for this engine, and ``params`` with its constants added."""
        found = self._statements.get(builder)
        if found is None:
            translate = self.engine.get_execution_options().get("schema_translate_map")
            found = self._statements[builder] = q.pg_sql(builder, self.engine.dialect, translate)
        sql, constants = found
        return sql, {**constants, **params}


def pg_autocommit(cached: PgAutocommit | None, engine: AsyncEngine) -> PgAutocommit:
    """``cached`` when it belongs to ``engine``, else a new one."""
    if cached is not None and cached.engine is engine:
        return cached
    return PgAutocommit(engine)


async def _pg_take(
    ac: PgAutocommit, take: Any, first: Any, params: dict[str, Any]
) -> tuple[Any, ...]:
    """Run a one-statement acquire: ``take``, or ``first`` when the row does not exist yet.

    ``take`` updates nothing when there is no row; ``first`` then creates it (and decides),
    unless a concurrent first acquirer won the insert, in which case ``take`` runs again.
    """
    if ac.engine.dialect.driver != "psycopg":  # pragma: no cover - taskq always uses psycopg 3
        return await _pg_take_core(ac, take, first, params)
    # The pool's own connection, used through psycopg directly: SQLAlchemy's Connection
    # (its autocommit switch on checkout and return, its execution context and result
    # wrapper, each a greenlet switch in asyncio) cost more than the statement itself.
    # The pool's checkout hooks (the idle ping) still run.
    fairy = await ac.engine.raw_connection()
    driver: Any = fairy.driver_connection
    sql = ""
    sent: dict[str, Any] = {}
    try:
        await driver.set_autocommit(True)
        sql, sent = ac.statement(take, params)
        row = await (await driver.execute(sql, sent)).fetchone()
        while row is None:
            sql, sent = ac.statement(first, params)
            row = await (await driver.execute(sql, sent)).fetchone()
            if row is None:
                sql, sent = ac.statement(take, params)
                row = await (await driver.execute(sql, sent)).fetchone()
        await driver.set_autocommit(False)
    except BaseException as exc:
        # Whatever went wrong (a dead connection, a cancelled task with a reply unread,
        # an autocommit switch left on), this connection must not serve anyone else.
        if ASYNC:
            await greenlet_spawn(fairy.invalidate)
        else:
            fairy.invalidate()
        if isinstance(exc, psycopg.Error):
            error = DBAPIError.instance(sql, sent, exc, psycopg.Error, dialect=ac.engine.dialect)
            translated = translate_error(error)
            raise translated from (exc if translated is error else error)
        raise
    finally:
        if ASYNC:
            await greenlet_spawn(fairy.close)
        else:
            fairy.close()
    return tuple(row)


async def _pg_take_core(
    ac: PgAutocommit, take: Any, first: Any, params: dict[str, Any]
) -> tuple[Any, ...]:
    """:func:`_pg_take` through SQLAlchemy's Connection (a driver other than psycopg)."""
    try:
        async with ac.autocommit.connect() as conn:
            row = (await conn.exec_driver_sql(*ac.statement(take, params))).first()
            while row is None:
                row = (await conn.exec_driver_sql(*ac.statement(first, params))).first()
                if row is None:
                    row = (await conn.exec_driver_sql(*ac.statement(take, params))).first()
            return tuple(row)
    except DBAPIError as exc:
        translated = translate_error(exc)
        if translated is exc:
            raise
        raise translated from exc


async def sql_token_bucket(
    engine: AsyncEngine,
    name: str,
    *,
    capacity: float,
    rate: float,
    count: float,
    pg: PgAutocommit | None = None,
) -> tuple[bool, float, float | None]:
    """Take ``count`` tokens: ``(allowed, tokens, retry_us)``.

    One autocommit statement on Postgres (``pg`` caches the autocommit engine); one
    ``BEGIN IMMEDIATE`` transaction on SQLite.
    """
    if traits(engine.dialect.name).autocommit_statements:
        params = {"p_name": name, "p_capacity": capacity, "p_refill": rate, "p_count": count}
        allowed, cur, left, _ = await _pg_take(
            pg_autocommit(pg, engine), q.tb_take_pg, q.tb_first_pg, params
        )
        if allowed:
            return True, left, 0.0
        return False, cur, None if rate <= 0 else (count - cur) * 1_000_000 / rate
    async with transaction(engine) as conn:
        tokens, _, updated_at, now_us = await _lock_row(
            conn,
            name,
            kind="token_bucket",
            capacity=capacity,
            refill_per_second=rate,
            window_s=None,
        )
        ts_us = to_us(updated_at) if tokens is not None else None
        result = tb_step(tokens, ts_us, now_us, capacity=capacity, rate=rate, count=count)
        if result.allowed:
            await conn.execute(
                q.bucket_store(),
                q.bucket_store_params(
                    name, tokens=result.tokens, updated_at=from_us(result.ts_us), tat=None
                ),
            )
        return result.allowed, result.tokens, result.retry_after_us


async def sql_token_bucket_refund(
    engine: AsyncEngine, name: str, *, capacity: float, rate: float, count: float
) -> float:
    """Give ``count`` tokens back (capped at ``capacity``); returns the tokens now there.

    One transaction: lock the row, refill it to the store's clock as an acquire would,
    add the tokens, write it back. A bucket with no row is full: nothing to give back to.
    """
    async with transaction(engine) as conn:
        tokens, _, updated_at, now_us = await _lock_row(
            conn,
            name,
            kind="token_bucket",
            capacity=capacity,
            refill_per_second=rate,
            window_s=None,
        )
        if tokens is None:
            return capacity
        now = tb_step(
            tokens,
            to_us(updated_at),
            now_us,
            capacity=capacity,
            rate=rate,
            count=0.0,
            consume=False,
        )
        refilled = min(capacity, now.tokens + count)
        await conn.execute(
            q.bucket_store(),
            q.bucket_store_params(name, tokens=refilled, updated_at=from_us(now.ts_us), tat=None),
        )
        return refilled


async def sql_log_refund(engine: AsyncEngine, name: str, request_id: str) -> None:
    """Drop the window entry of one accepted log-style request (its refund)."""
    async with transaction(engine) as conn:
        await conn.execute(q.window_refund(name, request_id))


async def sql_gcra(
    engine: AsyncEngine,
    name: str,
    *,
    limit: int,
    window_us: int,
    pg: PgAutocommit | None = None,
) -> tuple[bool, float, float]:
    """One GCRA acquire: ``(allowed, remaining, retry_us)``.

    One autocommit statement on Postgres; one ``BEGIN IMMEDIATE`` transaction on SQLite.
    """
    if traits(engine.dialect.name).autocommit_statements:
        step_us, step_rem = divmod(window_us, limit)
        params = {
            "p_name": name,
            "p_limit": limit,
            "p_window_us": window_us,
            "p_step_us": step_us,
            "p_step_rem": step_rem,
            "p_window_s": window_us / 1e6,
        }
        allowed, value, _ = await _pg_take(
            pg_autocommit(pg, engine), q.gcra_take_pg, q.gcra_first_pg, params
        )
        if allowed:
            return True, value, 0.0
        return False, 0.0, value
    async with transaction(engine) as conn:
        rem, tat, _, now_us = await _lock_row(
            conn,
            name,
            kind="gcra",
            capacity=float(limit),
            refill_per_second=limit * 1e6 / window_us,
            window_s=window_us / 1e6,
        )
        result = gcra_step(_gcra_state(rem, tat), now_us, limit=limit, window_us=window_us)
        if result.allowed:
            await conn.execute(
                q.bucket_store(),
                q.bucket_store_params(
                    name,
                    tokens=float(result.tat_rem),
                    updated_at=from_us(now_us),
                    tat=from_us(result.tat_us),
                ),
            )
        return result.allowed, result.remaining, result.retry_after_us


async def sql_log(
    engine: AsyncEngine, name: str, *, limit: int, window_us: int
) -> tuple[bool, float, float, str | None]:
    """One log-style acquire: ``(allowed, remaining, retry_us, request_id)``."""
    async with transaction(engine) as conn:
        _, _, _, now_us = await _lock_row(
            conn,
            name,
            kind="log",
            capacity=float(limit),
            refill_per_second=0.0,
            window_s=window_us / 1e6,
        )
        now = from_us(now_us)
        cutoff = now - timedelta(microseconds=window_us)
        await conn.execute(q.window_evict(name, cutoff))
        count, oldest = (await conn.execute(q.window_stats(name, cutoff))).one()
        allowed, remaining, retry = log_decide(
            int(count),
            None if oldest is None else to_us(oldest),
            now_us,
            limit=limit,
            window_us=window_us,
        )
        request_id = None
        if allowed:
            request_id = new_request_id()
            await conn.execute(q.window_insert(name, request_id, now))
        return allowed, remaining, retry, request_id


async def sql_read(
    engine: AsyncEngine, name: str, kind: str
) -> tuple[float | None, int | None, tuple[int, int] | None, int]:
    """Stored state for peek, no lock: ``(tokens, updated_us, gcra_tat, now_us)``.

    Everything but ``now_us`` is ``None`` when there is no row of ``kind``.
    """
    async with transaction(engine, readonly=True) as conn:
        row = (await conn.execute(q.bucket_read(conn.dialect.name, name))).one_or_none()
        if row is None or row.kind != kind:
            now = (await conn.execute(q.now_only(conn.dialect.name))).scalar_one()
            return None, None, None, to_us(now)
        return (
            row.tokens,
            to_us(row.updated_at),
            _gcra_state(row.tokens, row.tat),
            to_us(row.db_now),
        )


async def sql_window_count(
    engine: AsyncEngine, name: str, window_us: int
) -> tuple[int, int | None, int]:
    """Entries inside the window for peek: ``(count, oldest_us, now_us)``."""
    async with transaction(engine, readonly=True) as conn:
        now = (await conn.execute(q.now_only(conn.dialect.name))).scalar_one()
        cutoff = now - timedelta(microseconds=window_us)
        count, oldest = (await conn.execute(q.window_stats(name, cutoff))).one()
        return int(count), None if oldest is None else to_us(oldest), to_us(now)


async def sql_now_us(engine: AsyncEngine) -> int:
    """The store's clock in microseconds since the epoch."""
    async with transaction(engine, readonly=True) as conn:
        return to_us((await conn.execute(q.now_only(conn.dialect.name))).scalar_one())


async def sql_reset(engine: AsyncEngine, name: str) -> None:
    """Delete the bucket row and its log entries (idempotent)."""
    async with transaction(engine) as conn:
        await conn.execute(q.bucket_delete(name))
        await conn.execute(q.window_delete_all(name))


async def sql_publish(engine: AsyncEngine, name: str, **columns: Any) -> None:
    """Insert the bucket's row if missing, so admin pages list it (state untouched)."""
    async with transaction(engine) as conn:
        await conn.execute(q.bucket_publish(conn.dialect.name, name, **columns))
