"""Statement builders for the producer side of ``jobs``: enqueue checks, inserts, reads, cancel.

Each function returns a SQLAlchemy Core statement; backends execute them. ``dialect`` is
the engine's dialect name (``"postgresql"`` or ``"sqlite"``); timestamps that decide
behaviour (windows, schedules) come from the store's clock, :func:`taskq.db.dialect.now`.
"""

from __future__ import annotations

import functools
from datetime import timedelta
from typing import Any
from uuid import UUID

from sqlalchemy import (
    Float,
    Select,
    and_,
    bindparam,
    case,
    cast,
    func,
    literal,
    literal_column,
    null,
    select,
    update,
)
from sqlalchemy.sql.elements import ColumnElement

from taskq.constants import ACTIVE_STATUSES
from taskq.db import dialect as dialects
from taskq.db.tables import actor_config, job_attempts, jobs
from taskq.records import EnqueueRequest

__all__ = [
    "active_singleton",
    "advisory_key",
    "attempts",
    "cancel",
    "count_pending",
    "get",
    "idempotent_match",
    "insert_jobs",
    "job_params",
    "stored_max_pending",
    "unique_match",
]

_PENDING_OR_SCHEDULED = ("pending", "scheduled")


def ago(dialect: str, window: timedelta) -> ColumnElement[Any]:
    """``now() - window`` on the store's clock."""
    seconds = window.total_seconds()
    if dialect == "postgresql":
        return func.clock_timestamp() - func.make_interval(0, 0, 0, 0, 0, 0, literal(seconds))
    return func.strftime("%Y-%m-%d %H:%M:%f", "now", literal(f"-{seconds:.6f} seconds"))


def advisory_key(kind: str, actor: str, key: str = "") -> str:
    """The text an advisory lock hashes: one lock per (kind, actor, key)."""
    return f"taskq:{kind}:{actor}:{key}"


def unique_match(dialect: str, req: EnqueueRequest) -> Select[Any]:
    """The newest job for ``(actor, identity_key)`` created inside the window in ``unique_states``."""
    assert req.unique_for is not None
    assert req.identity_key is not None
    return (
        select(jobs)
        .where(
            jobs.c.actor == req.actor,
            jobs.c.identity_key == req.identity_key,
            jobs.c.status.in_(req.unique_states),
            jobs.c.created_at >= ago(dialect, req.unique_for),
        )
        .order_by(jobs.c.created_at.desc())
        .limit(1)
    )


def active_singleton(actor: str) -> Select[Any]:
    """The active job of a singleton actor, if any (the pre-flight)."""
    return (
        select(jobs.c.id, jobs.c.schedule_to_close_s, jobs.c.created_at)
        .where(
            jobs.c.actor == actor, jobs.c.singleton.is_(True), jobs.c.status.in_(ACTIVE_STATUSES)
        )
        .limit(1)
    )


def count_pending(actor: str) -> Select[Any]:
    """How many of the actor's jobs are pending or scheduled (what ``max_pending`` caps)."""
    return (
        select(func.count())
        .select_from(jobs)
        .where(jobs.c.actor == actor, jobs.c.status.in_(_PENDING_OR_SCHEDULED))
    )


def stored_max_pending(actor: str) -> Select[Any]:
    """The operator-owned ``actor_config.max_pending`` (NULL or no row: use the literal)."""
    return select(actor_config.c.max_pending).where(actor_config.c.actor == actor)


def idempotent_match(actor: str, idempotency_key: str) -> Select[Any]:
    """The job already holding ``(actor, idempotency_key)``."""
    return select(jobs).where(jobs.c.actor == actor, jobs.c.idempotency_key == idempotency_key)


def _after(dialect: str, seconds: ColumnElement[Any]) -> ColumnElement[Any]:
    if dialect == "postgresql":
        zero: ColumnElement[Any] = literal_column("0")
        return func.clock_timestamp() + func.make_interval(
            zero, zero, zero, zero, zero, zero, seconds
        )
    return func.strftime("%Y-%m-%d %H:%M:%f", "now", func.printf("+%.6f seconds", seconds))


