"""One driver for the producer-side behavioural suite over every store and both clients.

``Env`` runs the same async test body against Postgres, SQLite or ``InMemoryBackend``,
with the async client (``taskq``) or the blocking one (``taskq_sync``, called from a
thread). Helpers write terminal rows directly, standing in for the worker.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
from collections.abc import Callable, Mapping
from typing import Any
from uuid import UUID

from sqlalchemy import func, select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from taskq.db.tables import jobs
from taskq.exceptions import PayloadValidationError
from taskq.testing.in_memory import InMemoryBackend

STORES_AND_MODES = [
    ("postgres", "async"),
    ("postgres", "sync"),
    ("sqlite", "async"),
    ("sqlite", "sync"),
    ("memory", "async"),
]


@dataclasses.dataclass
class Env:
    store: str
    mode: str
    client: Any
    engine: AsyncEngine | None = None
    memory: InMemoryBackend | None = None
    sync_tq: Any = None
    async_tq: Any = None

    @property
    def sql(self) -> bool:
        return self.store != "memory"

    async def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Call a client or handle method in this env's mode and return its result."""
        if self.mode == "sync":
            return await asyncio.to_thread(fn, *args, **kwargs)
        result = fn(*args, **kwargs)
        if inspect.isawaitable(result):
            result = await result
        return result

    async def enqueue(self, actor: Any, payload: Any, **options: Any) -> Any:
        return await self.call(self.client.enqueue, actor, payload, **options)

    async def finish(
        self, job_id: UUID, status: str, result: Any = None, error_class: str | None = None
    ) -> None:
        """Write a terminal row as a worker would."""
        if self.memory is not None:
            job = self.memory.jobs[job_id]
            now = self.memory.clock.now()
            self.memory.jobs[job_id] = dataclasses.replace(
                job, status=status, result=result, error_class=error_class, finished_at=now
            )
            await self.memory._notify()
            return
        assert self.engine is not None
        async with self.engine.begin() as conn:
            await conn.execute(
                update(jobs)
                .where(jobs.c.id == job_id)
                .values(
                    status=status,
                    result=result,
                    error_class=error_class,
                    finished_at=func.current_timestamp(),
                )
            )

    async def count(self, actor: str, statuses: tuple[str, ...] | None = None) -> int:
        """How many jobs of ``actor`` exist (in ``statuses``)."""
        if self.memory is not None:
            return sum(
                1
                for j in self.memory.jobs.values()
                if j.actor == actor and (statuses is None or j.status in statuses)
            )
        assert self.engine is not None
        stmt = select(func.count()).select_from(jobs).where(jobs.c.actor == actor)
        if statuses is not None:
            stmt = stmt.where(jobs.c.status.in_(statuses))
        async with self.engine.connect() as conn:
            return int((await conn.execute(stmt)).scalar_one())

    async def set_stored_max_pending(self, actor: str, value: int | None) -> None:
        """Set ``actor_config.max_pending`` as an operator would."""
        if self.memory is not None:
            self.memory.stored_max_pending[actor] = value
            return
        tq = self.sync_tq if self.mode == "sync" else self.async_tq
        await self.call(tq.actors.set, actor, max_pending=value)


# --- multi-process race (spawned children import this module) -------------------------

from datetime import timedelta  # noqa: E402

from pydantic import BaseModel  # noqa: E402

from taskq import actor  # noqa: E402


class RacePayload(BaseModel):
    n: int


@actor(name="race_unique_proc", unique_for=timedelta(minutes=10))
async def race_unique(payload: RacePayload) -> None: ...


def enqueue_in_process(url: str, barrier: Any, count: int) -> list[tuple[str, bool]]:
    """Child process: wait for every sibling, then enqueue ``count`` times from threads."""
    import os
    from concurrent.futures import ThreadPoolExecutor

    from taskq.settings import TaskQSettings
    from taskq_sync import TaskQ

    settings = TaskQSettings.load(database_url=None, redis_url=None, schema_name="taskq")
    with TaskQ(url, settings=settings) as tq:
        tq.jobs.enqueue(race_unique, RacePayload(n=-1), identity_key=f"warmup-{os.getpid()}")
        barrier.wait()
        with ThreadPoolExecutor(count) as pool:
            handles = list(
                pool.map(
                    lambda i: tq.jobs.enqueue(race_unique, RacePayload(n=i), identity_key="race"),
                    range(count),
                )
            )
    return [(str(h.job_id), h.was_existing) for h in handles]


def first_error(exc: PayloadValidationError) -> Mapping[str, Any]:
    """The first of pydantic's errors that ``exc`` carries (not a plain message)."""
    assert not isinstance(exc.errors, str), exc.errors
    return exc.errors[0]
