"""Construction rules, clocks and the memory-backend contract (no services)."""

from __future__ import annotations

import logging
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from taskq.constants import DEFAULT_RESERVATION_BACKOFF
from taskq.exceptions import RedisUnavailableError, ReservationUnavailable
from taskq.ratelimit import (
    ConcurrencyReservation,
    RateLimitDecision,
    RateLimitRef,
    ReservationRef,
    SlidingWindow,
    TokenBucket,
)
from taskq.ratelimit._lua import EncodedCall, LuaScript, evalsha_command, redis_key
from taskq.ratelimit.decision import RateLimitState
from taskq.testing.clock import Clock, FakeClock, SystemClock

START = datetime(2025, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"capacity": 0, "refill_per_second": 1}, ValueError),
        ({"capacity": -1, "refill_per_second": 1}, ValueError),
        ({"capacity": 1, "refill_per_second": -0.1}, ValueError),
        ({"capacity": float("nan"), "refill_per_second": 1}, ValueError),
        ({"capacity": 1, "refill_per_second": 1, "backend": "mongo"}, ValueError),
    ],
)
def test_token_bucket_rejects_bad_config(kwargs: dict[str, object], error: type[Exception]) -> None:
    with pytest.raises(error):
        TokenBucket("b", **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"limit": 0, "window": timedelta(seconds=1)}, ValueError),
        ({"limit": 1, "window": timedelta(0)}, ValueError),
        ({"limit": 1, "window": timedelta(seconds=-1)}, ValueError),
        ({"limit": 1, "window": timedelta(seconds=1), "style": "fixed"}, ValueError),
        ({"limit": 1.5, "window": timedelta(seconds=1)}, TypeError),
    ],
)
def test_sliding_window_rejects_bad_config(
    kwargs: dict[str, object], error: type[Exception]
) -> None:
    with pytest.raises(error):
        SlidingWindow("w", **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("slots", "lease"), [(0, 10), (-1, 10), (1, 0), (1, -5), (1, timedelta(0))]
)
def test_reservation_rejects_bad_config(slots: int, lease: float | timedelta) -> None:
    with pytest.raises(ValueError):
        ConcurrencyReservation("r", slots=slots, lease=lease)


@pytest.mark.parametrize("name", ["", "has space", "semi;colon", "a" * 201, "{brace}", "-lead"])
def test_names_are_validated_before_reaching_a_key_or_query(name: str) -> None:
    with pytest.raises(ValueError):
        TokenBucket(name, capacity=1, refill_per_second=1)
    with pytest.raises(ValueError):
        SlidingWindow(name, limit=1, window=timedelta(seconds=1))
    with pytest.raises(ValueError):
        ConcurrencyReservation(name, slots=1, lease=1)
    with pytest.raises(ValueError):
        RateLimitRef(name=name)


@pytest.mark.parametrize("name", ["geocode-global", "taskq:global:queue:q1", "a.b_c", "9lives"])
def test_names_the_page_uses_are_accepted(name: str) -> None:
    assert ConcurrencyReservation(name, slots=1, lease=1).name == name
    assert TokenBucket(name, capacity=1, refill_per_second=0).name == name


def test_redis_keys_share_one_cluster_slot_per_primitive() -> None:
    assert redis_key("stripe", "tb") == "taskq:rl:{stripe}:tb"
    assert (
        TokenBucket("stripe", capacity=1, refill_per_second=1).redis_key == "taskq:rl:{stripe}:tb"
    )
    assert SlidingWindow("s", limit=1, window=timedelta(seconds=1)).redis_key == "taskq:rl:{s}:log"


def test_default_ttls_follow_the_page_and_never_reach_zero() -> None:
    assert TokenBucket("a", capacity=100, refill_per_second=10).ttl_seconds == 20 + 60
    assert TokenBucket("a", capacity=100, refill_per_second=0).ttl_seconds == 86_400
    assert TokenBucket("a", capacity=1, refill_per_second=1, ttl=timedelta(0)).ttl_seconds == 1
    assert (
        TokenBucket("a", capacity=1, refill_per_second=1, ttl=timedelta(milliseconds=1)).ttl_seconds
        == 1
    )
    minute = timedelta(minutes=1)
    assert SlidingWindow("w", limit=5, window=minute).ttl_seconds == 180
    assert SlidingWindow("w", limit=5, window=minute, style="gcra").ttl_seconds == 120
    assert SlidingWindow("w", limit=5, window=minute, ttl=timedelta(seconds=7)).ttl_seconds == 7


async def test_memory_backend_requires_a_clock() -> None:
    with pytest.raises(RuntimeError):
        await TokenBucket("m", capacity=1, refill_per_second=1, backend="memory").acquire()
    with pytest.raises(RuntimeError):
        await SlidingWindow("m", limit=1, window=timedelta(seconds=1), backend="memory").acquire()
    with pytest.raises(RuntimeError):
        await ConcurrencyReservation("m", slots=1, lease=1).acquire(None, uuid.uuid4())


async def test_store_backends_without_a_client_raise_clear_errors() -> None:
    with pytest.raises(RedisUnavailableError, match="redis_client"):
        await TokenBucket("r", capacity=1, refill_per_second=1).acquire()
    with pytest.raises(RuntimeError, match="pg_pool"):
        await TokenBucket("p", capacity=1, refill_per_second=1, backend="postgres").acquire()


async def test_page_example_token_bucket_refill() -> None:
    tb = TokenBucket(name="test", capacity=10, refill_per_second=10, backend="memory")
    clock = FakeClock(START)
    for _ in range(10):
        assert (await tb.acquire(clock=clock)).allowed
    r = await tb.acquire(clock=clock)
    assert not r.allowed
    assert r.retry_after == timedelta(milliseconds=100)
    clock.advance(timedelta(seconds=1))
    r = await tb.acquire(clock=clock)
    assert r.allowed
    assert r.remaining == 9


