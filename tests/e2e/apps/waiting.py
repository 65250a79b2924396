"""Actors held back by limits, for the waiting tests and ``benchmarks/throttled.py``.

The limits are configured from the environment, so that each test (and each benchmark
case) gets primitives of its own on the shared Redis:

- ``TASKQ_W_BUCKET`` / ``TASKQ_W_CAPACITY`` / ``TASKQ_W_RATE``: the token bucket of
  ``w_throttled`` (Redis-backed);
- ``TASKQ_W_MUTEX``: the one-slot reservation of ``w_mutex`` (lease
  ``TASKQ_W_MUTEX_LEASE`` seconds, default 300: a release, not the lease, must free it);
- ``TASKQ_W_KEYED`` / ``TASKQ_W_KEYED_RATE``: the base name and refill of the keyed
  per-tenant bucket of ``w_tenant`` (capacity 1).

Every actor appends ``job_id attempt pid event time`` lines to ``$TASKQ_E2E_RUNS``
(see :mod:`tests.e2e.apps.basic`).
"""

from __future__ import annotations

import asyncio
import os
import time
from datetime import timedelta
from typing import Any

from pydantic import BaseModel

from taskq import actor
from taskq.context import JobContext
from taskq.ratelimit import ConcurrencyReservation, KeyedRateLimitRef, TokenBucket
from tests.e2e.apps.basic import _record


class Work(BaseModel):
    n: int = 0
    seconds: float = 0.0


class TenantWork(BaseModel):
    tenant: str
    n: int = 0


def _env(name: str, default: str) -> str:
    return os.environ.get(name, default)


BUCKET = TokenBucket(
    _env("TASKQ_W_BUCKET", "w_bucket"),
    capacity=float(_env("TASKQ_W_CAPACITY", "5")),
    refill_per_second=float(_env("TASKQ_W_RATE", "5")),
)
MUTEX = ConcurrencyReservation(
    _env("TASKQ_W_MUTEX", "w_mutex"),
    slots=1,
    lease=timedelta(seconds=float(_env("TASKQ_W_MUTEX_LEASE", "300"))),
)
TENANT_LIMIT = KeyedRateLimitRef(
    payload_type=TenantWork,
    base_name=_env("TASKQ_W_KEYED", "w_tenant"),
    key_fn=lambda p: p.tenant,
    capacity=1,
    refill_per_second=float(_env("TASKQ_W_KEYED_RATE", "2")),
)


@actor(name="w_throttled", rate_limits=[BUCKET])
async def throttled(payload: Work, ctx: JobContext[Work]) -> None:
    """One token per job from the shared bucket."""
    _record(ctx.job_id, ctx.attempt, os.getpid(), "start", repr(time.time()))


@actor(name="w_mutex", reservations=[MUTEX])
async def mutex(payload: Work, ctx: JobContext[Work]) -> None:
    """Holds the fleet-wide one-slot reservation for ``seconds``."""
    _record(ctx.job_id, ctx.attempt, os.getpid(), "start", repr(time.time()))
    await asyncio.sleep(payload.seconds)
    _record(ctx.job_id, ctx.attempt, os.getpid(), "end", repr(time.time()))


@actor(name="w_tenant", rate_limits=[TENANT_LIMIT])
async def tenant(payload: TenantWork, ctx: JobContext[TenantWork]) -> None:
    """One token per job from its tenant's bucket."""
    _record(ctx.job_id, ctx.attempt, os.getpid(), "start", repr(time.time()))


registry: dict[str, Any] = {ref.name: ref for ref in (throttled, mutex, tenant)}
