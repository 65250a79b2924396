"""The Redis hot path writes its command without what redis-py's ``socket_timeout`` costs
each write (``_redis_utils._send``).

redis-py (8: ``socket_timeout=5`` by default) runs every asyncio write under
``asyncio.wait_for`` (a task and one more turn of the event loop per command), and a
blocking socket with a timeout polls before every ``send`` (one more system call). An
acquire writes its pre-encoded ``EVALSHA`` straight to the held connection's stream
(asyncio) or socket descriptor (blocking) instead; ``socket_timeout`` still bounds a round
trip whose command cannot go out, a write the socket takes only in part is finished by
redis-py, a write error drops the connection and the acquire runs on a new one, and a
connection with health checks keeps redis-py's own write.
"""

from __future__ import annotations

import asyncio
import errno
import os
import socket
import time
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any, TypeVar

import pytest
import redis
import redis.asyncio as aredis
from redis.asyncio.connection import Connection

import taskq.ratelimit as arl
import taskq_sync.ratelimit as srl
import taskq_sync.ratelimit._redis_utils as srru
from taskq.ratelimit import _redis_utils as rru
from taskq.settings import TaskQSettings

pytestmark = pytest.mark.integration

T = TypeVar("T")


def _primitives(rl: Any, name: str) -> tuple[Any, Any, Any]:
    """A token bucket of 100 and GCRA and log windows of 3 a minute, from ``rl``
    (``taskq.ratelimit`` or ``taskq_sync.ratelimit``)."""
    return (
        rl.TokenBucket(name, capacity=100, refill_per_second=0),
        rl.SlidingWindow(f"{name}_g", limit=3, window=timedelta(minutes=1), style="gcra"),
        rl.SlidingWindow(f"{name}_l", limit=3, window=timedelta(minutes=1)),
    )


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
    tb, gcra, log = _primitives(arl, unique_name)
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


@pytest.fixture
def sendall_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The size of every ``socket.sendall`` made while the test runs (redis-py's writes)."""
    calls: list[int] = []
    real = socket.socket.sendall

    def spy(self: socket.socket, data: Any, flags: int = 0) -> None:
        calls.append(len(data))
        real(self, data, flags)

    monkeypatch.setattr(socket.socket, "sendall", spy)
    return calls


def test_blocking_acquires_write_to_the_socket_descriptor(
    redis_url: str, unique_name: str, settings: TaskQSettings, sendall_calls: list[int]
) -> None:
    client = redis.Redis.from_url(redis_url, socket_timeout=5)
    kw: dict[str, Any] = {"redis_client": client, "settings": settings}
    tb, gcra, log = _primitives(srl, unique_name)
    try:
        client.ping()
        sendall_calls.clear()
        client.ping()  # redis-py's own command: sendall (the spy sees it)
        assert len(sendall_calls) == 1
        sendall_calls.clear()
        assert [tb.acquire(**kw).remaining for _ in range(50)] == list(range(99, 49, -1))
        assert [gcra.acquire(**kw).allowed for _ in range(4)] == [True] * 3 + [False]
        assert [log.acquire(**kw).allowed for _ in range(4)] == [True] * 3 + [False]
        assert tb.peek(**kw).remaining == 50
        assert sendall_calls == []
    finally:
        client.close()


def test_a_write_the_socket_takes_in_part_is_finished_by_redis_py(
    redis_url: str,
    unique_name: str,
    settings: TaskQSettings,
    monkeypatch: pytest.MonkeyPatch,
    sendall_calls: list[int],
) -> None:
    client = redis.Redis.from_url(redis_url, socket_timeout=5)
    kw: dict[str, Any] = {"redis_client": client, "settings": settings}
    tb = srl.TokenBucket(unique_name, capacity=10, refill_per_second=0)
    taken: list[int] = []

    def part(fd: int, data: bytes) -> int:  # the socket's buffer has room for 7 bytes
        taken.append(os.write(fd, data[:7]))
        return 7

    def full(fd: int, data: bytes) -> int:
        raise BlockingIOError(errno.EAGAIN, "Resource temporarily unavailable")

    try:
        assert tb.acquire(**kw).remaining == 9  # connects, loads the script
        sendall_calls.clear()
        monkeypatch.setattr(srru, "_write", part)
        assert tb.acquire(**kw).remaining == 8
        monkeypatch.setattr(srru, "_write", full)
        assert tb.acquire(**kw).remaining == 7
        command_size = taken[0] + sendall_calls[0]
        assert taken == [7]
        assert sendall_calls == [command_size - 7, command_size]  # the rest, then all
    finally:
        client.close()


def test_a_write_error_drops_the_connection_and_the_acquire_runs_on_a_new_one(
    redis_url: str, unique_name: str, settings: TaskQSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = redis.Redis.from_url(redis_url, socket_timeout=5)
    kw: dict[str, Any] = {"redis_client": client, "settings": settings}
    tb = srl.TokenBucket(unique_name, capacity=10, refill_per_second=0)
    broken: list[socket.socket] = []

    def reset(fd: int, data: bytes) -> int:
        monkeypatch.undo()  # once
        raise ConnectionResetError(errno.ECONNRESET, "Connection reset by peer")

    try:
        assert tb.acquire(**kw).remaining == 9
        [held] = getattr(client.connection_pool, srru._HELD_ATTRIBUTE)
        broken.append(held._sock)
        monkeypatch.setattr(srru, "_write", reset)
        assert tb.acquire(**kw).remaining == 8  # taken once, on a new connection
        assert broken[0].fileno() == -1  # the connection that failed was closed
        assert tb.acquire(**kw).remaining == 7
    finally:
        client.close()
