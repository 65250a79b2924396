"""Statement builders for the operations layer on ``jobs``: filter, list, count, and the
bounded batches of cancel, retry and purge.

Every value reaches SQL as a bound parameter; a :class:`~taskq.job_filter.JobFilter` was
validated when it was made. Batches select their rows with ``LIMIT`` (and, on Postgres,
``FOR UPDATE SKIP LOCKED``) so each statement touches a bounded number of rows and never
waits behind a worker's transaction: the operation loops until a batch comes back empty.
Pages use a keyset (``created_at, id`` descending), never ``OFFSET``.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from sqlalchemy import (
    Select,
    String,
    and_,
    bindparam,
    case,
    column,
    delete,
    exists,
    func,
    literal,
    literal_column,
    not_,
    null,
    select,
    tuple_,
    type_coerce,
    update,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.sql.elements import ColumnClause, ColumnElement

from taskq.constants import TERMINAL_STATUSES
from taskq.db import dialect as dialects
from taskq.db.tables import job_attempts, jobs
from taskq.db.types import UTCDateTime
from taskq.job_filter import JobFilter

__all__ = [
    "CANCELLABLE_QUEUED",
    "RETRYABLE",
    "attempts_of",
    "cancel_queued_batch",
    "count_capped",
    "filter_conditions",
    "list_page",
    "purge_attempts",
    "purge_batch",
    "purge_batch_ids",
    "remaining_cancellable",
    "request_cancel_batch",
    "retry_candidates",
    "retry_row",
    "select_job",
    "store_now",
]

CANCELLABLE_QUEUED = ("pending", "scheduled")
RETRYABLE = ("failed", "cancelled", "crashed", "abandoned")


def _has_tags(dialect: str, tags: tuple[str, ...]) -> ColumnElement[bool]:
    # ``tags <> '[]'`` is implied by any tag matching; it is spelled out so the planner
    # can use the partial index ix_jobs_tags (tagged rows only).
    tagged = jobs.c.tags != literal_column("'[]'")
    if dialect == "postgresql":
        # jsonb @> '["a", "b"]': every tag present (the GIN index serves it).
        return and_(tagged, type_coerce(jobs.c.tags, JSONB()).contains(list(tags)))
    value: ColumnClause[Any] = column("value")
    conds = [
        exists(
            select(literal(1))
            .select_from(func.json_each(jobs.c.tags).table_valued("value"))
            .where(value == bindparam(None, tag))
        )
        for tag in tags
    ]
    return and_(tagged, *conds)


def filter_conditions(dialect: str, flt: JobFilter) -> list[ColumnElement[bool]]:
    """The WHERE conditions of ``flt`` (ANDed by the caller); empty for ``JobFilter()``.

    ``waiting_on`` needs the ``jobs.waiting_on`` column: on a schema without it the
    filter is a ``ValueError`` (nothing runs).
    """
    c = jobs.c
    conds: list[ColumnElement[bool]] = []
    if flt.status:
        conds.append(c.status.in_(flt.status))
    if flt.actor:
        conds.append(c.actor.in_(flt.actor))
    if flt.queue:
        conds.append(c.queue.in_(flt.queue))
    if flt.tags:
        conds.append(_has_tags(dialect, flt.tags))
    if flt.identity_key is not None:
        conds.append(c.identity_key == flt.identity_key)
    if flt.parent_job_id is not None:
        conds.append(c.parent_job_id == flt.parent_job_id)
    if flt.error_class is not None:
        conds.append(c.error_class == flt.error_class)
    if flt.waiting_on is not None:
        waiting = c.get("waiting_on")
        if waiting is None:
            raise ValueError("JobFilter.waiting_on: this schema has no jobs.waiting_on column")
        conds.append(waiting == flt.waiting_on)
    if flt.waiting is not None:
        column = c.get("waiting_on")
        if column is None:
            raise ValueError("JobFilter.waiting: this schema has no jobs.waiting_on column")
        parked = and_(column.is_not(None), c.status.in_(("pending", "scheduled")))
        conds.append(parked if flt.waiting else not_(parked))
    if flt.created_after is not None:
        conds.append(c.created_at >= flt.created_after)
    if flt.created_before is not None:
        conds.append(c.created_at < flt.created_before)
    if flt.finished_after is not None:
        conds.append(c.finished_at >= flt.finished_after)
    if flt.finished_before is not None:
        conds.append(c.finished_at < flt.finished_before)
    return conds


def _restrict(flt: JobFilter, statuses: tuple[str, ...]) -> tuple[str, ...]:
    """``statuses`` narrowed to the filter's own (an operation on a subset of states)."""
    return tuple(s for s in statuses if not flt.status or s in flt.status)


