"""Plain values passed between the client, the backends and the worker.

An :class:`EnqueueRequest` is a fully validated enqueue (payload already serialised,
options resolved against the actor); a :class:`JobRecord` is a snapshot of one job row.
Pure: the async and the generated sync code share these.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeAlias
from uuid import UUID

import structlog

from taskq._ids import new_job_id
from taskq.constants import (
    MAX_NAME_LENGTH,
    SMALLINT_MAX,
    SMALLINT_MIN,
    TERMINAL_STATUSES,
    validate_queue_name,
)
from taskq.enqueue_options import EnqueueOptions, ItemOptions
from taskq.storable_json import describe, unstorable_error

if TYPE_CHECKING:
    from taskq.actor import ActorRef

__all__ = [
    "AttemptRecord",
    "EnqueueArgs",
    "EnqueueOutcome",
    "EnqueueRequest",
    "InsertedRecord",
    "JobRecord",
    "JobStatus",
    "RecordSource",
    "SharedRecords",
    "build_record",
    "build_request",
    "request_like",
    "request_template",
]


@dataclass(slots=True)
class EnqueueRequest:
    """One job to insert, with every check the backend must apply in order.

    ``unique_for``/``unique_states`` apply only with an ``identity_key``. ``max_pending``
    is the actor's literal, or a sub-job's per-call argument when ``max_pending_per_call``;
    the backend resolves the effective limit against the stored
    ``actor_config.max_pending`` (:meth:`effective_max_pending`). ``scheduled_at=None`` and
    ``delay_s=None`` mean "now";
    ``delay_s`` is added to the store's clock by the backend.

    Read-only by convention, not ``frozen``: one is built per job on the enqueue hot
    path, and a frozen dataclass's ``__init__`` costs four times as much.
    """

    job_id: UUID
    actor: str
    queue: str
    payload: dict[str, Any]
    priority: int = 0
    scheduled_at: datetime | None = None
    delay_s: float | None = None
    identity_key: str | None = None
    idempotency_key: str | None = None
    singleton: bool = False
    tags: tuple[str, ...] = ()
    metadata: dict[str, Any] = field(default_factory=dict)
    max_attempts: int | None = None
    start_to_close_s: float | None = None
    schedule_to_close_s: float | None = None
    unique_for: timedelta | None = None
    unique_states: tuple[str, ...] = ()
    max_pending: int | None = None
    max_pending_per_call: bool = False
    trace_context: dict[str, str] | None = None
    parent_job_id: UUID | None = None

    def effective_max_pending(self, stored: int | None) -> int | None:
        """The cap to enforce, given the stored ``actor_config.max_pending``.

        The actors page's rule: a stored cap wins over the actor's literal; a per-call
        argument is resolved against it, the tighter of the two winning (it may shed load,
        never widen the operator's cap); with nothing stored, the per-call argument or
        the literal applies as it is.
        """
        if stored is None:
            return self.max_pending
        if self.max_pending_per_call and self.max_pending is not None:
            return min(stored, self.max_pending)
        return stored

    @property
    def status(self) -> str:
        """The status the row starts in: ``scheduled`` when it runs later, else ``pending``."""
        return "pending" if self.scheduled_at is None and self.delay_s is None else "scheduled"

    @property
    def plain(self) -> bool:
        """True when no check needs a read first: the insert is the whole enqueue."""
        return (
            not (self.unique_for and self.identity_key)
            and not self.singleton
            and self.idempotency_key is None
        )

    @property
    def uncapped_plain(self) -> bool:
        """:attr:`plain` with no ``max_pending`` of its own: it may go in one bulk insert or
        COPY with other rows (a stored ``actor_config.max_pending`` is the backend's to
        check)."""
        return self.plain and self.max_pending is None


@dataclass(frozen=True, slots=True)
class JobRecord:
    """A snapshot of one ``jobs`` row."""

    id: UUID
    actor: str
    queue: str
    status: str
    payload: dict[str, Any]
    result: Any
    priority: int
    attempt: int
    budget_used: int
    max_attempts: int | None
    scheduled_at: datetime
    identity_key: str | None
    idempotency_key: str | None
    singleton: bool
    tags: list[str]
    metadata: dict[str, Any]
    error_class: str | None
    error: str | None
    cancel_phase: int
    cancel_requested_at: datetime | None
    progress: Any
    start_to_close_s: float | None
    schedule_to_close_s: float | None
    deadline_at: datetime | None
    parent_job_id: UUID | None
    created_at: datetime
    updated_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    waiting_on: str | None = None
    """The rate limit, reservation or queue cap whose denial parked the job, while it
    waits for it (``None`` once claimed again, and for a job never denied)."""
    denials: int = 0
    """How many times a limit denied the job and parked it (denials are not attempts)."""

    @property
    def is_terminal(self) -> bool:
        """True once the job can no longer change status."""
        return self.status in TERMINAL_STATUSES

    @property
    def waiting(self) -> bool:
        """True while the job is parked on a limit (``waiting_on`` set, not yet claimed
        again): held back by a rate limit, reservation or queue cap, as opposed to
        ``scheduled`` for later by a delay, a backoff or a ``Snooze``."""
        return self.waiting_on is not None and self.status in ("pending", "scheduled")

    @property
    def state(self) -> str:
        """The status as a user reads it: ``waiting`` for a job parked on a limit (see
        :attr:`waiting`), else :attr:`status`. The stored status of a parked job stays
        ``scheduled``: dispatch needs nothing more, and ``waiting_on`` says the rest."""
        return "waiting" if self.waiting else self.status

    @property
    def ready_at(self) -> datetime | None:
        """When a parked job can next be admitted (its ``scheduled_at``), ``None`` unless
        it is waiting on a limit. A job parked on a reservation or queue cap is woken
        earlier, as soon as a slot is released."""
        return self.scheduled_at if self.waiting else None

    @classmethod
    def from_mapping(cls, row: Mapping[Any, Any]) -> JobRecord:
        """Build from a result row's mapping (extra columns are ignored; the waiting
        fields default when a statement did not return them)."""
        values = {name: row[name] for name in _RECORD_REQUIRED}
        for name in _RECORD_OPTIONAL:
            if name in row:
                values[name] = row[name]
        return cls(**values)

    @classmethod
    def inserted(
        cls,
        req: EnqueueRequest,
        *,
        scheduled_at: datetime,
        deadline_at: datetime | None,
        created_at: datetime,
    ) -> JobRecord:
        """The row ``req`` has just become, given the columns the store computed.

        A fresh row holds exactly what was written plus the table's defaults (no attempt,
        no result, no cancellation), so the enqueue path need not read it back.
        """
        return cls(
            id=req.job_id,
            actor=req.actor,
            queue=req.queue,
            status=req.status,
            payload=req.payload,
            result=None,
            priority=req.priority,
            attempt=0,
            budget_used=0,
            max_attempts=req.max_attempts,
            scheduled_at=scheduled_at,
            identity_key=req.identity_key,
            idempotency_key=req.idempotency_key,
            singleton=req.singleton,
            tags=list(req.tags),
            metadata=req.metadata,
            error_class=None,
            error=None,
            cancel_phase=0,
            cancel_requested_at=None,
            progress=None,
            start_to_close_s=req.start_to_close_s,
            schedule_to_close_s=req.schedule_to_close_s,
            deadline_at=deadline_at,
            parent_job_id=req.parent_job_id,
            created_at=created_at,
            updated_at=created_at,
            started_at=None,
            finished_at=None,
        )


class JobStatus(str):
    """What ``JobHandle.status()`` returns: the stored status, a ``str`` that compares as
    before (``status == "scheduled"``), that also says why a job waits.

    ``waiting_on``, ``ready_at`` and ``denials`` are the record's (see :class:`JobRecord`):
    the limit that parked the job and when it can next be admitted, while it waits on
    one; ``state`` is ``"waiting"`` for such a job, else the status itself.
    """

    waiting_on: str | None
    ready_at: datetime | None
    denials: int

    def __new__(cls, record: JobRecord) -> JobStatus:
        """The status of ``record``."""
        made = super().__new__(cls, record.status)
        made.waiting_on = record.waiting_on if record.waiting else None
        made.ready_at = record.ready_at
        made.denials = record.denials
        return made

    @property
    def waiting(self) -> bool:
        """True while the job is parked on a limit."""
        return self.waiting_on is not None

    @property
    def state(self) -> str:
        """``"waiting"`` for a job parked on a limit, else the status."""
        return "waiting" if self.waiting else str(self)


_RECORD_OPTIONAL = ("waiting_on", "denials")
_RECORD_REQUIRED = tuple(n for n in JobRecord.__dataclass_fields__ if n not in _RECORD_OPTIONAL)


@dataclass(frozen=True, slots=True)
class AttemptRecord:
    """A snapshot of one ``job_attempts`` row."""

    job_id: UUID
    attempt: int
    worker_id: UUID | None
    outcome: str
    error_class: str | None
    error: str | None
    started_at: datetime
    finished_at: datetime | None

    @classmethod
    def from_mapping(cls, row: Mapping[Any, Any]) -> AttemptRecord:
        """Build from a result row's mapping."""
        return cls(**{name: row[name] for name in cls.__dataclass_fields__})


