"""Gates: the dispatcher's estimate of what each limit can admit at this moment.

A :class:`RateGate` tracks a rate limit's tokens (the last decision's ``remaining`` plus
the refill since); a :class:`SlotGate` tracks the slots of a reservation or queue cap
this worker holds, the ones it *kept* from a finished job for the next claim, and whether
a denial said the rest are taken. :class:`Prepaid` is what was taken for one actor before
a claim. Pure state and arithmetic on a monotonic clock; the I/O is
:mod:`taskq.worker.admission`'s.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from taskq.constants import DEFAULT_RESERVATION_BACKOFF
from taskq.ratelimit.composition import AcquiredResource, RateLimitHandle, ReservationHandle
from taskq.ratelimit.decision import RateLimitDecision

__all__ = ["EPS", "ActorGates", "Prepaid", "RateGate", "SlotGate", "wait_s"]

EPS = 1e-9
_EPS = EPS
_BACKOFF_S = DEFAULT_RESERVATION_BACKOFF.total_seconds()


def wait_s(decision: RateLimitDecision) -> float:
    wait = decision.retry_after
    return _BACKOFF_S if wait is None else max(0.0, wait.total_seconds())


@dataclass(slots=True)
class RateGate:
    """The estimate of one rate limit: ``level`` tokens at ``at`` (monotonic), refilled
    at ``rate`` per second up to ``capacity``; nothing before ``blocked_until``."""

    primitive: Any
    capacity: float
    rate: float
    level: float
    at: float
    blocked_until: float = 0.0
    next_park: float = 0.0
    """Keyed gates: when the next job parked behind this key is projected to run."""

    @classmethod
    def of(cls, primitive: Any, now: float) -> RateGate:
        """A gate for a ``TokenBucket`` or ``SlidingWindow``, assumed full (it starts so)."""
        if hasattr(primitive, "refill_per_second"):
            capacity, rate = float(primitive.capacity), float(primitive.refill_per_second)
        else:
            capacity = float(primitive.limit)
            rate = capacity / primitive.window.total_seconds()
        return cls(primitive, capacity, rate, capacity, now)

    @property
    def name(self) -> str:
        """The primitive's name."""
        name: str = self.primitive.name
        return name

    @property
    def counted(self) -> bool:
        """True for a token bucket (one acquire may take several tokens)."""
        return hasattr(self.primitive, "refill_per_second")

    def available(self, now: float) -> float:
        """Tokens the estimate says can be taken now."""
        if now < self.blocked_until:
            return 0.0
        return min(self.capacity, self.level + self.rate * max(0.0, now - self.at))

    def ready_at(self, want: float, now: float) -> float:
        """When ``want`` tokens are estimated to be there (``inf`` for a spent quota)."""
        have = self.available(now)
        if have + _EPS >= want:
            return now
        if self.rate <= 0:
            return max(self.blocked_until, now + _BACKOFF_S)
        need = min(want, self.capacity) - self.level
        return max(self.blocked_until, self.at + need / self.rate)

    def observe(self, decision: RateLimitDecision, now: float, count: float = 1.0) -> None:
        """Correct the estimate from the store's decision (the truth at ``now``)."""
        self.level = max(0.0, float(decision.remaining))
        self.at = now
        if decision.allowed:
            self.blocked_until = 0.0
        elif count <= 1.0 or not self.counted:
            self.blocked_until = now + wait_s(decision)
        elif self.level + _EPS < 1.0:
            # A count above one was refused and not even one token is left.
            self.blocked_until = now + (
                (1.0 - self.level) / self.rate if self.rate > 0 else _BACKOFF_S
            )

    def park_at(self, now: float) -> float:
        """The moment to park the next job of this (keyed) gate until, spreading a backlog
        one refill interval apart instead of waking it all at once."""
        at = max(self.ready_at(1.0, now), self.next_park)
        step = 1.0 / self.rate if self.rate > 0 else _BACKOFF_S
        self.next_park = at + step
        return at


@dataclass(slots=True)
class SlotGate:
    """The estimate of one reservation or queue cap: ``held`` slots are this worker's
    (``kept`` among them); ``waiting`` says a denial saw every slot taken, until a release
    or ``blocked_until`` (the soonest lease end the denial reported)."""

    reservation: Any
    slots: int
    held: int = 0
    waiting: bool = False
    blocked_until: float = 0.0
    kept: list[tuple[int, float]] = field(default_factory=list)
    """``(slot_index, when)`` of slots this worker still holds in the store from jobs that
    ended: the next claim ties one to the job it claims (a hand-over without a release),
    or gives it back."""

    @property
    def name(self) -> str:
        """The reservation's name."""
        name: str = self.reservation.name
        return name

    def available(self, now: float) -> int:
        """Slots this worker may try to take now (the kept ones always)."""
        kept = len(self.kept)
        if self.waiting:
            if now < self.blocked_until:
                return kept
            self.waiting = False
        return kept + max(0, self.slots - self.held)

    def denied(self, wait_s: float, now: float) -> None:
        """A denial: nothing free until a release, or ``wait_s`` at the latest."""
        self.waiting = True
        self.blocked_until = now + wait_s

    def released(self) -> None:
        """A slot was freed (here, or seen free in the store)."""
        self.waiting = False


@dataclass(slots=True)
class Prepaid:
    """What was taken for one actor before a claim: ``units[gate]`` holds one decision per
    token (a token bucket's multi-token decision repeated), ``slots[reservation]`` the
    slot indexes taken (not yet tied to a job), ``granted`` how many jobs they pay for."""

    actor: str
    granted: int
    units: dict[str, list[RateLimitDecision]] = field(default_factory=dict)
    gates: dict[str, RateGate] = field(default_factory=dict)
    slots: dict[str, list[int]] = field(default_factory=dict)
    slot_gates: dict[str, SlotGate] = field(default_factory=dict)
    deferred: list[SlotGate] = field(default_factory=list)
    """Slot gates whose slots are taken inside the claim's transaction
    (:meth:`Admission.take_in_claim`), not before it."""
    kept_only: bool = False
    """A hand-over: only kept slots may pay (no slot is claimed in the store)."""
    adopted: set[tuple[str, int]] = field(default_factory=set)
    """``(reservation, slot_index)`` of the kept slots among ``slots``: tied to their job
    by a fenced update instead of being claimed."""

    def take_one(self, job_id: UUID, worker_id: UUID) -> list[AcquiredResource]:
        """The handles paying for one claimed job (removed from the pool)."""
        out: list[AcquiredResource] = []
        for name, indexes in self.slots.items():
            if indexes:
                res = self.slot_gates[name].reservation
                out.append(ReservationHandle(name, res, indexes.pop(), job_id, worker_id))
        for name, units in self.units.items():
            if units:
                decision = units.pop()
                out.append(RateLimitHandle(name, self.gates[name].primitive, decision))
        self.granted -= 1
        return out


@dataclass(slots=True)
class ActorGates:
    """The static gates of one actor (``keyed``: it also has keyed limits)."""

    rate: list[RateGate]
    slots: list[SlotGate]
    keyed: bool
