# sync twin: src/taskq_sync/ops/jobs.py
"""Job operations for operators: list, count, detail, cancel_where, retry, purge.

:class:`JobOperations` is mixed into :class:`taskq.client.JobsClient`, so ``tq.jobs``
carries them (and ``taskq_sync``'s ``tq.jobs`` the blocking twins). The CLI and the
admin UI call exactly these methods.

Bulk actions run in bounded batches, each its own short transaction (on Postgres its
rows are taken ``FOR UPDATE SKIP LOCKED``, so a batch never waits behind a worker and
a concurrent enqueue never waits behind the batch). ``on_batch`` is called after each
batch with the running total, for progress reporting.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any, cast
from uuid import UUID

import structlog
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from taskq._acompat import asleep
from taskq._ids import as_job_id
from taskq.backends.base import Backend
from taskq.constants import TERMINAL_STATUSES
from taskq.db.engine import transaction
from taskq.db.queries import job_ops as q
from taskq.db.queries.dispatch import notify_enqueued
from taskq.exceptions import JobNotFoundError, JobNotRetryableError, SingletonCollisionError
from taskq.job_filter import JobFilter, decode_cursor, encode_cursor
from taskq.ops.results import (
    RETRIES_KEY,
    AttemptDetail,
    CancelResult,
    JobCount,
    JobDetail,
    JobPage,
    PurgeResult,
    RetryResult,
)
from taskq.records import AttemptRecord, JobRecord

__all__ = ["DEFAULT_BATCH_SIZE", "DEFAULT_COUNT_CAP", "MAX_PAGE_SIZE", "JobOperations"]

_log = structlog.get_logger("taskq.ops")

DEFAULT_BATCH_SIZE = 1000
"""Rows per batch of ``cancel_where``, ``retry_where`` and ``purge``."""
DEFAULT_COUNT_CAP = 10_000
"""Where ``count`` stops counting unless told otherwise."""
MAX_PAGE_SIZE = 1000
"""The largest ``limit`` of one ``list`` page."""
_CANCEL_PASSES = 3
"""Passes ``cancel_where`` makes over rows a concurrent transaction held (skipped)."""

Progress = Callable[[int], None]


def _positive(value: object, name: str, *, maximum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name} must be at most {maximum}, got {value}")
    return value


def _filter(flt: object) -> JobFilter:
    if flt is None:
        return JobFilter()
    if not isinstance(flt, JobFilter):
        raise TypeError(f"expected a JobFilter, got {type(flt).__name__}")
    return flt


def _schema(engine: AsyncEngine) -> str:
    mapping = engine.get_execution_options().get("schema_translate_map") or {}
    return str(mapping.get(None) or "taskq")


class JobOperations:
    """The operator's job operations, on the client's SQL backend (``self.backend``)."""

    backend: Backend

    def _engine(self) -> AsyncEngine:
        engine = getattr(self.backend, "engine", None)
        if engine is None:
            raise TypeError(
                "job operations need a SQL backend (PostgresBackend or SqliteBackend), "
                f"not {type(self.backend).__name__}"
            )
        return cast(AsyncEngine, engine)

    # -- reads ----------------------------------------------------------------------

    async def list(
        self,
        filter: JobFilter | None = None,
        *,
        limit: int = 50,
        after: str | None = None,
    ) -> JobPage:
        """Up to ``limit`` (at most :data:`MAX_PAGE_SIZE`) jobs matching ``filter``, newest
        first; pass the page's ``next_cursor`` as ``after`` for the next one (a keyset:
        pages stay fast however deep, and rows inserted meanwhile do not shift them)."""
        flt = _filter(filter)
        size = _positive(limit, "limit", maximum=MAX_PAGE_SIZE)
        keyset = decode_cursor(after) if after is not None else None
        engine = self._engine()
        stmt = q.list_page(engine.dialect.name, flt, size + 1, keyset)
        async with transaction(engine, readonly=True) as conn:
            rows = (await conn.execute(stmt)).mappings().all()
        records = [JobRecord.from_mapping(r) for r in rows[:size]]
        cursor = None
        if len(rows) > size:
            last = rows[size - 1]
            at = last["cursor_created_at"]
            cursor = encode_cursor(at if isinstance(at, str) else at.isoformat(), last["id"])
        return JobPage(records, cursor)

    async def count(
        self,
        filter: JobFilter | None = None,
        *,
        cap: int = DEFAULT_COUNT_CAP,
    ) -> JobCount:
        """How many jobs match ``filter``, counting no further than ``cap`` (so it stays
        cheap on a big table): ``JobCount(count, capped, cap)``, ``capped`` meaning "at
        least ``cap``"."""
        flt = _filter(filter)
        limit = _positive(cap, "cap")
        engine = self._engine()
        async with transaction(engine, readonly=True) as conn:
            n = int(
                (await conn.execute(q.count_capped(engine.dialect.name, flt, limit))).scalar_one()
            )
        return JobCount(min(n, limit), n > limit, limit)

    async def detail(self, job_id: UUID | str) -> JobDetail:
        """The job and every attempt (outcome, error, traceback), in one read;
        ``JobNotFoundError`` when there is no such job."""
        job_id = as_job_id(job_id)
        engine = self._engine()
        async with transaction(engine, readonly=True) as conn:
            row = (await conn.execute(q.select_job(job_id))).mappings().first()
            if row is None:
                raise JobNotFoundError(job_id)
            attempts = (await conn.execute(q.attempts_of(job_id))).mappings().all()
        return JobDetail(
            JobRecord.from_mapping(row),
            [AttemptDetail(AttemptRecord.from_mapping(a), a["traceback"]) for a in attempts],
        )

    # -- cancel ---------------------------------------------------------------------

    async def cancel_where(
        self,
        filter: JobFilter,
        *,
        batch_size: int = DEFAULT_BATCH_SIZE,
        on_batch: Progress | None = None,
    ) -> CancelResult:
        """Cancel every active job matching ``filter``.

        Pending and scheduled jobs end ``cancelled`` at once (``CancelledBeforeStart``).
        Running ones are stamped ``cancel_phase = 1``, the same request ``cancel()``
        makes: the worker holding each walks the cancel ladder (cooperative, forced
        after ``cancellation_grace_period``, abandoned after the cleanup grace).
        Finished jobs are left alone. Returns the counts by outcome.
        """
        flt = _filter(filter)
        size = _positive(batch_size, "batch_size")
        engine = self._engine()
        dialect = engine.dialect.name
        queued = q.cancel_queued_batch(dialect, flt, size)
        running = q.request_cancel_batch(dialect, flt, size)
        remaining = q.remaining_cancellable(dialect, flt)
        before = requested = left = 0
        for pass_no in range(_CANCEL_PASSES):
            if queued is not None:
                before += await _drain(engine, queued, size, before + requested, on_batch)
            if running is not None:
                requested += await _drain(engine, running, size, before + requested, on_batch)
            if remaining is None:
                break
            async with transaction(engine, readonly=True) as conn:
                left = int((await conn.execute(remaining)).scalar_one())
            if not left:
                break
            if pass_no + 1 < _CANCEL_PASSES:
                await asleep(0.05 * (pass_no + 1))  # let the holder's transaction end
        result = CancelResult(before, requested, left)
        _log.info("jobs-cancel-where", filter=flt.to_json(), **result.to_json())
        return result

    # -- retry ----------------------------------------------------------------------

    async def retry(self, job_id: UUID | str) -> JobRecord:
        """Put a failed, cancelled, crashed or abandoned job back to ``pending`` with a
        fresh retry budget; the retry is recorded in ``metadata["taskq.retries"]``.

        ``JobNotFoundError`` if there is no such job, ``JobNotRetryableError`` if it is
        active or succeeded, ``SingletonCollisionError`` if it is a singleton whose actor
        already has an active job. Nothing changes in any of those cases.
        """
        job_id = as_job_id(job_id)
        engine = self._engine()
        async with transaction(engine) as conn:
            row = (await conn.execute(q.select_job(job_id, for_update=True))).mappings().first()
            if row is None:
                raise JobNotFoundError(job_id)
            if row["status"] not in q.RETRYABLE:
                raise JobNotRetryableError(job_id, str(row["status"]))
            done = await _retry_rows(conn, [row])
            if done.singleton_blocked:
                raise SingletonCollisionError(str(row["actor"]), None)
            fresh = (await conn.execute(q.select_job(job_id))).mappings().one()
        _log.info("job-retried", job_id=str(job_id), from_status=row["status"])
        return JobRecord.from_mapping(fresh)

    async def retry_where(
        self,
        filter: JobFilter,
        *,
        batch_size: int = DEFAULT_BATCH_SIZE,
        on_batch: Progress | None = None,
    ) -> RetryResult:
        """:meth:`retry` every retryable job matching ``filter``, in batches. Singleton
        jobs whose actor already has an active job are left as they are and listed in
        ``singleton_blocked``; the others are retried."""
        flt = _filter(filter)
        size = _positive(batch_size, "batch_size")
        engine = self._engine()
        dialect = engine.dialect.name
        retried = 0
        by_status: dict[str, int] = {}
        blocked: list[UUID] = []
        after: UUID | None = None
        while True:
            stmt = q.retry_candidates(dialect, flt, size, after=after)
            if stmt is None:
                break
            async with transaction(engine) as conn:
                rows = (await conn.execute(stmt)).mappings().all()
                if not rows:
                    break
                done = await _retry_rows(conn, rows)
            # Retried rows no longer match; the keyset steps past the ones left (blocked
            # singletons) so no row is read twice.
            after = max([r["id"] for r in rows])
            retried += done.retried
            for status, n in done.by_status.items():
                by_status[status] = by_status.get(status, 0) + n
            blocked.extend(done.singleton_blocked)
            if on_batch is not None:
                on_batch(retried)
            if len(rows) < size:
                break
        result = RetryResult(retried, by_status, blocked)
        _log.info("jobs-retry-where", filter=flt.to_json(), **result.to_json())
        return result

    # -- purge ----------------------------------------------------------------------

    async def purge(
        self,
        older_than: timedelta,
        statuses: Sequence[str] = TERMINAL_STATUSES,
        *,
        batch_size: int = DEFAULT_BATCH_SIZE,
        on_batch: Progress | None = None,
    ) -> PurgeResult:
        """Delete finished jobs (in ``statuses``, terminal ones only) whose ``finished_at``
        is more than ``older_than`` ago, with their attempts, ``batch_size`` rows per
        transaction. Active jobs are never purged: a non-terminal status is a
        ``ValueError``."""
        if not isinstance(older_than, timedelta):
            raise TypeError(f"older_than must be a timedelta, got {type(older_than).__name__}")
        if older_than < timedelta(0):
            raise ValueError(f"older_than must not be negative, got {older_than}")
        if isinstance(statuses, str):
            statuses = (statuses,)
        chosen = tuple(dict.fromkeys(statuses))
        bad = [s for s in chosen if s not in TERMINAL_STATUSES]
        if bad or not chosen:
            raise ValueError(
                f"purge takes terminal statuses only ({', '.join(TERMINAL_STATUSES)}), "
                f"got {list(chosen)!r}"
            )
        size = _positive(batch_size, "batch_size")
        engine = self._engine()
        pick = q.purge_batch_ids(engine.dialect.name, older_than, chosen, size)
        deleted = batches = 0
        while True:
            async with transaction(engine) as conn:
                ids = list((await conn.execute(pick)).scalars())
                if ids:
                    await conn.execute(q.purge_attempts(ids))
                    deleted += (await conn.execute(q.purge_batch(ids))).rowcount
            if not ids:
                break
            batches += 1
            if on_batch is not None:
                on_batch(deleted)
            if len(ids) < size:
                break
        result = PurgeResult(deleted, batches)
        _log.info(
            "jobs-purged",
            older_than_s=older_than.total_seconds(),
            statuses=chosen,
            **result.to_json(),
        )
        return result


