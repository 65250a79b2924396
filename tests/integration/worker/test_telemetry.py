"""The process span is a child of the span that enqueued the job (``send {queue}``,
itself a child of the caller's span); the leader reports ``taskq.queue.depth``."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from pydantic import BaseModel
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncEngine

from taskq import actor
from taskq.backends.sql import SqlBackend
from taskq.client import JobsClient
from tests.e2e.apps import basic
from tests.support.otel import otel
from tests.support.workers import running_worker, wait_until, worker_settings


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return otel().spans


async def test_attempt_span_continues_the_enqueuers_trace(
    engine: AsyncEngine, engine_url: str | URL, exporter: InMemorySpanExporter
) -> None:
    exporter.clear()
    client = JobsClient(SqlBackend(engine))
    tracer = trace.get_tracer("test")
    with tracer.start_as_current_span("request") as request_span:
        handle = await client.enqueue(basic.echo, basic.Echo(value=2))
    trace_id = request_span.get_span_context().trace_id

    async def attempt_exported() -> bool:
        return any(s.name == "process default" for s in exporter.get_finished_spans())

    async with running_worker(worker_settings(engine_url), basic.registry):
        await wait_until(attempt_exported)
    [span] = [s for s in exporter.get_finished_spans() if s.name == "process default"]
    [enqueue] = [s for s in exporter.get_finished_spans() if s.name == "send default"]
    attributes: Any = span.attributes
    assert span.context.trace_id == trace_id
    assert span.parent is not None
    assert span.parent.span_id == enqueue.context.span_id
    assert enqueue.parent is not None
    assert enqueue.parent.span_id == request_span.get_span_context().span_id
    assert attributes["messaging.message.id"] == str(handle.job_id)
    assert attributes["taskq.outcome"] == "succeeded"


class Probe(BaseModel):
    n: int


@actor(name="otel_depth_probe")
async def depth_probe(payload: Probe) -> None: ...


async def test_the_leader_reports_each_queues_depth(
    engine: AsyncEngine, engine_url: str | URL, unique_name: str
) -> None:
    sdk = otel()
    client = JobsClient(SqlBackend(engine))
    queue = unique_name[-40:]
    handles = [await client.enqueue(depth_probe, Probe(n=i), queue=queue) for i in range(3)]
    handles += [
        await client.enqueue(depth_probe, Probe(n=i), queue=queue, delay=timedelta(hours=1))
        for i in range(2)
    ]

    def depth() -> dict[tuple[Any, ...], int]:
        return sdk.points("taskq.queue.depth", queue=queue)

    async def reads(expected: dict[tuple[Any, ...], int]) -> bool:
        return depth() == expected

    # the worker does not run depth_probe: its jobs wait, and the leader counts them
    async with running_worker(worker_settings(engine_url), basic.registry):
        await wait_until(
            lambda: reads({(("status", "pending"),): 3, (("status", "scheduled"),): 2})
        )
        for handle in handles:
            await client.cancel(handle.job_id)
        # a queue that emptied reads 0, not a stale count
        await wait_until(
            lambda: reads({(("status", "pending"),): 0, (("status", "scheduled"),): 0})
        )
