"""An enqueue writes exactly one job and returns what it wrote, even across a dead pooled
connection: the one-statement plain enqueue on Postgres, what it returns, whom it wakes,
how it survives a dead connection (async and sync clients)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from pydantic import BaseModel
from sqlalchemy import func, select
from sqlalchemy.engine import URL
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection
from structlog.testing import capture_logs

from taskq import TaskQ, actor
from taskq.backends import sql as sql_backend
from taskq.db import dialect
from taskq.db.queries.dispatch import notify_channel
from taskq.db.tables import jobs
from taskq.exceptions import StoreUnavailable
from taskq.records import EnqueueArgs
from taskq.settings import TaskQSettings
from tests.support.pg import count_jobs, kill_other_backends, libpq, refusing


class Ping(BaseModel):
    n: int
    text: str = "héllo"
    ratio: float = 0.1


@actor(name="fast_plain", queue="fast_a", priority=2)
async def fast_plain(payload: Ping) -> None: ...


async def test_returned_records_equal_the_rows_written(
    pg_url: URL, settings: TaskQSettings
) -> None:
    async with TaskQ(pg_url, settings=settings) as tq:
        one = await tq.jobs.enqueue(
            fast_plain,
            Ping(n=1, ratio=2.5e-5),
            queue="fast_b",
            priority=-7,
            delay=timedelta(seconds=30),
            tags=["x", "y"],
            metadata={"nested": {"k": [1, 2.5, None]}},
            start_to_close=timedelta(seconds=3),
            schedule_to_close=timedelta(minutes=5),
        )
        at = datetime(2031, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
        many = await tq.jobs.enqueue_many(
            [(fast_plain, Ping(n=i)) for i in range(3)]
            + [EnqueueArgs(fast_plain, {"n": 9}, {"scheduled_at": at})]
        )
        # The single enqueue's own statement (one row): every timing case.
        now_one = await tq.jobs.enqueue(fast_plain, Ping(n=2))
        at_one = await tq.jobs.enqueue(fast_plain, Ping(n=3), scheduled_at=at)
        for handle in [one, *many, now_one, at_one]:
            assert handle.record is not None
            assert handle.record == await handle.refresh()
        assert now_one.record is not None
        assert at_one.record is not None
        assert now_one.record.status == "pending"
        assert now_one.record.scheduled_at == now_one.record.created_at
        assert now_one.record.deadline_at is None
        assert at_one.record.scheduled_at == at
        first, *batch = (h.record for h in [one, *many])
        assert first is not None
        assert first.status == "scheduled"
        assert first.deadline_at is not None
        assert batch[0] is not None
        assert batch[0].status == "pending"
        assert batch[0].deadline_at is None
        assert batch[3] is not None
        assert batch[3].scheduled_at == at
        assert len({r.created_at for r in batch if r is not None}) == 1


async def test_one_notification_per_queue_at_commit(pg_url: URL, settings: TaskQSettings) -> None:
    listener = await psycopg.AsyncConnection.connect(libpq(pg_url), autocommit=True)
    channel = notify_channel(settings.schema_name)
    await listener.execute(psycopg.sql.SQL("LISTEN {}").format(psycopg.sql.Identifier(channel)))
    async with TaskQ(pg_url, settings=settings) as tq:
        await tq.jobs.enqueue_many(
            [(fast_plain, Ping(n=i)) for i in range(5)]
            + [EnqueueArgs(fast_plain, {"n": 7}, {"queue": "fast_c"})]
        )
        await tq.jobs.enqueue(fast_plain, Ping(n=8))
    seen: list[str] = []

    async def collect() -> None:
        async for note in listener.notifies():
            assert note.channel == channel
            seen.append(note.payload)
            if len(seen) == 3:
                return

    await asyncio.wait_for(collect(), timeout=5)
    await listener.close()
    assert sorted(seen) == ["fast_a", "fast_a", "fast_c"]


async def test_async_enqueue_survives_a_dead_pooled_connection(
    pg_url: URL, settings: TaskQSettings
) -> None:
    async with TaskQ(pg_url, settings=settings) as tq:
        await tq.jobs.enqueue(fast_plain, Ping(n=1))  # leaves a connection in the pool
        assert kill_other_backends(pg_url) >= 1
        with capture_logs() as logs:
            handle = await tq.jobs.enqueue(fast_plain, Ping(n=2))
        assert [e["event"] for e in logs] == ["enqueue_retry_after_disconnect"]
        assert await handle.status() == "pending"
        assert count_jobs(pg_url, "fast_plain") == 2


def test_sync_enqueue_survives_a_dead_pooled_connection(
    pg_url: URL, settings: TaskQSettings
) -> None:
    from taskq_sync import TaskQ as SyncTaskQ

    with SyncTaskQ(pg_url, settings=settings) as tq:
        tq.jobs.enqueue(fast_plain, Ping(n=1))
        assert kill_other_backends(pg_url) >= 1
        handles = tq.jobs.enqueue_many([(fast_plain, Ping(n=i)) for i in range(3)])
        assert [h.status() for h in handles] == ["pending"] * 3
        assert count_jobs(pg_url, "fast_plain") == 4


async def test_retry_after_a_lost_reply_writes_no_duplicate(
    pg_url: URL, settings: TaskQSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The connection dies after the server committed: the retry finds the rows, adds none."""
    real = sql_backend._execute_on_driver
    calls: list[str] = []

    async def commit_then_lose_the_reply(conn: AsyncConnection, sql: str, params: Any) -> Any:
        rows = await real(conn, sql, params)
        calls.append(sql)
        if len(calls) == 1:
            raise DBAPIError(
                sql,
                None,
                psycopg.OperationalError("server closed the connection unexpectedly"),
                connection_invalidated=True,
            )
        return rows

    monkeypatch.setattr(sql_backend, "_execute_on_driver", commit_then_lose_the_reply)
    async with TaskQ(pg_url, settings=settings) as tq:
        handles = await tq.jobs.enqueue_many([(fast_plain, Ping(n=i)) for i in range(3)])
        assert len(calls) == 2
        assert "ON CONFLICT (id) DO NOTHING" in calls[1]
        assert count_jobs(pg_url, "fast_plain") == 3
        for handle in handles:
            assert handle.record == await handle.refresh()
            assert handle.was_existing is False


