"""Statement builders for the producer side of ``jobs``: enqueue checks, inserts, reads, cancel.

Each function returns a SQLAlchemy Core statement; backends execute them. ``dialect`` is
the engine's dialect name (``"postgresql"`` or ``"sqlite"``); timestamps that decide
behaviour (windows, schedules) come from the store's clock, :func:`taskq.db.dialect.now`.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

from pydantic_core import to_json
from sqlalchemy import (
    Boolean,
    Float,
    Select,
    SmallInteger,
    Text,
    and_,
    bindparam,
    case,
    cast,
    column,
    func,
    literal,
    literal_column,
    null,
    or_,
    select,
    true,
    type_coerce,
    update,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.engine import Dialect
from sqlalchemy.sql.elements import ColumnElement

from taskq.constants import ACTIVE_STATUSES
from taskq.db import dialect as dialects
from taskq.db.queries.compiled import compile_once
from taskq.db.tables import actor_config, job_attempts, jobs
from taskq.db.types import UTCDateTime
from taskq.records import EnqueueRequest, InsertedRecord, RecordSource

__all__ = [
    "active_singleton",
    "advisory_key",
    "attempts",
    "cancel",
    "count_pending",
    "get",
    "get_many",
    "idempotent_match",
    "insert_jobs",
    "insert_row_sql",
    "insert_rows_sql",
    "inserted_record",
    "inserted_records",
    "job_params",
    "row_document",
    "rows_document",
    "stored_max_pending",
    "unique_match",
]

_PENDING_OR_SCHEDULED = ("pending", "scheduled")


def ago(dialect: str, window: timedelta) -> ColumnElement[Any]:
    """``now() - window`` on the store's clock."""
    return dialects.now_plus(dialect, -window.total_seconds())


def advisory_key(kind: str, actor: str, key: str = "") -> str:
    """The text an advisory lock hashes: one lock per (kind, actor, key)."""
    return f"taskq:{kind}:{actor}:{key}"


def unique_match(dialect: str, req: EnqueueRequest) -> Select[Any]:
    """The newest job for ``(actor, identity_key)`` created inside the window in ``unique_states``."""
    assert req.unique_for is not None
    assert req.identity_key is not None
    return (
        select(jobs)
        .where(
            jobs.c.actor == req.actor,
            jobs.c.identity_key == req.identity_key,
            jobs.c.status.in_(req.unique_states),
            jobs.c.created_at >= ago(dialect, req.unique_for),
        )
        .order_by(jobs.c.created_at.desc())
        .limit(1)
    )


def active_singleton(dialect: str, actor: str) -> Select[Any]:
    """The active job of a singleton actor, if any (the pre-flight): its ``id``, its
    ``deadline_at`` and the store's clock (``now``), which ``retry_after`` is taken from."""
    now = type_coerce(dialects.now(dialect), UTCDateTime())
    return (
        select(jobs.c.id, jobs.c.deadline_at, now.label("now"))
        .where(
            jobs.c.actor == actor, jobs.c.singleton.is_(True), jobs.c.status.in_(ACTIVE_STATUSES)
        )
        .limit(1)
    )


def count_pending(actor: str) -> Select[Any]:
    """How many of the actor's jobs are pending or scheduled (what ``max_pending`` caps)."""
    return (
        select(func.count())
        .select_from(jobs)
        .where(jobs.c.actor == actor, jobs.c.status.in_(_PENDING_OR_SCHEDULED))
    )


def stored_max_pending(actor: str) -> Select[Any]:
    """The operator-owned ``actor_config.max_pending`` (NULL or no row: use the literal)."""
    return select(actor_config.c.max_pending).where(actor_config.c.actor == actor)


def idempotent_match(actor: str, idempotency_key: str) -> Select[Any]:
    """The job already holding ``(actor, idempotency_key)``."""
    return select(jobs).where(jobs.c.actor == actor, jobs.c.idempotency_key == idempotency_key)


