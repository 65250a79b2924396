"""``connection=`` takes a SQLAlchemy or a psycopg connection and runs in its transaction.

Real Postgres. The caller's transaction decides: commit keeps the job, rollback leaves
none; taskq never commits, rolls back or closes the caller's connection, and JSON comes
back decoded even when the caller's connection loads ``jsonb`` as text (as Django's do).
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from psycopg.types.string import TextLoader
from pydantic import BaseModel
from sqlalchemy import text
from sqlalchemy.engine import URL

import taskq_sync
from taskq import TaskQ, actor
from taskq.db.dialect import async_url, sync_url
from taskq.settings import TaskQSettings


class Order(BaseModel):
    n: int


@actor(name="t_caller_conn_order")
async def order_actor(payload: Order) -> None:
    return None


def _dsn(url: URL) -> str:
    return sync_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def _jobs(url: URL) -> int:
    with psycopg.connect(_dsn(url)) as conn:
        row = conn.execute("SELECT count(*) FROM taskq.jobs").fetchone()
        assert row is not None
        return int(row[0])


@pytest.fixture
def sync_tq(pg_url: URL, settings: TaskQSettings) -> Any:
    tq = taskq_sync.TaskQ(sync_url(pg_url), settings=settings)
    yield tq
    tq.close()


def test_psycopg_connection_commit_keeps_the_job(sync_tq: Any, pg_url: URL) -> None:
    with psycopg.connect(_dsn(pg_url)) as conn:
        handle = sync_tq.enqueue(order_actor, Order(n=1), connection=conn)
        assert _jobs(pg_url) == 0  # not committed yet: it is in the caller's transaction
        assert not conn.closed
        conn.commit()
    assert _jobs(pg_url) == 1
    assert sync_tq.get(handle.job_id).job_id == handle.job_id


def test_psycopg_connection_rollback_leaves_no_job(sync_tq: Any, pg_url: URL) -> None:
    conn = psycopg.connect(_dsn(pg_url))
    try:
        conn.execute("CREATE TEMP TABLE t_mark (n int)")
        sync_tq.enqueue(order_actor, Order(n=1), connection=conn)
        # taskq ended nothing: the transaction is still open, the temp table still there
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
        conn.rollback()
    finally:
        conn.close()
    assert _jobs(pg_url) == 0


def test_checked_enqueue_on_psycopg_connection_with_text_json_loaders(
    sync_tq: Any, pg_url: URL
) -> None:
    """A dedup-checked enqueue reads rows back: JSON decoded despite the text loaders."""
    with psycopg.connect(_dsn(pg_url)) as conn:
        conn.adapters.register_loader("jsonb", TextLoader)
        first = sync_tq.enqueue(order_actor, Order(n=2), idempotency_key="k1", connection=conn)
        again = sync_tq.enqueue(order_actor, Order(n=2), idempotency_key="k1", connection=conn)
        assert again.job_id == first.job_id
        assert again.was_existing
        record = again.record
        assert record is not None
        assert record.payload == {"n": 2}
        # the caller's own connection still loads jsonb as text
        assert conn.execute("SELECT '{\"a\": 1}'::jsonb").fetchone() == ('{"a": 1}',)
        conn.commit()
    assert _jobs(pg_url) == 1


def test_sqlalchemy_connection_in_sync_facade(sync_tq: Any, pg_url: URL) -> None:
    with sync_tq.engine.connect() as conn:
        sync_tq.enqueue(order_actor, Order(n=3), connection=conn)
        conn.rollback()
    assert _jobs(pg_url) == 0


@pytest.mark.parametrize("bad", [object(), "postgresql://x", 42])
def test_anything_else_is_a_type_error_naming_what_is_accepted(
    sync_tq: Any, pg_url: URL, bad: object
) -> None:
    with pytest.raises(TypeError, match="SQLAlchemy Connection or a psycopg Connection"):
        sync_tq.enqueue(order_actor, Order(n=1), connection=bad)
    assert _jobs(pg_url) == 0


def test_sync_psycopg_connection_refused_by_async_client_before_anything(pg_url: URL) -> None:
    with psycopg.connect(_dsn(pg_url)) as conn:
        tq = TaskQ(async_url(pg_url))
        import asyncio

        async def go() -> None:
            try:
                with pytest.raises(TypeError, match="psycopg AsyncConnection"):
                    await tq.enqueue(order_actor, Order(n=1), connection=conn)  # type: ignore[arg-type]
            finally:
                await tq.aclose()

        asyncio.run(go())
    assert _jobs(pg_url) == 0


async def test_async_psycopg_connection(pg_url: URL, settings: TaskQSettings) -> None:
    async with TaskQ(async_url(pg_url), settings=settings) as tq:
        conn = await psycopg.AsyncConnection.connect(_dsn(pg_url))
        try:
            await tq.enqueue(order_actor, Order(n=4), connection=conn)
            await conn.rollback()
            await tq.enqueue(order_actor, Order(n=6), connection=conn)
            await conn.commit()
            assert not conn.closed
        finally:
            await conn.close()
        async with tq.engine.connect() as check:
            count = (await check.execute(text("SELECT count(*) FROM taskq.jobs"))).scalar_one()
    assert count == 1


def test_a_sqlite_connection_is_refused_pointing_at_enqueue_on_commit(
    sqlite_url: str, settings: TaskQSettings
) -> None:
    """Django's startproject default: the caller's sqlite3 connection, in its transaction."""
    import sqlite3

    path = sqlite_url.removeprefix("sqlite:///")
    tq = taskq_sync.TaskQ(sqlite_url, settings=settings)
    conn = sqlite3.connect(path)
    try:
        conn.execute("BEGIN")
        with pytest.raises(TypeError) as raised:
            tq.enqueue(order_actor, Order(n=1), connection=conn)  # type: ignore[arg-type]
        message = str(raised.value)
        assert "does not support SQLite connections (got sqlite3.Connection)" in message
        assert "enqueue_on_commit" in message
        assert conn.in_transaction  # the caller's transaction is untouched
        conn.rollback()
        assert conn.execute("SELECT count(*) FROM jobs").fetchone() == (0,)
    finally:
        conn.close()
        tq.close()
