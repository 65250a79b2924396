"""The sweeps: reclaim rows whose lease expired, and drop results past their TTL.

Leader-gated (one sweeper in the fleet). An expired ``running`` row belongs to a worker
presumed dead: it goes back to ``pending`` with the lost attempt recorded ``crashed``
(that attempt spends budget), or ends ``abandoned`` when the budget is spent, or
``cancelled`` (``CancelAbandoned``) when a cancel was already under way. The write is
fenced on the worker id and attempt read, so a worker that renews at the last moment
keeps its row.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import structlog
from sqlalchemy.ext.asyncio import AsyncEngine

from taskq.actor import ActorRef
from taskq.db.engine import transaction
from taskq.db.queries import dispatch as dq
from taskq.db.queries import worker as wq
from taskq.worker.cancel import CANCEL_ABANDONED
from taskq.worker.telemetry import record_reclaimed

__all__ = ["Sweeper"]

_log = structlog.get_logger("taskq.worker.sweep")
_BATCH: Final = 500
_DEFAULT_MAX_ATTEMPTS: Final = 3


class Sweeper:
    """Runs the leader's sweeps against ``engine``."""

    def __init__(self, engine: AsyncEngine, actors: Mapping[str, ActorRef[Any, Any]]) -> None:
        self._engine = engine
        self._dialect = engine.dialect.name
        self._actors = actors
        self._record = dq.record_attempts(self._dialect)
        self._reclaim = wq.sweep_reclaim(self._dialect)

    def _max_attempts(self, actor: str, stored: int | None) -> int | None:
        if stored is not None:
            return stored
        ref = self._actors.get(actor)
        if ref is None:
            return _DEFAULT_MAX_ATTEMPTS
        if ref.retry.kind == "indefinite":
            return None
        if ref.retry.kind == "non_retryable":
            return 1
        return ref.retry.max_attempts

    async def reclaim_expired(self) -> int:
        """Reclaim every row whose lease expired; returns how many were handled."""
        total = 0
        while True:
            async with transaction(self._engine) as conn:
                rows = (await conn.execute(wq.expired_leases(self._dialect, _BATCH))).all()
                if not rows:
                    return total
                params: list[dict[str, Any]] = []
                for row in rows:
                    limit = self._max_attempts(row.actor, row.max_attempts)
                    if row.cancel_phase > 0:
                        status, outcome, error_class = "cancelled", "abandoned", CANCEL_ABANDONED
                    elif limit is not None and row.budget_used + 1 >= limit:
                        status, outcome, error_class = "abandoned", "abandoned", "LeaseExpired"
                    else:
                        status, outcome, error_class = "pending", "crashed", "LeaseExpired"
                    params.append(
                        {
                            "b_id": row.id,
                            "b_worker": row.locked_by,
                            "b_attempt": row.attempt,
                            "b_outcome": outcome,
                            "b_status": status,
                            "b_error_class": error_class,
                            "b_error": f"lease of worker {row.locked_by} expired",
                            "b_traceback": None,
                        }
                    )
                    record_reclaimed(row.actor, status)
                    _log.warning(
                        "job-reclaimed",
                        job_id=str(row.id),
                        actor=row.actor,
                        attempt=row.attempt,
                        disposition=status,
                        worker_id=str(row.locked_by),
                    )
                await conn.execute(self._record, params)
                await conn.execute(self._reclaim, params)
            total += len(rows)
            if len(rows) < _BATCH:
                return total

    async def expire_results(self) -> int:
        """Null out results whose ``result_ttl`` ran out; returns how many."""
        async with transaction(self._engine) as conn:
            result = await conn.execute(wq.expire_results(self._dialect))
        return int(result.rowcount or 0)

    async def queue_depth(self) -> list[tuple[str, str, int]]:
        """``(queue, status, count)`` of the jobs waiting to run (``taskq.queue.depth``).

        A read: on SQLite it must not take the write lock (``BEGIN IMMEDIATE``), or it
        would queue behind the writers for up to the busy timeout, holding up shutdown.
        """
        async with transaction(self._engine, readonly=True) as conn:
            rows = (await conn.execute(wq.queue_depth())).all()
        return [(queue, status, int(count)) for queue, status, count in rows]

    async def run_once(self) -> None:
        """One full sweep (the caller checks leadership first)."""
        reclaimed = await self.reclaim_expired()
        expired = await self.expire_results()
        if reclaimed or expired:
            _log.info("worker-sweep", reclaimed=reclaimed, results_expired=expired)
