"""Each way an attempt ends, as OpenTelemetry sees it: the ``process {queue}`` span's
status and attributes, the ``receive``/``settle``/``admit``/``rate_limit acquire`` spans
around it, and the metrics; a job parked by a denied limit is no attempt (no ``process``
span), its park is an ``admit`` span and a ``taskq.job.throttled.duration`` point; no
metric point carries a job id. A worker in this process exports to
the SDK's in-memory exporter and reader (:mod:`tests.support.otel`)."""

from __future__ import annotations

import asyncio
import re
from datetime import timedelta
from typing import Any
from uuid import UUID

from opentelemetry import baggage, context, trace
from opentelemetry.trace import SpanKind, StatusCode
from pydantic import BaseModel
from sqlalchemy import select
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncEngine

from taskq import actor
from taskq.backends.sql import SqlBackend
from taskq.client import JobsClient
from taskq.context import JobContext
from taskq.db.tables import jobs
from taskq.exceptions import Snooze
from taskq.ratelimit import (
    ConcurrencyReservation,
    KeyedRateLimitRef,
    RateLimitRegistry,
    TokenBucket,
)
from taskq.retry import RetryPolicy
from tests.support.otel import Otel, otel
from tests.support.workers import running_worker, wait_until, worker_settings

FAST = RetryPolicy(
    max_attempts=3, base=timedelta(milliseconds=20), cap=timedelta(milliseconds=50), jitter=0
)
LIMIT = TokenBucket("otel_outcomes.limit", capacity=1, refill_per_second=20, backend="memory")
SLOTS = ConcurrencyReservation("otel_outcomes.slots", slots=2, lease=30.0)

seen: dict[tuple[str, int], dict[str, Any]] = {}
"""What each attempt saw, by ``(job id, attempt)``: its ``ctx.span`` id, baggage."""


class Item(BaseModel):
    n: int = 0


KEYED = KeyedRateLimitRef(
    payload_type=Item,
    base_name="otel_outcomes.keyed",
    key_fn=lambda p: "one",  # every job on one key: claimed together, all but one parked
    capacity=1,
    refill_per_second=20,
    backend="memory",
)


def _saw(ctx: JobContext[Any]) -> None:
    ctx.log.info("otel-test-attempt")
    seen[(str(ctx.job_id), ctx.attempt)] = {
        "span_id": ctx.span.get_span_context().span_id if ctx.span is not None else None,
        "tenant": baggage.get_baggage("tenant"),
    }


@actor(name="otel_flaky", retry=FAST)
async def flaky(payload: Item, ctx: JobContext[Item]) -> None:
    _saw(ctx)
    if ctx.attempt == 1:
        raise RuntimeError("first attempt fails")


@actor(name="otel_snoozer", retry=FAST)
async def snoozer(payload: Item, ctx: JobContext[Item]) -> None:
    _saw(ctx)
    if ctx.attempt == 1:
        raise Snooze(timedelta(milliseconds=20))


@actor(name="otel_broken", retry=RetryPolicy(kind="non_retryable"))
async def broken(payload: Item, ctx: JobContext[Item]) -> None:
    _saw(ctx)
    raise KeyError("nope")


@actor(name="otel_waiter", reservations=[SLOTS])
async def waiter(payload: Item, ctx: JobContext[Item]) -> None:
    _saw(ctx)
    async with asyncio.timeout(30):
        await ctx.cancel_event.wait()
    ctx.check_cancelled()


@actor(name="otel_limited", rate_limits=[LIMIT])
async def limited(payload: Item, ctx: JobContext[Item]) -> None:
    _saw(ctx)


@actor(name="otel_keyed", rate_limits=[KEYED])
async def keyed(payload: Item, ctx: JobContext[Item]) -> None:
    _saw(ctx)


ACTORS = {ref.name: ref for ref in (flaky, snoozer, broken, waiter, limited, keyed)}
UUID_RE = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def _total(sdk: Otel, name: str, **attributes: Any) -> int:
    return sum(sdk.points(name, **attributes).values())


async def _status(engine: AsyncEngine, job_id: UUID) -> str:
    async with engine.connect() as conn:
        return str(
            (await conn.execute(select(jobs.c.status).where(jobs.c.id == job_id))).scalar_one()
        )


