"""The Redis hot path holds its connection between acquires (see ``_redis_utils``).

What a user relies on: one connection serves a stream of acquires, it is still the
client's (closing the client closes it), pools that cannot spare a connection lend none,
concurrent acquirers never share one, and a forked child never writes to its parent's
socket. Each test names its client (``CLIENT SETNAME``) and counts its connections on
the server with ``CLIENT LIST``.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import threading
from datetime import timedelta
from typing import Any

import pytest
import redis
import redis.asyncio as aredis

import taskq.ratelimit as arl
import taskq_sync.ratelimit as srl
from taskq.ratelimit import _redis_utils as rru
from taskq.settings import TaskQSettings

pytestmark = pytest.mark.integration


def connections(redis_url: str, name: str) -> int:
    """How many connections named ``name`` the server has open."""
    admin = redis.Redis.from_url(redis_url)
    try:
        return sum(1 for c in admin.client_list() if c["name"] == name)
    finally:
        admin.close()


def test_a_stream_of_sync_acquires_uses_one_connection_that_close_releases(
    redis_url: str, unique_name: str, settings: TaskQSettings
) -> None:
    name = f"tq-{unique_name}"
    client = redis.Redis.from_url(redis_url, client_name=name)
    tb = srl.TokenBucket(unique_name, capacity=1000, refill_per_second=0)
    gcra = srl.SlidingWindow(
        f"{unique_name}_g", limit=1000, window=timedelta(minutes=1), style="gcra"
    )
    kw: dict[str, Any] = {"redis_client": client, "settings": settings}
    remaining = [tb.acquire(**kw).remaining for _ in range(100)]
    assert remaining == [999 - i for i in range(100)]
    assert all(gcra.acquire(**kw).allowed for _ in range(100))
    assert connections(redis_url, name) == 1
    # the client's own commands still work, on a connection of their own: the held
    # one is not in the pool's free list
    assert client.get("taskq:no-such-key") is None
    assert connections(redis_url, name) == 2
    client.close()
    assert connections(redis_url, name) == 0
    # a closed client reconnects on its next command, as redis-py does
    assert tb.acquire(**kw).remaining == 899
    client.close()
    assert connections(redis_url, name) == 0


async def test_a_stream_of_async_acquires_uses_one_connection_that_aclose_releases(
    redis_url: str, unique_name: str, settings: TaskQSettings
) -> None:
    name = f"tq-{unique_name}"
    client = aredis.Redis.from_url(redis_url, client_name=name)
    tb = arl.TokenBucket(unique_name, capacity=1000, refill_per_second=0)
    kw: dict[str, Any] = {"redis_client": client, "settings": settings}
    remaining = [(await tb.acquire(**kw)).remaining for _ in range(100)]
    assert remaining == [999 - i for i in range(100)]
    assert connections(redis_url, name) == 1
    await client.aclose()
    assert connections(redis_url, name) == 0


def test_a_pool_that_cannot_spare_a_connection_lends_none(
    redis_url: str, unique_name: str, settings: TaskQSettings
) -> None:
    """A blocking pool of ONE connection: every acquire gives it back, so the client's
    next command gets it at once instead of waiting out the pool's timeout."""
    name = f"tq-{unique_name}"
    pool = redis.BlockingConnectionPool.from_url(
        redis_url, max_connections=1, timeout=2, client_name=name
    )
    client = redis.Redis(connection_pool=pool)
    try:
        tb = srl.TokenBucket(unique_name, capacity=10, refill_per_second=0)
        for expected in (9, 8, 7):
            assert tb.acquire(redis_client=client, settings=settings).remaining == expected
            assert client.ping() is True
        assert connections(redis_url, name) == 1
    finally:
        client.close()
        pool.disconnect()


async def test_concurrent_async_acquirers_each_get_their_own_connection(
    redis_url: str, unique_name: str, settings: TaskQSettings
) -> None:
    """50 tasks at once on capacity 30: exactly 30 allowed, every reply to its own caller
    (a shared connection would hand one task another's reply), and at most the pool's
    share of connections stays held afterwards."""
    name = f"tq-{unique_name}"
    client = aredis.Redis.from_url(redis_url, client_name=name)
    try:
        tb = arl.TokenBucket(unique_name, capacity=30, refill_per_second=0)
        kw: dict[str, Any] = {"redis_client": client, "settings": settings}
        decisions = await asyncio.gather(*(tb.acquire(**kw) for _ in range(50)))
        allowed = sorted(d.remaining for d in decisions if d.allowed)
        assert allowed == list(range(30))  # each remaining count seen exactly once
        assert sum(not d.allowed for d in decisions) == 20
        held = getattr(client.connection_pool, rru._HELD_ATTRIBUTE)
        assert 1 <= len(held) <= held.cap <= 8
    finally:
        await client.aclose()
    assert connections(redis_url, name) == 0


def test_concurrent_threads_each_get_their_own_connection(
    redis_url: str, unique_name: str, settings: TaskQSettings
) -> None:
    client = redis.Redis.from_url(redis_url)
    tb = srl.TokenBucket(unique_name, capacity=300, refill_per_second=0)
    results: list[Any] = []
    start = threading.Barrier(12)

    def worker() -> None:
        start.wait()
        results.extend(tb.acquire(redis_client=client, settings=settings) for _ in range(40))

    threads = [threading.Thread(target=worker) for _ in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    client.close()
    allowed = sorted(d.remaining for d in results if d.allowed)
    assert allowed == list(range(300))
    assert sum(not d.allowed for d in results) == 12 * 40 - 300


def _child_acquires(client: redis.Redis, name: str, n: int, out: Any) -> None:
    tb = srl.TokenBucket(name, capacity=400, refill_per_second=0)
    out.put([tb.acquire(redis_client=client).remaining for _ in range(n)])


def test_a_forked_child_never_uses_its_parents_held_connection(
    redis_url: str, unique_name: str, settings: TaskQSettings
) -> None:
    """Parent and forked child acquire at the same time on the same client object: with
    a shared socket their replies would cross. Every remaining count is seen once."""
    client = redis.Redis.from_url(redis_url)
    tb = srl.TokenBucket(unique_name, capacity=400, refill_per_second=0)
    first = tb.acquire(redis_client=client, settings=settings).remaining  # holds a connection
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    child = ctx.Process(target=_child_acquires, args=(client, unique_name, 150, out))
    child.start()
    mine = [tb.acquire(redis_client=client, settings=settings).remaining for _ in range(150)]
    theirs = out.get(timeout=60)
    child.join(timeout=60)
    assert child.exitcode == 0
    client.close()
    assert sorted([first, *mine, *theirs]) == list(range(400 - 301, 400))
