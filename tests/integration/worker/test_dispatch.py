"""Dispatch controls, timeouts, DI, progress, hooks and result retention on each engine."""

from __future__ import annotations

import itertools
import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncEngine

from taskq.backends.sql import SqlBackend
from taskq.client import JobsClient
from taskq.db.dialect import insert
from taskq.db.tables import actor_config, job_attempts, jobs, queues
from taskq.di import ProviderRegistry, Scope
from tests.e2e import support
from tests.e2e.apps import basic
from tests.support.workers import running_worker, wait_until, worker_settings

ACTORS = {**basic.registry, **{r.name: r for r in (basic.with_progress, basic.exhausts)}}
DI_ACTORS = {**ACTORS, **{r.name: r for r in (basic.with_dependency, basic.scoped)}}


@pytest.fixture
def runs_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "runs.txt"
    monkeypatch.setenv("TASKQ_E2E_RUNS", str(path))
    return path


async def _row(engine: AsyncEngine, job_id: Any) -> Any:
    async with engine.connect() as conn:
        return (await conn.execute(select(jobs).where(jobs.c.id == job_id))).one()


async def _status(engine: AsyncEngine, job_id: Any, *statuses: str) -> bool:
    return bool((await _row(engine, job_id)).status in statuses)


async def test_paused_queue_and_drain_mode_are_not_dispatched(
    engine: AsyncEngine, engine_url: str | URL
) -> None:
    client = JobsClient(SqlBackend(engine))
    paused = await client.enqueue(basic.noop, basic.Empty(), queue="held")
    drained = await client.enqueue(basic.echo, basic.Echo(value=1), queue="other")
    control = await client.enqueue(basic.noop, basic.Empty(), queue="other")
    async with engine.begin() as conn:
        await conn.execute(insert(engine.dialect.name, queues).values(name="held", paused=True))
        # An operator's drain mode, stored before the worker boots (its sync is seed-only).
        await conn.execute(
            insert(engine.dialect.name, actor_config).values(actor="e2e_echo", max_concurrent=0)
        )
    settings = worker_settings(engine_url, queues=("held", "other"))
    async with running_worker(settings, ACTORS):
        await wait_until(lambda: _status(engine, control.job_id, "succeeded"))
    assert await _status(engine, paused.job_id, "pending")
    assert await _status(engine, drained.job_id, "pending")
    async with engine.connect() as conn:
        stored = (
            await conn.execute(
                select(actor_config.c.max_concurrent).where(actor_config.c.actor == "e2e_echo")
            )
        ).scalar_one()
    assert stored == 0


async def test_max_concurrent_one_serialises_an_actor(
    engine: AsyncEngine, engine_url: str | URL, runs_file: Path
) -> None:
    client = JobsClient(SqlBackend(engine))
    async with engine.begin() as conn:
        await conn.execute(
            insert(engine.dialect.name, actor_config).values(actor="e2e_record", max_concurrent=1)
        )
    handles = [await client.enqueue(basic.record, basic.Work(n=n, seconds=0.05)) for n in range(6)]
    async with running_worker(worker_settings(engine_url, max_concurrency=6), ACTORS):
        await wait_until(lambda: _all(engine, handles, "succeeded"))
    spans = sorted((events[0][3], events[-1][3]) for events in support.runs(runs_file).values())
    assert len(spans) == 6
    assert all(nxt[0] >= cur[1] for cur, nxt in itertools.pairwise(spans))


async def _all(engine: AsyncEngine, handles: list[Any], *statuses: str) -> bool:
    for handle in handles:
        if not await _status(engine, handle.job_id, *statuses):
            return False
    return True


async def test_priority_orders_dispatch(
    engine: AsyncEngine, engine_url: str | URL, runs_file: Path
) -> None:
    client = JobsClient(SqlBackend(engine))
    low = [await client.enqueue(basic.record, basic.Work(n=n), priority=0) for n in range(3)]
    high = [await client.enqueue(basic.record, basic.Work(n=n), priority=5) for n in range(3)]
    async with running_worker(worker_settings(engine_url, max_concurrency=1), ACTORS):
        await wait_until(lambda: _all(engine, low + high, "succeeded"))
    started = {job_id: events[0][3] for job_id, events in support.runs(runs_file).items()}
    assert max(started[str(h.job_id)] for h in high) < min(started[str(h.job_id)] for h in low)


