"""Every entry point that takes an engine or a connection works on one the user made.

The engines here come from plain ``create_async_engine`` / ``create_engine`` (no
``make_engine``, no execution options), on a database migrated into a non-default
schema (``app_jobs``): taskq applies the schema from the settings, or from ``schema=``.
A genuinely missing table is still ``SchemaNotReady``.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from pydantic import BaseModel
from sqlalchemy import create_engine, text
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

import taskq_sync
from taskq import JobHandle, TaskQ, actor
from taskq.db.dialect import async_url, sync_url
from taskq.exceptions import ReservationUnavailable, SchemaNotReady
from taskq.ratelimit import ConcurrencyReservation, SlidingWindow, TokenBucket
from taskq.settings import TaskQSettings
from taskq_sync.ratelimit import TokenBucket as SyncTokenBucket
from tests.support import databases

SCHEMA = "app_jobs"


class Item(BaseModel):
    n: int


@actor(name="t_user_engine_item")
async def item_actor(payload: Item) -> None: ...


@pytest.fixture(scope="module")
def app_settings() -> TaskQSettings:
    return TaskQSettings.load(database_url=None, redis_url=None, schema_name=SCHEMA)


@pytest.fixture(scope="module")
def pg_schema_url() -> Iterator[URL]:
    """A Postgres database migrated into ``app_jobs`` (nothing in ``taskq`` or ``public``)."""
    with databases.migrated_database("userengine", SCHEMA) as url:
        yield url


@pytest.fixture(params=["postgres", "sqlite"])
def user_url(request: pytest.FixtureRequest, pg_schema_url: URL, sqlite_url: str) -> Iterator[URL]:
    """The database URL a user would hand ``create_async_engine`` (psycopg / aiosqlite)."""
    if request.param == "postgres":
        yield async_url(pg_schema_url)
        databases.truncate_all(pg_schema_url, schema=SCHEMA)
    else:
        yield async_url(sqlite_url)


@pytest.fixture
async def user_engine(user_url: URL) -> AsyncIterator[AsyncEngine]:
    engine = create_async_engine(user_url)
    yield engine
    await engine.dispose()


def _count_url(url: URL) -> int:
    """Jobs in the table, read with a plain SQL statement naming the schema."""
    engine = create_engine(sync_url(url))
    table = f"{SCHEMA}.jobs" if engine.dialect.name == "postgresql" else "jobs"
    try:
        with engine.connect() as conn:
            return int(conn.execute(text(f"SELECT count(*) FROM {table}")).scalar_one())
    finally:
        engine.dispose()


async def _count(engine: AsyncEngine) -> int:
    return _count_url(engine.url)


async def test_taskq_on_a_user_engine_applies_the_settings_schema(
    user_engine: AsyncEngine, app_settings: TaskQSettings
) -> None:
    assert "schema_translate_map" not in user_engine.get_execution_options()
    async with TaskQ(engine=user_engine, settings=app_settings) as tq:
        handle = await tq.enqueue(item_actor, Item(n=1))
        more = await tq.enqueue_many([(item_actor, Item(n=2)), (item_actor, Item(n=3))])
        got: JobHandle[None] = await tq.get(handle.job_id)
        assert (await got.status()) == "pending"
        cancelled = await tq.cancel(more[0].job_id)
        assert cancelled.status == "cancelled"
        assert (await tq.actors.get(item_actor.name)) is None  # actor_config is found
    assert await _count(user_engine) == 3
    # The user's engine itself was not changed.
    assert "schema_translate_map" not in user_engine.get_execution_options()


async def test_explicit_schema_wins_over_settings(user_engine: AsyncEngine) -> None:
    default = TaskQSettings.load(database_url=None, redis_url=None, schema_name="taskq")
    async with TaskQ(engine=user_engine, settings=default, schema=SCHEMA) as tq:
        await tq.enqueue(item_actor, Item(n=1))
        assert tq.settings.schema_name == SCHEMA
    assert await _count(user_engine) == 1


async def test_enqueue_on_a_user_connection_joins_its_transaction(
    user_engine: AsyncEngine, app_settings: TaskQSettings
) -> None:
    async with TaskQ(engine=user_engine, settings=app_settings) as tq:
        async with user_engine.connect() as conn:
            await conn.begin()
            await tq.enqueue(item_actor, Item(n=1), connection=conn)
            await conn.rollback()
        assert await _count(user_engine) == 0
        async with user_engine.begin() as conn:
            await tq.enqueue(item_actor, Item(n=2), connection=conn)
            await tq.enqueue_many([(item_actor, Item(n=3))], connection=conn)
            # The caller's own statements keep the connection's own (empty) schema map.
            assert conn.sync_connection is not None
            assert conn.sync_connection.get_execution_options().get("schema_translate_map") is None
        assert await _count(user_engine) == 2


async def test_a_missing_table_is_still_schema_not_ready(user_engine: AsyncEngine) -> None:
    if user_engine.dialect.name == "postgresql":
        empty = user_engine  # the tables are in app_jobs, not in "nowhere"
    else:  # SQLite has no schemas: an empty file is the missing table
        folder = Path(str(user_engine.url.database)).parent
        empty = create_async_engine(async_url(f"sqlite:///{folder / 'empty.db'}"))
    try:
        async with TaskQ(engine=empty, schema="nowhere") as tq:
            with pytest.raises(SchemaNotReady, match="taskq migrate up"):
                await tq.enqueue(item_actor, Item(n=1))
    finally:
        if empty is not user_engine:
            await empty.dispose()


async def test_rate_limit_primitives_on_a_user_engine(
    pg_schema_url: URL, app_settings: TaskQSettings, unique_name: str
) -> None:
    engine = create_async_engine(async_url(pg_schema_url))
    try:
        bucket = TokenBucket(
            f"{unique_name}_tb", capacity=2, refill_per_second=0.001, backend="postgres"
        )
        first = await bucket.acquire(pg_pool=engine, settings=app_settings)
        second = await bucket.acquire(pg_pool=engine, settings=app_settings)
        third = await bucket.acquire(pg_pool=engine, settings=app_settings)
        assert [first.allowed, second.allowed, third.allowed] == [True, True, False]
        async with engine.connect() as conn:  # the state is in app_jobs
            stored = await conn.execute(
                text(f"SELECT count(*) FROM {SCHEMA}.rate_limit_buckets WHERE bucket_name = :n"),
                {"n": f"{unique_name}_tb"},
            )
            assert stored.scalar_one() == 1
        state = await bucket.peek(pg_pool=engine, settings=app_settings)
        assert state.is_exhausted
        await bucket.reset(pg_pool=engine, settings=app_settings)
        assert not (await bucket.peek(pg_pool=engine, settings=app_settings)).is_exhausted
        window = SlidingWindow(
            f"{unique_name}_sw", limit=1, window=timedelta(seconds=60), backend="postgres"
        )
        assert (await window.acquire(pg_pool=engine, settings=app_settings)).allowed
        assert not (await window.acquire(pg_pool=engine, settings=app_settings)).allowed
    finally:
        await engine.dispose()


async def test_a_reservation_on_a_user_engine_uses_the_settings_schema(
    pg_schema_url: URL, unique_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``ConcurrencyReservation(...).acquire(pool=<a user's engine>)`` finds its slots in
    ``TASKQ_SCHEMA_NAME`` (no ``schema=`` given), or in an explicit ``schema=``."""
    monkeypatch.setenv("TASKQ_SCHEMA_NAME", SCHEMA)
    engine = create_async_engine(async_url(pg_schema_url))
    worker = uuid.uuid4()
    try:
        mutex = ConcurrencyReservation(f"{unique_name}_mx", slots=1, lease=60)
        assert await mutex.acquire(None, worker, pool=engine) == 0
        with pytest.raises(ReservationUnavailable):
            await mutex.acquire(None, worker, pool=engine)
        async with engine.connect() as conn:  # the slot rows are in app_jobs
            stored = await conn.execute(
                text(
                    f"SELECT count(*) FROM {SCHEMA}.reservation_slots"
                    " WHERE name = :n AND worker_id IS NOT NULL"
                ),
                {"n": f"{unique_name}_mx"},
            )
            assert stored.scalar_one() == 1
        await mutex.release(0, worker, pool=engine)
        explicit = ConcurrencyReservation(f"{unique_name}_mx", slots=1, lease=60, schema=SCHEMA)
        monkeypatch.setenv("TASKQ_SCHEMA_NAME", "taskq")
        assert await explicit.acquire(None, worker, pool=engine) == 0
    finally:
        await engine.dispose()


