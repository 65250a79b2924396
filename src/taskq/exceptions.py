"""Every exception taskq raises, rooted at :class:`TaskQError`, and the signals actors raise.

Each exception carries machine-readable fields, so callers branch on attributes, never on
message text; docs/exceptions.md is generated from this module (tools/gen_reference_docs.py).
Control-flow signals (:class:`Snooze`, :class:`RetryAfter`) live here too because actors
raise them, but they are not errors: they derive from :class:`ControlFlow`, not
:class:`TaskQError`, so an actor's ``except TaskQError`` around its own calls into taskq
never swallows one.
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
    "ControlFlow",
    "JobCancelledError",
    "JobFailedError",
    "JobNotFoundError",
    "JobNotRetryableError",
    "MaxPendingExceededError",
    "MissingProvider",
    "PayloadValidationError",
    "ProgressTooLarge",
    "RedisExtraMissing",
    "RedisUnavailableError",
    "ReservationUnavailable",
    "RetryAfter",
    "ScheduleExistsError",
    "ScheduleNotFoundError",
    "ScheduleToCloseTimeout",
    "SchemaNotReady",
    "ScopeViolation",
    "SingletonCollisionError",
    "Snooze",
    "StartToCloseTimeout",
    "StoreUnavailable",
    "SubEnqueueError",
    "TaskQError",
    "UndecodableJob",
    "WaitTimeout",
]


class TaskQError(Exception):
    """Root of every exception the library raises on purpose."""


class ConfigurationError(TaskQError, ValueError):
    """A setting holds a value taskq cannot use: raised by ``TaskQSettings.load()`` /
    ``WorkerSettings.load()``, and at worker boot for a configuration it cannot run
    (an actor naming a rate limit or reservation nobody registered).

    ``variable`` names the environment variable (``TASKQ_*``) or argument at fault.
    """

    def __init__(self, variable: str, message: str) -> None:
        self.variable = variable
        super().__init__(f"{variable}: {message}")


class SchemaNotReady(TaskQError):
    """A taskq table does not exist yet: the schema has not been migrated. Raised by any
    operation on such a database (enqueue, a worker's boot, the CLI).

    ``table`` names the missing table; ``command`` is what to run to create it.
    """

    def __init__(self, table: str, command: str = "taskq migrate up") -> None:
        self.table = table
        self.command = command
        super().__init__(f"taskq table {table!r} does not exist; run: {command}")


class StoreUnavailable(TaskQError, ConnectionError):
    """The job store (Postgres or SQLite) cannot be reached, or dropped the connection.

    The operation may or may not have taken effect; trying again later can succeed.
    ``reason`` is the driver's message; the driver's error is the ``__cause__``.
    """

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"the job store is unavailable: {reason}")


class PayloadValidationError(TaskQError, ValueError):
    """A payload did not validate against the actor's payload model.

    Raised by enqueue (nothing is written) and by direct invocation; a stored payload that
    no longer fits the model fails its job at once, never retried. ``errors`` is pydantic's
    error list (or a message).
    """

    def __init__(self, actor: str, errors: Sequence[Mapping[str, Any]] | str) -> None:
        self.actor = actor
        self.errors = errors
        super().__init__(f"payload for actor {actor!r} is invalid: {errors}")


class ReservationUnavailable(TaskQError):
    """A reservation slot or rate-limit token could not be acquired.

    Raised by ``RateLimitRegistry.acquire_for_actor`` and by the primitives the worker
    acquires before a handler runs; there it never reaches the actor: the job is parked
    until ``retry_after`` with ``waiting_on`` set, no attempt and no retry budget spent.
    ``bucket_name`` names the primitive; ``retry_after`` is always a ``timedelta >= 0``, never ``None``.
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
    """A ``"redis"`` rate-limit backend was used with no Redis client (pass one, or set
    ``TASKQ_REDIS_URL``), or without the ``redis`` extra."""


class SingletonCollisionError(TaskQError):
    """Raised by enqueue: a singleton actor already has an active job.

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
    """Raised by enqueue: the actor's pending + scheduled count reached its effective
    ``max_pending`` (a stored ``actor_config`` value, else the decorator's)."""

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
    """Non-terminal jobs still reference the actor (with ``force=True``: running ones).

    ``status_counts`` maps each active status to its count."""

    def __init__(self, actor: str, active_count: int, status_counts: dict[str, int]) -> None:
        self.active_count = active_count
        self.status_counts = status_counts
        super().__init__(actor, f"actor {actor!r} has {active_count} active jobs: {status_counts}")


class ActorHasEnabledSchedulesError(ActorDeregistrationError):
    """Enabled cron schedules still reference the actor (refused without ``force``)."""

    def __init__(self, actor: str, schedule_ids: list[str]) -> None:
        self.schedule_ids = schedule_ids
        super().__init__(actor, f"actor {actor!r} has enabled schedules: {schedule_ids}")


class ActorNotFoundError(ActorDeregistrationError):
    """No stored ``actor_config`` row exists for the actor: nothing to deregister."""

    def __init__(self, actor: str) -> None:
        super().__init__(actor, f"actor {actor!r} has no actor_config row")


class SubEnqueueError(TaskQError):
    """Buffered sub-job enqueues the store refused when the parent succeeded.

    ``failed_items`` holds ``(enqueue_args, exception)`` pairs to re-enqueue from. The
    worker records it on the parent's row (``error_class``), passes it to the parent's
    ``on_success`` hook (``job_row["sub_enqueue_error"]``) and logs ``sub_enqueue_failed``.
    """

    def __init__(self, failed_items: list[tuple[Any, BaseException]]) -> None:
        self.failed_items = failed_items
        super().__init__(f"{len(failed_items)} sub-job enqueue(s) failed")


class ProgressTooLarge(TaskQError, ValueError):
    """Raised by ``ctx.progress()``: its ``data`` serialises to ``size`` bytes, past
    ``TASKQ_PROGRESS_DATA_MAX_BYTES`` (``limit``)."""

    def __init__(self, size: int, limit: int) -> None:
        self.size = size
        self.limit = limit
        super().__init__(f"progress data is {size} bytes; the limit is {limit}")


class ScheduleNotFoundError(TaskQError, LookupError):
    """No ``cron_schedules`` row has this id (``schedule_id``)."""

    def __init__(self, schedule_id: str) -> None:
        self.schedule_id = schedule_id
        super().__init__(f"no schedule {schedule_id!r}")


class ScheduleExistsError(TaskQError, ValueError):
    """``schedules.create()`` named an id that exists (pass ``replace=True`` to overwrite)."""

    def __init__(self, schedule_id: str) -> None:
        self.schedule_id = schedule_id
        super().__init__(f"schedule {schedule_id!r} already exists")


class JobNotFoundError(TaskQError, LookupError):
    """No job row has this id: raised by ``JobsClient.get`` and ``JobsClient.cancel``."""

    def __init__(self, job_id: UUID) -> None:
        self.job_id = job_id
        super().__init__(f"job {job_id} does not exist")


class JobNotRetryableError(TaskQError, ValueError):
    """An operator retry of a job that is active or succeeded (only failed, cancelled,
    crashed and abandoned jobs can be retried). ``job_id``, ``status``."""

    def __init__(self, job_id: UUID, status: str) -> None:
        self.job_id = job_id
        self.status = status
        super().__init__(
            f"job {job_id} is {status}: only failed, cancelled, crashed or abandoned jobs "
            "can be retried"
        )


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
    """``JobHandle.wait()`` found the job ended without success (``failed``).

    ``status``, ``error_class`` and ``error`` are the row's.
    """

    def __init__(
        self, job_id: UUID, status: str, error_class: str | None, error: str | None
    ) -> None:
        self.job_id = job_id
        self.status = status
        self.error_class = error_class
        self.error = error
        super().__init__(f"job {job_id} ended {status}: {error_class}: {error}")


class JobCancelledError(JobFailedError):
    """``JobHandle.wait()`` found the job ``cancelled`` (``error_class`` says how)."""


class WaitTimeout(TaskQError, TimeoutError):
    """``JobHandle.wait(timeout=)`` or ``progress_stream(timeout=)`` ran out before the job
    finished. The job itself is untouched."""

    def __init__(self, job_id: UUID, timeout: float) -> None:
        self.job_id = job_id
        self.timeout = timeout
        super().__init__(f"job {job_id} did not finish within {timeout}s")


class MissingProvider(TaskQError, LookupError):
    """A DI dependency has no registered provider: raised by ``ProviderRegistry.validate``
    and at worker boot, before any job runs. ``requested_by`` names the actor or provider."""

    def __init__(self, dependency: type[object], requested_by: str) -> None:
        self.dependency = dependency
        self.requested_by = requested_by
        super().__init__(f"no provider for {dependency.__qualname__} (needed by {requested_by})")


class ScopeViolation(TaskQError):
    """A provider depends on a provider of narrower scope: raised by
    ``ProviderRegistry.validate``."""

    def __init__(self, provider: type[object], dependency: type[object], message: str) -> None:
        self.provider = provider
        self.dependency = dependency
        super().__init__(message)


class ControlFlow(Exception):
    """Root of the signals an actor raises to steer its job (:class:`Snooze`,
    :class:`RetryAfter`). Not a :class:`TaskQError`: ``except TaskQError`` lets them through."""


class Snooze(ControlFlow):
    """Signal: reschedule the job at ``now + delay`` without consuming retry budget."""

    def __init__(self, delay: timedelta) -> None:
        if not isinstance(delay, timedelta):
            raise TypeError("Snooze(delay) takes a timedelta")
        if delay < timedelta(0):
            raise ValueError("Snooze(delay): delay must be >= timedelta(0)")
        self.delay = delay
        super().__init__(f"snoozed for {delay}")


class RetryAfter(ControlFlow):
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
    """An attempt ran longer than its ``start_to_close``; retried per the actor's policy.

    Not raised to callers: it is the attempt's recorded ``error_class``."""

    def __init__(self, actor: str, job_id: UUID, timeout_s: float) -> None:
        self.actor = actor
        self.job_id = job_id
        self.timeout_s = timeout_s
        super().__init__(f"job {job_id} ({actor}) exceeded start_to_close of {timeout_s:.3f}s")


class ScheduleToCloseTimeout(TaskQError, TimeoutError):
    """A job's ``schedule_to_close`` (its whole life, retries included) ran out: it fails,
    never retried. Recorded as the job's ``error_class``."""

    def __init__(self, actor: str, job_id: UUID) -> None:
        self.actor = actor
        self.job_id = job_id
        super().__init__(f"job {job_id} ({actor}) exceeded its schedule_to_close deadline")
