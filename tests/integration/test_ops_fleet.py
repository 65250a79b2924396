"""Queue pause/resume as dispatch sees it, and the workers list, with a real worker on each
SQL engine, through the async client and ``taskq_sync``."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncEngine

from taskq.client import TaskQ
from taskq.settings import TaskQSettings
from tests.e2e.apps import basic
from tests.support.workers import running_worker, wait_until, worker_settings


async def _status(tq: TaskQ, job_id: Any) -> str:
    return (await tq.jobs.detail(job_id)).job.status


@pytest.mark.parametrize("mode", ["async", "sync"])
async def test_a_paused_queue_is_not_claimed_until_resumed(
    engine: AsyncEngine, engine_url: str | URL, settings: TaskQSettings, mode: str
) -> None:
    tq = TaskQ(engine=engine, settings=settings)
    queues: Any = tq.queues
    sync_tq: Any = None
    if mode == "sync":
        from taskq_sync import TaskQ as SyncTaskQ

        sync_tq = SyncTaskQ(engine_url, settings=settings)
        queues = sync_tq.queues

    async def call(method: str, *args: Any) -> Any:
        fn = getattr(queues, method)
        return await asyncio.to_thread(fn, *args) if mode == "sync" else await fn(*args)

    try:
        paused = await call("pause", "default")
        assert paused.paused is True
        assert (await call("pause", "default")).paused is True  # idempotent
        held = await tq.jobs.enqueue(basic.noop, basic.Empty())
        # Enqueued after the held job, on a queue the same worker claims in the same
        # statement: once it has run, the claim has seen the held job and left it.
        probe = await tq.jobs.enqueue(basic.noop, basic.Empty(), queue="other")
        settings_w = worker_settings(engine_url, queues=("default", "other"))
        async with running_worker(settings_w, basic.registry) as worker:
            await wait_until(lambda: _is(tq, probe.job_id, "succeeded"))
            assert await _status(tq, held.job_id) == "pending"

            fleet = await tq.workers.list()
            assert [w.id for w in fleet] == [worker.worker_id]
            [me] = fleet
            assert (me.status, me.queues, me.running_jobs) == ("running", ["default", "other"], 0)
            if mode == "sync":
                [same] = await asyncio.to_thread(sync_tq.workers.list)
                assert same.id == me.id

            resumed = await call("resume", "default")
            assert resumed.paused is False
            await wait_until(lambda: _is(tq, held.job_id, "succeeded"))
        stopped = await tq.workers.list(include_stopped=True)
        assert [(w.id, w.status) for w in stopped] == [(worker.worker_id, "stopped")]
        assert await tq.workers.list() == []
    finally:
        if sync_tq is not None:
            await asyncio.to_thread(sync_tq.close)
        await tq.aclose()


async def _is(tq: TaskQ, job_id: Any, status: str) -> bool:
    return await _status(tq, job_id) == status


async def test_bad_queue_names_change_nothing(engine: AsyncEngine, settings: TaskQSettings) -> None:
    tq = TaskQ(engine=engine, settings=settings)
    try:
        for bad in ("a:b", "", "x" * 201):
            with pytest.raises(ValueError, match="invalid queue name"):
                await tq.queues.pause(bad)
        assert await tq.queues.list() == []
    finally:
        await tq.aclose()
