"""The reference page's behaviour, on every store and through both APIs (async and sync)."""

from __future__ import annotations

import logging
import time
import uuid
from datetime import timedelta
from types import SimpleNamespace

import pytest

from taskq.constants import DEFAULT_RESERVATION_BACKOFF
from taskq.exceptions import ReservationUnavailable
from tests.integration.ratelimit.conftest import Env, call

pytestmark = pytest.mark.integration
SLACK = timedelta(milliseconds=10)
"""Real stores: clock granularity (SQLite counts milliseconds) around a real-time wait."""


# -- TokenBucket ------------------------------------------------------------------------


async def test_token_bucket_starts_full_drains_and_fixed_quota_has_no_retry(
    env: Env, unique_name: str
) -> None:
    tb = env.rl.TokenBucket(unique_name, capacity=5, refill_per_second=0, backend=env.backend)
    decisions = [await call(tb.acquire(**env.kw)) for _ in range(6)]
    assert [d.allowed for d in decisions] == [True] * 5 + [False]
    assert [d.remaining for d in decisions[:5]] == [4, 3, 2, 1, 0]
    assert all(d.retry_after == timedelta(0) for d in decisions[:5])
    denied = decisions[-1]
    assert denied.retry_after is None
    assert denied.bucket_name == unique_name
    assert {d.backend for d in decisions} == {env.backend}
    assert all(d.request_id is None for d in decisions)


async def test_token_bucket_refills_continuously(env: Env, unique_name: str) -> None:
    # Real stores: a token per 2 s, far longer than three round trips take even on a loaded
    # machine (a fast refill would refill the bucket between them: the denial would not come).
    per_token = timedelta(seconds=2) if env.real_time else timedelta(milliseconds=200)
    rate = 1 / per_token.total_seconds()
    tb = env.rl.TokenBucket(unique_name, capacity=2, refill_per_second=rate, backend=env.backend)
    started = time.monotonic()
    assert (await call(tb.acquire(**env.kw))).allowed
    assert (await call(tb.acquire(**env.kw))).allowed
    denied = await call(tb.acquire(**env.kw))
    elapsed = timedelta(seconds=time.monotonic() - started)
    assert not denied.allowed
    assert timedelta(0) < denied.retry_after <= per_token
    if not env.real_time:
        assert denied.retry_after == per_token
        env.clock.advance(per_token - timedelta(milliseconds=1))
        assert not (await call(tb.acquire(**env.kw))).allowed
        env.clock.advance(timedelta(milliseconds=1))
    else:
        # The refill started at the first acquire: what is left of the token's time.
        assert denied.retry_after >= per_token - elapsed - SLACK
        await env.advance((denied.retry_after + SLACK).total_seconds())
    assert (await call(tb.acquire(**env.kw))).allowed


async def test_token_bucket_count_and_bounds(env: Env, unique_name: str) -> None:
    tb = env.rl.TokenBucket(unique_name, capacity=5, refill_per_second=0, backend=env.backend)
    first = await call(tb.acquire(3, **env.kw))
    assert first.allowed
    assert first.remaining == 2
    assert not (await call(tb.acquire(3, **env.kw))).allowed
    assert (await call(tb.acquire(2, **env.kw))).allowed
    with pytest.raises(ValueError):
        await call(tb.acquire(6, **env.kw))
    with pytest.raises(ValueError):
        await call(tb.acquire(0, **env.kw))