async def test_start_to_close_and_schedule_to_close(
    engine: AsyncEngine, engine_url: str | URL
) -> None:
    client = JobsClient(SqlBackend(engine))
    per_attempt = await client.enqueue(
        basic.control,
        basic.Control(kind="sleep", seconds=30),
        start_to_close=timedelta(milliseconds=200),
    )
    whole_job = await client.enqueue(
        basic.control,
        basic.Control(kind="sleep", seconds=30),
        schedule_to_close=timedelta(milliseconds=400),
    )
    async with running_worker(worker_settings(engine_url), ACTORS):
        await wait_until(lambda: _all(engine, [per_attempt, whole_job], "failed"))
    async with engine.connect() as conn:
        stmt = select(job_attempts.c.outcome, job_attempts.c.error_class).where(
            job_attempts.c.job_id == per_attempt.job_id
        )
        history = (await conn.execute(stmt.order_by(job_attempts.c.attempt))).all()
    assert [tuple(h) for h in history] == [
        ("retried", "StartToCloseTimeout"),
        ("retried", "StartToCloseTimeout"),
        ("failed", "StartToCloseTimeout"),
    ]
    row = await _row(engine, whole_job.job_id)
    assert row.error_class in ("StartToCloseTimeout", "ScheduleToCloseTimeout")
    assert row.attempt == 1


async def test_sync_actor_with_di_progress_hooks_and_result_ttl(
    engine: AsyncEngine, engine_url: str | URL
) -> None:
    client = JobsClient(SqlBackend(engine))
    counter = basic.Counter()
    providers = ProviderRegistry()
    providers.register_value(basic.Counter, Scope.PROCESS, counter)
    providers.register_class(basic.Session, Scope.TRANSIENT)
    providers.register_class(basic.ThreadLocalClient, Scope.THREAD)
    providers.validate(actors=[basic.with_dependency, basic.scoped])
    basic.HOOK_CALLS.clear()
    di_job = await client.enqueue(basic.with_dependency, basic.Echo(value=21))
    progress_job = await client.enqueue(basic.with_progress, basic.Echo(value=7))
    exhausted = await client.enqueue(basic.exhausts, basic.Empty())
    scoped = await client.enqueue(basic.scoped, basic.Echo(value=3))
    # No sweep while the outcomes are read: the 300 ms result TTL must not run out (and the
    # result be swept) between the job's success and the read, however slow the machine.
    settings = worker_settings(engine_url, sweep_interval=3600, heartbeat_interval=0.2)
    async with running_worker(settings, DI_ACTORS, di_registry=providers):
        await wait_until(lambda: _status(engine, di_job.job_id, "succeeded"))
        await wait_until(lambda: _status(engine, scoped.job_id, "succeeded", "failed"))
        assert (await _row(engine, scoped.job_id)).status == "succeeded"
        await wait_until(lambda: _status(engine, exhausted.job_id, "failed"))
        await wait_until(lambda: _status(engine, progress_job.job_id, "succeeded"))
        row = await _row(engine, progress_job.job_id)
        assert row.progress == {"step": 2, "percent": 100.0, "detail": "half"}
        assert row.result == {"doubled": 7}
        assert row.result_expires_at is not None
        ttl = row.result_expires_at - row.finished_at
        assert timedelta(milliseconds=290) <= ttl <= timedelta(milliseconds=310)
        await wait_until(lambda: _hooks_called(2))
    # The leader's result sweep drops the result once its TTL ran out.
    settings = worker_settings(engine_url, sweep_interval=0.2, heartbeat_interval=0.2)
    async with running_worker(settings, DI_ACTORS, di_registry=providers):
        await wait_until(lambda: _result_gone(engine, progress_job.job_id), timeout=60)
    assert (await _row(engine, di_job.job_id)).result == {"doubled": 42}
    assert counter.calls == 1
    assert ("success", progress_job.job_id) in basic.HOOK_CALLS
    assert ("exhausted", "ConnectionError") in basic.HOOK_CALLS


async def _result_gone(engine: AsyncEngine, job_id: Any) -> bool:
    row = await _row(engine, job_id)
    return row.result is None and row.result_expires_at is None


async def _hooks_called(n: int) -> bool:
    return len(basic.HOOK_CALLS) >= n


async def test_a_missing_provider_fails_the_boot(engine_url: str | URL) -> None:
    """Before any store write: no worker row is left behind."""
    from taskq.db.tables import workers
    from taskq.exceptions import MissingProvider
    from taskq.worker.run import Worker

    worker = Worker(
        settings=worker_settings(engine_url),
        actors={basic.with_dependency.name: basic.with_dependency},
        hard_exit=False,
    )
    with pytest.raises(MissingProvider):
        await worker.run()
    async with worker.engine.connect() as conn:
        assert (await conn.execute(select(func.count()).select_from(workers))).scalar() == 0
    await worker.engine.dispose()


