"""Statement builders for ``cron_schedules`` and the job reads the schedules show.

A tick is claimed with a compare-and-set on ``next_run_at`` (:func:`claim_tick`): the
UPDATE matches only while the row still holds the tick the caller read, so of two
workers evaluating one schedule at once exactly one moves it on; the other's UPDATE
matches no row and it enqueues nothing.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from datetime import datetime
from typing import Any
from uuid import UUID

from sqlalchemy import Select, and_, case, delete, func, or_, select, type_coerce, update

from taskq.db import dialect as dialects
from taskq.db.tables import cron_schedules, jobs
from taskq.db.types import UTCDateTime

__all__ = [
    "TICK_KEY_PREFIX",
    "claim_tick",
    "clear_next_run",
    "count_by_actor",
    "count_jobs",
    "delete_schedule",
    "due",
    "get",
    "history",
    "insert",
    "job_statuses",
    "list_all",
    "record_tick",
    "set_enabled",
    "store_now",
    "tick_key",
    "upsert_code",
]

TICK_KEY_PREFIX = "cron:"
_DEFINITION = (
    "queue",
    "cron_expression",
    "timezone",
    "payload",
    "jitter_s",
    "missed",
    "max_catchup",
    "priority",
    "tags",
    "identity_key",
)
"""The columns a schedule's definition owns (code re-seeds them at every worker start)."""


def tick_key(schedule_id: str, tick: str) -> str:
    """The idempotency key of one tick's job: ``cron:<tick>:<schedule id>``.

    The unique ``(actor, idempotency_key)`` index makes a tick's job exist at most once,
    whatever claimed it. ``tick`` is the tick's UTC time (``2026-12-01T22:00:00Z``) or
    ``manual-<hex>`` for a run-now; schedule ids hold no ``:``, so the key parses back.
    """
    return f"{TICK_KEY_PREFIX}{tick}:{schedule_id}"


def get(schedule_id: str) -> Select[Any]:
    """One schedule row."""
    return select(cron_schedules).where(cron_schedules.c.id == schedule_id)


def list_all(*, actor: str | None = None, enabled: bool | None = None) -> Select[Any]:
    """Schedule rows by id, optionally for one actor or in one state."""
    stmt = select(cron_schedules).order_by(cron_schedules.c.id)
    if actor is not None:
        stmt = stmt.where(cron_schedules.c.actor == actor)
    if enabled is not None:
        stmt = stmt.where(cron_schedules.c.enabled.is_(enabled))
    return stmt


def due(until: datetime, actors: Collection[str]) -> Select[Any]:
    """Enabled schedules of ``actors`` whose next tick is at or before ``until``."""
    return (
        select(cron_schedules)
        .where(
            cron_schedules.c.enabled.is_(True),
            cron_schedules.c.next_run_at.is_not(None),
            cron_schedules.c.next_run_at <= until,
            cron_schedules.c.actor.in_(sorted(actors)),
        )
        .order_by(cron_schedules.c.next_run_at, cron_schedules.c.id)
    )


def insert(dialect: str, row: Mapping[str, Any], *, replace: bool = False) -> Any:
    """Create a schedule (``replace``: overwrite an existing one's definition and state)."""
    now = dialects.now(dialect)
    stmt = dialects.insert(dialect, cron_schedules).values(**row, created_at=now, updated_at=now)
    if replace:
        keep = {"id", "created_at"}
        stmt = stmt.on_conflict_do_update(
            index_elements=[cron_schedules.c.id],
            set_={k: getattr(stmt.excluded, k) for k in row if k not in keep} | {"updated_at": now},
        )
    return stmt.returning(*cron_schedules.c)


def upsert_code(dialect: str, row: Mapping[str, Any]) -> Any:
    """The worker's startup sync of one schedule declared in code.

    A new row is written whole. An existing row of the same actor takes the code's
    definition; ``enabled`` stays the operator's, and ``next_run_at`` is recomputed
    only when the timing changed (expression or zone). A row owned by another actor is
    left alone and returns nothing, which the caller reports.
    """
    now = dialects.now(dialect)
    stmt = dialects.insert(dialect, cron_schedules).values(**row, created_at=now, updated_at=now)
    c = cron_schedules.c
    ex = stmt.excluded
    retimed = or_(
        c.cron_expression != ex.cron_expression,
        c.timezone != ex.timezone,
        c.next_run_at.is_(None),
    )
    set_: dict[str, Any] = {k: getattr(ex, k) for k in _DEFINITION}
    set_["origin"] = ex.origin
    set_["next_run_at"] = case((retimed, ex.next_run_at), else_=c.next_run_at)
    set_["updated_at"] = now
    return stmt.on_conflict_do_update(
        index_elements=[c.id], set_=set_, where=c.actor == ex.actor
    ).returning(c.id, c.enabled, c.next_run_at)


