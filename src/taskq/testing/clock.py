""":class:`FakeClock`, a clock tests move by hand, and the clock protocol it implements.

The memory rate-limit backend and in-memory reservations read time only through a
``Clock`` (defined in :mod:`taskq.clock` with the real :class:`SystemClock`, both
re-exported here), so tests drive them deterministically by advancing a
:class:`FakeClock` instead of sleeping. Store-backed primitives ignore the clock and use
the store's own.
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

from taskq.clock import Clock, SystemClock

__all__ = ["Clock", "FakeClock", "SystemClock"]


class FakeClock:
    """A clock that moves only when told to, for deterministic tests.

    ``monotonic()`` follows ``now()`` (seconds since ``start``), so an ``advance`` moves
    both. Thread-safe, so a test may share one across threads.
    """

    def __init__(self, start: datetime | None = None) -> None:
        start = start if start is not None else datetime(2025, 1, 1, tzinfo=UTC)
        if start.tzinfo is None:
            raise ValueError("FakeClock(start) needs an aware datetime")
        self._start = start.astimezone(UTC)
        self._now = self._start
        self._lock = threading.Lock()

    def now(self) -> datetime:
        """The clock's current time."""
        with self._lock:
            return self._now

    def monotonic(self) -> float:
        """Seconds between ``start`` and the current time."""
        with self._lock:
            return (self._now - self._start).total_seconds()

    def advance(self, delta: timedelta | float) -> datetime:
        """Move the clock by ``delta`` (a timedelta or seconds; negative allowed); return now."""
        step = delta if isinstance(delta, timedelta) else timedelta(seconds=delta)
        with self._lock:
            self._now += step
            return self._now

    def set(self, dt: datetime) -> None:
        """Jump to ``dt`` (aware), forwards or backwards."""
        if dt.tzinfo is None:
            raise ValueError("FakeClock.set() needs an aware datetime")
        with self._lock:
            self._now = dt.astimezone(UTC)
