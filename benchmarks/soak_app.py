"""The soak's mix: async sleeps, sync work in threads, a retried failure, progress reports.

Every run appends its start and its end to the audit table (``$TASKQ_SOAK_AUDIT``, lines
``job attempt pid event time`` written with ``O_APPEND``; events ``start``, ``end``,
``fail``), which :mod:`benchmarks.soak` checks against the job rows: no job lost, attempts
equal runs, no overlapping runs of one job.
"""

from __future__ import annotations

import asyncio
import os
import time
from datetime import timedelta
from typing import Any

from pydantic import BaseModel

from taskq import actor
from taskq.actor import ActorRef
from taskq.context import JobContext
from taskq.retry import RetryPolicy


class Item(BaseModel):
    n: int
    seconds: float = 0.0


def audit(ctx: JobContext[Any], event: str) -> None:
    """Append one line to the audit table (no-op without ``$TASKQ_SOAK_AUDIT``)."""
    path = os.environ.get("TASKQ_SOAK_AUDIT")
    if not path:
        return
    line = f"{ctx.job_id} {ctx.attempt} {os.getpid()} {event} {time.time()!r}\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


@actor(name="soak_async")
async def soak_async(payload: Item, ctx: JobContext[Item]) -> None:
    audit(ctx, "start")
    await asyncio.sleep(payload.seconds)
    audit(ctx, "end")


@actor(name="soak_sync")
def soak_sync(payload: Item, ctx: JobContext[Item]) -> None:
    audit(ctx, "start")
    time.sleep(payload.seconds)
    audit(ctx, "end")


@actor(
    name="soak_flaky",
    retry=RetryPolicy(max_attempts=3, base=timedelta(milliseconds=10), jitter=0),
)
async def soak_flaky(payload: Item, ctx: JobContext[Item]) -> None:
    """Fails its first attempt (the retry path: a traceback stored, a reschedule)."""
    audit(ctx, "start")
    if ctx.attempt == 1:
        audit(ctx, "fail")
        raise RuntimeError(f"planned first failure of {payload.n}")
    audit(ctx, "end")


@actor(name="soak_progress")
async def soak_progress(payload: Item, ctx: JobContext[Item]) -> None:
    audit(ctx, "start")
    for step in range(3):
        await ctx.progress(step=step, percent=step * 50.0, data={"n": payload.n})
        await asyncio.sleep(payload.seconds / 3)
    audit(ctx, "end")


registry: dict[str, Any] = {
    ref.name: ref for ref in (soak_async, soak_sync, soak_flaky, soak_progress)
}
_MIX: tuple[tuple[ActorRef[Any, Any], float], ...] = (
    (soak_async, 0.005),
    (soak_async, 0.02),
    (soak_sync, 0.005),
    (soak_flaky, 0.0),
    (soak_progress, 0.01),
    (soak_async, 0.0),
)


def item(n: int, seconds: float | None = None) -> tuple[ActorRef[Any, Any], Item]:
    """The ``n``-th job of the mix (``seconds``: its work, instead of the mix's)."""
    ref, mixed = _MIX[n % len(_MIX)]
    return ref, Item(n=n, seconds=mixed if seconds is None else seconds)


def planned_attempts(n: int) -> int:
    """How many attempts the ``n``-th job takes when nothing goes wrong."""
    return 2 if _MIX[n % len(_MIX)][0] is soak_flaky else 1