def list_page(
    dialect: str, flt: JobFilter, limit: int, after: tuple[str, UUID] | None
) -> Select[Any]:
    """Up to ``limit`` jobs matching ``flt``, newest first, after the keyset ``after``.

    Each row carries ``cursor_created_at``: its ``created_at`` as the store orders it
    (SQLite compares the stored text, whose precision depends on who wrote the row, so
    the keyset is that text there, not a re-formatted timestamp).
    """
    created: ColumnElement[Any] = jobs.c.created_at
    if dialect == "sqlite":
        created = type_coerce(jobs.c.created_at, String())
    stmt = select(jobs, created.label("cursor_created_at")).where(*filter_conditions(dialect, flt))
    if after is not None:
        at, job_id = after
        bound: ColumnElement[Any]
        if dialect == "sqlite":
            bound = literal(at, String())
        else:
            moment = datetime.fromisoformat(at)
            if moment.tzinfo is None:
                raise ValueError("invalid cursor: its timestamp has no time zone")
            bound = literal(moment, UTCDateTime())
        stmt = stmt.where(
            tuple_(created, jobs.c.id) < tuple_(bound, literal(job_id, jobs.c.id.type))
        )
    return stmt.order_by(jobs.c.created_at.desc(), jobs.c.id.desc()).limit(limit)


def count_capped(dialect: str, flt: JobFilter, cap: int) -> Select[Any]:
    """How many jobs match ``flt``, counting at most ``cap + 1`` rows (so the cost is bounded)."""
    # Ordered like a list page: with no selective index for the filter the count walks
    # ix_jobs_created (index only) and stops after cap + 1 matches.
    inner = (
        select(jobs.c.created_at)
        .where(*filter_conditions(dialect, flt))
        .order_by(jobs.c.created_at.desc())
        .limit(cap + 1)
    )
    return select(func.count()).select_from(inner.subquery("matching"))


def select_job(job_id: UUID, *, for_update: bool = False) -> Select[Any]:
    """One job row (locked for the transaction with ``for_update``, on Postgres)."""
    stmt = select(jobs).where(jobs.c.id == job_id)
    return stmt.with_for_update() if for_update else stmt


def attempts_of(job_id: UUID) -> Select[Any]:
    """A job's attempts, oldest first (with their tracebacks)."""
    return (
        select(job_attempts)
        .where(job_attempts.c.job_id == job_id)
        .order_by(job_attempts.c.attempt, job_attempts.c.id)
    )


def store_now(dialect: str) -> Select[Any]:
    """The store's clock, as an aware timestamp."""
    return select(type_coerce(dialects.now(dialect), UTCDateTime()).label("now"))


def _batch_ids(dialect: str, conds: list[ColumnElement[bool]], size: int) -> Any:
    sub = select(jobs.c.id).where(*conds).limit(size)
    if dialect == "postgresql":
        sub = sub.with_for_update(skip_locked=True)
    return sub.scalar_subquery()


def cancel_queued_batch(dialect: str, flt: JobFilter, size: int) -> Any | None:
    """End up to ``size`` matching pending/scheduled jobs ``cancelled``
    (``CancelledBeforeStart``), RETURNING ``id``; ``None`` when the filter admits no such
    status."""
    statuses = _restrict(flt, CANCELLABLE_QUEUED)
    if not statuses:
        return None
    conds = [*filter_conditions(dialect, flt), jobs.c.status.in_(statuses)]
    now = dialects.now(dialect)
    return (
        update(jobs)
        .where(jobs.c.id.in_(_batch_ids(dialect, conds, size)), jobs.c.status.in_(statuses))
        .values(
            status="cancelled",
            error_class="CancelledBeforeStart",
            finished_at=now,
            cancel_requested_at=func.coalesce(jobs.c.cancel_requested_at, now),
            updated_at=now,
        )
        .returning(jobs.c.id)
    )


def request_cancel_batch(dialect: str, flt: JobFilter, size: int) -> Any | None:
    """Stamp ``cancel_phase = 1`` on up to ``size`` matching running jobs not yet asked to
    cancel, RETURNING ``id``: their workers' cancel polls see the stamp and walk the
    ladder. ``None`` when the filter excludes ``running``."""
    if not _restrict(flt, ("running",)):
        return None
    conds = [*filter_conditions(dialect, flt), jobs.c.status == "running", jobs.c.cancel_phase == 0]
    now = dialects.now(dialect)
    return (
        update(jobs)
        .where(
            jobs.c.id.in_(_batch_ids(dialect, conds, size)),
            jobs.c.status == "running",
            jobs.c.cancel_phase == 0,
        )
        .values(
            cancel_phase=1,
            cancel_requested_at=func.coalesce(jobs.c.cancel_requested_at, now),
            updated_at=now,
        )
        .returning(jobs.c.id)
    )


