"""The fleet demo's actors, all on the queue ``fleet``.

- ``call_partner_api``: limited per partner to 2 at once and 2 a second by the keyed
  token bucket ``fleet.partner_api:<partner>`` (in-process; Redis when
  ``TASKQ_REDIS_URL`` is set). The key depends on the payload, so the worker checks it
  after the claim and parks the jobs it denies (``waiting_on`` names the bucket).
- ``build_report``: a long job that checks ``ctx.check_cancelled()`` between steps, so
  an operator's cancel ends it ``CancelledCooperatively``.
- ``migrate_tenant``: a long job that is running when the deploy's SIGTERM arrives; it
  raises when the worker asks it to stop, goes back to ``pending`` with no budget spent,
  and finishes on the next worker.
- ``sync_inventory``, on its own queue ``fleet.inventory``: the job of the every-second
  schedule ``INVENTORY_SCHEDULE`` that an operator stores during the demo. Its
  ``max_pending=6`` is the schedule's backlog budget (a tick beyond it is refused), and the
  schedule's ``missed="all", max_catchup=2`` its catch-up budget (after an outage, the
  two most recent missed ticks run, the rest are dropped).
"""

from __future__ import annotations

import asyncio
import os
from datetime import timedelta
from typing import Any, Literal

from pydantic import BaseModel

from taskq import ActorRef, JobContext, Schedule, actor
from taskq.ratelimit import KeyedRateLimitRef

QUEUE = "fleet"
BACKEND: Literal["redis", "memory"] = "redis" if os.environ.get("TASKQ_REDIS_URL") else "memory"


class PartnerCall(BaseModel):
    n: int
    partner: str = "acme"


PARTNER_CAPACITY = 2
PARTNER_RATE = 2.0
PARTNER_API = KeyedRateLimitRef.typed(
    PartnerCall,
    base_name="fleet.partner_api",
    key_fn=lambda p: p.partner,
    capacity=PARTNER_CAPACITY,
    refill_per_second=PARTNER_RATE,
    backend=BACKEND,
)


class Report(BaseModel):
    name: str
    steps: int


class Tenant(BaseModel):
    tenant: str
    steps: int


class Done(BaseModel):
    steps: int
    attempt: int


@actor(name="fleet_call_partner_api", queue=QUEUE, rate_limits=[PARTNER_API])
async def call_partner_api(payload: PartnerCall) -> Done:
    """One call to a partner that allows two at once and two a second."""
    return Done(steps=1, attempt=1)


@actor(name="fleet_build_report", queue=QUEUE)
async def build_report(payload: Report, ctx: JobContext[Report]) -> Done:
    """Many small steps; exits promptly once cancelled."""
    for step in range(payload.steps):
        ctx.check_cancelled()  # raises CancelledError once an operator cancelled the job
        await ctx.progress(step=step)
        await asyncio.sleep(0.1)
    return Done(steps=payload.steps, attempt=ctx.attempt)


@actor(name="fleet_migrate_tenant", queue=QUEUE)
async def migrate_tenant(payload: Tenant, ctx: JobContext[Tenant]) -> Done:
    """Long enough to be caught by a deploy; safe to run again from the start."""
    for _ in range(payload.steps):
        ctx.check_cancelled()  # also set when the worker is shutting down
        await asyncio.sleep(0.1)
    return Done(steps=payload.steps, attempt=ctx.attempt)


INVENTORY_QUEUE = "fleet.inventory"
INVENTORY_BACKLOG = 6
"""``sync_inventory``'s ``max_pending``: how many of its jobs may wait at once. Room for
the two catch-up jobs after the deploy, beside the ticks the stopping worker enqueued."""


class Inventory(BaseModel):
    warehouse: str = "north"


@actor(name="fleet_sync_inventory", queue=INVENTORY_QUEUE, max_pending=INVENTORY_BACKLOG)
async def sync_inventory(payload: Inventory) -> Done:
    """Pull the warehouse's stock levels (pretend); run by a schedule every second."""
    return Done(steps=1, attempt=1)


INVENTORY_SCHEDULE = Schedule(
    every=timedelta(seconds=1),
    id="fleet-inventory-sync",
    payload=Inventory(),
    missed="all",
    max_catchup=2,
)
"""Stored by the demo's operator with ``tq.schedules.create`` (not declared on the
actor, so it ticks only from the moment the operator adds it)."""

QUEUES = ("fleet", INVENTORY_QUEUE)
"""The queues the demo's workers claim."""

registry: dict[str, ActorRef[Any, Any]] = {
    ref.name: ref for ref in (call_partner_api, build_report, migrate_tenant, sync_inventory)
}
