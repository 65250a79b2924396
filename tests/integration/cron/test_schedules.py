"""``tq.schedules`` and the worker's startup sync on real Postgres and SQLite: code seeds,
operators own the switch; deregistration and enabled schedules."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pydantic import BaseModel
from sqlalchemy import select
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncEngine

from taskq.actor import actor
from taskq.actor_config_ops import ActorsClient, sync_actor_config
from taskq.backends.sql import SqlBackend
from taskq.client import JobsClient, TaskQ
from taskq.cron import Schedule
from taskq.cron.client import SchedulesClient
from taskq.cron.sync import sync_schedules
from taskq.cron.ticker import Ticker
from taskq.db.engine import transaction
from taskq.db.tables import cron_schedules, jobs
from taskq.exceptions import (
    ActorHasEnabledSchedulesError,
    ConfigurationError,
    PayloadValidationError,
    ScheduleExistsError,
    ScheduleNotFoundError,
)
from taskq.settings import TaskQSettings
from taskq.testing.clock import FakeClock
from tests.support.workers import running_worker, wait_until, worker_settings

START = datetime(2026, 6, 1, 12, 0, 0, tzinfo=UTC)


class Report(BaseModel):
    day: str = "today"


@actor(
    name="it-sched-report",
    schedules=[
        Schedule(cron="0 2 * * *", tz="Europe/Berlin", payload=Report(day="yesterday")),
        Schedule(every=timedelta(minutes=5), id="it-sched-report-5m", tags=["t"], priority=3),
    ],
)
async def report(payload: Report) -> None: ...


@actor(name="it-sched-other", schedules=[Schedule(cron="* * * * *", id="it-sched-report-5m")])
async def other(payload: Report) -> None: ...


@actor(name="it-sched-live", schedules=[Schedule(cron="*/1 * * * * *", missed="all")])
async def live(payload: Report) -> None: ...


def client(engine: AsyncEngine, clock: FakeClock) -> SchedulesClient:
    return SchedulesClient(engine, JobsClient(SqlBackend(engine)), clock=clock)


async def rows(engine: AsyncEngine) -> dict[str, Any]:
    async with engine.connect() as conn:
        return {r.id: r for r in (await conn.execute(select(cron_schedules))).all()}


async def sync(engine: AsyncEngine, *refs: Any, now: datetime = START) -> list[str]:
    async with transaction(engine) as conn:
        await sync_actor_config(conn, refs)
        return await sync_schedules(conn, refs, now=now)


async def test_startup_sync_seeds_and_keeps_the_operators_switch(engine: AsyncEngine) -> None:
    clock = FakeClock(START)
    assert await sync(engine, report) == ["it-sched-report", "it-sched-report-5m"]
    stored = await rows(engine)
    daily = stored["it-sched-report"]
    assert (daily.actor, daily.cron_expression, daily.timezone) == (
        "it-sched-report",
        "0 2 * * *",
        "Europe/Berlin",
    )
    assert daily.payload == {"day": "yesterday"}
    assert daily.origin == "code"
    assert daily.enabled is True
    assert daily.next_run_at == datetime(2026, 6, 2, 0, 0, tzinfo=UTC)  # 02:00 CEST
    five = stored["it-sched-report-5m"]
    assert (five.cron_expression, five.tags, five.priority) == ("@every 300s", ["t"], 3)

    await client(engine, clock).disable("it-sched-report")
    later = START + timedelta(days=3)
    await sync(engine, report, now=later)  # a redeploy: the operator's switch stays off
    assert (await rows(engine))["it-sched-report"].enabled is False
    assert (await rows(engine))["it-sched-report-5m"].next_run_at == five.next_run_at

    changed = dataclasses.replace(
        report,
        schedules=(
            dataclasses.replace(report.schedules[0], cron="0 3 * * *"),
            report.schedules[1],
        ),
    )
    await sync(engine, changed, now=later)  # new timing: definition and next run follow code
    daily = (await rows(engine))["it-sched-report"]
    assert daily.cron_expression == "0 3 * * *"
    assert daily.enabled is False
    assert daily.next_run_at == datetime(2026, 6, 5, 1, 0, tzinfo=UTC)


async def test_an_id_stored_for_another_actor_fails_the_sync(engine: AsyncEngine) -> None:
    await sync(engine, report)
    with pytest.raises(ConfigurationError, match="stored for actor 'it-sched-report'"):
        await sync(engine, other)
    with pytest.raises(ConfigurationError, match="declared by actors"):
        await sync(engine, report, other)
    assert (await rows(engine))["it-sched-report-5m"].actor == "it-sched-report"


async def test_a_worker_syncs_at_boot_and_runs_the_schedule(
    engine_url: str | URL, engine: AsyncEngine
) -> None:
    settings = worker_settings(engine_url)
    async with running_worker(settings, {live.name: live}):

        async def two_ran() -> bool:
            async with engine.connect() as conn:
                stmt = select(jobs.c.status).where(jobs.c.actor == live.name)
                statuses = (await conn.execute(stmt)).scalars().all()
            return statuses.count("succeeded") >= 2

        await wait_until(two_ran, timeout=60)
    stored = (await rows(engine))["it-sched-live"]
    assert stored.origin == "code"
    assert stored.enqueued_count >= 2
    assert stored.last_outcome == "enqueued"


async def test_schedules_api_create_get_list_switch_run_now_history_delete(
    engine_url: str | URL, settings: TaskQSettings
) -> None:
    clock = FakeClock(START)
    async with TaskQ(engine_url, settings=settings) as tq:
        tq.schedules.clock = clock
        created = await tq.schedules.create(
            report, Schedule(every=timedelta(hours=1), id="api-hourly", payload={"day": "d"})
        )
        assert created.origin == "api"
        assert created.next_run_at == START + timedelta(hours=1)
        with pytest.raises(ScheduleExistsError):
            await tq.schedules.create(report, Schedule(every=timedelta(hours=1), id="api-hourly"))
        with pytest.raises(PayloadValidationError):
            await tq.schedules.create(
                report, Schedule(every=timedelta(hours=1), id="api-bad", payload={"day": 5})
            )
        replaced = await tq.schedules.create(
            "it-sched-report",
            Schedule(cron="30 * * * *", id="api-hourly", payload={"day": "e"}),
            replace=True,
        )
        assert (replaced.cron, replaced.payload) == ("30 * * * *", {"day": "e"})
        assert [r.id for r in await tq.schedules.list()] == ["api-hourly"]
        assert await tq.schedules.list(enabled=False) == []

        handle = await tq.schedules.run_now("api-hourly")
        record = await tq.schedules.get("api-hourly")
        assert record.last_job_id == handle.job_id
        assert record.last_outcome == "run-now"
        assert record.last_job_status == "pending"
        assert record.next_run_at == replaced.next_run_at  # the timetable is untouched

        ticker = Ticker(tq.engine, tq.jobs, {report.name: report}, clock=clock)
        clock.set(datetime(2026, 6, 1, 12, 30, 0, tzinfo=UTC))
        await ticker.run_once()
        history = await tq.schedules.history("api-hourly")
        assert [(r.tick, r.status) for r in history] == [
            (datetime(2026, 6, 1, 12, 30, tzinfo=UTC), "pending"),
            (None, "pending"),
        ]
        assert history[1].job_id == handle.job_id

        disabled = await tq.schedules.disable("api-hourly")
        assert disabled.enabled is False
        clock.advance(timedelta(hours=2))
        await ticker.run_once()
        assert len(await tq.schedules.history("api-hourly")) == 2
        enabled = await tq.schedules.enable("api-hourly")
        assert enabled.next_run_at == datetime(2026, 6, 1, 15, 30, tzinfo=UTC)  # after 14:30

        deleted = await tq.schedules.delete("api-hourly")
        assert deleted.id == "api-hourly"
        with pytest.raises(ScheduleNotFoundError):
            await tq.schedules.get("api-hourly")
        async with tq.engine.connect() as conn:
            count = (await conn.execute(select(jobs.c.id).where(jobs.c.actor == report.name))).all()
        assert len(count) == 2  # the jobs stay


async def test_deregistration_refuses_enabled_schedules_and_force_disables(
    engine: AsyncEngine,
) -> None:
    await sync(engine, report)
    actors = ActorsClient(engine)
    with pytest.raises(ActorHasEnabledSchedulesError) as refused:
        await actors.deregister(report.name)
    assert refused.value.schedule_ids == ["it-sched-report", "it-sched-report-5m"]
    sc = client(engine, FakeClock(START))
    assert await sc.counts() == {report.name: {"enabled": 2, "disabled": 0}}
    result = await actors.deregister(report.name, force=True)
    assert result.schedules_disabled == 2
    assert [r.enabled for r in (await rows(engine)).values()] == [False, False]
    assert await sc.counts() == {report.name: {"enabled": 0, "disabled": 2}}


async def test_the_sync_facade_operates_schedules(
    engine_url: str | URL, settings: TaskQSettings
) -> None:
    from taskq_sync import TaskQ as SyncTaskQ

    with SyncTaskQ(engine_url, settings=settings) as tq:
        made = tq.schedules.create(report, Schedule(every=timedelta(hours=1), id="sync-made"))
        assert made.enabled is True
        assert tq.schedules.disable("sync-made").enabled is False
        handle = tq.schedules.run_now("sync-made")
        assert tq.schedules.get("sync-made").last_job_id == handle.job_id
        assert [r.id for r in tq.schedules.list()] == ["sync-made"]
        tq.schedules.delete("sync-made")
        assert tq.schedules.list() == []


async def test_a_worker_whose_schedule_id_belongs_to_another_actor_does_not_boot(
    engine_url: str | URL, engine: AsyncEngine
) -> None:
    from taskq.db.tables import workers
    from taskq.worker.run import Worker

    await sync(engine, report)
    worker = Worker(
        settings=worker_settings(engine_url), actors={other.name: other}, hard_exit=False
    )
    with pytest.raises(ConfigurationError, match="is stored for actor 'it-sched-report'"):
        await worker.run()
    async with engine.connect() as conn:
        assert (await conn.execute(select(workers.c.id))).all() == []  # nothing registered
    assert (await rows(engine))["it-sched-report-5m"].actor == "it-sched-report"


@actor(name="it-sched-stubborn")
async def stubborn(payload: Report) -> None:
    """Ignores the shutdown's cancel request: the drain lasts the cancellation grace."""
    import asyncio

    await asyncio.sleep(120)


