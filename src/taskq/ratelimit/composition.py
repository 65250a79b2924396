"""What ``RateLimitRegistry.acquire_for_actor`` hands back: one handle per resource held.

``release_for_actor`` takes the list back to free reservation slots; rate-limit handles
record the decision (tokens are kept once the actor ran).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any
from uuid import UUID

from taskq.ratelimit.decision import RateLimitDecision

__all__ = ["AcquiredResource", "CompositionResult", "RateLimitHandle", "ReservationHandle"]


@dataclass(frozen=True, slots=True)
class RateLimitHandle:
    """A token taken from ``primitive`` (a TokenBucket or SlidingWindow) for one job."""

    name: str
    primitive: Any = field(repr=False, compare=False)
    decision: RateLimitDecision


@dataclass(frozen=True, slots=True)
class ReservationHandle:
    """A slot of ``primitive`` (a ConcurrencyReservation) held for one job."""

    name: str
    primitive: Any = field(repr=False, compare=False)
    slot_index: int
    job_id: UUID | None
    worker_id: UUID


AcquiredResource = RateLimitHandle | ReservationHandle
"""One resource ``acquire_for_actor`` took, in acquisition order."""


@dataclass(frozen=True, slots=True)
class CompositionResult:
    """Reserved for introspection of an AND-composition; no public API returns it yet."""

    allowed: bool
    acquired: list[AcquiredResource]
    denied_by: str | None = None
    retry_after: timedelta | None = None
