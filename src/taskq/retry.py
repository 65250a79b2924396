"""Retry policy: what to do with a failed attempt, and how long to wait before the next.

Everything here is pure (no I/O, no clock reads): the worker passes the attempt numbers,
elapsed time and a random source in, and gets a :class:`RetryDecision` back. That keeps
the decision testable without a worker and identical in every process.
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal, Protocol

from taskq.exceptions import PayloadValidationError, RetryAfter, Snooze

__all__ = [
    "BackoffShape",
    "OnCancel",
    "OnRetryExhausted",
    "OnSuccess",
    "RetryClassifierHook",
    "RetryDecision",
    "RetryKind",
    "RetryOverride",
    "RetryPolicy",
    "decide_retry",
]

RetryKind = Literal["transient", "indefinite", "non_retryable"]
BackoffShape = Literal["exponential", "linear", "fixed"]

_KINDS: tuple[str, ...] = ("transient", "indefinite", "non_retryable")
_SHAPES: tuple[str, ...] = ("exponential", "linear", "fixed")


class _Uniform(Protocol):
    def uniform(self, a: float, b: float) -> float: ...


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How the worker retries a failed job. Validated at construction (``ValueError``).

    ``kind="transient"`` retries up to ``max_attempts`` attempts in all; ``"indefinite"``
    retries until ``time_budget`` (or the job's ``schedule_to_close``) runs out;
    ``"non_retryable"`` fails on the first error.
    """

    kind: RetryKind = "transient"
    max_attempts: int = 3
    backoff: BackoffShape = "exponential"
    base: timedelta = timedelta(seconds=5)
    cap: timedelta = timedelta(hours=1)
    jitter: float = 0.2
    time_budget: timedelta | None = None

    def __post_init__(self) -> None:
        if self.kind not in _KINDS:
            raise ValueError(f"RetryPolicy.kind must be one of {_KINDS}, got {self.kind!r}")
        if self.backoff not in _SHAPES:
            raise ValueError(f"RetryPolicy.backoff must be one of {_SHAPES}, got {self.backoff!r}")
        if isinstance(self.max_attempts, bool) or not isinstance(self.max_attempts, int):
            raise ValueError("RetryPolicy.max_attempts must be an int")
        if self.max_attempts < 1:
            raise ValueError(f"RetryPolicy.max_attempts must be >= 1, got {self.max_attempts}")
        if not isinstance(self.base, timedelta) or self.base <= timedelta(0):
            raise ValueError("RetryPolicy.base must be a timedelta > 0")
        if not isinstance(self.cap, timedelta) or self.cap < self.base:
            raise ValueError("RetryPolicy.cap must be a timedelta >= base")
        if isinstance(self.jitter, bool) or not isinstance(self.jitter, int | float):
            raise ValueError("RetryPolicy.jitter must be a number")
        if not 0.0 <= float(self.jitter) <= 1.0:
            raise ValueError(f"RetryPolicy.jitter must be in [0.0, 1.0], got {self.jitter}")
        if self.time_budget is not None and (
            not isinstance(self.time_budget, timedelta) or self.time_budget <= timedelta(0)
        ):
            raise ValueError("RetryPolicy.time_budget must be None or a timedelta > 0")

    def raw_delay(self, attempt: int) -> timedelta:
        """The un-jittered delay after failed attempt number ``attempt`` (1-indexed), capped.

        exponential: ``base * 2**(attempt-1)``; linear: ``base * attempt``; fixed: ``base``.
        """
        n = max(1, attempt)
        base_s = self.base.total_seconds()
        cap_s = self.cap.total_seconds()
        if self.backoff == "exponential":
            seconds = base_s * 2.0 ** min(n - 1, 64)
        elif self.backoff == "linear":
            seconds = base_s * n
        else:
            seconds = base_s
        return timedelta(seconds=min(seconds, cap_s))

    def next_delay(self, attempt: int, rng: _Uniform | None = None) -> timedelta:
        """The delay before the attempt after ``attempt``: ``raw * uniform(1-j, 1+j)``, <= cap."""
        raw = self.raw_delay(attempt).total_seconds()
        j = float(self.jitter)
        factor = (rng or random).uniform(1.0 - j, 1.0 + j) if j else 1.0
        return timedelta(seconds=min(raw * factor, self.cap.total_seconds()))


