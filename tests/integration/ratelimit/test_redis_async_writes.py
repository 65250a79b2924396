"""The asyncio Redis hot path writes its command without ``asyncio.wait_for`` (``_send``).

redis-py runs every asyncio write under ``asyncio.wait_for`` when the connection has a
``socket_timeout`` (its default since redis-py 8): a task and one more turn of the event
loop per command. An acquire writes its pre-encoded ``EVALSHA`` straight to the held
connection's stream instead; ``socket_timeout`` still bounds a round trip whose command
cannot go out, and a connection with health checks keeps redis-py's own path.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any, TypeVar

import pytest
import redis.asyncio as aredis
from redis.asyncio.connection import Connection

import taskq.ratelimit as arl
from taskq.ratelimit import _redis_utils as rru
from taskq.settings import TaskQSettings

pytestmark = pytest.mark.integration

T = TypeVar("T")


@pytest.fixture
def wait_for_calls(monkeypatch: pytest.MonkeyPatch) -> list[float | None]:
    """Every ``asyncio.wait_for`` call made while the test runs (its timeout), redis-py's
    included: it looks the function up on the ``asyncio`` module each time."""
    calls: list[float | None] = []
    real = asyncio.wait_for

    async def spy(aw: Awaitable[T], timeout: float | None) -> T:  # noqa: ASYNC109
        calls.append(timeout)
        return await real(aw, timeout)

    monkeypatch.setattr(asyncio, "wait_for", spy)
    return calls


async def test_async_acquires_write_without_a_task_per_command(
    redis_url: str, unique_name: str, settings: TaskQSettings, wait_for_calls: list[float | None]
) -> None:
    client = aredis.Redis.from_url(redis_url, socket_timeout=5)
    kw: dict[str, Any] = {"redis_client": client, "settings": settings}
    tb = arl.TokenBucket(unique_name, capacity=100, refill_per_second=0)
    gcra = arl.SlidingWindow(f"{unique_name}_g", limit=3, window=timedelta(minutes=1), style="gcra")
    log = arl.SlidingWindow(f"{unique_name}_l", limit=3, window=timedelta(minutes=1))
    try:
        await client.ping()  # connects (its handshake's writes are under wait_for too)
        wait_for_calls.clear()
        await client.ping()  # redis-py's own command: under wait_for (the spy sees it)
        assert wait_for_calls == [5]
        wait_for_calls.clear()
        assert [(await tb.acquire(**kw)).remaining for _ in range(50)] == list(range(99, 49, -1))
        assert [(await gcra.acquire(**kw)).allowed for _ in range(4)] == [True] * 3 + [False]
        assert [(await log.acquire(**kw)).allowed for _ in range(4)] == [True] * 3 + [False]
        assert (await tb.peek(**kw)).remaining == 50
        assert wait_for_calls == []
        # closing the client closes the held connection; the next acquire reconnects
        await client.aclose()
        assert (await tb.acquire(**kw)).remaining == 49
    finally:
        await client.aclose()


async def test_a_command_that_cannot_go_out_times_out_and_the_acquire_runs_on_a_new_connection(
    redis_url: str, unique_name: str, settings: TaskQSettings
) -> None:
    client = aredis.Redis.from_url(redis_url, socket_timeout=0.3)
    kw: dict[str, Any] = {"redis_client": client, "settings": settings}
    tb = arl.TokenBucket(unique_name, capacity=10, refill_per_second=0)
    try:
        assert (await tb.acquire(**kw)).remaining == 9
        held = getattr(client.connection_pool, rru._HELD_ATTRIBUTE)
        [stuck] = held
        writer = stuck._writer
        writer.write = lambda data: None  # the socket takes nothing: the command never leaves

        started = time.monotonic()
        decision = await tb.acquire(**kw)
        assert time.monotonic() - started >= 0.3  # the reply was awaited socket_timeout
        assert decision.allowed
        assert decision.remaining == 8  # taken once, on a new connection
        # the stuck stream was closed, never written to again
        assert writer.transport.is_closing()
        assert stuck._writer is not writer
        assert (await tb.acquire(**kw)).remaining == 7
    finally:
        await client.aclose()


async def test_a_connection_with_health_checks_keeps_redis_pys_write(
    redis_url: str,
    unique_name: str,
    settings: TaskQSettings,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    checks: list[Connection] = []
    real: Callable[[Connection], Awaitable[None]] = Connection.check_health

    async def counted(self: Connection) -> None:
        checks.append(self)
        await real(self)

    monkeypatch.setattr(Connection, "check_health", counted)
    client = aredis.Redis.from_url(redis_url, health_check_interval=30)
    kw: dict[str, Any] = {"redis_client": client, "settings": settings}
    tb = arl.TokenBucket(unique_name, capacity=100, refill_per_second=0)
    try:
        assert [(await tb.acquire(**kw)).remaining for _ in range(20)] == list(range(99, 79, -1))
        assert len(checks) >= 20  # one health check per command, as redis-py does it
    finally:
        await client.aclose()