async def test_a_second_failure_is_raised_as_store_unavailable(
    pg_url: URL, settings: TaskQSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def always_lost(conn: AsyncConnection, sql: str, params: Any) -> Any:
        raise DBAPIError(sql, None, psycopg.OperationalError("gone"), connection_invalidated=True)

    monkeypatch.setattr(sql_backend, "_execute_on_driver", always_lost)
    async with TaskQ(pg_url, settings=settings) as tq:
        with pytest.raises(StoreUnavailable) as caught:
            await tq.jobs.enqueue(fast_plain, Ping(n=1))
    assert isinstance(caught.value.__cause__, DBAPIError)


async def test_a_driver_error_is_a_dbapi_error_and_writes_nothing(
    pg_url: URL, settings: TaskQSettings
) -> None:
    """The server refuses a row (an operator's CHECK): the statement fails whole, as
    SQLAlchemy would raise it."""
    async with TaskQ(pg_url, settings=settings) as tq:
        with refusing(pg_url, "refused"), pytest.raises(DBAPIError) as caught:
            await tq.jobs.enqueue_many(
                [(fast_plain, Ping(n=1)), (fast_plain, Ping(n=2, text="refused"))]
            )
        assert isinstance(caught.value.orig, psycopg.Error)
        assert caught.value.connection_invalidated is False
        assert count_jobs(pg_url, "fast_plain") == 0
        handle = await tq.jobs.enqueue(fast_plain, Ping(n=3))  # the connection is still good
        assert await handle.status() == "pending"


async def test_an_idle_dead_connection_is_replaced_at_checkout(
    pg_url: URL, settings: TaskQSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reads are not retried; the idle ping hides a connection that died while pooled."""
    monkeypatch.setattr(dialect, "IDLE_PING_AFTER_S", 0.0)
    async with TaskQ(pg_url, settings=settings) as tq:
        handle = await tq.jobs.enqueue(fast_plain, Ping(n=1))
        assert kill_other_backends(pg_url) >= 1
        assert await handle.status() == "pending"
        async with tq.engine.connect() as conn:
            n = (await conn.execute(select(func.count()).select_from(jobs))).scalar_one()
        assert n == 1
