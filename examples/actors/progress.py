"""Progress: ``ctx.progress()`` from a running job, watched from outside while it runs.

What to observe:

- ``transcode`` reports ``step``, ``percent`` and ``detail`` after each of its five
  segments. The worker writes the newest state to the job row every
  ``progress_flush_interval`` (0.1 s here) and with the attempt's end.
- the watcher (``during``) re-reads the row while the job runs and prints each new state
  it sees: the percentages only ever grow, and the last one is 100 with
  ``detail='done'``, which is also what the row keeps after the job succeeded.
- with ``TASKQ_REDIS_URL`` set, the watcher follows ``handle.progress_stream()`` instead:
  every event of the job (``running``, each ``progress``, ``succeeded``) in ``seq`` order.

Run: ``python -m examples.actors.progress [--database-url URL]``.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterable
from typing import Any
from uuid import UUID

from pydantic import BaseModel

from examples.actors import runner
from taskq import JobContext, JobHandle, TaskQ, actor

QUEUE = "examples.progress"
SEGMENTS = 5
seen: list[str] = []
_job: list[UUID] = []


class Video(BaseModel):
    name: str


class Transcoded(BaseModel):
    name: str
    segments: int


@actor(name="examples_progress_transcode", queue=QUEUE)
async def transcode(payload: Video, ctx: JobContext[Video]) -> Transcoded:
    """Five slow segments, a progress report after each."""
    for i in range(1, SEGMENTS + 1):
        await asyncio.sleep(0.2)
        await ctx.progress(step=i, percent=100.0 * i / SEGMENTS, detail=f"segment {i}/{SEGMENTS}")
    await ctx.progress(detail="done")
    return Transcoded(name=payload.name, segments=SEGMENTS)


async def enqueue(tq: TaskQ) -> Iterable[UUID]:
    handle = await tq.jobs.enqueue(transcode, Video(name="holiday.mp4"))
    _job[:] = [handle.job_id]
    return [handle.job_id]


async def watch(tq: TaskQ) -> None:
    handle: JobHandle[Any] = await tq.jobs.get(_job[0])
    if os.environ.get("TASKQ_REDIS_URL"):
        async for event in handle.progress_stream(timeout=30):
            seen.append(f"seq {event.seq}: {event.event} {event.state}")
        return
    last = None
    while True:
        record = await handle.refresh()
        if record.progress and record.progress != last:
            last = record.progress
            seen.append(f"row progress: {last}")
        if record.is_terminal:
            return
        await asyncio.sleep(0.05)


async def notes(tq: TaskQ, report: runner.Report) -> list[str]:
    return [*seen, f"stored on the row at the end: {report.jobs[0].progress}"]


async def example(database_url: str | None = None) -> runner.Report:
    seen.clear()
    return await runner.run(
        "progress: ctx.progress() watched while it runs",
        [transcode],
        enqueue,
        database_url=database_url,
        during=watch,
        notes=notes,
    )


if __name__ == "__main__":
    runner.main(example)
