"""Reservation slot leases renewed by the worker heartbeat, on Postgres and SQLite.

A slot's renewal sets its lease to the store's now + the reservation's ``lease``. It
used to add ``lease_expires_at - acquired_at`` to now, and ``acquired_at`` never moves,
so every heartbeat grew the lease by the time the job had run: after an hour-long job a
crashed worker's slot stayed taken for days. "Time passing" is simulated on the store's
own clock by moving ``acquired_at`` back, the one input the old arithmetic read, so the
tests need no sleeps. Memory-backed reservations are renewed by the same beat, in
process, read by a ``FakeClock``.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any, cast
from uuid import UUID, uuid4

import pytest
from pydantic import BaseModel
from sqlalchemy import func, select, update
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncEngine

from taskq.actor import ActorRef, actor
from taskq.db.tables import reservation_slots
from taskq.exceptions import ReservationUnavailable
from taskq.ratelimit import ConcurrencyReservation, RateLimitRegistry
from taskq.testing.clock import FakeClock
from taskq.worker.claimed import ClaimedJob
from taskq.worker.heartbeat import Heartbeat
from taskq.worker.resources import Limits
from taskq.worker.state import RunningJob
from tests.support.workers import worker_settings

LEASE_S = 1.0
SLOW_JOB = ConcurrencyReservation("slotlease.sql", slots=1, lease=LEASE_S)
MEMORY_CLOCK = FakeClock(datetime(2025, 1, 1, tzinfo=UTC))
IN_PROCESS = ConcurrencyReservation("slotlease.memory", slots=1, lease=LEASE_S, clock=MEMORY_CLOCK)


class Empty(BaseModel):
    pass


@actor(name="slotlease_sql", reservations=[SLOW_JOB])
async def holds_sql_slot(payload: Empty) -> None:
    return None


@actor(name="slotlease_memory", reservations=[IN_PROCESS])
async def holds_memory_slot(payload: Empty) -> None:
    return None


async def _holding(
    engine: AsyncEngine, url: str | URL, ref: ActorRef[Any, Any]
) -> tuple[Heartbeat, Limits, RunningJob, UUID]:
    """A worker's Limits and Heartbeat with one in-flight job of ``ref`` holding its slot."""
    worker = uuid4()
    limits = Limits(engine, worker_settings(url), worker, RateLimitRegistry())
    limits.prepare([ref])
    await limits.boot([ref])
    claimed = ClaimedJob(id=uuid4(), actor=ref.name, queue="default", payload={}, attempt=1)
    job = RunningJob(claimed=claimed, ref=ref, worker_id=worker)
    await limits.acquire(job, {})
    dispatcher = SimpleNamespace(inflight={job.id: job}, running={})
    heartbeat = Heartbeat(
        engine,
        cast(Any, dispatcher),
        worker_id=worker,
        interval_s=0.3,
        lease_s=5.0,
        grace_s=1.0,
        renew_slots=True,
        limits=limits,
    )
    return heartbeat, limits, job, worker


def _seconds_left(dialect: str) -> Any:
    """The slot's remaining lease in seconds, on the store's clock."""
    expires = reservation_slots.c.lease_expires_at
    if dialect == "postgresql":
        return func.extract("epoch", expires - func.clock_timestamp())
    return (func.julianday(expires) - func.julianday("now")) * 86400.0


async def _lease_left(engine: AsyncEngine, name: str) -> float:
    stmt = select(_seconds_left(engine.dialect.name)).where(
        reservation_slots.c.name == name, reservation_slots.c.slot_index == 0
    )
    async with engine.connect() as conn:
        return float((await conn.execute(stmt)).scalar_one())


async def _shift(engine: AsyncEngine, name: str, column: str, by: timedelta) -> None:
    """Move a slot timestamp back by ``by``: as if that much store time had passed."""
    col = reservation_slots.c[column]
    where = (reservation_slots.c.name == name, reservation_slots.c.slot_index == 0)
    async with engine.begin() as conn:
        value = (await conn.execute(select(col).where(*where))).scalar_one()
        await conn.execute(update(reservation_slots).where(*where).values({column: value - by}))


async def test_renewal_keeps_the_lease_at_one_lease_from_now(
    engine: AsyncEngine, engine_url: str | URL
) -> None:
    heartbeat, _, _, _ = await _holding(engine, engine_url, holds_sql_slot)
    for _ in range(5):
        # The job has been running 10 s longer: the old renewal added that to the lease.
        await _shift(engine, SLOW_JOB.name, "acquired_at", timedelta(seconds=10))
        await heartbeat.beat()
        left = await _lease_left(engine, SLOW_JOB.name)
        assert 0.5 < left <= LEASE_S + 0.25, f"lease {left:.2f}s from now, want ~{LEASE_S}s"


async def test_a_crashed_holders_slot_frees_after_one_lease(
    engine: AsyncEngine, engine_url: str | URL
) -> None:
    heartbeat, _, _, _ = await _holding(engine, engine_url, holds_sql_slot)
    for _ in range(3):
        await _shift(engine, SLOW_JOB.name, "acquired_at", timedelta(minutes=20))
        await heartbeat.beat()
    # The holder crashes here: no more beats. Another worker waits at most one lease ...
    other = uuid4()
    with pytest.raises(ReservationUnavailable) as denied:
        await SLOW_JOB.acquire(uuid4(), other, pool=engine)
    assert denied.value.retry_after <= timedelta(seconds=LEASE_S + 0.25)
    # ... and once one lease has passed, the slot is its.
    await _shift(engine, SLOW_JOB.name, "lease_expires_at", timedelta(seconds=LEASE_S + 0.25))
    assert await SLOW_JOB.acquire(uuid4(), other, pool=engine) == 0


async def test_a_beat_racing_a_release_leaves_the_slot_free(
    engine: AsyncEngine, engine_url: str | URL
) -> None:
    """The beat's slot list can predate a release; the (worker, job) fence keeps the
    released slot free instead of renewing it back to life."""
    heartbeat, limits, job, worker = await _holding(engine, engine_url, holds_sql_slot)
    (hold,) = limits.held_slots([job.id])
    await SLOW_JOB.release(hold.slot_index, worker, pool=engine)
    await heartbeat.beat()
    assert await SLOW_JOB.held(pool=engine) == []


async def test_memory_reservation_slot_is_renewed_in_process(
    engine: AsyncEngine, engine_url: str | URL
) -> None:
    """A memory slot held past its lease by a running job used to lapse: the next job in
    the same process took it while the first still ran (two holders of a 1-slot cap)."""
    heartbeat, limits, job, _ = await _holding(engine, engine_url, holds_memory_slot)
    try:
        for _ in range(3):
            MEMORY_CLOCK.advance(timedelta(seconds=LEASE_S * 0.8))
            await heartbeat.beat()
        with pytest.raises(ReservationUnavailable):
            await IN_PROCESS.acquire(uuid4(), uuid4())
        # Crashed (no more beats): free one lease later.
        MEMORY_CLOCK.advance(timedelta(seconds=LEASE_S))
        other = uuid4()
        assert await IN_PROCESS.acquire(uuid4(), other) == 0
        await IN_PROCESS.release(0, other)
    finally:
        for hold in limits.held_slots([job.id]):
            await hold.reservation.release(hold.slot_index, heartbeat._worker_id)
