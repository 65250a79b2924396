"""The ``"postgres"`` rate-limit backend, which also runs on SQLite.

Each operation is one transaction: upsert-and-lock the bucket row (reading the store's
clock in the same statement), decide with :mod:`taskq.ratelimit._algorithms`, write back.
Postgres serialises on the row lock; SQLite on its write lock (``BEGIN IMMEDIATE``).
GCRA keeps its theoretical arrival time as whole microseconds in ``tat`` plus the remainder (in
``1/limit`` microseconds) in ``tokens``.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

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
    "sql_gcra",
    "sql_log",
    "sql_now_us",
    "sql_publish",
    "sql_read",
    "sql_reset",
    "sql_token_bucket",
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


async def sql_token_bucket(
    engine: AsyncEngine, name: str, *, capacity: float, rate: float, count: float, refund: bool
) -> tuple[bool, float, float | None]:
    """Take (or, with ``refund``, give back) ``count`` tokens: ``(allowed, tokens, retry_us)``."""
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
        if refund:
            cur = tb_step(
                tokens, ts_us, now_us, capacity=capacity, rate=rate, count=0.0, consume=False
            )
            left = min(capacity, cur.tokens + count)
            await conn.execute(
                q.bucket_store(),
                q.bucket_store_params(name, tokens=left, updated_at=from_us(cur.ts_us), tat=None),
            )
            return True, left, 0.0
        result = tb_step(tokens, ts_us, now_us, capacity=capacity, rate=rate, count=count)
        if result.allowed:
            await conn.execute(
                q.bucket_store(),
                q.bucket_store_params(
                    name, tokens=result.tokens, updated_at=from_us(result.ts_us), tat=None
                ),
            )
        return result.allowed, result.tokens, result.retry_after_us


async def sql_gcra(
    engine: AsyncEngine, name: str, *, limit: int, window_us: int
) -> tuple[bool, float, float]:
    """One GCRA acquire: ``(allowed, remaining, retry_us)``."""
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
            request_id = str(uuid.uuid4())
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
