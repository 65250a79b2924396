"""Chained: sub-jobs enqueued from inside an actor (``ctx.jobs``), a chain and a fan-out.

What to observe:

- ``place_order`` enqueues ``charge_card``, which enqueues ``send_receipt``: three jobs,
  each child's ``parent_job_id`` pointing at the job that enqueued it (the ``parent``
  lines under the title).
- ``split_batch`` fans out one ``resize`` job per image: the children run in parallel
  on the worker's slots and each returns its own result.
- children inherit the parent's tags (``order:1001`` on all three jobs of the chain).

Sub-jobs of an actor that has no ``AsyncConnection`` registered at ``Scope.LOOP`` are
written as they are enqueued, each in its own transaction (the autonomous path): they
exist even if the parent later fails, and the worker says so once (the
``sub_enqueue_autonomous_fallback`` warning you see first). See docs/jobs-and-clients.md for the
transactional path, where they are written only once the parent has succeeded.

Run: ``python -m examples.actors.chained [--database-url URL]``.
"""

from __future__ import annotations

from collections.abc import Iterable
from uuid import UUID

from pydantic import BaseModel

from examples.actors import runner
from taskq import JobContext, TaskQ, actor

QUEUE = "examples.chained"


class Order(BaseModel):
    order_id: int
    cents: int


class Receipt(BaseModel):
    order_id: int
    email: str


class Confirmation(BaseModel):
    order_id: int
    step: str


class Batch(BaseModel):
    images: list[str]


class Image(BaseModel):
    name: str


class Resized(BaseModel):
    name: str
    width: int


@actor(name="examples_chained_place_order", queue=QUEUE)
async def place_order(payload: Order, ctx: JobContext[Order]) -> Confirmation:
    """Step 1: accept the order, then hand the charge to its own job."""
    assert ctx.jobs is not None
    await ctx.jobs.enqueue(charge_card, payload)
    return Confirmation(order_id=payload.order_id, step="placed")


@actor(name="examples_chained_charge_card", queue=QUEUE)
async def charge_card(payload: Order, ctx: JobContext[Order]) -> Confirmation:
    """Step 2: charge, then queue the receipt."""
    assert ctx.jobs is not None
    await ctx.jobs.enqueue(
        send_receipt, Receipt(order_id=payload.order_id, email="buyer@example.com")
    )
    return Confirmation(order_id=payload.order_id, step=f"charged {payload.cents} cents")


@actor(name="examples_chained_send_receipt", queue=QUEUE)
async def send_receipt(payload: Receipt) -> Confirmation:
    """Step 3: the last link."""
    return Confirmation(order_id=payload.order_id, step=f"receipt sent to {payload.email}")


@actor(name="examples_chained_split_batch", queue=QUEUE)
async def split_batch(payload: Batch, ctx: JobContext[Batch]) -> None:
    """Fan out: one child job per image."""
    assert ctx.jobs is not None
    for name in payload.images:
        await ctx.jobs.enqueue(resize, Image(name=name))


@actor(name="examples_chained_resize", queue=QUEUE)
async def resize(payload: Image) -> Resized:
    """One image of the batch."""
    return Resized(name=payload.name, width=800)


async def enqueue(tq: TaskQ) -> Iterable[UUID]:
    order = await tq.jobs.enqueue(
        place_order, Order(order_id=1001, cents=2500), tags=["order:1001"]
    )
    batch = await tq.jobs.enqueue(split_batch, Batch(images=["a.png", "b.png", "c.png"]))
    return [order.job_id, batch.job_id]


async def notes(tq: TaskQ, report: runner.Report) -> list[str]:
    names = {job.id: job.actor for job in report.jobs}
    return [
        f"parent of {job.actor}: {names.get(job.parent_job_id, '?')} (tags {job.tags})"
        for job in report.jobs
        if job.parent_job_id is not None
    ]


async def example(database_url: str | None = None) -> runner.Report:
    return await runner.run(
        "chained: sub-jobs, a chain and a fan-out",
        [place_order, charge_card, send_receipt, split_batch, resize],
        enqueue,
        database_url=database_url,
        notes=notes,
    )


if __name__ == "__main__":
    runner.main(example)
