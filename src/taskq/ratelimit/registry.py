# sync twin: src/taskq_sync/ratelimit/registry.py
"""``RateLimitRegistry``: named primitives, keyed materialisation and AND-composition.

Two namespaces (rate limits; reservations). ``acquire_for_actor`` takes an actor's
reservations first, then its rate limits, each in declaration order, and on any denial
gives back what it took in reverse order before raising ``ReservationUnavailable``.
Bookkeeping is guarded by a ``threading.Lock`` whose critical sections never await, so
the same code is safe on an event loop and under a threaded WSGI server.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import TYPE_CHECKING, Any, cast
from uuid import UUID

from taskq.clock import Clock, SystemClock
from taskq.constants import DEFAULT_RESERVATION_BACKOFF, validate_name
from taskq.exceptions import ReservationUnavailable
from taskq.ratelimit import _sql
from taskq.ratelimit.composition import AcquiredResource, RateLimitHandle, ReservationHandle
from taskq.ratelimit.decision import HeldSlot, RateLimitDecision, RateLimitState
from taskq.ratelimit.refs import (
    QUEUE_CAP_PREFIX,
    KeyedRateLimitRef,
    KeyedReservationRef,
    lease_seconds,
)
from taskq.ratelimit.reservation import ConcurrencyReservation
from taskq.ratelimit.sliding_window import SlidingWindow
from taskq.ratelimit.token_bucket import TokenBucket
from taskq.settings import TaskQSettings

if TYPE_CHECKING:
    from redis.asyncio import Redis
    from sqlalchemy.ext.asyncio import AsyncEngine

__all__ = [
    "_KEYED_IDLE_THRESHOLD",
    "_OPPORTUNISTIC_EVICT_MIN_INTERVAL",
    "RateLimitRegistry",
    "registry",
]

_log = logging.getLogger("taskq.ratelimit")

_KEYED_IDLE_THRESHOLD = timedelta(hours=1)
"""Keyed primitives unused for this long are evicted by the worker sweep."""
_OPPORTUNISTIC_EVICT_MIN_INTERVAL = timedelta(seconds=30)
"""At most one eviction scan per this interval on the acquisition path, per kind."""

RateLimit = TokenBucket | SlidingWindow
DEFAULT_MAX_KEYED = 10_000
"""The keyed caps of a registry nobody configured (the settings' defaults too)."""


def _actor_name(actor: object) -> str:
    for attr in ("name", "actor_name"):
        value = getattr(actor, attr, None)
        if isinstance(value, str):
            return value
    return str(actor)


class RateLimitRegistry:
    """Holds primitives by name and composes them for actors.

    ``max_keyed_rate_limits`` / ``max_keyed_reservations`` cap how many keyed concrete
    primitives may be registered at once, each kind on its own counter. A cap left
    unset (``None``) is 10,000 until a worker adopts the registry, which sets it from
    ``TASKQ_MAX_KEYED_RATE_LIMITS`` / ``TASKQ_MAX_KEYED_RESERVATIONS``
    (:meth:`apply_settings`); a cap given here wins over the settings. ``clock`` times
    keyed-entry idleness (the system clock by default).
    """

    def __init__(
        self,
        *,
        max_keyed_rate_limits: int | None = None,
        max_keyed_reservations: int | None = None,
        clock: Clock | None = None,
    ) -> None:
        for cap in (max_keyed_rate_limits, max_keyed_reservations):
            if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap < 1):
                raise ValueError("max_keyed_* caps must be ints >= 1")
        self._caps_given = (max_keyed_rate_limits is not None, max_keyed_reservations is not None)
        self.max_keyed_rate_limits = max_keyed_rate_limits or DEFAULT_MAX_KEYED
        self.max_keyed_reservations = max_keyed_reservations or DEFAULT_MAX_KEYED
        self._clock: Clock = clock or SystemClock()
        self._lock = threading.Lock()
        self._rate_limits: dict[str, RateLimit] = {}
        self._reservations: dict[str, ConcurrencyReservation] = {}
        self._keyed_rl: dict[str, float] = {}
        self._keyed_res: dict[str, float] = {}
        self._last_scan_rl = -math.inf
        self._last_scan_res = -math.inf

    def apply_settings(self, *, max_keyed_rate_limits: int, max_keyed_reservations: int) -> None:
        """Take the keyed caps from settings (what a worker does with its registry at
        boot), except a cap the constructor was given, which stays."""
        if not self._caps_given[0]:
            self.max_keyed_rate_limits = max_keyed_rate_limits
        if not self._caps_given[1]:
            self.max_keyed_reservations = max_keyed_reservations

    # -- registration -------------------------------------------------------------

    def register(self, primitive: TokenBucket | SlidingWindow | ConcurrencyReservation) -> None:
        """Add a primitive under its name; identical re-registration is a no-op.

        Raises ``ValueError`` when the name is taken in the same namespace by a different
        config, and ``TypeError`` for anything but a primitive instance (names, keyed
        refs and ``RateLimitRef`` included).
        """
        with self._lock:
            self._register_locked(primitive)

    def _register_locked(self, primitive: object) -> None:
        table: dict[str, Any]
        if isinstance(primitive, TokenBucket | SlidingWindow):
            table = self._rate_limits
        elif isinstance(primitive, ConcurrencyReservation):
            table = self._reservations
        else:
            raise TypeError(
                "register() takes a TokenBucket, SlidingWindow or ConcurrencyReservation, "
                f"got {type(primitive).__name__}"
            )
        existing = table.get(primitive.name)
        if existing is None:
            table[primitive.name] = cast(Any, primitive)
        elif existing is not primitive and existing.config != primitive.config:
            raise ValueError(
                f"{primitive.name!r} is already registered with a different config: "
                f"{existing!r} vs {primitive!r}"
            )

    def register_queue_cap(self, reservation: ConcurrencyReservation) -> None:
        """Register a worker's queue cap ``taskq:global:queue:{queue}``, replacing a stale one.

        The worker calls this at startup with the cap it just read from the ``queues``
        row, the cap's single source of truth. Unlike :meth:`register`, a different config
        already under that name (an earlier worker in this process, before the cap or the
        lock lease changed) is replaced instead of raising: the slot rows are shared and
        re-synced from the new value, so a stale in-process copy is never right. Any other
        name raises ``ValueError``.
        """
        if not isinstance(reservation, ConcurrencyReservation):
            raise TypeError(f"expected a ConcurrencyReservation, got {type(reservation).__name__}")
        if not reservation.name.startswith(QUEUE_CAP_PREFIX):
            raise ValueError(
                f"{reservation.name!r} is not a queue cap name ({QUEUE_CAP_PREFIX}<queue>)"
            )
        with self._lock:
            existing = self._reservations.get(reservation.name)
            if existing is None or existing.config != reservation.config:
                self._reservations[reservation.name] = reservation

    def get_rate_limit(self, name: str) -> TokenBucket | SlidingWindow:
        """The rate limit registered as ``name``; ``KeyError`` if none."""
        with self._lock:
            try:
                return self._rate_limits[name]
            except KeyError:
                raise KeyError(f"no rate limit named {name!r} is registered") from None

    def get_reservation(self, name: str) -> ConcurrencyReservation:
        """The reservation registered as ``name``; ``KeyError`` if none."""
        with self._lock:
            try:
                return self._reservations[name]
            except KeyError:
                raise KeyError(f"no reservation named {name!r} is registered") from None

    def rate_limits(self) -> dict[str, TokenBucket | SlidingWindow]:
        """A snapshot of the registered rate limits by name."""
        with self._lock:
            return dict(self._rate_limits)

    def clear(self) -> None:
        """Forget everything (a test aid; not safe while a worker runs)."""
        with self._lock:
            self._rate_limits.clear()
            self._reservations.clear()
            self._keyed_rl.clear()
            self._keyed_res.clear()
            self._last_scan_rl = self._last_scan_res = -math.inf

    # -- peek / reset -------------------------------------------------------------

    async def peek(
        self,
        name: str,
        *,
        redis_client: Redis | None = None,
        pg_pool: AsyncEngine | None = None,
        clock: Clock | None = None,
        settings: TaskQSettings | None = None,
    ) -> RateLimitState:
        """The state of rate limit ``name`` without consuming anything."""
        return await self.get_rate_limit(name).peek(
            redis_client=redis_client, pg_pool=pg_pool, clock=clock, settings=settings
        )

    async def peek_all(
        self,
        *,
        redis_client: Redis | None = None,
        pg_pool: AsyncEngine | None = None,
        clock: Clock | None = None,
        settings: TaskQSettings | None = None,
    ) -> dict[str, RateLimitState]:
        """The state of every registered rate limit (token buckets and sliding windows)."""
        states: dict[str, RateLimitState] = {}
        for name, primitive in sorted(self.rate_limits().items()):
            states[name] = await primitive.peek(
                redis_client=redis_client, pg_pool=pg_pool, clock=clock, settings=settings
            )
        return states

    async def reset(
        self,
        name: str,
        *,
        redis_client: Redis | None = None,
        pg_pool: AsyncEngine | None = None,
        clock: Clock | None = None,
        settings: TaskQSettings | None = None,
    ) -> None:
        """Restore rate limit ``name`` to full (idempotent)."""
        await self.get_rate_limit(name).reset(
            redis_client=redis_client, pg_pool=pg_pool, clock=clock, settings=settings
        )
        _log.info("ratelimit.reset bucket=%s", name)

    async def reservations(self, pool: AsyncEngine | None = None) -> dict[str, list[HeldSlot]]:
        """Every registered reservation with its held slots.

        Memory reservations (constructed with a clock) answer from memory; the others
        need ``pool``.
        """
        with self._lock:
            items = sorted(self._reservations.items())
        return {
            name: await res.held(None if res.clock is not None else pool) for name, res in items
        }

    # -- non-job acquisition ------------------------------------------------------

    @asynccontextmanager
    async def acquire(
        self,
        name: str | KeyedRateLimitRef[Any],
        *,
        key: str | None = None,
        count: float = 1.0,
        redis_client: Redis | None = None,
        pg_pool: AsyncEngine | None = None,
        clock: Clock | None = None,
        settings: TaskQSettings | None = None,
    ) -> AsyncIterator[RateLimitDecision]:
        """Take from rate limit ``name`` for non-job code (a view, a script); yields the
        decision.

        ``name`` is a registered rate limit's name, or a :class:`KeyedRateLimitRef` with
        ``key=``: the bucket for that key (``f"{base_name}:{key}"``) is made and registered
        on first use, exactly as a job's payload would make it, so a view can limit each
        user on their own. Without ``redis_client`` a Redis-backed bucket uses the client
        of ``settings`` / ``TASKQ_REDIS_URL``. Nothing is refunded on exit. A reservation
        name raises ``TypeError``.
        """
        primitive = await self._for_acquire(name, key, pg_pool, settings)
        if isinstance(primitive, TokenBucket):
            decision = await primitive.acquire(
                count, redis_client=redis_client, pg_pool=pg_pool, clock=clock, settings=settings
            )
        else:
            decision = await primitive.acquire(
                redis_client=redis_client, pg_pool=pg_pool, clock=clock, settings=settings
            )
        yield decision

    async def _for_acquire(
        self,
        name: str | KeyedRateLimitRef[Any],
        key: str | None,
        pg_pool: AsyncEngine | None,
        settings: TaskQSettings | None,
    ) -> TokenBucket | SlidingWindow:
        """The primitive :meth:`acquire` takes from (see there)."""
        if isinstance(name, KeyedRateLimitRef):
            if not isinstance(key, str) or not key:
                raise ValueError(
                    f"acquire() of keyed rate limit {name.base_name!r} needs key= (a non-empty str)"
                )
            concrete = validate_name(f"{name.base_name}:{key}", kind="keyed concrete")
            return await self._keyed_bucket(name, concrete, pg_pool)
        if key is not None:
            raise TypeError(f"key= is for a KeyedRateLimitRef; {name!r} is a plain rate limit name")
        with self._lock:
            primitive = self._rate_limits.get(name)
            is_reservation = name in self._reservations
        if primitive is None:
            if is_reservation:
                raise TypeError(
                    f"{name!r} is a ConcurrencyReservation; acquire() takes rate limits only"
                )
            raise KeyError(f"no rate limit named {name!r} is registered")
        return primitive

    # -- actor composition --------------------------------------------------------

    async def acquire_for_actor(
        self,
        actor: object,
        payload: object,
        *,
        job_id: UUID | None,
        worker_id: UUID,
        redis_client: Redis | None = None,
        pg_pool: AsyncEngine | None = None,
        clock: Clock | None = None,
        settings: TaskQSettings | None = None,
    ) -> list[AcquiredResource]:
        """Take everything ``actor`` declares: reservations, then rate limits, in order.

        ``payload`` (a mapping or the model) feeds keyed refs. On a denial, what was taken
        is given back in reverse order and ``ReservationUnavailable`` is raised with a
        non-``None`` ``retry_after`` (``DEFAULT_RESERVATION_BACKOFF`` for an exhausted
        fixed quota). Rate-limit tokens taken are kept once the job ran.
        """
        name = _actor_name(actor)
        acquired: list[AcquiredResource] = []
        try:
            for entry in getattr(actor, "reservations", None) or []:
                res = await self._resolve_reservation_name(
                    entry, payload, name, pg_pool, clock, settings
                )
                pool = None if res.clock is not None else pg_pool
                slot = await res.acquire(job_id, worker_id, pool)
                acquired.append(ReservationHandle(res.name, res, slot, job_id, worker_id))
            for entry in getattr(actor, "rate_limits", None) or []:
                primitive = await self._resolve_rate_limit_name(
                    entry, payload, name, pg_pool, settings
                )
                if isinstance(primitive, TokenBucket):
                    decision = await primitive.acquire(
                        1.0,
                        redis_client=redis_client,
                        pg_pool=pg_pool,
                        clock=clock,
                        settings=settings,
                    )
                else:
                    decision = await primitive.acquire(
                        redis_client=redis_client, pg_pool=pg_pool, clock=clock, settings=settings
                    )
                if not decision.allowed:
                    wait = decision.retry_after
                    raise ReservationUnavailable(
                        primitive.name, DEFAULT_RESERVATION_BACKOFF if wait is None else wait
                    )
                acquired.append(RateLimitHandle(primitive.name, primitive, decision))
        except BaseException:
            await self._rollback(acquired, redis_client, pg_pool, clock, settings)
            raise
        return acquired

    async def release_for_actor(
        self,
        acquired: Sequence[AcquiredResource],
        *,
        worker_id: UUID,
        redis_client: Redis | None = None,
        pg_pool: AsyncEngine | None = None,
        clock: Clock | None = None,
        settings: TaskQSettings | None = None,
    ) -> None:
        """Release the reservation slots of ``acquired`` in reverse order; tokens are kept."""
        for handle in reversed(acquired):
            if isinstance(handle, ReservationHandle):
                res: ConcurrencyReservation = handle.primitive
                await res.release(
                    handle.slot_index, worker_id, None if res.clock is not None else pg_pool
                )

    async def _rollback(
        self,
        acquired: Iterable[AcquiredResource],
        redis_client: Redis | None,
        pg_pool: AsyncEngine | None,
        clock: Clock | None,
        settings: TaskQSettings | None,
    ) -> None:
        for handle in reversed(list(acquired)):
            try:
                if isinstance(handle, ReservationHandle):
                    res: ConcurrencyReservation = handle.primitive
                    pool = None if res.clock is not None else pg_pool
                    await res.release(handle.slot_index, handle.worker_id, pool)
                else:
                    await handle.primitive.refund(
                        handle.decision,
                        redis_client=redis_client,
                        pg_pool=pg_pool,
                        clock=clock,
                        settings=settings,
                    )
            except Exception:
                _log.warning("ratelimit.rollback_failed resource=%s", handle.name, exc_info=True)

    # -- keyed refs ---------------------------------------------------------------

    async def _resolve_rate_limit_name(
        self,
        entry: object,
        payload: object,
        actor: str,
        pg_pool: AsyncEngine | None,
        settings: TaskQSettings | None,
    ) -> TokenBucket | SlidingWindow:
        if isinstance(entry, str):
            return self.get_rate_limit(entry)
        if isinstance(entry, TokenBucket | SlidingWindow):
            return entry
        if not isinstance(entry, KeyedRateLimitRef):
            raise TypeError(
                f"rate_limits entries are names, primitives or KeyedRateLimitRef, got {entry!r}"
            )
        return await self._keyed_bucket(entry, entry.concrete_name(payload, actor=actor), pg_pool)

    async def _keyed_bucket(
        self, entry: KeyedRateLimitRef[Any], name: str, pg_pool: AsyncEngine | None
    ) -> TokenBucket | SlidingWindow:
        """The keyed bucket ``name`` of ``entry``, made (and published) on first use."""
        bucket, fresh = self._materialize_rate_limit(entry, name)
        if fresh and pg_pool is not None and isinstance(bucket, TokenBucket):
            try:
                await _sql.sql_publish(
                    pg_pool,
                    name,
                    kind="token_bucket",
                    capacity=bucket.capacity,
                    refill_per_second=bucket.refill_per_second,
                    window_s=None,
                    config={"keyed_base": entry.base_name, "backend": bucket.backend},
                )
            except Exception:
                _log.warning("ratelimit.keyed_publish_failed bucket=%s", name, exc_info=True)
        return bucket

    def _materialize_rate_limit(
        self, ref: KeyedRateLimitRef[Any], name: str
    ) -> tuple[TokenBucket | SlidingWindow, bool]:
        candidate = TokenBucket(name, ref.capacity, ref.refill_per_second, backend=ref.backend)
        candidate.metrics_name = ref.base_name  # one metric series per keyed ref, not per key
        now = self._clock.monotonic()
        with self._lock:
            existing = self._rate_limits.get(name)
            if existing is not None:
                if name not in self._keyed_rl:
                    return existing, False  # registered statically: reused as is
                if existing.config != candidate.config:
                    raise ValueError(
                        f"keyed rate limit {name!r} collides with {existing!r} of a different config"
                    )
                self._keyed_rl[name] = now
                return existing, False
            if len(self._keyed_rl) >= self.max_keyed_rate_limits:
                if now - self._last_scan_rl >= _OPPORTUNISTIC_EVICT_MIN_INTERVAL.total_seconds():
                    self._last_scan_rl = now
                    self._evict_locked(
                        self._keyed_rl, self._rate_limits, _KEYED_IDLE_THRESHOLD, now
                    )
                if len(self._keyed_rl) >= self.max_keyed_rate_limits:
                    raise ReservationUnavailable(name, DEFAULT_RESERVATION_BACKOFF)
            self._rate_limits[name] = candidate
            self._keyed_rl[name] = now
            return candidate, True

    async def _resolve_reservation_name(
        self,
        entry: object,
        payload: object,
        actor: str,
        pg_pool: AsyncEngine | None,
        clock: Clock | None,
        settings: TaskQSettings | None,
    ) -> ConcurrencyReservation:
        if isinstance(entry, str):
            return self.get_reservation(entry)
        if isinstance(entry, ConcurrencyReservation):
            return entry
        if not isinstance(entry, KeyedReservationRef):
            raise TypeError(
                f"reservations entries are names, ConcurrencyReservation or KeyedReservationRef, got {entry!r}"
            )
        name = entry.concrete_name(payload, actor=actor)
        schema = settings.schema_name if settings is not None else None
        res, fresh = self._materialize_reservation(
            entry, name, None if pg_pool is not None else clock, schema
        )
        if fresh and res.clock is None and pg_pool is not None:
            await res.ensure_slots(pg_pool)
        return res

    def _materialize_reservation(
        self, ref: KeyedReservationRef[Any], name: str, clock: Clock | None, schema: str | None
    ) -> tuple[ConcurrencyReservation, bool]:
        now = self._clock.monotonic()
        lease = (
            ref.lease
            if isinstance(ref.lease, timedelta)
            else timedelta(seconds=lease_seconds(ref.lease))
        )
        with self._lock:
            existing = self._reservations.get(name)
            if existing is not None:
                if name not in self._keyed_res:
                    return existing, False  # registered statically: reused as is
                if existing.slots != ref.slots or existing.lease != lease:
                    raise ValueError(
                        f"keyed reservation {name!r} collides with {existing!r} of a different config"
                    )
                self._keyed_res[name] = now
                return existing, False
            if len(self._keyed_res) >= self.max_keyed_reservations:
                if now - self._last_scan_res >= _OPPORTUNISTIC_EVICT_MIN_INTERVAL.total_seconds():
                    self._last_scan_res = now
                    self._evict_locked(
                        self._keyed_res, self._reservations, _KEYED_IDLE_THRESHOLD, now
                    )
                if len(self._keyed_res) >= self.max_keyed_reservations:
                    raise ReservationUnavailable(name, DEFAULT_RESERVATION_BACKOFF)
            res = ConcurrencyReservation(name, ref.slots, lease, clock=clock, schema=schema)
            self._reservations[name] = res
            self._keyed_res[name] = now
            return res, True

    # -- eviction -----------------------------------------------------------------

    def _evict_locked(
        self, tracked: dict[str, float], table: dict[str, Any], idle_for: timedelta, now: float
    ) -> int:
        threshold = idle_for.total_seconds()
        evicted = 0
        for name, last_used in list(tracked.items()):
            if now - last_used < threshold:
                continue
            primitive = table.get(name)
            if primitive is not None and not _evictable(primitive):
                continue
            del tracked[name]
            table.pop(name, None)
            evicted += 1
        return evicted

    def evict_idle_keyed_rate_limits(self, idle_for: timedelta = _KEYED_IDLE_THRESHOLD) -> int:
        """Drop keyed buckets unused for ``idle_for``; return how many went.

        Statically registered names are never evicted, nor memory fixed-quota buckets
        with quota consumed (evicting would silently refill them). Store state is
        untouched (Redis keys expire on their own TTL).
        """
        with self._lock:
            return self._evict_locked(
                self._keyed_rl, self._rate_limits, idle_for, self._clock.monotonic()
            )

    def evict_idle_keyed_reservations(self, idle_for: timedelta = _KEYED_IDLE_THRESHOLD) -> int:
        """Drop keyed reservations unused for ``idle_for``; return how many went.

        Only in-process bookkeeping goes; ``reservation_slots`` rows stay (the lease sweep
        reclaims them). Memory reservations with held slots are kept.
        """
        with self._lock:
            return self._evict_locked(
                self._keyed_res, self._reservations, idle_for, self._clock.monotonic()
            )


def _evictable(primitive: object) -> bool:
    if isinstance(primitive, ConcurrencyReservation):
        return not primitive.memory_slots_held()
    if isinstance(primitive, TokenBucket | SlidingWindow):
        return not primitive.memory_quota_consumed()
    return True


registry = RateLimitRegistry()
"""The process-wide default registry (tests should build their own)."""
