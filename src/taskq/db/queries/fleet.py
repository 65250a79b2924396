"""Statement builders for the operator's view of the fleet: workers, their running jobs,
and who holds the leader leases."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Select, func, select, type_coerce

from taskq.db import dialect as dialects
from taskq.db.tables import jobs, leader_leases, workers
from taskq.db.types import UTCDateTime

__all__ = ["held_leader_leases", "list_workers"]


def list_workers(dialect: str, *, include_stopped: bool) -> Select[Any]:
    """Every ``workers`` row (without ``stopped`` ones unless ``include_stopped``), oldest
    first, with the store's clock as ``now`` (heartbeat ages are taken from it) and
    ``running_jobs``: the worker's running jobs, counted on ``ix_jobs_running_worker`` (a
    worker's own entries, at most its concurrency; never every running row)."""
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
        stmt = stmt.where(workers.c.status != "stopped")
    return stmt


def held_leader_leases(dialect: str) -> Select[Any]:
    """``(name, holder)`` of the leader leases that have not expired."""
    return select(leader_leases.c.name, leader_leases.c.holder).where(
        leader_leases.c.expires_at > dialects.now(dialect)
    )
