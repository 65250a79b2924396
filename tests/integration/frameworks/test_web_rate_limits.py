"""Rate limits from web code: the settings' Redis client, keyed buckets by ``key=``."""

from __future__ import annotations

import os
from datetime import timedelta

import pytest
from pydantic import BaseModel

import taskq_sync.ratelimit as sync_rl
from taskq.contrib.http import retry_after_header
from taskq.ratelimit import KeyedRateLimitRef, RateLimitRegistry, TokenBucket
from taskq.ratelimit.decision import RateLimitDecision
from taskq.ratelimit.settings_redis import settings_redis
from taskq.settings import TaskQSettings


class User(BaseModel):
    user: str


async def test_a_redis_bucket_without_a_client_uses_the_settings_redis(
    redis_url: str, unique_name: str
) -> None:
    settings = TaskQSettings.load(redis_url=redis_url)
    bucket = TokenBucket(f"{unique_name}_b", capacity=2, refill_per_second=0.001)
    taken = [(await bucket.acquire(settings=settings)).allowed for _ in range(3)]
    assert taken == [True, True, False]
    assert settings_redis(settings) is settings_redis(settings)  # one client per URL


def test_sync_bucket_uses_taskq_redis_url_from_the_environment(
    redis_url: str, unique_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TASKQ_REDIS_URL", redis_url)
    from taskq_sync.ratelimit import settings_redis as module

    monkeypatch.setattr(module, "_ENV_URL", {})
    bucket = sync_rl.TokenBucket(f"{unique_name}_e", capacity=1, refill_per_second=0.001)
    assert bucket.acquire().allowed
    assert not bucket.acquire().allowed
    assert os.environ["TASKQ_REDIS_URL"] == redis_url


async def test_keyed_acquire_limits_each_key_on_its_own(redis_url: str, unique_name: str) -> None:
    settings = TaskQSettings.load(redis_url=redis_url)
    reg = RateLimitRegistry()
    ref = KeyedRateLimitRef.typed(
        User,
        base_name=f"{unique_name}_k",
        key_fn=lambda u: u.user,
        capacity=2,
        refill_per_second=0.001,
    )
    seen: dict[str, list[bool]] = {"a": [], "b": []}
    for key in ["a", "a", "a", "b", "b", "b"]:
        async with reg.acquire(ref, key=key, settings=settings) as decision:
            seen[key].append(decision.allowed)
    assert seen == {"a": [True, True, False], "b": [True, True, False]}
    assert set(reg.rate_limits()) == {f"{unique_name}_k:a", f"{unique_name}_k:b"}
    with pytest.raises(ValueError, match="needs key="):
        async with reg.acquire(ref, settings=settings):
            pass
    reg.register(TokenBucket(f"{unique_name}_plain", capacity=1, refill_per_second=1))
    with pytest.raises(TypeError, match="key= is for a KeyedRateLimitRef"):
        async with reg.acquire(f"{unique_name}_plain", key="a", settings=settings):
            pass


def test_retry_after_is_whole_seconds_rounded_up() -> None:
    def denied(wait: timedelta | None) -> RateLimitDecision:
        return RateLimitDecision(False, 0.0, wait, "b", "redis")

    assert retry_after_header(denied(timedelta(seconds=2.1))) == {"Retry-After": "3"}
    assert retry_after_header(denied(timedelta(milliseconds=10))) == {"Retry-After": "1"}
    assert retry_after_header(denied(None)) == {}
