"""What the page says is only logged: a SQL-store refund without the store to reach, and
a keyed bucket whose config could not be published. Neither may fail the caller (the
SQL-store refund itself gives the request back)."""

from __future__ import annotations

import logging
import uuid
from datetime import timedelta

import pytest
from pydantic import BaseModel
from redis import asyncio as aredis

from taskq.db.engine import make_engine
from taskq.ratelimit import KeyedRateLimitRef, RateLimitHandle, RateLimitRegistry
from taskq.settings import TaskQSettings
from tests.integration.ratelimit.conftest import Env, call

pytestmark = pytest.mark.integration


@pytest.fixture(params=["postgres", "sqlite"])
def store(request: pytest.FixtureRequest) -> str:
    """Only the SQL stores."""
    return str(request.param)


async def test_sql_log_window_refund_gives_the_request_back(
    env: Env, unique_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    """On Postgres/SQLite a log-style refund deletes the request's window entry: the
    window admits one more, and nothing is logged."""
    assert env.backend == "postgres"  # the SQL backend, on either store
    sw = env.rl.SlidingWindow(
        unique_name, limit=2, window=timedelta(seconds=30), style="log", backend=env.backend
    )
    await call(sw.acquire(**env.kw))
    second = await call(sw.acquire(**env.kw))
    assert second.allowed
    assert not (await call(sw.acquire(**env.kw))).allowed
    with caplog.at_level(logging.WARNING, logger="taskq.ratelimit"):
        await call(sw.refund(second, **env.kw))
    assert not any("refund_noop" in r.getMessage() for r in caplog.records)
    assert (await call(sw.acquire(**env.kw))).allowed  # the refunded request's room
    assert not (await call(sw.acquire(**env.kw))).allowed


async def test_a_sql_refund_without_pg_pool_logs_a_warning(
    env: Env, unique_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A decision of the SQL backend refunded without ``pg_pool`` cannot reach its store:
    nothing is given back, and it says so at WARNING (never raises)."""
    tb = env.rl.TokenBucket(unique_name, capacity=1, refill_per_second=0, backend=env.backend)
    taken = await call(tb.acquire(**env.kw))
    assert taken.allowed
    without_pool = {k: v for k, v in env.kw.items() if k != "pg_pool"}
    with caplog.at_level(logging.WARNING, logger="taskq.ratelimit"):
        await call(tb.refund(taken, **without_pool))
    warnings = [
        r for r in caplog.records if r.name == "taskq.ratelimit" and r.levelno == logging.WARNING
    ]
    assert any("refund_noop" in r.getMessage() and unique_name in r.getMessage() for r in warnings)
    assert not (await call(tb.acquire(**env.kw))).allowed  # nothing was given back


class Tenant(BaseModel):
    tenant: str


async def test_keyed_publish_failure_only_warns(
    redis_url: str,
    unique_name: str,
    settings: TaskQSettings,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A keyed Redis bucket's first use publishes its config to SQL; with that store
    refusing connections the acquisition (on Redis) still succeeds and a warning names it."""
    ref = KeyedRateLimitRef(
        payload_type=Tenant,
        base_name=unique_name,
        key_fn=lambda p: p.tenant,
        capacity=5,
        refill_per_second=1,
        backend="redis",
    )

    class KeyedActor:
        name = f"{unique_name}_actor"
        rate_limits = [ref]
        reservations: list[object] = []

    registry = RateLimitRegistry()
    client = aredis.Redis.from_url(redis_url)
    unreachable = make_engine("postgresql://postgres@127.0.0.1:1/nowhere", settings=settings)
    try:
        with caplog.at_level(logging.WARNING, logger="taskq.ratelimit"):
            acquired = await registry.acquire_for_actor(
                KeyedActor(),
                {"tenant": "acme"},
                job_id=None,
                worker_id=uuid.uuid4(),
                redis_client=client,
                pg_pool=unreachable,
                settings=settings,
            )
        assert [h.name for h in acquired] == [f"{unique_name}:acme"]
        (handle,) = acquired
        assert isinstance(handle, RateLimitHandle)
        assert handle.decision.allowed
        failed = [r for r in caplog.records if "keyed_publish_failed" in r.getMessage()]
        assert len(failed) == 1
        assert f"{unique_name}:acme" in failed[0].getMessage()
        assert failed[0].levelno == logging.WARNING
    finally:
        bucket = registry.rate_limits().get(f"{unique_name}:acme")
        if bucket is not None:
            await client.delete(bucket.redis_key)
        await client.aclose()
        await unreachable.dispose()