async def test_token_bucket_refund(
    env: Env, unique_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    tb = env.rl.TokenBucket(unique_name, capacity=2, refill_per_second=0, backend=env.backend)
    await call(tb.acquire(**env.kw))
    second = await call(tb.acquire(**env.kw))
    denied = await call(tb.acquire(**env.kw))
    await call(tb.refund(denied, **env.kw))  # took nothing, gives nothing
    assert not (await call(tb.acquire(**env.kw))).allowed
    with caplog.at_level(logging.WARNING, logger="taskq.ratelimit"):
        await call(tb.refund(second, count=1.0, **env.kw))
    # Every backend gives the token back (the SQL one too, since issue 20).
    assert (await call(tb.acquire(**env.kw))).allowed
    assert not (await call(tb.acquire(**env.kw))).allowed
    assert not any("refund_noop" in r.getMessage() for r in caplog.records)


async def test_token_bucket_peek_and_reset(env: Env, unique_name: str) -> None:
    tb = env.rl.TokenBucket(unique_name, capacity=3, refill_per_second=0, backend=env.backend)
    fresh = await call(tb.peek(**env.kw))
    assert (fresh.tokens_remaining, fresh.is_exhausted, fresh.capacity) == (3, False, 3)
    assert fresh.refill_per_second == 0
    assert fresh.limit is None
    assert fresh.style is None
    for _ in range(3):
        await call(tb.acquire(**env.kw))
    for _ in range(2):  # peeking consumes nothing
        state = await call(tb.peek(**env.kw))
        assert state.is_exhausted
        assert state.tokens_remaining == 0
        assert state.retry_after is None
        assert state.backend == env.backend
        assert state.bucket_name == unique_name
    await call(tb.reset(**env.kw))
    await call(tb.reset(**env.kw))
    assert (await call(tb.peek(**env.kw))).tokens_remaining == 3
    assert (await call(tb.acquire(**env.kw))).remaining == 2
    never = env.rl.TokenBucket(
        unique_name + "_x", capacity=1, refill_per_second=1, backend=env.backend
    )
    await call(never.reset(**env.kw))


# -- SlidingWindow ----------------------------------------------------------------------


def _window(env: Env) -> timedelta:
    # Real stores: long enough that four round trips fit in it on a loaded machine.
    return timedelta(seconds=2) if env.real_time else timedelta(seconds=10)


async def test_log_window_admits_limit_then_slides(env: Env, unique_name: str) -> None:
    window = _window(env)
    sw = env.rl.SlidingWindow(unique_name, limit=3, window=window, backend=env.backend, style="log")
    started = time.monotonic()
    allowed = [await call(sw.acquire(**env.kw)) for _ in range(3)]
    assert [d.remaining for d in allowed] == [2, 1, 0]
    assert len({d.request_id for d in allowed}) == 3
    assert all(d.request_id for d in allowed)
    denied = await call(sw.acquire(**env.kw))
    elapsed = timedelta(seconds=time.monotonic() - started)
    assert not denied.allowed
    assert denied.request_id is None
    assert timedelta(0) < denied.retry_after <= window
    if not env.real_time:
        assert denied.retry_after == window
        env.clock.advance(window)  # entries at exactly now - window are outside it
    else:
        # The oldest entry leaves the window `window` after the first acquire.
        assert denied.retry_after >= window - elapsed - SLACK
        await env.advance((denied.retry_after + SLACK).total_seconds())
    assert (await call(sw.acquire(**env.kw))).allowed


async def test_log_refund_on_redis_and_sql(env: Env, unique_name: str) -> None:
    """A log-style refund gives the request back on Redis and on the SQL backend (the
    memory log keeps no refundable entries)."""
    sw = env.rl.SlidingWindow(
        unique_name, limit=2, window=timedelta(seconds=30), backend=env.backend
    )
    await call(sw.acquire(**env.kw))
    second = await call(sw.acquire(**env.kw))
    assert not (await call(sw.acquire(**env.kw))).allowed
    await call(sw.refund(second, **env.kw))
    assert (await call(sw.acquire(**env.kw))).allowed is (env.backend != "memory")


async def test_gcra_admits_limit_back_to_back_then_one_per_interval(
    env: Env, unique_name: str
) -> None:
    # Real stores: an interval of 2 s, far longer than six round trips take on a loaded
    # machine (a short one would let a request through before the denials are checked).
    window = timedelta(seconds=4) if not env.real_time else timedelta(seconds=8)
    interval = window / 4
    sw = env.rl.SlidingWindow(
        unique_name, limit=4, window=window, backend=env.backend, style="gcra"
    )
    decisions = [await call(sw.acquire(**env.kw)) for _ in range(4)]
    assert all(d.allowed and d.request_id is None for d in decisions)
    assert decisions[0].remaining == 3
    assert decisions[-1].remaining == 0
    denied = await call(sw.acquire(**env.kw))
    assert not denied.allowed
    assert timedelta(0) < denied.retry_after <= interval
    await call(sw.refund(decisions[0], **env.kw))  # GCRA refund is a no-op
    assert not (await call(sw.acquire(**env.kw))).allowed
    if not env.real_time:
        assert denied.retry_after == interval
        env.clock.advance(interval - timedelta(microseconds=1))
        assert not (await call(sw.acquire(**env.kw))).allowed
        env.clock.advance(timedelta(microseconds=1))
        assert (await call(sw.acquire(**env.kw))).allowed
        assert not (await call(sw.acquire(**env.kw))).allowed
    else:
        await env.advance((denied.retry_after + SLACK).total_seconds())
        assert (await call(sw.acquire(**env.kw))).allowed


@pytest.mark.parametrize("style", ["log", "gcra"])
async def test_sliding_window_peek_and_reset(env: Env, unique_name: str, style: str) -> None:
    window = timedelta(seconds=30)
    sw = env.rl.SlidingWindow(unique_name, limit=3, window=window, backend=env.backend, style=style)
    fresh = await call(sw.peek(**env.kw))
    assert (fresh.remaining, fresh.is_exhausted, fresh.limit, fresh.window, fresh.style) == (
        3,
        False,
        3,
        window,
        style,
    )
    assert fresh.capacity is None
    assert fresh.refill_per_second is None
    for _ in range(3):
        await call(sw.acquire(**env.kw))
    state = await call(sw.peek(**env.kw))
    assert state.is_exhausted
    assert state.remaining == 0
    assert state.retry_after > timedelta(0)
    await call(sw.reset(**env.kw))
    assert (await call(sw.peek(**env.kw))).remaining == 3
    assert (await call(sw.acquire(**env.kw))).allowed


# -- Registry ---------------------------------------------------------------------------


async def test_registry_peek_reset_and_context_manager(env: Env, unique_name: str) -> None:
    reg = env.rl.RateLimitRegistry()
    tb = env.rl.TokenBucket(
        unique_name + "_tb", capacity=2, refill_per_second=0, backend=env.backend
    )
    sw = env.rl.SlidingWindow(
        unique_name + "_sw", limit=2, window=timedelta(seconds=30), backend=env.backend
    )
    reg.register(tb)
    reg.register(sw)
    reg.register(env.reservation(unique_name + "_tb", slots=1, lease=30))  # other namespace
    for _ in range(3):
        cm = reg.acquire(tb.name, **env.kw)
        if env.flavour == "async":
            async with cm as decision:
                pass
        else:
            with cm as decision:
                pass
    assert not decision.allowed  # two allowed, no refund on exit, third denied
    states = await call(reg.peek_all(**env.kw))
    assert set(states) == {tb.name, sw.name}
    assert states[tb.name].is_exhausted
    assert states[sw.name].remaining == 2
    await call(reg.reset(tb.name, **env.kw))
    assert (await call(reg.peek(tb.name, **env.kw))).tokens_remaining == 2
    reg.register(env.reservation(unique_name + "_res_only", slots=1, lease=30))
    for name, error in ((unique_name + "_res_only", TypeError), ("nope", KeyError)):
        cm = reg.acquire(name, **env.kw)
        with pytest.raises(error):
            await call(cm.__aenter__() if env.flavour == "async" else cm.__enter__())


async def test_acquire_for_actor_composes_and_rolls_back(slot_env: Env, unique_name: str) -> None:
    env = slot_env
    reg = env.rl.RateLimitRegistry()
    res = env.reservation(unique_name + "_slots", slots=2, lease=30)
    tb = env.rl.TokenBucket(
        unique_name + "_tb", capacity=3, refill_per_second=0, backend=env.backend
    )
    fixed = env.rl.TokenBucket(
        unique_name + "_fixed", capacity=1, refill_per_second=0, backend=env.backend
    )
    for p in (res, tb, fixed):
        reg.register(p)
    actor = SimpleNamespace(name="a", reservations=[res.name], rate_limits=[tb.name, fixed.name])
    worker = uuid.uuid4()
    kw = {"job_id": uuid.uuid4(), "worker_id": worker, **env.kw}
    got = await call(reg.acquire_for_actor(actor, {}, **kw))
    assert [h.name for h in got] == [res.name, tb.name, fixed.name]
    assert got[0].slot_index in range(2)
    # `fixed` is exhausted: the slot and tb's token taken before it are given back.
    with pytest.raises(ReservationUnavailable) as info:
        await call(reg.acquire_for_actor(actor, {}, **kw))
    assert info.value.bucket_name == fixed.name
    assert info.value.retry_after == DEFAULT_RESERVATION_BACKOFF
    held = await call(res.held(env.pool))
    assert [h.slot_index for h in held] == [got[0].slot_index]
    tokens = (await call(tb.peek(**env.kw))).tokens_remaining
    assert tokens == 2  # the token taken before the denial was given back (every backend)
    await call(reg.release_for_actor(got, worker_id=worker, **env.kw))
    assert await call(res.held(env.pool)) == []


# -- ConcurrencyReservation -------------------------------------------------------------


async def test_reservation_slots_release_and_leases(slot_env: Env, unique_name: str) -> None:
    env = slot_env
    # A lease no scheduling delay can run out; time passes by env.lapse_slots instead.
    lease = 60
    res = env.reservation(unique_name, slots=3, lease=lease)
    worker, other = uuid.uuid4(), uuid.uuid4()
    before = await env.now()
    slots = [await call(res.acquire(uuid.uuid4(), worker, env.pool)) for _ in range(3)]
    after = await env.now()
    assert sorted(slots) == [0, 1, 2]
    # Each lease ends `lease` after its acquire by the store's clock (SQLite's counts ms).
    tolerance = timedelta(milliseconds=1 if env.real_time else 0)
    held = await call(res.held(env.pool))
    assert [h.slot_index for h in held] == [0, 1, 2]
    for h in held:
        assert before + timedelta(seconds=lease) - tolerance <= h.lease_expires_at
        assert h.lease_expires_at <= after + timedelta(seconds=lease) + tolerance
    with pytest.raises(ReservationUnavailable) as info:
        await call(res.acquire(uuid.uuid4(), worker, env.pool))
    assert info.value.bucket_name == unique_name
    assert timedelta(0) <= info.value.retry_after <= timedelta(seconds=lease)
    await call(res.release(1, other, env.pool))  # not the holder: no-op
    assert len(await call(res.held(env.pool))) == 3
    await call(res.release(1, worker, env.pool))
    await call(res.release(1, worker, env.pool))  # double release is harmless
    assert await call(res.acquire(None, other, env.pool)) == 1
    await env.lapse_slots(unique_name, lease + 0.05)  # every lease lapses
    assert await call(res.held(env.pool)) == []
    assert await call(res.acquire(None, other, env.pool)) == 0


@pytest.mark.parametrize("slot_store", ["postgres", "sqlite"])
async def test_sync_slots_reconciles_rows(slot_env: Env, unique_name: str) -> None:
    env = slot_env
    big = env.rl.ConcurrencyReservation(unique_name, slots=3, lease=60)
    assert await call(env.rl.sync_slots([big], env.pool)) == env.rl.SyncResult(3, 0, 0)
    assert await call(env.rl.sync_slots([big], env.pool)) == env.rl.SyncResult(0, 0, 0)
    worker = uuid.uuid4()
    for _ in range(3):
        await call(big.acquire(None, worker, env.pool))
    await call(big.release(1, worker, env.pool))
    small = env.rl.ConcurrencyReservation(unique_name, slots=1, lease=60)
    # slot 1 is free (deleted), slot 2 is held (kept until released)
    assert await call(env.rl.sync_slots([small], env.pool)) == env.rl.SyncResult(0, 1, 1)
