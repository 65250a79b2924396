"""``ctx.progress()`` on the worker side: coalesce, flush to the row, publish to Redis.

Each call merges its fields into the attempt's state (last writer wins) and takes the
next ``seq``. The state is written to ``jobs.progress`` every ``progress_flush_interval``
(and with the attempt's terminal write). With Redis configured, each update is also
published on :func:`progress_channel` as JSON ``{"job_id", "seq", "state"}``: at most one
publish per job is in flight and the latest state always goes out last, so a subscriber
sees the newest state, not necessarily every call. Without Redis nothing is published.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any
from uuid import UUID

import structlog
from sqlalchemy.exc import DBAPIError, SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine

from taskq.db.engine import transaction
from taskq.db.queries import worker as wq
from taskq.exceptions import ProgressTooLarge
from taskq.worker.state import RunningJob

__all__ = ["Progress", "progress_channel"]

_log = structlog.get_logger("taskq.worker")


def progress_channel(job_id: UUID) -> str:
    """The Redis pub/sub channel carrying a job's progress events."""
    return f"taskq:progress:{job_id}"


class Progress:
    """Progress sinks for attempts, the periodic flush, and the Redis publisher."""

    def __init__(
        self, engine: AsyncEngine, worker_id: UUID, *, max_bytes: int, redis_url: str | None
    ) -> None:
        self._engine = engine
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
        self._latest: dict[UUID, str] = {}
        self._seq: dict[UUID, int] = {}

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
            if self._redis is not None:
                self._publish(job, state)

        return sink

    def _publish(self, job: RunningJob, state: dict[str, Any]) -> None:
        seq = self._seq.get(job.id, int(job.row.get("progress_seq") or 0)) + 1
        self._seq[job.id] = seq
        self._latest[job.id] = json.dumps(
            {"job_id": str(job.id), "seq": seq, "state": state}, default=str
        )
        if job.id not in self._publishing:
            task = asyncio.get_running_loop().create_task(self._drain(job.id))
            self._publishing[job.id] = task

    async def _drain(self, job_id: UUID) -> None:
        try:
            while job_id in self._latest:
                message = self._latest.pop(job_id)
                try:
                    await self._redis.publish(progress_channel(job_id), message)
                except Exception as exc:  # Redis is never the system of record
                    _log.warning("worker-progress-publish-failed", job_id=job_id, error=str(exc))
        finally:
            self._publishing.pop(job_id, None)

    def forget(self, job_id: UUID) -> None:
        """Drop the per-job sequence once the attempt is over."""
        self._seq.pop(job_id, None)

    async def flush(self, jobs: list[RunningJob]) -> None:
        """Write the coalesced state of every job whose progress changed (fenced)."""
        dirty = [job for job in jobs if job.progress_dirty]
        if not dirty:
            return
        for job in dirty:
            job.progress_dirty = False
        params = [{"b_id": j.id, "b_attempt": j.attempt, "b_progress": j.progress} for j in dirty]
        try:
            async with transaction(self._engine) as conn:
                await conn.execute(self._flush, params)
        except (DBAPIError, SQLAlchemyError, OSError) as exc:
            _log.warning("worker-progress-flush-failed", error=str(exc))

    async def close(self) -> None:
        """Let in-flight publishes finish briefly, then close the Redis client."""
        if self._publishing:
            await asyncio.wait(list(self._publishing.values()), timeout=1.0)
        if self._redis is not None:
            await self._redis.aclose()
