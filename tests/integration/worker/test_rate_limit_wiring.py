"""How a worker finds its rate limits: the registry it is given (argument or DI), the
names its actors reference (checked at boot), and the queue caps it registers.

Each engine in turn; real workers running as tasks of the test's event loop.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import structlog
from pydantic import BaseModel
from sqlalchemy import func, select, update
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncEngine

from taskq.actor import actor
from taskq.backends.sql import SqlBackend
from taskq.client import JobsClient
from taskq.db.dialect import insert
from taskq.db.tables import job_attempts, jobs, queues, workers
from taskq.di import ProviderRegistry, Scope
from taskq.exceptions import ConfigurationError
from taskq.ratelimit import (
    ConcurrencyReservation,
    KeyedReservationRef,
    RateLimitRegistry,
    TokenBucket,
)
from taskq.ratelimit.refs import queue_concurrency_reservation_name
from taskq.retry import RetryPolicy
from taskq.worker.run import Worker
from tests.support.workers import running_worker, wait_until, worker_settings

OWNED_LIMIT = "wiring.owned"
OWNED_SLOTS = "wiring.slots"


class Item(BaseModel):
    n: int = 0


@actor(name="wiring_named", rate_limits=[OWNED_LIMIT], reservations=[OWNED_SLOTS])
async def named(payload: Item) -> None:
    return None


@actor(name="wiring_missing", rate_limits=["wiring.nowhere"], reservations=["wiring.nada"])
async def missing(payload: Item) -> None:
    return None


@actor(
    name="wiring_keyed",
    reservations=[
        KeyedReservationRef(
            payload_type=Item,
            base_name="wiring.keyed",
            key_fn=lambda p: str(p.n),
            slots=1,
            lease=30.0,
        )
    ],
)
async def keyed(payload: Item) -> None:
    return None


def _owned() -> RateLimitRegistry:
    """A registry holding the two names ``named`` references (and nothing else does)."""
    owned = RateLimitRegistry()
    owned.register(TokenBucket(OWNED_LIMIT, capacity=100, refill_per_second=100, backend="memory"))
    owned.register(ConcurrencyReservation(OWNED_SLOTS, slots=2, lease=30.0))
    return owned


async def _status(engine: AsyncEngine, job_id: Any) -> str | None:
    async with engine.connect() as conn:
        value = (await conn.execute(select(jobs.c.status).where(jobs.c.id == job_id))).scalar()
    return None if value is None else str(value)


# -- a registry supplied through DI --------------------------------------------------


async def test_a_di_registered_registry_is_the_workers_registry(
    engine: AsyncEngine, engine_url: str | URL
) -> None:
    """``named`` references names registered only on the DI-provided instance: its job
    runs (before, the worker ignored the provider and used the empty module default)."""
    di = ProviderRegistry()
    owned = _owned()
    di.register_value(RateLimitRegistry, Scope.LOOP, owned)
    handle = await JobsClient(SqlBackend(engine)).enqueue(named, Item())
    settings = worker_settings(engine_url)
    async with running_worker(settings, {named.name: named}, di_registry=di) as worker:
        assert worker.limits.registry is owned

        async def done() -> bool:
            return await _status(engine, handle.job_id) == "succeeded"

        await wait_until(done, timeout=30)


def _factory_provider(di: ProviderRegistry) -> None:
    di.register_factory(RateLimitRegistry, Scope.LOOP, _owned)


def _class_provider(di: ProviderRegistry) -> None:
    di.register_class(RateLimitRegistry, Scope.LOOP)


def _process_scope(di: ProviderRegistry) -> None:
    di.register_value(RateLimitRegistry, Scope.PROCESS, _owned())


def _transient_scope(di: ProviderRegistry) -> None:
    di.register_value(RateLimitRegistry, Scope.TRANSIENT, _owned())


@pytest.mark.parametrize(
    ("register", "message"),
    [
        (_factory_provider, "value provider"),
        (_class_provider, "value provider"),
        (_process_scope, "Scope.LOOP"),
        (_transient_scope, "Scope.LOOP"),
    ],
    ids=["factory", "class", "process-scope", "transient-scope"],
)
def test_other_di_providers_raise_type_error(
    sqlite_url: str, register: Callable[[ProviderRegistry], None], message: str
) -> None:
    di = ProviderRegistry()
    register(di)
    with pytest.raises(TypeError, match=message):
        Worker(
            settings=worker_settings(sqlite_url),
            actors={named.name: named},
            di_registry=di,
            hard_exit=False,
        )


def test_both_the_argument_and_a_di_provider_raise_type_error(sqlite_url: str) -> None:
    di = ProviderRegistry()
    di.register_value(RateLimitRegistry, Scope.LOOP, _owned())
    with pytest.raises(TypeError, match="not both"):
        Worker(
            settings=worker_settings(sqlite_url),
            actors={named.name: named},
            rate_limit_registry=_owned(),
            di_registry=di,
            hard_exit=False,
        )


# -- names referenced by actors are checked at boot -----------------------------------


async def test_an_unregistered_name_fails_the_boot_at_once(
    engine: AsyncEngine, engine_url: str | URL
) -> None:
    """A configuration error, not a connection failure: one attempt, no retry, and the
    boot stops before it writes a worker row. The message names the actor and names."""
    worker = Worker(
        settings=worker_settings(engine_url),
        actors={missing.name: missing},
        rate_limit_registry=RateLimitRegistry(),
        engine=engine,
        hard_exit=False,
    )
    with structlog.testing.capture_logs() as logs, pytest.raises(ConfigurationError) as raised:
        await worker.run()
    text = str(raised.value)
    assert "'wiring_missing'" in text
    assert "rate limit 'wiring.nowhere'" in text
    assert "reservation 'wiring.nada'" in text
    events = [e["event"] for e in logs]
    assert "worker-boot-retry" not in events
    assert "worker-boot-failed" in events
    async with engine.connect() as conn:
        assert (await conn.execute(select(func.count()).select_from(workers))).scalar() == 0


async def test_keyed_refs_are_not_checked_at_boot(
    engine: AsyncEngine, engine_url: str | URL
) -> None:
    """Keyed concrete names are registered on first use; their job runs."""
    handle = await JobsClient(SqlBackend(engine)).enqueue(keyed, Item(n=7))
    settings = worker_settings(engine_url)
    async with running_worker(
        settings, {keyed.name: keyed}, rate_limit_registry=RateLimitRegistry()
    ):

        async def done() -> bool:
            return await _status(engine, handle.job_id) == "succeeded"

        await wait_until(done, timeout=30)


# -- queue caps are registered reservations -------------------------------------------


async def test_a_queue_cap_is_registered_in_the_registry(
    engine: AsyncEngine, engine_url: str | URL
) -> None:
    async with engine.begin() as conn:
        await conn.execute(
            insert(engine.dialect.name, queues).values(name="wiring-capped", max_concurrent=3)
        )
    owned = _owned()
    handle = await JobsClient(SqlBackend(engine)).enqueue(named, Item(), queue="wiring-capped")
    settings = worker_settings(engine_url, queues=("wiring-capped",))
    cap_name = queue_concurrency_reservation_name("wiring-capped")
    async with running_worker(settings, {named.name: named}, rate_limit_registry=owned) as w:

        async def done() -> bool:
            return await _status(engine, handle.job_id) == "succeeded"

        await wait_until(done, timeout=30)
        cap = owned.get_reservation(cap_name)
        assert cap is w.limits.queue_caps["wiring-capped"]
        assert (cap.slots, cap.lease) == (3, settings.lock_lease)
        listed = await owned.reservations(pool=engine)
        assert set(listed) == {cap_name, OWNED_SLOTS}
        assert listed[cap_name] == []  # released after the job

    # The cap changes in the queues row; a later worker in this process replaces it.
    async with engine.begin() as conn:
        await conn.execute(
            update(queues).where(queues.c.name == "wiring-capped").values(max_concurrent=5)
        )
    async with running_worker(settings, {named.name: named}, rate_limit_registry=owned) as w2:

        async def booted() -> bool:
            return w2.limits.active

        await wait_until(booted, timeout=30)
    assert owned.get_reservation(cap_name).slots == 5


# -- a rate limit holds jobs back without spending attempts or retry budget ----------

SCARCE = TokenBucket("wiring.scarce", capacity=1, refill_per_second=10, backend="memory")


@actor(name="wiring_scarce", rate_limits=[SCARCE], retry=RetryPolicy(max_attempts=2))
async def scarce(payload: Item) -> None:
    return None


async def test_a_rate_limit_spends_no_attempts_and_no_retry_budget(
    engine: AsyncEngine, engine_url: str | URL
) -> None:
    """Six jobs at once through a one-token bucket, with slots for all six: the bucket
    holds five back, yet every job succeeds on its first attempt (``attempt`` 1, one
    attempt row, ``budget_used`` 0): waiting for a token is not an attempt."""
    client = JobsClient(SqlBackend(engine))
    handles = [await client.enqueue(scarce, Item(n=n)) for n in range(6)]
    ids = [h.job_id for h in handles]
    settings = worker_settings(engine_url, max_concurrency=6)

    async def done() -> bool:
        return all([await _status(engine, i) == "succeeded" for i in ids])

    async with running_worker(
        settings, {scarce.name: scarce}, rate_limit_registry=RateLimitRegistry()
    ):
        await wait_until(done, timeout=30)
    async with engine.connect() as conn:
        rows = (
            await conn.execute(select(jobs.c.attempt, jobs.c.budget_used).where(jobs.c.id.in_(ids)))
        ).all()
        outcomes = (
            await conn.execute(select(job_attempts.c.outcome).where(job_attempts.c.job_id.in_(ids)))
        ).scalars()
    assert sorted(rows) == [(1, 0)] * 6
    assert sorted(outcomes) == ["succeeded"] * 6