@dataclass(frozen=True, slots=True)
class RetryOverride:
    """What a ``retry_classifier`` returns to refine one failure: a kind, a delay, or both."""

    kind: RetryKind | None = None
    delay: timedelta | None = None

    def __post_init__(self) -> None:
        if self.kind is not None and self.kind not in _KINDS:
            raise ValueError(f"RetryOverride.kind must be one of {_KINDS}, got {self.kind!r}")
        if self.delay is not None and (
            not isinstance(self.delay, timedelta) or self.delay < timedelta(0)
        ):
            raise ValueError("RetryOverride.delay must be None or a timedelta >= 0")


RetryClassifierHook = Callable[[BaseException, int], RetryOverride | None]
"""``(exception, attempt) -> RetryOverride | None``; ``None`` means "use the policy"."""

OnRetryExhausted = Callable[[Any, BaseException], Awaitable[None] | None]
"""``(job_row, exception)``: called after a job is marked failed with its budget spent."""
OnSuccess = Callable[[Any, Any], Awaitable[None] | None]
"""``(job_row, result)``: called after the success commits."""
OnCancel = Callable[[Any], Awaitable[None] | None]
"""``(job_row)``: called when a running job ends cancelled."""


@dataclass(frozen=True, slots=True)
class RetryDecision:
    """The outcome of :func:`decide_retry`.

    ``action`` is ``"retry"`` (reschedule after ``delay``), ``"snooze"`` (reschedule,
    never counted against the budget) or ``"fail"``. ``consume_budget`` says whether this
    attempt counts against ``max_attempts``. ``reason`` is a short machine-readable tag.
    """

    action: Literal["retry", "snooze", "fail"]
    delay: timedelta | None
    consume_budget: bool
    reason: str


def decide_retry(
    policy: RetryPolicy,
    exc: BaseException,
    *,
    attempt: int,
    budget_used: int,
    elapsed: timedelta = timedelta(0),
    schedule_to_close: timedelta | None = None,
    non_retryable_exceptions: tuple[type[BaseException], ...] = (),
    retry_classifier: RetryClassifierHook | None = None,
    rng: _Uniform | None = None,
) -> RetryDecision:
    """Decide what happens after attempt ``attempt`` raised ``exc``.

    ``budget_used`` counts the budget-consuming attempts *before* this one; ``elapsed`` is
    the time since the job was first enqueued. Order: ``Snooze`` → ``RetryAfter`` →
    ``PayloadValidationError`` / ``non_retryable_exceptions`` (fail) → ``retry_classifier``
    → the policy's kind and budget. A classifier that raises is ignored (policy applies).
    """
    if isinstance(exc, Snooze):
        return RetryDecision("snooze", exc.delay, False, "snooze")
    kind: RetryKind = policy.kind
    delay: timedelta | None = None
    consume = True
    reason = "policy"
    if isinstance(exc, RetryAfter):
        delay, consume, reason = exc.delay, exc.consume_budget, "retry_after"
    elif isinstance(exc, PayloadValidationError):
        return RetryDecision("fail", None, True, "payload_invalid")
    elif non_retryable_exceptions and isinstance(exc, non_retryable_exceptions):
        return RetryDecision("fail", None, True, "non_retryable_exception")
    elif retry_classifier is not None:
        try:
            override = retry_classifier(exc, attempt)
        except Exception:
            override = None
        if override is not None:
            kind = override.kind or kind
            delay = override.delay
            reason = "classifier"
    if kind == "non_retryable":
        return RetryDecision("fail", None, True, "non_retryable")
    used_after = budget_used + (1 if consume else 0)
    if delay is None:
        delay = policy.next_delay(max(1, used_after), rng)
    if kind == "transient" and used_after >= policy.max_attempts:
        return RetryDecision("fail", None, consume, "exhausted")
    if kind == "indefinite":
        budgets = [b for b in (policy.time_budget, schedule_to_close) if b is not None]
        if budgets and elapsed + delay > min(budgets):
            return RetryDecision("fail", None, consume, "time_budget_exhausted")
    return RetryDecision("retry", delay, consume, reason)
