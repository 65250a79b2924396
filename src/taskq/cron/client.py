# sync twin: src/taskq_sync/cron/client.py
"""``tq.schedules``: create, read and operate the stored schedules.

``list``/``get`` show each schedule with its last run, its next run and the last tick's
outcome (and the status of the job it made); ``history`` lists the jobs it made.
``enable``/``disable``/``delete`` are the operator's switches; ``run_now`` enqueues one job
from the schedule immediately, outside its timetable. Schedules declared in code are
re-seeded at every worker start (see :mod:`taskq.cron.sync`): disable one to stop it;
a deleted code schedule comes back at the next worker start.
"""

from __future__ import annotations

import builtins
import uuid
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from taskq.actor import ActorRef, find_actor
from taskq.clock import Clock
from taskq.cron.records import ScheduleRecord, ScheduleRun, schedule_row
from taskq.cron.schedule import Schedule, bind_schedule, validate_schedule_id
from taskq.db.engine import transaction
from taskq.db.queries import cron as q
from taskq.exceptions import ScheduleExistsError, ScheduleNotFoundError

if TYPE_CHECKING:
    from taskq.client import JobsClient
    from taskq.handle import JobHandle

__all__ = ["SchedulesClient"]

_TICK_LEN = len("2026-12-01T22:00:00Z")


def _tick_of(key: str | None) -> datetime | None:
    """The tick time in a tick's idempotency key (``None`` for a run-now's)."""
    if not key:
        return None
    stamp = key[len(q.TICK_KEY_PREFIX) : len(q.TICK_KEY_PREFIX) + _TICK_LEN]
    try:
        return datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    except ValueError:
        return None