def job_params(req: EnqueueRequest) -> dict[str, Any]:
    """The bound parameters of one row for :func:`insert_jobs` (executed as executemany)."""
    return {
        "id": req.job_id,
        "actor": req.actor,
        "queue": req.queue,
        "status": "pending" if req.scheduled_at is None and req.delay_s is None else "scheduled",
        "payload": req.payload,
        "priority": req.priority,
        "max_attempts": req.max_attempts,
        "identity_key": req.identity_key,
        "idempotency_key": req.idempotency_key,
        "singleton": req.singleton,
        "tags": req.tags,
        "metadata": req.metadata,
        "trace_context": req.trace_context,
        "start_to_close_s": req.start_to_close_s,
        "schedule_to_close_s": req.schedule_to_close_s,
        "parent_job_id": req.parent_job_id,
        "p_scheduled_at": req.scheduled_at,
        "p_delay_s": req.delay_s or 0.0,
        "p_deadline_s": req.schedule_to_close_s,
    }


@functools.cache
def insert_jobs(dialect: str, *, skip_conflicts: bool = False) -> Any:
    """An INSERT of job rows, executed with a list of :func:`job_params` (one round trip:
    SQLAlchemy batches the rows into multi-row statements); ``RETURNING`` every column.

    The statement is the same for every batch, so it is compiled once and cached.
    Timestamps come from the store's clock: ``scheduled_at`` is the explicit value or
    ``now() + delay``, ``deadline_at`` is ``now() + schedule_to_close``.
    ``skip_conflicts`` adds ``ON CONFLICT DO NOTHING``: a row that hits the singleton or
    idempotency unique index is silently not inserted (absent from RETURNING), so the
    caller's transaction is never aborted by an expected collision.
    """
    now = dialects.now(dialect)
    delay = cast(bindparam("p_delay_s", type_=Float()), Float())
    deadline = cast(bindparam("p_deadline_s", type_=Float()), Float())
    stmt = dialects.insert(dialect, jobs).values(
        scheduled_at=func.coalesce(
            bindparam("p_scheduled_at", type_=jobs.c.scheduled_at.type), _after(dialect, delay)
        ),
        deadline_at=case((deadline.is_(None), null()), else_=_after(dialect, deadline)),
        created_at=now,
        updated_at=now,
    )
    if skip_conflicts:
        stmt = stmt.on_conflict_do_nothing()
    return stmt.returning(*jobs.c, sort_by_parameter_order=True)


def get(job_id: UUID) -> Select[Any]:
    """One job row by id."""
    return select(jobs).where(jobs.c.id == job_id)


def attempts(job_id: UUID) -> Select[Any]:
    """A job's attempts, oldest first."""
    return (
        select(job_attempts)
        .where(job_attempts.c.job_id == job_id)
        .order_by(job_attempts.c.attempt, job_attempts.c.id)
    )


def cancel(dialect: str, job_id: UUID) -> Any:
    """Cancel a job: a pending/scheduled one ends ``cancelled`` (``CancelledBeforeStart``);
    a running one gets ``cancel_phase >= 1`` for its worker to act on; a finished one is
    left alone. Returns the row.
    """
    now = dialects.now(dialect)
    queued = jobs.c.status.in_(_PENDING_OR_SCHEDULED)
    return (
        update(jobs)
        .where(jobs.c.id == job_id, jobs.c.status.in_(ACTIVE_STATUSES))
        .values(
            status=case((queued, literal("cancelled")), else_=jobs.c.status),
            error_class=case((queued, literal("CancelledBeforeStart")), else_=jobs.c.error_class),
            finished_at=case((queued, now), else_=jobs.c.finished_at),
            cancel_phase=case(
                (and_(jobs.c.status == "running", jobs.c.cancel_phase < 1), literal(1)),
                else_=jobs.c.cancel_phase,
            ),
            cancel_requested_at=func.coalesce(jobs.c.cancel_requested_at, now),
            updated_at=now,
        )
        .returning(*jobs.c)
    )
