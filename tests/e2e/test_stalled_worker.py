"""A worker frozen (SIGSTOP) past its lease does not finish the jobs it lost when resumed.

Its rows are reclaimed and re-run by another worker during the freeze; on SIGCONT the
frozen worker stops its attempts before their actors go on (their sleeps came due during
the freeze): the actors' "end" lines (their side effect after the sleep) come only from
the re-runs.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from sqlalchemy.engine import URL

from taskq.backends.sql import SqlBackend
from taskq.client import JobsClient
from taskq.db.engine import make_engine
from taskq.settings import TaskQSettings
from tests.e2e import support
from tests.e2e.apps import basic
from tests.support.workers import count_jobs, spawn_worker, stop_worker, wait_until

SLEEP_S = 3.0
LEASE_S = 2.0


async def test_a_worker_resumed_after_its_lease_stops_the_jobs_it_lost(
    pg_url: URL,
    settings: TaskQSettings,
    runs_file: Path,
    tmp_path: Path,
    procs: list[subprocess.Popen[bytes]],
) -> None:
    engine = make_engine(pg_url, settings=settings)
    conf: dict[str, Any] = {
        "lock_lease": LEASE_S,
        "max_concurrency": 5,
        "cancellation_grace_period": 1,
    }
    try:
        client = JobsClient(SqlBackend(engine, settings=settings))
        frozen = spawn_worker(pg_url, log_path=tmp_path / "frozen.log", **conf)
        procs.append(frozen)
        handles = [
            await client.enqueue(basic.sleep_async, basic.Work(n=n, seconds=SLEEP_S))
            for n in range(3)
        ]
        ids = {str(h.job_id) for h in handles}

        def starts(pid: int) -> dict[str, float]:
            recorded = support.runs(runs_file)
            return {
                job: stamp
                for job in ids
                for _attempt, p, event, stamp in recorded.get(job, [])
                if p == pid and event == "start"
            }

        async def started_by(pid: int) -> bool:
            return len(starts(pid)) == 3

        await wait_until(lambda: started_by(frozen.pid), timeout=60)
        os.kill(frozen.pid, signal.SIGSTOP)
        try:
            other = spawn_worker(pg_url, log_path=tmp_path / "other.log", **conf)
            procs.append(other)
            await wait_until(lambda: started_by(other.pid), timeout=90)
            # Past the moment the frozen actors' sleeps came due.
            due = max(starts(frozen.pid).values()) + SLEEP_S + 1.0
            await asyncio.sleep(max(0.0, due - time.time()))
        finally:
            os.kill(frozen.pid, signal.SIGCONT)

        async def all_done() -> bool:
            return await count_jobs(engine, "succeeded") == 3

        await wait_until(all_done, timeout=60)
        recorded = support.runs(runs_file)
        ended_by = {
            (job, pid)
            for job in ids
            for _attempt, pid, event, _stamp in recorded[job]
            if event == "end"
        }
        log = (tmp_path / "frozen.log").read_text()
        assert not any(pid == frozen.pid for _job, pid in ended_by), log[-4000:]
        assert {job for job, pid in ended_by if pid == other.pid} == ids

        async def isolated() -> bool:
            return "worker-isolated" in (tmp_path / "frozen.log").read_text()

        await wait_until(isolated, timeout=30)
        assert stop_worker(frozen) == 0
        assert stop_worker(other) == 0
    finally:
        await engine.dispose()