class InsertedRecord:
    """A deferred :meth:`JobRecord.inserted`: call it for the record.

    One small object per job instead of a ``functools.partial`` and its argument tuple:
    an ``enqueue_many`` keeps one per job alive until its handles go, and every object
    it keeps alive is work for the cyclic garbage collector.
    """

    __slots__ = ("created_at", "deadline_at", "request", "scheduled_at")

    def __init__(
        self,
        request: EnqueueRequest,
        scheduled_at: datetime,
        deadline_at: datetime | None,
        created_at: datetime,
    ) -> None:
        self.request = request
        self.scheduled_at = scheduled_at
        self.deadline_at = deadline_at
        self.created_at = created_at

    def __call__(self) -> JobRecord:
        return JobRecord.inserted(
            self.request,
            scheduled_at=self.scheduled_at,
            deadline_at=self.deadline_at,
            created_at=self.created_at,
        )


class SharedRecords:
    """The records of many jobs behind one object, each built on first use
    (:meth:`record_of`): a bulk ``enqueue_many`` gives every handle the same one instead of
    a factory per job (:class:`~taskq.bulk_rows.BulkRecords`)."""

    __slots__ = ()

    def record_of(self, job_id: UUID) -> JobRecord:
        """The record of ``job_id``, one of the jobs behind this object."""
        raise NotImplementedError


