"""What the worker keeps in memory about one claimed attempt, and how an attempt ended.

:class:`RunningJob` is created at claim time and lives until its end is committed.
:class:`Outcome` is what execution hands to the completer: the row's next step
(:class:`OutcomeKind`) and the attempt's record (:class:`AttemptOutcome`). Both are plain
data shared by dispatch, execute, cancel and shutdown.
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Literal
from uuid import UUID

from taskq.actor import ActorRef
from taskq.context import JobContext
from taskq.storable_json import storable_text
from taskq.worker.claimed import ClaimedJob

if TYPE_CHECKING:
    from taskq.exceptions import SubEnqueueError

__all__ = ["AttemptOutcome", "CancelReason", "Outcome", "OutcomeKind", "RunningJob"]

CancelReason = Literal["job", "shutdown", "isolated"]


@dataclass(eq=False)
class RunningJob:
    """One claimed attempt: its :class:`~taskq.worker.claimed.ClaimedJob` plus its live handles.

    ``cancel_reason`` says who asked the attempt to stop (a job cancel, the worker's
    shutdown, or ``isolate_self``); ``cancel_phase`` is how far the ladder went locally
    (1 cooperative, 2 forced, 3 abandoned). ``thread_done`` is set by a sync actor's
    thread as it exits, whatever happened to the await.
    """

    claimed: ClaimedJob
    ref: ActorRef[Any, Any]
    worker_id: UUID
    claimed_mono: float = field(default_factory=time.monotonic)
    task: asyncio.Task[None] | None = None
    ctx: JobContext[Any] | None = None
    _cancel_event: asyncio.Event | None = None
    _abort_flag: threading.Event | None = None
    thread_done: threading.Event | None = None
    thread_exited: asyncio.Event | None = None
    cancel_reason: CancelReason | None = None
    cancel_phase: int = 0
    cancel_started_mono: float = 0.0
    forced: bool = False
    detached: bool = False
    progress: dict[str, Any] | None = None
    span: Any = None
    progress_dirty: bool = False
    _seq: int | None = None
    sub_jobs: Any = None
    """This attempt's ``ctx.jobs`` (a :class:`taskq.worker.subjobs.SubJobs`), whose buffered
    children the job's transaction inserts when the actor succeeds."""
    tx: Any = None
    """This attempt's :class:`taskq.worker.transactions.JobTransaction`, if it has one."""
    sub_enqueue_error: SubEnqueueError | None = None
    """The children the store refused when the job's transaction committed its success
    (``on_success`` gets it in its row as ``sub_enqueue_error``)."""

    @property
    def cancel_event(self) -> asyncio.Event:
        """The event behind ``ctx.cancel_event`` (created on first use)."""
        if self._cancel_event is None:
            self._cancel_event = asyncio.Event()
        return self._cancel_event

    @property
    def abort_flag(self) -> threading.Event:
        """The thread-safe flag behind ``ctx.should_abort()`` (created on first use)."""
        if self._abort_flag is None:
            self._abort_flag = threading.Event()
        return self._abort_flag

    @property
    def id(self) -> UUID:
        """The job id."""
        return self.claimed.id

    @property
    def attempt(self) -> int:
        """The attempt number this claim started (the fencing token with the worker id)."""
        return self.claimed.attempt

    @property
    def started_at(self) -> datetime | None:
        """When the store's clock saw the claim."""
        return self.claimed.started_at

    @property
    def seq(self) -> int:
        """The attempt's last event number (the claim's, until something else happened).

        Event numbers order a job's whole progress stream: the claim took the row's
        ``progress_seq`` (the claim statement adds one), then every ``ctx.progress()`` call
        and the attempt's end take the next one, and the row is written with the last.
        """
        if self._seq is None:
            self._seq = int(self.claimed.progress_seq or 0)
        return self._seq

    def next_seq(self) -> int:
        """Take the next event number (see :attr:`seq`)."""
        self._seq = self.seq + 1
        return self._seq

    def thread_alive(self) -> bool:
        """True while a sync actor's thread for this attempt has not provably exited."""
        return self.thread_done is not None and not self.thread_done.is_set()

    def request_cancel(self, reason: CancelReason) -> None:
        """Enter phase 1: set the cancel event (and the thread-safe flag sync actors poll)."""
        if reason == "job" or self.cancel_reason is None:
            self.cancel_reason = reason
        if self.cancel_phase < 1:
            self.cancel_phase = 1
            self.cancel_started_mono = time.monotonic()
        if self.ctx is not None:
            self.ctx.request_cancel()
        self.abort_flag.set()
        self.cancel_event.set()

    def force_cancel(self) -> None:
        """Enter phase 2: cancel the asyncio task (a sync actor's thread keeps running)."""
        self.cancel_phase = max(self.cancel_phase, 2)
        if self.task is not None and not self.task.done():
            self.forced = True
            self.task.cancel()


