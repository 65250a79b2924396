"""References to primitives by name, and keyed refs that derive a name from a payload.

``RateLimitRef`` / ``ReservationRef`` are structured name references for callers that
resolve primitives themselves. ``KeyedRateLimitRef`` / ``KeyedReservationRef`` hold the
config of a family of primitives, one per key that ``key_fn`` computes from the job's
validated payload; the registry materialises and registers each concrete primitive
lazily (see :mod:`taskq.ratelimit.registry`). Pure values, shared with ``taskq_sync``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from taskq.constants import validate_name, validate_queue_name
from taskq.exceptions import PayloadValidationError

__all__ = [
    "QUEUE_CAP_PREFIX",
    "KeyedRateLimitRef",
    "KeyedReservationRef",
    "RateLimitRef",
    "ReservationRef",
    "lease_seconds",
    "queue_concurrency_reservation_name",
    "validate_backend",
]

P = TypeVar("P", bound=BaseModel)

_BACKENDS = ("redis", "postgres", "memory")

QUEUE_CAP_PREFIX = "taskq:global:queue:"
"""What the names of the reservations capping queues (``queues.max_concurrent``) start with."""


def queue_concurrency_reservation_name(queue: str) -> str:
    """The reservation that caps queue ``queue`` fleet-wide: ``taskq:global:queue:{queue}``."""
    return validate_name(f"{QUEUE_CAP_PREFIX}{validate_queue_name(queue)}", kind="reservation")


def validate_backend(backend: object) -> Literal["redis", "postgres", "memory"]:
    """Return ``backend`` when it names a storage backend; ``ValueError`` otherwise."""
    if backend not in _BACKENDS:
        raise ValueError(f"backend must be one of {_BACKENDS}, got {backend!r}")
    return backend  # type: ignore[return-value]


def lease_seconds(lease: timedelta | float) -> float:
    """A reservation lease in seconds; ``ValueError`` unless it is finite and ``> 0``."""
    if isinstance(lease, bool) or not isinstance(lease, timedelta | int | float):
        raise TypeError(f"lease must be a timedelta or seconds, got {type(lease).__name__}")
    seconds = lease.total_seconds() if isinstance(lease, timedelta) else float(lease)
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(f"lease must be > 0, got {lease!r}")
    return seconds


class RateLimitRef(BaseModel):
    """A rate limit named for manual resolution; ``count`` is metadata only.

    ``@actor`` does not accept it (dispatch always takes exactly 1.0 token per name).
    """

    model_config = ConfigDict(frozen=True)

    name: str
    count: float = 1.0

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return validate_name(value, kind="rate limit")

    @field_validator("count")
    @classmethod
    def _count(cls, value: float) -> float:
        if not math.isfinite(value) or value <= 0:
            raise ValueError("count must be > 0")
        return value


class ReservationRef(BaseModel):
    """A reservation named for manual resolution."""

    model_config = ConfigDict(frozen=True)

    name: str

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return validate_name(value, kind="reservation")


def _concrete_name(
    payload_type: type[BaseModel],
    key_fn: Callable[[Any], str],
    base_name: str,
    payload: object,
    actor: str,
) -> str:
    if isinstance(payload, payload_type):
        model = payload
    else:
        raw: object = (
            payload.model_dump(by_alias=True) if isinstance(payload, BaseModel) else payload
        )
        if not isinstance(raw, Mapping):
            raise PayloadValidationError(actor, f"expected a mapping, got {type(raw).__name__}")
        try:
            model = payload_type.model_validate(raw)
        except ValidationError as exc:
            raise PayloadValidationError(actor, exc.errors(include_url=False)) from exc
    key = key_fn(model)
    if not isinstance(key, str) or not key:
        raise ValueError(f"key_fn of {base_name!r} must return a non-empty str, got {key!r}")
    return validate_name(f"{base_name}:{key}", kind="keyed concrete")


@dataclass(frozen=True, slots=True)
class KeyedRateLimitRef(Generic[P]):
    """One token bucket per key: the concrete bucket for key ``k`` is ``f"{base_name}:{k}"``.

    ``payload_type`` is the model the payload is validated against before ``key_fn`` runs
    (defaults, aliases and validators applied; failures are ``PayloadValidationError``).
    Every key shares ``capacity``, ``refill_per_second`` and ``backend``.
    """

    payload_type: type[P]
    base_name: str
    key_fn: Callable[[P], str] = field(compare=False)
    capacity: float
    refill_per_second: float
    backend: Literal["redis", "postgres", "memory"] = "redis"

    def __post_init__(self) -> None:
        if not (isinstance(self.payload_type, type) and issubclass(self.payload_type, BaseModel)):
            raise TypeError("payload_type must be a pydantic BaseModel subclass")
        validate_name(self.base_name, kind="keyed rate limit base")
        if not callable(self.key_fn):
            raise TypeError("key_fn must be callable")
        if not self.capacity > 0:
            raise ValueError("capacity must be > 0")
        if not self.refill_per_second >= 0:
            raise ValueError("refill_per_second must be >= 0")
        validate_backend(self.backend)

    @classmethod
    def typed(
        cls,
        payload_type: type[P],
        *,
        base_name: str,
        key_fn: Callable[[P], str],
        capacity: float,
        refill_per_second: float,
        backend: Literal["redis", "postgres", "memory"] = "redis",
    ) -> KeyedRateLimitRef[P]:
        """Build a ref whose ``key_fn`` is type-checked against ``payload_type``."""
        return cls(payload_type, base_name, key_fn, capacity, refill_per_second, backend)

    def concrete_name(self, payload: object, *, actor: str = "?") -> str:
        """The bucket name for ``payload`` (a mapping or a model)."""
        return _concrete_name(self.payload_type, self.key_fn, self.base_name, payload, actor)


@dataclass(frozen=True, slots=True)
class KeyedReservationRef(Generic[P]):
    """One concurrency reservation per key, named ``f"{base_name}:{key}"``.

    Layered on top of a static reservation to cap concurrency per tenant/session.
    Every key shares ``slots`` and ``lease``.
    """

    payload_type: type[P]
    base_name: str
    key_fn: Callable[[P], str] = field(compare=False)
    slots: int
    lease: timedelta | float

    def __post_init__(self) -> None:
        if not (isinstance(self.payload_type, type) and issubclass(self.payload_type, BaseModel)):
            raise TypeError("payload_type must be a pydantic BaseModel subclass")
        validate_name(self.base_name, kind="keyed reservation base")
        if not callable(self.key_fn):
            raise TypeError("key_fn must be callable")
        if isinstance(self.slots, bool) or not isinstance(self.slots, int) or self.slots < 1:
            raise ValueError("slots must be an int >= 1")
        lease_seconds(self.lease)

    @classmethod
    def typed(
        cls,
        payload_type: type[P],
        *,
        base_name: str,
        key_fn: Callable[[P], str],
        slots: int,
        lease: timedelta | float,
    ) -> KeyedReservationRef[P]:
        """Build a ref whose ``key_fn`` is type-checked against ``payload_type``."""
        return cls(payload_type, base_name, key_fn, slots, lease)

    def concrete_name(self, payload: object, *, actor: str = "?") -> str:
        """The reservation name for ``payload`` (a mapping or a model)."""
        return _concrete_name(self.payload_type, self.key_fn, self.base_name, payload, actor)
