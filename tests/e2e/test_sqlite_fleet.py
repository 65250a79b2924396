"""Several worker processes on one SQLite file: every job runs exactly once.

The embedded engine has no row locks; ``BEGIN IMMEDIATE`` serialises each claim, so a
claimed batch is invisible to the next claimant. This drains 5,000 jobs with 3 real
``taskq.worker`` processes and checks, from the actors' own start/end records, that no
job ran twice and no two runs of a job overlapped, and that the store agrees.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from taskq.backends.sql import SqlBackend
from taskq.client import JobsClient
from taskq.db.engine import make_engine
from taskq.records import EnqueueArgs
from taskq.settings import TaskQSettings
from tests.e2e import support
from tests.e2e.apps import basic
from tests.support.workers import count_jobs, spawn_worker, stop_worker, wait_until

pytestmark = pytest.mark.e2e

TOTAL = 5_000
PROCESSES = 3


async def test_five_thousand_jobs_three_processes_one_sqlite_file_exactly_once(
    sqlite_url: str,
    settings: TaskQSettings,
    runs_file: Path,
    tmp_path: Path,
    procs: list[Any],
) -> None:
    engine = make_engine(sqlite_url, settings=settings)
    try:
        client = JobsClient(SqlBackend(engine, settings=settings))
        items = [EnqueueArgs(basic.record, basic.Work(n=n)) for n in range(TOTAL)]
        for start in range(0, TOTAL, 1000):
            await client.enqueue_many(items[start : start + 1000])
        started = time.monotonic()
        for i in range(PROCESSES):
            procs.append(
                spawn_worker(
                    sqlite_url,
                    log_path=tmp_path / f"w{i}.log",
                    max_concurrency=50,
                    claim_batch_size=50,
                )
            )

        async def drained() -> bool:
            return await count_jobs(engine, "succeeded", "failed") >= TOTAL

        await wait_until(drained, timeout=60, interval=0.25)
        elapsed = time.monotonic() - started
        for proc in procs:
            assert stop_worker(proc) == 0

        rows = await support.job_rows(engine)
        attempts = await support.attempt_rows(engine)
        recorded = support.runs(runs_file)
        assert len(rows) == TOTAL
        assert {row.status for row in rows.values()} == {"succeeded"}
        assert all(row.attempt == 1 for row in rows.values())
        assert all([a.outcome for a in attempts[job_id]] == ["succeeded"] for job_id in rows)
        # The handlers' own records: one start and one end per job, never overlapping.
        assert set(recorded) == {str(job_id) for job_id in rows}
        for job_id, events in recorded.items():
            kinds = sorted(e[2] for e in events)
            assert kinds == ["end", "start"], (job_id, events)
            assert not support.overlapping(events), job_id
            (start_e,) = [e for e in events if e[2] == "start"]
            (end_e,) = [e for e in events if e[2] == "end"]
            assert start_e[1] == end_e[1]  # started and ended in the same process
        starts = sum(1 for events in recorded.values() for e in events if e[2] == "start")
        assert starts == TOTAL
        pids = {e[1] for events in recorded.values() for e in events}
        assert len(pids) == PROCESSES  # the work really was shared
        print(f"{TOTAL} jobs, {PROCESSES} processes, one SQLite file: drained in {elapsed:.1f}s")
    finally:
        await engine.dispose()
