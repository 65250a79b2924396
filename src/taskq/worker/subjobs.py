"""``ctx.jobs``: enqueue sub-jobs from inside an actor body.

Sub-jobs are enqueued through the worker's own :class:`~taskq.client.JobsClient` on the
autonomous path: each enqueue commits on its own, immediately, and carries the parent's
id in ``parent_job_id``. Joining the parent's transaction (so a failed parent leaves no
children) is not implemented yet. Per-call ``unique_for`` and ``max_pending`` are
accepted, as the actors page describes.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from taskq.client import JobsClient
from taskq.handle import JobHandle

__all__ = ["SubJobs"]


class SubJobs:
    """The ``SubJobEnqueuer`` of one attempt."""

    def __init__(self, client: JobsClient, parent_job_id: UUID) -> None:
        self._client = client
        self._parent = parent_job_id

    async def enqueue(self, actor: Any, payload: Any, /, **options: Any) -> JobHandle[Any]:
        """Enqueue ``actor`` with ``payload`` as a child of the running job."""
        from taskq.client import _resolve

        ref = _resolve(actor)
        request = self._client._request(ref, payload, {**options, "parent_job_id": self._parent})
        [outcome] = await self._client.backend.enqueue([request])
        return self._client._handle(ref, outcome)