class OutcomeKind(StrEnum):
    """What an attempt's end does to its row (:attr:`Outcome.row_status`)."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    RETRY = "retry"
    """Rescheduled after a delay, spending retry budget (``scheduled``)."""
    SNOOZE = "snooze"
    """Rescheduled after a delay, spending none (``scheduled``)."""
    RELEASE = "release"
    """Handed back to the queue by the worker itself (``pending``, or ``scheduled`` when
    held while a thread still runs): shutdown, isolation, a crash of the worker."""


class AttemptOutcome(StrEnum):
    """The ``job_attempts.outcome`` an attempt's end records (a subset of
    :data:`taskq.constants.ATTEMPT_OUTCOMES`: ``running`` is the claim's)."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    RETRIED = "retried"
    SNOOZED = "snoozed"
    CANCELLED = "cancelled"
    CRASHED = "crashed"
    ABANDONED = "abandoned"


@dataclass(eq=False)
class Outcome:
    """How one attempt ended, ready for the batched fenced write.

    ``kind`` picks the row's next status; ``attempt_outcome`` is the ``job_attempts``
    record. ``delay_s`` reschedules (retry/snooze), ``budget`` (0/1) is added to
    ``budget_used``, ``hold_s`` holds a release ``scheduled`` (a thread still running).
    ``exception`` feeds ``on_retry_exhausted``; ``result_value`` feeds ``on_success``.
    ``seq`` is the event number of this end, taken once, at the first write attempt.
    """

    job: RunningJob
    kind: OutcomeKind
    attempt_outcome: AttemptOutcome
    result: Any = None
    result_value: Any = None
    error_class: str | None = None
    error: str | None = None
    traceback: str | None = None
    delay_s: float | None = None
    budget: int = 0
    ttl_s: float | None = None
    hold_s: float | None = None
    exception: BaseException | None = None
    seq: int | None = None
    created_mono: float = field(default_factory=time.monotonic)
    committed: bool | None = None
    """Set when the outcome was written in the job's own transaction (``True``: committed;
    ``False``: its fence failed and everything was rolled back); ``None``: the completer
    writes it."""

    def __post_init__(self) -> None:
        # An exception's text may hold NUL, which a Postgres text column refuses: the
        # whole batch of outcomes would fail with it (storable_text writes it as \x00).
        if self.error is not None:
            self.error = storable_text(self.error)
        if self.traceback is not None:
            self.traceback = storable_text(self.traceback)
        if self.error_class is not None:
            self.error_class = storable_text(self.error_class)

    @property
    def row_status(self) -> str:
        """The job row's status after this outcome is written."""
        kind = self.kind
        if kind == OutcomeKind.RETRY or kind == OutcomeKind.SNOOZE:
            return "scheduled"
        if kind == OutcomeKind.RELEASE:
            return "pending" if self.hold_s is None else "scheduled"
        return str(kind)
