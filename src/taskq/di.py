"""Dependency injection for actors: providers by type, four scopes, async teardown.

Register providers on a :class:`ProviderRegistry`, ``validate(actors=...)`` it (which
checks every dependency has a provider and no provider depends on a narrower scope, then
seals it), and hand it to the worker. The worker opens a :class:`Container` per process,
asks it for each invocation's keyword arguments and closes it on shutdown; teardown runs
in reverse order of creation (async generators resumed, ``aclose``/``close`` called).
"""

from __future__ import annotations

import asyncio
import enum
import inspect
import threading
import typing
from collections.abc import Callable, Iterable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

import structlog

from taskq.exceptions import MissingProvider, ScopeViolation

__all__ = [
    "Container",
    "Invocation",
    "MissingProvider",
    "Provider",
    "ProviderRegistry",
    "Scope",
    "ScopeViolation",
]

T = TypeVar("T")
_log = structlog.get_logger("taskq.di")


class Scope(enum.Enum):
    """How long a provided instance lives.

    PROCESS: worker start to exit. LOOP: event-loop start to close (pools, clients).
    TRANSIENT: one actor invocation. THREAD: one instance per OS thread (sync drivers used
    by sync actors, which run in threads).
    """

    PROCESS = "process"
    LOOP = "loop"
    THREAD = "thread"
    TRANSIENT = "transient"


# Wider scopes first: a provider may depend on its own scope or a wider one.
_WIDTH = {Scope.PROCESS: 3, Scope.LOOP: 2, Scope.THREAD: 1, Scope.TRANSIENT: 0}


@dataclass(frozen=True)
class Provider:
    """One registration: how to build ``type_`` and which types building it needs."""

    type_: type[Any]
    scope: Scope
    kind: str  # "value" | "factory" | "class"
    target: Any
    needs: dict[str, type[Any]] = field(default_factory=dict)


def _needs(fn: Callable[..., Any], what: str) -> dict[str, type[Any]]:
    try:
        hints = typing.get_type_hints(fn)
    except NameError as exc:
        raise TypeError(f"{what}: cannot resolve an annotation: {exc}") from exc
    needs: dict[str, type[Any]] = {}
    for param in inspect.signature(fn).parameters.values():
        if param.name == "self" or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        if param.default is not inspect.Parameter.empty:
            continue
        annotation = hints.get(param.name)
        if not isinstance(annotation, type):
            raise TypeError(f"{what}: parameter {param.name!r} needs a concrete class annotation")
        needs[param.name] = annotation
    return needs


