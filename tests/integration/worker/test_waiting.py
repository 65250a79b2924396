"""Waiting without churn: keyed limits park per key, a denial parks a job once without an
attempt, and a release wakes a parked job on another worker.

Real workers running as tasks of the test's event loop, on real Postgres/SQLite and Redis.
"""

from __future__ import annotations

import asyncio
import itertools
import uuid
from datetime import timedelta
from typing import Any

from pydantic import BaseModel
from sqlalchemy import func, select, update
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncEngine

from taskq.actor import actor
from taskq.backends.sql import SqlBackend
from taskq.client import JobsClient
from taskq.context import JobContext
from taskq.db.dialect import now
from taskq.db.engine import make_engine
from taskq.db.tables import job_attempts, jobs
from taskq.ratelimit import (
    ConcurrencyReservation,
    KeyedRateLimitRef,
    KeyedReservationRef,
    RateLimitRegistry,
)
from taskq.records import EnqueueArgs
from taskq.settings import TaskQSettings
from tests.support.workers import running_worker, wait_until, worker_settings

REDIS = "redis://127.0.0.1:6379/0"


class Attempt(BaseModel):
    attempt: int


class Tenant(BaseModel):
    tenant: str
    n: int = 0
    seconds: float = 0.0
    hold: str = ""
    """The name of a :data:`_HOLDS` event the job waits for: it holds its slot until the
    test has seen what it must see meanwhile (a fixed sleep races a loaded machine)."""


_HOLDS: dict[str, asyncio.Event] = {}
"""Events the test sets to let a holding job end (the workers run in the test's loop)."""


async def _held(payload: Tenant) -> None:
    if payload.hold:
        async with asyncio.timeout(120):  # a broken test must not hang the run
            await _HOLDS.setdefault(payload.hold, asyncio.Event()).wait()
    if payload.seconds:
        await asyncio.sleep(payload.seconds)


async def _rows(engine: AsyncEngine, **where: Any) -> list[Any]:
    stmt = select(jobs)
    for column, value in where.items():
        stmt = stmt.where(jobs.c[column] == value)
    async with engine.connect() as conn:
        return list((await conn.execute(stmt)).all())


async def _attempt_count(engine: AsyncEngine, job_id: Any) -> int:
    async with engine.connect() as conn:
        stmt = select(func.count()).select_from(job_attempts).where(job_attempts.c.job_id == job_id)
        return int((await conn.execute(stmt)).scalar_one())


# -- keyed limits: a hot key never blocks the others ---------------------------------

PERIOD_S = 1.0
"""The keyed bucket's period: one token per second per tenant (capacity 1)."""


def _tenant_actor(base: str) -> Any:
    @actor(
        name=f"waiting_tenant_{base}",
        rate_limits=[
            KeyedRateLimitRef(
                payload_type=Tenant,
                base_name=base,
                key_fn=lambda p: p.tenant,
                capacity=1,
                refill_per_second=1 / PERIOD_S,
            )
        ],
    )
    async def tenant(payload: Tenant) -> None:
        return None

    return tenant


