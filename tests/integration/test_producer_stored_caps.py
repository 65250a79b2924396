"""The actors page's operator-owned ``max_pending`` as the enqueue side reads it (through a
TTL cache), and enqueue behaviour that depends on what the store already holds: an
expired ``unique_for`` window, a snoozed singleton, a deregistered actor.

On Postgres and SQLite, async and sync clients.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest
from pydantic import BaseModel
from sqlalchemy import func, select, update

from taskq import actor
from taskq.actor_config_ops import sync_actor_config
from taskq.client import TaskQ
from taskq.db.engine import make_engine, transaction
from taskq.db.tables import jobs
from taskq.exceptions import MaxPendingExceededError, SingletonCollisionError
from taskq.settings import TaskQSettings
from tests.support.producer import Env


class Item(BaseModel):
    n: int


@actor(name="caps_literal", max_pending=3)
async def literal_three(payload: Item) -> None: ...


@actor(name="caps_unique", unique_for=timedelta(minutes=10))
async def unique(payload: Item) -> None: ...


@actor(name="caps_single", singleton=True)
async def single(payload: Item) -> None: ...


@actor(name="caps_gone")
async def gone(payload: Item) -> None: ...


@pytest.fixture(params=["async", "sync"])
def mode(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def _settings(base: TaskQSettings, ttl: timedelta) -> TaskQSettings:
    return base.model_copy(update={"actor_config_cache_ttl": ttl})


@pytest.fixture
async def open_env(engine_url: Any, settings: TaskQSettings, mode: str) -> AsyncIterator[Any]:
    """``open_env(ttl)``: an :class:`Env` whose clients read stored caps through a cache
    of ``ttl``, on a database where the test actors are registered."""
    engines: list[Any] = []
    closers: list[Any] = []

    async def open_(ttl: timedelta) -> Env:
        local = _settings(settings, ttl)
        engine = make_engine(engine_url, settings=local)
        engines.append(engine)
        async with transaction(engine) as conn:
            await sync_actor_config(conn, [literal_three, unique, single, gone])
        async_tq = TaskQ(engine=engine, settings=local)
        closers.append(async_tq.aclose)
        if mode == "sync":
            from taskq_sync import TaskQ as SyncTaskQ

            sync_tq = SyncTaskQ(engine_url, settings=local)
            closers.append(sync_tq.close)
            store = "postgres" if engine.dialect.name == "postgresql" else "sqlite"
            return Env(store, mode, sync_tq.jobs, engine=engine, sync_tq=sync_tq)
        store = "postgres" if engine.dialect.name == "postgresql" else "sqlite"
        return Env(store, mode, async_tq.jobs, engine=engine, async_tq=async_tq)

    yield open_
    for close in reversed(closers):
        result = close()
        if result is not None:
            await result
    for engine in engines:
        await engine.dispose()


async def test_a_stored_cap_is_read_through_the_cache(open_env: Any) -> None:
    """Within the TTL a changed stored cap is not seen yet; a client whose TTL has passed
    (0 here) enforces the new value, and a cleared one falls back to the literal."""
    cached: Env = await open_env(timedelta(hours=1))
    fresh: Env = await open_env(timedelta(0))
    await cached.set_stored_max_pending("caps_literal", 1)
    await cached.enqueue(literal_three, Item(n=1))
    with pytest.raises(MaxPendingExceededError) as first:
        await cached.enqueue(literal_three, Item(n=2))
    assert first.value.max_pending == 1

    await fresh.set_stored_max_pending("caps_literal", 5)
    await fresh.enqueue(literal_three, Item(n=2))  # 5 is enforced at once with no cache
    with pytest.raises(MaxPendingExceededError) as stale:
        await cached.enqueue(literal_three, Item(n=3))  # still 1 within the hour
    assert stale.value.max_pending == 1

    await fresh.set_stored_max_pending("caps_literal", None)  # cleared: the literal, 3
    await fresh.enqueue(literal_three, Item(n=3))
    with pytest.raises(MaxPendingExceededError) as cleared:
        await fresh.enqueue(literal_three, Item(n=4))
    assert (cleared.value.current_count, cleared.value.max_pending) == (3, 3)


async def _age(env: Env, job_id: Any, by: timedelta) -> None:
    """Move a job's creation ``by`` into the past, as if the clock had run on."""
    assert env.engine is not None
    async with env.engine.begin() as conn:
        row = (await conn.execute(select(jobs.c.created_at).where(jobs.c.id == job_id))).one()
        await conn.execute(
            update(jobs).where(jobs.c.id == job_id).values(created_at=row.created_at - by)
        )


async def test_a_unique_for_window_slides_past_an_old_job(open_env: Any) -> None:
    env: Env = await open_env(timedelta(seconds=5))
    first = await env.enqueue(unique, Item(n=1), identity_key="acct")
    await _age(env, first.job_id, timedelta(minutes=9))
    inside = await env.enqueue(unique, Item(n=2), identity_key="acct")
    assert inside.was_existing
    assert inside.job_id == first.job_id
    await _age(env, first.job_id, timedelta(minutes=2))  # now 11 minutes old
    after = await env.enqueue(unique, Item(n=3), identity_key="acct")
    assert not after.was_existing
    assert after.job_id != first.job_id


async def test_a_snoozed_singleton_blocks_new_enqueues(open_env: Any) -> None:
    """A snoozed job sits in ``scheduled``, which is active: it still blocks."""
    env: Env = await open_env(timedelta(seconds=5))
    first = await env.enqueue(single, Item(n=1))
    assert env.engine is not None
    async with env.engine.begin() as conn:
        await conn.execute(
            update(jobs)
            .where(jobs.c.id == first.job_id)
            .values(status="scheduled", scheduled_at=func.current_timestamp())
        )
    with pytest.raises(SingletonCollisionError) as info:
        await env.enqueue(single, Item(n=2))
    assert info.value.blocking_job_id == first.job_id


async def test_enqueue_after_deregistration_succeeds_and_stays_pending(open_env: Any) -> None:
    """The page: no foreign key from jobs to actor_config, so the insert succeeds; the
    job is never dispatched (the dispatch query joins actor_config)."""
    env: Env = await open_env(timedelta(seconds=5))
    tq = env.sync_tq if env.mode == "sync" else env.async_tq
    result = await env.call(tq.actors.deregister, "caps_gone")
    assert result.actor_config_deleted
    handle = await env.enqueue(gone, Item(n=1))
    assert (await env.call(handle.refresh)).status == "pending"
    assert await env.count("caps_gone") == 1
