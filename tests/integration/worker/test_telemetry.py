"""The attempt span is a child of the span that enqueued the job."""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncEngine

from taskq.backends.sql import SqlBackend
from taskq.client import JobsClient
from tests.e2e.apps import basic
from tests.support.workers import running_worker, wait_until, worker_settings

_EXPORTER = InMemorySpanExporter()


@pytest.fixture(scope="module")
def exporter() -> InMemorySpanExporter:
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    provider.add_span_processor(SimpleSpanProcessor(_EXPORTER))
    return _EXPORTER


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
        return any(s.name == "taskq.attempt" for s in exporter.get_finished_spans())

    async with running_worker(worker_settings(engine_url), basic.registry):
        await wait_until(attempt_exported)
    [span] = [s for s in exporter.get_finished_spans() if s.name == "taskq.attempt"]
    attributes: Any = span.attributes
    assert span.context.trace_id == trace_id
    assert span.parent is not None
    assert span.parent.span_id == request_span.get_span_context().span_id
    assert attributes["taskq.job_id"] == str(handle.job_id)
    assert attributes["taskq.outcome"] == "succeeded"