async def test_a_hot_key_does_not_hold_back_the_cold_ones(
    pg_url: URL, settings: TaskQSettings, unique_name: str
) -> None:
    """1,000 jobs of a hot tenant, parked on their key (each looked at once), then ten
    cold tenants sending one job per period each for ten periods, through one keyed
    bucket (1 token per period per tenant). Every cold job starts within two of the hot
    key's periods of the moment it could run (due, and its own key's token back): at most
    two hot jobs start in between (the store's ``scheduled_at`` and ``started_at``), while
    the hot tenant's backlog waits parked, each job once.

    The hot key's own runs are the clock, not the wall clock: a cold job held back behind
    the hot backlog sees one hot job start per period it waits, while a worker stalled by
    a loaded machine (seconds without a turn of its event loop) stalls the hot key too.
    The cold tenants start once the backlog is parked: parking 1,000 rows is work
    proportional to the backlog (seconds on a loaded machine), and a cold tenant sending
    at exactly its rate never catches up a delay from before its first job."""
    tenant = _tenant_actor(unique_name)
    engine = make_engine(pg_url, settings=settings)
    try:
        client = JobsClient(SqlBackend(engine))
        await client.enqueue_many(
            [EnqueueArgs(tenant, Tenant(tenant="hot", n=n)) for n in range(1000)]
        )
        worker = worker_settings(pg_url, redis_url=REDIS, max_concurrency=50)

        async def hot_parked() -> bool:
            return not await _rows(engine, status="pending")

        async def cold_done() -> bool:
            rows = await _rows(engine, status="succeeded")
            return sum(1 for r in rows if r.payload["tenant"] != "hot") == 100

        cold = [
            EnqueueArgs(
                tenant,
                Tenant(tenant=f"cold{c}", n=i),
                {"delay": timedelta(seconds=PERIOD_S * (i + 1))},
            )
            for i in range(10)
            for c in range(10)
        ]
        async with running_worker(
            worker, {tenant.name: tenant}, rate_limit_registry=RateLimitRegistry()
        ):
            await wait_until(hot_parked, timeout=60)
            await client.enqueue_many(cold)
            await wait_until(cold_done, timeout=90)
        rows = await _rows(engine)
    finally:
        await engine.dispose()
    cold_rows = [r for r in rows if r.payload["tenant"] != "hot"]
    hot = [r for r in rows if r.payload["tenant"] == "hot"]
    hot_starts = sorted(r.started_at for r in hot if r.started_at is not None)
    ready = _ready(cold_rows)
    late = [
        (r.payload, (r.started_at - ready[r.id]).total_seconds(), passed)
        for r in cold_rows
        if (passed := sum(1 for t in hot_starts if ready[r.id] < t < r.started_at)) > 2
    ]
    assert not late, late
    waiting = [r for r in hot if r.status == "scheduled"]
    # The hot backlog is parked on its key, in order, without attempts.
    assert len(waiting) > 900
    assert {r.waiting_on for r in waiting} == {f"{unique_name}:hot"}
    assert all(r.attempt == 0 for r in waiting)
    # Parked once each (a job whose turn came and went early may be parked once more).
    assert sum(r.denials for r in waiting) <= len(waiting) + 10
    ran_hot = [r for r in hot if r.status == "succeeded"]
    assert ran_hot
    assert all(r.attempt == 1 for r in ran_hot)


def _due(row: Any) -> Any:
    """When a cold job was due: enqueued with a delay, it was ``scheduled`` for then."""
    return row.created_at + timedelta(seconds=PERIOD_S * (row.payload["n"] + 1))


def _ready(rows: list[Any]) -> dict[Any, Any]:
    """When each cold job could run: due, and its tenant's token back (one period after
    the tenant's previous start; the bucket holds one token)."""
    out: dict[Any, Any] = {}
    last: dict[str, Any] = {}
    for row in sorted(rows, key=lambda r: r.started_at):
        key = row.payload["tenant"]
        out[row.id] = _due(row)
        if key in last:
            out[row.id] = max(out[row.id], last[key] + timedelta(seconds=PERIOD_S))
        last[key] = row.started_at
    return out


# -- a denial parks a job once, with no attempt ---------------------------------------


def _slot_actor(base: str, lease_s: float) -> Any:
    @actor(
        name=f"waiting_slot_{base}",
        reservations=[
            KeyedReservationRef(
                payload_type=Tenant,
                base_name=base,
                key_fn=lambda p: p.tenant,
                slots=1,
                lease=lease_s,
            )
        ],
    )
    async def slot(payload: Tenant, ctx: JobContext[Tenant]) -> Attempt:
        await _held(payload)
        return Attempt(attempt=ctx.attempt)

    return slot


