"""Postgres only: a large plain batch written with binary ``COPY jobs (...) FROM STDIN``.

It is cheaper than the one-statement insert of :func:`taskq.db.queries.jobs.insert_rows_sql`:
the server plans nothing per batch and parses no document, and in binary format it parses
no text either, except each JSON value (jsonb's wire format is its text). The backend
runs it in one transaction: :func:`copy_clock_sql` (the server clock reading the rows
derive from, and the wake-up of each queue, delivered at commit), the COPY of
:class:`CopyEncoder`, COMMIT. What the one-statement insert computes in SQL from
``clock_timestamp()`` is computed here from that reading with the same integer arithmetic
(``make_interval`` rounds seconds to the nearest microsecond, half to even, as ``round``
does), so :func:`copied_records` equal a re-read of the rows.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from pydantic_core import to_json
from sqlalchemy import ARRAY, Text, bindparam, cast, column, func, select
from sqlalchemy.engine import Dialect

from taskq.db.queries.compiled import compile_once
from taskq.db.tables import jobs
from taskq.records import EnqueueRequest, InsertedRecord, RecordSource

__all__ = [
    "BEGIN",
    "COMMIT",
    "COPY_COLUMNS",
    "COPY_EXTRA_COLUMNS",
    "COPY_FIRST_ROWS",
    "COPY_HEADER",
    "COPY_ROWS_PER_WRITE",
    "COPY_TRAILER",
    "ROW_AT_A_TIME_ROWS",
    "SCHEDULED_AT",
    "CopyEncoder",
    "UnencodableRow",
    "check_encodable",
    "copied_records",
    "copy_clock_sql",
    "copy_columns",
    "copy_done_sql",
    "copy_rows_sql",
    "needs_extras",
    "runs_now",
]

COPY_COLUMNS: tuple[Any, ...] = (
    jobs.c.id,
    jobs.c.payload,
    # the same for every job of an actor in one batch: encoded once (``_shape``)
    jobs.c.actor,
    jobs.c.queue,
    jobs.c.priority,
    jobs.c.max_attempts,
    jobs.c.start_to_close_s,
    jobs.c.created_at,
    jobs.c.updated_at,
    # when the job runs: the same for every job that runs now (``_timing``)
    jobs.c.status,
    jobs.c.scheduled_at,
    jobs.c.deadline_at,
    jobs.c.schedule_to_close_s,
    # usually unset (``_extras``)
    jobs.c.identity_key,
    jobs.c.tags,
    jobs.c.metadata,
    jobs.c.trace_context,
    jobs.c.parent_job_id,
)
"""The columns the COPY writes, in order. The others take their defaults, as they do in
the one-statement insert of a plain request (no idempotency key, not a singleton)."""

COPY_EXTRA_COLUMNS = 5
"""How many of :data:`COPY_COLUMNS`, at the end, are the usually unset ones. A batch in
which no job sets one (:func:`needs_extras`) leaves them out of the COPY: they take their
defaults (``[]``, ``{}`` and NULLs), the same values, and the server parses two JSON
documents fewer per row (parsing the three took 9 % of its CPU in a profile)."""

SCHEDULED_AT: str = jobs.c.scheduled_at.name
"""The column whose default a ``clock=False`` COPY needs (migration 0002)."""

_CLOCK_COLUMNS = frozenset(
    col.name
    for col in (
        jobs.c.created_at,
        jobs.c.updated_at,
        jobs.c.status,
        jobs.c.scheduled_at,
        jobs.c.deadline_at,
        jobs.c.schedule_to_close_s,
    )
)
"""The columns a batch of jobs that all run now (:func:`runs_now`) can leave to their
defaults: the transaction's timestamp for the first three (Postgres, migration 0002),
``pending``, and NULLs."""


def copy_columns(*, clock: bool = True, extras: bool = True) -> tuple[Any, ...]:
    """The columns of :data:`COPY_COLUMNS` a COPY writes: without the
    :data:`COPY_EXTRA_COLUMNS` unless ``extras``; without the timestamps, the status and
    the deadline unless ``clock`` (they take their defaults, see :func:`runs_now`)."""
    columns = COPY_COLUMNS if extras else COPY_COLUMNS[:-COPY_EXTRA_COLUMNS]
    if not clock:
        columns = tuple(col for col in columns if col.name not in _CLOCK_COLUMNS)
    return columns


_PG_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)
COPY_HEADER = b"PGCOPY\n\xff\r\n\x00" + struct.pack(">ii", 0, 0)
"""What binary COPY data starts with (signature, flags, header extension length)."""
COPY_TRAILER = struct.pack(">h", -1)
"""What binary COPY data ends with."""
_NULL = struct.pack(">i", -1)
_ROW_START = struct.Struct(">hi").pack  # field count; the id's length
_INT4 = struct.Struct(">i").pack
_JSONB_START = struct.Struct(">iB").pack  # length, then jsonb's format version (1)
_INT2_FIELD = struct.Struct(">ih").pack
_INT4_FIELD = struct.Struct(">ii").pack
_INT8_FIELD = struct.Struct(">iq").pack
_FLOAT8_FIELD = struct.Struct(">id").pack
_PENDING = b"\x00\x00\x00\x07pending"
_SCHEDULED = b"\x00\x00\x00\x09scheduled"
_UUID_LENGTH = _INT4(16)
_CLOCK_SQL_CACHE: dict[tuple[str, str], str] = {}
BEGIN = "BEGIN"
"""What the COPY transaction starts with, sent in one pipeline with :func:`copy_clock_sql`
(its connection is in autocommit)."""
COMMIT = "COMMIT"
"""What the COPY transaction ends with."""
COPY_ROWS_PER_WRITE = 250
"""Rows per buffer handed to the driver: the server takes in one while the next is built
(measured: 100 to 500 rows are alike, a whole 1,000-row batch at once is slower)."""
COPY_FIRST_ROWS = 50
"""Rows of the first buffer: smaller, so the server starts inserting sooner (it inserts
more slowly than the client makes rows, so it sets the pace from then on)."""


ROW_AT_A_TIME_ROWS = range(600, 1501)
"""COPYs of this many rows are written row at a time by the server (:func:`copy_rows_sql`).

