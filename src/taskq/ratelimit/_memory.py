"""In-process state of the ``"memory"`` backend, one object per primitive.

Every operation is a short synchronous critical section under a ``threading.Lock``: it
never awaits, so the same lock protects it from other threads (the sync facade under a
threaded WSGI server) and is never held across an event-loop switch.
"""

from __future__ import annotations

import bisect
import threading
from dataclasses import dataclass
from uuid import UUID

from taskq._ids import new_request_id
from taskq.ratelimit._algorithms import (
    EPS_TOKENS,
    GcraResult,
    TokenResult,
    gcra_step,
    log_decide,
    tb_step,
)

__all__ = ["MemoryGcra", "MemoryLog", "MemoryReservation", "MemoryTokenBucket", "SlotHolder"]


class MemoryTokenBucket:
    """Tokens and the time they were counted at; ``None`` means full."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tokens: float | None = None
        self._ts: int | None = None

    def take(
        self, now_us: int, capacity: float, rate: float, count: float
    ) -> tuple[bool, float, float | None]:
        """Refill, then take ``count`` tokens if there are enough: ``(allowed, tokens, retry_us)``.

        The acquire hot path: :func:`~taskq.ratelimit._algorithms.tb_step` inlined (same
        operations in the same order, so the same floats), with no result object.
        """
        with self._lock:
            tokens = self._tokens
            ts = self._ts
            if tokens is None or ts is None:
                tokens = capacity
                ts = now_us
            elapsed = now_us - ts if now_us > ts else 0
            current = tokens + elapsed * rate / 1_000_000
            if current > capacity:
                current = capacity
            if now_us > ts:
                ts = now_us
            if current + EPS_TOKENS >= count:
                left = current - count if current > count else 0.0
                self._tokens, self._ts = left, ts
                return True, left, 0.0
            self._tokens, self._ts = current, ts
            return False, current, None if rate <= 0 else (count - current) * 1_000_000 / rate

    def step(
        self, now_us: int, *, capacity: float, rate: float, count: float, consume: bool
    ) -> TokenResult:
        """Refill and (when ``consume``) take ``count`` tokens atomically."""
        with self._lock:
            result = tb_step(
                self._tokens,
                self._ts,
                now_us,
                capacity=capacity,
                rate=rate,
                count=count,
                consume=consume,
            )
            if consume:
                self._tokens, self._ts = result.tokens, result.ts_us
            return result

    def refund(self, now_us: int, *, capacity: float, rate: float, count: float) -> None:
        """Give ``count`` tokens back, never above ``capacity``."""
        with self._lock:
            now = tb_step(
                self._tokens,
                self._ts,
                now_us,
                capacity=capacity,
                rate=rate,
                count=0.0,
                consume=False,
            )
            self._tokens, self._ts = min(capacity, now.tokens + count), now.ts_us

    def reset(self) -> None:
        """Back to full."""
        with self._lock:
            self._tokens = self._ts = None

    def consumed(self, capacity: float) -> bool:
        """True when some of the quota has been taken and not yet given back."""
        with self._lock:
            return self._tokens is not None and self._tokens < capacity


class MemoryGcra:
    """A single theoretical arrival time."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tat: tuple[int, int] | None = None

    def step(self, now_us: int, *, limit: int, window_us: int, consume: bool) -> GcraResult:
        """One GCRA decision; stores the new TAT when allowed and ``consume``."""
        with self._lock:
            result = gcra_step(self._tat, now_us, limit=limit, window_us=window_us, consume=consume)
            if consume and result.allowed:
                self._tat = (result.tat_us, result.tat_rem)
            return result

    def reset(self) -> None:
        """Forget the TAT."""
        with self._lock:
            self._tat = None


