"""The plain enqueue's held connections (``taskq.backends.held.HeldConnections``), on Postgres.

The backend keeps autocommit connections checked out between enqueues. These tests pin
what makes that safe: each in-flight enqueue has a connection of its own (tasks and
threads), no more are kept than the cap, all go back on close, a dead one is replaced
with exactly one job per request, and a long-idle one goes back through the pool's ping.
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from pydantic import BaseModel
from sqlalchemy.engine import URL
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, create_async_engine
from sqlalchemy.pool import NullPool
from structlog.testing import capture_logs

from taskq import TaskQ, actor
from taskq.backends import held as held_module
from taskq.backends import sql as sql_backend
from taskq.db import dialect
from taskq.db.engine import make_engine
from taskq.settings import TaskQSettings
from tests.support.pg import count_jobs, kill_other_backends, refusing

pytestmark = pytest.mark.integration


class Note(BaseModel):
    n: int
    text: str = ""


@actor(name="held_plain")
async def held_plain(payload: Note) -> None: ...


class _Exclusive:
    """Records the driver connections in flight; fails if two statements share one."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.in_flight: set[int] = set()
        self.seen: set[int] = set()
        self.peak = 0
        self.clash = False

    def enter(self, driver: object) -> None:
        with self.lock:
            if id(driver) in self.in_flight:
                self.clash = True
            self.in_flight.add(id(driver))
            self.seen.add(id(driver))
            self.peak = max(self.peak, len(self.in_flight))

    def leave(self, driver: object) -> None:
        with self.lock:
            self.in_flight.discard(id(driver))


def test_the_cap_follows_the_pool(pg_url: URL, settings: TaskQSettings) -> None:
    engine = make_engine(pg_url, settings=settings)  # pool_size 10, overflow 10
    assert held_module.held_connections_cap(engine) == 4
    small = make_engine(pg_url, settings=settings.model_copy(update={"pool_size": 2}))
    assert held_module.held_connections_cap(small) == 1
    tiny = create_async_engine(pg_url, pool_size=1, max_overflow=0)
    assert held_module.held_connections_cap(tiny) == 0
    unpooled = create_async_engine(pg_url, poolclass=NullPool)
    assert held_module.held_connections_cap(unpooled) == 0
    with pytest.raises(ValueError, match="held_connections"):
        sql_backend.SqlBackend(engine, held_connections=-1)


async def test_held_connections_go_back_on_close(pg_url: URL, settings: TaskQSettings) -> None:
    engine = make_engine(pg_url, settings=settings)
    try:
        tq = TaskQ(engine=engine, settings=settings)
        await tq.jobs.enqueue(held_plain, Note(n=1))
        await tq.jobs.enqueue(held_plain, Note(n=2))
        assert tq.backend.held.idle == 1  # reused, not one per enqueue
        assert engine.pool.checkedout() == 1  # type: ignore[attr-defined]
        await tq.aclose()
        assert tq.backend.held.idle == 0
        assert engine.pool.checkedout() == 0  # type: ignore[attr-defined]
        await tq.aclose()  # idempotent
        # A closed backend still enqueues, without keeping the connection.
        await tq.jobs.enqueue(held_plain, Note(n=3))
        assert engine.pool.checkedout() == 0  # type: ignore[attr-defined]
    finally:
        await engine.dispose()
    assert count_jobs(pg_url, "held_plain") == 3


