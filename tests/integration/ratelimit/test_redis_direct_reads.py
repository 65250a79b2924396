"""An acquire reads its reply straight from the socket or stream (``_redis_utils._receive``),
against a real Redis server, blocking and asyncio: never through redis-py's reader, on
RESP2 and RESP3 and with ``decode_responses`` either way, to the decisions redis-py's
reader gives; ``NOSCRIPT`` keeps the connection; a push message before the reply goes to
redis-py's push handler; a connection the server closed, or a reply that came too late,
is dropped and never read from again, so no later acquire reads an earlier command's
reply. Connections that keep redis-py's reader (health checks, a socket of another type)
still do.
"""

from __future__ import annotations

import asyncio
import hashlib
import select
import socket
import time
from dataclasses import dataclass
from datetime import timedelta
from types import ModuleType
from typing import Any

import pytest
import redis
import redis.asyncio as aredis
from redis._parsers.resp2 import _AsyncRESP2Parser, _RESP2Parser
from redis._parsers.resp3 import _AsyncRESP3Parser, _RESP3Parser
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry

import taskq.ratelimit as arl
import taskq_sync.ratelimit as srl
import taskq_sync.ratelimit._redis_utils as srru
from taskq.ratelimit._lua import TOKEN_BUCKET
from tests.integration.ratelimit.conftest import call

pytestmark = pytest.mark.integration


@dataclass(frozen=True)
class Flavour:
    """The blocking or the asyncio side: its API, redis-py client and reply readers."""

    name: str
    rl: ModuleType
    client_class: Any
    readers: dict[int, Any]
    retry: Any

    def client(self, redis_url: str, **options: Any) -> Any:
        return self.client_class.from_url(redis_url, **options)

    async def close(self, client: Any) -> None:
        await call(client.close() if self.name == "sync" else client.aclose())


SYNC = Flavour("sync", srl, redis.Redis, {2: _RESP2Parser, 3: _RESP3Parser}, Retry)
ASYNC = Flavour(
    "async", arl, aredis.Redis, {2: _AsyncRESP2Parser, 3: _AsyncRESP3Parser}, AsyncRetry
)


@pytest.fixture(params=[SYNC, ASYNC], ids=["sync", "async"])
def flavour(request: pytest.FixtureRequest) -> Flavour:
    flavour: Flavour = request.param
    return flavour


@pytest.fixture
def reader_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every reply redis-py's own readers (blocking and asyncio) read while the test runs."""
    calls: list[str] = []
    for reader in (_RESP2Parser, _RESP3Parser):
        real = reader.read_response

        def spy(self: Any, *args: Any, _real: Any = real, **kwargs: Any) -> Any:
            calls.append(type(self).__name__)
            return _real(self, *args, **kwargs)

        monkeypatch.setattr(reader, "read_response", spy)
    for areader in (_AsyncRESP2Parser, _AsyncRESP3Parser):
        areal = areader.read_response

        async def aspy(self: Any, *args: Any, _real: Any = areal, **kwargs: Any) -> Any:
            calls.append(type(self).__name__)
            return await _real(self, *args, **kwargs)

        monkeypatch.setattr(areader, "read_response", aspy)
    return calls


def _held(client: Any) -> Any:
    [conn] = getattr(client.connection_pool, srru._HELD_ATTRIBUTE)
    return conn


def _io(conn: Any) -> Any:
    """What a connection reads from: its socket (blocking) or stream (asyncio)."""
    return conn._sock if isinstance(conn, redis.Connection) else conn._reader


def _peek_elsewhere(redis_url: str, name: str, capacity: int) -> float:
    """The tokens of the bucket ``name`` as another (blocking) client sees them."""
    other = redis.Redis.from_url(redis_url)
    try:
        tb = srl.TokenBucket(name, capacity=capacity, refill_per_second=0)
        return tb.peek(redis_client=other).remaining
    finally:
        other.close()


