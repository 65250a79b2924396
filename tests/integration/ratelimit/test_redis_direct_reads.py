"""An acquire reads its reply straight from the socket or stream (``_redis_utils._receive``),
against a real Redis server, blocking and asyncio: never through redis-py's reader, on
RESP2 and RESP3 and with ``decode_responses`` either way, to the decisions redis-py's
reader gives; ``NOSCRIPT`` keeps the connection; a push message before the reply goes to
redis-py's push handler; a connection the server closed, or a reply that came too late,
is dropped and never read from again, so no later acquire reads an earlier command's
reply.
"""

from __future__ import annotations

import asyncio
import hashlib
import select
import socket
import time
from datetime import timedelta
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

pytestmark = pytest.mark.integration


@pytest.fixture
def reader_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every reply redis-py's own readers read while the test runs (its reader's name)."""
    calls: list[str] = []
    for reader in (_RESP2Parser, _RESP3Parser):
        real = reader.read_response

        def spy(self: Any, *args: Any, _real: Any = real, **kwargs: Any) -> Any:
            calls.append(type(self).__name__)
            return _real(self, *args, **kwargs)

        monkeypatch.setattr(reader, "read_response", spy)
    return calls


def _held(client: Any) -> Any:
    [conn] = getattr(client.connection_pool, srru._HELD_ATTRIBUTE)
    return conn


@pytest.mark.parametrize("protocol", [2, 3])
@pytest.mark.parametrize("decode", [False, True], ids=["bytes", "decoded"])
def test_blocking_acquires_read_their_replies_without_redis_pys_reader(
    redis_url: str, unique_name: str, reader_calls: list[str], protocol: int, decode: bool
) -> None:
    client = redis.Redis.from_url(
        redis_url, protocol=protocol, decode_responses=decode, socket_timeout=5
    )
    kw: dict[str, Any] = {"redis_client": client}
    tb = srl.TokenBucket(unique_name, capacity=100, refill_per_second=0)
    gcra = srl.SlidingWindow(f"{unique_name}_g", limit=3, window=timedelta(minutes=1), style="gcra")
    log = srl.SlidingWindow(f"{unique_name}_l", limit=3, window=timedelta(minutes=1))
    try:
        assert tb.acquire(**kw).remaining == 99  # connects; loads the scripts the server lacks
        assert gcra.acquire(**kw).allowed
        assert log.acquire(**kw).allowed
        assert _held(client)._parser.__class__ is (_RESP2Parser if protocol == 2 else _RESP3Parser)
        client.ping()  # a second connection (the first is held), its handshake read
        reader_calls.clear()
        client.ping()  # redis-py's own command: its reader (the spy sees it)
        assert len(reader_calls) == 1
        reader_calls.clear()
        assert [tb.acquire(**kw).remaining for _ in range(50)] == list(range(98, 48, -1))
        assert [gcra.acquire(**kw).allowed for _ in range(3)] == [True] * 2 + [False]
        assert [log.acquire(**kw).allowed for _ in range(3)] == [True] * 2 + [False]
        denied = log.acquire(**kw)
        assert denied.retry_after is not None
        assert timedelta(seconds=59) < denied.retry_after <= timedelta(minutes=1)
        assert tb.peek(**kw).remaining == 49
        assert reader_calls == []  # not one acquire's reply went through redis-py's reader
    finally:
        client.close()


def test_noscript_is_answered_on_the_same_connection(
    redis_url: str, unique_name: str, reader_calls: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    client = redis.Redis.from_url(redis_url, socket_timeout=5)
    kw: dict[str, Any] = {"redis_client": client}
    tb = srl.TokenBucket(unique_name, capacity=10, refill_per_second=0)
    try:
        assert tb.acquire(**kw).remaining == 9
        held = _held(client)
        sock = held._sock
        # a SHA the server never saw, as after a SCRIPT FLUSH (the server's cache is shared
        # with the tests running beside this one, so it is not flushed): NOSCRIPT
        unknown = hashlib.sha1(unique_name.encode()).hexdigest().encode()
        monkeypatch.setattr(TOKEN_BUCKET, "sha", unknown)
        assert tb.acquire(**kw).remaining == 8  # loaded again and run once
        assert _held(client) is held
        assert held._sock is sock  # the error reply left the connection usable
        assert TOKEN_BUCKET.sha == hashlib.sha1(TOKEN_BUCKET.source).hexdigest().encode()
        reader_calls.clear()
        assert tb.acquire(**kw).remaining == 7
        assert reader_calls == []
    finally:
        client.close()


def test_a_push_message_before_the_reply_goes_to_redis_pys_push_handler(
    redis_url: str, unique_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    pushes: list[list[Any]] = []
    real: Any = _RESP3Parser.handle_push_response

    def spy(self: Any, response: list[Any], **kwargs: Any) -> Any:
        pushes.append(response)
        return real(self, response, **kwargs)

    monkeypatch.setattr(_RESP3Parser, "handle_push_response", spy)
    client = redis.Redis.from_url(redis_url, protocol=3, socket_timeout=5)
    other = redis.Redis.from_url(redis_url)
    kw: dict[str, Any] = {"redis_client": client}
    tb = srl.TokenBucket(unique_name, capacity=10, refill_per_second=0)
    channel = f"{unique_name}_news".encode()
    try:
        assert tb.acquire(**kw).remaining == 9
        held = _held(client)
        held.send_command("SUBSCRIBE", channel)  # RESP3: still takes commands once subscribed
        assert held.read_response(push_request=True) == [b"subscribe", channel, 1]
        pushes.clear()
        assert other.publish(channel, b"hello") == 1
        readable, _, _ = select.select([held._sock], [], [], 5)
        assert readable  # the message waits on the socket ahead of the acquire's reply
        assert tb.acquire(**kw).remaining == 8
        assert pushes == [[b"message", channel, b"hello"]]
        assert _held(client) is held
        assert tb.acquire(**kw).remaining == 7
    finally:
        client.close()
        other.close()


def _peek_elsewhere(redis_url: str, tb: srl.TokenBucket) -> float:
    """The bucket's tokens as another client sees them."""
    other = redis.Redis.from_url(redis_url)
    try:
        return tb.peek(redis_client=other).remaining
    finally:
        other.close()


