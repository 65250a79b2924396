"""What an acquire returns (:class:`RateLimitDecision`) and what a peek sees (:class:`RateLimitState`).

Pure values shared by ``taskq`` and the generated ``taskq_sync``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal
from uuid import UUID

__all__ = [
    "HeldSlot",
    "RateLimitBackend",
    "RateLimitDecision",
    "RateLimitState",
    "SlidingWindowStyle",
    "SyncResult",
]

RateLimitBackend = Literal["redis", "postgres", "memory"]
"""Where a primitive keeps its state."""

SlidingWindowStyle = Literal["log", "gcra"]
"""``"log"``: one entry per accepted request; ``"gcra"``: one theoretical arrival time."""


@dataclass(frozen=True, slots=True)
class RateLimitDecision:
    """The outcome of one ``acquire()``.

    ``retry_after`` is ``timedelta(0)`` when allowed and ``None`` when a fixed quota
    (``refill_per_second=0``) is exhausted. ``backend`` names the store that actually
    decided (``"postgres"`` after a Redis fallback). ``request_id`` is set only on allowed
    log-style sliding-window decisions; refund uses it.
    """

    allowed: bool
    remaining: float
    retry_after: timedelta | None
    bucket_name: str
    backend: RateLimitBackend
    request_id: str | None = None


@dataclass(frozen=True, slots=True)
class RateLimitState:
    """A read-only snapshot of a primitive, returned by ``peek()``; consumes nothing."""

    bucket_name: str
    backend: RateLimitBackend
    is_exhausted: bool
    tokens_remaining: float
    remaining: float
    retry_after: timedelta | None
    capacity: float | None
    limit: int | None
    window: timedelta | None
    style: str | None
    refill_per_second: float | None


@dataclass(frozen=True, slots=True)
class SyncResult:
    """What ``sync_slots`` changed: rows inserted, free excess rows deleted, held ones kept."""

    inserted: int
    deleted: int
    skipped_held: int


@dataclass(frozen=True, slots=True)
class HeldSlot:
    """A reservation slot with a live lease."""

    slot_index: int
    job_id: UUID | None
    worker_id: UUID
    lease_expires_at: datetime
