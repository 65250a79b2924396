"""The fault suite's actors: each run appends its start and its end to the audit table.

The audit table is a file (``$TASKQ_CHAOS_AUDIT``) of lines ``job attempt pid event time``
written with ``O_APPEND`` (small writes from several processes never interleave), not a
database table: it must be written while the database is down, restarting or frozen,
which is exactly when the scenarios look hardest at it. Events: ``start``, ``end`` (the
actor's work completed: its side effect) and ``stop`` (the attempt was interrupted).
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
from taskq.ratelimit import TokenBucket
from taskq.retry import RetryPolicy

RETRY = RetryPolicy(
    max_attempts=50, base=timedelta(milliseconds=20), cap=timedelta(milliseconds=100), jitter=0
)
LIMIT = TokenBucket("chaos.limited", capacity=20, refill_per_second=20, backend="redis")
"""20 jobs a second, bursts of 20: the rate-limited scenarios' bucket."""


class Work(BaseModel):
    n: int = 0
    seconds: float = 0.0


def audit(ctx: JobContext[Any], event: str) -> None:
    """Append one line to the audit table (no-op without ``$TASKQ_CHAOS_AUDIT``)."""
    path = os.environ.get("TASKQ_CHAOS_AUDIT")
    if not path:
        return
    line = f"{ctx.job_id} {ctx.attempt} {os.getpid()} {event} {time.time()!r}\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


@actor(name="chaos_async", retry=RETRY)
async def work_async(payload: Work, ctx: JobContext[Work]) -> None:
    """Sleeps ``seconds`` (cancellable at its await)."""
    audit(ctx, "start")
    try:
        if payload.seconds:
            await asyncio.sleep(payload.seconds)
    except BaseException:
        audit(ctx, "stop")
        raise
    audit(ctx, "end")


@actor(name="chaos_sync", retry=RETRY)
def work_sync(payload: Work, ctx: JobContext[Work]) -> None:
    """Works ``seconds`` in a thread, polling ``should_abort`` every 10 ms."""
    audit(ctx, "start")
    deadline = time.monotonic() + payload.seconds
    while time.monotonic() < deadline:
        if ctx.should_abort():
            audit(ctx, "stop")
            raise asyncio.CancelledError
        time.sleep(0.01)
    audit(ctx, "end")


@actor(name="chaos_limited", retry=RETRY, rate_limits=[LIMIT])
async def limited(payload: Work, ctx: JobContext[Work]) -> None:
    """A rate-limited job (Redis bucket, Postgres fallback)."""
    audit(ctx, "start")
    audit(ctx, "end")


registry: dict[str, Any] = {ref.name: ref for ref in (work_async, work_sync, limited)}