def test_a_connection_the_server_closed_is_dropped_and_the_acquire_runs_on_a_new_one(
    redis_url: str, unique_name: str
) -> None:
    client = redis.Redis.from_url(redis_url, socket_timeout=5)
    admin = redis.Redis.from_url(redis_url)
    kw: dict[str, Any] = {"redis_client": client}
    tb = srl.TokenBucket(unique_name, capacity=10, refill_per_second=0)
    try:
        assert tb.acquire(**kw).remaining == 9
        sock = _held(client)._sock
        host, port = sock.getsockname()[:2]
        address = f"{host}:{port}"  # the server knows the connection by this address
        assert admin.client_kill(address)
        assert tb.acquire(**kw).remaining == 8  # taken once, on a new connection
        assert sock.fileno() == -1  # the closed connection was dropped
        assert [tb.acquire(**kw).remaining for _ in range(3)] == [7, 6, 5]
        assert _peek_elsewhere(redis_url, tb) == 5
    finally:
        client.close()
        admin.close()


def test_a_reply_that_comes_too_late_is_never_read_by_a_later_acquire(
    redis_url: str, unique_name: str
) -> None:
    client = redis.Redis.from_url(redis_url, socket_timeout=0.2, retry=Retry(NoBackoff(), 0))
    admin = redis.Redis.from_url(redis_url)
    kw: dict[str, Any] = {"redis_client": client}
    tb = srl.TokenBucket(unique_name, capacity=100, refill_per_second=0)
    try:
        assert tb.acquire(**kw).remaining == 99
        held = _held(client)
        sock = held._sock
        admin.client_pause(1000, all=False)  # EVALSHA waits
        started = time.monotonic()
        with pytest.raises(RedisTimeoutError):
            tb.acquire(**kw)  # times out on the held connection, then on redis-py's retry
        assert time.monotonic() - started < 0.9
        admin.client_unpause()
        assert sock.fileno() == -1  # the connection whose reply is late was dropped
        for _ in range(5):  # each answer is its own command's, not a late one's
            assert tb.acquire(**kw).remaining == _peek_elsewhere(redis_url, tb)
    finally:
        admin.client_unpause()
        client.close()
        admin.close()


