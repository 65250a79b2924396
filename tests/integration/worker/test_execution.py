"""Execution outcomes through a real worker on each SQL engine."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncEngine

from taskq.backends.sql import SqlBackend
from taskq.client import JobsClient
from taskq.db.tables import job_attempts, jobs
from tests.e2e.apps import basic
from tests.support.workers import count_jobs, running_worker, wait_until, worker_settings


async def _rows(engine: AsyncEngine) -> dict[Any, Any]:
    async with engine.connect() as conn:
        return {r.id: r for r in (await conn.execute(select(jobs))).all()}


async def _attempts(engine: AsyncEngine, job_id: Any) -> list[Any]:
    async with engine.connect() as conn:
        stmt = (
            select(job_attempts)
            .where(job_attempts.c.job_id == job_id)
            .order_by(job_attempts.c.attempt)
        )
        return list((await conn.execute(stmt)).all())


async def test_jobs_succeed_with_results(engine: AsyncEngine, engine_url: str | URL) -> None:
    client = JobsClient(SqlBackend(engine))
    handles = [await client.enqueue(basic.echo, basic.Echo(value=i)) for i in range(50)]
    async with running_worker(worker_settings(engine_url), basic.registry):
        await wait_until(lambda: _all_done(engine, 50))
    rows = await _rows(engine)
    for i, handle in enumerate(handles):
        row = rows[handle.job_id]
        assert row.status == "succeeded"
        assert row.result == {"doubled": i * 2}
        assert row.attempt == 1
        assert row.locked_by is None
        attempts = await _attempts(engine, handle.job_id)
        assert [a.outcome for a in attempts] == ["succeeded"]


async def _all_done(engine: AsyncEngine, n: int) -> bool:
    return await count_jobs(engine, "succeeded", "failed", "cancelled") >= n


async def test_retry_snooze_and_failure_outcomes(
    engine: AsyncEngine, engine_url: str | URL
) -> None:
    client = JobsClient(SqlBackend(engine))
    kinds = ["snooze", "retry_after_free", "always_fail", "non_retryable", "ok"]
    handles = {
        k: await client.enqueue(basic.control, basic.Control(kind=k, delay_ms=10)) for k in kinds
    }
    async with running_worker(worker_settings(engine_url), basic.registry):
        await wait_until(lambda: _all_done(engine, len(kinds)))
    rows = await _rows(engine)
    outcomes = {
        k: [a.outcome for a in await _attempts(engine, h.job_id)] for k, h in handles.items()
    }
    assert rows[handles["snooze"].job_id].status == "succeeded"
    assert outcomes["snooze"] == ["snoozed", "succeeded"]
    assert rows[handles["snooze"].job_id].budget_used == 0
    assert outcomes["retry_after_free"] == ["retried", "succeeded"]
    assert rows[handles["retry_after_free"].job_id].budget_used == 0
    assert outcomes["always_fail"] == ["retried", "retried", "failed"]
    failed = rows[handles["always_fail"].job_id]
    assert failed.status == "failed"
    assert failed.error_class == "ValueError"
    assert failed.budget_used == 3
    attempts = await _attempts(engine, handles["always_fail"].job_id)
    assert all(a.error_class == "ValueError" and "Traceback" in a.traceback for a in attempts)
    assert outcomes["ok"] == ["succeeded"]
