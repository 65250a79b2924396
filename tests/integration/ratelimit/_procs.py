"""Entry points for the multi-process tests (importable by ``spawn`` children)."""

from __future__ import annotations

import asyncio
import os
import uuid
from multiprocessing.synchronize import Barrier
from typing import Literal

import redis.asyncio as aredis

from taskq.db.engine import make_engine
from taskq.exceptions import ReservationUnavailable
from taskq.ratelimit import ConcurrencyReservation, TokenBucket
from taskq.settings import TaskQSettings

_start: Barrier | None = None


def init(barrier: Barrier) -> None:
    """Pool initializer: every task waits here until all four processes are ready."""
    global _start
    _start = barrier


def _wait_for_peers() -> int:
    assert _start is not None
    _start.wait()
    return os.getpid()


async def _bucket(store: str, url: str, name: str, acquirers: int) -> int:
    settings = TaskQSettings.load(database_url=None, redis_url=None)
    backend: Literal["redis", "postgres"] = "redis" if store == "redis" else "postgres"
    tb = TokenBucket(name, capacity=10, refill_per_second=0, backend=backend)
    if store == "redis":
        client = aredis.Redis.from_url(url)
        kw: dict[str, object] = {"redis_client": client, "settings": settings}
    else:
        engine = make_engine(url, settings=settings)
        kw = {"pg_pool": engine, "settings": settings}
    try:
        decisions = await asyncio.gather(*(tb.acquire(**kw) for _ in range(acquirers)))  # type: ignore[arg-type]
    finally:
        if store == "redis":
            await client.aclose()
        else:
            await engine.dispose()
    return sum(d.allowed for d in decisions)


def bucket_worker(store: str, url: str, name: str, acquirers: int) -> tuple[int, int]:
    """Run ``acquirers`` concurrent acquires here: ``(pid, how many passed)``."""
    pid = _wait_for_peers()
    return pid, asyncio.run(_bucket(store, url, name, acquirers))


async def _slots(url: str, name: str, acquirers: int) -> list[int]:
    settings = TaskQSettings.load(database_url=None, redis_url=None)
    engine = make_engine(url, settings=settings)
    res = ConcurrencyReservation(name, slots=3, lease=60)

    async def one() -> int | None:
        try:
            return await res.acquire(uuid.uuid4(), uuid.uuid4(), engine)
        except ReservationUnavailable:
            return None

    try:
        got = await asyncio.gather(*(one() for _ in range(acquirers)))
    finally:
        await engine.dispose()
    return [g for g in got if g is not None]


def slots_worker(url: str, name: str, acquirers: int) -> tuple[int, list[int]]:
    """Run ``acquirers`` concurrent slot claims here: ``(pid, slots won)``."""
    pid = _wait_for_peers()
    return pid, asyncio.run(_slots(url, name, acquirers))
