"""The job's progress stream on the worker side: ``ctx.progress()`` and state changes.

Every event of a job takes the next ``seq``, so seq is a total order over the job's whole
stream: the claim (``running``: the claim statement adds one to ``jobs.progress_seq`` and
returns it), each ``ctx.progress()`` call, and the attempt's end (``retried``,
``snoozed``, ``released``, ``succeeded``, ``failed``, ``cancelled``), whose fenced write
stores its number in ``progress_seq``. The next attempt's claim continues from there.
(:attr:`RunningJob.seq <taskq.worker.state.RunningJob.seq>` keeps the count in memory;
no statement is added for it.)

Progress state is merged per call (last writer wins) and written to ``jobs.progress``
every ``progress_flush_interval`` and with the attempt's end. With Redis configured,
events are published on :func:`~taskq.progress.progress_channel` as JSON (see
:func:`taskq.progress.event_message`):
at most one publish per job is in flight; queued progress updates coalesce (only the
newest waits), state-change events never do, and the latest event always goes out last.
Without Redis nothing is published (and nothing is queued). Publishing is best effort:
Redis is never the system of record. A publish is bounded by
``TASKQ_RATE_LIMIT_REDIS_TIMEOUT``; after a failure, events are dropped (counted) for
``TASKQ_RATE_LIMIT_REDIS_COOLDOWN`` before the next publish tries again, and the outage is
logged once per state change plus a periodic summary
(``worker-progress-publish-down``/``-summary``/``-back``), never once per event.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any
from uuid import UUID

import structlog
from sqlalchemy.exc import DBAPIError, SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine

from taskq.db.engine import transaction
from taskq.db.queries import worker as wq
from taskq.exceptions import ProgressTooLarge
from taskq.outage_log import OutageLog
from taskq.progress import event_message, progress_channel
from taskq.worker.state import Outcome, OutcomeKind, RunningJob

__all__ = ["Progress", "progress_channel"]

_log = structlog.get_logger("taskq.worker")


_EVENT_NAMES: dict[str, str] = {
    OutcomeKind.SUCCEEDED: "succeeded",
    OutcomeKind.FAILED: "failed",
    OutcomeKind.CANCELLED: "cancelled",
    OutcomeKind.RETRY: "retried",
    OutcomeKind.SNOOZE: "snoozed",
    OutcomeKind.RELEASE: "released",
}


class Progress:
    """Progress sinks for attempts, the periodic flush, and the Redis publisher."""

    def __init__(
        self,
        engine: AsyncEngine,
        worker_id: UUID,
        *,
        max_bytes: int,
        redis_url: str | None,
        timeout_s: float = 1.0,
        cooldown_s: float = 1.0,
        log_interval_s: float = 60.0,
    ) -> None:
        self._engine = engine
        self._timeout_s = timeout_s
        self._cooldown_s = cooldown_s
        self._retry_at = 0.0
        self.outage = OutageLog("worker-progress-publish", _log.warning, interval_s=log_interval_s)
        """The publisher's outage log (its counts: ``failures``, ``dropped``)."""
        self._flush = wq.flush_progress(worker_id)
        self._max_bytes = max_bytes
        self._redis: Any = None
        if redis_url:
            try:
                from redis.asyncio import Redis
            except ImportError:  # the redis extra is not installed: progress is row-only
                Redis = None  # type: ignore[assignment,misc]
            if Redis is not None:
                self._redis = Redis.from_url(redis_url)
        self._publishing: dict[UUID, asyncio.Task[None]] = {}
        # Per job: messages waiting to go out, each flagged True when it is a progress
        # update (a newer update replaces a waiting one; state events are kept).
        self._queued: dict[UUID, list[tuple[bool, str]]] = {}

    @property
    def publishing(self) -> bool:
        """True when a Redis client is configured (events are published)."""
        return self._redis is not None

    def sink(self, job: RunningJob) -> Callable[..., Awaitable[None]]:
        """The ``progress_sink`` of one attempt's ``JobContext``."""

        async def sink(**fields: Any) -> None:
            data = fields.get("data")
            if data is not None:
                size = len(json.dumps(data).encode())
                if size > self._max_bytes:
                    raise ProgressTooLarge(size, self._max_bytes)
            state = dict(job.progress or {})
            state.update({k: v for k, v in fields.items() if v is not None})
            job.progress = state
            job.progress_dirty = True
            seq = job.next_seq()
            if self._redis is not None:
                message = event_message(job.id, seq, "progress", "running", state)
                self._enqueue(job.id, message, progress=True)

        return sink

    def running(self, job: RunningJob) -> None:
        """Publish the claim's ``running`` event (its seq is the claimed row's)."""
        if self._redis is not None:
            message = event_message(job.id, job.seq, "running", "running", job.progress or {})
            self._enqueue(job.id, message, progress=False)

    def ended(self, outcome: Outcome) -> None:
        """Publish the committed end of an attempt (retry, snooze, release or terminal)."""
        if self._redis is None or outcome.seq is None:
            return
        job = outcome.job
        message = event_message(
            job.id,
            outcome.seq,
            _EVENT_NAMES[outcome.kind],
            outcome.row_status,
            job.progress or {},
            error_class=outcome.error_class,
        )
        self._enqueue(job.id, message, progress=False)

    def _enqueue(self, job_id: UUID, message: str, *, progress: bool) -> None:
        queued = self._queued.setdefault(job_id, [])
        if progress and queued and queued[-1][0]:
            queued[-1] = (True, message)  # coalesce: only the newest update waits
        else:
            queued.append((progress, message))
        if job_id not in self._publishing:
            task = asyncio.get_running_loop().create_task(self._drain(job_id))
            self._publishing[job_id] = task

    async def _drain(self, job_id: UUID) -> None:
        try:
            while True:
                queued = self._queued.get(job_id)
                if not queued:
                    self._queued.pop(job_id, None)
                    return
                _, message = queued.pop(0)
                if self.outage.is_down and time.monotonic() < self._retry_at:
                    self.outage.counted("dropped")  # Redis failed just now: do not wait on it
                    continue
                try:
                    async with asyncio.timeout(self._timeout_s):
                        await self._redis.publish(progress_channel(job_id), message)
                except Exception as exc:  # Redis is never the system of record
                    self._retry_at = time.monotonic() + self._cooldown_s
                    self.outage.failed(exc if str(exc) else type(exc).__name__)
                else:
                    self.outage.succeeded()
        finally:
            self._publishing.pop(job_id, None)

    async def flush(self, jobs: list[RunningJob]) -> None:
        """Write the coalesced state of every job whose progress changed (fenced).

        A failed write leaves those jobs marked changed, so the next flush retries them.
        """
        dirty = [job for job in jobs if job.progress_dirty]
        if not dirty:
            return
        for job in dirty:
            job.progress_dirty = False
        params = [
            {"b_id": j.id, "b_attempt": j.attempt, "b_progress": j.progress, "b_seq": j.seq}
            for j in dirty
        ]
        try:
            async with transaction(self._engine) as conn:
                await conn.execute(self._flush, params)
        except (DBAPIError, SQLAlchemyError, OSError) as exc:
            for job in dirty:  # the next flush writes them (their newest state by then)
                job.progress_dirty = True
            _log.warning("worker-progress-flush-failed", error=str(exc))

    async def close(self) -> None:
        """Let in-flight publishes finish briefly, then close the Redis client."""
        if self._publishing:
            await asyncio.wait(list(self._publishing.values()), timeout=1.0)
        if self._redis is not None:
            await self._redis.aclose()
