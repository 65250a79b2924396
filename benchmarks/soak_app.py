"""The soak's mix: async sleeps, sync work in threads, a retried failure, progress reports."""

from __future__ import annotations

import asyncio
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


@actor(name="soak_async")
async def soak_async(payload: Item) -> None:
    await asyncio.sleep(payload.seconds)


@actor(name="soak_sync")
def soak_sync(payload: Item) -> None:
    time.sleep(payload.seconds)


@actor(
    name="soak_flaky",
    retry=RetryPolicy(max_attempts=3, base=timedelta(milliseconds=10), jitter=0),
)
async def soak_flaky(payload: Item, ctx: JobContext[Item]) -> None:
    """Fails its first attempt (the retry path: a traceback stored, a reschedule)."""
    if ctx.attempt == 1:
        raise RuntimeError(f"planned first failure of {payload.n}")


@actor(name="soak_progress")
async def soak_progress(payload: Item, ctx: JobContext[Item]) -> None:
    for step in range(3):
        await ctx.progress(step=step, percent=step * 50.0, data={"n": payload.n})
        await asyncio.sleep(payload.seconds / 3)


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


def item(n: int) -> tuple[ActorRef[Any, Any], Item]:
    """The ``n``-th job of the mix."""
    ref, seconds = _MIX[n % len(_MIX)]
    return ref, Item(n=n, seconds=seconds)
