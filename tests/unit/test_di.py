"""ProviderRegistry: registration, validation and sealing, scopes, teardown order."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator

import pytest
from pydantic import BaseModel
from structlog.testing import capture_logs

from taskq import actor
from taskq.di import MissingProvider, ProviderRegistry, Scope, ScopeViolation


class Payload(BaseModel):
    n: int


class Database:
    pass


class Config:
    pass


class HttpClient:
    def __init__(self) -> None:
        self.closed = False

    async def aclose(self) -> None:
        self.closed = True


class MyService:
    def __init__(self, db: Database) -> None:
        self.db = db
        self.closed = False

    def close(self) -> None:
        self.closed = True


class Helper:
    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg


@actor(name="di_send_email")
async def send_email(payload: Payload, *, db: Database, http: HttpClient) -> None: ...


@actor(name="di_sync_actor")
def sync_actor(payload: Payload, *, http: HttpClient) -> None: ...


async def test_the_pages_registration_example() -> None:
    events: list[str] = []
    db_instance = Database()

    async def create_http_client() -> AsyncIterator[HttpClient]:
        client = HttpClient()
        try:
            yield client
        finally:
            events.append("http closed")
            await client.aclose()

    registry = ProviderRegistry()
    registry.register_value(Database, Scope.PROCESS, db_instance)
    registry.register_factory(HttpClient, Scope.LOOP, create_http_client)
    registry.register_class(MyService, Scope.LOOP)
    registry.validate(actors=[send_email])
    assert registry.sealed
    with pytest.raises(RuntimeError, match="sealed"):
        registry.register_value(Config, Scope.PROCESS, Config())

    container = registry.container()
    async with container.invocation() as inv:
        kwargs = await inv.kwargs_for(send_email)
    assert kwargs["db"] is db_instance
    http = kwargs["http"]
    assert isinstance(http, HttpClient)
    service = await container.resolve(MyService)
    assert service.db is db_instance
    assert await container.resolve(HttpClient) is http  # LOOP: one per container
    await container.aclose()
    assert events == ["http closed"]
    assert http.closed
    assert service.closed


async def test_transient_instances_are_fresh_and_torn_down() -> None:
    made: list[Helper] = []

    def make_helper(cfg: Config) -> Helper:
        helper = Helper(cfg)
        made.append(helper)
        return helper

    registry = ProviderRegistry()
    registry.register_value(Config, Scope.PROCESS, Config())
    registry.register_factory(Helper, Scope.TRANSIENT, make_helper)
    registry.validate()
    container = registry.container()
    for _ in range(2):
        async with container.invocation() as inv:
            await container.resolve(Helper, _transient=inv.stack)
    assert len(made) == 2
    with pytest.raises(ScopeViolation):
        await container.resolve(Helper)


def test_missing_provider_at_validate() -> None:
    registry = ProviderRegistry()
    registry.register_value(Database, Scope.PROCESS, Database())
    with pytest.raises(MissingProvider) as info:
        registry.validate(actors=[send_email])
    assert info.value.dependency is HttpClient


def test_scope_violation_at_validate() -> None:
    registry = ProviderRegistry()
    registry.register_factory(Config, Scope.TRANSIENT, Config)
    registry.register_class(Helper, Scope.PROCESS)
    with pytest.raises(ScopeViolation):
        registry.validate()


def test_the_payload_and_the_context_cannot_be_providers() -> None:
    """The page: payload and ctx are the worker's to supply, never registered."""
    from taskq.context import JobContext

    registry = ProviderRegistry()
    with pytest.raises(TypeError, match="JobContext"):
        registry.register_value(JobContext, Scope.PROCESS, object())
    registry.register_value(Database, Scope.PROCESS, Database())
    registry.register_class(HttpClient, Scope.PROCESS)
    registry.register_value(Payload, Scope.PROCESS, Payload(n=1))
    with pytest.raises(TypeError, match="payload type of actor 'di_send_email'"):
        registry.validate(actors=[send_email])
    assert not registry.sealed


