# sync twin: src/taskq_sync/__init__.py
"""taskq: a Postgres-backed job queue with first-class rate limiting.

This package, from an application::

    async with TaskQ() as tq:  # TASKQ_DATABASE_URL, else the embedded ./taskq.db
        handle = await tq.jobs.enqueue(send_welcome, Signup(user_id=7, email="a@b.c"))
        result = await handle.wait(timeout=30)

``taskq`` is the asyncio API and ``taskq_sync`` the same names with blocking calls (for
Django and Flask views, scripts and threads). Actors, payload models, ``Schedule``,
``RetryPolicy``, ``JobFilter`` and the exceptions are the same objects in both; a worker
(``taskq worker MODULE:ATTR``) runs the actors either side enqueues for.
"""

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