class ProviderRegistry:
    """Providers keyed by the type an actor annotates its parameter with."""

    def __init__(self) -> None:
        self._providers: dict[type[Any], Provider] = {}
        self._sealed = False

    @property
    def sealed(self) -> bool:
        """True after :meth:`validate`: no more registrations."""
        return self._sealed

    def _add(self, provider: Provider) -> None:
        if self._sealed:
            raise RuntimeError(
                "ProviderRegistry is sealed (validate() was called); register before it"
            )
        if not isinstance(provider.type_, type):
            raise TypeError(f"providers are keyed by a class, got {provider.type_!r}")
        if not isinstance(provider.scope, Scope):
            raise TypeError(f"scope must be a Scope, got {provider.scope!r}")
        from taskq.context import JobContext

        if provider.type_ is JobContext:
            raise TypeError("JobContext is supplied by the worker and cannot be registered")
        self._providers[provider.type_] = provider

    def register_value(self, type_: type[T], scope: Scope, value: T) -> None:
        """Provide an already-built ``value`` for ``type_``."""
        self._add(Provider(type_, scope, "value", value))

    def register_factory(self, type_: type[T], scope: Scope, factory: Callable[..., Any]) -> None:
        """Provide ``type_`` by calling ``factory`` once per scope lifetime (single-flight:
        concurrent first requests share one call).

        ``factory`` may be a plain or ``async`` function, or a (async) generator that
        yields the instance and runs its teardown after the ``yield``. Its annotated
        parameters are themselves resolved from the registry.
        """
        if not callable(factory):
            raise TypeError("factory must be callable")
        self._add(
            Provider(
                type_,
                scope,
                "factory",
                factory,
                _needs(factory, f"factory for {type_.__qualname__}"),
            )
        )

    def register_class(self, cls: type[T], scope: Scope) -> None:
        """Provide ``cls`` by instantiating it (its ``__init__`` annotations are resolved).

        ``aclose()`` or ``close()`` on the instance is called at scope teardown.
        """
        init = cls.__init__
        needs = {} if init is object.__init__ else _needs(init, f"class {cls.__qualname__}")
        self._add(Provider(cls, scope, "class", cls, needs))

    def get(self, type_: type[Any]) -> Provider | None:
        """The provider registered for ``type_``, if any."""
        return self._providers.get(type_)

    def validate(self, actors: Iterable[Any] = ()) -> None:
        """Check the graph and seal the registry.

        Raises :class:`MissingProvider` for an actor or provider dependency with no
        provider, :class:`ScopeViolation` when a provider depends on a narrower scope (or
        on itself through a cycle), ``TypeError`` when an actor's payload type has been
        registered (the worker supplies the payload, as it does the context). Logs a
        WARNING for a sync actor taking a LOOP-scoped dependency (not thread-safe).
        """
        for provider in self._providers.values():
            self._check_provider(provider, [])
        for ref in actors:
            if ref.payload_type in self._providers:
                raise TypeError(
                    f"{ref.payload_type.__qualname__} is the payload type of actor "
                    f"{ref.name!r}: the worker supplies it, it cannot be registered as a provider"
                )
            for param, dep in ref.dependencies.items():
                dep_provider = self._providers.get(dep)
                if dep_provider is None:
                    raise MissingProvider(dep, f"actor {ref.name!r} parameter {param!r}")
                if ref.is_sync and dep_provider.scope is Scope.LOOP:
                    _log.warning(
                        "di_loop_scope_in_sync_actor",
                        actor=ref.name,
                        parameter=param,
                        dependency=dep.__qualname__,
                        hint="LOOP-scoped objects are not thread-safe; use Scope.THREAD or Scope.TRANSIENT",
                    )
        self._sealed = True

    def _check_provider(self, provider: Provider, path: list[type[Any]]) -> None:
        if provider.type_ in path:
            raise ScopeViolation(
                provider.type_,
                provider.type_,
                f"dependency cycle through {provider.type_.__qualname__}",
            )
        for dep in provider.needs.values():
            found = self._providers.get(dep)
            if found is None:
                raise MissingProvider(dep, f"provider for {provider.type_.__qualname__}")
            sub = found
            if _WIDTH[sub.scope] < _WIDTH[provider.scope]:
                raise ScopeViolation(
                    provider.type_,
                    dep,
                    f"{provider.type_.__qualname__} ({provider.scope.name}) depends on "
                    f"{dep.__qualname__} ({sub.scope.name}), a narrower scope",
                )
            self._check_provider(sub, [*path, provider.type_])

    def container(self) -> Container:
        """A fresh container holding PROCESS/LOOP/THREAD instances; close it with ``aclose``."""
        return Container(self)


