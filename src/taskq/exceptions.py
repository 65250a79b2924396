"""Every exception taskq raises, rooted at :class:`TaskQError`.

Each exception carries the machine-readable fields the reference pages list, so callers
branch on attributes, never on message text. Control-flow signals (:class:`Snooze`,
:class:`RetryAfter`) live here too because actors raise them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

__all__ = [
    "ActorDeregistrationError",
    "ActorHasActiveJobsError",
    "ActorHasEnabledSchedulesError",
    "ActorNotFoundError",
    "ConfigurationError",
    "JobCancelledError",
    "JobFailedError",
    "JobNotFoundError",
    "MaxPendingExceededError",
    "MissingProvider",
    "PayloadValidationError",
    "ProgressTooLarge",
    "RedisExtraMissing",
    "RedisUnavailableError",
    "ReservationUnavailable",
    "RetryAfter",
    "ScheduleToCloseTimeout",
    "SchemaNotReady",
    "ScopeViolation",
    "SingletonCollisionError",
    "Snooze",
    "StartToCloseTimeout",
    "SubEnqueueError",
    "TaskQError",
    "UndecodableJob",
    "WaitTimeout",
]


class TaskQError(Exception):
    """Root of every exception the library raises on purpose."""


class ConfigurationError(TaskQError, ValueError):
    """A setting holds a value taskq cannot use.

    ``variable`` names the environment variable (``TASKQ_*``) or argument at fault.
    """

    def __init__(self, variable: str, message: str) -> None:
        self.variable = variable
        super().__init__(f"{variable}: {message}")


class SchemaNotReady(TaskQError):
    """A taskq table does not exist yet: the schema has not been migrated.

    ``table`` names the missing table; ``command`` is what to run to create it.
    """

    def __init__(self, table: str, command: str = "taskq migrate up") -> None:
        self.table = table
        self.command = command
        super().__init__(f"taskq table {table!r} does not exist; run: {command}")


class PayloadValidationError(TaskQError, ValueError):
    """A payload did not validate against the actor's payload model. Never retried."""

    def __init__(self, actor: str, errors: Sequence[Mapping[str, Any]] | str) -> None:
        self.actor = actor
        self.errors = errors
        super().__init__(f"payload for actor {actor!r} is invalid: {errors}")


class ReservationUnavailable(TaskQError):
    """A reservation slot or rate-limit token could not be acquired.

    ``retry_after`` is always a ``timedelta >= 0``, never ``None``.
    """

    def __init__(self, bucket_name: str, retry_after: timedelta) -> None:
        if retry_after is None or retry_after < timedelta(0):
            raise ValueError("retry_after must be a non-negative timedelta")
        self.bucket_name = bucket_name
        self.retry_after = retry_after
        super().__init__(
            f"{bucket_name!r} is unavailable; retry after {retry_after.total_seconds():.3f}s"
        )


class RedisUnavailableError(TaskQError, RuntimeError):
    """A ``"redis"`` backend was used with no client, or without the ``redis`` extra."""


class SingletonCollisionError(TaskQError):
    """A singleton actor already has an active job.

    ``blocking_job_id`` is the existing job from the pre-flight query, or ``None`` when the
    collision was caught by the partial unique index (the race path). ``retry_after`` comes
    from the blocking job's ``schedule_to_close`` when it has one: the time left until its
    deadline (``created_at + schedule_to_close``), by which it will have ended one way or
    another; ``timedelta(0)`` once that has passed (:meth:`blocked_by`).
    """

    def __init__(
        self,
        actor: str,
        blocking_job_id: UUID | None,
        retry_after: timedelta | None = None,
    ) -> None:
        self.actor = actor
        self.blocking_job_id = blocking_job_id
        self.retry_after = retry_after
        super().__init__(
            f"singleton actor {actor!r} already has an active job"
            + (f" ({blocking_job_id})" if blocking_job_id else "")
        )

    @classmethod
    def blocked_by(
        cls, actor: str, job_id: UUID, deadline_at: datetime | None, now: datetime
    ) -> SingletonCollisionError:
        """The collision with active job ``job_id`` (the pre-flight's find), whose deadline
        is ``deadline_at`` (``None``: no ``schedule_to_close``), seen at the store's ``now``."""
        retry_after = None if deadline_at is None else max(deadline_at - now, timedelta(0))
        return cls(actor, job_id, retry_after)


class MaxPendingExceededError(TaskQError):
    """The actor's pending + scheduled count reached its effective ``max_pending``."""

    def __init__(self, actor: str, current_count: int, max_pending: int) -> None:
        self.actor = actor
        self.current_count = current_count
        self.max_pending = max_pending
        super().__init__(f"actor {actor!r} has {current_count}/{max_pending} jobs pending")


class ActorDeregistrationError(TaskQError):
    """Base of every refusal from ``actors.deregister()``."""

    def __init__(self, actor: str, message: str) -> None:
        self.actor = actor
        super().__init__(message)


class ActorHasActiveJobsError(ActorDeregistrationError):
    """Non-terminal jobs still reference the actor."""

    def __init__(self, actor: str, active_count: int, status_counts: dict[str, int]) -> None:
        self.active_count = active_count
        self.status_counts = status_counts
        super().__init__(actor, f"actor {actor!r} has {active_count} active jobs: {status_counts}")


class ActorHasEnabledSchedulesError(ActorDeregistrationError):
    """Enabled cron schedules still reference the actor."""

    def __init__(self, actor: str, schedule_ids: list[str]) -> None:
        self.schedule_ids = schedule_ids
        super().__init__(actor, f"actor {actor!r} has enabled schedules: {schedule_ids}")


