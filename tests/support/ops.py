"""Shared by the operations tests: rows written straight into the job store in any state,
standing in for enqueues and workers, so filters and bulk actions have something to match."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

from sqlalchemy import insert, select
from sqlalchemy.ext.asyncio import AsyncEngine

from taskq.db.tables import job_attempts, jobs

BASE = datetime(2026, 1, 1, tzinfo=UTC)


async def seed(
    engine: AsyncEngine,
    n: int = 1,
    *,
    actor: str = "ops_actor",
    status: str = "pending",
    start: datetime = BASE,
    step: timedelta = timedelta(seconds=1),
    **columns: Any,
) -> list[UUID]:
    """Insert ``n`` jobs created ``step`` apart from ``start``; return their ids in order."""
    ids = [uuid.uuid4() for _ in range(n)]
    finished = status in ("succeeded", "failed", "cancelled", "crashed", "abandoned")
    rows = []
    for i, job_id in enumerate(ids):
        created = start + step * i
        row: dict[str, Any] = {
            "id": job_id,
            "actor": actor,
            "queue": "default",
            "status": status,
            "payload": {"i": i},
            "scheduled_at": created,
            "created_at": created,
            "updated_at": created,
            "finished_at": created + timedelta(seconds=5) if finished else None,
        }
        row.update(columns)
        rows.append(row)
    async with engine.begin() as conn:
        await conn.execute(insert(jobs), rows)
    return ids


async def add_attempt(engine: AsyncEngine, job_id: UUID, attempt: int, outcome: str) -> None:
    """Record one finished attempt of ``job_id``."""
    async with engine.begin() as conn:
        await conn.execute(
            insert(job_attempts).values(
                job_id=job_id,
                attempt=attempt,
                outcome=outcome,
                error_class="Boom" if outcome != "succeeded" else None,
                error="boom" if outcome != "succeeded" else None,
                traceback="Traceback ...\nBoom: boom" if outcome != "succeeded" else None,
                started_at=BASE + timedelta(seconds=attempt),
                finished_at=BASE + timedelta(seconds=attempt, milliseconds=500),
            )
        )


async def rows(engine: AsyncEngine) -> dict[UUID, Any]:
    """Every job row by id."""
    async with engine.connect() as conn:
        return {r.id: r for r in (await conn.execute(select(jobs))).all()}


async def attempts(engine: AsyncEngine) -> list[Any]:
    """Every attempt row."""
    async with engine.connect() as conn:
        return list((await conn.execute(select(job_attempts))).all())
