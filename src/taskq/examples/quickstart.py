"""The quickstart workload: a small, realistic job mix run end to end in one process.

``taskq quickstart`` (or ``python -m taskq.examples.quickstart``) calls :func:`run`: it
migrates the database (the embedded SQLite file ``./taskq.db`` unless told otherwise),
enqueues :func:`workload`, runs a :class:`~taskq.worker.run.Worker` in this process until
every one of those jobs has finished, stops the worker and returns a :class:`Summary`
read back from the store (``jobs`` and ``job_attempts``), so the figures are what the
database recorded, not what the demo believes happened.

The mix shows the main behaviours on a fresh machine with nothing installed:

- ``quickstart_fetch_page``: every fifth page fails once with a connection error and
  succeeds on its retry (``RetryPolicy``, fast backoff for the demo);
- ``quickstart_geocode``: limited by an in-process token bucket per city
  (``backend="memory"``); a job the bucket denies is parked until it has a token (no
  attempt, no retry budget: ``rate_limited`` counts these parks);
- ``quickstart_build_report``: reports progress (``ctx.progress``) step by step;
- ``quickstart_charge_card``: always declines, so it exhausts its two attempts and fails;
- ``quickstart_wait_for_export``: snoozes once (``Snooze``) waiting for an export, then
  completes;
- ``quickstart_send_email``: a plain sync function, run in the worker's thread pool.

Every actor uses the queue ``quickstart``, and the summary counts only the jobs this run
enqueued, so running the demo twice on one database gives the same figures.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import sys
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any, Final
from uuid import UUID

from pydantic import BaseModel
from sqlalchemy import func, select

from taskq.actor import ActorRef, actor
from taskq.client import TaskQ
from taskq.context import JobContext
from taskq.db import migrate
from taskq.db.engine import make_engine, transaction
from taskq.db.tables import job_attempts, jobs
from taskq.exceptions import Snooze
from taskq.ratelimit import KeyedRateLimitRef, RateLimitRegistry
from taskq.retry import RetryPolicy
from taskq.settings import WorkerSettings

__all__ = [
    "ACTORS",
    "DEFAULT_DATABASE_URL",
    "QUEUE",
    "Progress",
    "Summary",
    "WorkerStopped",
    "main",
    "run",
    "workload",
]

QUEUE: Final = "quickstart"
DEFAULT_DATABASE_URL: Final = "sqlite+aiosqlite:///./taskq.db"
"""Where the demo writes unless ``--database-url`` says otherwise (the embedded default)."""

_TERMINAL: Final = ("succeeded", "failed", "cancelled")
_DEMO_RETRY: Final = RetryPolicy(
    max_attempts=3, base=timedelta(milliseconds=50), cap=timedelta(milliseconds=200), jitter=0
)


class Page(BaseModel):
    url: str
    flaky: bool = False


class Address(BaseModel):
    street: str
    city: str = "Amsterdam"


class Report(BaseModel):
    name: str
    sections: int = 4


class Charge(BaseModel):
    customer: str
    cents: int


class Export(BaseModel):
    export_id: int


class Email(BaseModel):
    to: str
    subject: str


class Fetched(BaseModel):
    size: int


class Coordinates(BaseModel):
    lat: float
    lon: float


class File(BaseModel):
    path: str


@actor(name="quickstart_fetch_page", queue=QUEUE, retry=_DEMO_RETRY)
async def fetch_page(payload: Page, ctx: JobContext[Page]) -> Fetched:
    """Pretend to download a page; flaky pages drop the connection on the first attempt."""
    await asyncio.sleep(0.01)
    if payload.flaky and ctx.attempt == 1:
        raise ConnectionError(f"connection reset while fetching {payload.url} (simulated)")
    return Fetched(size=len(payload.url))


GEOCODER_LIMIT: Final = KeyedRateLimitRef.typed(
    Address,
    base_name="quickstart.geocoder",
    key_fn=lambda a: a.city,
    capacity=5,
    refill_per_second=25,
    backend="memory",
)
"""The third-party API's quota per city: 5 at once, 25 a second; in-process (no Redis
needed). Keyed, so the worker checks it per claimed job and parks the ones it denies."""


@actor(name="quickstart_geocode", queue=QUEUE, rate_limits=[GEOCODER_LIMIT])
async def geocode(payload: Address) -> Coordinates:
    """Pretend to call a rate-limited geocoding API."""
    await asyncio.sleep(0.005)
    seed = sum(map(ord, payload.street))
    return Coordinates(lat=seed % 180 - 90.0, lon=seed % 360 - 180.0)


@actor(name="quickstart_build_report", queue=QUEUE)
async def build_report(payload: Report, ctx: JobContext[Report]) -> File:
    """A longer job that reports progress after every section it renders."""
    for section in range(1, payload.sections + 1):
        await asyncio.sleep(0.15)
        await ctx.progress(
            step=section,
            percent=100.0 * section / payload.sections,
            detail=f"rendered section {section}/{payload.sections}",
        )
    return File(path=f"{payload.name}.pdf")


@actor(
    name="quickstart_charge_card",
    queue=QUEUE,
    retry=RetryPolicy(max_attempts=2, base=timedelta(milliseconds=50), jitter=0),
)
async def charge_card(payload: Charge) -> None:
    """Always declined: the job retries once, then fails for good."""
    raise ValueError(f"card of {payload.customer} declined for {payload.cents} cents (simulated)")


@actor(name="quickstart_wait_for_export", queue=QUEUE)
async def wait_for_export(payload: Export, ctx: JobContext[Export]) -> File:
    """The export is not ready on the first look: snooze (no retry budget spent), then done."""
    if ctx.attempt == 1:
        raise Snooze(timedelta(milliseconds=300))
    return File(path=f"export-{payload.export_id}.csv")


@actor(name="quickstart_send_email", queue=QUEUE)
def send_email(payload: Email) -> None:
    """A blocking (sync) actor: the worker runs it in a thread."""
    time.sleep(0.002)


ACTORS: Final[dict[str, ActorRef[Any, Any]]] = {
    ref.name: ref
    for ref in (fetch_page, geocode, build_report, charge_card, wait_for_export, send_email)
}


def workload() -> list[tuple[ActorRef[Any, Any], BaseModel]]:
    """The jobs one quickstart run enqueues (100 of them, in one transaction)."""
    items: list[tuple[ActorRef[Any, Any], BaseModel]] = []
    items += [
        (fetch_page, Page(url=f"https://example.com/page/{n}", flaky=n % 5 == 0)) for n in range(40)
    ]
    items += [(geocode, Address(street=f"{n} Main Street")) for n in range(25)]
    items += [(build_report, Report(name=f"report-{n}")) for n in range(3)]
    items += [(charge_card, Charge(customer=f"customer-{n}", cents=999)) for n in range(5)]
    items += [(wait_for_export, Export(export_id=n)) for n in range(5)]
    items += [(send_email, Email(to=f"user{n}@example.com", subject="welcome")) for n in range(22)]
    return items


class WorkerStopped(RuntimeError):
    """The worker shut down (Ctrl-C, SIGTERM) before the demo's jobs had all finished."""