RecordSource: TypeAlias = JobRecord | Callable[[], JobRecord] | SharedRecords
"""A job record, a zero-argument factory that builds it on first use, or the
:class:`SharedRecords` it is one of."""


def build_record(source: RecordSource, job_id: UUID) -> JobRecord:
    """The record ``source`` gives for the job ``job_id`` (built now if it was deferred)."""
    if isinstance(source, JobRecord):
        return source
    if isinstance(source, SharedRecords):
        return source.record_of(job_id)
    return source()


class EnqueueOutcome:
    """What an enqueue did: the job it points at and whether that job already existed.

    ``record`` may be given as a factory (with ``job_id``): the plain insert knows every
    column of the fresh row, and building a 29-field record per job costs more than the
    rest of an ``enqueue_many`` item, so it is built only if someone reads it.
    """

    __slots__ = ("_record", "job_id", "was_existing")

    def __init__(
        self, record: RecordSource, was_existing: bool = False, *, job_id: UUID | None = None
    ) -> None:
        if isinstance(record, JobRecord):
            job_id = record.id
        elif job_id is None:
            raise TypeError("a record factory needs job_id")
        self._record: RecordSource = record
        self.job_id: UUID = job_id
        self.was_existing = was_existing

    def __repr__(self) -> str:
        return f"EnqueueOutcome(job_id={self.job_id}, was_existing={self.was_existing})"

    @property
    def record(self) -> JobRecord:
        """The job's row as the enqueue left it (built now if it was deferred)."""
        record = self._record
        if not isinstance(record, JobRecord):
            record = self._record = build_record(record, self.job_id)
        return record

    @property
    def record_source(self) -> RecordSource:
        """The record or its factory, without building it (for ``JobHandle``)."""
        return self._record

    @property
    def deduplicated_onto_terminal(self) -> bool:
        """True when the enqueue was deduplicated onto a job that had already finished."""
        return self.was_existing and self.record.is_terminal


