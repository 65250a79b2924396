"""The ticker: turns a worker's due schedules into jobs, at most once per tick fleet-wide.

Every worker runs one for the actors it runs (:meth:`Ticker.run_once` from the worker's
cron loop), and the database arbitrates: there is no election to get wrong.

Each tick is one transaction on the store (the ticks of a catch-up share one): a compare-and-set UPDATE moves the
schedule's ``next_run_at`` from the tick that was read on to the next one
(:func:`taskq.db.queries.cron.claim_tick`), then the job is inserted with the tick's
idempotency key ``cron:<tick>:<schedule id>`` and the outcome is recorded on the row.
Two workers evaluating one schedule at once both read the same ``next_run_at``; the
first UPDATE wins, the second matches no row (on Postgres it waits for the winner's
commit on the row lock, on SQLite behind the write lock) and enqueues nothing. The unique
``(actor, idempotency_key)`` index is the second line: whatever moved the schedule back
(an operator's re-enable, a restored backup), a tick's job is inserted at most once.

A cron job is an ordinary job: ``max_pending``, singletons, payload validation and every
other enqueue check apply. A tick the enqueue refuses is rolled back, then the schedule
is moved on anyway and the refusal recorded (``last_outcome='refused:<reason>'``,
``refused_count``) and logged at WARNING: the tick is dropped, never retried in a loop.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any, Final

import structlog
from sqlalchemy.ext.asyncio import AsyncEngine

from taskq.actor import ActorRef
from taskq.client import JobsClient
from taskq.clock import Clock
from taskq.cron.missed import plan_ticks
from taskq.cron.records import ScheduleRecord
from taskq.cron.schedule import Schedule
from taskq.cron.telemetry import record_ticks, tick_span
from taskq.cron.ticks import tick_id
from taskq.db.engine import transaction
from taskq.db.queries import cron as q
from taskq.enqueue_options import EnqueueOptions
from taskq.exceptions import (
    MaxPendingExceededError,
    PayloadValidationError,
    SingletonCollisionError,
    TaskQError,
)
from taskq.records import EnqueueArgs

__all__ = ["POLL_S", "Ticker", "refusal_reason"]

POLL_S: Final = 1.0
"""The longest a worker's cron loop sleeps: how soon it sees a new or re-enabled schedule."""
_log = structlog.get_logger("taskq.cron")


def refusal_reason(exc: BaseException) -> str:
    """The ``refused:<reason>`` suffix for an enqueue error."""
    if isinstance(exc, MaxPendingExceededError):
        return "max_pending"
    if isinstance(exc, SingletonCollisionError):
        return "singleton"
    if isinstance(exc, PayloadValidationError):
        return "invalid-payload"
    return "error"