async def test_a_job_parked_a_hundred_times_has_made_no_attempt(
    engine: AsyncEngine, engine_url: str | URL, unique_name: str
) -> None:
    """Someone else holds the key's only slot (a 300 s lease). The job is claimed and
    denied 100 times (the test makes it due again after each park): it stays at
    ``attempt`` 0 with no attempt row, ``waiting_on`` names the reservation and
    ``ready_at`` is the holder's lease end. Once the slot is free it runs as attempt 1
    (``ctx.attempt`` 1), with one attempt row, ``budget_used`` 0."""
    slot = _slot_actor(unique_name, 300.0)
    name = f"{unique_name}:t1"
    holder = ConcurrencyReservation(name, slots=1, lease=300.0)
    someone = uuid.uuid4()  # not a worker: any holder of the slot will do
    held = await holder.acquire(None, someone, engine)
    client = JobsClient(SqlBackend(engine))
    handle = await client.enqueue(slot, Tenant(tenant="t1"))
    settings = worker_settings(engine_url)
    dialect = engine.dialect.name

    async def parked(times: int) -> bool:
        (row,) = await _rows(engine, id=handle.job_id)
        return bool(row.denials >= times and row.status == "scheduled")

    async with running_worker(settings, {slot.name: slot}, rate_limit_registry=RateLimitRegistry()):
        for times in range(1, 101):
            await wait_until(lambda t=times: parked(t), timeout=30, interval=0.01)  # type: ignore[misc]
            if times == 100:
                break
            async with engine.begin() as conn:  # due again now, as if the lease had lapsed
                await conn.execute(
                    update(jobs).where(jobs.c.id == handle.job_id).values(scheduled_at=now(dialect))
                )
        record = await handle.refresh()
        assert (record.status, record.attempt, record.denials) == ("scheduled", 0, 100)
        assert record.budget_used == 0
        assert record.waiting_on == name
        assert record.ready_at == record.scheduled_at
        assert (record.ready_at - record.updated_at).total_seconds() > 200  # the lease end
        assert await handle.attempts() == []
        assert await _attempt_count(engine, handle.job_id) == 0
        status = await handle.status()  # the same, through the handle's status
        assert (status, status.state, status.waiting_on) == ("scheduled", "waiting", name)
        assert (status.ready_at, status.denials) == (record.ready_at, 100)

        await holder.release(held, someone, engine)
        async with engine.begin() as conn:
            await conn.execute(
                update(jobs).where(jobs.c.id == handle.job_id).values(scheduled_at=now(dialect))
            )
        done = await handle.wait(timeout=30)
        assert done.attempt == 1  # ctx.attempt of the first real run
    record = await handle.refresh()
    assert (record.attempt, record.budget_used, record.denials) == (1, 0, 100)
    assert record.waiting_on is None
    assert record.ready_at is None
    assert [a.outcome for a in await handle.attempts()] == ["succeeded"]


# -- a release wakes a parked job on another worker -----------------------------------