def test_loop_scope_in_sync_actor_warns() -> None:
    registry = ProviderRegistry()
    registry.register_class(HttpClient, Scope.LOOP)
    with capture_logs() as logs:
        registry.validate(actors=[sync_actor])
    assert [e["event"] for e in logs if e["log_level"] == "warning"] == [
        "di_loop_scope_in_sync_actor"
    ]


async def test_thread_scope_gives_one_instance_per_thread() -> None:
    registry = ProviderRegistry()
    registry.register_class(Config, Scope.THREAD)

    @actor(name="di_thread_actor")
    def uses_config(payload: Payload, *, cfg: Config) -> None: ...

    registry.validate(actors=[uses_config])
    container = registry.container()
    seen: list[object] = []

    def run() -> None:
        first = container.thread_kwargs_for(uses_config)["cfg"]
        assert container.thread_kwargs_for(uses_config)["cfg"] is first
        seen.append(first)

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(seen) == 2
    assert seen[0] is not seen[1]
    await container.aclose()


class Slow:
    """Built by a factory that yields to the loop before returning."""


@pytest.mark.parametrize("scope", [Scope.LOOP, Scope.PROCESS])
async def test_concurrent_first_requests_share_one_build(scope: Scope) -> None:
    import asyncio

    calls: list[int] = []
    started = asyncio.Event()
    release = asyncio.Event()

    async def make_slow() -> AsyncIterator[Slow]:
        calls.append(1)
        started.set()
        await release.wait()  # every other request arrives while this one builds
        yield Slow()

    registry = ProviderRegistry()
    registry.register_factory(Slow, scope, make_slow)
    registry.validate()
    container = registry.container()
    tasks = [asyncio.ensure_future(container.resolve(Slow)) for _ in range(5)]
    await started.wait()
    await asyncio.sleep(0)
    release.set()
    instances = await asyncio.gather(*tasks)
    assert len(calls) == 1
    assert len({id(i) for i in instances}) == 1
    assert await container.resolve(Slow) is instances[0]
    await container.aclose()


async def test_a_failed_build_fails_its_waiters_and_is_retried_later() -> None:
    import asyncio

    attempts: list[int] = []
    release = asyncio.Event()

    async def flaky() -> Slow:
        attempts.append(1)
        await release.wait()
        if len(attempts) == 1:
            raise ConnectionError("first build fails")
        return Slow()

    registry = ProviderRegistry()
    registry.register_factory(Slow, Scope.LOOP, flaky)
    registry.validate()
    container = registry.container()
    tasks = [asyncio.ensure_future(container.resolve(Slow)) for _ in range(3)]
    await asyncio.sleep(0)
    release.set()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert all(isinstance(r, ConnectionError) for r in results)
    assert len(attempts) == 1  # the waiters did not each build their own
    again = await container.resolve(Slow)
    assert isinstance(again, Slow)
    assert len(attempts) == 2
    await container.aclose()


async def test_a_cancelled_builder_hands_the_build_to_a_waiter() -> None:
    import asyncio

    attempts: list[int] = []
    gate = asyncio.Event()

    async def make() -> Slow:
        attempts.append(1)
        await gate.wait()
        return Slow()

    registry = ProviderRegistry()
    registry.register_factory(Slow, Scope.LOOP, make)
    registry.validate()
    container = registry.container()
    builder = asyncio.ensure_future(container.resolve(Slow))
    await asyncio.sleep(0)
    waiter = asyncio.ensure_future(container.resolve(Slow))
    await asyncio.sleep(0)
    builder.cancel()
    await asyncio.sleep(0)
    gate.set()
    instance = await waiter
    assert isinstance(instance, Slow)
    assert builder.cancelled()
    assert len(attempts) == 2
    await container.aclose()