class Ticker:
    """Evaluates the schedules of ``actors`` and enqueues their due ticks on ``client``.

    ``clock`` decides what is due; by default it is the store's own clock (Postgres
    ``clock_timestamp()``), read with the due schedules, so every worker agrees on the
    time whatever its host's clock says. ``rng`` draws the jitter.
    """

    def __init__(
        self,
        engine: AsyncEngine,
        client: JobsClient,
        actors: Mapping[str, ActorRef[Any, Any]],
        *,
        clock: Clock | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.engine = engine
        self.client = client
        self.actors = dict(actors)
        self.clock = clock
        self.now: datetime | None = None
        """The time the last round went by (the store's clock unless ``clock`` is given)."""
        self.rng = rng or random.Random()
        self.enqueued = 0
        """Jobs this ticker has enqueued (ticks it won and that were not duplicates)."""

    async def run_once(self) -> datetime | None:
        """Enqueue every due tick of this worker's schedules; return when to look again
        (the earliest next tick seen within :data:`POLL_S`, or ``None``)."""
        if not self.actors:
            return None
        async with transaction(self.engine, readonly=True) as conn:
            if self.clock is not None:
                now = self.clock.now()
            else:
                now = (await conn.execute(q.store_now(conn.dialect.name))).scalar_one()
            horizon = now + timedelta(seconds=POLL_S)
            rows = (await conn.execute(q.due(horizon, self.actors))).mappings().all()
        self.now = now
        wake: datetime | None = None
        for row in rows:
            record = ScheduleRecord.from_mapping(row)
            assert record.next_run_at is not None
            nxt: datetime | None = record.next_run_at
            if record.next_run_at <= now:
                try:
                    with tick_span(record.id, record.actor):
                        nxt = await self._tick(record, now)
                except Exception as exc:  # one bad row never stops the others
                    _log.warning(
                        "cron-tick-failed", schedule=record.id, actor=record.actor, error=repr(exc)
                    )
                    nxt = None
            if nxt is not None and (wake is None or nxt < wake):
                wake = nxt
        return wake

    async def _tick(self, record: ScheduleRecord, now: datetime) -> datetime | None:
        assert record.next_run_at is not None
        expected = record.next_run_at
        try:
            schedule = record.schedule()
        except (TypeError, ValueError) as exc:
            _log.error("cron-schedule-invalid", schedule=record.id, error=str(exc))
            async with transaction(self.engine) as conn:
                await conn.execute(
                    q.clear_next_run(conn.dialect.name, record.id, expected, str(exc))
                )
            return None
        plan = plan_ticks(
            schedule.timetable,
            schedule.missed,
            due_from=expected,
            now=now,
            max_catchup=schedule.max_catchup,
        )

        def missed() -> None:  # reported by the worker whose claim won, once
            if plan.dropped:
                record_ticks(record.id, record.actor, "missed", plan.dropped)
                _log.info(
                    "cron-ticks-missed",
                    schedule=record.id,
                    policy=schedule.missed,
                    dropped=plan.dropped,
                    running=len(plan.run),
                    since=expected.isoformat(),
                )

        if not plan.run:
            async with transaction(self.engine) as conn:
                stmt = q.claim_tick(conn.dialect.name, record.id, expected, plan.next_run_at)
                won = (await conn.execute(stmt)).rowcount == 1
            if won:
                missed()
            return plan.next_run_at
        ref = self.actors[record.actor]
        if len(plan.run) > 1:
            caught_up = await self._enqueue_catchup(
                record, ref, schedule, expected, plan.run, plan.next_run_at, now
            )
            if caught_up is not None:
                if caught_up:
                    missed()
                return plan.next_run_at if caught_up else None
        claimed = expected
        for i, tick in enumerate(plan.run):
            following = plan.run[i + 1] if i + 1 < len(plan.run) else plan.next_run_at
            if not await self._enqueue_tick(record, ref, schedule, claimed, tick, following, now):
                return None  # another worker has this schedule now
            if i == 0:
                missed()
            claimed = following
        return plan.next_run_at

    def _scheduled_at(self, schedule: Schedule, tick: datetime, now: datetime) -> datetime | None:
        if schedule.jitter_s is None:
            return None
        at = tick + timedelta(seconds=self.rng.uniform(0.0, schedule.jitter_s))
        return at if at > now else None

    async def _enqueue_tick(
        self,
        record: ScheduleRecord,
        ref: ActorRef[Any, Any],
        schedule: Schedule,
        expected: datetime,
        tick: datetime,
        following: datetime,
        now: datetime,
    ) -> bool:
        """Claim ``tick`` and enqueue its job; ``False`` when another worker claimed it."""
        stamp = tick_id(tick)
        try:
            async with transaction(self.engine) as conn:
                claim = q.claim_tick(conn.dialect.name, record.id, expected, following)
                if (await conn.execute(claim)).rowcount != 1:
                    return False
                handle = await self.client.enqueue(
                    ref,
                    record.payload,
                    **self._options(record, schedule, tick, now),
                    connection=conn,
                )
                outcome = "deduplicated" if handle.was_existing else "enqueued"
                await conn.execute(
                    q.record_tick(
                        record.id,
                        outcome=outcome,
                        at=now,
                        tick=tick,
                        job_id=handle.job_id,
                        enqueued=0 if handle.was_existing else 1,
                    )
                )
        except (TaskQError, ValueError, TypeError) as exc:
            return await self._refuse(record, expected, tick, following, now, exc)
        if not handle.was_existing:
            self.enqueued += 1
        record_ticks(record.id, record.actor, outcome)
        _log.debug(
            "cron-tick-enqueued",
            schedule=record.id,
            tick=stamp,
            job_id=str(handle.job_id),
            outcome=outcome,
        )
        return True

    def _options(
        self, record: ScheduleRecord, schedule: Schedule, tick: datetime, now: datetime
    ) -> EnqueueOptions:
        stamp = tick_id(tick)
        return {
            "queue": schedule.queue,
            "priority": schedule.priority,
            "tags": schedule.tags or None,
            "identity_key": schedule.identity_key,
            "idempotency_key": q.tick_key(record.id, stamp),
            "scheduled_at": self._scheduled_at(schedule, tick, now),
            "metadata": {"cron_schedule": record.id, "cron_tick": stamp},
        }

    async def _enqueue_catchup(
        self,
        record: ScheduleRecord,
        ref: ActorRef[Any, Any],
        schedule: Schedule,
        expected: datetime,
        ticks: tuple[datetime, ...],
        next_run_at: datetime,
        now: datetime,
    ) -> bool | None:
        """Claim and enqueue several due ticks in one transaction (one commit, not one per
        tick). ``False``: another worker claimed them. ``None``: the enqueue refused one of
        them; nothing was written and the caller goes tick by tick, recording each."""
        items = [
            EnqueueArgs(ref, record.payload, self._options(record, schedule, t, now)) for t in ticks
        ]
        try:
            async with transaction(self.engine) as conn:
                claim = q.claim_tick(conn.dialect.name, record.id, expected, next_run_at)
                if (await conn.execute(claim)).rowcount != 1:
                    return False
                handles = await self.client.enqueue_many(items, connection=conn)
                created = sum(1 for h in handles if not h.was_existing)
                outcome = "deduplicated" if handles[-1].was_existing else "enqueued"
                await conn.execute(
                    q.record_tick(
                        record.id,
                        outcome=outcome,
                        at=now,
                        tick=ticks[-1],
                        job_id=handles[-1].job_id,
                        enqueued=created,
                    )
                )
        except (TaskQError, ValueError, TypeError):
            return None
        self.enqueued += created
        record_ticks(record.id, record.actor, "enqueued", created)
        record_ticks(record.id, record.actor, "deduplicated", len(ticks) - created)
        _log.debug("cron-ticks-caught-up", schedule=record.id, ticks=len(ticks), created=created)
        return True

    async def _refuse(
        self,
        record: ScheduleRecord,
        expected: datetime,
        tick: datetime,
        following: datetime,
        now: datetime,
        exc: BaseException,
    ) -> bool:
        """Move the schedule past a tick the enqueue refused and record why."""
        reason = refusal_reason(exc)
        async with transaction(self.engine) as conn:
            claim = q.claim_tick(conn.dialect.name, record.id, expected, following)
            if (await conn.execute(claim)).rowcount != 1:
                return False
            await conn.execute(
                q.record_tick(
                    record.id,
                    outcome=f"refused:{reason}",
                    at=now,
                    tick=tick,
                    error=str(exc),
                    refused=1,
                )
            )
        record_ticks(record.id, record.actor, f"refused:{reason}")
        _log.warning(
            "cron-tick-refused",
            schedule=record.id,
            actor=record.actor,
            tick=tick_id(tick),
            reason=reason,
            error=str(exc),
        )
        return True