async def test_a_release_wakes_the_job_parked_on_it_on_another_worker(
    engine: AsyncEngine, engine_url: str | URL, unique_name: str
) -> None:
    """Worker A runs X, holding the key's only slot (lease 300 s); worker B claims Y,
    same key, is denied and parks it until the lease end. X ends: its release wakes Y,
    and B runs it at once. On Postgres B polls only every 60 s, so only the release's
    NOTIFY can have brought it round; on SQLite the (short) poll does. The events come in
    this order: X starts, Y parks, X ends, Y starts, long before its parked time."""
    slot = _slot_actor(unique_name, 300.0)
    client = JobsClient(SqlBackend(engine))
    pg = engine.dialect.name == "postgresql"
    poll = 60.0 if pg else 0.05
    a_settings = worker_settings(engine_url, queues=("wa",), poll_interval=poll)
    b_settings = worker_settings(engine_url, queues=("wb",), poll_interval=poll)
    actors = {slot.name: slot}
    registry_a, registry_b = RateLimitRegistry(), RateLimitRegistry()
    async with (
        running_worker(a_settings, actors, rate_limit_registry=registry_a) as a,
        running_worker(b_settings, actors, rate_limit_registry=registry_b) as b,
    ):
        await wait_until(lambda: _booted(a, b), timeout=30)
        x = await client.enqueue(slot, Tenant(tenant="k", hold=unique_name), queue="wa")

        async def x_running() -> bool:
            return (await x.status()) == "running"

        await wait_until(x_running, timeout=30, interval=0.01)
        y = await client.enqueue(slot, Tenant(tenant="k"), queue="wb")

        async def y_parked() -> bool:
            record = await y.refresh()
            return record.denials == 1 and record.status == "scheduled"

        await wait_until(y_parked, timeout=30, interval=0.01)
        parked = await y.refresh()
        assert parked.waiting_on == f"{unique_name}:k"
        assert parked.attempt == 0
        assert (await x.status()) == "running"  # Y parked while X held the slot
        _HOLDS.setdefault(unique_name, asyncio.Event()).set()  # X ends: its release
        assert (await y.wait(timeout=30)).attempt == 1
    done_x, done_y = await x.refresh(), await y.refresh()
    assert done_x.started_at is not None
    assert done_y.started_at is not None
    assert parked.ready_at is not None
    # Y ran after X (the slot's release), long before its parked time.
    assert done_x.finished_at is not None
    assert done_y.started_at > done_x.started_at
    assert done_y.started_at < parked.ready_at - timedelta(seconds=200)
    assert done_y.attempt == 1
    assert done_y.denials == 1


def _static_slot_actor(base: str) -> Any:
    @actor(
        name=f"waiting_static_{base}",
        reservations=[ConcurrencyReservation(base, slots=1, lease=300.0)],
    )
    async def static(payload: Tenant, ctx: JobContext[Tenant]) -> Attempt:
        await _held(payload)
        return Attempt(attempt=ctx.attempt)

    return static


async def test_releasing_a_static_reservation_wakes_another_worker(
    engine: AsyncEngine, engine_url: str | URL, unique_name: str
) -> None:
    """A static one-slot reservation (lease 300 s). Worker A runs X holding it; worker B
    (another queue) is asked for Y, finds the slot taken in its claim and leaves Y
    ``pending`` (taken before the claim: nothing parked, nothing written). X ends, A has
    nothing more for the slot and releases it: on Postgres the release NOTIFYs, and B,
    which polls only every 60 s, runs Y at once; on SQLite B's poll finds it. Order: X
    starts, B's gate is full while X runs, X ends, Y starts (long before the lease end)."""
    static = _static_slot_actor(unique_name)
    client = JobsClient(SqlBackend(engine))
    pg = engine.dialect.name == "postgresql"
    poll = 60.0 if pg else 0.05
    a_settings = worker_settings(engine_url, queues=("wa",), poll_interval=poll)
    b_settings = worker_settings(engine_url, queues=("wb",), poll_interval=poll)
    actors = {static.name: static}
    async with (
        running_worker(a_settings, actors, rate_limit_registry=RateLimitRegistry()) as a,
        running_worker(b_settings, actors, rate_limit_registry=RateLimitRegistry()) as b,
    ):
        await wait_until(lambda: _booted(a, b), timeout=30)
        x = await client.enqueue(static, Tenant(tenant="k", hold=unique_name), queue="wa")

        async def x_running() -> bool:
            return (await x.status()) == "running"

        await wait_until(x_running, timeout=30, interval=0.01)
        y = await client.enqueue(static, Tenant(tenant="k"), queue="wb")
        assert b.dispatcher.gate is not None
        b_gate = b.dispatcher.gate.admission.slot_gates[unique_name]

        async def b_found_it_full() -> bool:
            return b_gate.waiting

        await wait_until(b_found_it_full, timeout=30, interval=0.01)
        assert (await x.status()) == "running"  # B was refused while X held the slot
        held_back = await y.refresh()
        assert (held_back.status, held_back.attempt, held_back.denials) == ("pending", 0, 0)
        _HOLDS.setdefault(unique_name, asyncio.Event()).set()  # X ends: A releases the slot
        assert (await y.wait(timeout=30)).attempt == 1
    done_x, done_y = await x.refresh(), await y.refresh()
    assert done_x.started_at is not None
    assert done_y.started_at is not None
    assert done_x.finished_at is not None
    assert done_y.started_at > done_x.started_at  # after X's release
    assert done_y.started_at < done_x.finished_at + timedelta(
        seconds=40
    )  # not the poll, not the lease
    assert (done_y.attempt, done_y.denials, done_y.waiting_on) == (1, 0, None)


