"""Bulk operations at size while a real worker runs: ``cancel_where`` on 50,000 matching jobs
and ``purge`` of 200,000 finished ones touch nothing else, and enqueues keep succeeding
between their batches (no long lock on ``jobs``)."""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select, text
from sqlalchemy.engine import URL

from taskq.client import TaskQ
from taskq.db.engine import make_engine
from taskq.db.tables import jobs
from taskq.job_filter import JobFilter
from taskq.ops import CancelResult
from taskq.settings import TaskQSettings
from tests.e2e.apps import basic
from tests.support.workers import spawn_worker, wait_until

TO_CANCEL = 50_000
TO_PURGE = 200_000

_FILL = """
INSERT INTO jobs (id, actor, queue, status, payload, scheduled_at, created_at, updated_at,
                  finished_at, tags)
SELECT gen_random_uuid(), CAST(:actor AS text), 'default', CAST(:status AS text), '{}'::jsonb,
       t.at, t.at, t.at,
       CASE WHEN CAST(:status AS text) = 'succeeded' THEN t.at END,
       CAST(:tags AS jsonb)
FROM (SELECT now() - CAST(:age AS int) * interval '1 day' AS at) AS t,
     generate_series(1, CAST(:rows AS int))
"""


async def _counts(engine: Any) -> dict[tuple[str, str, str | None], int]:
    async with engine.connect() as conn:
        stmt = select(jobs.c.actor, jobs.c.status, jobs.c.error_class, func.count()).group_by(
            jobs.c.actor, jobs.c.status, jobs.c.error_class
        )
        return {(a, s, e): int(n) for a, s, e, n in (await conn.execute(stmt)).all()}


@pytest.mark.slow
async def test_cancel_where_and_purge_at_size_beside_a_worker_and_enqueues(
    pg_url: URL,
    settings: TaskQSettings,
    runs_file: Path,
    tmp_path: Path,
    procs: list[subprocess.Popen[bytes]],
) -> None:
    engine = make_engine(pg_url, settings=settings)
    tq = TaskQ(engine=engine, settings=settings)
    try:
        async with engine.begin() as conn:
            await conn.execute(text(f"SET LOCAL search_path TO {settings.schema_name}"))
            # Jobs of an actor no worker here runs, so only the operations touch them.
            for actor, status, age, tags, rows in (
                ("bulk_target", "pending", 0, '["bulk"]', TO_CANCEL),
                ("bulk_target", "pending", 0, '["keep"]', 500),
                ("bulk_old", "succeeded", 30, "[]", TO_PURGE),
                ("bulk_old", "succeeded", 1, "[]", 500),
            ):
                await conn.execute(
                    text(_FILL),
                    {"actor": actor, "status": status, "age": age, "tags": tags, "rows": rows},
                )
        procs.append(spawn_worker(pg_url, log_path=tmp_path / "worker.log", max_concurrency=4))

        events: list[str] = []
        stop = asyncio.Event()
        enqueued: list[Any] = []

        async def enqueue_steadily() -> None:
            while not stop.is_set():
                enqueued.append(await tq.jobs.enqueue(basic.noop, basic.Empty()))
                events.append("enqueue")
                await asyncio.sleep(0.01)

        def batch(kind: str) -> Callable[[int], None]:
            return lambda _done: events.append(kind)

        producer = asyncio.ensure_future(enqueue_steadily())
        try:
            await wait_until(lambda: _has(events, "enqueue"))
            cancelled = await tq.jobs.cancel_where(
                JobFilter(tags=["bulk"]), on_batch=batch("cancel-batch")
            )
            purged = await tq.jobs.purge(
                timedelta(days=7),
                ["succeeded"],
                on_batch=batch("purge-batch"),
            )
        finally:
            stop.set()
            await producer

        assert cancelled == CancelResult(cancelled_before_start=TO_CANCEL)
        assert (purged.deleted, purged.batches) == (TO_PURGE, TO_PURGE // 1000)
        # Enqueues completed between the batches of each operation: neither held jobs.
        for kind in ("cancel-batch", "purge-batch"):
            first, last = events.index(kind), len(events) - 1 - events[::-1].index(kind)
            assert "enqueue" in events[first:last], kind

        async def all_ran() -> bool:
            counts = await _counts(engine)
            return counts.get(("e2e_noop", "succeeded", None), 0) == len(enqueued)

        await wait_until(all_ran)
        counts = await _counts(engine)
        assert counts == {
            ("bulk_target", "cancelled", "CancelledBeforeStart"): TO_CANCEL,
            ("bulk_target", "pending", None): 500,
            ("bulk_old", "succeeded", None): 500,
            ("e2e_noop", "succeeded", None): len(enqueued),
        }
    finally:
        await tq.aclose()
        await engine.dispose()


async def _has(events: list[str], kind: str) -> bool:
    return kind in events