async def test_reservation_and_queue_cap_serialise_jobs(
    engine: AsyncEngine, engine_url: str | URL, runs_file: Path
) -> None:
    """A one-slot reservation, and a queue capped at 1: no two of their jobs overlap."""
    from taskq.db.tables import reservation_slots

    client = JobsClient(SqlBackend(engine))
    async with engine.begin() as conn:
        await conn.execute(
            insert(engine.dialect.name, queues).values(name="capped", max_concurrent=1)
        )
    mutexed = [await client.enqueue(basic.mutex, basic.Work(n=n, seconds=0.2)) for n in range(3)]
    capped = [
        await client.enqueue(basic.record, basic.Work(n=n, seconds=0.2), queue="capped")
        for n in range(3)
    ]
    actors = {**ACTORS, basic.mutex.name: basic.mutex}
    settings = worker_settings(engine_url, max_concurrency=6, queues=("default", "capped"))
    async with running_worker(settings, actors):
        await wait_until(lambda: _all(engine, mutexed + capped, "succeeded"), timeout=60)
    recorded = support.runs(runs_file)
    for group in (mutexed, capped):
        spans = sorted((e[3], f[3]) for h in group for e, f in _pairs(recorded[str(h.job_id)]))
        assert len(spans) == 3
        assert all(nxt[0] >= cur[1] for cur, nxt in itertools.pairwise(spans))
    async with engine.connect() as conn:
        held = (
            await conn.execute(
                select(reservation_slots).where(reservation_slots.c.job_id.is_not(None))
            )
        ).all()
    assert held == []


def _pairs(events: list[tuple[int, int, str, float]]) -> list[tuple[Any, Any]]:
    starts = {e[0]: e for e in events if e[2] == "start"}
    ends = {e[0]: e for e in events if e[2] == "end"}
    return [(starts[a], ends[a]) for a in starts if a in ends]


async def test_fair_queue_shares_a_round_between_actors(
    engine: AsyncEngine, engine_url: str | URL, runs_file: Path
) -> None:
    """On a ``fair`` queue a backlog of one actor cannot hold the other back a whole round."""
    client = JobsClient(SqlBackend(engine))
    async with engine.begin() as conn:
        await conn.execute(insert(engine.dialect.name, queues).values(name="shared", mode="fair"))
    flood = [
        await client.enqueue(basic.record, basic.Work(n=n, seconds=0.3), queue="shared")
        for n in range(8)
    ]
    other = await client.enqueue(basic.slow_first, basic.Work(seconds=0.0), queue="shared")
    settings = worker_settings(engine_url, max_concurrency=4, queues=("shared",))
    async with running_worker(settings, ACTORS):
        await wait_until(lambda: _all(engine, [*flood, other], "succeeded"), timeout=60)
    recorded = support.runs(runs_file)
    other_start = recorded[str(other.job_id)][0][3]
    flood_starts = sorted(recorded[str(h.job_id)][0][3] for h in flood)
    # Strict FIFO would start all eight older flood jobs first (two full rounds of 4).
    assert other_start < flood_starts[4]


async def test_progress_is_published_to_redis(
    engine: AsyncEngine, engine_url: str | URL, redis_url: str
) -> None:
    from redis.asyncio import Redis

    from taskq.worker.progress import progress_channel

    client = JobsClient(SqlBackend(engine))
    handle = await client.enqueue(basic.with_progress, basic.Echo(value=1))
    redis = Redis.from_url(redis_url)
    pubsub = redis.pubsub()
    await pubsub.subscribe(progress_channel(handle.job_id))
    states: list[dict[str, Any]] = []
    try:
        settings = worker_settings(engine_url, redis_url=redis_url)
        async with running_worker(settings, ACTORS):

            async def final_state_seen() -> bool:
                message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=0.1)
                if message is not None:
                    states.append(json.loads(message["data"]))
                return bool(states) and states[-1]["state"].get("percent") == 100.0

            await wait_until(final_state_seen, timeout=20)
    finally:
        await pubsub.aclose()  # type: ignore[no-untyped-call]  # redis-py leaves it untyped
        await redis.aclose()
    seqs = [m["seq"] for m in states]
    assert seqs == sorted(seqs)
    assert len(set(seqs)) == len(seqs)
    assert states[-1]["state"] == {"step": 2, "percent": 100.0, "detail": "half"}


async def test_sub_jobs_are_enqueued_with_their_parent(
    engine: AsyncEngine, engine_url: str | URL
) -> None:
    client = JobsClient(SqlBackend(engine))
    parent = await client.enqueue(basic.fan_out, basic.Echo(value=3))
    async with running_worker(worker_settings(engine_url), ACTORS):

        async def children_done() -> bool:
            async with engine.connect() as conn:
                stmt = select(jobs.c.status).where(jobs.c.parent_job_id == parent.job_id)
                statuses = list((await conn.execute(stmt)).scalars())
            return len(statuses) == 3 and set(statuses) == {"succeeded"}

        await wait_until(children_done)
    assert (await _row(engine, parent.job_id)).status == "succeeded"
