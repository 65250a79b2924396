"""An actor limited by an in-process (``backend="memory"``) token bucket, in a real worker.

The memory backend reads a clock passed to ``acquire``; the worker passes the system clock
(Redis and SQL primitives ignore it and use the store's). Without it every attempt of
such an actor failed with "pass clock=". The dispatcher claims only what the bucket
admits, so the backlog waits without attempts.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel
from sqlalchemy import select
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncEngine

from taskq.actor import actor
from taskq.backends.sql import SqlBackend
from taskq.client import JobsClient
from taskq.db.tables import job_attempts, jobs
from taskq.ratelimit import RateLimitRegistry, TokenBucket
from tests.support.workers import running_worker, wait_until, worker_settings

LIMIT = TokenBucket("memrl.limit", capacity=2, refill_per_second=20, backend="memory")


class Item(BaseModel):
    n: int


@actor(name="memrl_limited", rate_limits=[LIMIT])
async def limited(payload: Item) -> None:
    return None


async def _outcomes(engine: AsyncEngine) -> list[Any]:
    async with engine.connect() as conn:
        return list(
            (await conn.execute(select(job_attempts.c.outcome, job_attempts.c.error_class))).all()
        )


async def test_memory_token_bucket_admits_in_a_worker_without_churn(
    engine: AsyncEngine, engine_url: str | URL
) -> None:
    client = JobsClient(SqlBackend(engine))
    total = 8
    for n in range(total):
        await client.enqueue(limited, Item(n=n))

    async def done() -> bool:
        async with engine.connect() as conn:
            rows = (await conn.execute(select(jobs.c.status))).scalars().all()
        return sum(1 for s in rows if s == "succeeded") == total

    settings = worker_settings(engine_url, max_concurrency=10)
    async with running_worker(
        settings, {limited.name: limited}, rate_limit_registry=RateLimitRegistry()
    ):
        await wait_until(done, timeout=30)
    outcomes = await _outcomes(engine)
    # 8 jobs through a bucket of 2: held back, never run and denied (one attempt each).
    assert [o for o, _ in outcomes] == ["succeeded"] * total
    async with engine.connect() as conn:
        attempts = (await conn.execute(select(jobs.c.attempt))).scalars().all()
    assert list(attempts) == [1] * total