def test_sync_taskq_and_bucket_on_a_user_engine(
    user_url: URL, app_settings: TaskQSettings, unique_name: str
) -> None:
    engine = create_engine(sync_url(user_url))
    try:
        with taskq_sync.TaskQ(engine=engine, settings=app_settings) as tq:
            handle = tq.enqueue(item_actor, Item(n=1))
            assert tq.get(handle.job_id).job_id == handle.job_id
            with engine.connect() as conn:
                conn.begin()
                tq.enqueue(item_actor, Item(n=2), connection=conn)
                conn.rollback()
            with engine.begin() as conn:
                tq.jobs.enqueue(item_actor, Item(n=3), connection=conn)
            assert tq.cancel(handle.job_id).status == "cancelled"
        count = _count_url(engine.url)
        assert count == 2
        if engine.dialect.name == "postgresql":
            bucket = SyncTokenBucket(
                f"{unique_name}_sync", capacity=1, refill_per_second=0.001, backend="postgres"
            )
            assert bucket.acquire(pg_pool=engine, settings=app_settings).allowed
            assert not bucket.acquire(pg_pool=engine, settings=app_settings).allowed
    finally:
        engine.dispose()


async def test_actors_and_queues_clients_on_a_user_engine(
    user_engine: AsyncEngine, app_settings: TaskQSettings
) -> None:
    from taskq.actor_config_ops import ActorsClient, QueuesClient

    actors = ActorsClient(user_engine, settings=app_settings)
    queues = QueuesClient(user_engine, settings=app_settings)
    assert await actors.list() == []
    assert await queues.get("nowhere") is None


async def test_a_bad_schema_name_is_refused_at_the_boundary(user_engine: AsyncEngine) -> None:
    from taskq.backends.sql import SqlBackend

    with pytest.raises(ValueError, match="invalid schema name"):
        SqlBackend(user_engine, schema='x"; DROP TABLE jobs; --')
