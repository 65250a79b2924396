"""``tq.jobs.cancel_where`` against a real worker process: queued jobs end before they start,
running ones go through the worker's cancel ladder (cooperative, forced, abandoned), and
jobs outside the filter are not touched."""

from __future__ import annotations

import subprocess
from datetime import timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncEngine

from taskq.client import TaskQ
from taskq.db.engine import make_engine
from taskq.db.tables import job_attempts, jobs
from taskq.job_filter import JobFilter
from taskq.ops import CancelResult
from taskq.settings import TaskQSettings
from tests.e2e.apps import basic
from tests.support.workers import spawn_worker, wait_until


async def _rows(engine: AsyncEngine, ids: list[Any]) -> dict[Any, Any]:
    async with engine.connect() as conn:
        return {r.id: r for r in (await conn.execute(select(jobs).where(jobs.c.id.in_(ids)))).all()}


async def test_cancel_where_walks_running_jobs_through_the_ladder(
    engine_url: str | URL,
    settings: TaskQSettings,
    runs_file: Path,
    tmp_path: Path,
    procs: list[subprocess.Popen[bytes]],
) -> None:
    engine = make_engine(engine_url, settings=settings)
    tq = TaskQ(engine=engine, settings=settings)
    try:
        tag = ["campaign-7"]
        cooperative = await tq.jobs.enqueue(
            basic.cooperative_async, basic.Work(seconds=60), tags=tag
        )
        forced = await tq.jobs.enqueue(basic.sleep_async, basic.Work(seconds=60), tags=tag)
        polling = await tq.jobs.enqueue(basic.sync_polling, basic.Work(seconds=60), tags=tag)
        blind = await tq.jobs.enqueue(basic.sync_blind, basic.Work(seconds=4), tags=tag)
        running = [cooperative, forced, polling, blind]
        procs.append(
            spawn_worker(
                engine_url,
                log_path=tmp_path / "worker.log",
                max_concurrency=8,
                cancellation_grace_period=0.5,
                cleanup_grace_period=0.5,
            )
        )

        async def all_running() -> bool:
            rows = await _rows(engine, [h.job_id for h in running])
            return all(r.status == "running" for r in rows.values())

        await wait_until(all_running)
        # Enqueued after the worker claimed the others: far in the future, so still queued.
        queued = [
            await tq.jobs.enqueue(basic.noop, basic.Empty(), tags=tag, delay=timedelta(hours=1))
            for _ in range(3)
        ]
        bystander = await tq.jobs.enqueue(basic.cooperative_async, basic.Work(seconds=60))
        await wait_until(lambda: _status_is(engine, bystander.job_id, "running"))

        result = await tq.jobs.cancel_where(JobFilter(tags=tag))
        assert result == CancelResult(cancelled_before_start=3, cancel_requested=4, not_reached=0)

        ids = [h.job_id for h in running]

        async def all_ended() -> bool:
            rows = await _rows(engine, ids)
            return all(r.status == "cancelled" for r in rows.values())

        await wait_until(all_ended)
        rows = await _rows(engine, [*ids, *[h.job_id for h in queued], bystander.job_id])
        assert rows[cooperative.job_id].error_class == "CancelledCooperatively"
        assert rows[polling.job_id].error_class == "CancelledCooperatively"
        assert rows[forced.job_id].error_class == "CancelledForced"
        assert rows[blind.job_id].error_class == "CancelAbandoned"
        for handle in queued:
            assert (rows[handle.job_id].status, rows[handle.job_id].error_class) == (
                "cancelled",
                "CancelledBeforeStart",
            )
            assert rows[handle.job_id].attempt == 0
        # The job outside the filter runs on, never asked to cancel.
        assert (rows[bystander.job_id].status, rows[bystander.job_id].cancel_phase) == (
            "running",
            0,
        )
        async with engine.connect() as conn:
            outcomes = dict(
                (
                    await conn.execute(
                        select(job_attempts.c.job_id, job_attempts.c.outcome).where(
                            job_attempts.c.job_id.in_(ids)
                        )
                    )
                ).all()
            )
        assert set(outcomes.values()) <= {"cancelled", "abandoned"}
        assert outcomes[blind.job_id] == "abandoned"
    finally:
        await tq.aclose()
        await engine.dispose()


async def _status_is(engine: AsyncEngine, job_id: Any, status: str) -> bool:
    rows = await _rows(engine, [job_id])
    return bool(rows[job_id].status == status)
