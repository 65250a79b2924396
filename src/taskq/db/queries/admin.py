"""Statement builders for the admin UI's reads: a job's progress row, recent finishes
(throughput), an actor's recent executions and schedule counts.

Each is bounded: the recent-finish reads walk ``ix_jobs_finished`` from the newest row
down and stop at a ``LIMIT``, so their cost follows the window shown, not the table.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import UUID

from sqlalchemy import Select, bindparam, case, func, select

from taskq.db.tables import cron_schedules, jobs

__all__ = ["actor_recent", "progress_row", "recent_finishes", "schedule_counts"]


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
