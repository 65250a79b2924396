"""What an attempt holds besides its row and its DI instances
(:mod:`taskq.worker.dependencies`): reservation slots and rate-limit tokens.

:class:`Limits` registers actor-declared
primitives and queue caps, checks at boot that every name an actor references is
registered, acquires/releases per attempt (the queue cap slot first, then the actor's
reservations and rate limits, ``acquire_for_actor``) and tells the heartbeat which
slots each running job holds. :func:`resolve_rate_limit_registry` picks the registry
from the ``rate_limit_registry`` argument or a DI value provider.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from uuid import UUID

import structlog
from sqlalchemy.exc import DBAPIError, SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine

from taskq.actor import ActorRef
from taskq.clock import SystemClock
from taskq.db.dialect import traits
from taskq.db.engine import transaction, with_schema
from taskq.db.queries import dispatch as dq
from taskq.db.queries import handover as hq
from taskq.db.queries import ratelimit as rq
from taskq.db.queries import worker as wq
from taskq.db.queries.dispatch import notify_channel
from taskq.di import ProviderRegistry, Scope
from taskq.exceptions import ConfigurationError
from taskq.settings import WorkerSettings
from taskq.worker.dependencies import Dependencies
from taskq.worker.state import RunningJob

if TYPE_CHECKING:
    from taskq.ratelimit import ConcurrencyReservation
    from taskq.ratelimit.composition import AcquiredResource

__all__ = ["Dependencies", "Limits", "SlotHold", "resolve_rate_limit_registry"]
# Dependencies moved to taskq.worker.dependencies; still importable from here.

_log = structlog.get_logger("taskq.worker")


def resolve_rate_limit_registry(argument: Any, di_registry: ProviderRegistry | None) -> Any:
    """The worker's ``RateLimitRegistry``: the argument, a DI provider, or ``None``.

    ``None`` (neither given) means the module-level default, picked by :meth:`Limits.boot`
    when an actor needs one. A DI registration must be a value provider at ``Scope.LOOP``
    holding a ``RateLimitRegistry`` instance, read here without resolving anything:
    dispatch uses the registry from the LOOP-scope cache only, which a factory, a class
    or another scope would not guarantee to be one instance for the worker's life.
    Raises ``TypeError`` for any other provider, and when both the argument and a DI
    provider are given (ambiguous: neither silently wins).
    """
    from taskq.ratelimit import RateLimitRegistry

    provider = di_registry.get(RateLimitRegistry) if di_registry is not None else None
    if provider is None:
        return argument
    if argument is not None:
        raise TypeError(
            "pass the RateLimitRegistry either as rate_limit_registry= or as a DI provider, "
            "not both (ambiguous)"
        )
    if provider.kind != "value":
        raise TypeError(
            f"RateLimitRegistry must be a value provider (register_value), got a "
            f"{provider.kind} provider: dispatch resolves it from the LOOP-scope cache only"
        )
    if provider.scope is not Scope.LOOP:
        raise TypeError(
            f"RateLimitRegistry must be registered at Scope.LOOP, got Scope.{provider.scope.name}"
        )
    if not isinstance(provider.target, RateLimitRegistry):
        raise TypeError(
            "the RateLimitRegistry provider holds "
            f"{type(provider.target).__name__}, not a RateLimitRegistry"
        )
    return provider.target


@dataclass(frozen=True, slots=True)
class SlotHold:
    """A reservation slot a running job holds (what the heartbeat renews)."""

    reservation: ConcurrencyReservation
    slot_index: int
    job_id: UUID


@dataclass(frozen=True, slots=True)
class _Declared:
    """An actor's declarations with some rate limits left out (those paid before the
    claim): what ``acquire_for_actor`` reads."""

    name: str
    reservations: Sequence[Any]
    rate_limits: Sequence[Any]


@dataclass(slots=True)
class _Acquired:
    """What :meth:`Limits.acquire` took for one attempt (opaque to the attempt)."""

    job_id: UUID
    caps: list[tuple[Any, int]] = field(default_factory=list)
    resources: list[Any] = field(default_factory=list)


class Limits:
    """Rate limits, reservations and queue caps for one worker."""

    def __init__(
        self,
        engine: AsyncEngine,
        settings: WorkerSettings,
        worker_id: UUID,
        registry: Any = None,
    ) -> None:
        self._engine = engine
        self._settings = settings
        self._worker_id = worker_id
        self.registry = registry
        # Memory-backed rate limits read this clock (Redis and SQL ones use the store's).
        self._clock = SystemClock()
        self._redis: Any = None
        self.queue_caps: dict[str, Any] = {}
        self.active = False
        self._slots: dict[UUID, list[SlotHold]] = {}
        self.on_release: Callable[[list[str]], None] | None = None
        """Told the names of the slots this worker released (the dispatcher's gates)."""
        self.schema_name = settings.schema_name
        self.never_parked: frozenset[str] = frozenset()
        """Reservations taken before the claim (no job waits parked on them: their release
        wakes the other workers instead, :meth:`release_slot`)."""
        self.keep: Callable[[Any], bool] | None = None
        """Asked for each static slot a finished job releases: True when the dispatcher
        keeps it for its next claim (:meth:`taskq.worker.waiting.Gatekeeper.keep`)."""

    def prepare(self, actors: Iterable[ActorRef[Any, Any]]) -> None:
        """Pick the registry, register actor-declared primitives, check referenced names.

        In process only, so the boot runs it before touching the store: a configuration
        error fails the boot at once (``ConfigurationError`` / ``ValueError``, never
        retried as a connection failure) and leaves no ``workers`` row behind. Names of
        queue caps are checked by :meth:`boot`, which registers the caps.
        """
        from taskq.ratelimit import ConcurrencyReservation, SlidingWindow, TokenBucket
        from taskq.ratelimit import registry as default_registry

        refs = list(actors)
        if any(ref.rate_limits or ref.reservations for ref in refs) and self.registry is None:
            self.registry = default_registry
        if self.registry is not None:
            self._apply_caps()
        for ref in refs:
            for item in (*ref.rate_limits, *ref.reservations):
                if isinstance(item, TokenBucket | SlidingWindow | ConcurrencyReservation):
                    self.registry.register(item)
        self.check_names(refs, queue_caps=False)

    def _apply_caps(self) -> None:
        """The worker's registry honours ``TASKQ_MAX_KEYED_*`` (unless its constructor
        was given the caps)."""
        apply = getattr(self.registry, "apply_settings", None)
        if apply is not None:
            apply(
                max_keyed_rate_limits=self._settings.max_keyed_rate_limits,
                max_keyed_reservations=self._settings.max_keyed_reservations,
            )

    async def boot(self, actors: Iterable[ActorRef[Any, Any]]) -> None:
        """Set up queue caps, sync the slot rows of every reservation, open Redis.

        Runs after :meth:`prepare`. A queue with ``queues.max_concurrent`` gets a
        ``taskq:global:queue:{queue}`` reservation, registered in the registry like any
        other (``get_reservation`` finds it, ``reservations()`` lists its slots) and
        acquired first by every job on that queue. A failure here crashes the boot: a cap
        registered without its slot rows would deny every dispatch on that queue.
        """
        from taskq.ratelimit import ConcurrencyReservation, sync_slots
        from taskq.ratelimit import registry as default_registry
        from taskq.ratelimit.refs import queue_concurrency_reservation_name

        refs = list(actors)
        uses_limits = any(ref.rate_limits or ref.reservations for ref in refs)
        s = self._settings
        async with transaction(self._engine, readonly=True) as conn:
            caps = (await conn.execute(wq.queue_caps(s.queues))).all()
        if caps and self.registry is None:
            self.registry = default_registry
            self._apply_caps()
        slots = [
            item
            for ref in refs
            for item in ref.reservations
            if isinstance(item, ConcurrencyReservation)
        ]
        self.queue_caps = {}
        for queue, max_concurrent in caps:
            reservation = ConcurrencyReservation(
                queue_concurrency_reservation_name(queue),
                slots=int(max_concurrent),
                lease=s.lock_lease,
                schema=s.schema_name,
            )
            # The row read just now is the cap's one source of truth: it replaces a stale
            # registration left by an earlier worker in this process.
            self.registry.register_queue_cap(reservation)
            self.queue_caps[queue] = reservation
            slots.append(reservation)
        self.check_names(refs, queue_caps=True)
        if slots:
            await sync_slots(slots, pool=self._engine, schema=s.schema_name)
        if uses_limits and s.redis_url and any(ref.rate_limits for ref in refs):
            from redis.asyncio import Redis

            self._redis = Redis.from_url(s.redis_url)
        self.active = uses_limits or bool(self.queue_caps)

    def check_names(self, actors: Iterable[ActorRef[Any, Any]], *, queue_caps: bool) -> None:
        """Fail when an actor references an unregistered rate limit or reservation.

        Only plain names are checked (keyed refs register their concrete names lazily);
        ``queue_caps`` selects the ``taskq:global:queue:*`` names (checked once the caps
        are registered) or every other name. Without this a missing name surfaced as a
        ``KeyError`` in every attempt of the actor, spending its retry budget. Raises
        ``ConfigurationError`` listing every missing ``actor -> name``.
        """
        from taskq.ratelimit.refs import QUEUE_CAP_PREFIX

        missing: list[str] = []
        registry = self.registry
        for ref in actors:
            for kind, entries, lookup in (
                ("rate limit", ref.rate_limits, "get_rate_limit"),
                ("reservation", ref.reservations, "get_reservation"),
            ):
                for entry in entries:
                    if (
                        not isinstance(entry, str)
                        or entry.startswith(QUEUE_CAP_PREFIX) != queue_caps
                    ):
                        continue
                    try:
                        getattr(registry, lookup)(entry)
                    except (KeyError, AttributeError):
                        missing.append(f"actor {ref.name!r} references {kind} {entry!r}")
        if missing:
            raise ConfigurationError(
                "rate_limit_registry",
                "not registered: "
                + "; ".join(missing)
                + " (register primitives referenced by name before the worker starts, "
                "or declare the instance on the actor)",
            )

    async def acquire(
        self,
        job: RunningJob,
        payload: Any,
        *,
        prepaid: Sequence[AcquiredResource] = (),
        rate_limits: Sequence[Any] | None = None,
        reservations: Sequence[Any] | None = None,
    ) -> _Acquired:
        """Queue cap slot first, then the actor's reservations and rate limits, in order.

        ``prepaid``: slots and tokens the dispatcher took for this job before claiming it
        (see :mod:`taskq.worker.admission`); ``rate_limits`` and ``reservations`` then
        list what is left to take per job (the keyed refs). Raises ``ReservationUnavailable`` (after releasing
        what it took, prepaid tokens excepted) when one is denied. The slots taken are
        recorded for the heartbeat (:meth:`held_slots`) until released.
        """
        from taskq.ratelimit import ReservationHandle

        taken = _Acquired(job.id)
        cap = self.queue_caps.get(job.claimed.queue)
        if cap is not None:
            taken.caps.append((cap, await cap.acquire(job.id, self._worker_id, pool=self._engine)))
        ref = job.ref
        entries = ref.rate_limits if rate_limits is None else rate_limits
        slots = ref.reservations if reservations is None else reservations
        if (entries or slots) and self.registry is not None:
            actor = (
                ref
                if rate_limits is None and reservations is None
                else _Declared(ref.name, slots, entries)
            )
            try:
                taken.resources = await self.registry.acquire_for_actor(
                    actor,
                    payload,
                    job_id=job.id,
                    worker_id=self._worker_id,
                    redis_client=self._redis,
                    pg_pool=self._engine,
                    clock=self._clock,
                    settings=self._settings,
                )
            except BaseException:
                await self.release(taken)
                raise
        taken.resources = [*prepaid, *taken.resources]
        held = [SlotHold(res, slot, job.id) for res, slot in taken.caps]
        held += [
            SlotHold(h.primitive, h.slot_index, job.id)
            for h in taken.resources
            if isinstance(h, ReservationHandle)
        ]
        if held:
            self._slots[job.id] = held
        return taken

    async def release(self, acquired: _Acquired) -> None:
        """Give back reservation slots (rate-limit tokens stay spent), newest first, then
        wake one job parked on each released slot (:meth:`wake`)."""
        from taskq.ratelimit import ReservationHandle

        self._slots.pop(acquired.job_id, None)
        freed: list[str] = []
        kept = False
        if acquired.resources and self.registry is not None:
            rest: list[Any] = []
            for handle in reversed(acquired.resources):
                if not isinstance(handle, ReservationHandle):
                    continue
                if handle.name not in self.never_parked:
                    rest.append(handle)
                elif self.keep is not None and self.keep(handle):
                    kept = True  # handed to the next claim: no release, no round trip
                else:
                    await self.release_slot(handle.primitive, handle.slot_index)
                    freed.append(handle.name)
            if rest:
                await self.registry.release_for_actor(
                    list(reversed(rest)),
                    worker_id=self._worker_id,
                    redis_client=self._redis,
                    pg_pool=self._engine,
                    clock=self._clock,
                    settings=self._settings,
                )
                freed += [h.name for h in rest]
        for reservation, slot in reversed(acquired.caps):
            await reservation.release(slot, self._worker_id, pool=self._engine)
            freed.append(reservation.name)
        if kept and not freed and self.on_release is not None:
            self.on_release([])  # the claim loop comes round for the kept slot
        if freed:
            if self.on_release is not None:
                self.on_release(freed)
            parked_on = [name for name in freed if name not in self.never_parked]
            if parked_on:
                await self.wake(parked_on)

    async def wake(self, names: Sequence[str]) -> None:
        """Make one parked job per released slot of ``names`` claimable at once.

        One transaction for all of them; on Postgres a NOTIFY per queue of a woken job
        (delivered at commit) brings every worker's claim loop round, on SQLite the
        poll does. A failure is logged: the parked jobs still run at their fallback
        time (the lease end the denial reported).
        """
        counts: dict[str, int] = {}
        for name in names:
            counts[name] = counts.get(name, 0) + 1
        dialect = self._engine.dialect.name
        try:
            async with transaction(self._engine) as conn:
                woken: set[str] = set()
                for name, count in counts.items():
                    result = await conn.execute(dq.wake_parked(dialect, name, count))
                    woken.update(result.scalars())
                if woken and traits(dialect).notify:
                    for queue in sorted(woken):
                        await conn.execute(dq.notify_enqueued(self._settings.schema_name, queue))
        except (DBAPIError, SQLAlchemyError, OSError) as exc:
            _log.warning("worker-wake-failed", reservations=sorted(counts), error=str(exc))

    async def take_slot(self, reservation: Any) -> int:
        """A slot of ``reservation`` for a job not claimed yet (the dispatcher ties it to
        the job in the claim's transaction); ``ReservationUnavailable`` when all are held."""
        pool = None if reservation.clock is not None else self._engine
        index: int = await reservation.acquire(None, self._worker_id, pool)
        return index

    async def give_slot(self, reservation: Any, index: int) -> None:
        """Give back a slot of a static reservation that no job used (taken for a claim
        that found no job, or kept from a job that ended)."""
        try:
            await self.release_slot(reservation, index)
        except (DBAPIError, SQLAlchemyError, OSError) as exc:
            _log.warning("worker-slot-release-failed", reservation=reservation.name, error=str(exc))

    async def release_slot(self, reservation: Any, index: int) -> None:
        """Free a slot of a static reservation (taken before the claim: no job is parked
        on it to wake). On Postgres the same statement NOTIFYs every worker that it is
        free (``slot <name>``), so one whose claim found it full comes round at once; on
        SQLite they see it at their next look at the slots (the poll)."""
        if reservation.clock is not None:
            await reservation.release(index, self._worker_id, None)
            return
        engine = with_schema(self._engine, schema=reservation.schema)
        async with transaction(engine) as conn:
            if traits(conn.dialect.name).notify:
                channel = notify_channel(self._settings.schema_name)
                stmt = hq.release_slot_notify(channel, reservation.name, index, self._worker_id)
            else:
                stmt = rq.slot_release(reservation.name, index, self._worker_id)
            await conn.execute(stmt)

    async def acquire_rate(self, primitive: Any, count: float) -> Any:
        """One acquire of ``count`` tokens (one request for a sliding window) of
        ``primitive``, with this worker's stores (the dispatcher's prepay)."""
        kwargs: dict[str, Any] = {
            "redis_client": self._redis,
            "pg_pool": self._engine,
            "clock": self._clock,
            "settings": self._settings,
        }
        if hasattr(primitive, "refill_per_second"):
            return await primitive.acquire(count, **kwargs)
        return await primitive.acquire(**kwargs)

    async def refund_rate(self, primitive: Any, decision: Any, count: float) -> None:
        """Give ``count`` tokens of ``decision`` back (see the refund table in the docs:
        a no-op on the SQL backend). A failure is logged, never raised."""
        try:
            await primitive.refund(
                decision,
                count=count,
                redis_client=self._redis,
                pg_pool=self._engine,
                clock=self._clock,
                settings=self._settings,
            )
        except Exception as exc:
            _log.warning("worker-refund-failed", bucket=primitive.name, error=repr(exc))

    def held_slots(self, job_ids: Collection[UUID]) -> list[SlotHold]:
        """The reservation slots held by the listed jobs (the heartbeat renews these).

        Limited to ``job_ids`` (the jobs still in flight) so an attempt that never
        unwound to its release does not keep its slots alive past its row.
        """
        return [hold for job_id in job_ids for hold in self._slots.get(job_id, ())]

    def evict_idle(self) -> None:
        """Per-worker (not leader-gated) eviction of idle keyed primitives."""
        for name in ("evict_idle_keyed_rate_limits", "evict_idle_keyed_reservations"):
            evict = getattr(self.registry, name, None)
            if callable(evict):
                with contextlib.suppress(Exception):
                    evict()

    async def close(self) -> None:
        """Close the Redis client this worker opened (if any)."""
        if self._redis is not None:
            with contextlib.suppress(Exception):
                await self._redis.aclose()
