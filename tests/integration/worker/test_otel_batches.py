"""The worker's telemetry per batch, not per job: one ``settle`` span per terminal write
with ``messaging.batch.message_count``, counters added once per attribute set and batch
that still sum to the jobs, one ``messaging.process.duration`` point per attempt
(recorded when its batch is written), and no job id in any metric point. A worker in
this process exports to the SDK's in-memory exporter and reader
(:mod:`tests.support.otel`)."""

from __future__ import annotations

import asyncio
import re

from pydantic import BaseModel
from sqlalchemy import func, select
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncEngine

from taskq import actor
from taskq.backends.sql import SqlBackend
from taskq.client import JobsClient
from taskq.db.tables import jobs
from taskq.records import EnqueueArgs
from tests.support.otel import otel
from tests.support.workers import running_worker, wait_until, worker_settings

JOBS = 20
UUID_RE = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")

started = 0
release: asyncio.Event | None = None
"""Set by the test once every attempt started (made on the test's own event loop)."""


class Step(BaseModel):
    n: int


@actor(name="otel_batched")
async def batched(payload: Step) -> None:
    """Every attempt waits for the others, so that they all end together: their outcomes
    are written in one batch."""
    global started
    started += 1
    assert release is not None
    await release.wait()


async def test_settle_spans_and_counters_are_per_batch_and_add_up_to_the_jobs(
    engine: AsyncEngine, engine_url: str | URL, unique_name: str
) -> None:
    global started, release
    started = 0
    release = asyncio.Event()
    sdk = otel()
    sdk.spans.clear()
    queue = unique_name[-40:]
    client = JobsClient(SqlBackend(engine))
    succeeded = (("status", "succeeded"),)
    before = sdk.points("taskq.jobs.completed", actor=batched.name).get(succeeded, 0)
    handles = await client.enqueue_many(
        [EnqueueArgs(batched, Step(n=i), {"queue": queue}) for i in range(JOBS)]
    )
    ids = {str(h.job_id) for h in handles}
    settings = worker_settings(engine_url, queues=(queue,), max_concurrency=JOBS)
    async with running_worker(settings, {batched.name: batched}):

        async def all_running() -> bool:
            return started == JOBS

        await wait_until(all_running)
        release.set()

        async def all_done() -> bool:
            async with engine.connect() as conn:
                done = (
                    await conn.execute(
                        select(func.count())
                        .select_from(jobs)
                        .where(jobs.c.queue == queue, jobs.c.status == "succeeded")
                    )
                ).scalar_one()
            return int(done) == JOBS

        await wait_until(all_done)
    spans = sdk.spans.get_finished_spans()
    process = [s for s in spans if s.name == f"process {queue}"]
    settles = [s for s in spans if s.name == f"settle {queue}"]
    assert len(process) == JOBS

    # every written outcome is in exactly one settle span: a batch says how many it
    # wrote (and names no job), a single write names its job
    written = 0
    for span in settles:
        attrs = dict(span.attributes or {})
        assert attrs["messaging.operation.name"] == "settle"
        assert attrs["messaging.destination.name"] == queue
        if "messaging.batch.message_count" in attrs:
            count = int(attrs["messaging.batch.message_count"])  # type: ignore[arg-type]
            assert count > 1
            assert "messaging.message.id" not in attrs
        else:
            count = 1
            assert attrs["messaging.message.id"] in ids
        assert len(span.links) == count  # linked to each attempt it wrote
        written += count
    assert written == JOBS
    # the attempts all ended together: their outcomes went out in one batch
    assert any("messaging.batch.message_count" in dict(s.attributes or {}) for s in settles)
    linked = [link.context.span_id for s in settles for link in s.links]
    assert sorted(linked) == sorted(s.context.span_id for s in process)

    # counters added per batch still count every job once (cumulative: the actor is
    # this module's, the queue this test's)
    completed = sdk.points("taskq.jobs.completed", actor=batched.name)
    assert set(completed) == {succeeded}
    assert completed[succeeded] - before == JOBS
    on_queue = {"messaging.destination.name": queue}
    assert sum(sdk.points("messaging.client.consumed.messages", **on_queue).values()) == JOBS
    # histograms: a point per attempt, per claimed job; one operation point per settle
    assert sdk.histogram_count("messaging.process.duration", **on_queue) == JOBS
    assert sdk.histogram_count("taskq.job.queue_latency", queue=queue) == JOBS
    assert sdk.histogram_count(
        "messaging.client.operation.duration",
        **on_queue,
        **{"messaging.operation.name": "settle"},
    ) == len(settles)

    # no metric point anywhere carries a job id (nor any other id)
    for name, attrs, _ in sdk.all_points():
        assert "messaging.message.id" not in attrs, name
        for value in attrs.values():
            assert str(value) not in ids, (name, attrs)
            assert not UUID_RE.search(str(value)), (name, attrs)