_log = structlog.get_logger("taskq.enqueue")
_warned_unique_ignored: set[str] = set()


def warn_unique_for_ignored(actor: str) -> None:
    """Log ``actor_config_unique_for_ignored`` once per actor per process."""
    if actor not in _warned_unique_ignored:
        _warned_unique_ignored.add(actor)
        _log.warning(
            "actor_config_unique_for_ignored",
            actor=actor,
            hint="unique_for has no effect without identity_key; a new job is created every time",
        )


def _key(value: object, what: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str, got {type(value).__name__}")
    if not value or len(value) > MAX_NAME_LENGTH:
        raise ValueError(f"{what} must be 1..{MAX_NAME_LENGTH} characters, got {len(value)}")
    if "\x00" in value:  # a Postgres text column cannot hold it; SQLite would
        raise ValueError(f"{what} must not contain a NUL character")
    return value


def _seconds(value: object, what: str) -> float | None:
    if value is None:
        return None
    if not isinstance(value, timedelta):
        raise TypeError(f"{what} must be a timedelta or None")
    if value <= timedelta(0):
        raise ValueError(f"{what} must be > 0")
    return value.total_seconds()


try:
    from opentelemetry.context import get_current as _otel_current
    from opentelemetry.propagate import inject as _otel_inject
except ImportError:  # pragma: no cover - the otel extra is optional
    _otel_current = None  # type: ignore[assignment]


def _trace_context() -> dict[str, str] | None:
    """The caller's trace context (W3C headers) to store on the job, if any.

    An empty OpenTelemetry context (no span, no baggage) has nothing to propagate; that
    check is cheap, so enqueues outside any span skip the propagators.
    """
    if _otel_current is None or not _otel_current():
        return None
    carrier: dict[str, str] = {}
    _otel_inject(carrier)
    return carrier or None


def build_request(
    ref: ActorRef[Any, Any],
    payload: object,
    *,
    queue: str | None = None,
    priority: int | None = None,
    scheduled_at: datetime | None = None,
    delay: timedelta | None = None,
    identity_key: str | None = None,
    idempotency_key: str | None = None,
    tags: Sequence[str] | None = None,
    metadata: Mapping[str, Any] | None = None,
    start_to_close: timedelta | None = None,
    schedule_to_close: timedelta | None = None,
    parent_job_id: UUID | None = None,
    unique_for: timedelta | None = None,
    max_pending: int | None = None,
    job_id: UUID | None = None,
) -> EnqueueRequest:
    """Validate one enqueue against its actor and resolve every option (the keywords are
    :class:`~taskq.enqueue_options.ItemOptions`, tested to be the same set).

    ``job_id``: an id made in advance (``enqueue_many`` makes its ids in one batch);
    by default a new one.

    Raises before anything is written: ``PayloadValidationError`` for the payload,
    ``ValueError``/``TypeError`` for an option (naming it). ``unique_for``/``max_pending``
    here are per-call overrides (sub-job enqueues); ``None`` keeps the actor's.
    """
    body = {} if payload is _TEMPLATE else ref.dump_payload(payload)
    queue = validate_queue_name(queue) if queue is not None else ref.queue
    prio = ref.priority if priority is None else priority
    if isinstance(prio, bool) or not isinstance(prio, int):
        raise TypeError("priority must be an int")
    if not SMALLINT_MIN <= prio <= SMALLINT_MAX:
        raise ValueError(f"priority must be in {SMALLINT_MIN}..{SMALLINT_MAX}, got {prio}")
    if delay is not None and scheduled_at is not None:
        raise ValueError("pass either delay= or scheduled_at=, not both")
    if delay is not None:
        if not isinstance(delay, timedelta) or delay < timedelta(0):
            raise ValueError("delay must be a timedelta >= 0")
        delay_s = delay.total_seconds() or None
    else:
        delay_s = None
    if scheduled_at is not None:
        if not isinstance(scheduled_at, datetime) or scheduled_at.tzinfo is None:
            raise ValueError("scheduled_at must be an aware datetime")
        scheduled_at = scheduled_at.astimezone(UTC)
    tag_list = tuple(tags) if tags else ()
    for tag in tag_list:
        _key(tag, "tag")
    meta = dict(metadata) if metadata else {}
    if ref.singleton:
        meta["singleton"] = True
    elif "singleton" in meta:  # the library's key: only a singleton actor's jobs carry it
        del meta["singleton"]
    if meta:
        try:
            json.dumps(meta, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise TypeError(f"metadata must be JSON-serialisable: {exc}") from exc
        unstorable = unstorable_error(meta)
        if unstorable is not None:
            raise ValueError("metadata cannot be stored: " + describe(unstorable))
    policy = ref.retry
    max_attempts = (
        policy.max_attempts
        if policy.kind == "transient"
        else (1 if policy.kind == "non_retryable" else None)
    )
    # Only the per-enqueue timeout is stored: the actor's default and
    # TASKQ_DEFAULT_START_TO_CLOSE are the worker's to apply when the attempt runs.
    stc = _seconds(start_to_close, "start_to_close")
    window = unique_for if unique_for is not None else ref.unique_for
    if window is not None and identity_key is None:
        warn_unique_for_ignored(ref.name)
    return EnqueueRequest(
        job_id=job_id if job_id is not None else new_job_id(),
        actor=ref.name,
        queue=queue,
        payload=body,
        priority=prio,
        scheduled_at=scheduled_at,
        delay_s=delay_s,
        identity_key=_key(identity_key, "identity_key"),
        idempotency_key=_key(idempotency_key, "idempotency_key"),
        singleton=ref.singleton,
        tags=tag_list,
        metadata=meta,
        max_attempts=max_attempts,
        start_to_close_s=stc,
        schedule_to_close_s=_seconds(schedule_to_close, "schedule_to_close"),
        unique_for=window,
        unique_states=tuple(ref.unique_states),
        max_pending=max_pending if max_pending is not None else ref.max_pending,
        max_pending_per_call=max_pending is not None,
        trace_context=_trace_context(),
        parent_job_id=parent_job_id,
    )


_TEMPLATE = object()
"""The payload of :func:`request_template`: an empty document, nothing validated."""


def request_template(ref: ActorRef[Any, Any]) -> EnqueueRequest:
    """The request of an enqueue of ``ref`` with no options and an empty payload: what
    :func:`request_like` makes the items of an ``enqueue_many`` of ``(actor, payload)``
    pairs like, before any of their payloads is validated. Never inserted itself."""
    return build_request(ref, _TEMPLATE)


def request_like(
    template: EnqueueRequest, payload: dict[str, Any], job_id: UUID | None = None
) -> EnqueueRequest:
    """A new job like ``template`` (a :func:`request_template`, or a :func:`build_request`
    made with no per-job options) carrying ``payload`` (already dumped by the actor).

    ``enqueue_many`` of ``(actor, payload)`` pairs resolves each actor once and makes
    every further item with this: a new id, the payload, a fresh ``metadata`` dict, the
    rest shared. The caller's trace context is the template's (one
    batch, one span). ``job_id``: one of a batch made by ``new_job_ids``, else a new one.
    """
    return EnqueueRequest(
        job_id=job_id if job_id is not None else new_job_id(),
        actor=template.actor,
        queue=template.queue,
        payload=payload,
        priority=template.priority,
        singleton=template.singleton,
        metadata=dict(template.metadata) if template.metadata else {},
        max_attempts=template.max_attempts,
        start_to_close_s=template.start_to_close_s,
        unique_for=template.unique_for,
        unique_states=template.unique_states,
        max_pending=template.max_pending,
        max_pending_per_call=template.max_pending_per_call,
        trace_context=template.trace_context,
    )


@dataclass(frozen=True, slots=True)
class EnqueueArgs:
    """One item of ``enqueue_many``: an actor, its payload and per-job enqueue options
    (:class:`~taskq.enqueue_options.ItemOptions`).

    ``SubEnqueueError.failed_items`` carries these too, so a lost sub-job can be re-enqueued.
    """

    actor: Any
    payload: Any
    options: EnqueueOptions | ItemOptions = field(default_factory=ItemOptions)
