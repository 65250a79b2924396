"""Hypothesis state machines: each algorithm against a reference model in exact arithmetic.

The models are the definition of the maths (``Fraction``s, integer microseconds); the
primitives run on the memory backend driven by a ``FakeClock``. Random acquire, advance
(backwards too), refund and reset steps must give the same allowed/denied answers and
the same ``retry_after`` to the microsecond.
"""

from __future__ import annotations

import math
from collections.abc import Coroutine
from datetime import UTC, datetime, timedelta
from fractions import Fraction
from typing import Any, TypeVar

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from taskq.ratelimit import RateLimitDecision, SlidingWindow, TokenBucket
from taskq.testing.clock import FakeClock

T = TypeVar("T")
START = datetime(2025, 1, 1, tzinfo=UTC)
US = 1_000_000


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Drive a memory-backend coroutine, which never suspends, to its result."""
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    raise AssertionError("the memory backend suspended")


def wait_us(decision: RateLimitDecision) -> int | None:
    assert decision.retry_after is not None or not decision.allowed
    return (
        None if decision.retry_after is None else decision.retry_after // timedelta(microseconds=1)
    )


advance_ms = st.integers(min_value=-500, max_value=5_000)
SETTINGS = settings(max_examples=40, stateful_step_count=40, deadline=None)


class TokenBucketMachine(RuleBasedStateMachine):
    """Reference: refill ``elapsed * rate`` capped at capacity; time never counted twice."""

    @initialize(
        capacity=st.integers(1, 10),
        rate=st.sampled_from([0, Fraction(1, 2), 1, 2, 4, 5, 10]),
    )
    def setup(self, capacity: int, rate: Fraction | int) -> None:
        self.clock = FakeClock(START)
        self.now = 0
        self.capacity, self.rate = capacity, Fraction(rate)
        self.tb = TokenBucket(
            "m", capacity=capacity, refill_per_second=float(rate), backend="memory"
        )
        self.tokens: Fraction | None = None
        self.ts = 0
        self.last: RateLimitDecision | None = None

    def _current(self) -> Fraction:
        if self.tokens is None:
            return Fraction(self.capacity)
        elapsed = max(0, self.now - self.ts)
        return min(Fraction(self.capacity), self.tokens + elapsed * self.rate / US)

    def _refill(self) -> Fraction:
        """Bring the model to now (what every write operation does)."""
        current = self._current()
        self.ts = self.now if self.tokens is None else max(self.ts, self.now)
        self.tokens = current
        return current

    @rule(ms=advance_ms)
    def advance(self, ms: int) -> None:
        self.clock.advance(timedelta(milliseconds=ms))
        self.now += ms * 1000

    @rule(count=st.sampled_from([1, Fraction(1, 2), 2]))
    def acquire(self, count: Fraction | int) -> None:
        if count > self.capacity:
            return
        got = run(self.tb.acquire(float(count), clock=self.clock))
        current = self._refill()
        if current >= count:
            self.tokens = current - count
            assert got.allowed
            assert got.retry_after == timedelta(0)
            assert math.isclose(got.remaining, self.tokens, abs_tol=1e-6)
            self.last = got
        else:
            assert not got.allowed
            expected = None if self.rate == 0 else math.ceil((count - current) * US / self.rate)
            assert wait_us(got) == expected

    @rule()
    def refund(self) -> None:
        if self.last is None:
            return
        run(self.tb.refund(self.last, count=1.0, clock=self.clock))
        self.tokens = min(Fraction(self.capacity), self._refill() + 1)
        self.last = None

    @rule()
    def reset(self) -> None:
        run(self.tb.reset())
        self.tokens = None

    @invariant()
    def peek_agrees(self) -> None:
        if not hasattr(self, "tb"):
            return
        state = run(self.tb.peek(clock=self.clock))  # changes nothing, in either world
        assert math.isclose(state.tokens_remaining, self._current(), abs_tol=1e-6)


class GcraMachine(RuleBasedStateMachine):
    """Reference: GCRA with emission interval ``window / limit`` and tolerance ``window - T``."""

    @initialize(limit=st.integers(1, 50), window_ms=st.integers(1, 10_000))
    def setup(self, limit: int, window_ms: int) -> None:
        self.clock = FakeClock(START)
        self.now = 0
        self.limit, self.window = limit, window_ms * 1000
        self.sw = SlidingWindow(
            "g",
            limit=limit,
            window=timedelta(milliseconds=window_ms),
            backend="memory",
            style="gcra",
        )
        self.tat: Fraction | None = None

    @rule(ms=advance_ms)
    def advance(self, ms: int) -> None:
        self.clock.advance(timedelta(milliseconds=ms))
        self.now += ms * 1000

    @rule(us=st.integers(0, 2_000))
    def advance_us(self, us: int) -> None:
        self.clock.advance(timedelta(microseconds=us))
        self.now += us

    @rule()
    def acquire(self) -> None:
        got = run(self.sw.acquire(clock=self.clock))
        interval = Fraction(self.window, self.limit)
        base = self.now if self.tat is None else max(self.tat, Fraction(self.now))
        new_tat = base + interval
        allow_at = new_tat - self.window
        if self.now >= allow_at:
            self.tat = new_tat
            assert got.allowed
            assert got.remaining == math.floor((self.now + self.window - new_tat) / interval)
        else:
            assert not got.allowed
            assert wait_us(got) == math.ceil(allow_at - self.now)
        assert got.request_id is None

    @rule()
    def refund_is_a_noop(self) -> None:
        run(
            self.sw.refund(
                RateLimitDecision(True, 0, timedelta(0), "g", "memory"), clock=self.clock
            )
        )

    @rule()
    def reset(self) -> None:
        run(self.sw.reset())
        self.tat = None


class LogMachine(RuleBasedStateMachine):
    """Reference: a list of accepted timestamps; the window is ``(now - window, now]``."""

    @initialize(limit=st.integers(1, 8), window_ms=st.integers(1, 3_000))
    def setup(self, limit: int, window_ms: int) -> None:
        self.clock = FakeClock(START)
        self.now = 0
        self.limit, self.window = limit, window_ms * 1000
        self.sw = SlidingWindow(
            "l", limit=limit, window=timedelta(milliseconds=window_ms), backend="memory"
        )
        self.entries: list[int] = []
        self.last: RateLimitDecision | None = None

    @rule(ms=advance_ms)
    def advance(self, ms: int) -> None:
        self.clock.advance(timedelta(milliseconds=ms))
        self.now += ms * 1000

    @rule()
    def acquire(self) -> None:
        got = run(self.sw.acquire(clock=self.clock))
        self.entries = [t for t in self.entries if t > self.now - self.window]
        if len(self.entries) < self.limit:
            assert got.allowed
            assert got.request_id is not None
            assert got.remaining == self.limit - len(self.entries) - 1
            self.entries.append(self.now)
            self.last = got
        else:
            assert not got.allowed
            assert got.request_id is None
            assert wait_us(got) == min(self.entries) + self.window - self.now

    @rule()
    def refund_is_a_noop_on_memory(self) -> None:
        if self.last is not None:
            run(self.sw.refund(self.last, clock=self.clock))

    @rule()
    def reset(self) -> None:
        run(self.sw.reset())
        self.entries = []


TestTokenBucketModel = TokenBucketMachine.TestCase
TestTokenBucketModel.settings = SETTINGS
TestGcraModel = GcraMachine.TestCase
TestGcraModel.settings = SETTINGS
TestLogModel = LogMachine.TestCase
TestLogModel.settings = SETTINGS
