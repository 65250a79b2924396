"""Cancellation from another process's client: each kind of job ends with its error class."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncEngine

from taskq.backends.sql import SqlBackend
from taskq.client import JobsClient
from taskq.db.tables import job_attempts, jobs
from tests.e2e.apps import basic
from tests.support.workers import running_worker, wait_until, worker_settings


async def _row(engine: AsyncEngine, job_id: Any) -> Any:
    async with engine.connect() as conn:
        return (await conn.execute(select(jobs).where(jobs.c.id == job_id))).one()


async def _outcomes(engine: AsyncEngine, job_id: Any) -> list[str]:
    async with engine.connect() as conn:
        stmt = select(job_attempts.c.outcome).where(job_attempts.c.job_id == job_id)
        return list((await conn.execute(stmt)).scalars())


@pytest.fixture
def runs_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "runs.txt"
    monkeypatch.setenv("TASKQ_E2E_RUNS", str(path))
    return path


async def test_cancel_each_kind_of_job(
    engine: AsyncEngine, engine_url: str | URL, runs_file: Path
) -> None:
    client = JobsClient(SqlBackend(engine))
    pending = await client.enqueue(basic.noop, basic.Empty(), delay=timedelta(hours=1))
    forced = await client.enqueue(basic.sleep_async, basic.Work(seconds=60))
    cooperative = await client.enqueue(basic.cooperative_async, basic.Work(seconds=60))
    polling = await client.enqueue(basic.sync_polling, basic.Work(seconds=60))
    blind = await client.enqueue(basic.sync_blind, basic.Work(seconds=3))
    running = [forced, cooperative, polling, blind]
    settings = worker_settings(
        engine_url, cancellation_grace_period=0.5, cleanup_grace_period=0.5, max_concurrency=8
    )
    async with running_worker(settings, basic.registry):

        async def all_running() -> bool:
            rows = [await _row(engine, h.job_id) for h in running]
            return all(r.status == "running" for r in rows)

        await wait_until(all_running)
        for handle in [pending, *running]:
            await client.cancel(handle.job_id)

        async def all_cancelled() -> bool:
            rows = [await _row(engine, h.job_id) for h in [pending, *running]]
            return all(r.status == "cancelled" for r in rows)

        await wait_until(all_cancelled)
        # The blind thread runs to its end; its late return must not change the row.
        await wait_until(lambda: _ended(runs_file, blind.job_id), timeout=10)

    expected = {
        pending.job_id: "CancelledBeforeStart",
        forced.job_id: "CancelledForced",
        cooperative.job_id: "CancelledCooperatively",
        polling.job_id: "CancelledCooperatively",
        blind.job_id: "CancelAbandoned",
    }
    for job_id, error_class in expected.items():
        row = await _row(engine, job_id)
        assert (row.status, row.error_class) == ("cancelled", error_class), job_id
    assert await _outcomes(engine, pending.job_id) == []
    assert await _outcomes(engine, forced.job_id) == ["cancelled"]
    assert await _outcomes(engine, blind.job_id) == ["abandoned"]
    assert (await _row(engine, forced.job_id)).cancel_phase == 2


async def _ended(path: Path, job_id: Any) -> bool:
    text = await asyncio.to_thread(lambda: path.read_text() if path.exists() else "")
    return f"{job_id} 1 " in text and " end " in text


async def test_return_after_cancel_request_succeeds(
    engine: AsyncEngine, engine_url: str | URL, runs_file: Path
) -> None:
    """The raise-vs-return rule: an actor that returns normally after a cancel succeeded."""
    client = JobsClient(SqlBackend(engine))
    handle = await client.enqueue(basic.cooperative_async, basic.Work(seconds=0.3))
    settings = worker_settings(engine_url, cancellation_grace_period=5, cleanup_grace_period=5)
    async with running_worker(settings, basic.registry):
        await wait_until(lambda: _is(engine, handle.job_id, "succeeded"), timeout=15)
    assert (await _row(engine, handle.job_id)).status == "succeeded"


async def _is(engine: AsyncEngine, job_id: Any, status: str) -> bool:
    return bool((await _row(engine, job_id)).status == status)
