"""The ticker on real Postgres and SQLite, driven by a FakeClock: at most once per tick with
two tickers racing, the missed-tick policies, refusals, the idempotency backstop."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pydantic import BaseModel
from sqlalchemy import select, update
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncEngine

from taskq.actor import ActorRef, actor
from taskq.backends.sql import SqlBackend
from taskq.client import JobsClient
from taskq.cron import Schedule
from taskq.cron.client import SchedulesClient
from taskq.cron.ticker import Ticker
from taskq.cron.ticks import tick_id
from taskq.db.engine import make_engine, transaction
from taskq.db.tables import cron_schedules, jobs
from taskq.settings import TaskQSettings
from taskq.testing.clock import FakeClock
from tests.support.otel import otel
from tests.support.workers import wait_until

START = datetime(2026, 6, 1, 12, 0, 0, tzinfo=UTC)


class Tick(BaseModel):
    n: int = 0


@actor(name="it-cron-tick")
async def tick(payload: Tick) -> None: ...


@actor(name="it-cron-capped", max_pending=1)
async def capped(payload: Tick) -> None: ...


@actor(name="it-cron-single", singleton=True)
async def single(payload: Tick) -> None: ...


def ticker(engine: AsyncEngine, clock: FakeClock, *refs: ActorRef[Any, Any]) -> Ticker:
    actors = {r.name: r for r in refs or (tick, capped, single)}
    return Ticker(engine, JobsClient(SqlBackend(engine)), actors, clock=clock)


def schedules(engine: AsyncEngine, clock: FakeClock) -> SchedulesClient:
    return SchedulesClient(engine, JobsClient(SqlBackend(engine)), clock=clock)


async def cron_jobs(engine: AsyncEngine, actor_name: str = "it-cron-tick") -> list[Any]:
    async with engine.connect() as conn:
        stmt = select(jobs).where(jobs.c.actor == actor_name).order_by(jobs.c.idempotency_key)
        return list((await conn.execute(stmt)).all())


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(START)


@pytest.fixture
async def second_engine(
    engine_url: str | URL, settings: TaskQSettings
) -> AsyncIterator[AsyncEngine]:
    """Another engine on the same database: a second worker's pool."""
    eng = make_engine(engine_url, settings=settings)
    yield eng
    await eng.dispose()


async def test_two_tickers_racing_enqueue_each_tick_exactly_once(
    engine: AsyncEngine, second_engine: AsyncEngine, clock: FakeClock
) -> None:
    every_second = Schedule(cron="*/1 * * * * *", id="race", missed="all", max_catchup=1000)
    await schedules(engine, clock).create(tick, every_second)
    one, two = ticker(engine, clock), ticker(second_engine, clock)
    for step in [1] * 15 + [5, 1, 7]:  # a tick a round, then catch-ups the two race for
        clock.advance(step)
        await asyncio.gather(one.run_once(), two.run_once(), one.run_once())
    rows = await cron_jobs(engine)
    elapsed = int((clock.now() - START).total_seconds())
    expected = [
        f"cron:{(START + timedelta(seconds=s)).strftime('%Y-%m-%dT%H:%M:%SZ')}:race"
        for s in range(1, elapsed + 1)
    ]
    assert [r.idempotency_key for r in rows] == expected  # one job per tick, none twice
    assert one.enqueued + two.enqueued == elapsed
    record = await schedules(engine, clock).get("race")
    assert record.enqueued_count == elapsed
    assert record.next_run_at == clock.now() + timedelta(seconds=1)
    assert record.last_outcome == "enqueued"


