"""Tags: labels stored on a job, inherited by its sub-jobs.

What to observe in the ``tags`` notes:

- ``import_file`` is enqueued with ``tags=["tenant:acme", "import:7"]``; each
  ``import_row`` it enqueues inherits both.
- the ``audit`` sub-job adds ``tags=["audit"]``: explicit tags are merged after the
  inherited ones (``tenant:acme``, ``import:7``, ``audit``).
- the ``notify`` sub-job is enqueued with ``inherit_tags=False``: only its own
  ``["notify"]``.
- tags are read back from the store (``JobRecord.tags``), in the order they were given.

Run: ``python -m examples.actors.tags [--database-url URL]``.
"""

from __future__ import annotations

from collections.abc import Iterable
from uuid import UUID

from pydantic import BaseModel

from examples.actors import runner
from taskq import JobContext, TaskQ, actor

QUEUE = "examples.tags"


class ImportFile(BaseModel):
    import_id: int
    rows: int


class Row(BaseModel):
    import_id: int
    row: int


@actor(name="examples_tags_import_file", queue=QUEUE)
async def import_file(payload: ImportFile, ctx: JobContext[ImportFile]) -> None:
    """Split the file into row jobs (which inherit the tags), plus an audit and a notice."""
    assert ctx.jobs is not None
    for n in range(payload.rows):
        await ctx.jobs.enqueue(import_row, Row(import_id=payload.import_id, row=n))
    await ctx.jobs.enqueue(audit, Row(import_id=payload.import_id, row=-1), tags=["audit"])
    await ctx.jobs.enqueue(
        notify, Row(import_id=payload.import_id, row=-1), inherit_tags=False, tags=["notify"]
    )


@actor(name="examples_tags_import_row", queue=QUEUE)
async def import_row(payload: Row) -> None:
    """One row of the import."""


@actor(name="examples_tags_audit", queue=QUEUE)
async def audit(payload: Row) -> None:
    """Records that the import ran."""


@actor(name="examples_tags_notify", queue=QUEUE)
async def notify(payload: Row) -> None:
    """Tells someone: not part of the tenant's work, so it does not carry its tags."""


async def enqueue(tq: TaskQ) -> Iterable[UUID]:
    handle = await tq.jobs.enqueue(
        import_file, ImportFile(import_id=7, rows=2), tags=["tenant:acme", "import:7"]
    )
    return [handle.job_id]


async def notes(tq: TaskQ, report: runner.Report) -> list[str]:
    lines = []
    for job in report.jobs:
        record = await (await tq.jobs.get(job.id)).refresh()
        lines.append(f"tags of {job.actor}: {record.tags}")
    return lines


async def example(database_url: str | None = None) -> runner.Report:
    return await runner.run(
        "tags: stored, inherited, merged",
        [import_file, import_row, audit, notify],
        enqueue,
        database_url=database_url,
        notes=notes,
    )


if __name__ == "__main__":
    runner.main(example)
