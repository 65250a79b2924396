"""Real world: an order pipeline that ties payload, result, context, DI, retry and
``unique_for`` together (the actors page's full worked example, runnable).

What to observe:

- ``process_order`` gets its ``PaymentGateway`` injected (``Scope.LOOP``). The gateway
  answers the first charge of each order with a 429; the actor turns that into
  ``RetryAfter``, so each order shows ``retried,succeeded`` with a spent attempt.
- it checks the gateway before charging: a retry after a crash never charges twice.
- the customer double-clicks: the second submit of order ``A-1`` has
  ``was_existing=True`` (``unique_for=10 min`` on ``identity_key=order_id``), one job.
- a successful charge enqueues ``send_receipt`` as a sub-job (``parent_job_id`` set).
- the client waits for each order with ``handle.wait()`` while the worker runs and gets
  a typed ``OrderResult`` back; the gateway's ledger shows one charge per order.

Run: ``python -m examples.actors.real_world [--database-url URL]``.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from datetime import timedelta
from uuid import UUID

from pydantic import BaseModel

from examples.actors import runner
from taskq import JobContext, JobHandle, RetryAfter, RetryPolicy, TaskQ, actor
from taskq.di import ProviderRegistry, Scope

QUEUE = "examples.orders"
ledger: list[str] = []
waited: list[str] = []
_handles: list[JobHandle[OrderResult]] = []


class OrderPayload(BaseModel):
    order_id: str
    customer_email: str
    amount_cents: int


class OrderResult(BaseModel):
    confirmation_number: str


class ReceiptPayload(BaseModel):
    order_id: str
    email: str


class GatewayRateLimited(Exception):
    def __init__(self, retry_after_seconds: float) -> None:
        super().__init__("429 Too Many Requests")
        self.retry_after_seconds = retry_after_seconds


class PaymentGateway:
    """A fake payment provider: rate-limits the first charge of each order."""

    def __init__(self) -> None:
        self.charged: dict[str, str] = {}
        self.refused: set[str] = set()

    async def status(self, order_id: str) -> str:
        return "already_charged" if order_id in self.charged else "new"

    async def charge(self, order_id: str, amount_cents: int) -> str:
        if order_id not in self.refused:
            self.refused.add(order_id)
            raise GatewayRateLimited(retry_after_seconds=0.1)
        confirmation = f"CONF-{order_id}"
        self.charged[order_id] = confirmation
        ledger.append(f"charged {order_id}: {amount_cents} cents")
        return confirmation


@actor(
    name="examples_orders_process_order",
    queue=QUEUE,
    retry=RetryPolicy(max_attempts=5, base=timedelta(milliseconds=100), jitter=0.0),
    result_ttl=timedelta(hours=24),
    unique_for=timedelta(minutes=10),
    max_pending=5000,
)
async def process_order(
    payload: OrderPayload, ctx: JobContext[OrderPayload], *, gateway: PaymentGateway
) -> OrderResult:
    """Charge the order once, then queue its receipt."""
    if await gateway.status(payload.order_id) == "already_charged":
        return OrderResult(confirmation_number=gateway.charged[payload.order_id])
    try:
        confirmation = await gateway.charge(payload.order_id, payload.amount_cents)
    except GatewayRateLimited as exc:
        raise RetryAfter(timedelta(seconds=exc.retry_after_seconds)) from exc
    assert ctx.jobs is not None
    await ctx.jobs.enqueue(
        send_receipt, ReceiptPayload(order_id=payload.order_id, email=payload.customer_email)
    )
    return OrderResult(confirmation_number=confirmation)


@actor(name="examples_orders_send_receipt", queue=QUEUE)
async def send_receipt(payload: ReceiptPayload) -> None:
    """Email the receipt (pretend)."""
    ledger.append(f"receipt for {payload.order_id} to {payload.email}")


def providers() -> ProviderRegistry:
    registry = ProviderRegistry()
    registry.register_class(PaymentGateway, Scope.LOOP)
    registry.validate(actors=[process_order, send_receipt])
    return registry


async def submit_order(tq: TaskQ, order_id: str, email: str, cents: int) -> JobHandle[OrderResult]:
    """What the web app calls when the customer clicks "Pay"."""
    handle = await tq.jobs.enqueue(
        process_order,
        OrderPayload(order_id=order_id, customer_email=email, amount_cents=cents),
        identity_key=order_id,  # unique_for dedupes on this
    )
    if handle.was_existing:
        waited.append(f"order {order_id} already queued: job {handle.job_id}")
    return handle


async def enqueue(tq: TaskQ) -> Iterable[UUID]:
    run = uuid.uuid4().hex[:6]  # order ids unique to this run: a rerun starts fresh
    orders = [(f"A-1-{run}", "ann@example.com", 1999), (f"B-2-{run}", "bob@example.com", 4500)]
    _handles[:] = [await submit_order(tq, *order) for order in orders]
    await submit_order(tq, *orders[0])  # the double click
    return [h.job_id for h in _handles]


async def wait_for_orders(tq: TaskQ) -> None:
    for handle in _handles:
        result = await handle.wait(timeout=30)
        waited.append(f"{type(result).__name__}: {result.confirmation_number}")


async def notes(tq: TaskQ, report: runner.Report) -> list[str]:
    return [*waited, *ledger]


async def example(database_url: str | None = None) -> runner.Report:
    ledger.clear()
    waited.clear()
    return await runner.run(
        "real world: an order pipeline",
        [process_order, send_receipt],
        enqueue,
        database_url=database_url,
        di_registry=providers(),
        during=wait_for_orders,
        notes=notes,
    )


if __name__ == "__main__":
    runner.main(example)
