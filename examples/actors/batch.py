"""Batch: ``enqueue_many``, all or nothing, in one transaction.

What to observe:

- 500 ``(actor, model)`` pairs go in with one ``enqueue_many`` call: one transaction
  (one ``INSERT`` per few hundred rows on SQLite, one ``COPY`` on Postgres), and the
  worker drains them in batches of claims.
- ``EnqueueArgs(actor, payload, options)`` carries per-job options (here ``priority``
  and ``tags``) inside the same batch.
- a batch with one invalid payload raises ``PayloadValidationError`` and writes
  nothing: the ``rejected batch`` note shows the job count unchanged.
- the sum of the results equals the sum of the inputs: no job lost, none run twice.

Run: ``python -m examples.actors.batch [--database-url URL]``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any
from uuid import UUID

from pydantic import BaseModel
from sqlalchemy import func, select

from examples.actors import runner
from taskq import EnqueueArgs, PayloadValidationError, TaskQ, actor
from taskq.db.engine import transaction
from taskq.db.tables import jobs

QUEUE = "examples.batch"
COUNT = 500


class Number(BaseModel):
    value: int


class Squared(BaseModel):
    value: int


@actor(name="examples_batch_square", queue=QUEUE)
async def square(payload: Number) -> Squared:
    """A tiny unit of work, many times over."""
    return Squared(value=payload.value * payload.value)


async def _count(tq: TaskQ) -> int:
    async with transaction(tq.engine, readonly=True) as conn:
        stmt = select(func.count()).select_from(jobs).where(jobs.c.actor == square.name)
        return int((await conn.execute(stmt)).scalar_one())


rejected: list[str] = []


async def enqueue(tq: TaskQ) -> Iterable[UUID]:
    before = await _count(tq)
    bad: list[Any] = [(square, Number(value=n)) for n in range(10)] + [(square, {"value": "x"})]
    try:
        await tq.jobs.enqueue_many(bad)
    except PayloadValidationError as exc:
        rejected.append(
            f"rejected batch: {type(exc).__name__} for {exc.actor}; jobs of the actor "
            f"before {before}, after {await _count(tq)}"
        )
    handles = await tq.jobs.enqueue_many([(square, Number(value=n)) for n in range(COUNT)])
    urgent = await tq.jobs.enqueue_many(
        [EnqueueArgs(square, Number(value=n), {"priority": 5, "tags": ["urgent"]}) for n in (7, 9)]
    )
    return [h.job_id for h in [*handles, *urgent]]


async def notes(tq: TaskQ, report: runner.Report) -> list[str]:
    total = sum(j.result["value"] for j in report.jobs if j.status == "succeeded")
    expected = sum(n * n for n in range(COUNT)) + 49 + 81
    return [*rejected, f"sum of the squares: {total} (expected {expected})"]


async def example(database_url: str | None = None) -> runner.Report:
    rejected.clear()
    return await runner.run(
        "batch: enqueue_many, all or nothing",
        [square],
        enqueue,
        database_url=database_url,
        settings=runner.worker_settings(database_url, max_concurrency=20, claim_batch_size=50),
        notes=notes,
    )


if __name__ == "__main__":
    runner.main(example)
