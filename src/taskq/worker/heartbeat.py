"""Liveness: renew leases, stamp the worker row, and walk away when the store is gone.

Every ``heartbeat_interval`` one transaction stamps the worker row, extends the lease of
every claimed row this worker still holds (to now + ``lock_lease``) and the leases of
the reservation slots those jobs hold (each to now + its reservation's ``lease``, see
:func:`taskq.db.queries.worker.renew_slot_leases`). Slots of memory-backed reservations
are renewed in process on the same beat, before the transaction (they need no store):
otherwise a job running longer than the lease would lose its slot to the next job in
this process, over-admitting the reservation. When heartbeats keep failing for longer than the
lock lease, the sweep elsewhere may already have handed this worker's rows to someone
else: :meth:`Heartbeat.isolate_self` stops every local attempt instead of finishing
work that is no longer ours.

**Leases lost or lapsed.** Each renewal returns the rows it renewed; a running job whose
row is neither renewed nor still held by this worker (a renewal skips rows another
transaction has locked, see :func:`taskq.db.queries.worker.renew_job_leases`) was
reclaimed: it is cancelled at once (``worker-lease-lost``). The heartbeat also keeps, per
job, the monotonic time its lease was last known to start; a job whose lease has lapsed by
that clock (the process was frozen, its event loop blocked, or the store unreachable, for
longer than the lease) is cancelled before the worker does anything else
(:meth:`Heartbeat.isolate_lapsed`, run first on ``SIGCONT`` and at the top of every beat).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any
from uuid import UUID

import structlog
from sqlalchemy.exc import DBAPIError, SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine

from taskq.db.dialect import schema_translate_map
from taskq.db.engine import transaction
from taskq.db.queries import worker as wq
from taskq.worker.dispatch import Dispatcher
from taskq.worker.resources import Limits, SlotHold
from taskq.worker.shutdown import pause
from taskq.worker.state import RunningJob

__all__ = ["Heartbeat"]

_log = structlog.get_logger("taskq.worker.heartbeat")


class Heartbeat:
    """The heartbeat loop of one worker."""

    def __init__(
        self,
        engine: AsyncEngine,
        dispatcher: Dispatcher,
        *,
        worker_id: UUID,
        interval_s: float,
        lease_s: float,
        grace_s: float,
        renew_slots: bool,
        limits: Limits | None = None,
        after_beat: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self._engine = engine
        self._dispatcher = dispatcher
        self._worker_id = worker_id
        self._interval = interval_s
        self._lease = lease_s
        self._grace = grace_s
        self.renew_slots = renew_slots
        self._limits = limits
        self._after_beat = after_beat
        self.status = "running"
        self.last_ok = time.monotonic()
        self.isolated = False
        self._renewed: dict[UUID, float] = {}
        """Per job id: the monotonic time its lease was last renewed from (its claim's
        time until the first renewal)."""
        dialect = engine.dialect.name
        self._beat = wq.heartbeat_worker(dialect, worker_id, "running")
        self._leases = wq.renew_job_leases(dialect, worker_id, lease_s)
        self._held = wq.held_jobs(worker_id)
        self._slots = wq.renew_slot_leases(dialect, worker_id)
        self._dialect = dialect

    async def beat(self) -> None:
        """One heartbeat transaction (raises on a store error); cancels, at once, every
        running job whose lease the renewal found lost."""
        started = time.monotonic()
        # The attempts as they are now: by the time the renewal answers, a job may have
        # ended and been claimed again (same id, next attempt), which this beat did not see.
        snapshot = dict(self._dispatcher.inflight)
        ids = list(snapshot)
        held = self._held_slots(ids)
        # Keyed by the reservation's schema; None: the worker engine's own map.
        stored: dict[str | None, list[dict[str, Any]]] = {}
        for hold in held:
            res = hold.reservation
            if res.clock is not None:
                await res.renew(hold.slot_index, self._worker_id)
                continue
            stored.setdefault(res.schema, []).append(
                {
                    "b_name": res.name,
                    "b_slot": hold.slot_index,
                    "b_job": hold.job_id,
                    "b_lease": res.lease_s,
                }
            )
        renewed: set[tuple[UUID, int]] = set()
        still: set[tuple[UUID, int]] = set()
        async with transaction(self._engine) as conn:
            await conn.execute(wq.heartbeat_worker(self._dialect, self._worker_id, self.status))
            if ids:
                result = await conn.execute(self._leases, {"ids": ids})
                renewed = {(row.id, row.attempt) for row in result.all()}
                if len(renewed) < len(ids):
                    done = {job_id for job_id, _ in renewed}
                    skipped = [job_id for job_id in ids if job_id not in done]
                    rows = await conn.execute(self._held, {"ids": skipped})
                    still = {(row.id, row.attempt) for row in rows.all()}
            for schema, params in stored.items():
                translate = (
                    schema_translate_map(self._engine.url, schema) if schema is not None else None
                )
                options = {"schema_translate_map": translate} if translate else {}
                await conn.execute(self._slots, params, execution_options=options)
        self.last_ok = time.monotonic()
        self._track(snapshot, renewed, still, started)
        if self.isolated:
            _log.warning("worker-rejoined", worker_id=str(self._worker_id))
            self.isolated = False

    def _track(
        self,
        snapshot: dict[UUID, RunningJob],
        renewed: set[tuple[UUID, int]],
        still: set[tuple[UUID, int]],
        started: float,
    ) -> None:
        """Remember the renewals; cancel the running jobs whose rows are no longer ours.

        Only the attempts of ``snapshot`` (taken before the renewal) are judged, and only
        while they are still running here: a job claimed again meanwhile is a new attempt
        the renewal never looked at.
        """
        inflight = self._dispatcher.inflight
        for job_id in list(self._renewed):
            if job_id not in inflight:
                del self._renewed[job_id]
        for job_id, _attempt in renewed:
            self._renewed[job_id] = started
        running = self._dispatcher.running
        lost = [
            job
            for job_id, job in snapshot.items()
            if running.get(job_id) is job
            and (job_id, job.attempt) not in renewed
            and (job_id, job.attempt) not in still
        ]
        if lost:
            _log.error(
                "worker-lease-lost",
                worker_id=str(self._worker_id),
                jobs=[str(job.id) for job in lost],
            )
            self._stop_jobs(lost)

    def lapsed(self) -> list[RunningJob]:
        """Running jobs whose lease has run out by this process's monotonic clock."""
        now = time.monotonic()
        return [
            job
            for job in self._dispatcher.running.values()
            if now - max(self._renewed.get(job.id, 0.0), job.claimed_mono) > self._lease
        ]

    def isolate_lapsed(self, why: str) -> int:
        """Cancel, at once, every running job whose lease lapsed (see :meth:`lapsed`);
        returns how many. Synchronous, so a ``SIGCONT`` handler runs it before any of the
        attempts' own callbacks that came due during a freeze."""
        jobs = self.lapsed()
        if jobs:
            self.isolated = True
            _log.error(
                "worker-isolated", worker_id=str(self._worker_id), running=len(jobs), reason=why
            )
            self._stop_jobs(jobs)
        return len(jobs)

    @staticmethod
    def _stop_jobs(jobs: list[RunningJob]) -> None:
        for job in jobs:
            job.request_cancel("isolated")
            job.cancel_reason = "isolated"
            job.force_cancel()

    def _held_slots(self, ids: list[UUID]) -> list[SlotHold]:
        if not ids or not self.renew_slots or self._limits is None:
            return []
        return self._limits.held_slots(ids)

    async def run(self, stop: asyncio.Event | None = None) -> None:
        """Beat until ``stop`` is set (or cancelled); isolate when the store is gone past
        the lease. ``stop`` ends the loop between two beats, never inside one (see
        :mod:`taskq.worker.shutdown`)."""
        stop = stop if stop is not None else asyncio.Event()
        while True:
            # First, before anything else this round: jobs whose lease lapsed while the
            # process was frozen or its loop blocked are stopped, not continued.
            self.isolate_lapsed("lease-lapsed")
            try:
                await self.beat()
                if self._after_beat is not None:
                    await self._after_beat()
            except (DBAPIError, SQLAlchemyError, OSError) as exc:
                silent = time.monotonic() - self.last_ok
                _log.warning("worker-heartbeat-failed", error=str(exc), silent_s=round(silent, 3))
                if silent > self._lease and not self.isolated:
                    await self.isolate_self()
            if not await pause(stop, self._interval):
                return

    async def isolate_self(self) -> None:
        """Stop every local attempt: the store has been unreachable for longer than the lease.

        Attempts get the shutdown cancel stamp and their tasks are cancelled; the join is
        bounded by the cancellation and cleanup graces. Their releases are queued like any
        outcome: fenced, they change nothing if the rows already moved on. A sync actor's
        thread that is still running keeps its row held until the lease-expiry backstop.
        """
        self.isolated = True
        jobs = list(self._dispatcher.running.values())
        _log.error("worker-isolated", worker_id=str(self._worker_id), running=len(jobs))
        self._stop_jobs(jobs)
        tasks = [job.task for job in jobs if job.task is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=self._grace)