def job_params(req: EnqueueRequest) -> dict[str, Any]:
    """The bound parameters of one row for :func:`insert_jobs` (executed as executemany)."""
    return {
        "id": req.job_id,
        "actor": req.actor,
        "queue": req.queue,
        "status": req.status,
        "payload": req.payload,
        "priority": req.priority,
        "max_attempts": req.max_attempts,
        "identity_key": req.identity_key,
        "idempotency_key": req.idempotency_key,
        "singleton": req.singleton,
        "tags": list(req.tags),
        "metadata": req.metadata,
        "trace_context": req.trace_context,
        "start_to_close_s": req.start_to_close_s,
        "schedule_to_close_s": req.schedule_to_close_s,
        "parent_job_id": req.parent_job_id,
        "p_scheduled_at": req.scheduled_at,
        "p_delay_s": req.delay_s or 0.0,
        "p_deadline_s": req.schedule_to_close_s,
    }


@functools.cache
def insert_jobs(dialect: str, *, skip_conflicts: bool = False) -> Any:
    """An INSERT of job rows, executed with a list of :func:`job_params` (one round trip:
    SQLAlchemy batches the rows into multi-row statements); ``RETURNING`` every column.

    The statement is the same for every batch, so it is compiled once and cached.
    Timestamps come from the store's clock: ``scheduled_at`` is the explicit value or
    ``now() + delay``, ``deadline_at`` is ``now() + schedule_to_close``.
    ``skip_conflicts`` adds ``ON CONFLICT DO NOTHING``: a row that hits the singleton or
    idempotency unique index is silently not inserted (absent from RETURNING), so the
    caller's transaction is never aborted by an expected collision.
    """
    now = dialects.now(dialect)
    delay = cast(bindparam("p_delay_s", type_=Float()), Float())
    deadline = cast(bindparam("p_deadline_s", type_=Float()), Float())
    stmt = dialects.insert(dialect, jobs).values(
        scheduled_at=func.coalesce(
            bindparam("p_scheduled_at", type_=jobs.c.scheduled_at.type),
            dialects.now_plus(dialect, delay),
        ),
        deadline_at=case((deadline.is_(None), null()), else_=dialects.now_plus(dialect, deadline)),
        created_at=now,
        updated_at=now,
    )
    if skip_conflicts:
        stmt = stmt.on_conflict_do_nothing()
    return stmt.returning(*jobs.c, sort_by_parameter_order=True)


# --- Postgres bulk/plain insert: one statement, rows in one JSON document -------------------
#
# The columns of the document ``jsonb_to_recordset`` unpacks, with their SQL types. A row
# carries only the keys it sets (absent keys read as NULL); NOT NULL columns with defaults
# are coalesced back to them. One ``jsonb`` parameter for N rows instead of N x 18 bound
# values: psycopg adapts a single string, the server parses it in one pass.
_DOC_COLUMNS: tuple[tuple[str, Any], ...] = (
    ("id", jobs.c.id.type),
    ("actor", Text()),
    ("queue", Text()),
    ("status", Text()),
    ("payload", JSONB()),
    ("priority", SmallInteger()),
    ("max_attempts", jobs.c.max_attempts.type),
    ("identity_key", Text()),
    ("idempotency_key", Text()),
    ("singleton", Boolean()),
    ("tags", JSONB()),
    ("metadata", JSONB()),
    ("trace_context", JSONB()),
    ("start_to_close_s", Float()),
    ("schedule_to_close_s", Float()),
    ("parent_job_id", jobs.c.parent_job_id.type),
    ("scheduled_at", jobs.c.scheduled_at.type),
    ("delay_s", Float()),
)
"""Compiled statements by (dialect, driver, skip_existing, one row, schema map)."""


