"""Leader election with a lease row: one worker runs the fleet-wide sweeps.

Each worker tries :func:`~taskq.db.queries.worker.acquire_leader` on every heartbeat. The
upsert takes the row only when it is free, expired or already ours, so at most one
holder exists at a time; when the leader dies its lease expires after ``lock_lease`` and
the next heartbeat of any other worker takes over.

Cron does not use the lease: every worker ticks its actors' schedules and the database
arbitrates each tick (see :mod:`taskq.cron.ticker`), so a failover opens no gap.
"""

from __future__ import annotations

from typing import Final
from uuid import UUID

import structlog
from sqlalchemy.ext.asyncio import AsyncEngine

from taskq.db.engine import transaction
from taskq.db.queries import worker as wq

__all__ = ["SWEEP_LEADER", "LeaderLease"]

SWEEP_LEADER: Final = "sweep"
_log = structlog.get_logger("taskq.worker.leader")


class LeaderLease:
    """This worker's view of one leader lease (``is_leader`` after the last renewal)."""

    def __init__(
        self, engine: AsyncEngine, worker_id: UUID, lease_s: float, name: str = SWEEP_LEADER
    ) -> None:
        self._engine = engine
        self._worker_id = worker_id
        self._lease_s = lease_s
        self.name = name
        self.is_leader = False

    async def renew(self) -> bool:
        """Take or extend the lease; returns whether this worker now leads."""
        stmt = wq.acquire_leader(
            self._engine.dialect.name, name=self.name, holder=self._worker_id, lease_s=self._lease_s
        )
        async with transaction(self._engine) as conn:
            holder = (await conn.execute(stmt)).scalar()
        leading = holder == self._worker_id
        if leading != self.is_leader:
            _log.info("worker-leader-changed", lease=self.name, leader=leading)
        self.is_leader = leading
        return leading

    async def release(self) -> None:
        """Give the lease up (shutdown), so a successor need not wait for it to expire."""
        if not self.is_leader:
            return
        async with transaction(self._engine) as conn:
            await conn.execute(wq.release_leader(self.name, self._worker_id))
        self.is_leader = False
