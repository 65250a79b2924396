"""Sync: plain ``def`` actors, the blocking ``taskq_sync`` facade, cooperative cancel.

What to observe:

- ``make_thumbnail`` is a plain ``def``: the worker runs it in a thread (``is_sync`` is
  ``True``), so its blocking call never stalls the event loop.
- the jobs are enqueued from blocking code with ``taskq_sync.TaskQ``, as a Django or
  Flask view would (here on a thread of its own); the async worker runs them all the same.
- ``long_export`` is a sync actor that polls ``ctx.should_abort()``; cancelled while it
  runs (``JobsClient.cancel``), it raises and ends ``cancelled`` with
  ``error_class='CancelledCooperatively'``. (Returning instead of raising would mark
  the job succeeded.)

Run: ``python -m examples.actors.sync [--database-url URL]``.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterable
from typing import Any
from uuid import UUID

from pydantic import BaseModel

import taskq_sync
from examples.actors import runner
from taskq import JobContext, JobHandle, TaskQ, actor

QUEUE = "examples.sync"
threads: set[str] = set()
_export: list[UUID] = []


class Image(BaseModel):
    name: str


class Thumbnail(BaseModel):
    name: str
    thread: str


class Export(BaseModel):
    rows: int


@actor(name="examples_sync_make_thumbnail", queue=QUEUE)
def make_thumbnail(payload: Image) -> Thumbnail:
    """Blocking work (an image library that releases the GIL, say), run in a thread."""
    time.sleep(0.05)
    return Thumbnail(name=f"thumb-{payload.name}", thread=threading.current_thread().name)


@actor(name="examples_sync_long_export", queue=QUEUE)
def long_export(payload: Export, ctx: JobContext[Export]) -> None:
    """A long loop that checks in often enough to be cancelled."""
    for _ in range(payload.rows):
        if ctx.should_abort():
            raise asyncio.CancelledError  # raise, do not return: returning means success
        time.sleep(0.05)


def enqueue_from_a_view(url: str) -> list[UUID]:
    """What a blocking web view does: no ``async``, no ``await``."""
    with taskq_sync.TaskQ(dsn=url) as tq:
        handles = [tq.jobs.enqueue(make_thumbnail, Image(name=f"{n}.jpg")) for n in range(4)]
        export = tq.jobs.enqueue(long_export, Export(rows=10_000))
    return [*(h.job_id for h in handles), export.job_id]


async def enqueue(tq: TaskQ) -> Iterable[UUID]:
    ids = await asyncio.to_thread(enqueue_from_a_view, tq.engine.url.render_as_string(False))
    _export[:] = ids[-1:]
    return ids


async def cancel_export(tq: TaskQ) -> None:
    handle: JobHandle[Any] = await tq.jobs.get(_export[0])
    for _ in range(600):  # until the worker has started it (at most 30 s)
        if await handle.status() == "running":
            break
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.2)
    await tq.jobs.cancel(_export[0])


async def notes(tq: TaskQ, report: runner.Report) -> list[str]:
    names = sorted({j.result["thread"] for j in report.by_actor(make_thumbnail.name)})
    return [
        f"make_thumbnail.is_sync={make_thumbnail.is_sync}; ran on threads {names}, "
        f"the event loop on {threading.main_thread().name}",
    ]


async def example(database_url: str | None = None) -> runner.Report:
    return await runner.run(
        "sync: plain def actors and the blocking facade",
        [make_thumbnail, long_export],
        enqueue,
        database_url=database_url,
        during=cancel_export,
        notes=notes,
    )


if __name__ == "__main__":
    runner.main(example)
