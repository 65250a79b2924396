"""Dependency injection: actors declare what they need by type; the worker provides it.

What to observe:

- ``AppConfig`` is a value registered at ``Scope.PROCESS``: every job sees the same one.
- ``HttpClient`` comes from an async-generator factory at ``Scope.LOOP``: built once
  for the worker's event loop, shared by every job, and torn down (the code after
  ``yield``) when the worker stops: the ``http client closed`` note.
- ``RequestLog`` is a class registered at ``Scope.TRANSIENT``: a fresh instance per
  job, its ``aclose()`` called when the job ends.
- each result carries the ids of the instances its job received: one ``http`` id for
  all jobs, a different ``request`` id for each.

Run: ``python -m examples.actors.di [--database-url URL]``.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Iterable
from uuid import UUID

from pydantic import BaseModel

from examples.actors import runner
from taskq import TaskQ, actor
from taskq.di import ProviderRegistry, Scope

QUEUE = "examples.di"
events: list[str] = []
_ids = itertools.count(1)


class AppConfig:
    """Read-only settings, built once."""

    def __init__(self, api_base: str) -> None:
        self.api_base = api_base


class HttpClient:
    """Stands in for an ``httpx.AsyncClient``: expensive to build, shared per loop."""

    def __init__(self) -> None:
        self.id = next(_ids)

    async def get(self, url: str) -> str:
        return f"200 OK {url}"


class RequestLog:
    """One per job: collects what the job did and flushes it at the end."""

    def __init__(self) -> None:
        self.id = next(_ids)

    async def aclose(self) -> None:
        events.append(f"request log {self.id} flushed")


class Fetch(BaseModel):
    path: str


class Fetched(BaseModel):
    body: str
    http_id: int
    request_id: int


async def http_client() -> AsyncIterator[HttpClient]:
    client = HttpClient()
    events.append(f"http client {client.id} opened")
    try:
        yield client
    finally:
        events.append(f"http client {client.id} closed")


@actor(name="examples_di_fetch", queue=QUEUE)
async def fetch(
    payload: Fetch, *, config: AppConfig, http: HttpClient, request: RequestLog
) -> Fetched:
    """Fetch a URL with the injected client."""
    body = await http.get(config.api_base + payload.path)
    return Fetched(body=body, http_id=http.id, request_id=request.id)


def providers() -> ProviderRegistry:
    """The worker's registry: validated (and sealed) against the actors it will run."""
    registry = ProviderRegistry()
    registry.register_value(AppConfig, Scope.PROCESS, AppConfig("https://api.example.com"))
    registry.register_factory(HttpClient, Scope.LOOP, http_client)
    registry.register_class(RequestLog, Scope.TRANSIENT)
    registry.validate(actors=[fetch])
    return registry


async def enqueue(tq: TaskQ) -> Iterable[UUID]:
    handles = [await tq.jobs.enqueue(fetch, Fetch(path=f"/items/{n}")) for n in range(3)]
    return [h.job_id for h in handles]


async def notes(tq: TaskQ, report: runner.Report) -> list[str]:
    return list(events)


async def example(database_url: str | None = None) -> runner.Report:
    events.clear()
    return await runner.run(
        "di: PROCESS, LOOP and TRANSIENT providers",
        [fetch],
        enqueue,
        database_url=database_url,
        di_registry=providers(),
        notes=notes,
    )


if __name__ == "__main__":
    runner.main(example)