async def test_concurrent_tasks_each_get_their_own_connection(
    pg_url: URL, settings: TaskQSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = sql_backend._execute_on_driver
    guard = _Exclusive()

    async def tracked(conn: AsyncConnection, sql: str, params: Any) -> Any:
        driver = await conn.get_raw_connection()
        guard.enter(driver.driver_connection)
        try:
            await asyncio.sleep(0.005)  # keep it in flight while the others start
            return await real(conn, sql, params)
        finally:
            guard.leave(driver.driver_connection)

    monkeypatch.setattr(sql_backend, "_execute_on_driver", tracked)
    async with TaskQ(pg_url, settings=settings) as tq:
        for _ in range(3):
            handles = await asyncio.gather(
                *(tq.jobs.enqueue(held_plain, Note(n=i)) for i in range(16))
            )
            assert len({h.job_id for h in handles}) == 16
            assert tq.backend.held.idle <= tq.backend.held.keep == 4
        assert not guard.clash
        assert guard.peak > 4  # more in flight than are kept: extras went back
        assert tq.engine.pool.checkedout() == tq.backend.held.idle  # type: ignore[attr-defined]
    assert count_jobs(pg_url, "held_plain") == 48


def test_sync_facade_threads_each_get_their_own_connection(
    pg_url: URL, settings: TaskQSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    from taskq_sync import TaskQ as SyncTaskQ
    from taskq_sync.backends import sql as sync_sql

    real = sync_sql._execute_on_driver
    guard = _Exclusive()

    def tracked(conn: Any, sql: str, params: Any) -> Any:
        driver = conn.connection.driver_connection
        guard.enter(driver)
        try:
            return real(conn, sql, params)
        finally:
            guard.leave(driver)

    monkeypatch.setattr(sync_sql, "_execute_on_driver", tracked)
    with SyncTaskQ(pg_url, settings=settings) as tq:
        with ThreadPoolExecutor(12) as pool:
            handles = list(pool.map(lambda i: tq.jobs.enqueue(held_plain, Note(n=i)), range(240)))
        assert len({h.job_id for h in handles}) == 240
        assert not guard.clash
        assert 1 <= tq.backend.held.idle <= tq.backend.held.keep
        assert tq.engine.pool.checkedout() == tq.backend.held.idle  # type: ignore[attr-defined]
    assert tq.engine.pool.checkedout() == 0  # type: ignore[attr-defined]
    assert count_jobs(pg_url, "held_plain") == 240


async def test_dead_held_connections_give_exactly_one_job_per_request(
    pg_url: URL, settings: TaskQSettings
) -> None:
    async with TaskQ(pg_url, settings=settings) as tq:
        await asyncio.gather(*(tq.jobs.enqueue(held_plain, Note(n=i)) for i in range(8)))
        assert tq.backend.held.idle == 4
        assert kill_other_backends(pg_url) >= 4  # every held connection dies
        with capture_logs() as logs:
            first = await tq.jobs.enqueue(held_plain, Note(n=100))
            rest = [await tq.jobs.enqueue(held_plain, Note(n=100 + i)) for i in range(1, 6)]
        # One retry: the other dead held connections went back to the pool with the
        # first, and the pool (invalidated by the disconnect) replaced them.
        assert [e["event"] for e in logs] == ["enqueue_retry_after_disconnect"]
        assert [await h.status() for h in [first, *rest]] == ["pending"] * 6
        assert tq.backend.held.idle == 1
    assert count_jobs(pg_url, "held_plain") == 8 + 6


async def test_a_long_idle_held_connection_goes_back_through_the_pool_ping(
    pg_url: URL, settings: TaskQSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Held past the idle threshold, a connection is not trusted: the pool pings it."""
    monkeypatch.setattr(dialect, "IDLE_PING_AFTER_S", 0.0)
    async with TaskQ(pg_url, settings=settings) as tq:
        await tq.jobs.enqueue(held_plain, Note(n=1))
        assert tq.backend.held.idle == 1
        assert kill_other_backends(pg_url) >= 1
        with capture_logs() as logs:
            handle = await tq.jobs.enqueue(held_plain, Note(n=2))
        assert logs == []  # replaced at checkout by the ping, no failed statement
        assert await handle.status() == "pending"
    assert count_jobs(pg_url, "held_plain") == 2


async def test_a_failed_statement_does_not_keep_its_connection(
    pg_url: URL, settings: TaskQSettings
) -> None:
    async with TaskQ(pg_url, settings=settings) as tq:
        await tq.jobs.enqueue(held_plain, Note(n=1))
        with refusing(pg_url, "refused"), pytest.raises(DBAPIError):
            await tq.jobs.enqueue(held_plain, Note(n=2, text="refused"))
        assert tq.backend.held.idle == 0
        await tq.jobs.enqueue(held_plain, Note(n=3))
        assert tq.backend.held.idle == 1
    assert count_jobs(pg_url, "held_plain") == 2


async def test_cancelled_enqueue_does_not_keep_its_connection(
    pg_url: URL, settings: TaskQSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    started = asyncio.Event()

    async def hang(conn: AsyncConnection, sql: str, params: Any) -> Any:
        started.set()
        await asyncio.sleep(30)

    async with TaskQ(pg_url, settings=settings) as tq:
        await tq.jobs.enqueue(held_plain, Note(n=1))
        monkeypatch.setattr(sql_backend, "_execute_on_driver", hang)
        task = asyncio.create_task(tq.jobs.enqueue(held_plain, Note(n=2)))
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert tq.backend.held.idle == 0
        assert tq.engine.pool.checkedout() == 0  # type: ignore[attr-defined]