def _doc_insert(source_fn: str, param: str, *, skip_existing: bool) -> Any:
    """``INSERT INTO jobs ... SELECT`` from the document(s) in bound parameter ``param``,
    unpacked by ``source_fn`` (``jsonb_to_recordset`` or ``jsonb_to_record``), every
    timestamp from one ``clock_timestamp()`` reading; ``RETURNING`` id, queue and the
    three timestamps."""
    r = (
        getattr(func, source_fn)(bindparam(param, type_=JSONB()))
        .table_valued(*(column(name, type_) for name, type_ in _DOC_COLUMNS))
        .render_derived(name="r", with_types=True)
    )
    clock = select(func.clock_timestamp().label("now")).subquery("t")
    now = clock.c.now
    zero: ColumnElement[Any] = literal_column("0")

    def after(seconds: ColumnElement[Any]) -> ColumnElement[Any]:
        return now + func.make_interval(zero, zero, zero, zero, zero, zero, seconds)

    values: dict[str, ColumnElement[Any]] = {
        "id": r.c.id,
        "actor": r.c.actor,
        "queue": r.c.queue,
        "status": r.c.status,
        "payload": r.c.payload,
        "priority": r.c.priority,
        "max_attempts": r.c.max_attempts,
        "identity_key": r.c.identity_key,
        "idempotency_key": r.c.idempotency_key,
        "singleton": func.coalesce(r.c.singleton, literal_column("false")),
        "tags": func.coalesce(r.c.tags, cast(literal_column("'[]'"), JSONB())),
        "metadata": func.coalesce(r.c.metadata, cast(literal_column("'{}'"), JSONB())),
        "trace_context": r.c.trace_context,
        "start_to_close_s": r.c.start_to_close_s,
        "schedule_to_close_s": r.c.schedule_to_close_s,
        "parent_job_id": r.c.parent_job_id,
        "scheduled_at": func.coalesce(
            r.c.scheduled_at, after(func.coalesce(r.c.delay_s, literal_column("0")))
        ),
        # make_interval is strict: no schedule_to_close, no deadline.
        "deadline_at": after(r.c.schedule_to_close_s),
        "created_at": now,
        "updated_at": now,
    }
    source = select(*values.values()).select_from(clock.join(r, true()))
    ins = dialects.insert("postgresql", jobs).from_select(list(values), source)
    if skip_existing:
        ins = ins.on_conflict_do_nothing(index_elements=[jobs.c.id])
    return ins.returning(
        jobs.c.id, jobs.c.queue, jobs.c.scheduled_at, jobs.c.deadline_at, jobs.c.created_at
    )


def _rows_insert(*, skip_existing: bool) -> Any:
    """The Core statement behind :func:`insert_rows_sql` (see there)."""
    inserted = _doc_insert("jsonb_to_recordset", "rows", skip_existing=skip_existing).cte("ins")
    queues = select(inserted.c.queue).distinct().subquery("q")
    notified = select(func.pg_notify(bindparam("channel"), queues.c.queue).label("n")).cte("n")
    utc: ColumnElement[Any] = literal_column("'UTC'")
    special = or_(
        inserted.c.scheduled_at != inserted.c.created_at, inserted.c.deadline_at.is_not(None)
    )
    # ONE result row, whatever the batch size: rows that start now with no deadline (the
    # common case) are described by the shared clock reading alone; only the others are
    # listed. Timestamps as naive UTC, the client attaches the zone.
    return select(
        func.count().label("inserted"),
        func.min(func.timezone(utc, inserted.c.created_at)).label("now"),
        func.jsonb_agg(
            func.jsonb_build_array(
                inserted.c.id,
                func.timezone(utc, inserted.c.scheduled_at),
                func.timezone(utc, inserted.c.deadline_at),
            )
        )
        .filter(special)
        .label("special"),
        select(func.count()).select_from(notified).scalar_subquery().label("notified"),
    ).select_from(inserted)


def _row_insert() -> Any:
    """The Core statement behind :func:`insert_row_sql` (see there)."""
    inserted = _doc_insert("jsonb_to_record", "row", skip_existing=False).cte("ins")
    utc: ColumnElement[Any] = literal_column("'UTC'")
    return select(
        func.timezone(utc, inserted.c.created_at).label("now"),
        func.timezone(utc, inserted.c.scheduled_at).label("scheduled_at"),
        func.timezone(utc, inserted.c.deadline_at).label("deadline_at"),
        func.pg_notify(bindparam("channel"), inserted.c.queue).label("notified"),
    ).select_from(inserted)


