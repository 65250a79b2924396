"""``ctx.jobs`` through a real worker on each SQL engine: transactional and autonomous paths.

Transactional mode is switched on the way the actors page says: an ``AsyncConnection``
registered at ``Scope.LOOP`` in the worker's DI registry.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any
from uuid import UUID

import pytest
from pydantic import BaseModel
from sqlalchemy import select
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from structlog.testing import capture_logs

from taskq.actor import actor
from taskq.backends.sql import SqlBackend
from taskq.client import JobsClient
from taskq.context import JobContext
from taskq.db.tables import jobs
from taskq.di import ProviderRegistry, Scope
from taskq.exceptions import SubEnqueueError
from taskq.handle import JobHandle
from taskq.retry import RetryPolicy
from tests.e2e.apps import basic
from tests.support.workers import running_worker, wait_until, worker_settings


class Fan(BaseModel):
    """How many children to enqueue, and whether the parent then fails."""

    children: int
    fail: bool = False
    inherit: bool = True


HANDLES: dict[UUID, list[JobHandle[Any]]] = {}


@actor(name="t_sub_fan", retry=RetryPolicy(kind="non_retryable"))
async def fan(payload: Fan, ctx: JobContext[Fan]) -> None:
    """Enqueues ``children`` echo jobs (tagged ``extra``), then fails if asked."""
    assert ctx.jobs is not None
    handles = HANDLES.setdefault(ctx.job_id, [])
    for i in range(payload.children):
        handle = await ctx.jobs.enqueue(
            basic.echo, basic.Echo(value=i), tags=["extra"], inherit_tags=payload.inherit
        )
        handles.append(handle)
    if payload.fail:
        raise ValueError("parent fails after enqueuing")


ACTORS = {**basic.registry, fan.name: fan}


def _connection_registry(engine_url: str | URL) -> ProviderRegistry:
    """A registry with an ``AsyncConnection`` at ``Scope.LOOP`` (transactional sub-jobs)."""
    from taskq.db.engine import make_engine

    async def connection() -> AsyncIterator[AsyncConnection]:
        eng = make_engine(engine_url)
        async with eng.connect() as conn:
            yield conn
        await eng.dispose()

    registry = ProviderRegistry()
    registry.register_factory(AsyncConnection, Scope.LOOP, connection)
    return registry


async def _children(engine: AsyncEngine, parent: UUID) -> list[Any]:
    async with engine.connect() as conn:
        stmt = select(jobs).where(jobs.c.parent_job_id == parent)
        return list((await conn.execute(stmt)).all())


async def _status(engine: AsyncEngine, job_id: UUID) -> str:
    async with engine.connect() as conn:
        return str((await conn.execute(select(jobs.c.status).where(jobs.c.id == job_id))).scalar())


async def _terminal(engine: AsyncEngine, job_id: UUID) -> bool:
    return await _status(engine, job_id) in ("succeeded", "failed", "cancelled")


async def test_transactional_parent_failure_leaves_no_children(
    engine: AsyncEngine, engine_url: str | URL
) -> None:
    client = JobsClient(SqlBackend(engine))
    parent = await client.enqueue(fan, Fan(children=3, fail=True), tags=["batch-7"])
    registry = _connection_registry(engine_url)
    with capture_logs() as logs:
        async with running_worker(worker_settings(engine_url), ACTORS, di_registry=registry):
            await wait_until(lambda: _terminal(engine, parent.job_id))
    # Leaving running_worker shut the worker down, which awaits the completer's spawned
    # tasks (where a replay runs): a replay that wrongly ran has landed by now.
    assert await _status(engine, parent.job_id) == "failed"
    assert await _children(engine, parent.job_id) == []
    # The handles' ids were never written anywhere.
    for handle in HANDLES[parent.job_id]:
        assert await client.backend.get_job(handle.job_id) is None
    assert not [e for e in logs if e["event"] == "sub_enqueue_autonomous_fallback"]


async def test_transactional_parent_success_commits_children(
    engine: AsyncEngine, engine_url: str | URL
) -> None:
    client = JobsClient(SqlBackend(engine))
    parent = await client.enqueue(fan, Fan(children=3), tags=["batch-8"])
    registry = _connection_registry(engine_url)
    async with running_worker(worker_settings(engine_url), ACTORS, di_registry=registry):

        async def children_done() -> bool:
            rows = await _children(engine, parent.job_id)
            return len(rows) == 3 and {r.status for r in rows} == {"succeeded"}

        await wait_until(children_done)
        # Unbound handles: wait() works (it reads through the backend), the rest raise.
        handles = HANDLES[parent.job_id]
        assert await handles[0].wait(timeout=10) == basic.EchoResult(doubled=0)
        for method in ("status", "refresh", "attempts", "cancel"):
            with pytest.raises(RuntimeError, match="needs a client"):
                await getattr(handles[0], method)()
    assert await _status(engine, parent.job_id) == "succeeded"
    rows = await _children(engine, parent.job_id)
    assert {r.id for r in rows} == {h.job_id for h in HANDLES[parent.job_id]}
    for row in rows:
        assert row.parent_job_id == parent.job_id
        assert list(row.tags) == ["batch-8", "extra"]  # inherited, then merged


async def test_inherit_tags_false_keeps_only_explicit_tags(
    engine: AsyncEngine, engine_url: str | URL
) -> None:
    client = JobsClient(SqlBackend(engine))
    parent = await client.enqueue(fan, Fan(children=1, inherit=False), tags=["batch-9"])
    async with running_worker(worker_settings(engine_url), ACTORS):

        async def child_seen() -> bool:
            return len(await _children(engine, parent.job_id)) == 1

        await wait_until(child_seen)
    [row] = await _children(engine, parent.job_id)
    assert list(row.tags) == ["extra"]


async def test_autonomous_children_persist_when_parent_fails_and_warn(
    engine: AsyncEngine, engine_url: str | URL
) -> None:
    client = JobsClient(SqlBackend(engine))
    parent = await client.enqueue(fan, Fan(children=3, fail=True), tags=["batch-10"])
    with capture_logs() as logs:
        async with running_worker(worker_settings(engine_url), ACTORS):
            await wait_until(lambda: _terminal(engine, parent.job_id))
    assert await _status(engine, parent.job_id) == "failed"
    rows = await _children(engine, parent.job_id)
    assert len(rows) == 3
    assert all(list(r.tags) == ["batch-10", "extra"] for r in rows)
    warnings = [e for e in logs if e["event"] == "sub_enqueue_autonomous_fallback"]
    # First autonomous enqueue warns; the next 99 do not.
    assert len(warnings) == 1
    assert warnings[0]["log_level"] == "warning"
    assert warnings[0]["count"] == 1


async def test_autonomous_warning_fires_every_100(
    engine: AsyncEngine, engine_url: str | URL
) -> None:
    client = JobsClient(SqlBackend(engine))
    parent = await client.enqueue(fan, Fan(children=201))
    with capture_logs() as logs:
        async with running_worker(worker_settings(engine_url), ACTORS):
            await wait_until(lambda: _terminal(engine, parent.job_id))
    warnings = [e for e in logs if e["event"] == "sub_enqueue_autonomous_fallback"]
    assert [w["count"] for w in warnings] == [1, 101, 201]


async def test_failed_replay_raises_sub_enqueue_error_with_items(
    engine: AsyncEngine, engine_url: str | URL
) -> None:
    """flush_buffer() (no connection: each group commits on its own) keeps the good items
    and reports each bad one with its exception."""
    from taskq.exceptions import MaxPendingExceededError
    from taskq.worker.subjobs import AutonomousCounter, SubJobs

    client = JobsClient(SqlBackend(engine))
    parent = await client.enqueue(fan, Fan(children=0))
    subs = SubJobs(
        client,
        parent.job_id,
        parent_actor=fan.name,
        transactional=True,
        counter=AutonomousCounter(reason="test"),
    )
    ok = await subs.enqueue(basic.echo, basic.Echo(value=1))
    capped = await subs.enqueue(basic.echo, basic.Echo(value=2), max_pending=0)
    assert await client.backend.get_job(ok.job_id) is None  # buffered, not written
    with pytest.raises(SubEnqueueError) as info:
        await subs.flush_buffer()
    [(args, exc)] = info.value.failed_items
    assert isinstance(exc, MaxPendingExceededError)
    assert args.payload == basic.Echo(value=2)
    assert args.options["parent_job_id"] == parent.job_id
    assert args.options["max_pending"] == 0
    assert await client.backend.get_job(ok.job_id) is not None
    assert await client.backend.get_job(capped.job_id) is None
    assert subs.buffer == []
