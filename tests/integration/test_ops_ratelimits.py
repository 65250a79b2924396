"""``RateLimitsClient`` on each SQL engine: peek state without consuming, buckets known only
from ``rate_limit_buckets`` rebuilt, reset refilling and logged at WARNING, unknown names
refused; async and ``taskq_sync``."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncEngine

from taskq.ops import RateLimitsClient
from taskq.ratelimit import RateLimitRegistry, TokenBucket
from taskq.settings import TaskQSettings


async def test_list_peek_and_reset(
    engine: AsyncEngine, settings: TaskQSettings, unique_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    bucket = TokenBucket(unique_name, capacity=3, refill_per_second=0, backend="postgres")
    registry = RateLimitRegistry()
    registry.register(bucket)
    client = RateLimitsClient(engine, registry=registry, settings=settings)
    [fresh] = await client.list()
    assert (fresh.name, fresh.kind, fresh.backend, fresh.source) == (
        unique_name,
        "token_bucket",
        "postgres",
        "registry",
    )
    assert fresh.state is not None
    assert fresh.state.tokens_remaining == 3
    for _ in range(3):
        assert (await bucket.acquire(pg_pool=engine, settings=settings)).allowed
    peeked = await client.peek(unique_name)
    assert peeked.state is not None
    assert peeked.state.is_exhausted
    assert (await client.peek(unique_name)).state == peeked.state  # peeking consumes nothing

    # Another process (an operator's CLI) that never declared the bucket finds it stored.
    elsewhere = RateLimitsClient(engine, registry=RateLimitRegistry(), settings=settings)
    [stored] = await elsewhere.list()
    assert (stored.name, stored.source) == (unique_name, "stored")
    assert stored.state is not None
    assert stored.state.is_exhausted
    with caplog.at_level(logging.WARNING, logger="taskq.ratelimit"):
        after = await elsewhere.reset(unique_name)
    assert after.state is not None
    assert (after.state.is_exhausted, after.state.tokens_remaining) == (False, 3)
    [record] = [r for r in caplog.records if "ratelimit-reset" in r.getMessage()]
    assert record.levelno == logging.WARNING
    assert unique_name in record.getMessage()
    assert (await bucket.acquire(pg_pool=engine, settings=settings)).allowed

    with pytest.raises(KeyError, match="no rate limit named 'nope'"):
        await client.peek("nope")
    with pytest.raises(KeyError):
        await client.reset("nope")


async def test_the_blocking_twin(
    engine: AsyncEngine, engine_url: str | URL, settings: TaskQSettings, unique_name: str
) -> None:
    from taskq_sync.db.engine import make_engine
    from taskq_sync.ops import RateLimitsClient as SyncRateLimitsClient
    from taskq_sync.ratelimit import RateLimitRegistry as SyncRateLimitRegistry

    bucket = TokenBucket(unique_name, capacity=2, refill_per_second=0, backend="postgres")
    assert (await bucket.acquire(pg_pool=engine, settings=settings)).allowed

    def go() -> list[Any]:
        sync_engine = make_engine(engine_url, settings=settings)
        try:
            registry = SyncRateLimitRegistry()
            client = SyncRateLimitsClient(sync_engine, registry=registry, settings=settings)
            listed = client.list()
            client.reset(unique_name)
            return [listed, client.peek(unique_name)]
        finally:
            sync_engine.dispose()

    listed, after = await asyncio.to_thread(go)
    [only] = listed
    assert only.state.tokens_remaining == 1
    assert after.state.tokens_remaining == 2
