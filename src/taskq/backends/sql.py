"""``SqlBackend``: the job store on a SQLAlchemy engine, for Postgres and SQLite alike.

Enqueue runs the actors page's checks in order inside one transaction. Single-flight
``unique_for`` and exact ``max_pending`` need the check and the insert serialised: on
Postgres a transaction-scoped advisory lock per (actor, identity) or per actor does it,
on SQLite the ``BEGIN IMMEDIATE`` write lock already has. Singleton and idempotency
collisions are caught by their unique indexes with ``ON CONFLICT DO NOTHING``, so a
caller's transaction is never aborted by one. Requests with no checks go in one
multi-row INSERT: one round trip for a whole ``enqueue_many``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import timedelta
from uuid import UUID

import structlog
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from taskq._acompat import asleep
from taskq.db.dialect import advisory_xact_lock, translate_error
from taskq.db.engine import transaction
from taskq.db.queries import jobs as q
from taskq.db.queries.dispatch import notify_enqueued
from taskq.exceptions import MaxPendingExceededError, SingletonCollisionError
from taskq.records import AttemptRecord, EnqueueOutcome, EnqueueRequest, JobRecord
from taskq.settings import TaskQSettings

__all__ = ["PostgresBackend", "SqlBackend", "SqliteBackend"]

_log = structlog.get_logger("taskq.enqueue")
_CHUNK = {"postgresql": 1000, "sqlite": 400}  # rows per INSERT, under each bind-parameter limit


class SqlBackend:
    """The job store on ``engine`` (which the caller owns and disposes of)."""

    def __init__(self, engine: AsyncEngine, *, settings: TaskQSettings | None = None) -> None:
        self.engine = engine
        self.dialect: str = engine.dialect.name
        resolved = settings or TaskQSettings.load()
        self._ttl = resolved.actor_config_cache_ttl.total_seconds()
        self._schema = resolved.schema_name
        self._stored_cap: dict[str, tuple[float, int | None]] = {}

    async def enqueue(
        self, requests: Sequence[EnqueueRequest], *, connection: AsyncConnection | None = None
    ) -> list[EnqueueOutcome]:
        """Apply ``requests`` in one transaction (or in the caller's, given ``connection``)."""
        if connection is not None:
            try:
                return await self._enqueue_on(connection, requests)
            except DBAPIError as exc:
                translated = translate_error(exc)
                if translated is exc:
                    raise
                raise translated from exc
        async with transaction(self.engine) as conn:
            return await self._enqueue_on(conn, requests)

    async def _enqueue_on(
        self, conn: AsyncConnection, requests: Sequence[EnqueueRequest]
    ) -> list[EnqueueOutcome]:
        caps: dict[str, int | None] = {}
        for req in requests:
            if req.actor not in caps:
                caps[req.actor] = await self._effective_cap(conn, req)
        outcomes: dict[int, EnqueueOutcome] = {}
        bulk = [i for i, r in enumerate(requests) if r.plain and caps[r.actor] is None]
        size = _CHUNK.get(self.dialect, 400)
        for start in range(0, len(bulk), size):
            chunk = bulk[start : start + size]
            params = [q.job_params(requests[i]) for i in chunk]
            rows = (await conn.execute(q.insert_jobs(self.dialect), params)).mappings().all()
            by_id = {row["id"]: JobRecord.from_mapping(row) for row in rows}
            for i in chunk:
                outcomes[i] = EnqueueOutcome(by_id[requests[i].job_id])
        for i, req in enumerate(requests):
            if i not in outcomes:
                outcomes[i] = await self._enqueue_one(conn, req, caps[req.actor])
        if self.dialect == "postgresql":  # wake LISTENing workers at commit
            for queue in sorted({r.queue for r in requests}):
                await conn.execute(notify_enqueued(self._schema, queue))
        return [outcomes[i] for i in range(len(requests))]

    async def _effective_cap(self, conn: AsyncConnection, req: EnqueueRequest) -> int | None:
        now = time.monotonic()
        cached = self._stored_cap.get(req.actor)
        if cached is None or now - cached[0] >= self._ttl:
            stored = (await conn.execute(q.stored_max_pending(req.actor))).scalar()
            cached = (now, stored)
            self._stored_cap[req.actor] = cached
        stored_cap = cached[1]
        return stored_cap if stored_cap is not None else req.max_pending

    async def _lock(self, conn: AsyncConnection, key: str) -> None:
        stmt = advisory_xact_lock(self.dialect, key)
        if stmt is not None:
            await conn.execute(stmt)

    async def _enqueue_one(
        self, conn: AsyncConnection, req: EnqueueRequest, cap: int | None
    ) -> EnqueueOutcome:
        if req.unique_for is not None and req.identity_key is not None:
            await self._lock(conn, q.advisory_key("unique", req.actor, req.identity_key))
            row = (await conn.execute(q.unique_match(self.dialect, req))).mappings().first()
            if row is not None:
                return _deduplicated(JobRecord.from_mapping(row))
        if req.singleton:
            blocking = (await conn.execute(q.active_singleton(req.actor))).mappings().first()
            if blocking is not None:
                stc = blocking["schedule_to_close_s"]
                raise SingletonCollisionError(
                    req.actor, blocking["id"], timedelta(seconds=stc) if stc is not None else None
                )
        if cap is not None:
            await self._lock(conn, q.advisory_key("max_pending", req.actor))
            count = int((await conn.execute(q.count_pending(req.actor))).scalar_one())
            if count >= cap:
                raise MaxPendingExceededError(req.actor, count, cap)
        stmt = q.insert_jobs(self.dialect, skip_conflicts=True)
        inserted = (await conn.execute(stmt, [q.job_params(req)])).mappings().first()
        if inserted is not None:
            return EnqueueOutcome(JobRecord.from_mapping(inserted))
        if req.idempotency_key is not None:
            match = q.idempotent_match(req.actor, req.idempotency_key)
            row = (await conn.execute(match)).mappings().first()
            if row is not None:
                return EnqueueOutcome(JobRecord.from_mapping(row), was_existing=True)
        if req.singleton:
            raise SingletonCollisionError(req.actor, None)
        raise RuntimeError(f"job {req.job_id} was not inserted and no conflicting row was found")

    async def get_job(self, job_id: UUID) -> JobRecord | None:
        """The job's current row, or ``None``."""
        async with transaction(self.engine, readonly=True) as conn:
            row = (await conn.execute(q.get(job_id))).mappings().first()
        return JobRecord.from_mapping(row) if row is not None else None

    async def get_attempts(self, job_id: UUID) -> list[AttemptRecord]:
        """The job's attempts, oldest first."""
        async with transaction(self.engine, readonly=True) as conn:
            rows = (await conn.execute(q.attempts(job_id))).mappings().all()
        return [AttemptRecord.from_mapping(row) for row in rows]

    async def cancel_job(self, job_id: UUID) -> JobRecord | None:
        """Cancel (see :func:`taskq.db.queries.jobs.cancel`); ``None`` if the job is unknown."""
        async with transaction(self.engine) as conn:
            row = (await conn.execute(q.cancel(self.dialect, job_id))).mappings().first()
            if row is None:
                row = (await conn.execute(q.get(job_id))).mappings().first()
        return JobRecord.from_mapping(row) if row is not None else None

    async def wait_for(self, job_id: UUID, timeout: float | None) -> JobRecord | None:  # noqa: ASYNC109
        """Poll the row (20 ms doubling to 500 ms) until it is terminal or ``timeout`` passes."""
        deadline = None if timeout is None else time.monotonic() + timeout
        interval = 0.02
        while True:
            record = await self.get_job(job_id)
            if record is None or record.is_terminal:
                return record
            if deadline is not None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return record
                interval = min(interval, remaining)
            await asleep(interval)
            interval = min(interval * 2, 0.5)


def _deduplicated(record: JobRecord) -> EnqueueOutcome:
    outcome = EnqueueOutcome(record, was_existing=True)
    if outcome.deduplicated_onto_terminal:
        _log.warning(
            "enqueue_deduplicated",
            actor=record.actor,
            job_id=str(record.id),
            identity_key=record.identity_key,
            matched_status=record.status,
        )
    return outcome


class PostgresBackend(SqlBackend):
    """:class:`SqlBackend` on a ``postgresql+psycopg`` engine (the production store)."""


class SqliteBackend(SqlBackend):
    """:class:`SqlBackend` on a ``sqlite+aiosqlite`` engine (the embedded store)."""