async def test_every_ending_has_its_span_status_attributes_and_metrics(
    engine: AsyncEngine, engine_url: str | URL, unique_name: str
) -> None:
    sdk = otel()
    sdk.spans.clear()
    queue = unique_name[-40:]
    client = JobsClient(SqlBackend(engine))
    before_retries = _total(sdk, "taskq.job.retries", actor="otel_flaky", queue=queue)
    tracer = trace.get_tracer("test")
    with tracer.start_as_current_span("request") as request:
        ids = {
            name: (await client.enqueue(ref, Item(), queue=queue)).job_id
            for name, ref in ACTORS.items()
        }
        ids["otel_limited_2"] = (await client.enqueue(limited, Item(n=2), queue=queue)).job_id
        ids["otel_limited_3"] = (await client.enqueue(limited, Item(n=3), queue=queue)).job_id
        ids["otel_keyed_2"] = (await client.enqueue(keyed, Item(n=2), queue=queue)).job_id
        ids["otel_keyed_3"] = (await client.enqueue(keyed, Item(n=3), queue=queue)).job_id
    settings = worker_settings(engine_url, queues=(queue,), max_concurrency=10)
    async with running_worker(settings, ACTORS, rate_limit_registry=RateLimitRegistry()):

        async def waiter_running() -> bool:
            return await _status(engine, ids["otel_waiter"]) == "running"

        await wait_until(waiter_running)

        async def slot_held() -> bool:  # the running waiter holds one of its two slots
            return sdk.points("taskq.reservation.slots.held", reservation=SLOTS.name) == {(): 1}

        await wait_until(slot_held)
        await client.cancel(ids["otel_waiter"])

        async def all_ended() -> bool:
            statuses = [await _status(engine, job_id) for job_id in ids.values()]
            return all(s in ("succeeded", "failed", "cancelled") for s in statuses)

        await wait_until(all_ended, timeout=60)
    spans = sdk.spans.get_finished_spans()
    process = [s for s in spans if s.name == f"process {queue}"]
    by_job: dict[str, list[Any]] = {}
    for span in sorted(process, key=lambda s: s.start_time or 0):
        by_job.setdefault(str(dict(span.attributes or {})["messaging.message.id"]), []).append(span)
    trace_id = request.get_span_context().trace_id

    for span in process:
        attrs: Any = span.attributes
        assert span.kind == SpanKind.CONSUMER
        assert span.context.trace_id == trace_id  # every attempt continues the request
        assert attrs["messaging.system"] == "taskq"
        assert attrs["messaging.operation.type"] == "process"
        assert attrs["messaging.destination.name"] == queue
        job = attrs["messaging.message.id"]
        assert seen[(job, attrs["taskq.attempt"])]["span_id"] == span.context.span_id  # ctx.span
        assert "taskq.throttled.bucket" not in attrs  # every process span ran the actor

    first, second = by_job[str(ids["otel_flaky"])]
    assert dict(first.attributes or {})["taskq.outcome"] == "retry"
    assert first.status.status_code == StatusCode.ERROR
    assert dict(first.attributes or {})["error.type"] == "RuntimeError"
    assert [e.name for e in first.events] == ["exception"]
    assert dict(first.events[0].attributes or {})["exception.message"] == "first attempt fails"
    assert dict(second.attributes or {})["taskq.outcome"] == "succeeded"
    assert second.status.status_code == StatusCode.UNSET
    assert "error.type" not in dict(second.attributes or {})

    snoozed, woke = by_job[str(ids["otel_snoozer"])]
    assert dict(snoozed.attributes or {})["taskq.outcome"] == "snooze"
    assert snoozed.status.status_code == StatusCode.UNSET
    assert "error.type" not in dict(snoozed.attributes or {})
    assert dict(woke.attributes or {})["taskq.outcome"] == "succeeded"

    [failed] = by_job[str(ids["otel_broken"])]
    assert dict(failed.attributes or {})["taskq.outcome"] == "failed"
    assert failed.status.status_code == StatusCode.ERROR
    assert dict(failed.attributes or {})["error.type"] == "KeyError"
    assert [e.name for e in failed.events] == ["exception"]

    [cancelled] = by_job[str(ids["otel_waiter"])]
    assert dict(cancelled.attributes or {})["taskq.outcome"] == "cancelled"
    assert cancelled.status.status_code == StatusCode.UNSET
    assert dict(cancelled.attributes or {})["taskq.cancel"].startswith("Cancel")

    # three jobs through a static bucket of one: tokens are paid before the claim, so
    # each job is claimed when its token is there and never parked: one attempt each
    limited_ids = [str(ids[k]) for k in ("otel_limited", "otel_limited_2", "otel_limited_3")]
    for job_id in limited_ids:
        [span] = by_job[job_id]
        assert dict(span.attributes or {})["taskq.outcome"] == "succeeded"
    acquires = [s for s in spans if s.name == "rate_limit acquire"]
    assert all(s.kind == SpanKind.INTERNAL for s in acquires)
    static = [
        s for s in acquires if dict(s.attributes or {})["taskq.rate_limit.bucket"] == LIMIT.name
    ]
    static_allowed = [
        s for s in static if dict(s.attributes or {})["taskq.rate_limit.decision"] == "allowed"
    ]
    assert len(static_allowed) >= 3  # the gatekeeper's prepayments (a surplus is refunded)
    assert all(
        dict(s.attributes or {})["taskq.rate_limit.primitive"] == "token_bucket" for s in static
    )

    # three jobs claimed together on one key of a keyed bucket of one: the denied ones are
    # parked (no attempt, no process span), each park an ``admit`` span that says why
    keyed_ids = {str(ids[k]) for k in ("otel_keyed", "otel_keyed_2", "otel_keyed_3")}
    for job_id in keyed_ids:
        [span] = by_job[job_id]  # parks are not attempts: one process span, attempt 1
        assert dict(span.attributes or {})["taskq.attempt"] == 1
        assert dict(span.attributes or {})["taskq.outcome"] == "succeeded"
    admits = [s for s in spans if s.name == f"admit {queue}"]
    keyed_admits = [
        s for s in admits if dict(s.attributes or {})["messaging.message.id"] in keyed_ids
    ]
    assert all(s.kind == SpanKind.INTERNAL for s in admits)
    assert all(s.context.trace_id == trace_id for s in admits)  # in the job's trace
    parked = [s for s in keyed_admits if dict(s.attributes or {})["taskq.admission"] == "parked"]
    admitted = [
        s for s in keyed_admits if dict(s.attributes or {})["taskq.admission"] == "admitted"
    ]
    assert parked
    assert sorted(
        str(dict(s.attributes or {})["messaging.message.id"]) for s in admitted
    ) == sorted(keyed_ids)  # each keyed job admitted exactly once, after its parks
    for span in parked:
        attrs = dict(span.attributes or {})
        assert attrs["taskq.waiting_on"] == "otel_outcomes.keyed:one"
        assert attrs["taskq.throttled.primitive"] == "token_bucket"
        assert float(attrs["taskq.throttled.delay_s"]) > 0
        assert span.status.status_code == StatusCode.UNSET
    for span in admitted:  # a job admitted after a park knows what it waited on
        attrs = dict(span.attributes or {})
        was_parked = any(
            dict(p.attributes or {})["messaging.message.id"] == attrs["messaging.message.id"]
            for p in parked
        )
        assert (attrs.get("taskq.waited_on") == "otel_outcomes.keyed:one") == was_parked
    # the acquires the gatekeeper made for them are children of their admit spans: one
    # allowed per admission, a denied one (or none: a key known to be empty) per park
    children: dict[int, list[str]] = {}
    for s in acquires:
        if s.parent is not None:
            decision = str(dict(s.attributes or {})["taskq.rate_limit.decision"])
            children.setdefault(s.parent.span_id, []).append(decision)
    for span in admitted:
        assert children[span.context.span_id] == ["allowed"]
    for span in parked:
        assert children.get(span.context.span_id, ["denied"]) == ["denied"]
    assert any(span.context.span_id in children for span in parked)  # the store was asked
    admit_ids = {s.context.span_id for s in keyed_admits}
    for s in acquires:
        if s.parent is not None and s.parent.span_id in admit_ids:
            assert dict(s.attributes or {})["taskq.rate_limit.bucket"] == KEYED.base_name
    # the store agrees: one denial counted per park, no attempt spent on one
    async with engine.connect() as conn:
        rows = (
            await conn.execute(
                select(jobs.c.denials, jobs.c.attempt).where(
                    jobs.c.id.in_([UUID(j) for j in keyed_ids])
                )
            )
        ).all()
    assert sum(int(r.denials) for r in rows) == len(parked)
    assert [int(r.attempt) for r in rows] == [1, 1, 1]
    every_park = [s for s in admits if dict(s.attributes or {})["taskq.admission"] == "parked"]
    assert every_park == parked  # only the keyed jobs were ever parked
    claimed = len(process) + len(parked)  # every claimed row: an attempt or a park

    # receive: one span per claim batch (no link from each attempt: the attempt's
    # relation is to its job's creation, its parent; a link per attempt is not free)
    receives = [s for s in spans if s.name == f"receive {queue}"]
    assert all(s.kind == SpanKind.CLIENT for s in receives)
    receive_ids = {s.context.span_id for s in receives}
    batches = [int(dict(s.attributes or {})["messaging.batch.message_count"]) for s in receives]  # type: ignore[arg-type]
    assert sum(batches) == claimed
    assert all(not s.links for s in process)
    assert all(any(link.context.span_id in receive_ids for link in s.links) for s in admits)
    # settle: every attempt's ending was written by a settle span linked to it
    settled = {
        link.context.span_id for s in spans if s.name.startswith("settle") for link in s.links
    }
    assert {s.context.span_id for s in process} <= settled

    # metrics
    assert _total(sdk, "taskq.job.retries", actor="otel_flaky", queue=queue) - before_retries == 1
    on_queue = {"messaging.destination.name": queue}
    assert _total(sdk, "messaging.client.consumed.messages", **on_queue) == claimed
    assert sdk.histogram_count("messaging.process.duration", **on_queue) == len(process)
    assert (
        sdk.histogram_count("messaging.process.duration", **on_queue, **{"error.type": "KeyError"})
        == 1
    )
    assert sdk.histogram_count("taskq.job.queue_latency", queue=queue) == claimed
    throttled = sdk.histogram_count(
        "taskq.job.throttled.duration", queue=queue, primitive="token_bucket"
    )
    assert throttled == len(parked)  # one point per park, none per attempt
    assert (
        sdk.histogram_count("taskq.job.throttled.duration", queue=queue, actor="otel_keyed")
        == throttled
    )
    receive_ops = {"messaging.operation.name": "receive", **on_queue}
    assert sdk.histogram_count("messaging.client.operation.duration", **receive_ops) == len(
        receives
    )
    assert sdk.histogram_count(
        "messaging.client.operation.duration", **{"messaging.operation.name": "settle"}
    )

    # no metric point anywhere carries a job id (nor any other id)
    every = sdk.all_points()
    assert every
    job_ids = {str(job_id) for job_id in ids.values()}
    for name, attrs, _ in every:
        assert "messaging.message.id" not in attrs, name
        for value in attrs.values():
            assert str(value) not in job_ids, (name, attrs)
            assert not UUID_RE.search(str(value)), (name, attrs)


