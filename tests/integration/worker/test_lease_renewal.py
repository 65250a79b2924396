"""The heartbeat's lease renewal: it never waits on a locked row (the deadlock with the
outcome write), and it cancels at once a running job whose row it no longer holds."""

from __future__ import annotations

import asyncio
from typing import Any
from uuid import uuid4

from sqlalchemy import select, update
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncEngine

from taskq.backends.sql import SqlBackend
from taskq.client import JobsClient
from taskq.db.engine import make_engine
from taskq.db.tables import jobs
from taskq.settings import TaskQSettings
from tests.e2e.apps import basic
from tests.support.workers import running_worker, wait_until, worker_settings


async def _running(engine: AsyncEngine, job_id: Any) -> bool:
    async with engine.connect() as conn:
        status = await conn.scalar(select(jobs.c.status).where(jobs.c.id == job_id))
    return status == "running"


async def test_renewal_skips_a_row_locked_by_another_transaction(
    pg_url: URL, settings: TaskQSettings
) -> None:
    engine = make_engine(pg_url, settings=settings)
    try:
        client = JobsClient(SqlBackend(engine, settings=settings))
        locked = await client.enqueue(basic.sleep_async, basic.Work(seconds=60))
        free = await client.enqueue(basic.sleep_async, basic.Work(seconds=60))
        conf = worker_settings(pg_url, heartbeat_interval=60, sweep_interval=60)
        async with running_worker(conf, basic.registry) as worker:
            await wait_until(lambda: _running(engine, locked.job_id))
            await wait_until(lambda: _running(engine, free.job_id))
            async with engine.connect() as holder:
                # What the outcome write does to the rows it finishes: lock them.
                await holder.execute(
                    select(jobs.c.id).where(jobs.c.id == locked.job_id).with_for_update()
                )
                before = await _lease(engine, free.job_id)
                await asyncio.wait_for(worker.heartbeat.beat(), 20)  # did not wait
                assert await _lease(engine, free.job_id) > before
                # The skipped row is still ours: its job keeps running.
                assert locked.job_id in worker.dispatcher.running
                await holder.rollback()
    finally:
        await engine.dispose()


async def _lease(engine: AsyncEngine, job_id: Any) -> Any:
    async with engine.connect() as conn:
        return await conn.scalar(select(jobs.c.lease_expires_at).where(jobs.c.id == job_id))


async def test_a_job_whose_row_was_reclaimed_is_cancelled_at_the_next_renewal(
    engine: AsyncEngine,
) -> None:
    client = JobsClient(SqlBackend(engine))
    taken = await client.enqueue(basic.sleep_async, basic.Work(seconds=60))
    kept = await client.enqueue(basic.sleep_async, basic.Work(seconds=60))
    conf = worker_settings(engine.url, heartbeat_interval=60, sweep_interval=60)
    async with running_worker(conf, basic.registry) as worker:
        await wait_until(lambda: _running(engine, taken.job_id))
        await wait_until(lambda: _running(engine, kept.job_id))
        job = worker.dispatcher.running[taken.job_id]
        # As if the sweep reclaimed it and another worker claimed it again.
        async with engine.begin() as conn:
            await conn.execute(
                update(jobs)
                .where(jobs.c.id == taken.job_id)
                .values(locked_by=uuid4(), attempt=jobs.c.attempt + 1)
            )
        await worker.heartbeat.beat()
        assert job.cancel_reason == "isolated"
        assert job.task is not None
        await asyncio.wait([job.task], timeout=20)
        assert job.task.done()
        assert taken.job_id not in worker.dispatcher.running
        assert kept.job_id in worker.dispatcher.running  # the job still ours runs on
    async with engine.connect() as conn:
        row = (
            await conn.execute(
                select(jobs.c.status, jobs.c.attempt).where(jobs.c.id == taken.job_id)
            )
        ).one()
    assert tuple(row) == ("running", 2)  # the other worker's claim, untouched by ours


