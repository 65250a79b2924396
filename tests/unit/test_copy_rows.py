"""The binary COPY data and statement of the Postgres bulk enqueue (taskq.db.queries.jobs)."""

from __future__ import annotations

import struct
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy.dialects.postgresql import psycopg

from taskq._ids import new_job_id
from taskq.db.queries import copy_rows as q
from taskq.db.tables import jobs
from taskq.records import EnqueueRequest

NOW = datetime(2026, 5, 6, 7, 8, 9, 123456, tzinfo=UTC)


def _request(**options: Any) -> EnqueueRequest:
    return EnqueueRequest(
        job_id=new_job_id(), actor="a", queue="q", payload={"s": "é\\\t"}, **options
    )


def _rows(data: bytes) -> list[list[bytes | None]]:
    """Parse binary COPY data back into fields (what the server does with it)."""
    assert data.startswith(b"PGCOPY\n\xff\r\n\x00\x00\x00\x00\x00\x00\x00\x00\x00")
    at = 19
    rows: list[list[bytes | None]] = []
    while True:
        (count,) = struct.unpack_from(">h", data, at)
        at += 2
        if count == -1:
            assert at == len(data)
            return rows
        row: list[bytes | None] = []
        for _ in range(count):
            (length,) = struct.unpack_from(">i", data, at)
            at += 4
            if length == -1:
                row.append(None)
            else:
                row.append(data[at : at + length])
                at += length
        rows.append(row)


def test_copy_statement_names_the_table_through_the_schema_map() -> None:
    dialect = psycopg.dialect()
    columns = ", ".join(col.name for col in q.COPY_COLUMNS)
    assert q.copy_rows_sql(dialect, {None: "taskq"}) == (
        f"COPY taskq.jobs ({columns}) FROM STDIN (FORMAT BINARY)"
    )
    assert q.copy_rows_sql(dialect, {None: "Odd Name"}).startswith('COPY "Odd Name".jobs (')
    assert q.copy_rows_sql(dialect, None).startswith("COPY jobs (id, payload, ")
    assert q.copy_rows_sql(dialect, {None: "taskq"}, row_at_a_time=True) == (
        f"COPY taskq.jobs ({columns}) FROM STDIN (FORMAT BINARY) WHERE pg_catalog.random() >= 0"
    )


def test_copy_columns_are_the_ones_a_plain_row_sets_with_the_types_encoded() -> None:
    """The encoder writes each column in its binary wire format: a type change here must
    change the encoder too. Columns left out take their defaults, as in the statement."""
    expected = {
        "id": "UUID",
        "payload": "JSONB",
        "actor": "VARCHAR(200)",
        "queue": "VARCHAR(200)",
        "priority": "SMALLINT",
        "max_attempts": "INTEGER",
        "start_to_close_s": "FLOAT",
        "created_at": "TIMESTAMP WITH TIME ZONE",
        "updated_at": "TIMESTAMP WITH TIME ZONE",
        "status": "VARCHAR(16)",
        "scheduled_at": "TIMESTAMP WITH TIME ZONE",
        "deadline_at": "TIMESTAMP WITH TIME ZONE",
        "schedule_to_close_s": "FLOAT",
        "identity_key": "VARCHAR(200)",
        "tags": "JSONB",
        "metadata": "JSONB",
        "trace_context": "JSONB",
        "parent_job_id": "UUID",
    }
    dialect = psycopg.dialect()
    assert [col.name for col in q.COPY_COLUMNS] == list(expected)
    for col in q.COPY_COLUMNS:
        assert col.table is jobs
        assert col.type.compile(dialect=dialect) == expected[col.name], col.name
    for col in jobs.c:
        if col.name not in expected:
            assert col.nullable or col.server_default is not None, col.name


def _copy_data(requests: list[EnqueueRequest], now: datetime, rows: int = 250) -> bytes:
    """The COPY data as the backend sends it: header, each chunk's rows, trailer."""
    encoder = q.CopyEncoder(now)
    chunks = [encoder.encode(requests[i : i + rows]) for i in range(0, len(requests), rows)]
    return q.COPY_HEADER + b"".join(chunks) + q.COPY_TRAILER


def test_chunks_carry_every_row_once_with_one_header_and_one_trailer() -> None:
    requests = [_request() for _ in range(601)]
    rows = _rows(_copy_data(requests, NOW))
    assert [row[0] for row in rows] == [req.job_id.bytes for req in requests]
    assert {len(row) for row in rows} == {len(q.COPY_COLUMNS)}
    payload = rows[0][1]
    assert payload == b"\x01" + '{"s":"é\\\\\\t"}'.encode()  # jsonb version 1, JSON as is


def test_encodable_timestamps_pass_the_check() -> None:
    q.check_encodable([_request(), _request(delay_s=1e9, schedule_to_close_s=2.5)], NOW)


