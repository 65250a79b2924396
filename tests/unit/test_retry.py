"""RetryPolicy validation, the backoff formula and decide_retry's order of rules."""

from __future__ import annotations

import random
from datetime import timedelta
from typing import Any

import pytest
from pydantic import BaseModel

from taskq.exceptions import PayloadValidationError, RetryAfter, Snooze
from taskq.retry import RetryOverride, RetryPolicy, decide_retry

S = timedelta(seconds=1)


class _Mid:
    def uniform(self, a: float, b: float) -> float:
        return (a + b) / 2


class _High:
    def uniform(self, a: float, b: float) -> float:
        return b


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_attempts": 0},
        {"base": timedelta(0)},
        {"base": 10 * S, "cap": 5 * S},
        {"jitter": 1.5},
        {"jitter": -0.1},
        {"kind": "sometimes"},
        {"backoff": "random"},
        {"time_budget": timedelta(0)},
    ],
)
def test_invalid_policies_raise(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        RetryPolicy(**kwargs)  # type: ignore[arg-type]


def test_defaults() -> None:
    policy = RetryPolicy()
    assert (policy.kind, policy.max_attempts, policy.backoff) == ("transient", 3, "exponential")
    assert (policy.base, policy.cap, policy.jitter, policy.time_budget) == (
        5 * S,
        timedelta(hours=1),
        0.2,
        None,
    )


def test_backoff_shapes_and_cap() -> None:
    exp = RetryPolicy(base=10 * S, cap=60 * S, jitter=0)
    assert [exp.next_delay(n).total_seconds() for n in (1, 2, 3, 4)] == [10, 20, 40, 60]
    lin = RetryPolicy(backoff="linear", base=10 * S, cap=25 * S, jitter=0)
    assert [lin.next_delay(n).total_seconds() for n in (1, 2, 3)] == [10, 20, 25]
    fixed = RetryPolicy(backoff="fixed", base=7 * S, jitter=0)
    assert fixed.next_delay(9) == 7 * S


def test_jitter_is_symmetric_and_capped() -> None:
    policy = RetryPolicy(base=10 * S, cap=100 * S, jitter=0.2)
    assert policy.next_delay(1, _Mid()) == 10 * S
    assert policy.next_delay(1, _High()) == 12 * S
    assert policy.next_delay(10, _High()) == 100 * S  # never above cap
    rng = random.Random(1)
    for _ in range(200):
        assert 8 * S <= policy.next_delay(1, rng) <= 12 * S


def test_transient_budget() -> None:
    policy = RetryPolicy(max_attempts=3, jitter=0)
    first = decide_retry(policy, RuntimeError(), attempt=1, budget_used=0)
    assert (first.action, first.delay, first.consume_budget) == ("retry", 5 * S, True)
    assert decide_retry(policy, RuntimeError(), attempt=2, budget_used=1).action == "retry"
    assert decide_retry(policy, RuntimeError(), attempt=3, budget_used=2).action == "fail"


def test_control_flow_signals() -> None:
    policy = RetryPolicy(max_attempts=1)
    snooze = decide_retry(policy, Snooze(2 * S), attempt=5, budget_used=1)
    assert (snooze.action, snooze.delay, snooze.consume_budget) == ("snooze", 2 * S, False)
    free = decide_retry(policy, RetryAfter(3 * S, consume_budget=False), attempt=1, budget_used=0)
    assert (free.action, free.delay, free.consume_budget) == ("retry", 3 * S, False)
    spent = decide_retry(policy, RetryAfter(3 * S), attempt=1, budget_used=0)
    assert spent.action == "fail"


def test_non_retryable_paths() -> None:
    policy = RetryPolicy(max_attempts=10)
    assert (
        decide_retry(policy, PayloadValidationError("a", "bad"), attempt=1, budget_used=0).action
        == "fail"
    )
    decision = decide_retry(
        policy, KeyError(), attempt=1, budget_used=0, non_retryable_exceptions=(KeyError,)
    )
    assert decision.reason == "non_retryable_exception"
    assert (
        decide_retry(
            RetryPolicy(kind="non_retryable"), RuntimeError(), attempt=1, budget_used=0
        ).action
        == "fail"
    )


def test_classifier_override() -> None:
    policy = RetryPolicy(max_attempts=10, jitter=0)

    def classify(exc: BaseException, attempt: int) -> RetryOverride | None:
        if isinstance(exc, TimeoutError):
            return RetryOverride(delay=timedelta(seconds=attempt))
        if isinstance(exc, PermissionError):
            return RetryOverride(kind="non_retryable")
        return None

    assert (
        decide_retry(
            policy, TimeoutError(), attempt=4, budget_used=3, retry_classifier=classify
        ).delay
        == 4 * S
    )
    assert (
        decide_retry(
            policy, PermissionError(), attempt=1, budget_used=0, retry_classifier=classify
        ).action
        == "fail"
    )
    assert (
        decide_retry(
            policy, ValueError(), attempt=1, budget_used=0, retry_classifier=classify
        ).delay
        == 5 * S
    )


def test_indefinite_stops_at_time_budget() -> None:
    policy = RetryPolicy(kind="indefinite", base=10 * S, jitter=0, time_budget=timedelta(minutes=1))
    assert (
        decide_retry(policy, RuntimeError(), attempt=50, budget_used=49, elapsed=10 * S).action
        == "fail"
    )
    assert (
        decide_retry(policy, RuntimeError(), attempt=1, budget_used=0, elapsed=10 * S).action
        == "retry"
    )
    open_ended = RetryPolicy(kind="indefinite", jitter=0)
    assert decide_retry(open_ended, RuntimeError(), attempt=500, budget_used=499).action == "retry"
    assert (
        decide_retry(
            open_ended, RuntimeError(), attempt=1, budget_used=0, schedule_to_close=S
        ).action
        == "fail"
    )


def test_snooze_and_retry_after_validate() -> None:
    with pytest.raises(ValueError, match="delay"):
        Snooze(timedelta(seconds=-1))
    with pytest.raises(ValueError, match="delay"):
        RetryAfter(timedelta(seconds=-1))


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"kind": "sometimes"}, "kind"),
        ({"delay": timedelta(seconds=-1)}, "delay"),
        ({"delay": 5}, "delay"),
    ],
)
def test_retry_override_is_validated(kwargs: dict[str, object], fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        RetryOverride(**kwargs)  # type: ignore[arg-type]


def test_a_retry_classifier_must_be_callable() -> None:
    from taskq import actor

    class Body(BaseModel):
        n: int

    async def classified_badly(payload: Body) -> None: ...

    options: dict[str, Any] = {"name": "classified_badly", "retry_classifier": "transient"}
    with pytest.raises(TypeError, match="retry_classifier"):
        actor(**options)(classified_badly)
