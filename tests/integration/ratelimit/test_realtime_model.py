"""The algorithms on the real stores, checked against what the maths allows in real time.

The stores use their own clock, so the model cannot know the exact instant of a call,
only that it fell between the local clock readings before and after it (same host, same
system clock; 2 ms slack for SQLite's millisecond clock). Hypothesis drives random
sequences; each decision must be one the model allows for some instant in that interval:

- right after an allowed decision with ``remaining = R``, a request for ``<= R`` passes;
- a request for more than ``R`` plus what can refill in the elapsed interval is denied;
- after sleeping a denial's ``retry_after``, the same request passes.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from datetime import timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.integration.ratelimit.conftest import Env, call

pytestmark = pytest.mark.integration
SLACK = 0.002


@pytest.mark.parametrize("store", ["redis", "postgres", "sqlite"])
@pytest.mark.parametrize("flavour", ["async"])
@settings(max_examples=5, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    capacity=st.integers(2, 5),
    steps=st.lists(
        st.one_of(
            st.tuples(st.just("take"), st.integers(1, 5)),
            st.tuples(st.just("sleep"), st.integers(0, 30)),
        ),
        min_size=3,
        max_size=10,
    ),
)
async def test_token_bucket_decisions_are_ones_the_maths_allows(
    env: Env, capacity: int, steps: list[tuple[str, int]]
) -> None:
    rate = 50.0  # a token per 20 ms
    tb = env.rl.TokenBucket(
        f"rt_{uuid.uuid4().hex}", capacity=capacity, refill_per_second=rate, backend=env.backend
    )
    last_remaining: float | None = None
    last_before = 0.0
    for kind, value in steps:
        if kind == "sleep":
            await asyncio.sleep(value / 1000)
            continue
        count = min(value, capacity)
        before = time.monotonic()
        d = await call(tb.acquire(count, **env.kw))
        after = time.monotonic()
        if last_remaining is None:
            assert d.allowed  # a fresh bucket is full
        else:
            if count <= last_remaining:
                assert d.allowed
            if count > last_remaining + rate * (after - last_before + SLACK) + 1e-6:
                assert not d.allowed
        if d.allowed:
            last_remaining, last_before = d.remaining, before
            assert 0 <= d.remaining <= capacity - count + 1e-9
        else:
            assert d.retry_after is not None
            assert timedelta(0) < d.retry_after <= timedelta(seconds=count / rate)
            await asyncio.sleep(d.retry_after.total_seconds() + SLACK)
            before = time.monotonic()
            again = await call(tb.acquire(count, **env.kw))
            assert again.allowed
            last_remaining, last_before = again.remaining, before


@pytest.mark.parametrize("store", ["redis", "postgres", "sqlite"])
@pytest.mark.parametrize("flavour", ["async"])
@pytest.mark.parametrize("style", ["log", "gcra"])
@settings(max_examples=4, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    limit=st.integers(1, 4),
    steps=st.lists(st.one_of(st.just(0), st.integers(0, 40)), min_size=3, max_size=8),
)
async def test_sliding_window_decisions_are_ones_the_maths_allows(
    env: Env, style: str, limit: int, steps: list[int]
) -> None:
    window = timedelta(milliseconds=80)
    sw = env.rl.SlidingWindow(
        f"rt_{uuid.uuid4().hex}", limit=limit, window=window, backend=env.backend, style=style
    )
    first = await call(sw.acquire(**env.kw))
    assert first.allowed
    assert first.remaining == limit - 1
    remaining = first.remaining
    for sleep_ms in steps:
        if sleep_ms:
            await asyncio.sleep(sleep_ms / 1000)
        d = await call(sw.acquire(**env.kw))
        if remaining >= 1:
            assert d.allowed  # nothing leaves the window faster than it entered
        if d.allowed:
            remaining = d.remaining
            assert 0 <= remaining <= limit - 1
        else:
            assert timedelta(0) < d.retry_after <= window
            await asyncio.sleep(d.retry_after.total_seconds() + SLACK)
            again = await call(sw.acquire(**env.kw))
            assert again.allowed
            remaining = again.remaining
