"""The attempt's dependency injection: one DI container per worker, one scope per attempt.

:class:`Dependencies` opens one DI scope per attempt (TRANSIENT instances live until the
attempt ends; a sync actor's THREAD instances are built on its own thread) and checks at
boot that every dependency has a provider.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterable
from typing import Any

import structlog
from sqlalchemy.ext.asyncio import AsyncConnection

from taskq.actor import ActorRef
from taskq.di import Container, ProviderRegistry, Scope
from taskq.exceptions import MissingProvider
from taskq.worker.state import RunningJob

__all__ = ["Dependencies"]

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

    async def loop_connection_instance(self) -> AsyncConnection:
        """The registered LOOP-scope ``AsyncConnection`` (built on first use, single-flight):
        the connection a ``TASKQ_MAX_CONCURRENCY=1`` worker runs each job's transaction on."""
        if self._container is None:
            raise RuntimeError("the DI container is not open")
        return await self._container.resolve(AsyncConnection)

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