class Container:
    """Live instances for one worker process (PROCESS, LOOP and THREAD scopes).

    ``async with container.invocation() as inv: kwargs = await inv.kwargs_for(actor)``
    resolves one invocation's keyword arguments; TRANSIENT instances die with ``inv``.
    """

    def __init__(self, registry: ProviderRegistry) -> None:
        self._registry = registry
        self._instances: dict[type[Any], Any] = {}
        self._pending: dict[type[Any], asyncio.Future[Any]] = {}
        """PROCESS/LOOP instances being built right now (see :meth:`_shared`)."""
        self._stack = AsyncExitStack()
        self._thread_local = threading.local()
        self._thread_stacks: list[AsyncExitStack] = []

    async def resolve(self, type_: type[T], *, _transient: AsyncExitStack | None = None) -> T:
        """The instance for ``type_`` (building it and its dependencies if needed)."""
        provider = self._registry.get(type_)
        if provider is None:
            raise MissingProvider(type_, "Container.resolve")
        if provider.scope is Scope.TRANSIENT:
            if _transient is None:
                raise ScopeViolation(
                    type_,
                    type_,
                    f"{type_.__qualname__} is TRANSIENT: resolve it inside an invocation",
                )
            return cast("T", await self._build(provider, _transient))
        if provider.scope is Scope.THREAD:
            cache: dict[type[Any], Any] = self._thread_local.__dict__.setdefault("instances", {})
            if type_ not in cache:
                stack = AsyncExitStack()
                self._thread_stacks.append(stack)
                cache[type_] = await self._build(provider, stack)
            return cast("T", cache[type_])
        return cast("T", await self._shared(type_, provider))

    async def _shared(self, type_: type[Any], provider: Provider) -> Any:
        """The PROCESS/LOOP instance for ``type_``, built once however many ask at once.

        Single-flight: the first request builds it; requests that arrive while it is being
        built (five jobs starting together, each needing the LOOP connection) wait for that
        build instead of starting their own. A build that fails fails its waiters too and
        leaves nothing cached, so a later request tries again; a build whose task was
        cancelled hands the build to the next waiter.
        """
        while True:
            if type_ in self._instances:
                return self._instances[type_]
            pending = self._pending.get(type_)
            if pending is None:
                return await self._build_shared(type_, provider)
            try:
                return await asyncio.shield(pending)
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if pending.cancelled() and task is not None and not task.cancelling():
                    continue  # the builder was cancelled, not this request: build it here
                raise

    async def _build_shared(self, type_: type[Any], provider: Provider) -> Any:
        pending: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[type_] = pending
        try:
            instance = await self._build(provider, self._stack)
        except asyncio.CancelledError:
            pending.cancel()
            raise
        except BaseException as exc:
            pending.set_exception(exc)
            pending.exception()  # retrieved: no "never retrieved" warning without waiters
            raise
        finally:
            del self._pending[type_]
        self._instances[type_] = instance
        pending.set_result(instance)
        return instance

    async def _build(self, provider: Provider, stack: AsyncExitStack) -> Any:
        if provider.kind == "value":
            return provider.target
        kwargs = {
            name: await self.resolve(dep, _transient=stack) for name, dep in provider.needs.items()
        }
        target = provider.target
        if provider.kind == "class":
            instance = target(**kwargs)
            aclose = getattr(instance, "aclose", None)
            close = getattr(instance, "close", None)
            if callable(aclose):
                stack.push_async_callback(_maybe_await, aclose)
            elif callable(close):
                stack.push_async_callback(_maybe_await, close)
            return instance
        if inspect.isasyncgenfunction(target):
            return await stack.enter_async_context(asynccontextmanager(target)(**kwargs))
        if inspect.isgeneratorfunction(target):
            from contextlib import contextmanager

            return stack.enter_context(contextmanager(target)(**kwargs))
        return await _maybe_await(target, **kwargs)

    def thread_kwargs_for(self, actor: Any) -> dict[str, object]:
        """Build a sync actor's THREAD-scoped dependencies on the calling thread.

        Call it inside the actor's thread; each thread gets (and keeps) its own instances.
        THREAD providers used this way must be values, classes or plain (generator) factories.
        """
        cache: dict[type[Any], Any] = self._thread_local.__dict__.setdefault("instances", {})
        out: dict[str, object] = {}
        for name, dep in actor.dependencies.items():
            provider = self._registry.get(dep)
            if provider is None or provider.scope is not Scope.THREAD:
                continue
            if dep not in cache:
                cache[dep] = self._build_sync(provider)
            out[name] = cache[dep]
        return out

    def _build_sync(self, provider: Provider) -> Any:
        if provider.kind == "value":
            return provider.target
        kwargs = {
            name: self._instances[dep]
            for name, dep in provider.needs.items()
            if dep in self._instances
        }
        if inspect.isgeneratorfunction(provider.target):
            from contextlib import ExitStack, contextmanager

            exit_stack = ExitStack()
            instance = exit_stack.enter_context(contextmanager(provider.target)(**kwargs))
            holder = AsyncExitStack()
            holder.callback(exit_stack.close)
            self._thread_stacks.append(holder)
            return instance
        if inspect.iscoroutinefunction(provider.target) or inspect.isasyncgenfunction(
            provider.target
        ):
            raise TypeError(
                f"THREAD provider for {provider.type_.__qualname__} must be synchronous"
            )
        return provider.target(**kwargs)

    @asynccontextmanager
    async def invocation(self) -> typing.AsyncIterator[Invocation]:
        """A TRANSIENT scope for one actor invocation; its instances are torn down on exit."""
        async with AsyncExitStack() as stack:
            yield Invocation(self, stack)

    async def aclose(self) -> None:
        """Tear down every PROCESS/LOOP/THREAD instance, newest first."""
        for stack in reversed(self._thread_stacks):
            await stack.aclose()
        self._thread_stacks.clear()
        await self._stack.aclose()
        self._instances.clear()


@dataclass
class Invocation:
    """One invocation's transient scope (see :meth:`Container.invocation`)."""

    container: Container
    stack: AsyncExitStack

    async def kwargs_for(self, actor: Any) -> dict[str, object]:
        """Resolve an ``ActorRef``'s DI parameters into the keyword arguments to call it with."""
        return {
            name: await self.container.resolve(dep, _transient=self.stack)
            for name, dep in actor.dependencies.items()
        }


async def _maybe_await(fn: Callable[..., Any], /, **kwargs: Any) -> Any:
    result = fn(**kwargs)
    if inspect.isawaitable(result):
        return await result
    return result
