"""Run the fleet demo: ``python -m examples.fleet_demo.run_demo [--database-url URL]``.

Four acts, each narrated from the worker's own log lines (``[worker A] ...``, the JSON
the worker process writes, shortened) and from the store (``store: ...``):

1. **A rate limit holds jobs back.** Eight ``fleet_call_partner_api`` jobs for partner
   ``acme`` arrive at once; its bucket admits two at once and two a second. The worker
   runs two and **parks** the other six: each is ``scheduled`` for the moment the bucket
   will admit it, ``waiting_on='fleet.partner_api:acme'``, one denial counted, attempt 0
   (a denial is not an attempt: no attempt row, no retry budget). The store's view is
   printed while they wait, then the admitted rate: never more starts in a stretch of
   time than the bucket allows. All eight succeed on their first attempt.
2. **An operator cancels a running job.** ``fleet_build_report`` is cancelled with
   ``JobsClient.cancel()`` while it runs; the worker logs ``job-cancel-requested``
   (phase 1, cooperative), the actor's ``ctx.check_cancelled()`` raises, and the job ends
   ``cancelled`` / ``CancelledCooperatively``.
3. **Cron budgets.** The warehouse API is down for maintenance, so the operator pauses
   the queue ``fleet.inventory``, then stores the every-second schedule
   ``fleet-inventory-sync`` (``tq.schedules.create``). Worker A picks it up within a
   second and ticks it (``cron-tick-enqueued``). Nothing runs on the paused queue, and
   ``fleet_sync_inventory``'s ``max_pending=6`` is the schedule's backlog budget: six
   jobs wait, and every later tick is refused (``cron-tick-refused reason=max_pending``),
   recorded on the schedule and dropped, never retried. The operator resumes the queue:
   the backlog runs and the ticks enqueue again.
4. **A SIGTERM deploy.** ``fleet_migrate_tenant`` is running when worker A gets SIGTERM:
   it logs ``worker-shutdown-requested`` and each ``worker-shutdown-phase`` (DRAINING,
   CANCELLING, ...), hands the interrupted job back (``outcome=release``,
   ``WorkerShutdown``: back to ``pending``, no budget spent), logs ``worker-stopped`` and
   exits 0. With no worker running, the schedule's ticks fall due and nobody enqueues
   them. Worker B, the new release, claims the job and finishes it on attempt 2. It also
   catches up the schedule within its catch-up budget (``missed="all"``,
   ``max_catchup=2``): it logs ``cron-ticks-missed`` and enqueues the two most recent
   missed ticks, and drops the rest.

At the end the operator disables the schedule (``tq.schedules.disable``: it stays stored).
The database defaults to ``TASKQ_DATABASE_URL``, else the embedded SQLite file
``./taskq.db``; ``TASKQ_REDIS_URL`` moves the bucket to Redis.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from uuid import UUID

import structlog

from examples.fleet_demo.actors import (
    INVENTORY_BACKLOG,
    INVENTORY_QUEUE,
    INVENTORY_SCHEDULE,
    PARTNER_CAPACITY,
    PARTNER_RATE,
    QUEUES,
    PartnerCall,
    Report,
    Tenant,
    build_report,
    call_partner_api,
    migrate_tenant,
    sync_inventory,
)
from taskq.client import JobHandle, TaskQ
from taskq.db import migrate
from taskq.db.engine import make_engine
from taskq.job_filter import JobFilter
from taskq.settings import TaskQSettings

ROOT = Path(__file__).resolve().parents[2]
TERMINAL = ("succeeded", "failed", "cancelled")
SCHEDULE = str(INVENTORY_SCHEDULE.id)
Event = dict[str, Any]


def say(text: str) -> None:
    print(text, flush=True)


class WorkerProcess:
    """One worker subprocess and the log events it has written so far."""

    def __init__(self, label: str, proc: asyncio.subprocess.Process) -> None:
        self.label = label
        self.proc = proc
        self.events: list[Event] = []
        self.routine_ticks = True
        """Whether the schedule's routine lines (each tick enqueued, each of its jobs
        finished) are narrated; refusals and catch-ups always are."""
        self._changed = asyncio.Event()
        self._reader = asyncio.ensure_future(self._read())

    @classmethod
    async def start(
        cls, label: str, database_url: str, *, routine_ticks: bool = True
    ) -> WorkerProcess:
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
            "TASKQ_DATABASE_URL": database_url,
            "TASKQ_QUEUES": json.dumps(list(QUEUES)),
            "TASKQ_LOG_LEVEL": "DEBUG",  # job-finished lines are DEBUG
            "TASKQ_MAX_CONCURRENCY": "8",
            "TASKQ_POLL_INTERVAL": "0.05",
            "TASKQ_CANCELLATION_GRACE_PERIOD": "5",
            "TASKQ_CLEANUP_GRACE_PERIOD": "2",
            "TASKQ_TERMINATION_GRACE_PERIOD": "20",
        }
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "examples.fleet_demo.worker",
            env=env,
            stdout=asyncio.subprocess.PIPE,
        )
        worker = cls(label, proc)
        worker.routine_ticks = routine_ticks
        say(f"demo: started worker {label} (pid {proc.pid})")
        await worker.wait_for(lambda e: e.get("event") == "worker-started", "worker-started")
        return worker

    async def _read(self) -> None:
        assert self.proc.stdout is not None
        async for raw in self.proc.stdout:
            line = raw.decode(errors="replace").strip()
            try:
                event = json.loads(line)
            except ValueError:
                continue  # not one of the worker's JSON log lines
            if isinstance(event, dict):
                self.events.append(event)
                self._narrate(event)
                self._changed.set()
        self._changed.set()

    def _narrate(self, e: Event) -> None:
        name = e.get("event")
        tag = f"[worker {self.label}] {name}:"
        if name == "worker-started":
            say(f"{tag} queues={e.get('queues')} concurrency={e.get('concurrency')}")
        elif name in ("cron-tick-enqueued", "job-finished") and not self._shown(e):
            return
        elif name == "job-finished":
            say(
                f"{tag} {e.get('actor')} attempt={e.get('attempt')} "
                f"outcome={e.get('outcome')} error_class={e.get('error_class')}"
            )
        elif name in ("job-cancel-requested", "job-cancel-forced", "job-cancel-abandoned"):
            say(f"{tag} {e.get('actor')} attempt={e.get('attempt')} phase={e.get('phase')}")
        elif name == "worker-shutdown-requested":
            say(f"{tag} signal={e.get('signal')}")
        elif name == "worker-shutdown-phase":
            say(f"{tag} {e.get('phase')}")
        elif name == "worker-stopped":
            say(f"{tag} lingering_threads={e.get('lingering_threads')}")
        elif name == "cron-tick-enqueued":
            say(f"{tag} {e.get('schedule')} tick={e.get('tick')} outcome={e.get('outcome')}")
        elif name == "cron-tick-refused":
            say(f"{tag} {e.get('schedule')} tick={e.get('tick')} reason={e.get('reason')}")
        elif name == "cron-ticks-missed":
            say(
                f"{tag} {e.get('schedule')} policy={e.get('policy')} "
                f"dropped={e.get('dropped')} running={e.get('running')}"
            )
        elif e.get("level") in ("warning", "error", "critical"):
            say(f"{tag} {json.dumps({k: v for k, v in e.items() if k != 'event'})}")

    def _shown(self, e: Event) -> bool:
        if self.routine_ticks:
            return True
        return e.get("schedule") != SCHEDULE and e.get("actor") != sync_inventory.name

    async def wait_for(
        self,
        match: Callable[[Event], bool],
        what: str,
        timeout_s: float = 60.0,
        *,
        nth: int = 1,
        after: int = 0,
    ) -> Event:
        """The ``nth`` event (old or new, from index ``after`` on) for which ``match`` is
        true."""
        deadline = time.monotonic() + timeout_s
        seen = after
        found = 0
        while True:
            for event in self.events[seen:]:
                if match(event):
                    found += 1
                    if found == nth:
                        return event
            seen = max(seen, len(self.events))
            if self._reader.done():
                raise RuntimeError(f"worker {self.label} exited before logging {what}")
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"worker {self.label} did not log {what} in {timeout_s}s")
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), left)

    async def stop(self) -> int:
        """SIGTERM, as a deploy or ``systemctl stop`` sends it; the exit code."""
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
        code = await self.proc.wait()
        await self._reader
        return code


async def _wait_status(
    tq: TaskQ, job_id: UUID, statuses: Sequence[str], timeout_s: float = 60.0
) -> Any:
    handle: JobHandle[Any] = await tq.jobs.get(job_id)
    deadline = time.monotonic() + timeout_s
    while True:
        record = await handle.refresh()
        if record.status in statuses:
            return record
        if time.monotonic() > deadline:
            raise TimeoutError(f"job {job_id} still {record.status} after {timeout_s}s")
        await asyncio.sleep(0.05)


async def _drained(tq: TaskQ, which: JobFilter, timeout_s: float = 60.0) -> None:
    """Wait until no job matches ``which``."""
    deadline = time.monotonic() + timeout_s
    while (await tq.jobs.count(which)).count:
        if time.monotonic() > deadline:
            raise TimeoutError(f"jobs still match {which} after {timeout_s}s")
        await asyncio.sleep(0.05)


def most_in_window(starts: Sequence[Any], window_s: float) -> int:
    """The most starts that fell within any ``window_s`` seconds."""
    times = sorted(starts)
    return max(
        sum(1 for t in times[i:] if (t - first).total_seconds() <= window_s)
        for i, first in enumerate(times)
    )


async def act_rate_limits(tq: TaskQ, worker: WorkerProcess) -> None:
    say("\n== act 1: a rate limit holds jobs back ==")
    say(
        f"demo: enqueue 8 calls to partner acme, whose API allows {PARTNER_CAPACITY} at once "
        f"and {PARTNER_RATE:g} a second"
    )
    handles = await tq.jobs.enqueue_many([(call_partner_api, PartnerCall(n=n)) for n in range(8)])
    ids = [h.job_id for h in handles]
    mine = JobFilter(actor=call_partner_api.name)
    deadline = time.monotonic() + 60
    while True:  # one read of the store once the worker has claimed or parked every job
        records = [r for r in (await tq.jobs.list(mine, limit=100)).jobs if r.id in ids]
        parked = [r for r in records if r.status == "scheduled" and r.waiting_on is not None]
        unclaimed = [r for r in records if r.attempt == 0 and r.waiting_on is None]
        if (parked and not unclaimed) or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.02)
    admitted = sum(1 for r in records if r.attempt > 0)
    say(f"store: {admitted} admitted, {len(parked)} parked")
    for r in sorted(parked, key=lambda r: r.scheduled_at):
        say(
            f"store: parked {r.actor} status={r.status} waiting_on={r.waiting_on} "
            f"denials={r.denials} attempt={r.attempt} "
            f"ready_at=+{(r.scheduled_at - r.created_at).total_seconds():.1f}s"
        )
    records = [await _wait_status(tq, h.job_id, TERMINAL) for h in handles]
    attempts = [a for h in handles for a in await (await tq.jobs.get(h.job_id)).attempts()]
    snoozed = sum(1 for a in attempts if a.outcome == "snoozed")
    window = most_in_window([a.started_at for a in attempts], 1.0)
    say(
        f"store: 8 jobs {sorted({r.status for r in records})}, {len(attempts)} attempts, "
        f"{snoozed} snoozed, {sum(r.denials for r in records)} denials, "
        f"retry budget spent: {sum(r.budget_used for r in records)}"
    )
    allowed = int(PARTNER_CAPACITY + PARTNER_RATE * 1.0)
    say(
        f"store: at most {window} calls started in any 1 s "
        f"(the bucket allows {allowed}: {PARTNER_CAPACITY} at once + {PARTNER_RATE:g}/s)"
    )


async def act_operator_cancel(tq: TaskQ, worker: WorkerProcess) -> None:
    say("\n== act 2: an operator cancels a running job ==")
    handle = await tq.jobs.enqueue(build_report, Report(name="q3-revenue", steps=600))
    await _wait_status(tq, handle.job_id, ("running",))
    say(f"operator: cancel job {handle.job_id} ({build_report.name}, running)")
    await tq.jobs.cancel(handle.job_id)
    await worker.wait_for(
        lambda e: (
            e.get("event") == "job-cancel-requested" and e.get("job_id") == str(handle.job_id)
        ),
        "job-cancel-requested",
    )
    record = await _wait_status(tq, handle.job_id, TERMINAL)
    say(f"store: {build_report.name} {record.status} / {record.error_class}")


def _is(name: str, **fields: Any) -> Callable[[Event], bool]:
    return lambda e: e.get("event") == name and all(e.get(k) == v for k, v in fields.items())


async def act_cron_budgets(tq: TaskQ, worker: WorkerProcess) -> None:
    say("\n== act 3: cron budgets ==")
    say(f"operator: the warehouse API is down for maintenance: pause queue {INVENTORY_QUEUE}")
    await tq.queues.pause(INVENTORY_QUEUE)
    say(
        f"operator: schedule {sync_inventory.name} every second as {SCHEDULE} "
        f"(missed={INVENTORY_SCHEDULE.missed!r}, max_catchup={INVENTORY_SCHEDULE.max_catchup}); "
        f"the actor allows max_pending={INVENTORY_BACKLOG}"
    )
    start = len(worker.events)
    await tq.schedules.create(sync_inventory, INVENTORY_SCHEDULE, replace=True)
    refused = _is("cron-tick-refused", schedule=SCHEDULE)
    await worker.wait_for(refused, "cron-tick-refused", nth=2, after=start)
    record = await tq.schedules.get(SCHEDULE)
    waiting = await tq.jobs.count(JobFilter(actor=sync_inventory.name, status="pending"))
    say(
        f"store: {SCHEDULE} enqueued={record.enqueued_count} refused={record.refused_count} "
        f"last_outcome={record.last_outcome}; {waiting.count} jobs pending on the paused queue"
    )
    say(f"operator: maintenance is over: resume queue {INVENTORY_QUEUE}")
    start = len(worker.events)
    await tq.queues.resume(INVENTORY_QUEUE)
    finished = _is("job-finished", actor=sync_inventory.name, outcome="succeeded")
    await worker.wait_for(finished, "the backlog's jobs finished", nth=waiting.count, after=start)
    await worker.wait_for(_is("cron-tick-enqueued", schedule=SCHEDULE), "a tick", after=start)
    record = await tq.schedules.get(SCHEDULE)
    say(
        f"store: {SCHEDULE} last_outcome={record.last_outcome}, enqueued={record.enqueued_count}"
        f", refused={record.refused_count} (each refused tick was dropped, not retried)"
    )
    say("demo: the schedule keeps ticking; its routine lines are not shown from here on")
    worker.routine_ticks = False


async def _ticks_behind(tq: TaskQ, n: int) -> datetime:
    """Wait until at least ``n`` ticks of the schedule are due; its ``next_run_at``."""
    while True:
        nxt = (await tq.schedules.get(SCHEDULE)).next_run_at
        assert nxt is not None
        if (datetime.now(UTC) - nxt).total_seconds() >= n - 1:
            return nxt
        await asyncio.sleep(0.1)


async def act_deploy(tq: TaskQ, worker: WorkerProcess, database_url: str) -> WorkerProcess:
    say("\n== act 4: a SIGTERM deploy ==")
    handle = await tq.jobs.enqueue(migrate_tenant, Tenant(tenant="acme", steps=30))
    await _wait_status(tq, handle.job_id, ("running",))
    say(f"deploy: SIGTERM to worker {worker.label} while {migrate_tenant.name} is running")
    code = await worker.stop()
    record = await (await tq.jobs.get(handle.job_id)).refresh()
    say(f"demo: worker {worker.label} exited with code {code}")
    say(
        f"store: {migrate_tenant.name} is {record.status} after attempt {record.attempt} "
        f"(retry budget spent: {record.budget_used})"
    )
    due = await _ticks_behind(tq, 3)
    say(
        f"store: no worker is running: {SCHEDULE}'s ticks have been falling due since "
        f"{due:%H:%M:%S} and nobody enqueues them"
    )
    new = await WorkerProcess.start("B", database_url, routine_ticks=False)
    missed = await new.wait_for(_is("cron-ticks-missed", schedule=SCHEDULE), "cron-ticks-missed")
    since = datetime.fromisoformat(missed["since"])
    runs = await tq.schedules.history(SCHEDULE, limit=50)
    ticks = sorted(r.tick for r in runs if r.tick is not None and r.tick >= since)
    caught_up = ticks[: missed["running"]]
    say(
        f"store: worker B found {missed['dropped'] + missed['running']} ticks due (from "
        f"{since:%H:%M:%S}) and enqueued the {len(caught_up)} most recent, "
        f"{' and '.join(f'{t:%H:%M:%S}' for t in caught_up)}; it dropped the other "
        f"{missed['dropped']}"
    )
    record = await _wait_status(tq, handle.job_id, TERMINAL)
    tries = await (await tq.jobs.get(handle.job_id)).attempts()
    outcomes = ", ".join(f"{a.outcome}/{a.error_class}" for a in tries)
    say(f"store: {migrate_tenant.name} {record.status} on attempt {record.attempt}: {outcomes}")
    return new


async def main_async(database_url: str | None) -> int:
    # The demo narrates the workers' logs; its own client's INFO lines would only interleave.
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    settings = TaskQSettings.load(**({"database_url": database_url} if database_url else {}))
    url = settings.effective_database_url
    engine = make_engine(url, settings=settings)
    worker: WorkerProcess | None = None
    try:
        await migrate.upgrade(engine, settings=settings)
        async with TaskQ(engine=engine, settings=settings) as tq:
            worker = await WorkerProcess.start("A", url)
            await act_rate_limits(tq, worker)
            await act_operator_cancel(tq, worker)
            await act_cron_budgets(tq, worker)
            worker = await act_deploy(tq, worker, url)
            say("\n== the end ==")
            record = await tq.schedules.disable(SCHEDULE)
            say(
                f"operator: disable schedule {SCHEDULE} (it stays stored: "
                f"enqueued={record.enqueued_count}, refused={record.refused_count})"
            )
            await _drained(tq, JobFilter(actor=sync_inventory.name, status=("pending", "running")))
            code = await worker.stop()
            worker = None
            say(f"demo: worker B exited with code {code}")
            return 0
    finally:
        if worker is not None and worker.proc.returncode is None:
            worker.proc.kill()
            await worker.proc.wait()
        await engine.dispose()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="taskq's fleet demo, narrated from a worker's logs"
    )
    parser.add_argument("--database-url", default=None)
    args = parser.parse_args(argv)
    return asyncio.run(main_async(args.database_url))


if __name__ == "__main__":
    sys.exit(main())
