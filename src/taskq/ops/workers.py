# sync twin: src/taskq_sync/ops/workers.py
"""The operator's view of the worker fleet (``tq.workers``): who runs, where, doing what.

A worker writes its own ``workers`` row (id, host, pid, queues, concurrency, status) at
boot and refreshes ``last_heartbeat_at`` while it lives; ``isolated`` means it lost the
database and walked away from its jobs. This module only reads.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from sqlalchemy.ext.asyncio import AsyncEngine

from taskq.db.engine import transaction
from taskq.db.queries import fleet as q

__all__ = ["WorkerInfo", "WorkersClient"]


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    """One worker as its row and the jobs table see it."""

    id: UUID
    hostname: str
    pid: int
    queues: list[str]
    concurrency: int
    status: str
    version: str | None
    started_at: datetime
    last_heartbeat_at: datetime
    stopped_at: datetime | None
    heartbeat_age_s: float
    """Seconds since the last heartbeat, on the store's clock."""
    running_jobs: int
    leader_of: list[str]
    """The leader leases this worker holds now (empty: not a leader)."""

    @property
    def leader(self) -> bool:
        """True when the worker holds any leader lease."""
        return bool(self.leader_of)

    def to_json(self) -> dict[str, Any]:
        """The worker as a JSON object (ids as strings, times as ISO 8601)."""
        return {
            "id": str(self.id),
            "hostname": self.hostname,
            "pid": self.pid,
            "queues": list(self.queues),
            "concurrency": self.concurrency,
            "status": self.status,
            "version": self.version,
            "started_at": self.started_at.isoformat(),
            "last_heartbeat_at": self.last_heartbeat_at.isoformat(),
            "stopped_at": self.stopped_at.isoformat() if self.stopped_at else None,
            "heartbeat_age_s": round(self.heartbeat_age_s, 3),
            "running_jobs": self.running_jobs,
            "leader": self.leader,
            "leader_of": list(self.leader_of),
        }


class WorkersClient:
    """Reads the fleet on ``engine``."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine

    async def list(
        self, *, include_stopped: bool = False, stopped_limit: int | None = None
    ) -> list[WorkerInfo]:
        """Every worker (stopped ones only with ``include_stopped``; with
        ``stopped_limit``, only the newest that many of them), oldest first."""
        dialect = self.engine.dialect.name
        stmt = q.list_workers(dialect, include_stopped=include_stopped, stopped_limit=stopped_limit)
        async with transaction(self.engine, readonly=True) as conn:
            rows = (await conn.execute(stmt)).mappings().all()
            leases: dict[UUID, list[str]] = {}
            for name, holder in (await conn.execute(q.held_leader_leases(dialect))).all():
                leases.setdefault(holder, []).append(str(name))
        return [
            WorkerInfo(
                id=r["id"],
                hostname=str(r["hostname"]),
                pid=int(r["pid"]),
                queues=[str(x) for x in (r["queues"] or [])],
                concurrency=int(r["concurrency"]),
                status=str(r["status"]),
                version=r["version"],
                started_at=r["started_at"],
                last_heartbeat_at=r["last_heartbeat_at"],
                stopped_at=r["stopped_at"],
                heartbeat_age_s=max((r["now"] - r["last_heartbeat_at"]).total_seconds(), 0.0),
                running_jobs=int(r["running_jobs"]),
                leader_of=sorted(leases.get(r["id"], [])),
            )
            for r in rows
        ]
