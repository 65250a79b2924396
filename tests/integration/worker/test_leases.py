"""Leases: leader election, the expired-lease sweep, and isolate_self."""

from __future__ import annotations

import asyncio
from typing import Any
from uuid import uuid4

from sqlalchemy import select, update
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncEngine

from taskq.backends.sql import SqlBackend
from taskq.client import JobsClient
from taskq.db.engine import make_engine, transaction
from taskq.db.queries import dispatch as dq
from taskq.db.tables import job_attempts, jobs
from taskq.settings import TaskQSettings
from taskq.worker.leader import LeaderLease
from taskq.worker.sweep import Sweeper
from tests.e2e.apps import basic
from tests.support.workers import running_worker, wait_until, worker_settings


async def test_one_leader_and_a_successor_after_expiry(engine: AsyncEngine) -> None:
    first = LeaderLease(engine, uuid4(), lease_s=0.5)
    second = LeaderLease(engine, uuid4(), lease_s=0.5)
    assert await first.renew() is True
    assert await second.renew() is False
    assert await first.renew() is True  # renewal keeps it
    # The first leader dies (stops renewing): the second takes over once the lease lapses.
    await wait_until(second.renew, timeout=10)
    assert await first.renew() is False
    await second.release()
    assert await first.renew() is True


async def _claim_as(engine: AsyncEngine, worker_id: Any, lease_s: float) -> list[Any]:
    stmt = dq.claim_jobs(
        engine.dialect.name,
        queues_=("default",),
        actors=(*tuple(basic.registry), "e2e_exhausts"),
        limit=10,
    )
    async with transaction(engine) as conn:
        return [
            r.id
            for r in (await conn.execute(stmt, {"worker_id": worker_id, "lease_s": lease_s})).all()
        ]


async def test_sweep_reclaims_abandons_and_cancels_expired_rows(engine: AsyncEngine) -> None:
    client = JobsClient(SqlBackend(engine))
    from taskq.actor_config_ops import sync_actor_config

    actors = {**basic.registry, basic.exhausts.name: basic.exhausts}
    async with transaction(engine) as conn:
        await sync_actor_config(conn, actors.values())
    crashed = await client.enqueue(basic.noop, basic.Empty())
    spent = await client.enqueue(basic.exhausts, basic.Empty())
    cancelling = await client.enqueue(basic.echo, basic.Echo(value=1))
    dead_worker = uuid4()
    claimed = await _claim_as(engine, dead_worker, lease_s=-1.0)
    assert set(claimed) == {crashed.job_id, spent.job_id, cancelling.job_id}
    async with engine.begin() as conn:
        await conn.execute(update(jobs).where(jobs.c.id == spent.job_id).values(budget_used=1))
        await conn.execute(
            update(jobs).where(jobs.c.id == cancelling.job_id).values(cancel_phase=1)
        )

    assert await Sweeper(engine, actors).reclaim_expired() == 3
    assert await Sweeper(engine, actors).reclaim_expired() == 0

    async with engine.connect() as conn:
        rows = {r.id: r for r in (await conn.execute(select(jobs))).all()}
        history = {
            r.job_id: (r.outcome, r.worker_id)
            for r in (await conn.execute(select(job_attempts))).all()
        }
    assert (rows[crashed.job_id].status, rows[crashed.job_id].locked_by) == ("pending", None)
    assert rows[crashed.job_id].budget_used == 1
    assert history[crashed.job_id] == ("crashed", dead_worker)
    assert (rows[spent.job_id].status, history[spent.job_id][0]) == ("abandoned", "abandoned")
    assert rows[cancelling.job_id].status == "cancelled"
    assert rows[cancelling.job_id].error_class == "CancelAbandoned"


async def test_isolate_self_stops_local_attempts_when_the_store_is_gone(
    pg_url: URL, settings: TaskQSettings
) -> None:
    """Postgres only: "the store is gone" is a network server refusing connections; an
    embedded SQLite file cannot become unreachable while the process runs."""
    engine = make_engine(pg_url, settings=settings)
    unreachable = make_engine("postgresql://postgres@127.0.0.1:1/nowhere", settings=settings)
    try:
        client = JobsClient(SqlBackend(engine, settings=settings))
        handle = await client.enqueue(basic.sleep_async, basic.Work(seconds=60))
        worker_conf = worker_settings(
            pg_url, lock_lease=1.0, heartbeat_interval=0.1, sweep_interval=60
        )
        async with running_worker(worker_conf, basic.registry) as worker:
            await wait_until(lambda: _status_is(engine, handle.job_id, "running"))
            worker.heartbeat._engine = unreachable  # the store stops answering heartbeats
            await wait_until(lambda: _has_attempt(engine, handle.job_id), timeout=20)
            assert worker.heartbeat.isolated
            worker.heartbeat._engine = engine
            await asyncio.sleep(0)
        async with engine.connect() as conn:
            first = (
                await conn.execute(
                    select(job_attempts.c.outcome, job_attempts.c.error_class)
                    .where(job_attempts.c.job_id == handle.job_id)
                    .order_by(job_attempts.c.attempt)
                )
            ).first()
        assert first is not None
        assert tuple(first) == ("retried", "WorkerIsolated")
    finally:
        await unreachable.dispose()
        await engine.dispose()


async def _status_is(engine: AsyncEngine, job_id: Any, status: str) -> bool:
    async with engine.connect() as conn:
        value = (await conn.execute(select(jobs.c.status).where(jobs.c.id == job_id))).scalar()
    return bool(value == status)


async def _has_attempt(engine: AsyncEngine, job_id: Any) -> bool:
    async with engine.connect() as conn:
        stmt = select(job_attempts.c.id).where(job_attempts.c.job_id == job_id)
        return (await conn.execute(stmt)).first() is not None


async def test_a_reclaimed_job_keeps_its_place_in_the_queue(engine: AsyncEngine) -> None:
    """Reclaim puts the job back where it was (``scheduled_at`` kept), not behind the
    backlog that arrived while it ran."""
    client = JobsClient(SqlBackend(engine))
    from taskq.actor_config_ops import sync_actor_config

    async with transaction(engine) as conn:
        await sync_actor_config(conn, basic.registry.values())
    first = await client.enqueue(basic.noop, basic.Empty())
    assert await _claim_as(engine, uuid4(), lease_s=-1.0) == [first.job_id]
    backlog = [await client.enqueue(basic.noop, basic.Empty()) for _ in range(5)]
    assert await Sweeper(engine, basic.registry).reclaim_expired() == 1
    stmt = dq.claim_jobs(engine.dialect.name, queues_=("default",), actors=("e2e_noop",), limit=1)
    async with transaction(engine) as conn:
        claimed = (await conn.execute(stmt, {"worker_id": uuid4(), "lease_s": 60.0})).all()
    assert [row.id for row in claimed] == [first.job_id]
    assert len(backlog) == 5
