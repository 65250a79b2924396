"""Actor-config operations (tq.actors) on Postgres and SQLite, async and sync."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from pydantic import BaseModel
from sqlalchemy import insert
from structlog.testing import capture_logs

from taskq import actor
from taskq.actor_config_ops import DeregisterResult, sync_actor_config
from taskq.client import TaskQ
from taskq.db.engine import make_engine, transaction
from taskq.db.tables import cron_schedules, jobs, queues
from taskq.exceptions import (
    ActorHasActiveJobsError,
    ActorHasEnabledSchedulesError,
    ActorNotFoundError,
)
from taskq.settings import TaskQSettings


class P(BaseModel):
    n: int


@actor(
    name="cfg_actor", queue="cfgq", max_concurrent=4, max_pending=10, result_ttl=timedelta(hours=1)
)
async def cfg_actor(payload: P) -> None: ...


@actor(name="cfg_other", queue="cfgq")
async def cfg_other(payload: P) -> None: ...


@pytest.fixture(params=["async", "sync"])
def mode(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def tq(engine_url: Any, settings: TaskQSettings, mode: str) -> Any:
    engine = make_engine(engine_url, settings=settings)
    async with transaction(engine) as conn:
        await sync_actor_config(conn, [cfg_actor, cfg_other])
        await conn.execute(insert(queues).values(name="cfgq"))
    client: Any = TaskQ(engine=engine, settings=settings)
    if mode == "sync":
        from taskq_sync import TaskQ as SyncTaskQ

        client = SyncTaskQ(engine_url, settings=settings)
    yield client
    if mode == "sync":
        client.close()
    else:
        await client.aclose()
    await engine.dispose()


async def call(mode: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    if mode == "sync":
        return await asyncio.to_thread(fn, *args, **kwargs)
    return await fn(*args, **kwargs)


async def test_seed_only_fields_survive_a_resync(
    tq: Any, mode: str, engine_url: Any, settings: TaskQSettings
) -> None:
    row = await call(mode, tq.actors.get, "cfg_actor")
    assert (row.queue, row.max_concurrent, row.max_pending, row.result_ttl) == (
        "cfgq",
        4,
        10,
        timedelta(hours=1),
    )
    await call(mode, tq.actors.set, "cfg_actor", max_concurrent=1, max_pending=None)
    engine = make_engine(engine_url, settings=settings)
    with capture_logs() as logs:
        async with transaction(engine) as conn:
            [stored, _] = await sync_actor_config(conn, [cfg_actor, cfg_other])
    await engine.dispose()
    assert (stored.max_concurrent, stored.max_pending) == (1, None)
    # The tell the page names: one info line per actor whose literal is not enforced.
    overrides = [e for e in logs if e["event"] == "actor-config-capacity-override"]
    assert [(e["log_level"], e["actor"]) for e in overrides] == [("info", "cfg_actor")]
    assert set(overrides[0]["fields"]) == {"max_concurrent", "max_pending"}
    diff = {d.field: d for d in await call(mode, tq.actors.diff, [cfg_actor])}
    assert diff["max_concurrent"].differs
    assert diff["max_concurrent"].enforced == "stored"
    assert diff["max_pending"].enforced == "literal"
    names = [r.actor for r in await call(mode, tq.actors.list)]
    assert names == ["cfg_actor", "cfg_other"]
    with pytest.raises(ValueError, match="max_pending"):
        await call(mode, tq.actors.set, "cfg_actor", max_pending=-1)


async def test_deregister_refuses_then_forces(tq: Any, mode: str) -> None:
    running = await call(mode, tq.jobs.enqueue, cfg_actor, P(n=1))
    queued = await call(mode, tq.jobs.enqueue, cfg_actor, P(n=2))
    done = await call(mode, tq.jobs.enqueue, cfg_actor, P(n=3))
    engine = tq.engine
    stmt_running = jobs.update().where(jobs.c.id == running.job_id).values(status="running")
    stmt_done = jobs.update().where(jobs.c.id == done.job_id).values(status="succeeded")
    stmt_cron = insert(cron_schedules).values(
        id="nightly", actor="cfg_actor", cron_expression="0 0 * * *"
    )
    if mode == "sync":
        with engine.begin() as conn:
            for stmt in (stmt_running, stmt_done, stmt_cron):
                conn.execute(stmt)
    else:
        async with engine.begin() as conn:
            for stmt in (stmt_running, stmt_done, stmt_cron):
                await conn.execute(stmt)

    with pytest.raises(ActorHasActiveJobsError) as info:
        await call(mode, tq.actors.deregister, "cfg_actor")
    assert info.value.active_count == 2
    assert info.value.status_counts == {"pending": 1, "running": 1}
    with pytest.raises(ActorHasActiveJobsError):
        await call(mode, tq.actors.deregister, "cfg_actor", force=True)  # running jobs block force

    await call(mode, _finish, engine, running.job_id, mode)
    result = await call(mode, tq.actors.deregister, "cfg_actor", force=True, purge_queue=True)
    assert result == DeregisterResult(
        actor="cfg_actor",
        queue="cfgq",
        actor_config_deleted=True,
        schedules_disabled=1,
        jobs_cancelled=1,
        terminal_jobs_remaining=3,  # two finished plus the one just cancelled
        queue_purged=False,  # cfg_other still uses cfgq
    )
    record = await call(mode, tq.jobs.backend.get_job, queued.job_id)
    assert (record.status, record.error_class) == ("cancelled", "ActorDeregistered")
    with pytest.raises(ActorNotFoundError):
        await call(mode, tq.actors.deregister, "cfg_actor", force=True, purge_queue=True)

    last = await call(mode, tq.actors.deregister, "cfg_other", purge_queue=True)
    assert last.queue_purged


async def test_enabled_schedule_refuses_without_force(tq: Any, mode: str) -> None:
    stmt = insert(cron_schedules).values(id="s1", actor="cfg_other", cron_expression="* * * * *")
    if mode == "sync":
        with tq.engine.begin() as conn:
            conn.execute(stmt)
    else:
        async with tq.engine.begin() as conn:
            await conn.execute(stmt)
    with pytest.raises(ActorHasEnabledSchedulesError) as info:
        await call(mode, tq.actors.deregister, "cfg_other")
    assert info.value.schedule_ids == ["s1"]


def _finish(engine: Any, job_id: Any, mode: str) -> Any:
    stmt = jobs.update().where(jobs.c.id == job_id).values(status="succeeded")
    if mode == "sync":
        with engine.begin() as conn:
            conn.execute(stmt)
        return None

    async def run() -> None:
        async with engine.begin() as conn:
            await conn.execute(stmt)

    return run()


async def test_set_moves_the_queue_and_keeps_the_other_fields(tq: Any, mode: str) -> None:
    row = await call(mode, tq.actors.set, "cfg_actor", queue="newq")
    assert (row.queue, row.max_concurrent, row.max_pending) == ("newq", 4, 10)
    assert (await call(mode, tq.actors.get, "cfg_actor")).queue == "newq"
    created = await call(mode, tq.actors.set, "brand_new", queue="otherq", max_concurrent=2)
    assert (created.queue, created.max_concurrent, created.max_pending) == ("otherq", 2, None)


@pytest.mark.parametrize(
    ("actor_name", "kwargs", "error"),
    [
        ("bad name", {"max_concurrent": 1}, ValueError),
        ("", {"max_concurrent": 1}, ValueError),
        ("x" * 201, {"max_pending": 1}, ValueError),
        ("tab\there", {"max_pending": 1}, ValueError),
        (7, {"max_concurrent": 1}, TypeError),
        ("cfg_actor", {"queue": "a:b"}, ValueError),
        ("cfg_actor", {"queue": ""}, ValueError),
        ("cfg_actor", {"max_concurrent": True}, ValueError),
        ("cfg_actor", {"result_ttl_s": float("inf")}, ValueError),
    ],
    ids=[
        "space",
        "empty",
        "too-long",
        "tab",
        "not-str",
        "queue-colon",
        "queue-empty",
        "bool",
        "inf",
    ],
)
async def test_set_rejects_bad_input_and_changes_nothing(
    tq: Any, mode: str, actor_name: Any, kwargs: dict[str, Any], error: type[Exception]
) -> None:
    before = await call(mode, tq.actors.list)
    with pytest.raises(error):
        await call(mode, tq.actors.set, actor_name, **kwargs)
    assert await call(mode, tq.actors.list) == before


async def test_queues_client_sets_reads_and_clears_the_cap(tq: Any, mode: str) -> None:
    queues_client = tq.queues
    capped = await call(mode, queues_client.set_max_concurrent, "cfgq", 5)
    assert (capped.name, capped.max_concurrent, capped.stored) == ("cfgq", 5, True)
    assert capped.actors == ("cfg_actor", "cfg_other")
    created = await call(mode, queues_client.set_max_concurrent, "fresh", 2)
    assert (created.max_concurrent, created.mode, created.paused) == (2, "fifo", False)
    with pytest.raises(ValueError, match="int >= 1"):
        await call(mode, queues_client.set_max_concurrent, "cfgq", 0)
    assert (await call(mode, queues_client.get, "cfgq")).max_concurrent == 5
    assert await call(mode, queues_client.get, "unknown") is None
    cleared = await call(mode, queues_client.set_max_concurrent, "cfgq", None)
    assert cleared.max_concurrent is None
    listed = await call(mode, queues_client.list)
    assert [(q.name, q.max_concurrent) for q in listed] == [("cfgq", None), ("fresh", 2)]