def test_timestamps_are_the_reading_plus_rounded_intervals() -> None:
    requests = [
        _request(),
        _request(delay_s=2.5e-6, schedule_to_close_s=3.5e-6),
        _request(scheduled_at=datetime(2030, 1, 1, tzinfo=UTC)),
    ]
    names = [col.name for col in q.COPY_COLUMNS]
    rows = _rows(_copy_data(requests, NOW))
    epoch = datetime(2000, 1, 1, tzinfo=UTC)

    def at(row: list[bytes | None], name: str) -> datetime | None:
        raw = row[names.index(name)]
        return None if raw is None else epoch + timedelta(microseconds=struct.unpack(">q", raw)[0])

    records = [source() for source in q.copied_records(requests, NOW)]  # type: ignore[operator]
    for row, record in zip(rows, records, strict=True):
        assert at(row, "created_at") == at(row, "updated_at") == NOW == record.created_at
        assert at(row, "scheduled_at") == record.scheduled_at
        assert at(row, "deadline_at") == record.deadline_at
        assert row[names.index("status")] == record.status.encode()
    assert records[1].scheduled_at == NOW + timedelta(microseconds=2)  # half to even
    assert records[1].deadline_at == NOW + timedelta(microseconds=4)
    assert records[2].scheduled_at == datetime(2030, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize(
    "options",
    [
        {"schedule_to_close_s": 86400.0 * 365 * 9000},
        {"delay_s": float("inf")},
        {"delay_s": float("nan")},
    ],
)
def test_a_timestamp_python_cannot_hold_is_unencodable(options: dict[str, float]) -> None:
    requests = [_request(), _request(**options)]
    with pytest.raises(q.UnencodableRow):
        q.copied_records(requests, NOW)
    with pytest.raises(q.UnencodableRow):
        q.check_encodable(requests, NOW)
    with pytest.raises(q.UnencodableRow):
        _copy_data(requests, NOW)


@pytest.mark.parametrize("extras", [True, False])
def test_rows_without_the_clock_are_the_clock_rows_less_its_columns(extras: bool) -> None:
    """``CopyEncoder(None)`` writes exactly the columns of ``copy_columns(clock=False)``:
    the rows of a reading with the timestamps, status and deadline taken out."""
    requests = [_request(priority=2, max_attempts=3), _request(start_to_close_s=1.5)]
    if extras:
        requests.append(_request(identity_key="k", tags=["t"], metadata={"m": 1}))
    assert q.runs_now(requests)
    assert q.needs_extras(requests) == extras
    full = [col.name for col in q.copy_columns(extras=extras)]
    short = [col.name for col in q.copy_columns(clock=False, extras=extras)]
    assert [name for name in full if name not in short] == [
        "created_at",
        "updated_at",
        "status",
        "scheduled_at",
        "deadline_at",
        "schedule_to_close_s",
    ]
    with_clock = _rows(
        q.COPY_HEADER + q.CopyEncoder(NOW, extras=extras).encode(requests) + q.COPY_TRAILER
    )
    without = _rows(
        q.COPY_HEADER + q.CopyEncoder(None, extras=extras).encode(requests) + q.COPY_TRAILER
    )
    assert without == [[row[full.index(name)] for name in short] for row in with_clock]
    dialect = psycopg.dialect()
    assert q.copy_rows_sql(dialect, None, clock=False, extras=extras) == (
        f"COPY jobs ({', '.join(short)}) FROM STDIN (FORMAT BINARY)"
    )


@pytest.mark.parametrize(
    "options",
    [
        {"delay_s": 1.0},
        {"scheduled_at": NOW + timedelta(hours=1)},
        {"schedule_to_close_s": 60.0},
    ],
)
def test_a_job_that_does_not_run_now_has_no_row_without_the_clock(
    options: dict[str, Any],
) -> None:
    requests = [_request(), _request(**options)]
    assert not q.runs_now(requests)
    with pytest.raises(ValueError, match="does not run now"):
        q.CopyEncoder(None).encode(requests)
    with pytest.raises(ValueError, match="does not run now"):
        q.CopyEncoder(None).row_tail(requests[1])


def test_rows_without_extras_refuse_a_job_that_sets_one() -> None:
    with pytest.raises(ValueError, match="tags, metadata"):
        q.CopyEncoder(NOW, extras=False).encode([_request(tags=["t"])])


def test_the_statement_after_a_committing_copy_reads_the_first_row_and_wakes_the_queues() -> None:
    sql = q.copy_done_sql(psycopg.dialect(), {None: "taskq"})
    assert "FROM taskq.jobs" in sql
    assert "taskq.jobs.id = %(first)s" in sql
    assert "pg_notify(%(channel)s, q.queue)" in sql
    assert q.copy_done_sql(psycopg.dialect(), {None: "other"}) != sql
