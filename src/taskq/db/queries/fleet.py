"""Statement builders for the operator's view of the fleet: workers, their running jobs,
and who holds the leader leases."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Select, func, select, type_coerce

from taskq.db import dialect as dialects
from taskq.db.tables import jobs, leader_leases, workers
from taskq.db.types import UTCDateTime

__all__ = ["held_leader_leases", "list_workers", "running_by_worker"]


def list_workers(dialect: str, *, include_stopped: bool) -> Select[Any]:
    """Every ``workers`` row (without ``stopped`` ones unless ``include_stopped``), oldest
    first, with the store's clock as ``now`` (heartbeat ages are taken from it)."""
    now = type_coerce(dialects.now(dialect), UTCDateTime()).label("now")
    stmt = select(workers, now).order_by(workers.c.started_at, workers.c.id)
    if not include_stopped:
        stmt = stmt.where(workers.c.status != "stopped")
    return stmt


def running_by_worker() -> Select[Any]:
    """``(locked_by, count)`` of running jobs (the partial index on running rows serves it)."""
    return (
        select(jobs.c.locked_by, func.count())
        .where(jobs.c.status == "running", jobs.c.locked_by.is_not(None))
        .group_by(jobs.c.locked_by)
    )


def held_leader_leases(dialect: str) -> Select[Any]:
    """``(name, holder)`` of the leader leases that have not expired."""
    return select(leader_leases.c.name, leader_leases.c.holder).where(
        leader_leases.c.expires_at > dialects.now(dialect)
    )
