"""What every example in ``examples.actors`` shares: migrate, enqueue, drain, report.

:func:`run` migrates the database (the embedded SQLite file ``./taskq.db`` unless
``--database-url`` or ``TASKQ_DATABASE_URL`` says otherwise), calls the example's
``enqueue`` with a :class:`~taskq.client.TaskQ`, runs a real
:class:`~taskq.worker.run.Worker` in this process until every job the example enqueued
(and every sub-job they enqueued) has finished, stops the worker through its normal
shutdown, and reads back what the store recorded: each job's status, attempts, result,
error, tags and parent. It prints that as a table, so what you see is what the database
holds, not what the example believes happened.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import itertools
import os
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Sequence
from typing import Any
from uuid import UUID

from sqlalchemy import or_, select

from taskq.actor import ActorRef
from taskq.client import TaskQ
from taskq.db import migrate
from taskq.db.engine import make_engine, transaction
from taskq.db.tables import job_attempts, jobs
from taskq.di import ProviderRegistry
from taskq.ratelimit import RateLimitRegistry
from taskq.settings import WorkerSettings

__all__ = ["JobRow", "Report", "main", "run"]

MAX_ROWS = 20
"""The most job rows the printed table shows (the summary line counts them all)."""
TERMINAL = frozenset({"succeeded", "failed", "cancelled"})

Enqueue = Callable[[TaskQ], Awaitable[Iterable[UUID]]]
During = Callable[[TaskQ], Awaitable[Iterable[UUID] | None]]


@dataclasses.dataclass(frozen=True)
class JobRow:
    """One job as the store recorded it, with the outcome of each of its attempts."""

    id: UUID
    actor: str
    status: str
    result: Any
    error_class: str | None
    tags: list[str]
    parent_job_id: UUID | None
    progress: Any
    outcomes: list[str]
    attempt_errors: list[str | None]


@dataclasses.dataclass(frozen=True)
class Report:
    """Every job of one example run (roots first, in enqueue order, then sub-jobs)."""

    title: str
    jobs: list[JobRow]
    notes: list[str]

    def by_actor(self, name: str) -> list[JobRow]:
        """The jobs of one actor, in the report's order."""
        return [j for j in self.jobs if j.actor == name]

    def render(self) -> str:
        """The table the example prints."""
        lines = [f"== {self.title} ==", *self.notes, ""]
        lines.append(f"{'actor':<34} {'status':<10} {'attempts':<28} result / error")
        for job in self.jobs[:MAX_ROWS]:
            shown = job.error_class if job.status != "succeeded" else _short(job.result)
            lines.append(f"{job.actor:<34} {job.status:<10} {_runs(job.outcomes):<28} {shown}")
        if len(self.jobs) > MAX_ROWS:
            lines.append(f"... and {len(self.jobs) - MAX_ROWS} more")
        counts: dict[str, int] = {}
        for job in self.jobs:
            counts[job.status] = counts.get(job.status, 0) + 1
        summary = ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
        lines.append(f"-- {len(self.jobs)} jobs: {summary}")
        return "\n".join(lines)


def _runs(outcomes: list[str]) -> str:
    """``snoozed x6,succeeded`` for six snoozes then a success."""
    out: list[str] = []
    for name, group in itertools.groupby(outcomes):
        n = len(list(group))
        out.append(name if n == 1 else f"{name} x{n}")
    return ",".join(out) or "-"


def _short(value: Any) -> str:
    text = "" if value is None else str(value)
    return text if len(text) <= 60 else text[:57] + "..."


async def _read(engine: Any, ids: list[UUID]) -> list[JobRow]:
    """The example's jobs and, transitively, every sub-job they enqueued."""
    known: dict[UUID, Any] = {}
    frontier = list(ids)
    async with transaction(engine, readonly=True) as conn:
        while frontier:
            found = (
                await conn.execute(
                    select(jobs).where(
                        or_(jobs.c.id.in_(frontier), jobs.c.parent_job_id.in_(frontier))
                    )
                )
            ).all()
            frontier = [r.id for r in found if r.id not in known]
            known.update({r.id: r for r in found})
        attempts: dict[UUID, list[Any]] = {}
        if known:
            rows = await conn.execute(
                select(job_attempts)
                .where(job_attempts.c.job_id.in_(list(known)))
                .order_by(job_attempts.c.job_id, job_attempts.c.attempt, job_attempts.c.id)
            )
            for row in rows.all():
                attempts.setdefault(row.job_id, []).append(row)
    order = {job_id: n for n, job_id in enumerate(ids)}
    ranked = sorted(known.values(), key=lambda r: (order.get(r.id, len(order)), r.created_at))
    return [
        JobRow(
            id=r.id,
            actor=r.actor,
            status=r.status,
            result=r.result,
            error_class=r.error_class,
            tags=list(r.tags or []),
            parent_job_id=r.parent_job_id,
            progress=r.progress,
            outcomes=[a.outcome for a in attempts.get(r.id, [])],
            attempt_errors=[a.error_class for a in attempts.get(r.id, [])],
        )
        for r in ranked
    ]