async def _booted(*workers: Any) -> bool:
    return all(w.limits.active and w.dispatcher.gate is not None for w in workers)


# -- a queue cap hands on at a release, not at the lease end ----------------------------


@actor(name="waiting_capped")
async def capped(payload: Tenant, ctx: JobContext[Tenant]) -> Attempt:
    await asyncio.sleep(payload.seconds)
    return Attempt(attempt=ctx.attempt)


async def test_a_queue_cap_hands_on_at_a_release_across_two_workers(
    engine: AsyncEngine, engine_url: str | URL, unique_name: str
) -> None:
    """``queues.max_concurrent = 1`` and two workers (lock lease, hence the cap's slot
    lease, 60 s): six jobs of 0.3 s run one at a time, each once, and all are done long
    before one lease could have lapsed. A job denied by the cap on the other worker was
    parked and woken by the release (no attempt spent on it)."""
    from taskq.db.dialect import insert
    from taskq.db.tables import queues

    queue = unique_name.replace(".", "_")[:60]
    async with engine.begin() as conn:
        await conn.execute(insert(engine.dialect.name, queues).values(name=queue, max_concurrent=1))
    client = JobsClient(SqlBackend(engine))
    handles = [
        await client.enqueue(capped, Tenant(tenant="x", n=n, seconds=0.3), queue=queue)
        for n in range(6)
    ]
    settings = worker_settings(engine_url, queues=(queue,), lock_lease=60.0)
    actors = {capped.name: capped}
    async with (
        running_worker(settings, actors, rate_limit_registry=RateLimitRegistry()),
        running_worker(settings, actors, rate_limit_registry=RateLimitRegistry()),
    ):
        for handle in handles:
            assert (await handle.wait(timeout=30)).attempt == 1
    records = [await h.refresh() for h in handles]
    starts = sorted(r.started_at for r in records if r.started_at is not None)
    assert len(starts) == 6
    for cur, nxt in itertools.pairwise(starts):
        assert nxt >= cur + timedelta(seconds=0.3)  # one at a time
    assert all(r.attempt == 1 and r.waiting_on is None for r in records)
    assert [await _attempt_count(engine, r.id) for r in records] == [1] * 6


# -- tokens taken for jobs the claim did not find are given back ------------------------


async def test_tokens_paid_for_jobs_the_claim_did_not_find_go_back_to_a_sql_bucket(
    engine: AsyncEngine, engine_url: str | URL, unique_name: str
) -> None:
    """A SQL-backed fixed quota of 10 tokens, 3 jobs, a worker with room for 10: the claim
    round pays for up to 10 jobs before claiming, finds 3, and refunds the other 7 into
    the bucket (on Postgres and SQLite), so 7 are left once the 3 have run."""
    from taskq.ratelimit import TokenBucket

    bucket = TokenBucket(unique_name, capacity=10, refill_per_second=0, backend="postgres")

    @actor(name=f"waiting_sql_quota_{unique_name}", rate_limits=[bucket])
    async def quota(payload: Tenant) -> None:
        return None

    client = JobsClient(SqlBackend(engine))
    handles = [await client.enqueue(quota, Tenant(tenant="t", n=n)) for n in range(3)]
    settings = worker_settings(engine_url, max_concurrency=10)
    async with running_worker(
        settings, {quota.name: quota}, rate_limit_registry=RateLimitRegistry()
    ):
        for handle in handles:
            await handle.wait(timeout=30)
    state = await bucket.peek(pg_pool=engine)
    assert state.tokens_remaining == 7
    assert [(await h.refresh()).attempt for h in handles] == [1, 1, 1]
