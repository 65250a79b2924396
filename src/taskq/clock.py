"""Clocks: the :class:`Clock` protocol and the real :class:`SystemClock`.

The memory rate-limit backend, in-memory reservations and the worker's resource waits
read time only through a ``Clock``, so tests can drive them deterministically with
:class:`taskq.testing.clock.FakeClock` instead of sleeping. Store-backed primitives
ignore the clock and use the store's own.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Protocol, runtime_checkable

__all__ = ["Clock", "SystemClock"]


@runtime_checkable
class Clock(Protocol):
    """A source of time: wall-clock ``now()`` (aware, UTC) and a ``monotonic()`` reading."""

    def now(self) -> datetime:
        """The current time as an aware UTC datetime."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock that only the clock's owner can move backwards."""
        ...


class SystemClock:
    """The real clock: ``datetime.now(UTC)`` and ``time.monotonic()``."""

    def now(self) -> datetime:
        """The current wall-clock time in UTC."""
        return datetime.now(UTC)

    def monotonic(self) -> float:
        """``time.monotonic()``."""
        return time.monotonic()
