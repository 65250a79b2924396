"""The Redis acquire hot path (``_redis_utils.evalsha``), blocking and asyncio, against a
real server: the decisions are the script's on RESP2 and RESP3, with or without
``decode_responses``; ``NOSCRIPT`` keeps the held connection; a connection the server
closed, or one whose reply came too late, is dropped, and no later acquire reads an
earlier command's reply; a client with health checks still acquires.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import pytest
import redis
import redis.asyncio as aredis
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry

import taskq.ratelimit as arl
import taskq_sync.ratelimit as srl
from taskq._compat import redis as compat_redis
from taskq.ratelimit import _redis_utils as rru
from taskq.ratelimit._lua import TOKEN_BUCKET
from tests.integration.ratelimit.conftest import call

pytestmark = pytest.mark.integration


@dataclass(frozen=True)
class Flavour:
    """The blocking or the asyncio side: its API, redis-py client class and retry class."""

    name: str
    rl: ModuleType
    client_class: Any
    retry: Any

    def client(self, redis_url: str, **options: Any) -> Any:
        return self.client_class.from_url(redis_url, **options)

    async def close(self, client: Any) -> None:
        await call(client.close() if self.name == "sync" else client.aclose())


SYNC = Flavour("sync", srl, redis.Redis, Retry)
ASYNC = Flavour("async", arl, aredis.Redis, AsyncRetry)


@pytest.fixture(params=[SYNC, ASYNC], ids=["sync", "async"])
def flavour(request: pytest.FixtureRequest) -> Flavour:
    flavour: Flavour = request.param
    return flavour


def _held(client: Any) -> Any:
    """The one connection the client's pool holds for acquires."""
    [conn] = getattr(client.connection_pool, rru._HELD_ATTRIBUTE)
    return conn


def _server_ids(redis_url: str, name: str) -> list[int]:
    """The server's ids of the connections named ``name``."""
    admin = redis.Redis.from_url(redis_url)
    try:
        return [int(c["id"]) for c in admin.client_list() if c["name"] == name]
    finally:
        admin.close()


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
async def test_acquires_get_the_scripts_decisions_on_every_protocol(
    redis_url: str, unique_name: str, flavour: Flavour, protocol: int, decode: bool
) -> None:
    client = flavour.client(redis_url, protocol=protocol, decode_responses=decode)
    kw: dict[str, Any] = {"redis_client": client}
    tb = flavour.rl.TokenBucket(unique_name, capacity=5, refill_per_second=0)
    try:
        decisions = [await call(tb.acquire(**kw)) for _ in range(6)]
        assert [d.allowed for d in decisions] == [True] * 5 + [False]
        assert [d.remaining for d in decisions] == [4, 3, 2, 1, 0, 0]
        assert _peek_elsewhere(redis_url, unique_name, 5) == 0
        held = _held(client)
        assert (await call(tb.acquire(**kw))).allowed is False
        assert _held(client) is held  # one connection served them all
    finally:
        await flavour.close(client)


async def test_noscript_is_answered_on_the_same_held_connection(
    redis_url: str, unique_name: str, flavour: Flavour, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = f"tq-{unique_name}"
    client = flavour.client(redis_url, client_name=name)
    kw: dict[str, Any] = {"redis_client": client}
    tb = flavour.rl.TokenBucket(unique_name, capacity=10, refill_per_second=0)
    try:
        assert (await call(tb.acquire(**kw))).remaining == 9
        held = _held(client)
        [server_id] = _server_ids(redis_url, name)
        # a SHA the server never saw, as after a SCRIPT FLUSH (the server's cache is shared
        # with the tests running beside this one, so it is not flushed): NOSCRIPT
        unknown = hashlib.sha1(unique_name.encode()).hexdigest().encode()
        monkeypatch.setattr(TOKEN_BUCKET, "sha", unknown)
        assert (await call(tb.acquire(**kw))).remaining == 8  # loaded again and run once
        assert TOKEN_BUCKET.sha == hashlib.sha1(TOKEN_BUCKET.source).hexdigest().encode()
        assert (await call(tb.acquire(**kw))).remaining == 7
        assert _held(client) is held
        assert server_id in _server_ids(redis_url, name)  # the error reply left it usable
    finally:
        await flavour.close(client)


async def test_a_connection_the_server_closed_is_dropped_and_the_acquire_runs_on_a_new_one(
    redis_url: str, unique_name: str, flavour: Flavour
) -> None:
    name = f"tq-{unique_name}"
    client = flavour.client(redis_url, client_name=name)
    admin = redis.Redis.from_url(redis_url)
    kw: dict[str, Any] = {"redis_client": client}
    tb = flavour.rl.TokenBucket(unique_name, capacity=10, refill_per_second=0)
    try:
        assert (await call(tb.acquire(**kw))).remaining == 9
        [server_id] = _server_ids(redis_url, name)
        assert admin.client_kill_filter(_id=str(server_id)) == 1
        assert (await call(tb.acquire(**kw))).remaining == 8  # taken once, on a new one
        assert server_id not in _server_ids(redis_url, name)
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
        admin.client_pause(1000, all=False)  # EVALSHA waits
        with pytest.raises(RedisTimeoutError):
            await call(tb.acquire(**kw))  # times out on the held connection, then on the retry
        admin.client_unpause()
        for _ in range(5):  # each answer is its own command's, not a late one's
            decision = await call(tb.acquire(**kw))
            assert decision.remaining == _peek_elsewhere(redis_url, unique_name, 100)
    finally:
        admin.client_unpause()
        await flavour.close(client)
        admin.close()


async def test_a_client_with_health_checks_acquires(
    redis_url: str, unique_name: str, flavour: Flavour
) -> None:
    client = flavour.client(redis_url, health_check_interval=30, socket_timeout=5)
    kw: dict[str, Any] = {"redis_client": client}
    tb = flavour.rl.TokenBucket(unique_name, capacity=100, refill_per_second=0)
    try:
        taken = [(await call(tb.acquire(**kw))).remaining for _ in range(6)]
        assert taken == [99, 98, 97, 96, 95, 94]
    finally:
        await flavour.close(client)


def test_the_installed_redis_py_is_one_whose_asyncio_writer_was_checked() -> None:
    assert compat_redis.SUPPORTED, (
        f"redis-py {redis.__version__}: check asyncio Connection._writer (set by connect(), "
        "None after disconnect()) against taskq/_compat/redis.py, then add the version to "
        "its TESTED_VERSIONS"
    )


@pytest.mark.parametrize("supported", [True, False], ids=["compat", "public-fallback"])
async def test_async_acquires_write_through_compat_or_redis_pys_send(
    redis_url: str, unique_name: str, monkeypatch: pytest.MonkeyPatch, supported: bool
) -> None:
    monkeypatch.setattr(compat_redis, "SUPPORTED", supported)
    sends: list[object] = []
    real = aredis.Connection.send_packed_command

    async def spy(self: Any, command: Any, check_health: bool = True) -> None:
        sends.append(command)
        await real(self, command, check_health)

    monkeypatch.setattr(aredis.Connection, "send_packed_command", spy)
    client = aredis.Redis.from_url(redis_url, socket_timeout=5)
    tb = arl.TokenBucket(unique_name, capacity=10, refill_per_second=0)
    try:
        assert (await tb.acquire(redis_client=client)).remaining == 9  # connects
        sends.clear()
        taken = [(await tb.acquire(redis_client=client)).remaining for _ in range(5)]
        assert taken == [8, 7, 6, 5, 4]
        assert len(sends) == (0 if supported else 5)
    finally:
        await client.aclose()