def remaining_cancellable(dialect: str, flt: JobFilter) -> Select[Any] | None:
    """How many matching jobs a cancel has not reached yet (queued, or running unstamped)."""
    queued = _restrict(flt, CANCELLABLE_QUEUED)
    running = bool(_restrict(flt, ("running",)))
    parts: list[ColumnElement[bool]] = []
    if queued:
        parts.append(jobs.c.status.in_(queued))
    if running:
        parts.append((jobs.c.status == "running") & (jobs.c.cancel_phase == 0))
    if not parts:
        return None
    either = parts[0] if len(parts) == 1 else parts[0] | parts[1]
    return select(func.count()).select_from(jobs).where(*filter_conditions(dialect, flt), either)


def retry_candidates(dialect: str, flt: JobFilter, size: int, *, after: UUID | None) -> Any | None:
    """Up to ``size`` matching retryable jobs (failed, cancelled, crashed, abandoned):
    ``id, status, error_class, attempt, singleton, metadata, queue``, by id, after ``after``
    (the singletons a batch had to leave are not read again). Locked on Postgres."""
    statuses = _restrict(flt, RETRYABLE)
    if not statuses:
        return None
    stmt = select(
        jobs.c.id,
        jobs.c.status,
        jobs.c.error_class,
        jobs.c.attempt,
        jobs.c.singleton,
        jobs.c.metadata,
        jobs.c.queue,
    ).where(*filter_conditions(dialect, flt), jobs.c.status.in_(statuses))
    if after is not None:
        stmt = stmt.where(jobs.c.id > after)
    stmt = stmt.order_by(jobs.c.id).limit(size)
    if dialect == "postgresql":
        stmt = stmt.with_for_update(skip_locked=True)
    return stmt


def retry_row(dialect: str) -> Any:
    """Put one job (``b_id``) back to ``pending`` now with a fresh budget, executed with a
    list of ``{b_id, b_metadata}``: ``budget_used = 0``, the error, result and
    cancellation cleared, a fresh deadline from ``schedule_to_close``. ``attempt`` keeps
    counting (the attempt history stays unique); the caller records the retry in
    ``b_metadata``. Only a job still in a retryable status is changed."""
    now = dialects.now(dialect)
    return (
        update(jobs)
        .where(
            jobs.c.id == bindparam("b_id", type_=jobs.c.id.type),
            # literals, not an expanding parameter: the statement runs as an executemany
            jobs.c.status.in_([literal(status) for status in RETRYABLE]),
        )
        .values(
            status="pending",
            scheduled_at=now,
            budget_used=0,
            result=null(),
            error=null(),
            error_class=null(),
            cancel_phase=0,
            cancel_requested_at=null(),
            locked_by=null(),
            lease_expires_at=null(),
            result_expires_at=null(),
            started_at=null(),
            finished_at=null(),
            deadline_at=case(
                (jobs.c.schedule_to_close_s.is_(None), null()),
                else_=dialects.now_plus(dialect, jobs.c.schedule_to_close_s),
            ),
            metadata=bindparam("b_metadata", type_=jobs.c.metadata.type),
            updated_at=now,
        )
    )


def purge_batch_ids(
    dialect: str, older_than: timedelta, statuses: tuple[str, ...], size: int
) -> Select[Any]:
    """Up to ``size`` ids of jobs in ``statuses`` that finished more than ``older_than`` ago."""
    stmt = (
        select(jobs.c.id)
        .where(
            jobs.c.finished_at.is_not(None),
            jobs.c.finished_at < dialects.now_plus(dialect, -older_than.total_seconds()),
            jobs.c.status.in_(statuses),
        )
        # Oldest first, along ix_jobs_finished: each batch starts where the deleted ones
        # were instead of re-reading them (a sequential scan would, dead rows and all).
        .order_by(jobs.c.finished_at)
        .limit(size)
    )
    if dialect == "postgresql":
        stmt = stmt.with_for_update(skip_locked=True)
    return stmt


def purge_attempts(ids: list[UUID]) -> Any:
    """Delete the attempts of jobs ``ids`` (explicitly: a SQLite connection made without
    ``PRAGMA foreign_keys = ON`` would not cascade)."""
    return delete(job_attempts).where(job_attempts.c.job_id.in_(ids))


def purge_batch(ids: list[UUID]) -> Any:
    """Delete the jobs ``ids`` that are still finished (after :func:`purge_attempts`)."""
    return delete(jobs).where(jobs.c.id.in_(ids), jobs.c.status.in_(TERMINAL_STATUSES))
