# sync twin: src/taskq_sync/backends/base.py
"""The :class:`Backend` protocol: what a job store offers the producer-side clients.

``SqlBackend`` (Postgres and SQLite through SQLAlchemy) and ``InMemoryBackend`` (tests)
implement it; ``JobsClient`` talks only to this protocol.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol
from uuid import UUID

from taskq.records import AttemptRecord, EnqueueOutcome, EnqueueRequest, JobRecord
from taskq.request_batch import RequestBatch
from taskq.settings import TaskQSettings

__all__ = ["Backend"]


class Backend(Protocol):
    """A job store. Enqueue applies the actors page's checks in order:

    ``unique_for`` dedup → singleton pre-flight → ``max_pending`` → idempotency upsert →
    insert. ``connection`` (SQL backends only) runs the enqueue inside the caller's open
    transaction, so a rollback leaves no job.
    """

    settings: TaskQSettings | None
    """The settings the store was built with (``None``: a test store built without any)."""

    async def enqueue(
        self, requests: Sequence[EnqueueRequest], *, connection: Any = None
    ) -> list[EnqueueOutcome]:
        """Apply every request (all or nothing) and say what each one did."""
        ...

    async def enqueue_batch(self, batch: RequestBatch) -> Sequence[EnqueueOutcome]:
        """:meth:`enqueue` of ``batch.all()`` outside any caller's transaction. A backend
        may write rows while later requests are still being made (``batch.chunks``): if
        making one raises, nothing is written and the error is raised."""
        ...

    async def get_job(self, job_id: UUID) -> JobRecord | None:
        """The job's current row, or ``None``."""
        ...

    async def get_attempts(self, job_id: UUID) -> list[AttemptRecord]:
        """The job's attempts, oldest first."""
        ...

    async def cancel_job(self, job_id: UUID) -> JobRecord | None:
        """Request cancellation; ``None`` when the job does not exist."""
        ...

    async def wait_for(self, job_id: UUID, timeout: float | None) -> JobRecord | None:  # noqa: ASYNC109
        """Block until the job is terminal (or ``timeout`` seconds pass); return its row.

        Returns the last-seen (non-terminal) row on timeout, ``None`` if it does not exist.
        """
        ...
