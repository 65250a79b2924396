"""A worker process whose actor writes through the job's transaction (``python -m`` it).

``tx_parent`` inserts one ``app_rows`` row through its injected ``AsyncConnection``,
enqueues two ``tx_child`` jobs through ``ctx.jobs``, sleeps ``seconds`` (the window a
``kill -9`` lands in) and raises when ``fail`` is set. The DI registry registers an
``AsyncConnection`` at ``Scope.LOOP`` from a plain ``create_async_engine`` on
``TASKQ_DATABASE_URL``: the activation signal of the job's transaction.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator
from datetime import timedelta

from pydantic import BaseModel
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, create_async_engine

from taskq import actor
from taskq.context import JobContext
from taskq.db.dialect import async_url
from taskq.di import ProviderRegistry, Scope
from taskq.retry import RetryPolicy

APP_TABLE = "CREATE TABLE IF NOT EXISTS app_rows (job_id VARCHAR(36) NOT NULL, n INTEGER NOT NULL)"


class Parent(BaseModel):
    n: int
    fail: bool = False
    seconds: float = 0.0


class Child(BaseModel):
    n: int


class Refused(ValueError):
    """What a failing parent raises (never retried)."""


@actor(name="e2e_tx_child")
async def tx_child(payload: Child) -> None: ...


@actor(
    name="e2e_tx_parent",
    retry=RetryPolicy(max_attempts=5, base=timedelta(milliseconds=20), jitter=0),
    non_retryable_exceptions=(Refused,),
)
async def tx_parent(payload: Parent, ctx: JobContext[Parent], *, conn: AsyncConnection) -> None:
    await conn.execute(
        text("INSERT INTO app_rows (job_id, n) VALUES (:job, :n)"),
        {"job": str(ctx.job_id), "n": payload.n},
    )
    assert ctx.jobs is not None
    await ctx.jobs.enqueue(tx_child, Child(n=payload.n * 2))
    await asyncio.sleep(payload.seconds)
    await ctx.jobs.enqueue(tx_child, Child(n=payload.n * 2 + 1))
    if payload.fail:
        raise Refused(f"parent {payload.n} fails after writing")


def registry() -> ProviderRegistry:
    """The DI registry: an ``AsyncConnection`` at ``Scope.LOOP`` on a plain engine."""

    async def connection() -> AsyncIterator[AsyncConnection]:
        engine = create_async_engine(async_url(os.environ["TASKQ_DATABASE_URL"]))
        try:
            async with engine.connect() as conn:
                yield conn
        finally:
            await engine.dispose()

    providers = ProviderRegistry()
    providers.register_factory(AsyncConnection, Scope.LOOP, connection)
    return providers


def main() -> int:
    from taskq.worker.run import worker_main

    return worker_main(actor_registry=[tx_parent, tx_child], di_registry=registry())


if __name__ == "__main__":
    sys.exit(main())