async def test_backward_clock_steps_refill_nothing_and_count_no_time_twice() -> None:
    tb = TokenBucket("b", capacity=2, refill_per_second=1, backend="memory")
    clock = FakeClock(START)
    await tb.acquire(clock=clock)
    await tb.acquire(clock=clock)
    clock.advance(-5)
    assert not (await tb.acquire(clock=clock)).allowed
    clock.advance(5.5)  # back to START + 0.5 s: half a token, not 5.5
    assert not (await tb.acquire(clock=clock)).allowed
    clock.advance(0.5)
    assert (await tb.acquire(clock=clock)).allowed


async def test_memory_fixed_quota_stays_exhausted_until_reset() -> None:
    tb = TokenBucket("q", capacity=1, refill_per_second=0, backend="memory")
    clock = FakeClock(START)
    assert (await tb.acquire(clock=clock)).allowed
    clock.advance(timedelta(days=30))
    denied = await tb.acquire(clock=clock)
    assert not denied.allowed
    assert denied.retry_after is None
    await tb.reset()
    assert (await tb.acquire(clock=clock)).allowed


def test_fake_clock() -> None:
    clock = FakeClock(START)
    assert isinstance(clock, Clock)
    assert isinstance(SystemClock(), Clock)
    assert clock.now() == START
    assert clock.monotonic() == 0
    clock.advance(timedelta(seconds=2))
    clock.advance(-1)
    assert clock.now() == START + timedelta(seconds=1)
    assert clock.monotonic() == 1
    clock.set(START - timedelta(hours=1))
    assert clock.now() == START - timedelta(hours=1)
    assert SystemClock().now().tzinfo is not None
    with pytest.raises(ValueError):
        FakeClock(datetime(2025, 1, 1))


def test_decision_and_state_are_frozen_values() -> None:
    d = RateLimitDecision(True, 1.0, timedelta(0), "b", "memory")
    assert d.request_id is None
    with pytest.raises(AttributeError):
        d.allowed = False  # type: ignore[misc]
    assert RateLimitState.__dataclass_params__.frozen  # type: ignore[attr-defined]


def test_refs_are_validated_models() -> None:
    assert RateLimitRef(name="stripe_api", count=2.0).count == 2.0
    assert ReservationRef(name="gpu_slots").name == "gpu_slots"
    with pytest.raises(ValueError):
        RateLimitRef(name="x", count=0)


async def test_reservation_unavailable_retry_after_is_time_to_soonest_lease_end() -> None:
    clock = FakeClock(START)
    res = ConcurrencyReservation("gpu", slots=2, lease=timedelta(seconds=60), clock=clock)
    w = uuid.uuid4()
    assert await res.acquire(uuid.uuid4(), w) == 0
    clock.advance(10)
    assert await res.acquire(uuid.uuid4(), w) == 1
    with pytest.raises(ReservationUnavailable) as info:
        await res.acquire(uuid.uuid4(), w)
    assert info.value.retry_after == timedelta(seconds=50)
    assert await res.renew(0, w)
    assert not await res.renew(1, uuid.uuid4())
    clock.advance(55)  # both run until +70 s now: slot 0 was renewed at +10 s
    with pytest.raises(ReservationUnavailable) as info:
        await res.acquire(None, w)
    assert info.value.retry_after == timedelta(seconds=5)
    clock.advance(5)
    assert await res.acquire(None, w) == 0
    assert timedelta(seconds=5) == DEFAULT_RESERVATION_BACKOFF


def test_lease_shorter_than_lock_lease_warns(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="taskq.ratelimit"):
        ConcurrencyReservation("r", slots=1, lease=5, lock_lease=timedelta(seconds=60))
    assert [r.levelno for r in caplog.records] == [logging.WARNING]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="taskq.ratelimit"):
        ConcurrencyReservation("r", slots=1, lease=120, lock_lease=timedelta(seconds=60))
    assert caplog.records == []


def test_queue_cap_reservation_name() -> None:
    from taskq.ratelimit.refs import queue_concurrency_reservation_name

    assert queue_concurrency_reservation_name("external-api") == "taskq:global:queue:external-api"
    with pytest.raises(ValueError):
        queue_concurrency_reservation_name("bad:queue")


async def test_redis_backend_without_the_extra_says_how_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import importlib.util

    from taskq.exceptions import RedisExtraMissing

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "redis" else real(name, *a)
    )
    with pytest.raises(ImportError, match=r'pip install "taskq-py\[redis\]"') as info:
        await TokenBucket("r", capacity=1, refill_per_second=1).acquire()
    assert isinstance(info.value, RedisExtraMissing)
    assert isinstance(info.value, RuntimeError)


def test_an_encoded_call_follows_its_scripts_sha() -> None:
    """The pre-encoded hot-path EVALSHA is the RESP form of the call, and it is encoded
    again when the script's sha changes (a NOSCRIPT reload replaces it)."""
    script = LuaScript("return 1")
    call = EncodedCall(script, (b"key", b"10", b"60"))
    first = call.command()
    assert first == (
        b"*6\r\n$7\r\nEVALSHA\r\n$40\r\n" + script.sha + b"\r\n$1\r\n1\r\n"
        b"$3\r\nkey\r\n$2\r\n10\r\n$2\r\n60\r\n"
    )
    assert call.command() is first  # encoded once while the sha stands
    script.sha = b"f" * 40
    assert call.command() == evalsha_command(b"f" * 40, b"key", b"10", b"60")
