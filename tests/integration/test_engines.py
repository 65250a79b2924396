"""Engine behaviour on the real stores: SQLite's WAL/busy-timeout/BEGIN IMMEDIATE, UTC times."""

from __future__ import annotations

import asyncio
import sqlite3
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import func, select
from sqlalchemy.engine import URL, make_url

from taskq.db import tables
from taskq.db.dialect import now
from taskq.db.engine import make_engine, transaction
from taskq.settings import TaskQSettings
from taskq_sync.db.engine import make_engine as make_sync_engine
from taskq_sync.db.engine import transaction as sync_transaction


def _sqlite_path(url: str) -> str:
    database = make_url(url).database
    assert database is not None
    return database


async def test_sqlite_engine_uses_wal_and_busy_timeout(
    sqlite_url: str, settings: TaskQSettings
) -> None:
    engine = make_engine(sqlite_url, settings=settings)
    async with engine.connect() as conn:
        assert (await conn.exec_driver_sql("PRAGMA journal_mode")).scalar() == "wal"
        timeout = (await conn.exec_driver_sql("PRAGMA busy_timeout")).scalar()
        assert timeout == settings.sqlite_busy_timeout_ms
    await engine.dispose()


async def test_sqlite_write_transaction_takes_the_lock_at_begin(
    sqlite_url: str, settings: TaskQSettings
) -> None:
    engine = make_engine(sqlite_url, settings=settings)
    other = sqlite3.connect(_sqlite_path(sqlite_url), timeout=0, isolation_level=None)
    async with transaction(engine) as conn:
        await conn.execute(select(1))  # only a read: BEGIN IMMEDIATE already holds the lock
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            other.execute("BEGIN IMMEDIATE")
    other.execute("BEGIN IMMEDIATE")  # released at commit
    other.execute("ROLLBACK")
    # A read-only transaction does not take the write lock.
    async with transaction(engine, readonly=True) as conn:
        await conn.execute(select(1))
        other.execute("BEGIN IMMEDIATE")
        other.execute("ROLLBACK")
    other.close()
    await engine.dispose()


async def test_sqlite_concurrent_writers_serialise_without_errors(
    sqlite_url: str, settings: TaskQSettings
) -> None:
    """Many concurrent read-modify-write transactions lose no update (no 'database is locked')."""
    engines = [make_engine(sqlite_url, settings=settings) for _ in range(4)]
    async with transaction(engines[0]) as conn:
        await conn.execute(
            tables.queues.insert().values(name="counter", max_concurrent=1, mode="fifo")
        )

    async def bump(engine_index: int) -> None:
        async with transaction(engines[engine_index % 4]) as conn:
            value = await conn.scalar(
                select(tables.queues.c.max_concurrent).where(tables.queues.c.name == "counter")
            )
            assert value is not None
            await conn.execute(
                tables.queues.update()
                .where(tables.queues.c.name == "counter")
                .values(max_concurrent=value + 1)
            )

    await asyncio.gather(*(bump(i) for i in range(40)))
    async with transaction(engines[0], readonly=True) as conn:
        final = await conn.scalar(select(tables.queues.c.max_concurrent))
    for engine in engines:
        await engine.dispose()
    assert final == 41


async def test_timestamps_round_trip_as_aware_utc(
    engine_url: str | URL, settings: TaskQSettings
) -> None:
    engine = make_engine(engine_url, settings=settings)
    when = datetime(2030, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
    job_id = uuid.uuid4()
    async with transaction(engine) as conn:
        await conn.execute(
            tables.jobs.insert().values(id=job_id, actor="a", payload={}, scheduled_at=when)
        )
        store_now = await conn.scalar(select(now(conn.dialect.name)))
    async with transaction(engine, readonly=True) as conn:
        row = (await conn.execute(select(tables.jobs).where(tables.jobs.c.id == job_id))).one()
    await engine.dispose()
    assert row.scheduled_at == when
    assert row.scheduled_at.tzinfo is not None
    assert row.created_at.tzinfo is not None
    assert abs(row.created_at - datetime.now(UTC)) < timedelta(minutes=5)
    assert row.status == "pending"
    assert row.singleton is False
    assert row.tags == []
    assert row.metadata == {}
    assert store_now is not None


def test_sync_engine_round_trip(engine_url: str | URL, settings: TaskQSettings) -> None:
    engine = make_sync_engine(engine_url, settings=settings)
    with sync_transaction(engine) as conn:
        conn.execute(tables.queues.insert().values(name="q1"))
    with sync_transaction(engine, readonly=True) as conn:
        rows = conn.execute(select(tables.queues.c.name, tables.queues.c.paused)).all()
    engine.dispose()
    assert [(r.name, r.paused) for r in rows] == [("q1", False)]


async def test_singleton_partial_unique_index(
    engine_url: str | URL, settings: TaskQSettings
) -> None:
    """Two active jobs of a singleton actor cannot coexist; terminal ones do not count."""
    from sqlalchemy.exc import IntegrityError

    engine = make_engine(engine_url, settings=settings)
    at = datetime.now(UTC)

    async def insert(status: str) -> None:
        async with transaction(engine) as conn:
            await conn.execute(
                tables.jobs.insert().values(
                    id=uuid.uuid4(),
                    actor="s",
                    payload={},
                    scheduled_at=at,
                    singleton=True,
                    status=status,
                )
            )

    await insert("succeeded")
    await insert("pending")
    with pytest.raises(IntegrityError):
        await insert("running")
    await insert("failed")
    await engine.dispose()


async def test_check_constraints_reject_bad_rows(
    engine_url: str | URL, settings: TaskQSettings
) -> None:
    from sqlalchemy.exc import IntegrityError

    engine = make_engine(engine_url, settings=settings)
    with pytest.raises(IntegrityError):
        async with transaction(engine) as conn:
            await conn.execute(tables.queues.insert().values(name="q", max_concurrent=0))
    with pytest.raises(IntegrityError):
        async with transaction(engine) as conn:
            await conn.execute(
                tables.jobs.insert().values(
                    id=uuid.uuid4(),
                    actor="a",
                    payload={},
                    scheduled_at=datetime.now(UTC),
                    status="bogus",
                )
            )
    async with transaction(engine, readonly=True) as conn:
        assert await conn.scalar(select(func.count()).select_from(tables.queues)) == 0
    await engine.dispose()
