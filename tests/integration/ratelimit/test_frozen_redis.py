"""A frozen Redis (SIGSTOP: connections open, no replies) costs one timeout, not one per
acquire: the circuit sends the calls straight to the Postgres fallback, one probe goes to
Redis after the cool-down, and its answer closes the circuit at once.

The Redis is a private server on a free port: freezing the shared one would stall every
other test run on the machine.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Iterator
from typing import Any

import pytest
import redis.asyncio as aredis
from sqlalchemy.ext.asyncio import AsyncEngine

from taskq.ratelimit import TokenBucket
from taskq.ratelimit.circuit import RedisCircuit, register_circuit
from taskq.settings import TaskQSettings
from tests.support import servers


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def private_redis() -> Iterator[servers.Server]:
    server = servers.private_server("redis")
    try:
        yield server
    finally:
        if server.pid is not None:
            os.kill(server.pid, signal.SIGCONT)
        servers.stop(server)


async def test_a_frozen_redis_sends_acquires_to_the_fallback_until_a_probe_answers(
    engine: AsyncEngine,
    private_redis: servers.Server,
    unique_name: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    client = aredis.Redis.from_url(private_redis.url, socket_timeout=30)
    clock = Clock()
    circuit = RedisCircuit(timeout_s=0.3, cooldown_s=1.0, log_interval_s=60.0, clock=clock)
    register_circuit(client, circuit)
    settings = TaskQSettings.load(rate_limit_pg_fallback_enabled=True)
    bucket = TokenBucket(unique_name, capacity=1000, refill_per_second=0)
    kw: dict[str, Any] = {"redis_client": client, "pg_pool": engine, "settings": settings}
    try:
        assert (await bucket.acquire(**kw)).backend == "redis"
        assert private_redis.pid is not None
        os.kill(private_redis.pid, signal.SIGSTOP)
        with caplog.at_level(logging.WARNING, logger="taskq.ratelimit"):
            frozen = [await bucket.acquire(**kw) for _ in range(40)]
            assert {d.backend for d in frozen} == {"postgres"}
            assert all(d.allowed for d in frozen)
            # Only the first call waited for Redis (its timeout, not the client's 30 s).
            assert circuit.log.totals == {"failures": 1, "fallbacks": 40}
            clock.now += 1.0  # the cool-down passes: the next call probes, and times out
            assert (await bucket.acquire(**kw)).backend == "postgres"
            assert circuit.log.totals["failures"] == 2
            os.kill(private_redis.pid, signal.SIGCONT)
            assert (await bucket.acquire(**kw)).backend == "postgres"  # still cooling down
            clock.now += 1.0
            assert (await bucket.acquire(**kw)).backend == "redis"  # the probe answered
            assert not circuit.is_open
            assert (await bucket.acquire(**kw)).backend == "redis"
        events = [getattr(r, "event", None) for r in caplog.records]
        assert events == ["ratelimit.redis_down", "ratelimit.redis_back"]
    finally:
        await client.aclose()
