"""Rate limiting: a token bucket, a per-tenant keyed bucket and a strict one-slot mutex.

What to observe:

- ``geocode`` takes a token from ``examples.geocoder`` (capacity 2, refilled at 10 a
  second) per run. Eight jobs arrive at once on a worker with eight slots: the worker
  checks the bucket **before it claims**, so it claims two, and the other six stay
  ``pending`` (untouched: no attempt row, no retry budget) until tokens are back. All
  eight succeed with exactly one attempt each.
- ``sync_tenant`` is limited per tenant by a ``KeyedRateLimitRef`` (capacity 1): the
  key depends on the payload, so it is checked after the claim. Tenant ``acme``'s second
  and third jobs are denied and **parked** once each (``scheduled`` until
  ``examples.tenant:acme`` admits them, ``waiting_on`` naming it, ``denials`` counting
  the park; no attempt row), while ``globex`` has its own bucket.
- ``render_pdf`` holds a ``ConcurrencyReservation`` with ``slots=1``: however many
  worker slots are free, the jobs run one at a time. Each job reports how many renders
  were in flight when it started (``in_flight``): always 1. The second job is not
  claimed while the first holds the slot.

The example prints how many attempts a limit cost (always 0: a denial is not an
attempt) and how many parks the store counted (``jobs.denials``).

The buckets use ``backend="memory"`` (one worker process, nothing to install); with
``TASKQ_REDIS_URL`` set they use Redis, shared by every worker of a fleet.

Run: ``python -m examples.actors.ratelimit [--database-url URL]``.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterable
from datetime import timedelta
from typing import Any, Literal
from uuid import UUID

from pydantic import BaseModel

from examples.actors import runner
from taskq import ActorRef, TaskQ, actor
from taskq.ratelimit import ConcurrencyReservation, KeyedRateLimitRef, TokenBucket

QUEUE = "examples.ratelimit"
BACKEND: Literal["redis", "memory"] = "redis" if os.environ.get("TASKQ_REDIS_URL") else "memory"


class Address(BaseModel):
    street: str


class Coordinates(BaseModel):
    lat: float
    lon: float


class TenantSync(BaseModel):
    tenant: str
    page: int


class Page(BaseModel):
    tenant: str
    page: int


class Render(BaseModel):
    document: str


class Rendered(BaseModel):
    document: str
    in_flight: int


GEOCODER = TokenBucket("examples.geocoder", capacity=2, refill_per_second=10, backend=BACKEND)
PER_TENANT = KeyedRateLimitRef.typed(
    TenantSync,
    base_name="examples.tenant",
    key_fn=lambda p: p.tenant,
    capacity=1,
    refill_per_second=10,
    backend=BACKEND,
)
PDF_MUTEX = ConcurrencyReservation("examples.pdf", slots=1, lease=timedelta(seconds=2))

_in_flight = 0


@actor(name="examples_ratelimit_geocode", queue=QUEUE, rate_limits=[GEOCODER])
async def geocode(payload: Address) -> Coordinates:
    """Calls a third-party API that allows 2 at once and 10 a second."""
    seed = sum(map(ord, payload.street))
    return Coordinates(lat=seed % 180 - 90.0, lon=seed % 360 - 180.0)


@actor(name="examples_ratelimit_sync_tenant", queue=QUEUE, rate_limits=[PER_TENANT])
async def sync_tenant(payload: TenantSync) -> Page:
    """One bucket per tenant: a busy tenant never holds back a quiet one."""
    return Page(tenant=payload.tenant, page=payload.page)


@actor(name="examples_ratelimit_render_pdf", queue=QUEUE, reservations=[PDF_MUTEX])
async def render_pdf(payload: Render) -> Rendered:
    """A thread-unsafe renderer: the reservation makes it a fleet-wide mutex."""
    global _in_flight
    _in_flight += 1
    try:
        seen = _in_flight
        await asyncio.sleep(0.05)
        return Rendered(document=payload.document, in_flight=seen)
    finally:
        _in_flight -= 1


async def enqueue(tq: TaskQ) -> Iterable[UUID]:
    items: list[tuple[ActorRef[Any, Any], BaseModel]] = []
    items += [(geocode, Address(street=f"{n} Main Street")) for n in range(8)]
    items += [(sync_tenant, TenantSync(tenant="acme", page=n)) for n in range(3)]
    items += [(sync_tenant, TenantSync(tenant="globex", page=n)) for n in range(2)]
    items += [(render_pdf, Render(document=f"invoice-{n}.pdf")) for n in range(2)]
    handles = await tq.jobs.enqueue_many(items)
    return [h.job_id for h in handles]


async def notes(tq: TaskQ, report: runner.Report) -> list[str]:
    snoozed = sum(1 for job in report.jobs for outcome in job.outcomes if outcome == "snoozed")
    parks: dict[str, int] = {}
    for job in report.jobs:
        record = await (await tq.jobs.get(job.id)).refresh()
        parks[job.actor] = parks.get(job.actor, 0) + record.denials
    renders = [j.result["in_flight"] for j in report.by_actor(render_pdf.name)]
    return [
        f"attempts a limit cost (snoozed attempt rows): {snoozed}",
        f"parks the store counted (jobs.denials): {parks[sync_tenant.name]} for "
        f"{sync_tenant.name}, {parks[geocode.name]} for {geocode.name} (held before the claim)",
        f"renders in flight when each started: {renders}",
    ]


async def example(database_url: str | None = None) -> runner.Report:
    return await runner.run(
        "ratelimit: token buckets, keyed buckets, a one-slot reservation",
        [geocode, sync_tenant, render_pdf],
        enqueue,
        database_url=database_url,
        notes=notes,
    )


if __name__ == "__main__":
    runner.main(example)