async def test_the_idempotency_key_backstops_a_schedule_moved_back(
    engine: AsyncEngine, clock: FakeClock
) -> None:
    await schedules(engine, clock).create(tick, Schedule(every=timedelta(minutes=1), id="back"))
    t = ticker(engine, clock)
    clock.advance(timedelta(minutes=1))
    await t.run_once()
    # Something puts the schedule back on the tick it already ran (a restored backup).
    async with transaction(engine) as conn:
        await conn.execute(
            update(cron_schedules)
            .where(cron_schedules.c.id == "back")
            .values(next_run_at=START + timedelta(minutes=1))
        )
    await t.run_once()
    assert len(await cron_jobs(engine)) == 1
    record = await schedules(engine, clock).get("back")
    assert record.last_outcome == "deduplicated"
    assert record.enqueued_count == 1
    assert record.next_run_at == START + timedelta(minutes=2)


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        ("skip", []),
        ("latest", ["15:00"]),
        ("all", ["14:00", "14:15", "14:30", "14:45", "15:00"]),
    ],
)
async def test_missed_tick_policy_after_a_three_hour_gap(
    engine: AsyncEngine, clock: FakeClock, policy: str, expected: list[str]
) -> None:
    schedule = Schedule(cron="*/15 * * * *", id="gap", missed=policy, max_catchup=5)  # type: ignore[arg-type]
    await schedules(engine, clock).create(tick, schedule)
    clock.advance(timedelta(hours=3, minutes=2))  # the fleet was down from 12:00 to 15:02
    t = ticker(engine, clock)
    await t.run_once()
    await t.run_once()  # a second round at the same time changes nothing
    rows = await cron_jobs(engine)
    assert [r.idempotency_key[16:21] for r in rows] == expected
    assert all(r.metadata["cron_schedule"] == "gap" for r in rows)
    record = await schedules(engine, clock).get("gap")
    assert record.next_run_at == datetime(2026, 6, 1, 15, 15, tzinfo=UTC)
    clock.advance(timedelta(minutes=13))  # 15:15 comes: every policy runs it, on time
    await t.run_once()
    assert len(await cron_jobs(engine)) == len(expected) + 1


async def test_a_tick_refused_by_max_pending_is_counted_and_not_retried(
    engine: AsyncEngine, clock: FakeClock
) -> None:
    sc = schedules(engine, clock)
    await sc.create(capped, Schedule(every=timedelta(minutes=1), id="capped"))
    t = ticker(engine, clock)
    for _ in range(3):
        clock.advance(timedelta(minutes=1))
        await t.run_once()
        await t.run_once()
    assert len(await cron_jobs(engine, "it-cron-capped")) == 1  # the first is still pending
    record = await sc.get("capped")
    assert record.enqueued_count == 1
    assert record.refused_count == 2
    assert record.last_outcome == "refused:max_pending"
    assert record.last_error is not None
    assert record.next_run_at == clock.now() + timedelta(minutes=1)
    assert record.last_tick_at == clock.now()


async def test_a_singleton_collision_is_a_refusal_too(
    engine: AsyncEngine, clock: FakeClock
) -> None:
    sc = schedules(engine, clock)
    await sc.create(single, Schedule(every=timedelta(minutes=1), id="single"))
    t = ticker(engine, clock)
    clock.advance(timedelta(minutes=1))
    await t.run_once()
    clock.advance(timedelta(minutes=1))
    await t.run_once()
    record = await sc.get("single")
    assert (record.enqueued_count, record.refused_count) == (1, 1)
    assert record.last_outcome == "refused:singleton"


async def test_jitter_delays_the_job_not_the_tick(engine: AsyncEngine, clock: FakeClock) -> None:
    schedule = Schedule(every=timedelta(hours=1), id="jit", jitter=timedelta(minutes=10))
    await schedules(engine, clock).create(tick, schedule)
    clock.set(datetime(2026, 6, 1, 13, 0, 0, tzinfo=UTC))
    await ticker(engine, clock).run_once()
    [row] = await cron_jobs(engine)
    assert row.idempotency_key == "cron:2026-06-01T13:00:00Z:jit"
    assert row.status == "scheduled"
    assert clock.now() < row.scheduled_at <= clock.now() + timedelta(minutes=10)


async def test_disabled_schedules_and_other_actors_do_not_tick(
    engine: AsyncEngine, clock: FakeClock
) -> None:
    sc = schedules(engine, clock)
    await sc.create(tick, Schedule(every=timedelta(minutes=1), id="off", enabled=False))
    await sc.create(capped, Schedule(every=timedelta(minutes=1), id="elsewhere"))
    clock.advance(timedelta(minutes=5))
    await ticker(engine, clock, tick).run_once()  # this worker runs only it-cron-tick
    assert await cron_jobs(engine) == []
    assert await cron_jobs(engine, "it-cron-capped") == []
    enabled = await sc.enable("off")
    assert enabled.next_run_at == clock.now() + timedelta(minutes=1)  # no catch-up


