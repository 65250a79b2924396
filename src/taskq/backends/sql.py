# sync twin: src/taskq_sync/backends/sql.py
"""``SqlBackend``: the job store on a SQLAlchemy engine, for Postgres and SQLite alike.

Enqueue runs the actors page's checks in order inside one transaction. Single-flight
``unique_for`` and exact ``max_pending`` need the check and the insert serialised: on
Postgres a transaction-scoped advisory lock per (actor, identity) or per actor does it,
on SQLite the ``BEGIN IMMEDIATE`` write lock already has. Singleton and idempotency
collisions are caught by their unique indexes with ``ON CONFLICT DO NOTHING``, so a
caller's transaction is never aborted by one.

The plain path (no ``unique_for`` identity, no singleton, no idempotency key, no
``max_pending``) is the hot one. On Postgres it is ONE statement on an autocommit
connection, one round trip whether it carries one job or a whole ``enqueue_many``: the
rows travel as one JSON document, the ``pg_notify`` that wakes the workers rides in the
same statement (:func:`taskq.db.queries.jobs.insert_rows_sql`). A pooled connection
found dead by that statement is retried once, safely: see :meth:`SqlBackend._enqueue_plain`.

That statement runs on a connection the backend keeps checked out between enqueues
(:class:`~taskq.backends.held.HeldConnections`): a pool checkout and checkin, with the
switch to autocommit and back, cost more client CPU than the statement itself.

A plain ``enqueue_many`` of at least ``SqlBackend.copy_min_rows`` jobs is written with
binary ``COPY`` instead, in one transaction on a held connection: four more round trips,
but less server work per job than the statement (:meth:`SqlBackend._enqueue_copy`). In
a transaction (the caller's ``connection=``, or the backend's own for a batch with
checked items) the plain items are one COPY too (:meth:`SqlBackend._copy_in_transaction`).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any, NoReturn
from uuid import UUID

import psycopg
import structlog
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from taskq._acompat import ASYNC, asleep
from taskq._ids import uuid_from_int
from taskq.backends.held import HeldConnections
from taskq.bulk_rows import BulkOutcomes, BulkRows
from taskq.db.caller_connection import CallerConnection, caller_connection
from taskq.db.dialect import advisory_xact_lock, traits, translate_error
from taskq.db.engine import on_schema, transaction, with_schema
from taskq.db.queries import copy_rows as cq
from taskq.db.queries import jobs as q
from taskq.db.queries.dispatch import notify_channel, notify_enqueued
from taskq.exceptions import MaxPendingExceededError, SingletonCollisionError, UndecodableJob
from taskq.records import (
    AttemptRecord,
    EnqueueOutcome,
    EnqueueRequest,
    JobRecord,
)
from taskq.request_batch import RequestBatch
from taskq.settings import TaskQSettings

__all__ = [
    "COPY_MIN_ROWS",
    "PostgresBackend",
    "SqlBackend",
    "SqliteBackend",
]

_log = structlog.get_logger("taskq.enqueue")
_ROWS_PER_STATEMENT = 5000
"""Postgres: jobs per JSON-document INSERT. An ``enqueue_many`` up to this size is one
autocommit statement; a larger one is split into statements inside one transaction."""
COPY_MIN_ROWS = 250
"""Postgres: a plain batch of at least this many jobs is written with COPY (the default of
``SqlBackend.copy_min_rows``). COPY costs a fixed ~0.4 ms more client CPU per batch (four
more round trips: BEGIN, the clock reading, COPY in two) and saves server time per row;
measured on the reference machine, the two paths take the same wall time at ~200 jobs,
COPY is ~10% faster at 300 and ~27% at 1,000. Below the threshold: the one statement."""


class SqlBackend:
    """The job store on ``engine`` (which the caller owns and disposes of).

    ``held_connections``: how many idle autocommit connections the plain enqueue may
    keep checked out between calls (:class:`HeldConnections`; Postgres only). ``TaskQ``
    passes :func:`held_connections_cap`; a backend that holds any must be closed with
    :meth:`aclose` before its engine is disposed of. The default, 0, checks a connection
    out of the pool for every enqueue and needs no closing.
    """

    def __init__(
        self,
        engine: AsyncEngine,
        *,
        settings: TaskQSettings | None = None,
        schema: str | None = None,
        held_connections: int = 0,
    ) -> None:
        # An engine the user made has no schema map: taskq's view of it gets one
        # (``schema``, else the settings', else the map the engine carries).
        self.engine = engine = with_schema(engine, schema=schema, settings=settings)
        self.dialect: str = engine.dialect.name
        resolved = settings or TaskQSettings.load()
        self.settings: TaskQSettings | None = resolved
        self._ttl = resolved.actor_config_cache_ttl.total_seconds()
        self._translate: dict[str | None, str | None] = dict(
            engine.get_execution_options().get("schema_translate_map") or {}
        )
        """Where taskq's tables live, applied to every statement this backend runs (on a
        caller's ``connection=`` too, through :func:`~taskq.db.engine.on_schema`)."""
        self._schema = str(self._translate.get(None) or schema or resolved.schema_name)
        self._channel = notify_channel(self._schema)
        self._stored_cap: dict[str, tuple[float, int | None]] = {}
        # The one-statement insert needs psycopg's named parameters (any Postgres engine
        # that taskq builds); another driver takes the Core path.
        self._doc_insert = (
            traits(self.dialect).document_batches and engine.dialect.driver == "psycopg"
        )
        self._autocommit = engine.execution_options(isolation_level="AUTOCOMMIT")
        self._plain_sql_cache: dict[bool, str] = {}
        self._one_sql: str | None = None
        if held_connections < 0:
            raise ValueError(f"held_connections must be >= 0, got {held_connections}")
        self.held = HeldConnections(self._autocommit, held_connections if self._doc_insert else 0)
        """The autocommit connections the plain enqueue keeps between calls."""
        self.copy_min_rows = COPY_MIN_ROWS
        """Postgres: plain batches (or the plain items of a transactional batch) of at
        least this many jobs are written with COPY (:meth:`_enqueue_copy`,
        :meth:`_copy_in_transaction`); smaller ones with the one statement."""
        self._copy_sql: dict[tuple[bool, bool, bool], str] = {}
        self._scheduled_default = True
        """Whether ``jobs.scheduled_at`` has its default (migration 0002): until a COPY
        finds it missing, bulk batches that run now leave it to the server."""

    def _copy_rows_sql(self, conn: AsyncConnection, *, clock: bool, extras: bool, rows: int) -> str:
        """:func:`~taskq.db.queries.copy_rows.copy_rows_sql` for this engine and a COPY of
        ``rows`` rows (row at a time for :data:`~taskq.db.queries.copy_rows.ROW_AT_A_TIME_ROWS`),
        made once."""
        key = (clock, extras, rows in cq.ROW_AT_A_TIME_ROWS)
        sql = self._copy_sql.get(key)
        if sql is None:
            sql = self._copy_sql[key] = cq.copy_rows_sql(
                conn.dialect,
                self._translate,
                clock=clock,
                extras=extras,
                row_at_a_time=key[2],
            )
        return sql

    async def aclose(self) -> None:
        """Return the connections this backend holds to the engine's pool.

        Call it before disposing of the engine (``TaskQ`` does): ``dispose`` closes only
        the connections checked in to the pool. Idempotent; a no-op when none are held.
        """
        await self.held.aclose()

    async def enqueue(
        self, requests: Sequence[EnqueueRequest], *, connection: CallerConnection | None = None
    ) -> list[EnqueueOutcome]:
        """Apply ``requests`` in one transaction (or in the caller's, given ``connection``:
        a SQLAlchemy or psycopg connection, see :mod:`taskq.db.caller_connection`)."""
        if (
            connection is None
            and self._doc_insert
            and all([req.uncapped_plain for req in requests])
        ):
            if len(requests) >= self.copy_min_rows:
                copied = await self._enqueue_copy(RequestBatch.of(requests))
                if copied is not None:
                    return list(copied)
            if len(requests) <= _ROWS_PER_STATEMENT:
                outcomes = await self._enqueue_plain(requests)
                if outcomes is not None:
                    return outcomes
        if connection is not None:
            try:
                async with (
                    caller_connection(connection) as conn,
                    on_schema(conn, self._translate),
                ):
                    return await self._enqueue_on(conn, requests)
            except DBAPIError as exc:
                _raise_translated(exc)
        async with transaction(self.engine) as conn:
            return await self._enqueue_on(conn, requests)

    async def enqueue_batch(self, batch: RequestBatch) -> Sequence[EnqueueOutcome]:
        """:meth:`enqueue` of ``batch.all()``; a large batch known to be plain is COPYed
        while its requests are made (:meth:`_enqueue_copy`)."""
        if batch.plain and self._doc_insert and batch.size >= self.copy_min_rows:
            outcomes = await self._enqueue_copy(batch)
            if outcomes is not None:
                return outcomes
        return await self.enqueue(batch.all())

    async def _enqueue_plain(
        self, requests: Sequence[EnqueueRequest]
    ) -> list[EnqueueOutcome] | None:
        """Insert plain requests with one autocommit statement; ``None`` if one is capped.

        The statement is :func:`q.insert_row_sql` for one request (the single ``enqueue``),
        :func:`q.insert_rows_sql` for more.

        A capped actor (a stored ``actor_config.max_pending``, read through the TTL cache)
        needs the locked count, so the caller falls back to the transactional path.

        The statement runs on a held connection
        (:class:`~taskq.backends.held.HeldConnections`). There is no pre-ping (it would be a
        second round trip per enqueue; only connections that sat idle are pinged, see
        ``taskq.db.dialect``). If the statement fails because the connection was dead
        (SQLAlchemy reports ``connection_invalidated`` and has already recycled the pool),
        the connection and every other idle held one go back to the pool and the statement
        is retried ONCE on a freshly checked-out connection. That retry is safe although the
        first attempt may have committed before the connection broke: the job ids were fixed
        client-side, so the retry inserts with ``ON CONFLICT (id) DO NOTHING`` and reads
        back any row the lost attempt wrote. Exactly one job per request either way; any
        other error, or a second failure, is raised.
        """
        rows: list[Any] = []
        retried = False
        one = len(requests) == 1
        for attempt in (0, 1):
            try:
                async with self.held.lease() as conn:
                    if await self._any_capped(conn, {req.actor for req in requests}):
                        return None
                    if one and not retried:
                        sql = self._row_sql(conn)
                        params = {"row": q.row_document(requests[0]), "channel": self._channel}
                    else:
                        sql = self._plain_sql(conn, skip_existing=retried)
                        params = {"rows": q.rows_document(requests), "channel": self._channel}
                    rows = await _execute_on_driver(conn, sql, params)
            except DBAPIError as exc:
                if attempt == 0 and exc.connection_invalidated:
                    await self._after_disconnect(len(requests))
                    retried = True
                    continue
                _raise_translated(exc)
            break
        if retried:  # the lost attempt may have written any of them: read them all back
            found = await self._read_back(requests)
            return [EnqueueOutcome(found[req.job_id]) for req in requests]
        if one:
            if len(rows) != 1:
                raise RuntimeError(f"inserted {len(rows)} of 1 jobs")
            [row] = rows
            return [EnqueueOutcome(q.inserted_record(requests[0], row), job_id=requests[0].job_id)]
        sources = q.inserted_records(requests, rows[0])
        return [
            EnqueueOutcome(source, job_id=req.job_id)
            for req, source in zip(requests, sources, strict=True)
        ]

    async def _enqueue_copy(self, batch: RequestBatch) -> Sequence[EnqueueOutcome] | None:
        """Insert a plain batch with binary COPY in one transaction; ``None`` to fall back.

        On a held connection (:class:`~taskq.backends.held.HeldConnections`), after the same
        capped-actor check as :meth:`_enqueue_plain` (a capped actor: ``None``, the caller
        takes the transactional path). A batch held column by column whose jobs all run
        now (``enqueue_many`` of ``(actor, model)`` pairs) is one COPY that commits on its
        own, its timestamps the server's defaults, then the reading of that time and the
        wake-ups (:func:`_copy_committing`). Any other: ``BEGIN``; ``copy_clock_sql`` reads
        ``clock_timestamp()`` and queues the ``pg_notify`` of each of the batch's queues
        (delivered at commit); the rows, every timestamp derived from that reading, sent a
        chunk at a time, each chunk of requests made (``batch.chunks``) while the server
        inserts the one before (:func:`_copy_on_driver`); ``COMMIT``. All or nothing: any
        error, a bad item of the batch included, rolls the transaction back and is raised
        (a ``DBAPIError`` as the one-statement path raises it, translated).

        A connection found dead is handled as :meth:`_enqueue_plain` handles one: the held
        connections go back to the pool and the batch is tried again ONCE. If it died while
        reading the stored caps, nothing was sent: the same COPY runs on a fresh connection.
        If it died in the COPY transaction (whose commit may have gone through), or in or
        after the COPY that commits on its own, the batch is inserted with ``ON CONFLICT
        (id) DO NOTHING`` and read back (:meth:`_insert_again`). A second failure is
        raised. A timestamp out of Python's range (a delay of millennia) aborts the COPY,
        and the caller falls back too.
        """
        for attempt in (0, 1):
            copying = False
            try:
                async with self.held.lease() as conn:
                    if await self._any_capped(conn, batch.actors):
                        return None
                    extras = _copy_extras(batch)
                    params = {"channel": self._channel, "queues": list(batch.queues)}
                    copying = True
                    if self._scheduled_default and batch.bulk is not None:
                        committed = await self._try_copy_committing(
                            conn, params, batch.bulk, extras
                        )
                        if committed is not None:
                            return committed
                    copy_sql = self._copy_rows_sql(conn, clock=True, extras=extras, rows=batch.size)
                    try:
                        return await _copy_on_driver(
                            conn, cq.copy_clock_sql(conn.dialect), params, copy_sql, batch
                        )
                    except cq.UnencodableRow:  # the COPY was aborted and rolled back
                        return None
            except DBAPIError as exc:
                if exc.connection_invalidated and attempt == 0:
                    await self._after_disconnect(batch.size)
                    if copying:
                        return await self._insert_again(batch.all())
                    continue  # nothing was sent: the whole thing again, on a fresh connection
                _raise_translated(exc)
        raise AssertionError("unreachable: the second attempt returns or raises")

    async def _try_copy_committing(
        self, conn: AsyncConnection, params: dict[str, Any], rows: BulkRows, extras: bool
    ) -> BulkOutcomes | None:
        """``rows`` with the COPY that commits on its own (:func:`_copy_committing`) when
        every job runs now; else ``None``, and ``None`` too (nothing written) when the
        table has no default for ``scheduled_at`` yet (migration 0002 pending): this
        backend then takes the COPY in a transaction from now on, and says so once."""
        if not cq.runs_now(rows.templates):
            return None
        copy_sql = self._copy_rows_sql(conn, clock=False, extras=extras, rows=rows.size)
        done_sql = cq.copy_done_sql(conn.dialect, self._translate)
        try:
            return await _copy_committing(conn, copy_sql, done_sql, params, rows, extras=extras)
        except IntegrityError as exc:
            if not _missing_default(exc):
                raise
        self._scheduled_default = False
        _log.warning(
            "enqueue_copy_without_defaults",
            detail="jobs.scheduled_at has no default: run `taskq migrate up`",
        )
        return None

    async def _insert_again(self, requests: Sequence[EnqueueRequest]) -> list[EnqueueOutcome]:
        """After a COPY whose connection died: insert the batch again, in one transaction
        on a fresh connection, with ``ON CONFLICT (id) DO NOTHING`` (the lost attempt may
        have committed; the ids were fixed client-side), then read every row back.
        Exactly one job per request; a second failure is raised."""
        async with transaction(self.engine) as conn:
            sql = self._plain_sql(conn, skip_existing=True)
            for start in range(0, len(requests), _ROWS_PER_STATEMENT):
                chunk = requests[start : start + _ROWS_PER_STATEMENT]
                params = {"rows": q.rows_document(chunk), "channel": self._channel}
                await conn.exec_driver_sql(sql, params)
        found = await self._read_back(requests)
        return [EnqueueOutcome(found[req.job_id]) for req in requests]

    async def _read_back(self, requests: Sequence[EnqueueRequest]) -> dict[UUID, JobRecord]:
        """The rows of ``requests`` after a retried insert; each must exist."""
        found: dict[UUID, JobRecord] = {}
        async with transaction(self.engine, readonly=True) as conn:
            for start in range(0, len(requests), _ROWS_PER_STATEMENT):
                ids = [req.job_id for req in requests[start : start + _ROWS_PER_STATEMENT]]
                result = await conn.execute(q.get_many(ids))
                for row in result.mappings().all():
                    found[row["id"]] = JobRecord.from_mapping(row)
        missing = [str(req.job_id) for req in requests if req.job_id not in found]
        if missing:
            raise RuntimeError(f"jobs {', '.join(missing)} were neither inserted nor found")
        return found

    def _row_sql(self, conn: AsyncConnection) -> str:
        """:func:`q.insert_row_sql` for this engine, remembered (it never changes)."""
        if self._one_sql is None:
            self._one_sql = q.insert_row_sql(conn.dialect, self._translate)
        return self._one_sql

    def _plain_sql(self, conn: AsyncConnection, *, skip_existing: bool) -> str:
        """:func:`q.insert_rows_sql` for this engine, remembered (it never changes)."""
        sql = self._plain_sql_cache.get(skip_existing)
        if sql is None:
            sql = q.insert_rows_sql(conn.dialect, self._translate, skip_existing=skip_existing)
            self._plain_sql_cache[skip_existing] = sql
        return sql

    async def _enqueue_on(
        self, conn: AsyncConnection, requests: Sequence[EnqueueRequest]
    ) -> list[EnqueueOutcome]:
        stored: dict[str, int | None] = {}  # each actor's stored cap, read once per batch
        for req in requests:
            if req.actor not in stored:
                stored[req.actor] = await self._stored_max_pending(conn, req.actor)
        # Per request: items of one actor may carry different per-call caps.
        caps = [req.effective_max_pending(stored[req.actor]) for req in requests]
        outcomes: dict[int, EnqueueOutcome] = {}
        bulk = [i for i, r in enumerate(requests) if r.plain and caps[i] is None]
        if self._doc_insert:  # COPY or JSON-document statements, NOTIFY included
            plain = [requests[i] for i in bulk]
            copied: list[EnqueueOutcome] | None = None
            if len(plain) >= self.copy_min_rows:
                copied = await self._copy_in_transaction(conn, plain)
            if copied is None:
                sql = q.insert_rows_sql(conn.dialect, self._translate)
                copied = []
                for start in range(0, len(plain), _ROWS_PER_STATEMENT):
                    chunk = plain[start : start + _ROWS_PER_STATEMENT]
                    params = {"rows": q.rows_document(chunk), "channel": self._channel}
                    row = (await conn.exec_driver_sql(sql, params)).one()
                    copied += [
                        EnqueueOutcome(source, job_id=req.job_id)
                        for req, source in zip(chunk, q.inserted_records(chunk, row), strict=True)
                    ]
            outcomes.update(zip(bulk, copied, strict=True))
        else:
            size = traits(self.dialect).insert_chunk
            for start in range(0, len(bulk), size):
                chunk_ix = bulk[start : start + size]
                params_list = [q.job_params(requests[i]) for i in chunk_ix]
                result = await conn.execute(q.insert_jobs(self.dialect), params_list)
                by_id = {row["id"]: JobRecord.from_mapping(row) for row in result.mappings().all()}
                for i in chunk_ix:
                    outcomes[i] = EnqueueOutcome(by_id[requests[i].job_id])
        notify = set() if self._doc_insert else {requests[i].queue for i in bulk}
        for i, req in enumerate(requests):
            if i not in outcomes:
                outcomes[i] = await self._enqueue_one(conn, req, caps[i])
                notify.add(req.queue)
        if traits(self.dialect).notify:  # wake LISTENing workers at commit
            for queue in sorted(notify):
                await conn.execute(notify_enqueued(self._schema, queue))
        return [outcomes[i] for i in range(len(requests))]

    async def _copy_in_transaction(
        self, conn: AsyncConnection, requests: Sequence[EnqueueRequest]
    ) -> list[EnqueueOutcome] | None:
        """Write plain, uncapped ``requests`` with binary COPY in the transaction ``conn`` is
        in (the caller's, given ``connection=``, or the backend's own); what each did, or
        ``None`` for the statement path instead.

        Nothing is committed here: the rows, and the wake-up of each queue, become visible
        when that transaction commits and vanish if it rolls back. The clock reading goes
        through SQLAlchemy, so a connection that had not begun begins as any statement
        would begin it (and the caller's ``commit()`` commits the rows). ``None`` (nothing
        written) for a connection in autocommit, which has no transaction to hold the
        COPY, and for a timestamp out of Python's range (found before the COPY starts).
        An error during the COPY is raised and leaves the transaction aborted, as a
        failed statement would; there is no retry on a connection the caller owns.
        """
        driver = _driver_connection(conn)
        if driver.autocommit:
            return None
        copy_sql = self._copy_rows_sql(conn, clock=True, extras=True, rows=len(requests))
        params = {"channel": self._channel, "queues": sorted({r.queue for r in requests})}
        clock = await conn.exec_driver_sql(cq.copy_clock_sql(conn.dialect), params)
        now = clock.one()[0]
        try:
            cq.check_encodable(requests, now)
        except cq.UnencodableRow:
            return None  # the notifications queued are repeated, and folded, by the statement
        try:
            async with driver.cursor() as cursor, cursor.copy(copy_sql) as copy:
                return list(await _write_rows(copy, RequestBatch.of(requests), now))
        except psycopg.Error as exc:
            raise await _driver_error(conn, driver, copy_sql, None, exc) from exc

    async def _after_disconnect(self, jobs: int) -> None:
        """A held connection was found dead: log the one retry, and return the other idle
        held connections to the pool (they most likely died with it)."""
        _log.warning("enqueue_retry_after_disconnect", jobs=jobs)
        await self.held.drop_idle()

    async def _any_capped(self, conn: AsyncConnection, actors: Iterable[str]) -> bool:
        """True when one of ``actors`` has a stored ``max_pending`` (a locked count)."""
        for actor in actors:
            stored = await self._stored_max_pending(conn, actor)
            if stored is not None:
                return True
        return False

    async def _stored_max_pending(self, conn: AsyncConnection, actor: str) -> int | None:
        """``actor_config.max_pending`` for ``actor``, through the TTL cache."""
        now = time.monotonic()
        cached = self._stored_cap.get(actor)
        if cached is None or now - cached[0] >= self._ttl:
            stored = (await conn.execute(q.stored_max_pending(actor))).scalar()
            cached = (now, stored)
            self._stored_cap[actor] = cached
        return cached[1]

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
            stmt = q.active_singleton(self.dialect, req.actor)
            blocking = (await conn.execute(stmt)).mappings().first()
            if blocking is not None:
                raise SingletonCollisionError.blocked_by(
                    req.actor, blocking["id"], blocking["deadline_at"], blocking["now"]
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
        try:
            async with transaction(self.engine, readonly=True) as conn:
                row = (await conn.execute(q.get(job_id))).mappings().first()
        except RecursionError:  # a document written by SQL, nested past the decoder
            raise UndecodableJob(
                job_id, "payload/result/progress", "JSON nested deeper than the decoder allows"
            ) from None
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


def _pooled(conn: AsyncConnection) -> Any:
    """The pool's proxy of the DBAPI connection SQLAlchemy checked out for ``conn``."""
    if ASYNC:
        sync_conn = conn.sync_connection
        assert sync_conn is not None  # started by ``async with engine.connect()``
        return sync_conn.connection
    else:
        return conn.connection


def _driver_connection(conn: AsyncConnection) -> Any:
    """The psycopg connection SQLAlchemy checked out for ``conn``."""
    return _pooled(conn).driver_connection


_CURSOR_KEY = "taskq_plain_cursor"


def _driver_cursor(conn: AsyncConnection) -> Any:
    """A psycopg cursor on ``conn``'s psycopg connection, made once per connection.

    Kept in the pool's ``info`` for the connection (it follows the DBAPI connection
    from checkout to checkout) and reused by every plain enqueue on it: a new cursor per
    statement cost about 15 µs of client CPU in a bare psycopg loop, and about 30 µs per
    enqueue measured A/B in one process.
    A cursor whose connection is not this one (the DBAPI connection was replaced) or
    that was closed is replaced. A held connection has one user at a time, so its
    cursor does too.
    """
    pooled = _pooled(conn)
    driver = pooled.driver_connection
    cursor = pooled.info.get(_CURSOR_KEY)
    if cursor is None or cursor.connection is not driver or cursor.closed:
        cursor = pooled.info[_CURSOR_KEY] = driver.cursor()
    return cursor


async def _driver_error(
    conn: AsyncConnection, driver: Any, sql: str, params: Any, exc: psycopg.Error
) -> Exception:
    """``exc`` as SQLAlchemy would raise it: a dead connection is handed back to SQLAlchemy,
    which invalidates it and the rest of the pool and raises
    ``DBAPIError(connection_invalidated=True)``; any other driver error is returned
    wrapped in its ``DBAPIError`` subclass."""
    if driver.closed or driver.broken:
        await conn.exec_driver_sql(";")  # SQLAlchemy meets the dead connection: raises
    return DBAPIError.instance(sql, params, exc, psycopg.Error, dialect=conn.dialect)


async def _execute_on_driver(conn: AsyncConnection, sql: str, params: dict[str, Any]) -> list[Any]:
    """Run ``sql`` on the psycopg connection that SQLAlchemy checked out for ``conn``.

    The hot path's statement is compiled once (``insert_rows_sql``); going through
    ``exec_driver_sql`` would still build an execution context and a result wrapper per
    call, a quarter of the client's CPU per enqueue. It runs on the connection's one
    reused cursor (:func:`_driver_cursor`). Errors come out as SQLAlchemy would raise
    them (:func:`_driver_error`).
    """
    cursor = _driver_cursor(conn)
    try:
        await cursor.execute(sql, params)
        rows: list[Any] = await cursor.fetchall()
        return rows
    except psycopg.Error as exc:
        raise await _driver_error(conn, cursor.connection, sql, params, exc) from exc


async def _copy_on_driver(
    conn: AsyncConnection,
    clock_sql: str,
    params: dict[str, Any],
    copy_sql: str,
    batch: RequestBatch,
) -> list[EnqueueOutcome] | BulkOutcomes:
    """Write ``batch`` with binary COPY in one transaction on ``conn``'s psycopg
    connection (in autocommit) and return what each request did.

    ``BEGIN`` and ``clock_sql`` (:func:`taskq.db.queries.copy_rows.copy_clock_sql`, which
    reads the server clock and queues the wake-ups) go in one pipeline: one round trip,
    where psycopg's ``transaction()`` would make ``BEGIN`` a round trip of its own. Then
    the rows are written from that reading (:func:`_write_rows`), then ``COMMIT``. A
    timestamp out of range (``UnencodableRow``), a bad item of the batch, a cancellation
    or any other error aborts the COPY and rolls back (:func:`_roll_back`): nothing is
    written. Driver errors come out as SQLAlchemy would raise them (:func:`_driver_error`).
    """
    driver = _driver_connection(conn)
    cursor = _driver_cursor(conn)
    sql: str = clock_sql  # what failed, for the error
    shown: dict[str, Any] | None = params
    try:
        try:
            async with driver.pipeline():
                await cursor.execute(cq.BEGIN)
                await cursor.execute(clock_sql, params)
            (now, _) = await cursor.fetchone()
            sql, shown = copy_sql, None
            async with cursor.copy(copy_sql) as copy:
                outcomes = await _write_rows(copy, batch, now)
            sql = cq.COMMIT
            await driver.commit()
        except BaseException:
            await _roll_back(driver)
            raise
        return outcomes
    except psycopg.Error as exc:
        raise await _driver_error(conn, driver, sql, shown, exc) from exc


async def _roll_back(driver: Any) -> None:
    """End the failed transaction the COPY path began on ``driver`` (in autocommit, so
    the pool's reset would not): ``ROLLBACK`` unless the connection is idle or dead. An
    error doing so is dropped: the one that got here is raised."""
    if driver.closed or driver.broken:
        return
    with contextlib.suppress(psycopg.Error):
        await driver.rollback()


def _missing_default(exc: IntegrityError) -> bool:
    """Whether ``exc`` is the NOT NULL violation of a COPY that left ``scheduled_at`` to a
    default the table does not have (its schema is before migration 0002)."""
    orig = exc.orig
    return (
        isinstance(orig, psycopg.errors.NotNullViolation)
        and orig.diag.column_name == cq.SCHEDULED_AT
    )


def _copy_extras(batch: RequestBatch) -> bool:
    """Whether ``batch``'s COPY writes the :data:`~taskq.db.queries.copy_rows.COPY_EXTRA_COLUMNS`
    (not when it is held column by column and none of its templates sets one)."""
    return batch.bulk is None or cq.needs_extras(batch.bulk.templates)


async def _write_rows(
    copy: Any, batch: RequestBatch, now: datetime
) -> list[EnqueueOutcome] | BulkOutcomes:
    """Send the binary COPY data of ``batch``'s rows, made at the clock reading ``now``,
    to ``copy`` (a psycopg ``Copy``) and return what each request did (each row inserted).

    A chunk of :data:`~taskq.db.queries.copy_rows.COPY_ROWS_PER_WRITE` rows at a time (a
    smaller first one): the server inserts one while the next is made (``batch.chunks``),
    encoded and its outcomes built, so the client's work hides behind the server's.
    Anything raised (a bad item, ``UnencodableRow``) leaves the ``with`` block of ``copy``,
    which aborts the COPY.
    """
    encoder = cq.CopyEncoder(now, extras=_copy_extras(batch))
    if batch.bulk is not None:
        await _write_bulk(copy, batch.bulk, encoder)
        return BulkOutcomes(batch.bulk, now)
    outcomes: list[EnqueueOutcome] = []
    await copy.write(cq.COPY_HEADER)
    for chunk in batch.chunks(cq.COPY_ROWS_PER_WRITE, first=cq.COPY_FIRST_ROWS):
        await copy.write(encoder.encode(chunk))
        sources = cq.copied_records(chunk, now)
        outcomes += [
            EnqueueOutcome(source, job_id=req.job_id)
            for req, source in zip(chunk, sources, strict=True)
        ]
    await copy.write(cq.COPY_TRAILER)
    return outcomes


async def _write_bulk(copy: Any, rows: BulkRows, encoder: cq.CopyEncoder) -> None:
    """Send the rows of a batch held column by column, as :func:`_write_rows` sends its
    chunks: each row is its id, its payload and its template's other fields, encoded once
    (``row_tail``)."""
    tails = [encoder.row_tail(template) for template in rows.templates]
    if rows.size == 0:
        await copy.write(cq.COPY_HEADER + cq.COPY_TRAILER)
    start, size = 0, cq.COPY_FIRST_ROWS
    while start < rows.size:
        stop = min(start + size, rows.size)
        chunk_tails = [tails[t] for t in rows.template_indexes(start, stop)]
        payloads = rows.payloads_json(start, stop)
        data = encoder.encode_bulk(rows.ids[start:stop], payloads, chunk_tails)
        # the header with the first rows and the trailer with the last: a write fewer each
        await copy.write(
            (cq.COPY_HEADER if start == 0 else b"")
            + data
            + (cq.COPY_TRAILER if stop == rows.size else b"")
        )
        start, size = stop, cq.COPY_ROWS_PER_WRITE


async def _copy_committing(
    conn: AsyncConnection,
    copy_sql: str,
    done_sql: str,
    params: dict[str, Any],
    rows: BulkRows,
    *,
    extras: bool,
) -> BulkOutcomes:
    """Write ``rows``, every job of which runs now (:func:`~taskq.db.queries.copy_rows.runs_now`),
    with one binary COPY that commits on its own (``conn``'s psycopg connection is in
    autocommit), then read the time it wrote and wake the queues.

    The rows leave ``created_at``, ``updated_at`` and ``scheduled_at`` to their default,
    the transaction's timestamp (``copy_rows_sql(..., clock=False)``), so no clock reading
    and no ``BEGIN`` come before the COPY, and its end is the commit: two round trips
    fewer than :func:`_copy_on_driver`. Then ``done_sql``
    (:func:`~taskq.db.queries.copy_rows.copy_done_sql`) reads that timestamp off the
    first row, which the records are built from, and sends each queue's ``pg_notify``
    (delivered as it commits, just after the rows). A bad row, a cancellation or any
    other error during the COPY aborts it: nothing is written. Driver errors come out as
    SQLAlchemy would raise them (:func:`_driver_error`); the caller retries one that
    found the connection dead, whose COPY may have committed, as it does for the
    transaction of :func:`_copy_on_driver`.
    """
    cursor = _driver_cursor(conn)
    driver = cursor.connection
    if not driver.autocommit:  # a held connection always is: else the COPY would not commit
        raise RuntimeError("_copy_committing needs a connection in autocommit")
    sql: str = copy_sql  # what failed, for the error
    shown: dict[str, Any] | None = None
    try:
        async with cursor.copy(copy_sql) as copy:
            await _write_bulk(copy, rows, cq.CopyEncoder(None, extras=extras))
        sql, shown = done_sql, {**params, "first": uuid_from_int(rows.ids[0])}
        await cursor.execute(done_sql, shown, prepare=True)  # once per connection
        (now, _) = await cursor.fetchone()
    except psycopg.Error as exc:
        raise await _driver_error(conn, driver, sql, shown, exc) from exc
    if now is None:
        raise RuntimeError("the first job of the COPY is not in the table after its commit")
    return BulkOutcomes(rows, now)


def _raise_translated(exc: DBAPIError) -> NoReturn:
    """Raise ``exc`` as :func:`~taskq.db.dialect.translate_error` maps it (a missing table
    becomes ``SchemaNotReady``), chained to the driver error; else ``exc`` itself."""
    translated = translate_error(exc)
    if translated is exc:
        raise exc
    raise translated from exc


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
