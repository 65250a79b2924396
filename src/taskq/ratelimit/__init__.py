# sync twin: src/taskq_sync/ratelimit/__init__.py
"""Rate limiting: token buckets, sliding windows, concurrency reservations and the registry.

Primitives keep their state in Redis, Postgres/SQLite or process memory, compose through
:class:`RateLimitRegistry` and wire to actors by name. ``taskq_sync.ratelimit`` is the
same API with blocking calls.
"""

from __future__ import annotations

from taskq.constants import DEFAULT_RESERVATION_BACKOFF
from taskq.exceptions import ReservationUnavailable
from taskq.ratelimit.composition import (
    AcquiredResource,
    CompositionResult,
    RateLimitHandle,
    ReservationHandle,
)
from taskq.ratelimit.decision import (
    HeldSlot,
    RateLimitBackend,
    RateLimitDecision,
    RateLimitState,
    SlidingWindowStyle,
    SyncResult,
)
from taskq.ratelimit.refs import (
    KeyedRateLimitRef,
    KeyedReservationRef,
    RateLimitRef,
    ReservationRef,
)
from taskq.ratelimit.registry import RateLimitRegistry, registry
from taskq.ratelimit.reservation import ConcurrencyReservation, sync_slots
from taskq.ratelimit.sliding_window import SlidingWindow
from taskq.ratelimit.token_bucket import TokenBucket

__all__ = [
    "DEFAULT_RESERVATION_BACKOFF",
    "AcquiredResource",
    "CompositionResult",
    "ConcurrencyReservation",
    "HeldSlot",
    "KeyedRateLimitRef",
    "KeyedReservationRef",
    "RateLimitBackend",
    "RateLimitDecision",
    "RateLimitHandle",
    "RateLimitRef",
    "RateLimitRegistry",
    "RateLimitState",
    "ReservationHandle",
    "ReservationRef",
    "ReservationUnavailable",
    "SlidingWindow",
    "SlidingWindowStyle",
    "SyncResult",
    "TokenBucket",
    "registry",
    "sync_slots",
]
