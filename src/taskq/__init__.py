# sync twin: src/taskq_sync/__init__.py
"""taskq: a Postgres-backed job queue with first-class rate limiting."""

from __future__ import annotations

from taskq.actor import ActorRef, actor
from taskq.client import EnqueueArgs, JobHandle, JobsClient, TaskQ
from taskq.context import JobContext
from taskq.cron.schedule import Schedule
from taskq.di import ProviderRegistry, Scope
from taskq.exceptions import (
    JobCancelledError,
    JobFailedError,
    MaxPendingExceededError,
    PayloadValidationError,
    RetryAfter,
    SingletonCollisionError,
    Snooze,
    TaskQError,
)
from taskq.handle import JobHandles
from taskq.job_filter import JobFilter
from taskq.retry import RetryOverride, RetryPolicy

__version__ = "0.1.0"

__all__ = [
    "ActorRef",
    "EnqueueArgs",
    "JobCancelledError",
    "JobContext",
    "JobFailedError",
    "JobFilter",
    "JobHandle",
    "JobHandles",
    "JobsClient",
    "MaxPendingExceededError",
    "PayloadValidationError",
    "ProviderRegistry",
    "RetryAfter",
    "RetryOverride",
    "RetryPolicy",
    "Schedule",
    "Scope",
    "SingletonCollisionError",
    "Snooze",
    "TaskQ",
    "TaskQError",
    "__version__",
    "actor",
]
