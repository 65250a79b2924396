"""Redis unreachable: Postgres takes over with one WARNING, unless the flag says not to."""

from __future__ import annotations

import logging
import socket
from datetime import timedelta
from typing import Any

import pytest
import redis
import redis.asyncio as aredis
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError

from taskq.settings import TaskQSettings
from tests.integration.ratelimit.conftest import Env, call

pytestmark = pytest.mark.integration


@pytest.fixture
def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(params=["postgres", "sqlite"])
def slot_store(request: pytest.FixtureRequest) -> str:
    """The fallback store: the SQL backend on each engine."""
    return str(request.param)


@pytest.fixture
def dead_redis(slot_env: Env, closed_port: int) -> Any:
    """A client for a port nobody listens on (no retries: fail fast)."""
    kw: dict[str, Any] = {"port": closed_port, "retry": redis.retry.Retry(NoBackoff(), 0)}
    return aredis.Redis(**kw) if slot_env.flavour == "async" else redis.Redis(**kw)


@pytest.mark.parametrize("style", ["token_bucket", "log", "gcra"])
async def test_postgres_takes_over_with_a_warning(
    slot_env: Env, dead_redis: Any, unique_name: str, style: str, caplog: pytest.LogCaptureFixture
) -> None:
    env = slot_env
    if style == "token_bucket":
        prim = env.rl.TokenBucket(unique_name, capacity=3, refill_per_second=0)
    else:
        prim = env.rl.SlidingWindow(unique_name, limit=3, window=timedelta(minutes=1), style=style)
    assert prim.backend == "redis"  # the default
    settings = TaskQSettings.load(rate_limit_pg_fallback_enabled=True)
    kw = {"redis_client": dead_redis, "pg_pool": env.engine, "settings": settings}
    with caplog.at_level(logging.WARNING, logger="taskq.ratelimit"):
        decisions = [await call(prim.acquire(**kw)) for _ in range(4)]
    assert [d.allowed for d in decisions] == [True, True, True, False]
    assert {d.backend for d in decisions} == {"postgres"}
    # One warning for the outage (the circuit opened), not one per fallen-back call.
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert getattr(warnings[0], "event", None) == "ratelimit.redis_down"
    assert getattr(warnings[0], "backend", None) == "redis"
    assert getattr(warnings[0], "fallback", None) == "postgres"
    state = await call(prim.peek(**kw))
    assert state.backend == "postgres"
    assert state.is_exhausted
    await call(prim.reset(**kw))
    assert not (await call(prim.peek(**kw))).is_exhausted


async def test_flag_false_lets_the_redis_error_propagate(
    slot_env: Env, dead_redis: Any, unique_name: str
) -> None:
    env = slot_env
    tb = env.rl.TokenBucket(unique_name, capacity=3, refill_per_second=0)
    off = TaskQSettings.load(rate_limit_pg_fallback_enabled=False)
    with pytest.raises(RedisConnectionError):
        await call(tb.acquire(redis_client=dead_redis, pg_pool=env.engine, settings=off))
    on = TaskQSettings.load(rate_limit_pg_fallback_enabled=True)
    with pytest.raises(RedisConnectionError):  # no pg_pool to fall back to
        await call(tb.acquire(redis_client=dead_redis, settings=on))