async def test_ticks_are_counted_by_outcome_once_fleet_wide(
    engine: AsyncEngine, second_engine: AsyncEngine, clock: FakeClock
) -> None:
    telemetry = otel()
    sid = f"metered-{engine.dialect.name}"
    await schedules(engine, clock).create(capped, Schedule(every=timedelta(minutes=1), id=sid))
    t = ticker(engine, clock)
    clock.advance(timedelta(minutes=1))
    await t.run_once()  # enqueued
    clock.advance(timedelta(minutes=1))
    await t.run_once()  # refused: the first is still pending (max_pending=1)
    clock.advance(timedelta(minutes=10))
    other = ticker(second_engine, clock)  # a second worker racing: counts nothing twice
    await asyncio.gather(t.run_once(), other.run_once())  # 9 missed, the tenth refused
    points = telemetry.points("taskq.cron.ticks", schedule=sid)
    assert points == {
        (("actor", "it-cron-capped"), ("outcome", "enqueued")): 1,
        (("actor", "it-cron-capped"), ("outcome", "refused:max_pending")): 2,
        (("actor", "it-cron-capped"), ("outcome", "missed")): 9,
    }


async def test_a_catch_up_refused_midway_goes_tick_by_tick(
    engine: AsyncEngine, clock: FakeClock
) -> None:
    sc = schedules(engine, clock)
    sid = "capped-catchup"
    await sc.create(capped, Schedule(every=timedelta(minutes=1), id=sid, missed="all"))
    clock.advance(timedelta(minutes=4, seconds=10))  # four ticks due at once
    await ticker(engine, clock).run_once()
    [job] = await cron_jobs(engine, "it-cron-capped")  # max_pending=1: only the first
    assert job.idempotency_key == "cron:2026-06-01T12:01:00Z:capped-catchup"
    record = await sc.get(sid)
    assert (record.enqueued_count, record.refused_count) == (1, 3)
    assert record.last_tick_at == START + timedelta(minutes=4)
    assert record.next_run_at == START + timedelta(minutes=5)


async def test_without_a_clock_the_ticker_goes_by_the_stores(engine: AsyncEngine) -> None:
    sc = SchedulesClient(engine, JobsClient(SqlBackend(engine)))  # the store's clock too
    created = await sc.create(tick, Schedule(cron="*/1 * * * * *", id="store-clock"))
    assert created.next_run_at is not None
    t = Ticker(engine, JobsClient(SqlBackend(engine)), {tick.name: tick})

    async def ran() -> bool:
        await t.run_once()
        return len(await cron_jobs(engine)) >= 2

    await wait_until(ran, timeout=30, interval=0.2)
    assert t.now is not None
    assert t.now >= created.next_run_at
    keys = [r.idempotency_key for r in await cron_jobs(engine)]
    assert len(keys) == len(set(keys))
    assert keys[0] >= f"cron:{tick_id(created.next_run_at)}:store-clock"


async def test_a_tick_is_a_span_and_its_job_is_sent_inside_it(
    engine: AsyncEngine, clock: FakeClock
) -> None:
    """The ``cron tick`` span is the parent of the ``send`` span of the job it enqueued,
    and that job's stored trace context points at the ``send`` span: a cron job's trace
    starts at its tick."""
    telemetry = otel()
    telemetry.spans.clear()
    sid = f"traced-{engine.dialect.name}"
    await schedules(engine, clock).create(tick, Schedule(every=timedelta(minutes=1), id=sid))
    clock.advance(timedelta(minutes=1))
    await ticker(engine, clock, tick).run_once()
    spans = telemetry.spans.get_finished_spans()
    [tick_span] = [
        s
        for s in spans
        if s.name == "cron tick" and dict(s.attributes or {})["taskq.schedule"] == sid
    ]
    assert dict(tick_span.attributes or {})["taskq.actor"] == tick.name
    [send] = [
        s
        for s in spans
        if s.name.startswith("send")
        and s.parent is not None
        and s.parent.span_id == tick_span.context.span_id
    ]
    [job] = await cron_jobs(engine)
    assert dict(send.attributes or {})["messaging.message.id"] == str(job.id)