async def _drain(
    engine: AsyncEngine, stmt: Any, size: int, done: int, on_batch: Progress | None
) -> int:
    """Run a batch statement until it changes fewer than ``size`` rows; how many it changed."""
    total = 0
    while True:
        async with transaction(engine) as conn:
            n = len((await conn.execute(stmt)).all())
        total += n
        if n and on_batch is not None:
            on_batch(done + total)
        if n < size:
            return total


async def _retry_rows(conn: AsyncConnection, rows: Sequence[Any]) -> RetryResult:
    """Retry ``rows`` (from :func:`~taskq.db.queries.job_ops.retry_candidates`) on ``conn``.

    Plain rows go in one executemany; each singleton in its own savepoint, since one
    whose actor already has an active job hits the unique index (and is then skipped).
    """
    dialect = conn.dialect.name
    now = (await conn.execute(q.store_now(dialect))).scalar_one()
    stmt = q.retry_row(dialect)

    def params(row: Any) -> dict[str, Any]:
        metadata = dict(row["metadata"] or {})
        history = metadata.get(RETRIES_KEY)
        entries = list(history) if isinstance(history, list) else []
        entries.append(
            {
                "at": now.isoformat(),
                "from_status": row["status"],
                "error_class": row["error_class"],
                "after_attempt": row["attempt"],
            }
        )
        metadata[RETRIES_KEY] = entries
        return {"b_id": row["id"], "b_metadata": metadata}

    plain = [r for r in rows if not r["singleton"]]
    by_status: dict[str, int] = {}
    retried: list[Any] = []
    if plain:
        await conn.execute(stmt, [params(r) for r in plain])
        retried.extend(plain)
    blocked: list[UUID] = []
    for row in rows:
        if not row["singleton"]:
            continue
        try:
            async with conn.begin_nested():
                await conn.execute(stmt, [params(row)])
        except IntegrityError:
            blocked.append(row["id"])
            continue
        retried.append(row)
    for row in retried:
        by_status[str(row["status"])] = by_status.get(str(row["status"]), 0) + 1
    if dialect == "postgresql" and retried:
        schema = _schema(conn.engine)
        for queue in sorted({str(r["queue"]) for r in retried}):
            await conn.execute(notify_enqueued(schema, queue))
    return RetryResult(len(retried), by_status, blocked)
