"""Actors the worker tests run, in-process and in real worker processes.

Handlers that the tests inspect append one line per event to ``$TASKQ_E2E_RUNS`` (a
file opened ``O_APPEND``: small writes from several processes never interleave).
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
from taskq.exceptions import RetryAfter, Snooze
from taskq.ratelimit import ConcurrencyReservation
from taskq.retry import RetryPolicy

FAST_RETRY = RetryPolicy(
    max_attempts=3, base=timedelta(milliseconds=20), cap=timedelta(milliseconds=50), jitter=0
)


def _record(*fields: object) -> None:
    path = os.environ.get("TASKQ_E2E_RUNS")
    if not path:
        return
    line = " ".join(str(f) for f in fields) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


class Empty(BaseModel):
    pass


class Work(BaseModel):
    n: int = 0
    fail_first: bool = False
    seconds: float = 0.0


class Echo(BaseModel):
    value: int


class EchoResult(BaseModel):
    doubled: int


class Ratio(BaseModel):
    ratio: float


class Control(BaseModel):
    kind: str
    seconds: float = 0.0
    delay_ms: int = 0


@actor(name="e2e_noop")
async def noop(payload: Empty) -> None:
    return None


@actor(name="e2e_echo")
async def echo(payload: Echo) -> EchoResult:
    return EchoResult(doubled=payload.value * 2)


@actor(name="e2e_ratio", retry=RetryPolicy(kind="non_retryable"))
async def ratio(payload: Echo) -> Ratio:
    """An infinite float (which JSON cannot hold) when ``value`` is not 0, else 0.5."""
    return Ratio(ratio=float("inf") if payload.value else 0.5)


@actor(name="e2e_record", retry=FAST_RETRY)
async def record(payload: Work, ctx: JobContext[Work]) -> None:
    """Records start/end per attempt; raises on the first attempt when ``fail_first``."""
    _record(ctx.job_id, ctx.attempt, os.getpid(), "start", repr(time.time()))
    try:
        if payload.seconds:
            await asyncio.sleep(payload.seconds)
        if payload.fail_first and ctx.attempt == 1:
            raise RuntimeError(f"planned failure of job {payload.n}")
    finally:
        _record(ctx.job_id, ctx.attempt, os.getpid(), "end", repr(time.time()))


@actor(name="e2e_sleep_async", retry=FAST_RETRY)
async def sleep_async(payload: Work, ctx: JobContext[Work]) -> None:
    """Sleeps ``seconds`` without looking at the cancel event (cancellable by the task)."""
    _record(ctx.job_id, ctx.attempt, os.getpid(), "start", repr(time.time()))
    await asyncio.sleep(payload.seconds)
    _record(ctx.job_id, ctx.attempt, os.getpid(), "end", repr(time.time()))


@actor(name="e2e_slow_first", retry=FAST_RETRY)
async def slow_first(payload: Work, ctx: JobContext[Work]) -> EchoResult:
    """Sleeps ``seconds`` on its first attempt only (so a reclaimed job finishes fast)."""
    _record(ctx.job_id, ctx.attempt, os.getpid(), "start", repr(time.time()))
    if ctx.attempt == 1:
        await asyncio.sleep(payload.seconds)
    _record(ctx.job_id, ctx.attempt, os.getpid(), "end", repr(time.time()))
    return EchoResult(doubled=ctx.attempt)


@actor(name="e2e_cooperative_async")
async def cooperative_async(payload: Work, ctx: JobContext[Work]) -> None:
    """Waits for cancellation and exits by raising, as the raise-vs-return rule asks."""
    _record(ctx.job_id, ctx.attempt, os.getpid(), "start", repr(time.time()))
    try:
        async with asyncio.timeout(payload.seconds):
            await ctx.cancel_event.wait()
    except TimeoutError:
        return
    ctx.check_cancelled()


@actor(name="e2e_sync_polling")
def sync_polling(payload: Work, ctx: JobContext[Work]) -> None:
    """A sync actor that polls ``should_abort`` every 10 ms and raises when asked."""
    _record(ctx.job_id, ctx.attempt, os.getpid(), "start", repr(time.time()))
    deadline = time.monotonic() + payload.seconds
    while time.monotonic() < deadline:
        if ctx.should_abort():
            _record(ctx.job_id, ctx.attempt, os.getpid(), "aborted", repr(time.time()))
            raise asyncio.CancelledError
        time.sleep(0.01)


@actor(name="e2e_sync_blind")
def sync_blind(payload: Work, ctx: JobContext[Work]) -> None:
    """A sync actor that never polls: it sleeps its whole time."""
    _record(ctx.job_id, ctx.attempt, os.getpid(), "start", repr(time.time()))
    time.sleep(payload.seconds)
    _record(ctx.job_id, ctx.attempt, os.getpid(), "end", repr(time.time()))


@actor(name="e2e_control", retry=FAST_RETRY, start_to_close=timedelta(seconds=30))
async def control(payload: Control, ctx: JobContext[Control]) -> None:
    """One actor, many endings, chosen by ``kind``."""
    if payload.kind == "snooze" and ctx.attempt == 1:
        raise Snooze(timedelta(milliseconds=payload.delay_ms))
    if payload.kind == "retry_after_free" and ctx.attempt == 1:
        raise RetryAfter(timedelta(milliseconds=payload.delay_ms), consume_budget=False)
    if payload.kind == "always_fail":
        raise ValueError("always")
    if payload.kind == "non_retryable":
        raise KeyError("nope")
    if payload.kind == "nul_message":
        raise ValueError("a NUL \x00 in the message")
    if payload.kind == "sleep":
        await asyncio.sleep(payload.seconds)


class Counter:
    """A DI dependency: one instance per worker process."""

    def __init__(self) -> None:
        self.calls = 0


class Session:
    """A TRANSIENT dependency: one per invocation, closed when the invocation ends."""

    def __init__(self) -> None:
        self.closed = False

    def close(self) -> None:
        self.closed = True


class ThreadLocalClient:
    """A THREAD dependency: built on the thread that uses it."""

    def __init__(self) -> None:
        import threading

        self.thread = threading.get_ident()


HOOK_CALLS: list[tuple[str, Any]] = []


def _on_success(row: Any, result: Any) -> None:
    HOOK_CALLS.append(("success", row["id"]))


async def _on_exhausted(row: Any, exc: BaseException) -> None:
    HOOK_CALLS.append(("exhausted", type(exc).__name__))


@actor(name="e2e_di")
def with_dependency(payload: Echo, ctx: JobContext[Echo], *, counter: Counter) -> EchoResult:
    """A sync actor with a DI dependency (resolved on the loop, used in the thread)."""
    counter.calls += 1
    return EchoResult(doubled=payload.value * 2)


MUTEX = ConcurrencyReservation("e2e_mutex", slots=1, lease=timedelta(seconds=1))


@actor(name="e2e_mutex", reservations=[MUTEX])
async def mutex(payload: Work, ctx: JobContext[Work]) -> None:
    """Holds the one-slot reservation while it runs (a fleet-wide mutex)."""
    _record(ctx.job_id, ctx.attempt, os.getpid(), "start", repr(time.time()))
    await asyncio.sleep(payload.seconds)
    _record(ctx.job_id, ctx.attempt, os.getpid(), "end", repr(time.time()))


@actor(name="e2e_fan_out")
async def fan_out(payload: Echo, ctx: JobContext[Echo]) -> None:
    """Enqueues ``value`` echo sub-jobs through ``ctx.jobs``."""
    assert ctx.jobs is not None
    for i in range(payload.value):
        await ctx.jobs.enqueue(echo, Echo(value=i), priority=1)


@actor(name="e2e_scoped")
def scoped(payload: Echo, *, session: Session, client: ThreadLocalClient) -> EchoResult:
    """Checks its TRANSIENT dependency is still open and its THREAD one is this thread's."""
    import threading

    assert not session.closed
    assert client.thread == threading.get_ident()
    return EchoResult(doubled=payload.value)


@actor(name="e2e_progress", on_success=_on_success, result_ttl=timedelta(milliseconds=300))
async def with_progress(payload: Echo, ctx: JobContext[Echo]) -> EchoResult:
    await ctx.progress(step=1, percent=50.0, detail="half")
    await ctx.progress(step=2, percent=100.0)
    return EchoResult(doubled=payload.value)


@actor(
    name="e2e_exhausts",
    retry=RetryPolicy(max_attempts=2, base=timedelta(milliseconds=10), jitter=0),
    on_retry_exhausted=_on_exhausted,
)
async def exhausts(payload: Empty) -> None:
    raise ConnectionError("down")


registry: dict[str, Any] = {
    ref.name: ref
    for ref in (
        noop,
        echo,
        ratio,
        record,
        slow_first,
        fan_out,
        sleep_async,
        cooperative_async,
        sync_polling,
        sync_blind,
        control,
    )
}
