"""OpenTelemetry on the producer side (``taskq.telemetry``): the ``send {queue}`` span
(PRODUCER, messaging conventions), the trace context the jobs carry,
``taskq.jobs.enqueued`` and ``messaging.client.sent.messages``; async and sync clients."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.trace import SpanKind, StatusCode
from pydantic import BaseModel
from sqlalchemy import select
from sqlalchemy.engine import URL

from taskq import TaskQ, actor
from taskq.backends.sql import COPY_MIN_ROWS
from taskq.db.tables import jobs
from taskq.exceptions import PayloadValidationError
from taskq.settings import TaskQSettings
from tests.support.otel import Otel, otel

pytestmark = pytest.mark.integration


class Item(BaseModel):
    n: int


@actor(name="otel_plain", queue="otel_q")
async def otel_plain(payload: Item) -> None: ...


@actor(name="otel_unique", unique_for=timedelta(minutes=5))
async def otel_unique(payload: Item) -> None: ...


@pytest.fixture
def sdk() -> Otel:
    installed = otel()
    installed.spans.clear()
    return installed


def _spans(sdk: Otel, name: str) -> list[Any]:
    return [s for s in sdk.spans.get_finished_spans() if s.name == name]


def _count(span: Any) -> int:
    """How many jobs a ``send`` span says it carried (a single send has no batch count)."""
    return int(dict(span.attributes).get("messaging.batch.message_count", 1))


async def test_an_enqueue_is_a_span_and_its_job_continues_that_trace(
    pg_url: URL, settings: TaskQSettings, sdk: Otel
) -> None:
    tracer = trace.get_tracer("test")
    async with TaskQ(pg_url, settings=settings) as tq:
        with tracer.start_as_current_span("request") as request:
            handle = await tq.jobs.enqueue(otel_plain, Item(n=1))
        record = await handle.refresh()
        stored = await _trace_context(tq, handle.job_id)
    [span] = _spans(sdk, "send otel_q")
    attributes: Any = span.attributes
    assert span.kind == SpanKind.PRODUCER
    assert span.parent.span_id == request.get_span_context().span_id
    assert attributes["taskq.actor"] == "otel_plain"
    assert "messaging.batch.message_count" not in attributes
    assert attributes["messaging.system"] == "taskq"
    assert attributes["messaging.operation.name"] == "send"
    assert attributes["messaging.operation.type"] == "send"
    assert attributes["messaging.destination.name"] == "otel_q"
    assert attributes["messaging.message.id"] == str(handle.job_id)
    assert attributes["taskq.was_existing"] is False
    # the job carries the enqueue span's context: its attempt will be that span's child
    _, trace_id, parent_id, _ = stored["traceparent"].split("-")
    assert (trace_id, parent_id) == (
        f"{span.context.trace_id:032x}",
        f"{span.context.span_id:016x}",
    )
    assert record.status == "pending"


@pytest.mark.parametrize("size", [3, COPY_MIN_ROWS], ids=["statement", "bulk-copy"])
async def test_every_job_of_an_enqueue_many_continues_its_span(
    pg_url: URL, settings: TaskQSettings, sdk: Otel, size: int
) -> None:
    """The jobs of a batch carry the batch ``send`` span's context too (the actors'
    templates are made inside it), whichever path writes them."""
    tracer = trace.get_tracer("test")
    async with TaskQ(pg_url, settings=settings) as tq:
        with tracer.start_as_current_span("request"):
            handles = await tq.jobs.enqueue_many([(otel_plain, Item(n=i)) for i in range(size)])
        stored = [await _trace_context(tq, h.job_id) for h in (handles[0], handles[-1])]
        record = await handles[-1].refresh()
    [span] = _spans(sdk, "send otel_q")
    expected = ["00", f"{span.context.trace_id:032x}", f"{span.context.span_id:016x}"]
    assert [context["traceparent"].split("-")[:3] for context in stored] == [expected] * 2
    assert handles[-1].record == record


async def _trace_context(tq: TaskQ, job_id: Any) -> dict[str, str]:
    async with tq.engine.connect() as conn:
        value: dict[str, str] = (
            await conn.execute(select(jobs.c.trace_context).where(jobs.c.id == job_id))
        ).scalar_one()
    return value


async def test_enqueue_many_is_one_span_and_counts_every_job(
    pg_url: URL, settings: TaskQSettings, sdk: Otel
) -> None:
    before = sdk.points("taskq.jobs.enqueued", actor="otel_plain", queue="otel_q")
    sent = {"messaging.system": "taskq", "messaging.destination.name": "otel_q"}
    sent_before = sdk.points("messaging.client.sent.messages", **sent)
    async with TaskQ(pg_url, settings=settings) as tq:
        handles = await tq.jobs.enqueue_many(
            [(otel_plain, Item(n=i)) for i in range(COPY_MIN_ROWS)]  # the streamed COPY
        )
        small = await tq.jobs.enqueue_many([(otel_plain, Item(n=i)) for i in range(3)])
    assert len(handles) == COPY_MIN_ROWS
    assert len(small) == 3
    spans = _spans(sdk, "send otel_q")
    assert [_count(s) for s in spans] == [COPY_MIN_ROWS, 3]
    assert all(dict(s.attributes)["taskq.actor"] == "otel_plain" for s in spans)
    after = sdk.points("taskq.jobs.enqueued", actor="otel_plain", queue="otel_q")
    created = (("outcome", "created"),)
    assert after[created] - before.get(created, 0) == COPY_MIN_ROWS + 3
    send = (("messaging.operation.name", "send"),)
    sent_after = sdk.points("messaging.client.sent.messages", **sent)
    assert sent_after[send] - sent_before.get(send, 0) == COPY_MIN_ROWS + 3


async def test_a_deduplicated_enqueue_counts_as_existing(
    pg_url: URL, settings: TaskQSettings, sdk: Otel, unique_name: str
) -> None:
    before = sdk.points("taskq.jobs.enqueued", actor="otel_unique")
    async with TaskQ(pg_url, settings=settings) as tq:
        first = await tq.jobs.enqueue(otel_unique, Item(n=1), identity_key=unique_name)
        again = await tq.jobs.enqueue(otel_unique, Item(n=2), identity_key=unique_name)
    assert again.was_existing
    assert again.job_id == first.job_id
    after = sdk.points("taskq.jobs.enqueued", actor="otel_unique")
    gained = {key: n - before.get(key, 0) for key, n in after.items()}
    assert gained == {
        (("outcome", "created"), ("queue", "default")): 1,
        (("outcome", "existing"), ("queue", "default")): 1,
    }
    [_, second] = _spans(sdk, "send default")
    assert dict(second.attributes)["taskq.was_existing"] is True


async def test_a_failed_enqueue_is_an_error_span_and_counts_nothing(
    pg_url: URL, settings: TaskQSettings, sdk: Otel
) -> None:
    before = sdk.points("taskq.jobs.enqueued", actor="otel_plain")
    async with TaskQ(pg_url, settings=settings) as tq:
        with pytest.raises(PayloadValidationError):
            await tq.jobs.enqueue(otel_plain, {"n": "not a number"})
        with pytest.raises(PayloadValidationError):
            await tq.jobs.enqueue_many([(otel_plain, Item(n=1)), (otel_plain, {"n": "bad"})])
    spans = _spans(sdk, "send")  # it failed before its queue was known
    assert len(spans) == 2
    assert all(s.status.status_code == StatusCode.ERROR for s in spans)
    assert all(s.events[0].name == "exception" for s in spans)
    assert all(dict(s.attributes)["error.type"] == "PayloadValidationError" for s in spans)
    assert sdk.points("taskq.jobs.enqueued", actor="otel_plain") == before


async def test_the_sync_client_records_the_same(
    pg_url: URL, settings: TaskQSettings, sdk: Otel
) -> None:
    from taskq_sync import TaskQ as SyncTaskQ

    before = sdk.points("taskq.jobs.enqueued", actor="otel_plain", queue="otel_q")

    def produce() -> list[Any]:
        with SyncTaskQ(pg_url, settings=settings) as tq:
            one = tq.jobs.enqueue(otel_plain, Item(n=1))
            return [one, *tq.jobs.enqueue_many([(otel_plain, Item(n=i)) for i in range(4)])]

    handles = await asyncio.to_thread(produce)
    assert len(handles) == 5
    spans = _spans(sdk, "send otel_q")
    assert [_count(s) for s in spans] == [1, 4]
    assert dict(spans[0].attributes)["messaging.message.id"] == str(handles[0].job_id)
    after = sdk.points("taskq.jobs.enqueued", actor="otel_plain", queue="otel_q")
    created = (("outcome", "created"),)
    assert after[created] - before.get(created, 0) == 5
