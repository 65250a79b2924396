"""Statement builders for the operator's view of the fleet: workers, their running jobs,
and who holds the leader leases."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Select, func, or_, select, type_coerce

from taskq.db import dialect as dialects
from taskq.db.tables import jobs, leader_leases, workers
from taskq.db.types import UTCDateTime

__all__ = ["held_leader_leases", "list_workers"]


def list_workers(
    dialect: str, *, include_stopped: bool, stopped_limit: int | None = None
) -> Select[Any]:
    """The ``workers`` rows (without ``stopped`` ones unless ``include_stopped``; with
    ``stopped_limit``, only the newest that many stopped ones), oldest first, with the
    store's clock as ``now`` (heartbeat ages are taken from it) and ``running_jobs``: the
    worker's running jobs, counted on ``ix_jobs_running_worker`` (a worker's own entries,
    at most its concurrency; never every running row)."""
    now = type_coerce(dialects.now(dialect), UTCDateTime()).label("now")
    running = (
        select(func.count())
        .where(jobs.c.locked_by == workers.c.id, jobs.c.status == "running")
        .correlate(workers)
        .scalar_subquery()
        .label("running_jobs")
    )
    stmt = select(workers, now, running).order_by(workers.c.started_at, workers.c.id)
    if not include_stopped:
        return stmt.where(workers.c.status != "stopped")
    if stopped_limit is not None:
        newest = (
            select(workers.c.id)
            .where(workers.c.status == "stopped")
            .order_by(workers.c.started_at.desc(), workers.c.id.desc())
            .limit(stopped_limit)
        )
        stmt = stmt.where(or_(workers.c.status != "stopped", workers.c.id.in_(newest)))
    return stmt


def held_leader_leases(dialect: str) -> Select[Any]:
    """``(name, holder)`` of the leader leases that have not expired."""
    return select(leader_leases.c.name, leader_leases.c.holder).where(
        leader_leases.c.expires_at > dialects.now(dialect)
    )
