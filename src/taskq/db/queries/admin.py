"""Statement builders for the admin UI's reads: a job's progress row, recent finishes
(throughput), an actor's recent executions and schedule counts.

Each is bounded: the recent-finish reads walk ``ix_jobs_finished`` from the newest row
down and stop at a ``LIMIT``, so their cost follows the window shown, not the table.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import UUID

from sqlalchemy import Select, Subquery, bindparam, case, func, select
from sqlalchemy.dialects.postgresql import distinct_on
from sqlalchemy.sql.elements import ColumnElement

from taskq.db.tables import cron_schedules, jobs

__all__ = [
    "active_count",
    "actor_recent",
    "actors_last_error",
    "actors_summary",
    "children_of",
    "finished_count",
    "progress_row",
    "recent_finishes",
    "recent_rows",
    "schedule_counts",
    "window_sample",
]

FAILED = ("failed", "crashed", "abandoned")


def progress_row(job_id: UUID) -> Select[Any]:
    """The columns a progress stream needs: status, state, the event number, error class."""
    return select(
        jobs.c.id,
        jobs.c.status,
        jobs.c.progress,
        jobs.c.progress_seq,
        jobs.c.error_class,
    ).where(jobs.c.id == bindparam("b_id", job_id))


def recent_finishes(since: datetime, limit: int, queue: str | None = None) -> Select[Any]:
    """Jobs finished at or after ``since`` (newest first, at most ``limit``): queue,
    status and finish time, for the throughput chart and a queue's drain rate."""
    stmt = (
        select(jobs.c.queue, jobs.c.status, jobs.c.finished_at)
        .where(jobs.c.finished_at >= bindparam("b_since", since, type_=jobs.c.finished_at.type))
        .order_by(jobs.c.finished_at.desc())
        .limit(limit)
    )
    if queue is not None:
        stmt = stmt.where(jobs.c.queue == bindparam("b_queue", queue))
    return stmt


def actor_recent(actor: str, since: datetime, limit: int) -> Select[Any]:
    """``actor``'s jobs finished at or after ``since``, newest first, at most ``limit``:
    status, error class and the attempt's start and finish (its duration)."""
    return (
        select(jobs.c.status, jobs.c.error_class, jobs.c.started_at, jobs.c.finished_at)
        .where(
            jobs.c.actor == bindparam("b_actor", actor),
            jobs.c.finished_at >= bindparam("b_since", since, type_=jobs.c.finished_at.type),
        )
        .order_by(jobs.c.finished_at.desc())
        .limit(limit)
    )


def schedule_counts() -> Select[Any]:
    """Per actor: its cron schedules and how many are enabled."""
    return select(
        cron_schedules.c.actor,
        func.count(),
        func.sum(case((cron_schedules.c.enabled, 1), else_=0)),
    ).group_by(cron_schedules.c.actor)


def window_sample(since: datetime, limit: int) -> Subquery:
    """The newest ``limit`` finishes at or after ``since`` (every actor): actor, status,
    error class, finish time and duration in seconds (Postgres)."""
    return (
        select(
            jobs.c.actor,
            jobs.c.status,
            jobs.c.error_class,
            jobs.c.finished_at,
            func.extract("epoch", jobs.c.finished_at - jobs.c.started_at).label("duration_s"),
        )
        .where(jobs.c.finished_at >= bindparam("b_since", since, type_=jobs.c.finished_at.type))
        .order_by(jobs.c.finished_at.desc())
        .limit(limit)
        .subquery("recent")
    )


def actors_summary(sample: Subquery) -> Select[Any]:
    """Per actor over ``sample`` (Postgres): completed, failures, duration p50/p95/p99
    (nearest rank, as :func:`taskq.ops.stats.percentile` computes them on SQLite)."""
    failed = sample.c.status.in_(FAILED)
    return select(
        sample.c.actor,
        func.count(),
        func.count().filter(failed),
        func.percentile_disc(0.5).within_group(sample.c.duration_s),
        func.percentile_disc(0.95).within_group(sample.c.duration_s),
        func.percentile_disc(0.99).within_group(sample.c.duration_s),
    ).group_by(sample.c.actor)


def actors_last_error(sample: Subquery) -> Select[Any]:
    """Per actor over ``sample`` (Postgres): the error class of its newest failure."""
    return (
        select(sample.c.actor, sample.c.error_class)
        .where(sample.c.status.in_(FAILED), sample.c.error_class.is_not(None))
        .ext(distinct_on(sample.c.actor))
        .order_by(sample.c.actor, sample.c.finished_at.desc())
    )


def recent_rows(since: datetime, limit: int) -> Select[Any]:
    """The newest ``limit`` finishes at or after ``since``: actor, status, error class,
    start and finish (the engine-neutral form of :func:`window_sample`)."""
    return (
        select(
            jobs.c.actor, jobs.c.status, jobs.c.error_class, jobs.c.started_at, jobs.c.finished_at
        )
        .where(jobs.c.finished_at >= bindparam("b_since", since, type_=jobs.c.finished_at.type))
        .order_by(jobs.c.finished_at.desc())
        .limit(limit)
    )


def finished_count(since: datetime, queue: str, cap: int) -> Select[Any]:
    """How many of ``queue``'s jobs finished at or after ``since``, counting at most
    ``cap + 1`` (a queue's drain rate)."""
    inner = (
        select(jobs.c.finished_at)
        .where(
            jobs.c.finished_at >= bindparam("b_since", since, type_=jobs.c.finished_at.type),
            jobs.c.queue == bindparam("b_queue", queue),
        )
        .order_by(jobs.c.finished_at.desc())  # walk ix_jobs_finished from the newest
        .limit(cap + 1)
    )
    return select(func.count()).select_from(inner.subquery("finished"))


def active_count(
    statuses: tuple[str, ...], cap: int, *, queue: str | None = None, actor: str | None = None
) -> Select[Any]:
    """How many jobs of ``queue`` (or ``actor``) are in ``statuses``, counting at most
    ``cap + 1``: ``ix_jobs_queue_active`` for a queue's active statuses,
    ``ix_jobs_actor_status`` for an actor's."""
    conds: list[ColumnElement[bool]] = [jobs.c.status.in_([bindparam(None, st) for st in statuses])]
    if queue is not None:
        conds.append(jobs.c.queue == bindparam("b_queue", queue))
    if actor is not None:
        conds.append(jobs.c.actor == bindparam("b_actor", actor))
    # Ordered as the index that serves it, so the planner walks that index and stops at
    # the cap (an unordered LIMIT invites a sequential scan that "stops early").
    # ix_jobs_actor_status (actor, status) or ix_jobs_queue_active (queue, status; active
    # rows): ordered as the index so the planner walks it, index-only, to the cap.
    inner = select(jobs.c.status).where(*conds).order_by(jobs.c.status).limit(cap + 1)
    return select(func.count()).select_from(inner.subquery("active"))


def children_of(job_id: UUID, limit: int) -> Select[Any]:
    """Up to ``limit`` jobs whose parent is ``job_id``, unordered: an equality on
    ``ix_jobs_parent`` (ordering by creation here would walk ``ix_jobs_created`` instead,
    the whole index when the job has no children). The caller sorts them."""
    return select(jobs).where(jobs.c.parent_job_id == bindparam("b_parent", job_id)).limit(limit)