@actor(name="otel_linked")
async def linked(payload: Item, ctx: JobContext[Item]) -> None:
    _saw(ctx)


async def test_process_span_linked_to_its_creation_by_a_setting(
    engine: AsyncEngine, engine_url: str | URL, unique_name: str
) -> None:
    """``otel_process_parent="link"``: the attempt starts a trace of its own, linked to
    the enqueue; the baggage stored with the job is current in the actor either way."""
    sdk = otel()
    sdk.spans.clear()
    queue = unique_name[-40:]
    client = JobsClient(SqlBackend(engine))
    token = context.attach(baggage.set_baggage("tenant", "acme"))
    try:
        with trace.get_tracer("test").start_as_current_span("request") as request:
            job_id = (await client.enqueue(linked, Item(), queue=queue)).job_id
    finally:
        context.detach(token)
    settings = worker_settings(engine_url, queues=(queue,), otel_process_parent="link")
    async with running_worker(settings, {linked.name: linked}):

        async def done() -> bool:
            return await _status(engine, job_id) == "succeeded"

        await wait_until(done)
    spans = sdk.spans.get_finished_spans()
    [send] = [s for s in spans if s.name == f"send {queue}"]
    [span] = [s for s in spans if s.name == f"process {queue}"]
    assert span.parent is None
    assert span.context.trace_id != request.get_span_context().trace_id
    assert [link.context.span_id for link in span.links if link.attributes] == [
        send.context.span_id
    ]
    assert seen[(str(job_id), 1)] == {"span_id": span.context.span_id, "tenant": "acme"}
