"""The progress stream through a real worker and a real Redis, on each SQL engine.

``seq`` must be a total order over a job's whole stream: the claim (``running``), every
``ctx.progress()``, retries and the terminal end, across attempts, and the row's
``progress_seq`` must end on the last number published.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any
from uuid import UUID

import pytest
from pydantic import BaseModel
from redis.asyncio import Redis
from sqlalchemy import select
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncEngine

from taskq.actor import actor
from taskq.backends.sql import SqlBackend
from taskq.client import JobsClient
from taskq.context import JobContext
from taskq.db.tables import jobs
from taskq.progress import ProgressEvent, progress_channel
from taskq.retry import RetryPolicy
from tests.e2e.apps import basic
from tests.support.workers import running_worker, wait_until, worker_settings


class Steps(BaseModel):
    """How many progress calls to make; fail the first attempt when ``flaky``."""

    steps: int
    flaky: bool = False


@actor(
    name="t_stream_steps",
    retry=RetryPolicy(max_attempts=3, base=timedelta(milliseconds=20), jitter=0),
)
async def steps(payload: Steps, ctx: JobContext[Steps]) -> None:
    """Reports ``steps`` progress updates (none coalescing), maybe fails once."""
    for i in range(payload.steps):
        await ctx.progress(step=i + 1, detail=f"attempt {ctx.attempt}")
        delivered = _DELIVERED.get(ctx.job_id)
        if delivered is not None:
            # A test streams this job: report the next update only once this one arrived.
            # (A fixed pause is not enough on a loaded machine: a publish still in flight
            # when the next update comes makes the two coalesce, by design.)
            await asyncio.wait_for(delivered.get(), 30)
        else:
            await asyncio.sleep(0.02)
    if payload.flaky and ctx.attempt == 1:
        raise ConnectionError("first attempt fails")


ACTORS = {**basic.registry, steps.name: steps}
_DELIVERED: dict[UUID, asyncio.Queue[None]] = {}
"""Per streamed job: one item per ``progress`` event the test's stream received."""


async def _progress_seq(engine: AsyncEngine, job_id: UUID) -> int:
    async with engine.connect() as conn:
        stmt = select(jobs.c.progress_seq).where(jobs.c.id == job_id)
        return int((await conn.execute(stmt)).scalar_one())


async def _collect(stream: Any, delivered: asyncio.Queue[None]) -> list[ProgressEvent]:
    events: list[ProgressEvent] = []
    async for event in stream:
        events.append(event)
        if event.event == "progress":
            delivered.put_nowait(None)
    return events


async def _stream_run(
    engine: AsyncEngine, engine_url: str | URL, redis_url: str, payload: Steps
) -> tuple[UUID, list[ProgressEvent]]:
    client = JobsClient(SqlBackend(engine))
    handle = await client.enqueue(steps, payload)
    redis = Redis.from_url(redis_url)
    delivered = _DELIVERED[handle.job_id] = asyncio.Queue()
    try:
        collector = asyncio.ensure_future(
            _collect(handle.progress_stream(redis, timeout=30), delivered)
        )
        channel = progress_channel(handle.job_id)

        async def subscribed() -> bool:  # the stream listens before the worker claims the job
            return dict(await redis.pubsub_numsub(channel)).get(channel.encode(), 0) > 0

        await wait_until(subscribed, timeout=30)
        settings = worker_settings(engine_url, redis_url=redis_url)
        async with running_worker(settings, ACTORS):
            events = await asyncio.wait_for(collector, 30)
    finally:
        _DELIVERED.pop(handle.job_id, None)
        await redis.aclose()
    return handle.job_id, events


async def test_stream_is_a_total_order_ending_with_the_terminal_event(
    engine: AsyncEngine, engine_url: str | URL, redis_url: str
) -> None:
    job_id, events = await _stream_run(engine, engine_url, redis_url, Steps(steps=3))
    names = [e.event for e in events]
    assert names == ["running", "progress", "progress", "progress", "succeeded"]
    seqs = [e.seq for e in events if e.seq is not None]
    assert len(seqs) == len(events)
    assert seqs == sorted(seqs)
    assert len(set(seqs)) == len(seqs)
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
    assert events[-1].terminal
    assert events[-1].status == "succeeded"
    assert events[-1].state == {"step": 3, "detail": "attempt 1"}
    assert all(e.job_id == job_id for e in events)
    # The row ends on the last number published: the next event would follow it.
    assert await _progress_seq(engine, job_id) == seqs[-1]


async def test_retry_and_next_attempt_continue_the_sequence(
    engine: AsyncEngine, engine_url: str | URL, redis_url: str
) -> None:
    job_id, events = await _stream_run(engine, engine_url, redis_url, Steps(steps=1, flaky=True))
    names = [e.event for e in events]
    assert names == ["running", "progress", "retried", "running", "progress", "succeeded"]
    assert events[2].status == "scheduled"
    assert not events[2].terminal
    assert events[2].error_class == "ConnectionError"
    seqs = [e.seq for e in events if e.seq is not None]
    assert seqs == sorted(seqs)
    assert len(set(seqs)) == len(seqs)
    assert await _progress_seq(engine, job_id) == seqs[-1]


async def test_stream_of_a_finished_job_yields_its_row(
    engine: AsyncEngine, engine_url: str | URL, redis_url: str
) -> None:
    client = JobsClient(SqlBackend(engine))
    handle = await client.enqueue(steps, Steps(steps=1))
    async with running_worker(worker_settings(engine_url), ACTORS):  # no Redis: no-op
        assert await handle.wait(timeout=20) is None
    events = [e async for e in handle.progress_stream(redis_url=redis_url, timeout=5)]
    assert len(events) == 1
    assert events[0].seq is None
    assert events[0].terminal
    assert events[0].event == "succeeded"
    assert events[0].state == {"step": 1, "detail": "attempt 1"}
    # Without Redis the row still counts every event: claim, one progress, the end.
    assert await _progress_seq(engine, handle.job_id) == 3


async def test_progress_stream_without_redis_is_an_error(engine: AsyncEngine) -> None:
    client = JobsClient(SqlBackend(engine))
    handle = await client.enqueue(steps, Steps(steps=1))
    with pytest.raises(RuntimeError, match="needs Redis"):
        async for _ in handle.progress_stream(redis_url=""):
            pass