async def test_a_worker_that_is_shutting_down_enqueues_no_more_ticks(
    engine_url: str | URL, engine: AsyncEngine
) -> None:
    """The schedule ticks every second; the worker's shutdown waits out a 3 s
    cancellation grace for a job that ignores the cancel. From the shutdown's start no
    tick is enqueued (one round already under way may finish): the ticks falling due
    during the drain are left to the next worker's catch-up budget."""

    from taskq.worker.shutdown import Phase

    settings = worker_settings(engine_url, cancellation_grace_period=3.0)

    async def ticks() -> int:
        async with engine.connect() as conn:
            stmt = select(jobs.c.id).where(jobs.c.actor == live.name)
            return len((await conn.execute(stmt)).all())

    async with running_worker(settings, {live.name: live, stubborn.name: stubborn}) as worker:
        job = await JobsClient(SqlBackend(engine)).enqueue(stubborn, Report())

        async def ticking_and_busy() -> bool:
            return (await ticks()) >= 2 and (await job.status()) == "running"

        await wait_until(ticking_and_busy, timeout=60)
        worker.state.signal("test")
        at_signal = await ticks()

        async def drained() -> bool:  # the drain: 3 s of cancellation grace
            return worker.state.phase >= Phase.FORCING

        await wait_until(drained, timeout=60)
    assert (await job.refresh()).status in ("pending", "scheduled")  # released, not run
    assert await ticks() <= at_signal + 1