@dataclasses.dataclass(frozen=True)
class Progress:
    """What the live display shows: this run's jobs by state, and attempts by outcome."""

    total: int
    finished: int
    running: int
    retried: int
    snoozed: int
    report_percent: float | None


@dataclasses.dataclass(frozen=True)
class Summary:
    """This run's figures as the store recorded them.

    ``jobs == succeeded + failed + cancelled``; every attempt ended as one of
    ``succeeded``, ``failed``, ``retried`` or ``snoozed``, so ``attempts`` is their sum.
    ``rate_limited`` counts the times the token bucket parked a job (``jobs.denials``):
    a denial is not an attempt.
    """

    database_url: str
    jobs: int
    succeeded: int
    failed: int
    cancelled: int
    retried: int
    snoozed: int
    rate_limited: int
    attempts: int
    seconds: float

    @property
    def jobs_per_second(self) -> float:
        """Jobs finished per second of the drain."""
        return self.jobs / self.seconds if self.seconds > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (``taskq quickstart --json``)."""
        data = dataclasses.asdict(self)
        data["seconds"] = round(self.seconds, 3)
        data["jobs_per_second"] = round(self.jobs_per_second, 1)
        return data


async def _progress(engine: Any, ids: list[UUID]) -> tuple[dict[str, int], dict[str, int], Any]:
    async with transaction(engine, readonly=True) as conn:
        statuses: dict[str, int] = dict(
            (
                await conn.execute(
                    select(jobs.c.status, func.count())
                    .where(jobs.c.id.in_(ids))
                    .group_by(jobs.c.status)
                )
            ).all()
        )
        outcomes: dict[str, int] = dict(
            (
                await conn.execute(
                    select(job_attempts.c.outcome, func.count())
                    .where(job_attempts.c.job_id.in_(ids))
                    .group_by(job_attempts.c.outcome)
                )
            ).all()
        )
        reports = (
            await conn.execute(
                select(jobs.c.progress).where(jobs.c.id.in_(ids), jobs.c.actor == build_report.name)
            )
        ).all()
    return statuses, outcomes, reports


async def _rate_limited(engine: Any, ids: list[UUID]) -> int:
    async with transaction(engine, readonly=True) as conn:
        value = (
            await conn.execute(
                select(func.coalesce(func.sum(jobs.c.denials), 0)).where(jobs.c.id.in_(ids))
            )
        ).scalar_one()
    return int(value)


def _report_percent(rows: Any) -> float | None:
    values = [float((r.progress or {}).get("percent", 0.0)) for r in rows]
    return sum(values) / len(values) if values else None


async def run(
    database_url: str | None = None,
    *,
    on_progress: Callable[[Progress], None] | None = None,
    concurrency: int = 20,
    timeout_s: float = 120.0,
) -> Summary:
    """Migrate, enqueue :func:`workload`, drain it with an in-process worker, summarise.

    ``on_progress`` is called about ten times a second while the queue drains. The worker
    is stopped (its normal shutdown path) before this returns, also on error or timeout:
    nothing is left running. Raises ``TimeoutError`` when the jobs have not all finished
    within ``timeout_s``.
    """
    url = database_url or DEFAULT_DATABASE_URL
    settings = WorkerSettings.load(
        database_url=url,
        redis_url=None,
        queues=(QUEUE,),
        max_concurrency=concurrency,
        claim_batch_size=concurrency,
        log_level="WARNING",
        # Flush progress often enough for the live display to show the reports moving.
        progress_flush_interval=0.2,
    )
    engine = make_engine(url, settings=settings)
    try:
        await migrate.upgrade(engine, settings=settings)
        async with TaskQ(engine=engine, settings=settings) as tq:
            handles = await tq.jobs.enqueue_many(workload())
        ids = [h.job_id for h in handles]
        return await _drain(engine, settings, ids, on_progress, timeout_s)
    finally:
        await engine.dispose()


async def _drain(
    engine: Any,
    settings: WorkerSettings,
    ids: list[UUID],
    on_progress: Callable[[Progress], None] | None,
    timeout_s: float,
) -> Summary:
    from taskq.worker.run import Worker, configure_logging

    configure_logging(settings.log_level)
    worker = Worker(
        settings=settings,
        actors=ACTORS,
        rate_limit_registry=RateLimitRegistry(),
        engine=engine,
        hard_exit=False,
    )
    with contextlib.suppress(NotImplementedError, RuntimeError):  # no signals off the main thread
        worker.install_signals()
    started = time.monotonic()
    task = asyncio.ensure_future(worker.run())
    try:
        while True:
            statuses, outcomes, reports = await _progress(engine, ids)
            finished = sum(statuses.get(s, 0) for s in _TERMINAL)
            if on_progress is not None:
                on_progress(
                    Progress(
                        total=len(ids),
                        finished=finished,
                        running=statuses.get("running", 0),
                        retried=outcomes.get("retried", 0),
                        snoozed=outcomes.get("snoozed", 0),
                        report_percent=_report_percent(reports),
                    )
                )
            if finished >= len(ids):
                break
            if task.done():
                raise WorkerStopped(f"the worker stopped with {len(ids) - finished} jobs left")
            if time.monotonic() - started > timeout_s:
                raise TimeoutError(
                    f"{len(ids) - finished} jobs still unfinished after {timeout_s}s"
                )
            await asyncio.sleep(0.1)
        seconds = time.monotonic() - started
    finally:
        if not task.done():
            worker.state.signal("quickstart-done")
        await task
    statuses, outcomes, _ = await _progress(engine, ids)
    return Summary(
        database_url=engine.url.render_as_string(hide_password=True),
        jobs=len(ids),
        succeeded=statuses.get("succeeded", 0),
        failed=statuses.get("failed", 0),
        cancelled=statuses.get("cancelled", 0),
        retried=outcomes.get("retried", 0),
        snoozed=outcomes.get("snoozed", 0),
        rate_limited=await _rate_limited(engine, ids),
        attempts=sum(outcomes.values()),
        seconds=seconds,
    )


def main(argv: list[str] | None = None) -> None:
    """``python -m taskq.examples.quickstart [DATABASE_URL]``: run the demo and print its
    summary as JSON (``taskq quickstart`` runs the same with a live progress bar)."""
    args = sys.argv[1:] if argv is None else argv
    database_url = args[0] if args else "sqlite+aiosqlite:///./taskq.db"
    summary = asyncio.run(run(database_url))
    print(json.dumps(summary.as_dict(), indent=2))


if __name__ == "__main__":
    main()