@pytest.mark.parametrize("protocol", [2, 3])
@pytest.mark.parametrize("decode", [False, True], ids=["bytes", "decoded"])
async def test_acquires_read_their_replies_without_redis_pys_reader(
    redis_url: str,
    unique_name: str,
    reader_calls: list[str],
    flavour: Flavour,
    protocol: int,
    decode: bool,
) -> None:
    client = flavour.client(redis_url, protocol=protocol, decode_responses=decode, socket_timeout=5)
    kw: dict[str, Any] = {"redis_client": client}
    rl = flavour.rl
    tb = rl.TokenBucket(unique_name, capacity=100, refill_per_second=0)
    gcra = rl.SlidingWindow(f"{unique_name}_g", limit=3, window=timedelta(minutes=1), style="gcra")
    log = rl.SlidingWindow(f"{unique_name}_l", limit=3, window=timedelta(minutes=1))
    try:
        assert (await call(tb.acquire(**kw))).remaining == 99  # connects; loads missing scripts
        assert (await call(gcra.acquire(**kw))).allowed
        assert (await call(log.acquire(**kw))).allowed
        held = _held(client)
        assert held._parser.__class__ is flavour.readers[protocol]
        await call(client.ping())  # a second connection (the first is held), its handshake
        reader_calls.clear()
        await call(client.ping())  # redis-py's own command: its reader (the spy sees it)
        assert len(reader_calls) == 1
        reader_calls.clear()
        assert [(await call(tb.acquire(**kw))).remaining for _ in range(50)] == list(
            range(98, 48, -1)
        )
        assert [(await call(gcra.acquire(**kw))).allowed for _ in range(3)] == [True] * 2 + [False]
        assert [(await call(log.acquire(**kw))).allowed for _ in range(3)] == [True] * 2 + [False]
        denied = await call(log.acquire(**kw))
        assert denied.retry_after is not None
        assert timedelta(seconds=59) < denied.retry_after <= timedelta(minutes=1)
        assert (await call(tb.peek(**kw))).remaining == 49
        assert reader_calls == []  # not one acquire's reply went through redis-py's reader
        assert _held(client) is held
    finally:
        await flavour.close(client)