class ActorNotFoundError(ActorDeregistrationError):
    """No stored ``actor_config`` row exists for the actor."""

    def __init__(self, actor: str) -> None:
        super().__init__(actor, f"actor {actor!r} has no actor_config row")


class SubEnqueueError(TaskQError):
    """Buffered sub-job enqueues failed after the parent committed.

    ``failed_items`` holds ``(enqueue_args, exception)`` pairs to re-enqueue from.
    """

    def __init__(self, failed_items: list[tuple[Any, BaseException]]) -> None:
        self.failed_items = failed_items
        super().__init__(f"{len(failed_items)} sub-job enqueue(s) failed after commit")


class ProgressTooLarge(TaskQError, ValueError):
    """A progress ``data`` payload serialises past ``progress_data_max_bytes``."""

    def __init__(self, size: int, limit: int) -> None:
        self.size = size
        self.limit = limit
        super().__init__(f"progress data is {size} bytes; the limit is {limit}")


class JobNotFoundError(TaskQError, LookupError):
    """No job row has this id."""

    def __init__(self, job_id: UUID) -> None:
        self.job_id = job_id
        super().__init__(f"job {job_id} does not exist")


class UndecodableJob(TaskQError):
    """A stored job row cannot be read or run as stored (written by SQL or another producer).

    A payload nested past what JSON decoding allows, an attempt counter at the top of its
    column's range, a ``start_to_close_s`` that is negative, zero, NaN or infinite. The
    worker fails such a row with this ``error_class`` without running it (the rest of its
    batch runs), and ``JobsClient.get`` raises it instead of a decoder's error. ``column``
    names the offending column.
    """

    def __init__(self, job_id: UUID | None, column: str, reason: str) -> None:
        self.job_id = job_id
        self.column = column
        self.reason = reason
        super().__init__(f"job {job_id}: stored {column} cannot be used: {reason}")


class JobFailedError(TaskQError):
    """``JobHandle.wait()`` found the job ended without success."""

    def __init__(
        self, job_id: UUID, status: str, error_class: str | None, error: str | None
    ) -> None:
        self.job_id = job_id
        self.status = status
        self.error_class = error_class
        self.error = error
        super().__init__(f"job {job_id} ended {status}: {error_class}: {error}")


class JobCancelledError(JobFailedError):
    """``JobHandle.wait()`` found the job cancelled."""


class WaitTimeout(TaskQError, TimeoutError):
    """``JobHandle.wait(timeout=)`` ran out before the job finished."""

    def __init__(self, job_id: UUID, timeout: float) -> None:
        self.job_id = job_id
        self.timeout = timeout
        super().__init__(f"job {job_id} did not finish within {timeout}s")


class MissingProvider(TaskQError, LookupError):
    """A DI dependency has no registered provider."""

    def __init__(self, dependency: type[object], requested_by: str) -> None:
        self.dependency = dependency
        self.requested_by = requested_by
        super().__init__(f"no provider for {dependency.__qualname__} (needed by {requested_by})")


class ScopeViolation(TaskQError):
    """A provider depends on a provider of narrower scope."""

    def __init__(self, provider: type[object], dependency: type[object], message: str) -> None:
        self.provider = provider
        self.dependency = dependency
        super().__init__(message)


class Snooze(TaskQError):
    """Signal: reschedule the job at ``now + delay`` without consuming retry budget."""

    def __init__(self, delay: timedelta) -> None:
        if not isinstance(delay, timedelta):
            raise TypeError("Snooze(delay) takes a timedelta")
        if delay < timedelta(0):
            raise ValueError("Snooze(delay): delay must be >= timedelta(0)")
        self.delay = delay
        super().__init__(f"snoozed for {delay}")


class RetryAfter(TaskQError):
    """Signal: retry after ``delay``; consumes the retry budget unless told not to."""

    def __init__(self, delay: timedelta, consume_budget: bool = True) -> None:
        if not isinstance(delay, timedelta):
            raise TypeError("RetryAfter(delay) takes a timedelta")
        if delay < timedelta(0):
            raise ValueError("RetryAfter(delay): delay must be >= timedelta(0)")
        self.delay = delay
        self.consume_budget = consume_budget
        super().__init__(f"retry after {delay}")


class RedisExtraMissing(RedisUnavailableError, ImportError):
    """A ``"redis"`` rate-limit backend was used but the ``redis`` package is not installed.

    Both a ``RedisUnavailableError`` and an ``ImportError``; the message says to install
    ``taskq-py[redis]``.
    """


class StartToCloseTimeout(TaskQError, TimeoutError):
    """An attempt ran longer than its ``start_to_close``; retried per the actor's policy."""

    def __init__(self, actor: str, job_id: UUID, timeout_s: float) -> None:
        self.actor = actor
        self.job_id = job_id
        self.timeout_s = timeout_s
        super().__init__(f"job {job_id} ({actor}) exceeded start_to_close of {timeout_s:.3f}s")


class ScheduleToCloseTimeout(TaskQError, TimeoutError):
    """A job's ``schedule_to_close`` (its whole life, retries included) ran out: it fails."""

    def __init__(self, actor: str, job_id: UUID) -> None:
        self.actor = actor
        self.job_id = job_id
        super().__init__(f"job {job_id} ({actor}) exceeded its schedule_to_close deadline")