def claim_tick(dialect: str, schedule_id: str, expected: datetime, next_run_at: datetime) -> Any:
    """Move the schedule from the tick ``expected`` on to ``next_run_at`` (compare-and-set).

    Matches no row when another worker moved it first, or it was disabled or deleted.
    """
    c = cron_schedules.c
    return (
        update(cron_schedules)
        .where(c.id == schedule_id, c.enabled.is_(True), c.next_run_at == expected)
        .values(next_run_at=next_run_at, updated_at=dialects.now(dialect))
    )


def record_tick(
    schedule_id: str,
    *,
    outcome: str,
    at: datetime,
    tick: datetime | None,
    job_id: UUID | None = None,
    error: str | None = None,
    enqueued: int = 0,
    refused: int = 0,
) -> Any:
    """Write what a tick (or a run-now) did onto its schedule row."""
    c = cron_schedules.c
    values: dict[str, Any] = {
        "last_outcome": outcome,
        "last_error": error,
        "enqueued_count": c.enqueued_count + enqueued,
        "refused_count": c.refused_count + refused,
    }
    if tick is not None:
        values["last_tick_at"] = tick
    if job_id is not None:
        values["last_job_id"] = job_id
        values["last_run_at"] = at
    return update(cron_schedules).where(c.id == schedule_id).values(**values)


def set_enabled(
    dialect: str, schedule_id: str, enabled: bool, next_run_at: datetime | None = None
) -> Any:
    """Enable (from ``next_run_at`` on) or disable one schedule; a no-op if already so."""
    c = cron_schedules.c
    values: dict[str, Any] = {"enabled": enabled, "updated_at": dialects.now(dialect)}
    if enabled:
        values["next_run_at"] = next_run_at
    return (
        update(cron_schedules)
        .where(c.id == schedule_id, c.enabled.is_(not enabled))
        .values(**values)
    )


def clear_next_run(dialect: str, schedule_id: str, expected: datetime, error: str) -> Any:
    """Park a schedule whose stored definition no longer parses (``next_run_at`` NULL)."""
    c = cron_schedules.c
    return (
        update(cron_schedules)
        .where(c.id == schedule_id, c.next_run_at == expected)
        .values(
            next_run_at=None,
            last_outcome="invalid",
            last_error=error,
            updated_at=dialects.now(dialect),
        )
    )


def delete_schedule(schedule_id: str) -> Any:
    """Delete one schedule (its jobs stay)."""
    return delete(cron_schedules).where(cron_schedules.c.id == schedule_id)


def _like_escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def history(actor: str, schedule_id: str, limit: int) -> Select[Any]:
    """The schedule's most recent jobs (ticks and run-nows), newest first."""
    pattern = f"{TICK_KEY_PREFIX}%:{_like_escape(schedule_id)}"
    return (
        select(
            jobs.c.id,
            jobs.c.status,
            jobs.c.idempotency_key,
            jobs.c.scheduled_at,
            jobs.c.created_at,
            jobs.c.finished_at,
            jobs.c.error_class,
        )
        .where(
            and_(
                jobs.c.actor == actor,
                jobs.c.idempotency_key.like(pattern, escape="\\"),
            )
        )
        .order_by(jobs.c.created_at.desc(), jobs.c.id)
        .limit(limit)
    )


def job_statuses(job_ids: Collection[UUID]) -> Select[Any]:
    """``(id, status)`` of the given jobs (a schedule's last job)."""
    return select(jobs.c.id, jobs.c.status).where(jobs.c.id.in_(list(job_ids)))


def count_jobs(actor: str, schedule_id: str) -> Select[Any]:
    """How many jobs the schedule's ticks and run-nows made (the history's length)."""
    pattern = f"{TICK_KEY_PREFIX}%:{_like_escape(schedule_id)}"
    return (
        select(func.count())
        .select_from(jobs)
        .where(jobs.c.actor == actor, jobs.c.idempotency_key.like(pattern, escape="\\"))
    )


def count_by_actor() -> Select[Any]:
    """``(actor, enabled, count)`` over every schedule (the admin page's per-actor counts)."""
    c = cron_schedules.c
    return select(c.actor, c.enabled, func.count()).group_by(c.actor, c.enabled)


def store_now(dialect: str) -> Select[Any]:
    """The store's clock as an aware UTC datetime: what the ticker decides "due" by."""
    return select(type_coerce(dialects.now(dialect), UTCDateTime()))
