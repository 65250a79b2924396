"""Statement builders for the admin UI's reads: a job's progress row, recent finishes
(throughput), an actor's recent executions and schedule counts.

Each is bounded: the recent-finish reads walk ``ix_jobs_finished`` (or, per actor,
``ix_jobs_actor_finished``) from the newest row down, index-only on Postgres, and stop at
a ``LIMIT``; counts stop at a cap. Their cost follows the window shown, not the table.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any
from uuid import UUID

from sqlalchemy import (
    Float,
    Select,
    String,
    and_,
    bindparam,
    case,
    func,
    select,
    true,
    type_coerce,
)
from sqlalchemy.dialects.postgresql import ARRAY, aggregate_order_by
from sqlalchemy.sql.elements import ColumnElement

from taskq.db.tables import cron_schedules, jobs

__all__ = [
    "active_count",
    "active_counts",
    "actor_recent",
    "actors_window",
    "children_of",
    "finished_count",
    "progress_row",
    "recent_finishes",
    "schedule_counts",
    "throughput_buckets",
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


def throughput_buckets(since: datetime, width_s: float, cap: int) -> Select[Any]:
    """Postgres: ``(bucket, status, count)`` of the newest ``cap`` finishes at or after
    ``since``, bucket ``n`` covering ``[since + n * width_s, since + (n + 1) * width_s)``.

    An index-only range scan of ``ix_jobs_finished`` (it covers ``status``) aggregated in
    the store: a handful of rows cross the wire, not one per finish."""
    start = bindparam("b_since", since, type_=jobs.c.finished_at.type)
    recent = (
        select(jobs.c.finished_at, jobs.c.status)
        .where(jobs.c.finished_at >= start)
        .order_by(jobs.c.finished_at.desc())
        .limit(cap)
        .subquery("recent")
    )
    offset = func.date_part("epoch", recent.c.finished_at - start)
    bucket = func.floor(offset / bindparam("b_width", width_s, type_=Float())).label("bucket")
    return select(bucket, recent.c.status, func.count()).group_by(bucket, recent.c.status)


def actors_window(actors: Sequence[str], since: datetime, per_actor: int) -> Select[Any]:
    """Postgres: per actor of ``actors``, over its newest ``per_actor`` finishes at or
    after ``since``: how many (at most ``per_actor``), failures, the newest failure's
    error class, duration p50/p95/p99 as one array (nearest rank, as
    :func:`taskq.ops.stats.percentile` computes them on SQLite) and the oldest finish
    looked at. An actor with no finish in the window has a count of 0.

    Each actor's rows are an index-only range of ``ix_jobs_actor_finished`` (it covers
    status, start and error class), aggregated per actor inside the lateral join: the
    cost is ``len(actors) * per_actor`` index entries at most, whatever the window holds."""
    names = (
        func.unnest(bindparam("b_actors", list(actors), type_=ARRAY(String())))
        .table_valued("actor")
        .render_derived(name="a")
    )
    recent = (
        select(
            jobs.c.status,
            jobs.c.error_class,
            jobs.c.finished_at,
            func.date_part("epoch", jobs.c.finished_at - jobs.c.started_at).label("duration_s"),
        )
        .where(
            jobs.c.actor == names.c.actor,
            jobs.c.finished_at >= bindparam("b_since", since, type_=jobs.c.finished_at.type),
        )
        .order_by(jobs.c.finished_at.desc())
        .limit(per_actor)
        .correlate(names)  # the lateral join's actor, not a second unnest
        .subquery("recent")
    )
    failed = recent.c.status.in_(FAILED)
    errors = func.array_agg(aggregate_order_by(recent.c.error_class, recent.c.finished_at.desc()))
    last_error = type_coerce(
        errors.filter(and_(failed, recent.c.error_class.is_not(None))), ARRAY(String())
    )[1]
    points = bindparam("b_points", [0.5, 0.95, 0.99], type_=ARRAY(Float()))
    summary = select(
        func.count().label("n"),
        func.count().filter(failed).label("failures"),
        last_error.label("last_error"),
        type_coerce(
            func.percentile_disc(points).within_group(recent.c.duration_s), ARRAY(Float())
        ).label("percentiles"),
        func.min(recent.c.finished_at).label("oldest"),
    ).lateral("summary")
    return select(
        names.c.actor,
        summary.c.n,
        summary.c.failures,
        summary.c.last_error,
        summary.c.percentiles,
        summary.c.oldest,
    ).select_from(names.join(summary, true()))


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
    # Anonymous binds: many of these share one statement (active_counts).
    if queue is not None:
        conds.append(jobs.c.queue == bindparam(None, queue))
    if actor is not None:
        conds.append(jobs.c.actor == bindparam(None, actor))
    # Ordered as the index that serves it, so the planner walks that index and stops at
    # the cap (an unordered LIMIT invites a sequential scan that "stops early").
    # ix_jobs_actor_status (actor, status) or ix_jobs_queue_active (queue, status; active
    # rows): ordered as the index so the planner walks it, index-only, to the cap.
    inner = select(jobs.c.status).where(*conds).order_by(jobs.c.status).limit(cap + 1)
    return select(func.count()).select_from(inner.subquery("active"))


def active_counts(column: str, pairs: Sequence[tuple[str, str]], cap: int) -> Select[Any]:
    """Postgres: ``(value, status, n)`` for each ``(value, status)`` of ``pairs``: how
    many jobs have ``column`` (``"queue"`` or ``"actor"``) = value in that status,
    counting at most ``cap + 1``.

    One statement, planned once, however many counts a page shows: each pair is an
    index-only range of ``ix_jobs_queue_active`` (queue, status; active rows) or
    ``ix_jobs_actor_status`` (actor, status) that stops at the cap (one status per range,
    so the walk is in index order and the ``LIMIT`` ends it)."""
    statuses = sorted({status for _value, status in pairs})
    keys = (
        func.unnest(
            bindparam("b_values", [v for v, _s in pairs], type_=ARRAY(String())),
            bindparam("b_statuses", [st for _v, st in pairs], type_=ARRAY(String())),
        )
        .table_valued("value", "status")
        .render_derived(name="k")
    )
    # The literal status list lets the planner prove a partial index's predicate (the
    # lateral's status is only known per row).
    inner = (
        select(jobs.c.status)
        .where(
            jobs.c[column] == keys.c.value,
            jobs.c.status == keys.c.status,
            jobs.c.status.in_([bindparam(None, st) for st in statuses]),
        )
        .limit(cap + 1)
        .correlate(keys)
        .subquery("matching")
    )
    counted = select(func.count().label("n")).select_from(inner).lateral("counted")
    return select(keys.c.value, keys.c.status, counted.c.n).select_from(keys.join(counted, true()))


def children_of(job_id: UUID, limit: int) -> Select[Any]:
    """Up to ``limit`` jobs whose parent is ``job_id``, unordered: an equality on
    ``ix_jobs_parent`` (ordering by creation here would walk ``ix_jobs_created`` instead,
    the whole index when the job has no children). The caller sorts them."""
    return select(jobs).where(jobs.c.parent_job_id == bindparam("b_parent", job_id)).limit(limit)