Postgres' COPY buffers up to 1,000 rows and inserts them together, with one tuple slot
per buffered row. Each slot pins the table's row descriptor in the statement's resource
owner, which files every pin of the same descriptor in one chain of its hash table, so
making and dropping the slots costs time quadratic in the rows one buffer holds: 19 % of
the server's CPU for a 1,000-row COPY into ``jobs`` (perf, PostgreSQL 15). Inserting row
at a time keeps one slot and pays a heap insert per row instead of per page.

Measured on this project's machine (2026-12-01), a bare COPY into ``jobs``, wall time per
1,000 rows, buffered against row at a time: 400 rows 3.9-4.4 against 4.2-4.4 ms; 600 rows
3.8-4.4 against 3.7-3.9; 800 rows 4.0 against 3.5-3.6; 1,000 rows 3.6-3.9 against 3.3-3.4
(server CPU 3.3-3.9 against 2.9-3.6 ms, the same on PostgreSQL 17); 1,500 rows 3.3-3.8
against 3.4-3.5; 2,000 rows 3.2 against 3.3-3.4; 3,000 rows 2.9 against 3.2. Past the
range a bigger COPY reuses its 1,000 slots across buffers; below it the slots are fewer.
A Postgres release that fixed the quadratic cost would make this range a few per cent
slower, not wrong."""


class UnencodableRow(ValueError):
    """A timestamp of the batch is outside what Python's ``datetime`` holds (a delay or a
    deadline of thousands of years): the backend takes the one-statement path instead."""


def copy_rows_sql(
    dialect: Dialect,
    schema_translate_map: Mapping[str | None, str | None] | None,
    *,
    clock: bool = True,
    extras: bool = True,
    row_at_a_time: bool = False,
) -> str:
    """Postgres only: ``COPY <schema>.jobs (<columns>) FROM STDIN (FORMAT BINARY)``, the
    columns of :func:`copy_columns`.

    ``row_at_a_time`` (for a COPY of :data:`ROW_AT_A_TIME_ROWS` rows) adds ``WHERE
    pg_catalog.random() >= 0``: true of every row, since ``random()`` returns a value in
    ``[0, 1)``, but volatile, and a COPY with a volatile ``WHERE`` inserts each row as it
    reads it rather than in buffers of 1,000 (PostgreSQL 12 and later).

    Core has no COPY construct: the text is assembled from the ``jobs`` table with the
    dialect's identifier quoting, the schema mapped through ``schema_translate_map`` as
    Core statements are. Nothing in it comes from a request.
    """
    preparer = dialect.identifier_preparer
    schema = (schema_translate_map or {}).get(jobs.schema, jobs.schema)
    table = preparer.quote(jobs.name)
    if schema is not None:
        table = f"{preparer.quote_schema(schema)}.{table}"
    written = copy_columns(clock=clock, extras=extras)
    columns = ", ".join(preparer.quote(col.name) for col in written)
    where = " WHERE pg_catalog.random() >= 0" if row_at_a_time else ""
    return f"COPY {table} ({columns}) FROM STDIN (FORMAT BINARY){where}"


def copy_clock_sql(dialect: Dialect) -> str:
    """Postgres only: the statement the COPY transaction starts with.

    Parameters ``channel`` (``notify_channel(schema)``) and ``queues`` (the batch's
    distinct queue names). Returns one row: ``clock_timestamp()``, which every timestamp
    of the batch derives from, and how many notifications were queued; each
    ``pg_notify(channel, queue)`` is delivered at commit, and dropped with a rollback.
    """
    key = (dialect.name, dialect.driver)
    sql = _CLOCK_SQL_CACHE.get(key)
    if sql is None:
        stmt = select(func.clock_timestamp(), _notified().scalar_subquery())
        sql = _CLOCK_SQL_CACHE[key] = stmt.compile(dialect=dialect).string
    return sql


def _notified() -> Any:
    """``count(pg_notify(:channel, queue))`` over the queue names in ``:queues``."""
    queues = (
        func.unnest(cast(bindparam("queues"), ARRAY(Text())))
        .table_valued(column("queue", Text()))
        .render_derived(name="q")
    )
    return select(func.count(func.pg_notify(bindparam("channel"), queues.c.queue)))


def copy_done_sql(
    dialect: Dialect, schema_translate_map: Mapping[str | None, str | None] | None
) -> str:
    """Postgres only: the statement run after a ``copy_rows_sql(..., clock=False)`` COPY
    committed on its own (autocommit).

    Parameters ``first`` (the id of the batch's first job), ``channel`` and ``queues`` as
    for :func:`copy_clock_sql`. Returns one row: that job's ``created_at``, the
    transaction timestamp every row of the batch took for its timestamps, and how many
    notifications were sent (each delivered when this statement commits, at once).
    """

    def build() -> Any:
        created = select(jobs.c.created_at).where(jobs.c.id == bindparam("first"))
        return select(created.scalar_subquery(), _notified().scalar_subquery())

    return compile_once("copy_done", build, dialect, schema_translate_map).string


def _micros(at: datetime) -> int:
    """Microseconds since Postgres' epoch, 2000-01-01 UTC: a timestamptz on the wire."""
    return (at - _PG_EPOCH) // _MICROSECOND


_MIN_US = _micros(datetime.min.replace(tzinfo=UTC))
_MAX_US = _micros(datetime.max.replace(tzinfo=UTC))


def _after(now_us: int, seconds: float) -> int:
    """``now + make_interval(secs => seconds)`` in microseconds: the interval holds
    ``rint(seconds * 1e6)`` microseconds (round half to even, as ``round`` does)."""
    if not math.isfinite(seconds):
        raise UnencodableRow(f"{seconds} seconds")
    at = now_us + round(seconds * 1_000_000)
    if not _MIN_US <= at <= _MAX_US:
        raise UnencodableRow(f"{seconds} seconds from now is out of range")
    return at


def _when(req: EnqueueRequest, now_us: int) -> tuple[int, int | None]:
    """The row's ``scheduled_at`` and ``deadline_at`` in microseconds, as the SQL makes
    them: the explicit time, else now plus the delay; now plus ``schedule_to_close``."""
    if req.scheduled_at is not None:
        scheduled = _micros(req.scheduled_at)
    elif req.delay_s is not None:
        scheduled = _after(now_us, req.delay_s)
    else:
        scheduled = now_us
    stc = req.schedule_to_close_s
    return scheduled, (None if stc is None else _after(now_us, stc))


def _text_field(value: str) -> bytes:
    raw = value.encode()
    return _INT4(len(raw)) + raw


def _json_field(value: Any) -> bytes:
    raw = to_json(value)
    return _JSONB_START(len(raw) + 1, 1) + raw


def _shape(req: EnqueueRequest, created: bytes) -> bytes:
    """actor, queue, priority, max_attempts, start_to_close_s, created_at, updated_at."""
    return b"".join(
        (
            _text_field(req.actor),
            _text_field(req.queue),
            _INT2_FIELD(2, req.priority),
            _NULL if req.max_attempts is None else _INT4_FIELD(4, req.max_attempts),
            _NULL if req.start_to_close_s is None else _FLOAT8_FIELD(8, req.start_to_close_s),
            created,
            created,
        )
    )


def _timing(req: EnqueueRequest, now_us: int) -> bytes:
    """status, scheduled_at, deadline_at, schedule_to_close_s of a job that does not run now
    or has a deadline."""
    scheduled, deadline = _when(req, now_us)
    stc = req.schedule_to_close_s
    return b"".join(
        (
            _PENDING if req.status == "pending" else _SCHEDULED,
            _INT8_FIELD(8, scheduled),
            _NULL if deadline is None else _INT8_FIELD(8, deadline),
            _NULL if stc is None else _FLOAT8_FIELD(8, stc),
        )
    )


def needs_extras(requests: Sequence[EnqueueRequest]) -> bool:
    """Whether a job of ``requests`` sets one of the :data:`COPY_EXTRA_COLUMNS`."""
    return not all([_has_no_extras(req) for req in requests])


def runs_now(requests: Sequence[EnqueueRequest]) -> bool:
    """Whether every job of ``requests`` is pending to run now with no deadline: its row
    can leave the timestamps, the status and the deadline to their defaults
    (``copy_rows_sql(..., clock=False)``)."""
    return all([_is_run_now(req) for req in requests])


def _extras(req: EnqueueRequest) -> bytes:
    """identity_key, tags, metadata, trace_context, parent_job_id of a job that sets one."""
    return b"".join(
        (
            _NULL if req.identity_key is None else _text_field(req.identity_key),
            _json_field(req.tags),
            _json_field(req.metadata),
            _NULL if req.trace_context is None else _json_field(req.trace_context),
            _NULL if req.parent_job_id is None else _UUID_LENGTH + req.parent_job_id.bytes,
        )
    )


class CopyEncoder:
    """The binary COPY data of rows for :func:`copy_rows_sql`, all made at one clock
    reading: send :data:`COPY_HEADER`, then :meth:`encode` of each chunk of requests, then
    :data:`COPY_TRAILER`.

    ``now`` is the server's clock reading from :func:`copy_clock_sql`: ``created_at`` and
    ``updated_at`` of every row, and the base of each delay and deadline. With ``now``
    ``None``, the rows are the ones of ``copy_rows_sql(..., clock=False)``: every job must
    run now (:func:`runs_now`), and the server fills in the timestamps. Without
    ``extras``, the rows are the ones of ``copy_rows_sql(..., extras=False)``. A job that
    does not fit the columns is a ``ValueError``. JSON values are serialised by
    pydantic-core as in :func:`taskq.db.queries.jobs.rows_document`, so the stored
    documents are the same. Binary fields are length-prefixed: no value is escaped, and
    none is interpolated into SQL.
    """

    __slots__ = (
        "_created",
        "_extras",
        "_no_extras",
        "_now_us",
        "_row_start",
        "_runs_now",
        "_shapes",
    )

    def __init__(self, now: datetime | None, *, extras: bool = True) -> None:
        self._now_us = None if now is None else _micros(now)
        self._created = b"" if self._now_us is None else _INT8_FIELD(8, self._now_us)
        self._runs_now = b"" if now is None else _PENDING + self._created + _NULL + _NULL
        self._extras = extras
        self._row_start = _ROW_START(len(copy_columns(clock=now is not None, extras=extras)), 16)
        self._no_extras = (
            _NULL + _json_field([]) + _json_field({}) + _NULL + _NULL if extras else b""
        )
        self._shapes: dict[tuple[Any, ...], bytes] = {}

    def encode(self, requests: Sequence[EnqueueRequest]) -> bytes:
        """The rows of ``requests`` (plain: checked by the caller), in order.
        ``UnencodableRow`` when a timestamp is out of Python's range (the caller aborts
        the COPY)."""
        shapes, created = self._shapes, self._created
        row_start = self._row_start
        out: list[bytes] = []
        put = out.append
        for req in requests:
            raw = to_json(req.payload)
            put(row_start)
            put(req.job_id.bytes)
            put(_JSONB_START(len(raw) + 1, 1))
            put(raw)
            key = (req.actor, req.queue, req.priority, req.max_attempts, req.start_to_close_s)
            shape = shapes.get(key)
            if shape is None:
                shape = shapes[key] = _shape(req, created)
            put(shape)
            put(self._runs_now if _is_run_now(req) else self._timing_of(req))
            put(self._no_extras if _has_no_extras(req) else self._extras_of(req))
        return b"".join(out)

    def _timing_of(self, req: EnqueueRequest) -> bytes:
        if self._now_us is None:
            raise ValueError("CopyEncoder(None): a job does not run now or has a deadline")
        return _timing(req, self._now_us)

    def _extras_of(self, req: EnqueueRequest) -> bytes:
        if not self._extras:
            raise ValueError("CopyEncoder(extras=False): a job sets tags, metadata or the like")
        return _extras(req)

    def row_tail(self, template: EnqueueRequest) -> bytes:
        """Every field of a row of ``template``'s after its id and payload: what each job
        of a bulk batch shares with its actor's template (:meth:`encode_bulk`)."""
        return b"".join(
            (
                _shape(template, self._created),
                self._runs_now if _is_run_now(template) else self._timing_of(template),
                self._no_extras if _has_no_extras(template) else self._extras_of(template),
            )
        )

    def encode_bulk(
        self,
        ids: Sequence[int],
        payloads: Sequence[bytes],
        tails: Sequence[bytes],
    ) -> bytes:
        """The rows of a chunk of :class:`~taskq.bulk_rows.BulkRows`: row ``i`` is the id
        whose 128-bit integer is ``ids[i]``, the payload whose JSON text is
        ``payloads[i]`` and ``tails[i]`` (its template's :meth:`row_tail`). The same bytes
        :meth:`encode` makes of the rows' requests."""
        row_start = self._row_start
        out: list[bytes] = []
        put = out.append
        for job_id, raw, tail in zip(ids, payloads, tails, strict=True):
            put(row_start)
            put(job_id.to_bytes(16, "big"))
            put(_JSONB_START(len(raw) + 1, 1))
            put(raw)
            put(tail)
        return b"".join(out)


def _is_run_now(req: EnqueueRequest) -> bool:
    """The row's timing fields are the encoder's ``_runs_now``: pending, no deadline."""
    return req.status == "pending" and req.schedule_to_close_s is None


def _has_no_extras(req: EnqueueRequest) -> bool:
    """The row's last fields are the encoder's ``_no_extras``: all unset."""
    return (
        req.identity_key is None
        and not req.tags
        and not req.metadata
        and req.trace_context is None
        and req.parent_job_id is None
    )


def check_encodable(requests: Sequence[EnqueueRequest], now: datetime) -> None:
    """``UnencodableRow`` if a timestamp of ``requests`` at the reading ``now`` is out of
    Python's range, as :meth:`CopyEncoder.encode` would raise mid-COPY: for a caller's
    transaction, which an aborted COPY would abort, before any row is sent."""
    now_us = _micros(now)
    for req in requests:
        if not _is_run_now(req):
            _when(req, now_us)


def copied_records(requests: Sequence[EnqueueRequest], now: datetime) -> list[RecordSource]:
    """Job records, in request order, of the rows :class:`CopyEncoder` wrote at ``now``.

    Each equals a re-read of its row: the timestamps are the ones written, at the
    microsecond, in UTC (as the store returns them); the rest is the request and the table's
    defaults. Deferred, as :func:`taskq.db.queries.jobs.inserted_records`'s are.
    ``UnencodableRow`` when a timestamp is out of Python's range, exactly as
    :class:`CopyEncoder`.
    """
    now = now.astimezone(UTC)
    now_us = _micros(now)
    out: list[RecordSource] = []
    for req in requests:
        if _is_run_now(req):
            out.append(InsertedRecord(req, now, None, now))
            continue
        scheduled, deadline = _when(req, now_us)
        out.append(
            InsertedRecord(
                req,
                now + (scheduled - now_us) * _MICROSECOND,
                None if deadline is None else now + (deadline - now_us) * _MICROSECOND,
                now,
            )
        )
    return out