def insert_row_sql(
    dialect: Dialect, schema_translate_map: Mapping[str | None, str | None] | None
) -> str:
    """Postgres only: :func:`insert_rows_sql` for ONE job, the single ``enqueue``.

    Parameters: ``row`` (:func:`row_document`) and ``channel``. Returns one row
    ``(now, scheduled_at, deadline_at, notified)``, timestamps as naive UTC (see
    :func:`inserted_record`). The same insert, with ``jsonb_to_record`` instead of
    ``jsonb_to_recordset`` and no aggregate over the inserted rows: the server does
    measurably less per job, and one enqueue is one such statement. Compiled once per
    driver and schema map, as :func:`insert_rows_sql` is.
    """
    return compile_once("insert_row", _row_insert, dialect, schema_translate_map).string


def insert_rows_sql(
    dialect: Dialect,
    schema_translate_map: Mapping[str | None, str | None] | None,
    *,
    skip_existing: bool = False,
) -> str:
    """Postgres only: the SQL that inserts every row of a :func:`rows_document` and wakes
    the workers of their queues, as ONE statement (so one round trip, atomic even on an
    autocommit connection).

    Parameters: ``rows`` (the document) and ``channel`` (``notify_channel(schema)``); the
    payload of each ``pg_notify`` is a queue name, once per distinct queue, delivered at
    commit. Returns ONE row ``(inserted, now, special, notified)``: how many rows went in,
    the one ``clock_timestamp()`` they all share (naive UTC), and for the rows whose
    ``scheduled_at`` is not ``now`` or that have a deadline a JSON list of
    ``[id, scheduled_at, deadline_at]`` (see :func:`inserted_records`). ``skip_existing`` adds
    ``ON CONFLICT (id) DO NOTHING``: the retry after a lost connection, where a row that
    the first attempt committed must not be inserted twice.

    Built with Core and compiled once per driver and schema map, with the schema rendered
    through ``schema_translate_map``; executed with ``exec_driver_sql`` so no per-call
    compile, cache-key or bind-processing work is done on the enqueue hot path.
    """
    build = functools.partial(_rows_insert, skip_existing=skip_existing)
    return compile_once(("insert_rows", skip_existing), build, dialect, schema_translate_map).string


def _doc_row(req: EnqueueRequest) -> dict[str, Any]:
    row: dict[str, Any] = {
        "id": req.job_id,
        "actor": req.actor,
        "queue": req.queue,
        "status": req.status,
        "payload": req.payload,
        "priority": req.priority,
    }
    if req.max_attempts is not None:
        row["max_attempts"] = req.max_attempts
    if req.identity_key is not None:
        row["identity_key"] = req.identity_key
    if req.idempotency_key is not None:
        row["idempotency_key"] = req.idempotency_key
    if req.singleton:
        row["singleton"] = True
    if req.tags:
        row["tags"] = req.tags
    if req.metadata:
        row["metadata"] = req.metadata
    if req.trace_context is not None:
        row["trace_context"] = req.trace_context
    if req.start_to_close_s is not None:
        row["start_to_close_s"] = req.start_to_close_s
    if req.schedule_to_close_s is not None:
        row["schedule_to_close_s"] = req.schedule_to_close_s
    if req.parent_job_id is not None:
        row["parent_job_id"] = req.parent_job_id
    if req.scheduled_at is not None:
        row["scheduled_at"] = req.scheduled_at
    if req.delay_s is not None:
        row["delay_s"] = req.delay_s
    return row


def rows_document(requests: Iterable[EnqueueRequest]) -> str:
    """The ``rows`` parameter of :func:`insert_rows_sql`: one JSON array, one object per job.

    Serialised by pydantic-core (UUIDs and aware datetimes natively, no per-value Python
    conversion). Values were validated by ``build_request``; nothing here is interpolated
    into SQL, the document is a bound parameter.
    """
    return to_json([_doc_row(req) for req in requests]).decode()


