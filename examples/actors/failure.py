"""Failure: retries with backoff, budgets, non-retryable errors, timeouts, hooks.

What to observe in the attempts column:

- ``flaky`` raises ``ConnectionError`` on its first two attempts and succeeds on the
  third: ``retried,retried,succeeded`` (``RetryPolicy(max_attempts=3)``, a short backoff).
- ``doomed`` always raises: ``retried,failed`` with its two attempts spent, after which
  ``on_retry_exhausted`` runs once (the note under the title).
- ``strict`` raises ``ValueError``, listed in ``non_retryable_exceptions``: ``failed`` at
  once, no retry.
- ``slow`` sleeps past its ``start_to_close``: ``StartToCloseTimeout``, then failed.
- ``polite`` raises ``RetryAfter(delay, consume_budget=False)`` once: the retry does not
  count against ``max_attempts=1``, so it still succeeds.
- ``handle.wait()`` on a failed job raises ``JobFailedError`` carrying ``status`` and
  ``error_class``.

Run: ``python -m examples.actors.failure [--database-url URL]``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from datetime import timedelta
from typing import Any
from uuid import UUID

from pydantic import BaseModel

from examples.actors import runner
from taskq import JobContext, JobFailedError, JobHandle, RetryAfter, RetryPolicy, TaskQ, actor

QUEUE = "examples.failure"


def fast(max_attempts: int) -> RetryPolicy:
    """A retry policy with a demo-sized backoff (50 ms, no jitter)."""
    return RetryPolicy(
        max_attempts=max_attempts,
        base=timedelta(milliseconds=50),
        cap=timedelta(milliseconds=100),
        jitter=0.0,
    )


exhausted: list[str] = []
"""What ``on_retry_exhausted`` saw (this process's worker runs the hook)."""


class Call(BaseModel):
    label: str


class Done(BaseModel):
    attempt: int


@actor(name="examples_failure_flaky", queue=QUEUE, retry=fast(3))
async def flaky(payload: Call, ctx: JobContext[Call]) -> Done:
    """Drops the connection twice, then works."""
    if ctx.attempt < 3:
        raise ConnectionError(f"{payload.label}: connection reset (attempt {ctx.attempt})")
    return Done(attempt=ctx.attempt)


async def give_up(job_row: Any, exc: BaseException) -> None:
    exhausted.append(f"{job_row['actor']} gave up after {type(exc).__name__}: {exc}")


@actor(
    name="examples_failure_doomed",
    queue=QUEUE,
    retry=fast(2),
    on_retry_exhausted=give_up,
)
async def doomed(payload: Call) -> None:
    """Never works: spends its budget, then the hook runs."""
    raise RuntimeError(f"{payload.label}: upstream is down")


@actor(name="examples_failure_strict", queue=QUEUE, non_retryable_exceptions=(ValueError,))
async def strict(payload: Call) -> None:
    """A bad input is not worth retrying."""
    raise ValueError(f"{payload.label}: not a valid account number")


@actor(
    name="examples_failure_slow",
    queue=QUEUE,
    start_to_close=timedelta(milliseconds=200),
    retry=RetryPolicy(max_attempts=1),
)
async def slow(payload: Call) -> None:
    """Takes far longer than its per-attempt timeout allows."""
    await asyncio.sleep(30)


@actor(name="examples_failure_polite", queue=QUEUE, retry=RetryPolicy(max_attempts=1))
async def polite(payload: Call, ctx: JobContext[Call]) -> Done:
    """Told to come back later by the API it calls: retries without spending budget."""
    if ctx.attempt == 1:
        raise RetryAfter(timedelta(milliseconds=100), consume_budget=False)
    return Done(attempt=ctx.attempt)


async def enqueue(tq: TaskQ) -> Iterable[UUID]:
    ids = []
    for ref in (flaky, doomed, strict, slow, polite):
        ids.append((await tq.jobs.enqueue(ref, Call(label=ref.name))).job_id)
    return ids


async def notes(tq: TaskQ, report: runner.Report) -> list[str]:
    for _ in range(100):  # the hook runs just after the failure is written
        if exhausted:
            break
        await asyncio.sleep(0.05)
    lines = [f"on_retry_exhausted: {line}" for line in exhausted]
    handle: JobHandle[Any] = await tq.jobs.get(report.by_actor(doomed.name)[0].id)
    try:
        await handle.wait(timeout=5)
    except JobFailedError as exc:
        lines.append(
            f"handle.wait() raised JobFailedError(status={exc.status!r}, "
            f"error_class={exc.error_class!r})"
        )
    return lines


async def example(database_url: str | None = None) -> runner.Report:
    exhausted.clear()
    return await runner.run(
        "failure: retries, budgets, timeouts, hooks",
        [flaky, doomed, strict, slow, polite],
        enqueue,
        database_url=database_url,
        notes=notes,
    )


if __name__ == "__main__":
    runner.main(example)
