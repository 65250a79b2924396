"""Basic: ``@actor``, ``enqueue``, a typed result, and direct invocation.

What to observe:

- ``greet`` is an ``async def`` actor taking a pydantic payload and returning a pydantic
  result; ``handle.wait()`` gives back a ``Greeted`` instance, not a dict.
- one job is enqueued with ``delay=`` (it is ``scheduled`` first, then runs), one with
  ``priority=``; every job succeeds in one attempt.
- ``await greet(payload)`` runs the handler in this process without the queue (what tests
  and simulators use): no job row is written for it.

Run: ``python -m examples.actors.basic [--database-url URL]``.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta
from uuid import UUID

from pydantic import BaseModel

from examples.actors import runner
from taskq import TaskQ, actor

QUEUE = "examples.basic"


class Greeting(BaseModel):
    name: str


class Greeted(BaseModel):
    message: str


@actor(name="examples_basic_greet", queue=QUEUE)
async def greet(payload: Greeting) -> Greeted:
    """Say hello: the smallest useful actor."""
    return Greeted(message=f"hello, {payload.name}")


async def enqueue(tq: TaskQ) -> Iterable[UUID]:
    handles = [
        await tq.jobs.enqueue(greet, Greeting(name="Ada")),
        await tq.jobs.enqueue(greet, {"name": "Grace"}),  # a dict is validated too
        await tq.jobs.enqueue(greet, Greeting(name="Edsger"), delay=timedelta(milliseconds=300)),
        await tq.jobs.enqueue(greet, Greeting(name="Barbara"), priority=10),
    ]
    delayed = await handles[2].status()
    print(f"enqueued {len(handles)} jobs; the delayed one is {delayed!r} until its time comes")
    return [h.job_id for h in handles]


async def notes(tq: TaskQ, report: runner.Report) -> list[str]:
    first = await tq.jobs.get(report.jobs[0].id, result_adapter=greet.result_adapter)
    typed = await first.wait(timeout=5)
    direct = await greet(Greeting(name="in-process"))
    return [
        f"handle.wait() returned {type(typed).__name__}(message={typed.message!r})",
        f"direct invocation returned {direct.message!r} without writing a job",
    ]


async def example(database_url: str | None = None) -> runner.Report:
    return await runner.run(
        "basic: @actor, enqueue, typed results",
        [greet],
        enqueue,
        database_url=database_url,
        notes=notes,
    )


if __name__ == "__main__":
    runner.main(example)
