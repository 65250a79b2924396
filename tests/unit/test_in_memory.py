"""InMemoryBackend execution: stubs, retries on the fake clock, snoozes, and the page's full example."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pydantic import BaseModel
from structlog.testing import capture_logs

from taskq import actor
from taskq.client import JobsClient
from taskq.context import JobContext
from taskq.exceptions import JobFailedError, MaxPendingExceededError, RetryAfter, Snooze
from taskq.retry import RetryPolicy
from taskq.testing.clock import FakeClock
from taskq.testing.in_memory import InMemoryBackend


class Num(BaseModel):
    value: int


class Out(BaseModel):
    value: int


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(datetime(2025, 1, 1, tzinfo=UTC))


@pytest.fixture
def backend(clock: FakeClock) -> InMemoryBackend:
    return InMemoryBackend(clock=clock)


@actor(name="mem_flaky", retry=RetryPolicy(max_attempts=3, base=timedelta(seconds=10), jitter=0))
async def flaky(payload: Num) -> Out:
    raise RuntimeError("boom")


async def test_retries_follow_the_policy_on_the_fake_clock(
    backend: InMemoryBackend, clock: FakeClock
) -> None:
    client = JobsClient(backend)
    handle = await client.enqueue(flaky, Num(value=1))
    assert await backend.run_until_drained() == 1
    record = await handle.refresh()
    assert (record.status, record.attempt, record.budget_used) == ("scheduled", 1, 1)
    assert record.scheduled_at == clock.now() + timedelta(seconds=10)
    assert await backend.run_until_drained() == 0  # not due yet
    clock.advance(timedelta(seconds=10))
    assert await backend.run_until_drained() == 1
    clock.advance(timedelta(seconds=20))
    assert await backend.run_until_drained() == 1
    with pytest.raises(JobFailedError) as info:
        await handle.wait()
    assert info.value.error_class == "RuntimeError"
    assert [a.outcome for a in await handle.attempts()] == ["retried", "retried", "failed"]


async def test_snooze_spends_no_budget(backend: InMemoryBackend, clock: FakeClock) -> None:
    calls: list[int] = []

    @actor(name="mem_snoozer", retry=RetryPolicy(max_attempts=1))
    async def snoozer(payload: Num, ctx: JobContext[Num]) -> None:
        calls.append(ctx.attempt)
        if len(calls) < 3:
            raise Snooze(timedelta(minutes=2))

    handle = await JobsClient(backend).enqueue(snoozer, Num(value=1))
    for _ in range(3):
        await backend.run_until_drained()
        clock.advance(timedelta(minutes=2))
    assert await handle.wait(timeout=1) is None
    record = await handle.refresh()
    assert (record.attempt, record.budget_used) == (3, 0)


async def test_retry_after_without_budget(backend: InMemoryBackend, clock: FakeClock) -> None:
    @actor(name="mem_retry_after", retry=RetryPolicy(max_attempts=1))
    async def limited(payload: Num) -> Out:
        raise RetryAfter(timedelta(seconds=5), consume_budget=False)

    handle = await JobsClient(backend).enqueue(limited, Num(value=1))
    await backend.run_until_drained()
    record = await handle.refresh()
    assert (record.status, record.budget_used) == ("scheduled", 0)
    assert record.scheduled_at == clock.now() + timedelta(seconds=5)


async def test_bare_name_stub_gets_a_passthrough_payload(backend: InMemoryBackend) -> None:
    with capture_logs() as logs:
        backend.register_stub(
            "mem_flaky", lambda payload, ctx: {"value": payload.value + ctx.attempt}
        )
    assert any(e["event"] == "in_memory_stub_by_name" for e in logs)
    handle = await JobsClient(backend).enqueue(flaky, Num(value=1))
    await backend.run_until_drained()
    assert (await handle.refresh()).result == {"value": 2}


async def test_invalid_stored_payload_fails_without_retry(backend: InMemoryBackend) -> None:
    handle = await JobsClient(backend).enqueue(flaky, Num(value=1))
    backend.jobs[handle.job_id] = __import__("dataclasses").replace(
        backend.jobs[handle.job_id], payload={"value": "x"}
    )
    await backend.run_until_drained()
    record = await handle.refresh()
    assert (record.status, record.error_class) == ("failed", "PayloadValidationError")


async def test_connection_argument_is_rejected(backend: InMemoryBackend) -> None:
    with pytest.raises(TypeError, match="connection"):
        await JobsClient(backend).enqueue(flaky, Num(value=1), connection=object())  # type: ignore[arg-type]


# --- the page's "Full worked example", with a stubbed gateway --------------------------


class OrderPayload(BaseModel):
    order_id: str
    customer_id: str
    amount_cents: int


class OrderResult(BaseModel):
    confirmation_number: str
    charged_at: str


class ReceiptPayload(BaseModel):
    order_id: str
    email: str


class PaymentGateway:
    async def charge(self, order_id: str, amount_cents: int) -> dict[str, str]:
        return {"confirmation": f"C-{order_id}", "charged_at": "2025-01-01"}

    async def status(self, order_id: str) -> str:
        return "new"


class RateLimitError(Exception):
    retry_after_seconds = 1


@actor(name="wx_send_receipt")
async def send_receipt(payload: ReceiptPayload) -> None: ...


@actor(
    name="process_order",
    queue="payments",
    retry=RetryPolicy(kind="transient", max_attempts=5, base=timedelta(seconds=10)),
    result_ttl=timedelta(hours=24),
    unique_for=timedelta(minutes=10),
    unique_states=("pending", "scheduled", "running"),
    max_pending=5000,
)
async def process_order(
    payload: OrderPayload,
    ctx: JobContext[OrderPayload],
    *,
    gateway: PaymentGateway,
) -> OrderResult:
    ctx.log.info("charging", order_id=payload.order_id, attempt=ctx.attempt)

    if ctx.cancellation_requested:
        raise Snooze(timedelta(minutes=1))

    current_status = await gateway.status(payload.order_id)
    if current_status == "already_charged":
        return OrderResult(confirmation_number="DEDUP", charged_at="")

    try:
        charge = await gateway.charge(payload.order_id, payload.amount_cents)
    except RateLimitError as exc:
        raise RetryAfter(timedelta(seconds=exc.retry_after_seconds)) from exc

    assert ctx.jobs is not None
    await ctx.jobs.enqueue(
        send_receipt,
        ReceiptPayload(order_id=payload.order_id, email=payload.customer_id),
    )

    return OrderResult(
        confirmation_number=charge["confirmation"],
        charged_at=charge["charged_at"],
    )


async def submit_order(client: Any, order_id: str, customer_id: str, amount_cents: int) -> Any:
    try:
        handle = await client.enqueue(
            process_order,
            OrderPayload(order_id=order_id, customer_id=customer_id, amount_cents=amount_cents),
            identity_key=order_id,  # required for unique_for dedup to take effect
        )
    except MaxPendingExceededError:
        raise RuntimeError("payment queue is full") from None

    if handle.was_existing:
        print(f"order {order_id} already queued: {handle.job_id}")
        return handle.job_id

    result: OrderResult = await handle.wait(timeout=30.0)
    print(f"confirmed: {result.confirmation_number}")
    return handle.job_id


class _SubJobs:
    def __init__(self, client: JobsClient) -> None:
        self.client = client

    async def enqueue(self, actor: Any, payload: Any, /, **options: Any) -> Any:
        return await self.client.enqueue(actor, payload, **options)


async def test_full_worked_example(backend: InMemoryBackend) -> None:
    client = JobsClient(backend)
    gateway = PaymentGateway()

    async def run_process_order(payload: OrderPayload, ctx: Any) -> OrderResult:
        from taskq._ids import new_uuid

        full = JobContext(
            ctx.job_id,
            "process_order",
            "payments",
            ctx.attempt,
            new_uuid(),
            payload,
            jobs=_SubJobs(client),
        )
        result: OrderResult = await process_order(payload, full, gateway=gateway)
        return result

    backend.register_stub(process_order, run_process_order)

    async def drain_when_enqueued() -> None:
        async with backend._changed:  # woken by the enqueue's notification
            await backend._changed.wait_for(lambda: bool(backend.jobs))
        await backend.run_until_drained()

    drainer = asyncio.create_task(drain_when_enqueued())
    job_id = await submit_order(client, "o-1", "c@example.com", 500)
    await drainer
    actors = sorted(j.actor for j in backend.jobs.values())
    assert actors == ["process_order", "wx_send_receipt"]
    assert backend.jobs[job_id].result == {
        "confirmation_number": "C-o-1",
        "charged_at": "2025-01-01",
    }
    # A second submit inside the window dedupes only while the first is active; it succeeded,
    # and this actor's unique_states exclude "succeeded", so a new job is created.
    second = await client.enqueue(
        process_order,
        OrderPayload(order_id="o-1", customer_id="c", amount_cents=1),
        identity_key="o-1",
    )
    assert not second.was_existing
    dup = await client.enqueue(
        process_order,
        OrderPayload(order_id="o-1", customer_id="c", amount_cents=1),
        identity_key="o-1",
    )
    assert dup.was_existing
    assert dup.job_id == second.job_id
