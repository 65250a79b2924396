"""One bad row never stops a queue: rows written by SQL that the worker cannot run.

A payload nested past the JSON decoder's depth, an ``attempt`` already at the top of its
column and a ``start_to_close_s`` that is negative or NaN are failed unrun with
``UndecodableJob``; the good jobs around them all run and the worker stays up.
"""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import Text, bindparam, cast, select, update
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.ext.asyncio import AsyncEngine

from taskq.backends.sql import SqlBackend
from taskq.client import JobsClient
from taskq.db.tables import jobs
from taskq.exceptions import UndecodableJob
from tests.e2e.apps import basic
from tests.support.workers import count_jobs, running_worker, wait_until, worker_settings

DEEP = '{"data": ' + "[" * 1500 + "]" * 1500 + "}"


async def _set(engine: AsyncEngine, job_id: Any, **values: Any) -> None:
    async with engine.begin() as conn:
        await conn.execute(update(jobs).where(jobs.c.id == job_id).values(**values))


async def _set_deep_payload(engine: AsyncEngine, job_id: Any) -> None:
    raw = bindparam("raw", type_=Text())
    value = cast(raw, JSONB()) if engine.dialect.name == "postgresql" else raw
    async with engine.begin() as conn:
        await conn.execute(
            update(jobs).where(jobs.c.id == job_id).values(payload=value), {"raw": DEEP}
        )


async def test_poison_rows_fail_alone_and_the_queue_keeps_flowing(engine: AsyncEngine) -> None:
    client = JobsClient(SqlBackend(engine))
    # Values from 100: another test leaves a CHECK on the shared database refusing 14.
    good = [await client.enqueue(basic.echo, basic.Echo(value=n)) for n in range(100, 120)]
    deep = await client.enqueue(basic.echo, basic.Echo(value=-1))
    top = await client.enqueue(basic.echo, basic.Echo(value=-2))
    negative = await client.enqueue(basic.echo, basic.Echo(value=-3))
    nan = await client.enqueue(basic.echo, basic.Echo(value=-4))
    await _set_deep_payload(engine, deep.job_id)
    await _set(engine, top.job_id, attempt=2147483647)
    await _set(engine, negative.job_id, start_to_close_s=-5.0)
    await _set(engine, nan.job_id, start_to_close_s=float("nan"))
    # Bad rows first in the queue, so every claim batch meets them.
    for bad in (deep, top, negative, nan):
        await _set(engine, bad.job_id, priority=10)

    with pytest.raises(UndecodableJob) as info:
        await client.get(deep.job_id)
    assert info.value.job_id == deep.job_id

    conf = worker_settings(engine.url, claim_batch_size=5, max_concurrency=5)
    async with running_worker(conf, basic.registry) as worker:
        await wait_until(lambda: _all_ended(engine, 24), timeout=60)
        claim_tasks = [t for t in worker._tasks if not t.done()]
        assert claim_tasks, "the worker's loops stopped"
        assert not worker.state.requested.is_set()

    async with engine.connect() as conn:
        stmt = select(jobs.c.id, jobs.c.status, jobs.c.error_class, jobs.c.error)
        rows = {r.id: r for r in (await conn.execute(stmt)).all()}
    for handle in good:
        assert rows[handle.job_id].status == "succeeded", rows[handle.job_id]
    columns = {deep: "payload", top: "attempt", negative: "start_to_close_s"}
    if engine.dialect.name == "postgresql":  # SQLite stores a NaN REAL as NULL
        columns[nan] = "start_to_close_s"
    for handle, column in columns.items():
        row = rows[handle.job_id]
        assert (row.status, row.error_class) == ("failed", "UndecodableJob"), row
        assert column in row.error


async def _all_ended(engine: AsyncEngine, total: int) -> bool:
    return await count_jobs(engine, "succeeded", "failed") >= total