class MemoryLog:
    """Timestamps (microseconds) and request ids of accepted requests, sorted by time.

    Kept sorted (a clock stepped backwards inserts in the middle) so that eviction and
    counting are a binary search, not a scan.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._times: list[int] = []

    def take(self, now_us: int, limit: int, window_us: int) -> tuple[bool, float, float]:
        """Evict, count, record when allowed: ``(allowed, remaining, retry_us)``.

        The acquire hot path: :meth:`step` with ``consume=True`` and
        :func:`~taskq.ratelimit._algorithms.log_decide` inlined (same results).
        """
        with self._lock:
            times = self._times
            first_inside = bisect.bisect_right(times, now_us - window_us)
            if first_inside:
                del times[:first_inside]
            inside = len(times)
            if inside < limit:
                if not times or times[-1] <= now_us:
                    times.append(now_us)
                else:  # the clock stepped backwards: keep the list sorted
                    bisect.insort_right(times, now_us)
                return True, float(limit - inside - 1), 0.0
            wait = float(times[0] + window_us - now_us)
            return False, 0.0, wait if wait > 0.0 else 0.0

    def step(
        self, now_us: int, *, limit: int, window_us: int, consume: bool
    ) -> tuple[bool, float, float, str | None]:
        """Evict, count, maybe record; returns ``(allowed, remaining, retry_us, request_id)``."""
        with self._lock:
            first_inside = bisect.bisect_right(self._times, now_us - window_us)
            if consume and first_inside:
                del self._times[:first_inside]
                first_inside = 0
            inside = len(self._times) - first_inside
            oldest = self._times[first_inside] if inside else None
            allowed, remaining, retry = log_decide(
                inside, oldest, now_us, limit=limit, window_us=window_us
            )
            if not consume:
                return allowed, float(limit - inside) if allowed else 0.0, retry, None
            request_id = None
            if allowed:
                request_id = new_request_id()
                bisect.insort_right(self._times, now_us)
            return allowed, remaining, retry, request_id

    def reset(self) -> None:
        """Drop every entry."""
        with self._lock:
            self._times.clear()


@dataclass(slots=True)
class SlotHolder:
    """Who holds an in-memory reservation slot, and until when (microseconds)."""

    job_id: UUID | None
    worker_id: UUID
    lease_expires_us: int


class MemoryReservation:
    """``slots`` leased slots; a lapsed lease frees its slot."""

    def __init__(self, slots: int) -> None:
        self._lock = threading.Lock()
        self._holders: list[SlotHolder | None] = [None] * slots

    def acquire(
        self, now_us: int, lease_us: int, job_id: UUID | None, worker_id: UUID
    ) -> tuple[int | None, int]:
        """Take the lowest free slot: ``(slot_index, 0)``, or ``(None, wait_us)`` when full."""
        with self._lock:
            for index, holder in enumerate(self._holders):
                if holder is None or holder.lease_expires_us <= now_us:
                    self._holders[index] = SlotHolder(job_id, worker_id, now_us + lease_us)
                    return index, 0
            soonest = min(h.lease_expires_us for h in self._holders if h is not None)
            return None, max(0, soonest - now_us)

    def release(self, slot_index: int, worker_id: UUID) -> bool:
        """Free the slot if ``worker_id`` holds it; False (and nothing changes) otherwise."""
        with self._lock:
            if not 0 <= slot_index < len(self._holders):
                return False
            holder = self._holders[slot_index]
            if holder is None or holder.worker_id != worker_id:
                return False
            self._holders[slot_index] = None
            return True

    def renew(self, slot_index: int, worker_id: UUID, now_us: int, lease_us: int) -> bool:
        """Extend the lease of a slot ``worker_id`` holds."""
        with self._lock:
            holder = self._holders[slot_index] if 0 <= slot_index < len(self._holders) else None
            if holder is None or holder.worker_id != worker_id:
                return False
            holder.lease_expires_us = now_us + lease_us
            return True

    def held(self, now_us: int) -> list[tuple[int, SlotHolder]]:
        """Slots whose lease has not lapsed."""
        with self._lock:
            return [
                (i, h)
                for i, h in enumerate(self._holders)
                if h is not None and h.lease_expires_us > now_us
            ]