def test_a_connection_with_health_checks_keeps_redis_pys_reader(
    redis_url: str, unique_name: str, reader_calls: list[str]
) -> None:
    client = redis.Redis.from_url(redis_url, health_check_interval=30, socket_timeout=5)
    kw: dict[str, Any] = {"redis_client": client}
    tb = srl.TokenBucket(unique_name, capacity=100, refill_per_second=0)
    try:
        assert tb.acquire(**kw).remaining == 99
        reader_calls.clear()
        assert [tb.acquire(**kw).remaining for _ in range(5)] == [98, 97, 96, 95, 94]
        assert len(reader_calls) >= 5
    finally:
        client.close()


def test_a_socket_that_is_not_a_plain_socket_keeps_redis_pys_reader(
    redis_url: str, unique_name: str, reader_calls: list[str], monkeypatch: pytest.MonkeyPatch
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


@pytest.fixture
def async_reader_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every reply redis-py's own asyncio readers read while the test runs."""
    calls: list[str] = []
    for reader in (_AsyncRESP2Parser, _AsyncRESP3Parser):
        real = reader.read_response

        async def spy(self: Any, *args: Any, _real: Any = real, **kwargs: Any) -> Any:
            calls.append(type(self).__name__)
            return await _real(self, *args, **kwargs)

        monkeypatch.setattr(reader, "read_response", spy)
    return calls


@pytest.mark.parametrize("protocol", [2, 3])
@pytest.mark.parametrize("decode", [False, True], ids=["bytes", "decoded"])
async def test_async_acquires_read_their_replies_without_redis_pys_reader(
    redis_url: str, unique_name: str, async_reader_calls: list[str], protocol: int, decode: bool
) -> None:
    client = aredis.Redis.from_url(
        redis_url, protocol=protocol, decode_responses=decode, socket_timeout=5
    )
    kw: dict[str, Any] = {"redis_client": client}
    tb = arl.TokenBucket(unique_name, capacity=100, refill_per_second=0)
    gcra = arl.SlidingWindow(f"{unique_name}_g", limit=3, window=timedelta(minutes=1), style="gcra")
    log = arl.SlidingWindow(f"{unique_name}_l", limit=3, window=timedelta(minutes=1))
    try:
        assert (await tb.acquire(**kw)).remaining == 99  # connects; loads missing scripts
        assert (await gcra.acquire(**kw)).allowed
        assert (await log.acquire(**kw)).allowed
        held = _held(client)
        assert held._parser.__class__ is (_AsyncRESP2Parser if protocol == 2 else _AsyncRESP3Parser)
        await client.ping()  # a second connection (the first is held), its handshake read
        async_reader_calls.clear()
        await client.ping()  # redis-py's own command: its reader (the spy sees it)
        assert len(async_reader_calls) == 1
        async_reader_calls.clear()
        assert [(await tb.acquire(**kw)).remaining for _ in range(50)] == list(range(98, 48, -1))
        assert [(await gcra.acquire(**kw)).allowed for _ in range(3)] == [True] * 2 + [False]
        assert [(await log.acquire(**kw)).allowed for _ in range(3)] == [True] * 2 + [False]
        assert (await tb.peek(**kw)).remaining == 49
        assert async_reader_calls == []
        assert _held(client) is held
    finally:
        await client.aclose()


async def test_async_a_push_message_before_the_reply_goes_to_redis_pys_push_handler(
    redis_url: str, unique_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    pushes: list[list[Any]] = []
    real: Any = _AsyncRESP3Parser.handle_push_response

    async def spy(self: Any, response: list[Any], **kwargs: Any) -> Any:
        pushes.append(response)
        return await real(self, response, **kwargs)

    monkeypatch.setattr(_AsyncRESP3Parser, "handle_push_response", spy)
    client = aredis.Redis.from_url(redis_url, protocol=3, socket_timeout=5)
    other = aredis.Redis.from_url(redis_url)
    kw: dict[str, Any] = {"redis_client": client}
    tb = arl.TokenBucket(unique_name, capacity=10, refill_per_second=0)
    channel = f"{unique_name}_news".encode()
    try:
        assert (await tb.acquire(**kw)).remaining == 9
        held = _held(client)
        await held.send_command("SUBSCRIBE", channel)
        assert await held.read_response(push_request=True) == [b"subscribe", channel, 1]
        pushes.clear()
        assert await other.publish(channel, b"hello") == 1
        for _ in range(500):  # until the message waits in the stream, ahead of the reply
            if held._reader._buffer:
                break
            await asyncio.sleep(0.01)
        assert held._reader._buffer
        assert (await tb.acquire(**kw)).remaining == 8
        assert pushes == [[b"message", channel, b"hello"]]
        assert _held(client) is held
        assert (await tb.acquire(**kw)).remaining == 7
    finally:
        await client.aclose()
        await other.aclose()


async def test_async_a_connection_the_server_closed_is_dropped_and_the_acquire_runs_again(
    redis_url: str, unique_name: str
) -> None:
    client = aredis.Redis.from_url(redis_url, socket_timeout=5)
    admin = redis.Redis.from_url(redis_url)
    kw: dict[str, Any] = {"redis_client": client}
    tb = arl.TokenBucket(unique_name, capacity=10, refill_per_second=0)
    try:
        assert (await tb.acquire(**kw)).remaining == 9
        held = _held(client)
        reader = held._reader
        host, port = held._writer.get_extra_info("sockname")[:2]
        assert admin.client_kill(f"{host}:{port}")
        assert (await tb.acquire(**kw)).remaining == 8  # taken once, on a new connection
        assert held._reader is not reader  # the closed connection was dropped
        assert [(await tb.acquire(**kw)).remaining for _ in range(3)] == [7, 6, 5]
        assert _peek_elsewhere(redis_url, tb_sync(unique_name)) == 5
    finally:
        await client.aclose()
        admin.close()


def tb_sync(name: str) -> srl.TokenBucket:
    """The blocking twin of a bucket of 10 called ``name`` (same key)."""
    return srl.TokenBucket(name, capacity=10, refill_per_second=0)


async def test_async_a_reply_that_comes_too_late_is_never_read_by_a_later_acquire(
    redis_url: str, unique_name: str
) -> None:
    client = aredis.Redis.from_url(redis_url, socket_timeout=0.2, retry=AsyncRetry(NoBackoff(), 0))
    admin = redis.Redis.from_url(redis_url)
    kw: dict[str, Any] = {"redis_client": client}
    tb = arl.TokenBucket(unique_name, capacity=10, refill_per_second=0)
    try:
        assert (await tb.acquire(**kw)).remaining == 9
        held = _held(client)
        reader = held._reader
        admin.client_pause(1000, all=False)  # EVALSHA waits
        started = time.monotonic()
        with pytest.raises(RedisTimeoutError):
            await tb.acquire(**kw)  # times out on the held connection, then on redis-py's retry
        assert time.monotonic() - started < 0.9
        admin.client_unpause()
        assert held._reader is not reader  # the connection whose reply is late was dropped
        for _ in range(5):  # each answer is its own command's, not a late one's
            decision = await tb.acquire(**kw)
            assert decision.remaining == _peek_elsewhere(redis_url, tb_sync(unique_name))
    finally:
        admin.client_unpause()
        await client.aclose()
        admin.close()
