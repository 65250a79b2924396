"""Transactional enqueue on a caller's connection, and a cross-process unique_for race."""

from __future__ import annotations

import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from pydantic import BaseModel
from sqlalchemy import func, select
from sqlalchemy.engine import URL

from taskq import TaskQ, actor
from taskq.db.engine import make_engine
from taskq.db.tables import jobs
from taskq.settings import TaskQSettings
from tests.support import producer


class Order(BaseModel):
    order_id: str


@actor(name="tx_actor")
async def tx_actor(payload: Order) -> None: ...


def _count_sync(url: str | URL, actor_name: str) -> int:
    from taskq_sync.db.engine import make_engine as make_sync_engine

    engine = make_sync_engine(url)
    with engine.connect() as conn:
        n = conn.execute(
            select(func.count()).select_from(jobs).where(jobs.c.actor == actor_name)
        ).scalar_one()
    engine.dispose()
    return int(n)


async def test_async_enqueue_joins_the_callers_transaction(
    engine_url: Any, settings: TaskQSettings
) -> None:
    engine = make_engine(engine_url, settings=settings)
    async with TaskQ(engine=engine, settings=settings) as tq:
        async with engine.connect() as conn:
            request = await conn.begin()
            handle = await tq.jobs.enqueue(tx_actor, Order(order_id="a"), connection=conn)
            assert handle.job_id is not None
            await request.rollback()  # the web request failed
        assert _count_sync(engine_url, "tx_actor") == 0

        async with engine.begin() as conn:
            await tq.jobs.enqueue(tx_actor, Order(order_id="b"), connection=conn)
            await tq.jobs.enqueue_many([(tx_actor, Order(order_id="c"))], connection=conn)
        assert _count_sync(engine_url, "tx_actor") == 2
    await engine.dispose()


def test_sync_enqueue_joins_the_callers_transaction(
    engine_url: Any, settings: TaskQSettings
) -> None:
    from taskq_sync import TaskQ as SyncTaskQ

    with SyncTaskQ(engine_url, settings=settings) as tq:
        with tq.engine.connect() as conn:
            request = conn.begin()
            tq.jobs.enqueue(tx_actor, Order(order_id="a"), connection=conn)
            request.rollback()
        assert _count_sync(engine_url, "tx_actor") == 0
        with tq.engine.begin() as conn:
            tq.jobs.enqueue(tx_actor, Order(order_id="b"), connection=conn)
        assert _count_sync(engine_url, "tx_actor") == 1


def test_unique_for_is_single_flight_across_processes(engine_url: str | URL) -> None:
    """4 processes x 8 threads race one identity key: exactly one job is written.

    Postgres serialises the check-then-insert with a transaction-scoped advisory lock;
    SQLite with ``BEGIN IMMEDIATE`` (the write lock taken before the check).
    """
    url = (
        engine_url.render_as_string(hide_password=False)
        if isinstance(engine_url, URL)
        else engine_url
    )
    ctx = multiprocessing.get_context("spawn")
    manager = ctx.Manager()
    barrier = manager.Barrier(4)
    with ProcessPoolExecutor(4, mp_context=ctx) as pool:
        futures = [pool.submit(producer.enqueue_in_process, url, barrier, 8) for _ in range(4)]
        results = [item for f in futures for item in f.result(timeout=120)]
    manager.shutdown()
    assert len(results) == 32
    assert len({job_id for job_id, _ in results}) == 1
    assert sum(not existing for _, existing in results) == 1
    assert _count_sync(engine_url, "race_unique_proc") == 1 + 4  # the race job plus 4 warm-ups
