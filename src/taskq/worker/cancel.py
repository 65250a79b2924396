"""Cancelling running jobs from any process: the escalation ladder a worker runs locally.

A cancel (``JobsClient.cancel``) ends a queued job at once (``CancelledBeforeStart``) and
stamps a running one ``cancel_phase = 1``. The worker holding it sees the stamp on its
next cancel poll and walks the ladder:

1. COOPERATIVE: ``ctx.cancel_event`` is set and ``ctx.should_abort()`` turns True. An
   actor that raises (``asyncio.CancelledError`` or ``ctx.check_cancelled()``) ends
   ``cancelled`` with ``CancelledCooperatively``. One that returns normally succeeds: the
   attempt's outcome is what the actor says it is.
2. FORCED, after ``cancellation_grace_period``: ``cancel_phase = 2`` is written and an
   async actor's task is cancelled (``CancelledForced``). A sync actor's thread cannot be
   interrupted; it keeps its chance to poll.
3. ABANDON, after ``cancellation_grace_period + cleanup_grace_period``: the row is ended
   ``cancelled`` with ``CancelAbandoned`` and the attempt is detached; whatever it returns
   later is discarded (the fence has moved on).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any, Final
from uuid import UUID

import structlog
from sqlalchemy.ext.asyncio import AsyncEngine

from taskq.db.engine import transaction
from taskq.db.queries import worker as wq
from taskq.worker.state import AttemptOutcome, Outcome, OutcomeKind, RunningJob

__all__ = [
    "CANCELLED_BEFORE_START",
    "CANCELLED_COOPERATIVELY",
    "CANCELLED_FORCED",
    "CANCEL_ABANDONED",
    "CancelController",
]

CANCELLED_BEFORE_START: Final = "CancelledBeforeStart"
CANCELLED_COOPERATIVELY: Final = "CancelledCooperatively"
CANCELLED_FORCED: Final = "CancelledForced"
CANCEL_ABANDONED: Final = "CancelAbandoned"

_log = structlog.get_logger("taskq.worker.cancel")


class CancelController:
    """Polls cancel requests for this worker's jobs and escalates them by the graces."""

    def __init__(
        self,
        engine: AsyncEngine,
        worker_id: UUID,
        *,
        cancellation_grace_s: float,
        cleanup_grace_s: float,
        submit: Callable[[Outcome], None],
    ) -> None:
        self._engine = engine
        self._worker_id = worker_id
        self._cancel_grace = cancellation_grace_s
        self._cleanup_grace = cleanup_grace_s
        self._submit = submit
        self._requests = wq.cancel_requests(worker_id)
        self._set_phase = wq.set_cancel_phase(worker_id)

    async def poll(self, running: dict[UUID, RunningJob]) -> None:
        """Read cancel stamps for the in-flight jobs, then escalate every cancelling one."""
        if not running:
            return
        async with transaction(self._engine, readonly=True) as conn:
            rows = (await conn.execute(self._requests, {"ids": list(running)})).all()
        for row in rows:
            job = running.get(row.id)
            if job is None or job.attempt != row.attempt or job.cancel_reason == "job":
                continue
            job.cancel_reason = "job"
            job.request_cancel("job")
            _log.info(
                "job-cancel-requested",
                job_id=str(job.id),
                actor=job.ref.name,
                attempt=job.attempt,
                phase=1,
            )
        await self.escalate(running.values())

    async def escalate(self, jobs: Iterable[RunningJob]) -> None:
        """Move job-cancelled attempts to phase 2 or 3 when their grace ran out."""
        now = time.monotonic()
        phase_writes: list[dict[str, Any]] = []
        to_force: list[RunningJob] = []
        for job in list(jobs):
            if job.cancel_reason != "job" or job.detached:
                continue
            waited = now - job.cancel_started_mono
            if job.cancel_phase < 2 and waited >= self._cancel_grace:
                job.cancel_phase = 2
                to_force.append(job)
                phase_writes.append({"b_id": job.id, "b_attempt": job.attempt, "phase": 2})
                _log.info(
                    "job-cancel-forced",
                    job_id=str(job.id),
                    actor=job.ref.name,
                    attempt=job.attempt,
                    phase=2,
                )
            if job.cancel_phase < 3 and waited >= self._cancel_grace + self._cleanup_grace:
                job.cancel_phase = 3
                job.detached = True
                _log.warning(
                    "job-cancel-abandoned",
                    job_id=str(job.id),
                    actor=job.ref.name,
                    attempt=job.attempt,
                    phase=3,
                )
                self._submit(
                    Outcome(
                        job,
                        OutcomeKind.CANCELLED,
                        AttemptOutcome.ABANDONED,
                        error_class=CANCEL_ABANDONED,
                        error="the actor did not stop within the cancellation graces",
                    )
                )
        if phase_writes:
            # Stamp phase 2 before interrupting, so the row says why the attempt ended.
            try:
                async with transaction(self._engine) as conn:
                    await conn.execute(self._set_phase, phase_writes)
            finally:
                for job in to_force:
                    if not job.ref.is_sync:
                        job.force_cancel()
