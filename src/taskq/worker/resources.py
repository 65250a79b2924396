"""What an attempt holds besides its row: DI instances, reservation slots, rate-limit tokens.

:class:`Dependencies` opens one DI scope per attempt (TRANSIENT instances live until the
attempt ends; a sync actor's THREAD instances are built on its own thread) and checks at
boot that every dependency has a provider. :class:`Limits` registers actor-declared
primitives, sets up queue caps, and acquires/releases per attempt: the queue cap slot
first, then the actor's reservations and rate limits (``acquire_for_actor``).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterable
from typing import Any
from uuid import UUID

import structlog
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from taskq.actor import ActorRef
from taskq.db.engine import transaction
from taskq.db.queries import worker as wq
from taskq.di import Container, ProviderRegistry, Scope
from taskq.exceptions import MissingProvider
from taskq.settings import WorkerSettings
from taskq.testing.clock import SystemClock
from taskq.worker.state import RunningJob

__all__ = ["Dependencies", "Limits"]

_log = structlog.get_logger("taskq.worker")


def _scope_of(registry: ProviderRegistry, dep: type[object]) -> Scope | None:
    provider = registry.get(dep)
    return provider.scope if provider is not None else None


class Dependencies:
    """The worker's DI: one container per process, one scope per attempt."""

    def __init__(self, registry: ProviderRegistry | None) -> None:
        self._registry = registry
        self._container: Container | None = None

    def open(self, actors: Iterable[ActorRef[Any, Any]]) -> None:
        """Check every actor's dependencies (boot fails, not the first job) and open the
        container. An unsealed registry is validated (and sealed) here. A sync actor
        declaring a LOOP-scoped dependency gets a WARNING: loop-bound clients are not
        thread-safe."""
        refs = list(actors)
        needy = [ref for ref in refs if ref.dependencies]
        if self._registry is None:
            if needy:
                raise MissingProvider(next(iter(needy[0].dependencies.values())), needy[0].name)
            return
        if not self._registry.sealed:
            self._registry.validate(actors=refs)
        for ref in needy:
            for name, dep in ref.dependencies.items():
                scope = _scope_of(self._registry, dep)
                if scope is None:
                    raise MissingProvider(dep, ref.name)
                if ref.is_sync and scope is Scope.LOOP:
                    _log.warning(
                        "worker-sync-actor-loop-dependency",
                        actor=ref.name,
                        parameter=name,
                        dependency=dep.__qualname__,
                    )
        self._container = self._registry.container()

    @property
    def loop_connection(self) -> bool:
        """True when an ``AsyncConnection`` is registered at ``Scope.LOOP``: the signal that
        turns on transactional sub-jobs (a pool or engine registration does not)."""
        provider = self._registry.get(AsyncConnection) if self._registry is not None else None
        return provider is not None and provider.scope is Scope.LOOP

    @contextlib.asynccontextmanager
    async def scope(self, job: RunningJob) -> AsyncIterator[dict[str, object]]:
        """The attempt's loop-side keyword arguments; TRANSIENT ones torn down at exit."""
        if self._container is None or self._registry is None:
            raise RuntimeError(f"actor {job.ref.name!r} declares dependencies but no di_registry")
        registry = self._registry
        container = self._container
        ref = job.ref
        on_thread = {
            name
            for name, dep in ref.dependencies.items()
            if ref.is_sync and _scope_of(registry, dep) is Scope.THREAD
        }
        async with container.invocation() as inv:
            yield {
                name: await container.resolve(dep, _transient=inv.stack)
                for name, dep in ref.dependencies.items()
                if name not in on_thread
            }

    def thread_kwargs(self, job: RunningJob) -> dict[str, object]:
        """A sync actor's THREAD-scoped arguments, built on the calling (actor) thread."""
        if self._container is None:
            return {}
        return self._container.thread_kwargs_for(job.ref)

    async def close(self) -> None:
        """Tear the container down (PROCESS/LOOP/THREAD instances, newest first)."""
        if self._container is not None:
            with contextlib.suppress(Exception):
                await self._container.aclose()


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

    async def boot(self, actors: Iterable[ActorRef[Any, Any]]) -> None:
        """Register actor-declared primitives, sync their slots, and set up queue caps.

        A queue with ``queues.max_concurrent`` gets a ``taskq:global:queue:{queue}``
        reservation every job on it acquires first. A failure here crashes the boot: a
        cap registered without its slot rows would deny every dispatch on that queue.
        """
        from taskq.ratelimit import ConcurrencyReservation, SlidingWindow, TokenBucket, sync_slots
        from taskq.ratelimit import registry as default_registry
        from taskq.ratelimit.refs import queue_concurrency_reservation_name

        refs = list(actors)
        uses_limits = any(ref.rate_limits or ref.reservations for ref in refs)
        if uses_limits and self.registry is None:
            self.registry = default_registry
        declared = [
            item
            for ref in refs
            for item in (*ref.rate_limits, *ref.reservations)
            if isinstance(item, TokenBucket | SlidingWindow | ConcurrencyReservation)
        ]
        for item in declared:
            self.registry.register(item)
        slots = [i for i in declared if isinstance(i, ConcurrencyReservation)]
        s = self._settings
        async with transaction(self._engine, readonly=True) as conn:
            caps = (await conn.execute(wq.queue_caps(s.queues))).all()
        for queue, max_concurrent in caps:
            reservation = ConcurrencyReservation(
                queue_concurrency_reservation_name(queue),
                slots=int(max_concurrent),
                lease=s.lock_lease,
                schema=s.schema_name,
            )
            self.queue_caps[queue] = reservation
            slots.append(reservation)
        if slots:
            await sync_slots(slots, pool=self._engine, schema=s.schema_name)
        if uses_limits and s.redis_url and any(ref.rate_limits for ref in refs):
            from redis.asyncio import Redis

            self._redis = Redis.from_url(s.redis_url)
        self.active = uses_limits or bool(self.queue_caps)

    async def acquire(self, job: RunningJob, payload: Any) -> Any:
        """Queue cap slot first, then the actor's reservations and rate limits, in order.

        Raises ``ReservationUnavailable`` (after releasing what it took) when one is denied.
        """
        held: list[tuple[Any, int]] = []
        cap = self.queue_caps.get(job.row["queue"])
        if cap is not None:
            held.append((cap, await cap.acquire(job.id, self._worker_id, pool=self._engine)))
        ref = job.ref
        if not (ref.rate_limits or ref.reservations) or self.registry is None:
            return (held, [])
        try:
            acquired = await self.registry.acquire_for_actor(
                ref,
                payload,
                job_id=job.id,
                worker_id=self._worker_id,
                redis_client=self._redis,
                pg_pool=self._engine,
                clock=self._clock,
                settings=self._settings,
            )
        except BaseException:
            await self.release((held, []))
            raise
        return (held, acquired)

    async def release(self, acquired: Any) -> None:
        """Give back reservation slots (rate-limit tokens stay spent), newest first."""
        held, resources = acquired
        if resources and self.registry is not None:
            await self.registry.release_for_actor(
                resources,
                worker_id=self._worker_id,
                redis_client=self._redis,
                pg_pool=self._engine,
                clock=self._clock,
                settings=self._settings,
            )
        for reservation, slot in reversed(held):
            await reservation.release(slot, self._worker_id, pool=self._engine)

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