async def test_noscript_is_answered_on_the_same_connection(
    redis_url: str,
    unique_name: str,
    reader_calls: list[str],
    flavour: Flavour,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    client = flavour.client(redis_url, socket_timeout=5)
    kw: dict[str, Any] = {"redis_client": client}
    tb = flavour.rl.TokenBucket(unique_name, capacity=10, refill_per_second=0)
    try:
        assert (await call(tb.acquire(**kw))).remaining == 9
        held = _held(client)
        before = _io(held)
        # a SHA the server never saw, as after a SCRIPT FLUSH (the server's cache is shared
        # with the tests running beside this one, so it is not flushed): NOSCRIPT
        unknown = hashlib.sha1(unique_name.encode()).hexdigest().encode()
        monkeypatch.setattr(TOKEN_BUCKET, "sha", unknown)
        assert (await call(tb.acquire(**kw))).remaining == 8  # loaded again and run once
        assert _held(client) is held
        assert _io(held) is before  # the error reply left the connection usable
        assert TOKEN_BUCKET.sha == hashlib.sha1(TOKEN_BUCKET.source).hexdigest().encode()
        reader_calls.clear()
        assert (await call(tb.acquire(**kw))).remaining == 7
        assert reader_calls == []
    finally:
        await flavour.close(client)


async def test_a_push_message_before_the_reply_goes_to_redis_pys_push_handler(
    redis_url: str, unique_name: str, flavour: Flavour, monkeypatch: pytest.MonkeyPatch
) -> None:
    pushes: list[list[Any]] = []
    reader = flavour.readers[3]
    real: Any = reader.handle_push_response

    def spy(self: Any, response: list[Any], **kwargs: Any) -> Any:
        pushes.append(response)
        return real(self, response, **kwargs)  # a coroutine for the asyncio reader

    monkeypatch.setattr(reader, "handle_push_response", spy)
    client = flavour.client(redis_url, protocol=3, socket_timeout=5)
    other = redis.Redis.from_url(redis_url)
    kw: dict[str, Any] = {"redis_client": client}
    tb = flavour.rl.TokenBucket(unique_name, capacity=10, refill_per_second=0)
    channel = f"{unique_name}_news".encode()
    try:
        assert (await call(tb.acquire(**kw))).remaining == 9
        held = _held(client)
        await call(held.send_command("SUBSCRIBE", channel))  # RESP3: still takes commands
        confirmed = await call(held.read_response(push_request=True))
        assert confirmed == [b"subscribe", channel, 1]
        pushes.clear()
        assert other.publish(channel, b"hello") == 1
        if flavour is SYNC:
            readable, _, _ = select.select([held._sock], [], [], 5)
            assert readable  # the message waits on the socket ahead of the acquire's reply
        else:
            for _ in range(500):  # until the stream holds the message
                if held._reader._buffer:
                    break
                await asyncio.sleep(0.01)
            assert held._reader._buffer
        assert (await call(tb.acquire(**kw))).remaining == 8
        assert pushes == [[b"message", channel, b"hello"]]
        assert _held(client) is held
        assert (await call(tb.acquire(**kw))).remaining == 7
    finally:
        await flavour.close(client)
        other.close()


async def test_a_connection_the_server_closed_is_dropped_and_the_acquire_runs_on_a_new_one(
    redis_url: str, unique_name: str, flavour: Flavour
) -> None:
    client = flavour.client(redis_url, socket_timeout=5)
    admin = redis.Redis.from_url(redis_url)
    kw: dict[str, Any] = {"redis_client": client}
    tb = flavour.rl.TokenBucket(unique_name, capacity=10, refill_per_second=0)
    try:
        assert (await call(tb.acquire(**kw))).remaining == 9
        held = _held(client)
        before = _io(held)
        if flavour is SYNC:
            host, port = held._sock.getsockname()[:2]
        else:
            host, port = held._writer.get_extra_info("sockname")[:2]
        assert admin.client_kill(f"{host}:{port}")  # the server knows the connection so
        assert (await call(tb.acquire(**kw))).remaining == 8  # taken once, on a new one
        assert _io(held) is not before  # the closed connection was dropped
        assert [(await call(tb.acquire(**kw))).remaining for _ in range(3)] == [7, 6, 5]
        assert _peek_elsewhere(redis_url, unique_name, 10) == 5
    finally:
        await flavour.close(client)
        admin.close()


async def test_a_reply_that_comes_too_late_is_never_read_by_a_later_acquire(
    redis_url: str, unique_name: str, flavour: Flavour
) -> None:
    client = flavour.client(redis_url, socket_timeout=0.2, retry=flavour.retry(NoBackoff(), 0))
    admin = redis.Redis.from_url(redis_url)
    kw: dict[str, Any] = {"redis_client": client}
    tb = flavour.rl.TokenBucket(unique_name, capacity=100, refill_per_second=0)
    try:
        assert (await call(tb.acquire(**kw))).remaining == 99
        held = _held(client)
        before = _io(held)
        admin.client_pause(1000, all=False)  # EVALSHA waits
        started = time.monotonic()
        with pytest.raises(RedisTimeoutError):
            await call(tb.acquire(**kw))  # times out on the held connection, then on the retry
        assert time.monotonic() - started < 0.9
        admin.client_unpause()
        assert _io(held) is not before  # the connection whose reply is late was dropped
        if flavour is SYNC:
            assert before.fileno() == -1
        for _ in range(5):  # each answer is its own command's, not a late one's
            decision = await call(tb.acquire(**kw))
            assert decision.remaining == _peek_elsewhere(redis_url, unique_name, 100)
    finally:
        admin.client_unpause()
        await flavour.close(client)
        admin.close()


async def test_a_connection_with_health_checks_keeps_redis_pys_reader(
    redis_url: str, unique_name: str, reader_calls: list[str], flavour: Flavour
) -> None:
    client = flavour.client(redis_url, health_check_interval=30, socket_timeout=5)
    kw: dict[str, Any] = {"redis_client": client}
    tb = flavour.rl.TokenBucket(unique_name, capacity=100, refill_per_second=0)
    try:
        assert (await call(tb.acquire(**kw))).remaining == 99
        reader_calls.clear()
        taken = [(await call(tb.acquire(**kw))).remaining for _ in range(5)]
        assert taken == [98, 97, 96, 95, 94]
        assert len(reader_calls) >= 5
    finally:
        await flavour.close(client)


def test_a_socket_that_is_not_a_plain_socket_keeps_redis_pys_reader(
    redis_url: str, unique_name: str, reader_calls: list[str]
) -> None:
    class Wrapped(socket.socket):
        """Stands in for a socket of another type (a TLS one): read through redis-py."""

    client = redis.Redis.from_url(redis_url, socket_timeout=5)
    kw: dict[str, Any] = {"redis_client": client}
    tb = srl.TokenBucket(unique_name, capacity=100, refill_per_second=0)
    try:
        assert tb.acquire(**kw).remaining == 99
        held = _held(client)
        wrapped = Wrapped(fileno=held._sock.detach())
        wrapped.settimeout(5)
        held._sock = wrapped
        held._parser._sock = wrapped
        held._parser._buffer._sock = wrapped
        reader_calls.clear()
        assert [tb.acquire(**kw).remaining for _ in range(3)] == [98, 97, 96]
        assert len(reader_calls) == 3
    finally:
        client.close()
