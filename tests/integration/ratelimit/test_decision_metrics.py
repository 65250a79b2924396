"""``taskq.rate_limit.decisions{bucket,backend,allowed}``: one per acquire, on every backend,
a keyed bucket under its base name, the Postgres fallback under ``postgres``; async and
sync (see ``taskq.telemetry``)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import pytest
import redis.asyncio as aredis
from pydantic import BaseModel
from sqlalchemy.engine import URL

import taskq.ratelimit as arl
import taskq_sync.ratelimit as srl
from taskq.db.engine import make_engine
from taskq.exceptions import ReservationUnavailable
from taskq.settings import TaskQSettings
from taskq.testing.clock import FakeClock
from tests.support.otel import Otel, otel

pytestmark = pytest.mark.integration

METRIC = "taskq.rate_limit.decisions"


class Tenant(BaseModel):
    tenant: str


@pytest.fixture
def sdk() -> Otel:
    return otel()


def _points(sdk: Otel, bucket: str) -> dict[tuple[Any, ...], int]:
    return sdk.points(METRIC, bucket=bucket)


def _key(backend: str, allowed: bool) -> tuple[Any, ...]:
    return (("allowed", allowed), ("backend", backend))


async def test_each_acquire_is_counted_by_backend_and_outcome(
    sdk: Otel, unique_name: str, redis_url: str, settings: TaskQSettings
) -> None:
    clock = FakeClock(datetime(2025, 1, 1, tzinfo=UTC))
    memory = arl.TokenBucket(unique_name, capacity=3, refill_per_second=0, backend="memory")
    allowed = [(await memory.acquire(clock=clock)).allowed for _ in range(4)]
    assert allowed == [True, True, True, False]
    assert _points(sdk, unique_name) == {_key("memory", True): 3, _key("memory", False): 1}

    client = aredis.Redis.from_url(redis_url)
    gcra = arl.SlidingWindow(f"{unique_name}_g", limit=1, window=timedelta(minutes=1), style="gcra")
    try:
        kw: dict[str, Any] = {"redis_client": client, "settings": settings}
        assert [(await gcra.acquire(**kw)).allowed for _ in range(3)] == [True, False, False]
        # peeks and refunds are not decisions
        await gcra.peek(**kw)
    finally:
        await client.aclose()
    assert _points(sdk, f"{unique_name}_g") == {_key("redis", True): 1, _key("redis", False): 2}


async def test_the_postgres_fallback_counts_under_postgres(
    sdk: Otel, unique_name: str, pg_url: URL, settings: TaskQSettings
) -> None:
    engine = make_engine(pg_url, settings=settings)
    down = aredis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.5)
    tb = arl.TokenBucket(unique_name, capacity=5, refill_per_second=0)
    try:
        decision = await tb.acquire(redis_client=down, pg_pool=engine, settings=settings)
    finally:
        await down.aclose()
        await engine.dispose()
    assert decision.backend == "postgres"
    assert _points(sdk, unique_name) == {_key("postgres", True): 1}


async def test_a_keyed_bucket_counts_under_its_base_name(sdk: Otel, unique_name: str) -> None:
    clock = FakeClock(datetime(2025, 1, 1, tzinfo=UTC))
    reg = arl.RateLimitRegistry()
    ref = arl.KeyedRateLimitRef.typed(
        Tenant,
        base_name=unique_name,
        key_fn=lambda p: p.tenant,
        capacity=1,
        refill_per_second=0,
        backend="memory",
    )
    actor = SimpleNamespace(name="a", rate_limits=[ref], reservations=[])
    for tenant in ("t1", "t2", "t3"):
        await reg.acquire_for_actor(
            actor, {"tenant": tenant}, job_id=None, worker_id=uuid.uuid4(), clock=clock
        )
    with pytest.raises(ReservationUnavailable):
        await reg.acquire_for_actor(
            actor, {"tenant": "t1"}, job_id=None, worker_id=uuid.uuid4(), clock=clock
        )
    assert _points(sdk, unique_name) == {_key("memory", True): 3, _key("memory", False): 1}
    assert _points(sdk, f"{unique_name}:t1") == {}


def test_sync_acquires_are_counted(sdk: Otel, unique_name: str) -> None:
    clock = FakeClock(datetime(2025, 1, 1, tzinfo=UTC))
    tb = srl.TokenBucket(unique_name, capacity=2, refill_per_second=0, backend="memory")
    log = srl.SlidingWindow(
        f"{unique_name}_l", limit=1, window=timedelta(minutes=1), backend="memory"
    )
    assert [tb.acquire(clock=clock).allowed for _ in range(3)] == [True, True, False]
    assert [log.acquire(clock=clock).allowed for _ in range(2)] == [True, False]
    assert _points(sdk, unique_name) == {_key("memory", True): 2, _key("memory", False): 1}
    assert _points(sdk, f"{unique_name}_l") == {_key("memory", True): 1, _key("memory", False): 1}
