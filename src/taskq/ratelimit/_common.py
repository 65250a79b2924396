"""Argument checks and small conversions shared by the primitives (pure)."""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Any, Literal

from taskq.ratelimit._algorithms import to_us, us_to_timedelta
from taskq.ratelimit.decision import RateLimitBackend, RateLimitDecision
from taskq.testing.clock import Clock

__all__ = [
    "check_count",
    "check_number",
    "decision",
    "memory_now_us",
    "require_engine",
    "retry",
]


def check_number(value: object, what: str, *, minimum: float, strict: bool) -> float:
    """``value`` as a finite float ``> minimum`` (``strict``) or ``>= minimum``."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{what} must be a number, got {type(value).__name__}")
    number = float(value)
    ok = number > minimum if strict else number >= minimum
    if not math.isfinite(number) or not ok:
        raise ValueError(f"{what} must be {'>' if strict else '>='} {minimum:g}, got {value!r}")
    return number


def check_count(count: object, capacity: float) -> float:
    """A token count to take or give back: ``0 < count <= capacity``."""
    number = check_number(count, "count", minimum=0, strict=True)
    if number > capacity:
        raise ValueError(f"count {number:g} exceeds capacity {capacity:g}: it could never pass")
    return number


def memory_now_us(clock: Clock | None, name: str) -> int:
    """The injected clock's time for the memory backend; ``RuntimeError`` when absent."""
    if clock is None:
        raise RuntimeError(f'{name!r} uses backend="memory": pass clock= (a Clock or FakeClock)')
    return to_us(clock.now())


def require_engine(pg_pool: Any, name: str) -> Any:
    """The engine for the postgres backend; ``RuntimeError`` when absent."""
    if pg_pool is None:
        raise RuntimeError(f'{name!r} uses backend="postgres": pass pg_pool= (a SQLAlchemy engine)')
    return pg_pool


def retry(us: float | None) -> timedelta | None:
    """A wait in microseconds as a timedelta (``None`` stays ``None``)."""
    return None if us is None else us_to_timedelta(us)


def decision(
    name: str,
    backend: RateLimitBackend,
    allowed: bool,
    remaining: float,
    retry_us: float | None,
    request_id: str | None = None,
) -> RateLimitDecision:
    """Build a decision; allowed ones always wait ``timedelta(0)``."""
    return RateLimitDecision(
        allowed=allowed,
        remaining=max(0.0, float(remaining)),
        retry_after=timedelta(0) if allowed else retry(retry_us),
        bucket_name=name,
        backend=backend,
        request_id=request_id if allowed else None,
    )


Style = Literal["log", "gcra"]