async def test_a_job_whose_lease_lapsed_by_the_local_clock_is_stopped_first(
    engine: AsyncEngine,
) -> None:
    """A frozen process (or a blocked loop) resumes: jobs past their lease stop."""
    client = JobsClient(SqlBackend(engine))
    handle = await client.enqueue(basic.sleep_async, basic.Work(seconds=60))
    conf = worker_settings(engine.url, heartbeat_interval=60, sweep_interval=60, lock_lease=2)
    async with running_worker(conf, basic.registry) as worker:
        await wait_until(lambda: _running(engine, handle.job_id))
        job = worker.dispatcher.running[handle.job_id]
        assert worker.heartbeat.isolate_lapsed("test") == 0
        job.claimed_mono -= 10  # as if the process had been frozen for 10 s
        worker.heartbeat._renewed.pop(job.id, None)
        assert worker.heartbeat.isolate_lapsed("resumed") == 1
        assert job.task is not None
        await asyncio.wait([job.task], timeout=20)
        assert job.task.cancelled() or job.task.done()
        assert job.cancel_reason == "isolated"


async def test_an_outcome_outliving_the_lease_in_an_outage_is_still_written(
    pg_url: URL, settings: TaskQSettings
) -> None:
    """The completer cannot reach the store for longer than the lease while the rows stay
    the worker's (its heartbeat still renews them): the outcome is written afterwards, not
    dropped (a dropped one would be reclaimed and run a second time)."""
    engine = make_engine(pg_url, settings=settings)
    unreachable = make_engine("postgresql://postgres@127.0.0.1:1/nowhere", settings=settings)
    try:
        client = JobsClient(SqlBackend(engine, settings=settings))
        handle = await client.enqueue(basic.sleep_async, basic.Work(seconds=0.5))
        conf = worker_settings(pg_url, lock_lease=1.0, heartbeat_interval=0.1, sweep_interval=0.2)
        async with running_worker(conf, basic.registry) as worker:
            completer = worker.dispatcher.completer
            await wait_until(lambda: _running(engine, handle.job_id))
            completer._engine = unreachable
            await wait_until(lambda: _pending(completer), timeout=20)
            await asyncio.sleep(3.0)  # three leases of failed writes
            completer._engine = engine
            await wait_until(lambda: _ended(engine, handle.job_id), timeout=30)
        async with engine.connect() as conn:
            row = (
                await conn.execute(
                    select(jobs.c.status, jobs.c.attempt).where(jobs.c.id == handle.job_id)
                )
            ).one()
        assert tuple(row) == ("succeeded", 1)
    finally:
        await unreachable.dispose()
        await engine.dispose()


async def _pending(completer: Any) -> bool:
    return bool(completer.pending)


async def _ended(engine: AsyncEngine, job_id: Any) -> bool:
    async with engine.connect() as conn:
        status = await conn.scalar(select(jobs.c.status).where(jobs.c.id == job_id))
    return status == "succeeded"


async def test_a_job_claimed_again_while_the_renewal_ran_is_not_taken_for_lost(
    engine: AsyncEngine,
) -> None:
    """The renewal judged attempt 1; by its answer the job had ended and been claimed
    again (attempt 2, same id). Attempt 2 was never looked at: it must keep running."""
    from types import SimpleNamespace

    from taskq.worker.claimed import ClaimedJob
    from taskq.worker.heartbeat import Heartbeat
    from taskq.worker.state import RunningJob

    job_id, worker = uuid4(), uuid4()

    def claimed(attempt: int) -> ClaimedJob:
        return ClaimedJob(
            id=job_id, actor=basic.noop.name, queue="default", payload={}, attempt=attempt
        )

    before = RunningJob(claimed=claimed(1), ref=basic.noop, worker_id=worker)
    again = RunningJob(claimed=claimed(2), ref=basic.noop, worker_id=worker)
    dispatcher: Any = SimpleNamespace(inflight={job_id: again}, running={job_id: again})
    heartbeat = Heartbeat(
        engine, dispatcher, worker_id=worker, interval_s=1, lease_s=5, grace_s=1, renew_slots=False
    )
    heartbeat._track({job_id: before}, set(), set(), 0.0)
    assert again.cancel_reason is None
    assert not again.cancel_event.is_set()
    # The same attempt, still running and not renewed: that one is lost.
    dispatcher.inflight = dispatcher.running = {job_id: before}
    heartbeat._track({job_id: before}, set(), set(), 0.0)
    assert before.cancel_reason == "isolated"
