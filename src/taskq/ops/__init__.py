# sync twin: src/taskq_sync/ops/__init__.py
"""The operations layer: what the CLI and the admin UI read and act through.

``tq.jobs`` carries the job operations (:class:`~taskq.ops.jobs.JobOperations`),
``tq.queues`` pause/resume and the caps, ``tq.workers`` the fleet
(:class:`~taskq.ops.workers.WorkersClient`), and :class:`~taskq.ops.ratelimits.RateLimitsClient`
the rate-limit state. The values they take and return are defined once, here and in
:mod:`taskq.job_filter`, and shared with ``taskq_sync``.
"""

from __future__ import annotations

from taskq.job_filter import JobFilter
from taskq.ops.jobs import DEFAULT_BATCH_SIZE, DEFAULT_COUNT_CAP, MAX_PAGE_SIZE, JobOperations
from taskq.ops.ratelimits import RateLimitInfo, RateLimitsClient
from taskq.ops.results import (
    AttemptDetail,
    CancelResult,
    JobCount,
    JobDetail,
    JobPage,
    PurgeResult,
    RetryResult,
)
from taskq.ops.workers import WorkerInfo, WorkersClient

__all__ = [
    "DEFAULT_BATCH_SIZE",
    "DEFAULT_COUNT_CAP",
    "MAX_PAGE_SIZE",
    "AttemptDetail",
    "CancelResult",
    "JobCount",
    "JobDetail",
    "JobFilter",
    "JobOperations",
    "JobPage",
    "PurgeResult",
    "RateLimitInfo",
    "RateLimitsClient",
    "RetryResult",
    "WorkerInfo",
    "WorkersClient",
]
