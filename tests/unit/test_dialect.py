"""The Postgres/SQLite differences: URLs, engine options, clock, error translation."""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from sqlalchemy import event, select, text
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import OperationalError

from taskq.db import dialect, tables
from taskq.db.types import UTCDateTime
from taskq.exceptions import SchemaNotReady
from taskq.settings import TaskQSettings

_PG = postgresql.dialect()
_LITE = sqlite.dialect()


@pytest.mark.parametrize(
    ("given", "async_", "sync"),
    [
        ("postgresql://u@h/db", "postgresql+psycopg", "postgresql+psycopg"),
        ("postgresql+psycopg://u@h/db", "postgresql+psycopg", "postgresql+psycopg"),
        ("postgresql+asyncpg://u@h/db", "postgresql+psycopg", "postgresql+psycopg"),
        ("sqlite:///x.db", "sqlite+aiosqlite", "sqlite+pysqlite"),
        ("sqlite+aiosqlite:///x.db", "sqlite+aiosqlite", "sqlite+pysqlite"),
    ],
)
def test_one_url_serves_both_engines(given: str, async_: str, sync: str) -> None:
    assert dialect.async_url(given).drivername == async_
    assert dialect.sync_url(given).drivername == sync
    assert dialect.async_url(given).database == dialect.sync_url(given).database


@pytest.mark.parametrize("url", ["mysql://u@h/db", "oracle://x"])
def test_unsupported_url_is_refused(url: str) -> None:
    with pytest.raises(ValueError, match="unsupported database URL"):
        dialect.async_url(url)


def test_schema_translation_only_on_postgres() -> None:
    s = TaskQSettings.load(schema_name="custom")
    pg = dialect.engine_options("postgresql://u@h/db", s)
    lite = dialect.engine_options("sqlite:///x.db", s)
    assert pg["execution_options"]["schema_translate_map"] == {None: "custom"}
    assert lite["execution_options"]["schema_translate_map"] == {}


def test_store_clock_expression() -> None:
    pg = select(dialect.now("postgresql")).compile(dialect=_PG)
    lite = select(dialect.now("sqlite")).compile(dialect=_LITE)
    assert "clock_timestamp()" in str(pg)
    assert "strftime" in str(lite)


def test_advisory_lock_binds_the_key() -> None:
    stmt = dialect.advisory_xact_lock("postgresql", "actor:key")
    assert stmt is not None
    compiled = stmt.compile(dialect=_PG)
    assert "pg_advisory_xact_lock(hashtextextended(" in str(compiled)
    assert "actor:key" in compiled.params.values()
    assert dialect.advisory_xact_lock("sqlite", "actor:key") is None


def _dbapi_error(message: str, sqlstate: str | None = None) -> OperationalError:
    orig = sqlite3.OperationalError(message)
    if sqlstate is not None:
        orig.sqlstate = sqlstate  # type: ignore[attr-defined]
    return OperationalError("SELECT", {}, orig)


def test_missing_table_becomes_schema_not_ready() -> None:
    lite = dialect.translate_error(_dbapi_error("no such table: jobs"))
    assert isinstance(lite, SchemaNotReady)
    assert lite.table == "jobs"
    pg = dialect.translate_error(
        _dbapi_error('relation "taskq.reservation_slots" does not exist', "42P01")
    )
    assert isinstance(pg, SchemaNotReady)
    assert pg.table == "reservation_slots"
    assert "run: taskq migrate up" in str(pg)
    other = _dbapi_error("disk I/O error")
    assert dialect.translate_error(other) is other


def test_utc_datetime_type() -> None:
    col = UTCDateTime()
    lite, pg = _LITE, _PG
    when = datetime(2030, 1, 1, 12, tzinfo=timezone(timedelta(hours=2)))
    assert col.process_bind_param(when, lite) == datetime(2030, 1, 1, 10)
    assert col.process_bind_param(when, pg) == datetime(2030, 1, 1, 10, tzinfo=UTC)
    assert col.process_result_value("2030-01-01 10:00:00.123", lite) == datetime(
        2030, 1, 1, 10, 0, 0, 123000, tzinfo=UTC
    )
    with pytest.raises(ValueError, match="naive"):
        col.process_bind_param(datetime(2030, 1, 1), pg)


def test_every_table_is_unqualified() -> None:
    """The schema comes from schema_translate_map, never from the table definitions."""
    assert all(t.schema is None for t in tables.metadata.sorted_tables)


@pytest.mark.engine("sqlite")
def test_sqlite_file_connections_are_pooled_and_set_up_once(tmp_path: Any) -> None:
    """A file engine keeps its connections (WAL, busy timeout, BEGIN IMMEDIATE each time).

    Opening a SQLite connection and running the setup PRAGMAs cost more than an enqueue,
    so they are pooled; overflow is unlimited so no caller ever waits for the pool.
    """
    from taskq_sync.db.engine import make_engine

    options = dialect.engine_options("sqlite:///x.db", TaskQSettings.load(pool_size=4))
    assert options["pool_size"] == 4
    assert options["max_overflow"] == -1
    assert "poolclass" not in options
    engine = make_engine(f"sqlite:///{tmp_path / 'p.db'}")
    connects: list[int] = []
    event.listen(engine, "connect", lambda *_: connects.append(1))
    try:
        for _ in range(5):
            with engine.begin() as conn:
                assert conn.execute(text("PRAGMA journal_mode")).scalar() == "wal"
                assert conn.execute(text("PRAGMA busy_timeout")).scalar() == 30_000
                dbapi = conn.connection.dbapi_connection
                assert dbapi is not None
                assert dbapi.in_transaction  # BEGIN IMMEDIATE
        assert len(connects) == 1
    finally:
        engine.dispose()