class SchedulesClient:
    """Operator-side schedule operations on ``engine``; ``jobs`` enqueues run-now jobs.

    ``clock`` places a new or re-enabled schedule's first tick; by default the store's
    clock, the one the workers' tickers go by.
    """

    def __init__(
        self, engine: AsyncEngine, jobs: JobsClient, *, clock: Clock | None = None
    ) -> None:
        self.engine = engine
        self.jobs = jobs
        self.clock = clock

    async def _now(self, conn: AsyncConnection) -> datetime:
        if self.clock is not None:
            return self.clock.now()
        now: datetime = (await conn.execute(q.store_now(conn.dialect.name))).scalar_one()
        return now

    async def _read(self, conn: AsyncConnection, schedule_id: str) -> ScheduleRecord:
        row = (await conn.execute(q.get(schedule_id))).mappings().first()
        if row is None:
            raise ScheduleNotFoundError(schedule_id)
        status = None
        if row["last_job_id"] is not None:
            found = (await conn.execute(q.job_statuses([row["last_job_id"]]))).first()
            status = str(found[1]) if found is not None else None
        return ScheduleRecord.from_mapping(row, last_job_status=status)

    async def create(
        self, actor: ActorRef[Any, Any] | str, schedule: Schedule, *, replace: bool = False
    ) -> ScheduleRecord:
        """Store ``schedule`` for ``actor`` (an ``ActorRef``, or the name of one declared in
        this process); return the stored row.

        The payload and options are validated against the actor first. Raises
        ``ScheduleExistsError`` when the id exists (``replace=True`` overwrites it, state
        included), ``LookupError`` for an unknown actor.
        """
        ref = _actor(actor)
        bound = bind_schedule(ref, schedule, default_id=True)
        try:
            async with transaction(self.engine) as conn:
                first = bound.timetable.next_after(await self._now(conn))
                row = schedule_row(ref.name, bound, origin="api", next_run_at=first)
                await conn.execute(q.insert(conn.dialect.name, row, replace=replace))
                return await self._read(conn, str(bound.id))
        except IntegrityError:
            raise ScheduleExistsError(str(bound.id)) from None

    async def get(self, schedule_id: str) -> ScheduleRecord:
        """One schedule; ``ScheduleNotFoundError`` if there is none."""
        validate_schedule_id(schedule_id)
        async with transaction(self.engine, readonly=True) as conn:
            return await self._read(conn, schedule_id)

    async def list(
        self, *, actor: str | None = None, enabled: bool | None = None
    ) -> builtins.list[ScheduleRecord]:
        """Every schedule by id (optionally one actor's, or only enabled/disabled ones)."""
        async with transaction(self.engine, readonly=True) as conn:
            rows = (await conn.execute(q.list_all(actor=actor, enabled=enabled))).mappings().all()
            job_ids = [r["last_job_id"] for r in rows if r["last_job_id"] is not None]
            statuses: dict[Any, str] = {}
            if job_ids:
                found = await conn.execute(q.job_statuses(job_ids))
                statuses = {jid: str(status) for jid, status in found.all()}
        return [
            ScheduleRecord.from_mapping(r, last_job_status=statuses.get(r["last_job_id"]))
            for r in rows
        ]

    async def counts(self) -> dict[str, dict[str, int]]:
        """Per actor: how many schedules are ``enabled`` and ``disabled`` (for an admin
        page, and for the deregistration rule: enabled schedules block it)."""
        async with transaction(self.engine, readonly=True) as conn:
            found = (await conn.execute(q.count_by_actor())).all()
        out: dict[str, dict[str, int]] = {}
        for name, enabled, n in found:
            entry = out.setdefault(str(name), {"enabled": 0, "disabled": 0})
            entry["enabled" if enabled else "disabled"] += int(n)
        return out

    async def enable(self, schedule_id: str) -> ScheduleRecord:
        """Enable the schedule from its next tick on (ticks while it was disabled are not
        caught up). A no-op on an enabled schedule."""
        validate_schedule_id(schedule_id)
        async with transaction(self.engine) as conn:
            record = await self._read(conn, schedule_id)
            if not record.enabled:
                nxt = record.schedule().timetable.next_after(await self._now(conn))
                await conn.execute(q.set_enabled(conn.dialect.name, schedule_id, True, nxt))
                record = await self._read(conn, schedule_id)
        return record

    async def disable(self, schedule_id: str) -> ScheduleRecord:
        """Disable the schedule: no tick is enqueued until it is enabled again."""
        validate_schedule_id(schedule_id)
        async with transaction(self.engine) as conn:
            await self._read(conn, schedule_id)
            await conn.execute(q.set_enabled(conn.dialect.name, schedule_id, False))
            return await self._read(conn, schedule_id)

    async def delete(self, schedule_id: str) -> ScheduleRecord:
        """Delete the schedule and return what it was; its jobs stay."""
        validate_schedule_id(schedule_id)
        async with transaction(self.engine) as conn:
            record = await self._read(conn, schedule_id)
            await conn.execute(q.delete_schedule(schedule_id))
        return record

    async def run_now(self, schedule_id: str) -> JobHandle[Any]:
        """Enqueue one job from the schedule now (enabled or not), outside its timetable.

        The schedule's actor must be declared in this process (its payload is validated
        as every enqueue's is). Records ``last_outcome='run-now'`` on success; an enqueue
        refusal (``MaxPendingExceededError``, ...) is raised and changes nothing.
        """
        validate_schedule_id(schedule_id)
        record = await self.get(schedule_id)
        ref = _actor(record.actor)
        schedule = record.schedule()
        tick = f"manual-{uuid.uuid4().hex}"
        async with transaction(self.engine) as conn:
            now = await self._now(conn)
            handle = await self.jobs.enqueue(
                ref,
                record.payload,
                queue=schedule.queue,
                priority=schedule.priority,
                tags=schedule.tags or None,
                identity_key=schedule.identity_key,
                idempotency_key=q.tick_key(schedule_id, tick),
                metadata={"cron_schedule": schedule_id, "cron_tick": "run-now"},
                connection=conn,
            )
            await conn.execute(
                q.record_tick(
                    schedule_id, outcome="run-now", at=now, tick=None, job_id=handle.job_id
                )
            )
        return handle

    async def history(self, schedule_id: str, *, limit: int = 20) -> builtins.list[ScheduleRun]:
        """The schedule's most recent jobs, newest first (``limit`` at most)."""
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ValueError(f"limit must be an int >= 1, got {limit!r}")
        validate_schedule_id(schedule_id)
        async with transaction(self.engine, readonly=True) as conn:
            record = await self._read(conn, schedule_id)
            rows = (await conn.execute(q.history(record.actor, schedule_id, limit))).all()
        return [
            ScheduleRun(
                job_id=r.id,
                status=str(r.status),
                tick=_tick_of(r.idempotency_key),
                scheduled_at=r.scheduled_at,
                created_at=r.created_at,
                finished_at=r.finished_at,
                error_class=r.error_class,
            )
            for r in rows
        ]


def _actor(actor: ActorRef[Any, Any] | str) -> ActorRef[Any, Any]:
    if isinstance(actor, ActorRef):
        return actor
    if not isinstance(actor, str):
        raise TypeError(f"actor must be an ActorRef or a name, got {type(actor).__name__}")
    ref = find_actor(actor)
    if ref is None:
        raise LookupError(
            f"actor {actor!r} is not declared in this process: import the module that "
            "declares it (the CLI's --app MODULE)"
        )
    return ref
