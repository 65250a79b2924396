"""Advanced: singleton, ``unique_for``, ``idempotency_key``, ``max_pending``, ``Snooze``,
cancelling before start, and the ``on_success`` hook.

Everything here is decided at enqueue time, before the worker starts, so the notes
under the title are what the enqueue calls returned:

- ``nightly_report`` is ``singleton=True``: a second enqueue while the first is active
  raises ``SingletonCollisionError`` whose ``blocking_job_id`` is the first job.
- ``sync_account`` has ``unique_for=10 min``: a second enqueue with the same
  ``identity_key`` returns the first job's handle with ``was_existing=True``.
- ``charge`` enqueued twice with one ``idempotency_key`` is one job, ever.
- ``ingest`` has ``max_pending=2``: the third enqueue raises
  ``MaxPendingExceededError`` (``current_count=2``, ``max_pending=2``).
- ``wait_for_export`` raises ``Snooze`` on its first attempt: ``snoozed,succeeded``, no
  retry budget spent.
- a job scheduled an hour out and cancelled before it ran ends ``cancelled`` with
  ``error_class='CancelledBeforeStart'``; no attempt, no hook.
- ``nightly_report``'s ``on_success`` hook runs once after its success is written.

Run: ``python -m examples.actors.advanced [--database-url URL]``.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterable
from datetime import timedelta
from typing import Any
from uuid import UUID

from pydantic import BaseModel

from examples.actors import runner
from taskq import (
    JobContext,
    MaxPendingExceededError,
    SingletonCollisionError,
    Snooze,
    TaskQ,
    actor,
)

QUEUE = "examples.advanced"
notes_seen: list[str] = []


class Report(BaseModel):
    day: str


class Account(BaseModel):
    account_id: str


class Charge(BaseModel):
    order_id: str
    cents: int


class Event(BaseModel):
    n: int


class Export(BaseModel):
    export_id: int


async def report_done(job_row: Any, result: Any) -> None:
    notes_seen.append(f"on_success: {job_row['actor']} finished")


@actor(name="examples_advanced_nightly_report", queue=QUEUE, singleton=True, on_success=report_done)
async def nightly_report(payload: Report) -> None:
    """At most one active job of this actor, fleet-wide."""


@actor(name="examples_advanced_sync_account", queue=QUEUE, unique_for=timedelta(minutes=10))
async def sync_account(payload: Account) -> None:
    """One sync per account per ten minutes."""


@actor(name="examples_advanced_charge", queue=QUEUE)
async def charge(payload: Charge) -> None:
    """A charge must never happen twice: the caller passes an idempotency key."""


@actor(name="examples_advanced_ingest", queue=QUEUE, max_pending=2)
async def ingest(payload: Event) -> None:
    """Backpressure: at most two waiting jobs."""


@actor(name="examples_advanced_wait_for_export", queue=QUEUE)
async def wait_for_export(payload: Export, ctx: JobContext[Export]) -> None:
    """The export is not ready on the first look."""
    if ctx.attempt == 1:
        raise Snooze(timedelta(milliseconds=200))


async def enqueue(tq: TaskQ) -> Iterable[UUID]:
    run = uuid.uuid4().hex[:8]  # keys unique to this run: a rerun on one database is fresh
    ids: list[UUID] = []

    first = await tq.jobs.enqueue(nightly_report, Report(day=run))
    ids.append(first.job_id)
    try:
        await tq.jobs.enqueue(nightly_report, Report(day=run))
    except SingletonCollisionError as exc:
        same = exc.blocking_job_id == first.job_id
        notes_seen.append(f"singleton: second enqueue refused, blocked by the first job: {same}")

    a = await tq.jobs.enqueue(sync_account, Account(account_id="a1"), identity_key=f"a1-{run}")
    b = await tq.jobs.enqueue(sync_account, Account(account_id="a1"), identity_key=f"a1-{run}")
    ids.append(a.job_id)
    notes_seen.append(
        f"unique_for: second enqueue was_existing={b.was_existing}, same job: {a.job_id == b.job_id}"
    )

    key = f"order-42-{run}"
    c1 = await tq.jobs.enqueue(charge, Charge(order_id="42", cents=999), idempotency_key=key)
    c2 = await tq.jobs.enqueue(charge, Charge(order_id="42", cents=999), idempotency_key=key)
    ids.append(c1.job_id)
    notes_seen.append(f"idempotency_key: second enqueue was_existing={c2.was_existing}")

    for n in range(3):
        try:
            ids.append((await tq.jobs.enqueue(ingest, Event(n=n))).job_id)
        except MaxPendingExceededError as exc:
            notes_seen.append(
                f"max_pending: enqueue {n + 1} refused ({exc.current_count}/{exc.max_pending})"
            )

    ids.append((await tq.jobs.enqueue(wait_for_export, Export(export_id=7))).job_id)

    later = await tq.jobs.enqueue(
        sync_account, Account(account_id="b2"), identity_key=f"b2-{run}", delay=timedelta(hours=1)
    )
    cancelled = await later.cancel()
    notes_seen.append(f"cancelled before start: {cancelled.status} / {cancelled.error_class}")
    ids.append(later.job_id)
    return ids


async def notes(tq: TaskQ, report: runner.Report) -> list[str]:
    for _ in range(100):  # the hook runs just after the success is written
        if any(line.startswith("on_success") for line in notes_seen):
            break
        await asyncio.sleep(0.05)
    return list(notes_seen)


async def example(database_url: str | None = None) -> runner.Report:
    notes_seen.clear()
    return await runner.run(
        "advanced: enqueue-time guarantees, Snooze, hooks",
        [nightly_report, sync_account, charge, ingest, wait_for_export],
        enqueue,
        database_url=database_url,
        notes=notes,
    )


if __name__ == "__main__":
    runner.main(example)
