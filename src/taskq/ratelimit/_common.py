"""Argument checks and small conversions shared by the primitives (pure)."""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Any, Final, Literal

from taskq.clock import Clock
from taskq.ratelimit._algorithms import to_us, us_to_timedelta
from taskq.ratelimit.decision import RateLimitBackend, RateLimitDecision

__all__ = [
    "ALLOWED_WAIT",
    "check_count",
    "check_number",
    "decision",
    "memory_now_us",
    "missing_clock",
    "redis_decision",
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


def missing_clock(name: str) -> RuntimeError:
    """The error for a memory-backend call made without ``clock=``."""
    return RuntimeError(f'{name!r} uses backend="memory": pass clock= (a Clock or FakeClock)')


def memory_now_us(clock: Clock | None, name: str) -> int:
    """The injected clock's time for the memory backend; ``RuntimeError`` when absent."""
    if clock is None:
        raise missing_clock(name)
    return to_us(clock.now())


def require_engine(pg_pool: Any, name: str) -> Any:
    """The engine for the postgres backend; ``RuntimeError`` when absent."""
    if pg_pool is None:
        raise RuntimeError(f'{name!r} uses backend="postgres": pass pg_pool= (a SQLAlchemy engine)')
    return pg_pool


def retry(us: float | None) -> timedelta | None:
    """A wait in microseconds as a timedelta (``None`` stays ``None``)."""
    return None if us is None else us_to_timedelta(us)


ALLOWED_WAIT: Final = timedelta(0)
"""The ``retry_after`` of every allowed decision (one shared, immutable value)."""

_YES: Final = (b"1", "1")


def redis_decision(
    name: str, reply: bytes | str, request_id: str | None = None
) -> RateLimitDecision:
    """The decision a script replied (``"1 <value>"`` or ``"0 <value> <wait_us>"``).

    ``str`` replies come from clients made with ``decode_responses=True``. A negative wait
    means the state never recovers on its own (``retry_after=None``).
    """
    parts = reply.split()
    if parts[0] in _YES:
        return RateLimitDecision(True, float(parts[1]), ALLOWED_WAIT, name, "redis", request_id)
    wait = float(parts[2])
    return RateLimitDecision(
        False,
        max(0.0, float(parts[1])),
        None if wait < 0 else us_to_timedelta(wait),
        name,
        "redis",
    )


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
        allowed,
        max(0.0, float(remaining)),
        ALLOWED_WAIT if allowed else retry(retry_us),
        name,
        backend,
        request_id if allowed else None,
    )


Style = Literal["log", "gcra"]