def worker_settings(database_url: str | None, **overrides: Any) -> WorkerSettings:
    """Settings for an example's in-process worker: quick polls, short graces."""
    values: dict[str, Any] = {
        "redis_url": os.environ.get("TASKQ_REDIS_URL") or None,
        "max_concurrency": 8,
        "poll_interval": 0.05,
        "progress_flush_interval": 0.1,
        "cancellation_grace_period": 2.0,
        "cleanup_grace_period": 1.0,
        "termination_grace_period": 10.0,
        "log_level": "WARNING",
    }
    if database_url:
        values["database_url"] = database_url
    values.update(overrides)
    return WorkerSettings.load(**values)


async def run(
    title: str,
    actors: Sequence[ActorRef[Any, Any]],
    enqueue: Enqueue,
    *,
    database_url: str | None = None,
    during: During | None = None,
    rate_limit_registry: RateLimitRegistry | None = None,
    di_registry: ProviderRegistry | None = None,
    settings: WorkerSettings | None = None,
    notes: Callable[[TaskQ, Report], Awaitable[list[str]]] | None = None,
    timeout_s: float = 60.0,
) -> Report:
    """Enqueue with ``enqueue(tq)`` (it returns the job ids), drain with a worker that runs
    ``actors`` on their queues, and return the :class:`Report`.

    ``during(tq)`` runs while the worker drains (to cancel a job, watch progress, ...);
    the job ids it returns (jobs the worker made itself, such as a schedule's ticks) are
    drained and reported too.
    ``notes(tq, report)`` adds lines under the title once everything has finished.
    """
    from taskq.worker.run import Worker, configure_logging

    queues = tuple(sorted({a.queue for a in actors}))
    settings = settings or worker_settings(database_url)
    settings = settings.model_copy(update={"queues": queues})
    configure_logging(settings.log_level)
    engine = make_engine(settings.effective_database_url, settings=settings)
    try:
        await migrate.upgrade(engine, settings=settings)
        async with TaskQ(engine=engine, settings=settings) as tq:
            ids = list(await enqueue(tq))
            worker = Worker(
                settings=settings,
                actors={a.name: a for a in actors},
                rate_limit_registry=rate_limit_registry or RateLimitRegistry(),
                di_registry=di_registry,
                engine=engine,
                hard_exit=False,
            )
            task = asyncio.ensure_future(worker.run())
            side = asyncio.ensure_future(during(tq)) if during is not None else None
            started = time.monotonic()
            try:
                while True:
                    side_done = side is None or side.done()
                    if side is not None and side_done and not side.cancelled():
                        extra = side.result()  # its exception, if any, is the example's
                        ids += [i for i in extra or () if i not in ids]
                    rows = await _read(engine, ids)
                    if side_done and all(r.status in TERMINAL for r in rows):
                        break
                    if task.done():
                        raise RuntimeError("the worker stopped before the example finished")
                    if time.monotonic() - started > timeout_s:
                        left = [r.actor for r in rows if r.status not in TERMINAL]
                        raise TimeoutError(f"jobs still unfinished after {timeout_s}s: {left}")
                    await asyncio.sleep(0.05)
                if side is not None:
                    await side  # its exception, if any, is the example's
            finally:
                if side is not None and not side.done():
                    side.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await side
                if not task.done():
                    worker.state.signal("example-done")
                await task
            report = Report(title, await _read(engine, ids), [])
            if notes is not None:
                report.notes.extend(await notes(tq, report))
            return report
    finally:
        await engine.dispose()


def main(
    example: Callable[[str | None], Coroutine[Any, Any, Report]],
    argv: Sequence[str] | None = None,
) -> Report:
    """The examples' command line: ``python -m examples.actors.NAME [--database-url URL]``."""
    parser = argparse.ArgumentParser(
        description=(sys.modules[example.__module__].__doc__ or "").split("\n\n")[0]
    )
    parser.add_argument(
        "--database-url",
        default=None,
        help="SQLAlchemy URL of the job store (default: TASKQ_DATABASE_URL, else ./taskq.db)",
    )
    args = parser.parse_args(argv)
    report = asyncio.run(example(args.database_url))
    print(report.render(), flush=True)
    return report