def row_document(request: EnqueueRequest) -> str:
    """The ``row`` parameter of :func:`insert_row_sql`: :func:`rows_document`'s object
    for one job."""
    return to_json(_doc_row(request)).decode()


def inserted_record(request: EnqueueRequest, row: Sequence[Any]) -> RecordSource:
    """The job record of ``request`` from the row :func:`insert_row_sql` returned (as
    :func:`inserted_records` builds them: what was written, plus the server's times)."""
    now_naive, scheduled_at, deadline_at, _ = row
    now = now_naive.replace(tzinfo=UTC)
    return InsertedRecord(
        request,
        scheduled_at.replace(tzinfo=UTC),
        deadline_at.replace(tzinfo=UTC) if deadline_at is not None else None,
        now,
    )


def _naive_utc(text: str | None) -> datetime | None:
    return datetime.fromisoformat(text).replace(tzinfo=UTC) if text is not None else None


def inserted_records(requests: Sequence[EnqueueRequest], row: Sequence[Any]) -> list[RecordSource]:
    """Job records, in request order, from the one row :func:`insert_rows_sql` returned.

    Only the server-computed timestamps travel back; the rest is what was just written,
    so each record equals a re-read of the fresh row. Each is a factory, built only when
    read (see ``EnqueueOutcome``). ``RuntimeError`` if the statement did not insert every
    request (it cannot, short of ``skip_existing``, whose caller re-reads the rows).
    """
    inserted, now_naive, special, _ = row
    if inserted != len(requests):
        raise RuntimeError(f"inserted {inserted} of {len(requests)} jobs")
    now = now_naive.replace(tzinfo=UTC)
    times = {
        job_id: (_naive_utc(scheduled_at), _naive_utc(deadline_at))
        for job_id, scheduled_at, deadline_at in special or ()
    }
    out: list[RecordSource] = []
    for req in requests:
        scheduled_at = deadline_at = None
        if times and (req.status == "scheduled" or req.schedule_to_close_s is not None):
            scheduled_at, deadline_at = times.get(str(req.job_id), (None, None))
        out.append(InsertedRecord(req, scheduled_at or now, deadline_at, now))
    return out


def get(job_id: UUID) -> Select[Any]:
    """One job row by id."""
    return select(jobs).where(jobs.c.id == job_id)


def get_many(job_ids: Sequence[UUID]) -> Select[Any]:
    """The rows of ``job_ids`` (in no particular order)."""
    return select(jobs).where(jobs.c.id.in_(job_ids))


def attempts(job_id: UUID) -> Select[Any]:
    """A job's attempts, oldest first."""
    return (
        select(job_attempts)
        .where(job_attempts.c.job_id == job_id)
        .order_by(job_attempts.c.attempt, job_attempts.c.id)
    )


def cancel(dialect: str, job_id: UUID) -> Any:
    """Cancel a job: a pending/scheduled one ends ``cancelled`` (``CancelledBeforeStart``);
    a running one gets ``cancel_phase >= 1`` for its worker to act on; a finished one is
    left alone. Returns the row.
    """
    now = dialects.now(dialect)
    queued = jobs.c.status.in_(_PENDING_OR_SCHEDULED)
    return (
        update(jobs)
        .where(jobs.c.id == job_id, jobs.c.status.in_(ACTIVE_STATUSES))
        .values(
            status=case((queued, literal("cancelled")), else_=jobs.c.status),
            error_class=case((queued, literal("CancelledBeforeStart")), else_=jobs.c.error_class),
            finished_at=case((queued, now), else_=jobs.c.finished_at),
            cancel_phase=case(
                (and_(jobs.c.status == "running", jobs.c.cancel_phase < 1), literal(1)),
                else_=jobs.c.cancel_phase,
            ),
            cancel_requested_at=func.coalesce(jobs.c.cancel_requested_at, now),
            updated_at=now,
        )
        .returning(*jobs.c)
    )
