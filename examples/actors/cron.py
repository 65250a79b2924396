"""Cron: schedules on an actor, the operator's switches, missed ticks and a backlog budget.

What to observe:

- ``heartbeat`` declares ``Schedule(every=timedelta(seconds=1), id="examples-cron-heartbeat")``
  on the actor. The worker seeds it into ``cron_schedules`` when it starts
  (``origin='code'``), then turns each tick into one ordinary job: its idempotency key is
  ``cron:<tick>:examples-cron-heartbeat`` and its metadata names the schedule and the tick
  (whole seconds on the schedule's one-second grid). No tick has two jobs.
- Once three ticks have run, the operator calls ``tq.schedules.run_now`` (one more job,
  outside the timetable: ``cron_tick='run-now'``, ``last_outcome='run-now'``) and then
  ``tq.schedules.disable``: the schedule stays stored and makes no more jobs.
- ``nightly_rollup`` has three schedules that an operator stored through the API
  (``origin='api'``) four days ago. No worker has run since then: a ``FakeClock`` given to
  ``SchedulesClient`` placed their first tick in the past (the worker itself goes by the
  store's clock). So four daily ticks are due when the worker starts, and each schedule's
  ``missed`` policy decides what runs. ``latest`` runs one job, for the most recent tick.
  ``all`` with ``max_catchup=3`` runs three, for the three most recent ticks, oldest first.
  ``skip`` runs none, because its last tick is hours late.
- ``refresh_cache`` has ``max_pending=1``, a backlog budget. While one of its jobs waits
  (enqueued to run an hour from now), every tick of its every-second schedule is
  **refused**: the tick is dropped, not retried, and recorded on the schedule
  (``last_outcome='refused:max_pending'``, ``refused_count``). The worker logs it once at
  WARNING (``cron-tick-refused``). Cancelling the waiting job frees the budget, and the
  next tick enqueues.

The example deletes its schedules when it ends (their jobs stay), so it can be run again.
Run it twice within a minute and the second run finds the missed ticks' jobs already made
(a tick's idempotency key is the backstop): no new job, ``last_outcome='deduplicated'``.

Run: ``python -m examples.actors.cron [--database-url URL]``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterable
from datetime import UTC, datetime, timedelta
from uuid import UUID

from pydantic import BaseModel

from examples.actors import runner
from taskq import JobFilter, Schedule, TaskQ, actor
from taskq.cron import MissedPolicy
from taskq.cron.client import SchedulesClient
from taskq.cron.records import ScheduleRecord
from taskq.exceptions import ScheduleNotFoundError
from taskq.records import JobRecord
from taskq.testing.clock import FakeClock

QUEUE = "examples.cron"
HEARTBEAT = "examples-cron-heartbeat"
REFRESH = "examples-cron-refresh"
NIGHTLY: dict[MissedPolicy, str] = {
    "latest": "examples-cron-nightly-latest",
    "all": "examples-cron-nightly-all",
    "skip": "examples-cron-nightly-skip",
}


class Beat(BaseModel):
    source: str = "cron"


class Rollup(BaseModel):
    scope: str = "nightly"


class Refresh(BaseModel):
    cache: str = "prices"


class Done(BaseModel):
    what: str


@actor(
    name="examples_cron_heartbeat",
    queue=QUEUE,
    schedules=[Schedule(every=timedelta(seconds=1), id=HEARTBEAT, payload=Beat())],
)
async def heartbeat(payload: Beat) -> Done:
    """Runs once a second while its schedule is enabled."""
    return Done(what=f"beat from {payload.source}")


@actor(name="examples_cron_nightly_rollup", queue=QUEUE)
async def nightly_rollup(payload: Rollup) -> Done:
    """A daily job; its schedules are stored by an operator, not declared here."""
    return Done(what=f"{payload.scope} rollup")


@actor(
    name="examples_cron_refresh_cache",
    queue=QUEUE,
    max_pending=1,
    schedules=[Schedule(every=timedelta(seconds=1), id=REFRESH, payload=Refresh())],
)
async def refresh_cache(payload: Refresh) -> Done:
    """At most one job waiting at a time: a tick never piles onto a backlog."""
    return Done(what=f"{payload.cache} refreshed")


state: dict[str, object] = {}
"""What ``enqueue`` and ``during`` saw, for the notes."""


async def _until(
    tq: TaskQ, schedule_id: str, done: Callable[[ScheduleRecord], bool]
) -> ScheduleRecord:
    """Re-read the schedule until ``done(record)`` (the runner's timeout bounds the wait)."""
    while True:
        with contextlib.suppress(ScheduleNotFoundError):  # not seeded by the worker yet
            record = await tq.schedules.get(schedule_id)
            if done(record):
                return record
        await asyncio.sleep(0.05)


async def _forget(tq: TaskQ, *schedule_ids: str) -> None:
    """Delete schedules left by an earlier run (a worker re-seeds the code ones)."""
    for schedule_id in schedule_ids:
        with contextlib.suppress(ScheduleNotFoundError):
            await tq.schedules.delete(schedule_id)


async def enqueue(tq: TaskQ) -> Iterable[UUID]:
    await _forget(tq, HEARTBEAT, REFRESH, *NIGHTLY.values())
    # The job that fills refresh_cache's budget of one, before the worker starts.
    blocker = await tq.jobs.enqueue(refresh_cache, Refresh(cache="all"), delay=timedelta(hours=1))
    state["since"] = (await blocker.refresh()).created_at  # the store's clock
    state["blocker"] = blocker.job_id

    # A daily time two hours ago, so the last missed tick is hours late whatever the time
    # of day this runs at.
    last = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(hours=2)
    state["last_tick"] = last
    four_days_ago = FakeClock(last - timedelta(days=3, minutes=1))
    operator = SchedulesClient(tq.engine, tq.jobs, clock=four_days_ago)
    for policy, schedule_id in NIGHTLY.items():
        created = await operator.create(
            nightly_rollup,
            Schedule(
                cron=f"{last.minute} {last.hour} * * *",
                id=schedule_id,
                payload=Rollup(scope=policy),
                missed=policy,
                max_catchup=3,
            ),
        )
        assert created.next_run_at == last - timedelta(days=3)
    return [blocker.job_id]


async def during(tq: TaskQ) -> Iterable[UUID]:
    """The operator's side, while the worker runs; returns the jobs the schedules made."""
    await _until(tq, HEARTBEAT, lambda r: r.enqueued_count >= 3)
    manual = await tq.schedules.run_now(HEARTBEAT)
    state["run_now"] = manual.job_id
    state["after_run_now"] = (await tq.schedules.get(HEARTBEAT)).last_outcome
    off = await tq.schedules.disable(HEARTBEAT)
    state["heartbeat_off"] = off

    refused = await _until(tq, REFRESH, lambda r: r.refused_count >= 2)
    state["refused"] = refused
    assert isinstance(state["blocker"], UUID)
    await tq.jobs.cancel(state["blocker"])
    freed = await _until(tq, REFRESH, lambda r: r.enqueued_count >= 1)
    state["freed"] = freed
    await tq.schedules.disable(REFRESH)

    last = state["last_tick"]
    assert isinstance(last, datetime)
    waited: Callable[[ScheduleRecord], bool] = lambda r: (  # noqa: E731
        r.next_run_at is not None and r.next_run_at > last
    )
    outcomes: dict[str, str | None] = {}
    for schedule_id in NIGHTLY.values():
        handled = await _until(tq, schedule_id, waited)  # the worker took its missed ticks
        outcomes[schedule_id] = handled.last_outcome
    state["outcomes"] = outcomes

    assert isinstance(state["since"], datetime)
    made = JobFilter(
        actor=[heartbeat.name, nightly_rollup.name, refresh_cache.name],
        created_after=state["since"],
    )
    page = await tq.jobs.list(made, limit=500)
    return [r.id for r in reversed(page.jobs)]  # oldest first


def _ticks(records: Iterable[JobRecord]) -> list[str]:
    return sorted(str(r.metadata.get("cron_tick")) for r in records)


async def notes(tq: TaskQ, report: runner.Report) -> list[str]:
    records = [await (await tq.jobs.get(j.id)).refresh() for j in report.jobs]
    by_schedule: dict[str, list[JobRecord]] = {}
    for r in records:
        by_schedule.setdefault(str(r.metadata.get("cron_schedule")), []).append(r)
    beats = [r for r in by_schedule[HEARTBEAT] if r.metadata.get("cron_tick") != "run-now"]
    keys = sorted(str(r.idempotency_key) for r in beats)
    off = state["heartbeat_off"]
    refused = state["refused"]
    freed = state["freed"]
    assert isinstance(off, ScheduleRecord)
    assert isinstance(refused, ScheduleRecord)
    assert isinstance(freed, ScheduleRecord)
    lines = [
        f"heartbeat: {len(beats)} ticks, {len(set(keys))} distinct idempotency keys, "
        f"e.g. {keys[0]}",
        f"heartbeat: run_now made job {state['run_now']} (cron_tick='run-now'), "
        f"last_outcome={state['after_run_now']!r}",
        f"heartbeat: disabled (enabled={off.enabled}, origin={off.origin!r}), "
        f"{off.enqueued_count} jobs enqueued by its ticks",
    ]
    last = state["last_tick"]
    outcomes = state["outcomes"]
    assert isinstance(last, datetime)
    assert isinstance(outcomes, dict)
    for policy, schedule_id in NIGHTLY.items():
        made = by_schedule.get(schedule_id, [])
        days = [
            (last - datetime.fromisoformat(tick.replace("Z", "+00:00"))).days
            for tick in _ticks(made)
        ]
        ago = ", ".join(f"{d}d" for d in days) or "none"
        jobs = f"{len(made)} job" + ("" if len(made) == 1 else "s")
        outcome = outcomes[schedule_id]
        lines.append(
            f"missed={policy!r}: {jobs} for the 4 missed ticks (days before the last one: "
            f"{ago}; last_outcome={outcome!r})"
        )
    lines += [
        f"refresh_cache: {refused.refused_count} ticks refused while one job waited, "
        f"last_outcome={refused.last_outcome!r}",
        f"refresh_cache: after the waiting job was cancelled, last_outcome="
        f"{freed.last_outcome!r} ({freed.enqueued_count} enqueued)",
    ]
    for schedule_id in (HEARTBEAT, REFRESH, *NIGHTLY.values()):
        await tq.schedules.delete(schedule_id)  # their jobs stay
    return lines


async def example(database_url: str | None = None) -> runner.Report:
    state.clear()
    side: Callable[[TaskQ], Awaitable[Iterable[UUID]]] = during
    return await runner.run(
        "cron: schedules, run-now, missed ticks, a backlog budget",
        [heartbeat, nightly_rollup, refresh_cache],
        enqueue,
        database_url=database_url,
        during=side,
        notes=notes,
    )


if __name__ == "__main__":
    runner.main(example)
