"""Limits shared by real worker processes (``tests.e2e.apps.waiting``): one token bucket
never over-admits across two workers, and a one-slot reservation runs its jobs back to
back across two workers, each handed on by a release, not by a lease.

Postgres and Redis; every primitive is named for the test (``unique_name``).
"""

from __future__ import annotations

import asyncio
import itertools
import subprocess
from pathlib import Path
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncEngine

from taskq.backends.sql import SqlBackend
from taskq.client import JobsClient
from taskq.db.engine import make_engine
from taskq.db.tables import job_attempts, jobs
from taskq.records import EnqueueArgs
from taskq.settings import TaskQSettings
from tests.e2e import support
from tests.e2e.apps import waiting
from tests.support.workers import spawn_worker, stop_worker, wait_until

APP = "tests.e2e.apps.waiting:registry"


async def _count(engine: AsyncEngine, *statuses: str) -> int:
    async with engine.connect() as conn:
        stmt = select(func.count()).select_from(jobs).where(jobs.c.status.in_(statuses))
        return int((await conn.execute(stmt)).scalar_one())


def _spawn(
    url: URL, tmp_path: Path, env: dict[str, str], n: int, **settings: Any
) -> subprocess.Popen[bytes]:
    return spawn_worker(
        url,
        APP,
        log_path=tmp_path / f"w{n}.log",
        env=env,
        redis_url="redis://127.0.0.1:6379/0",
        **settings,
    )


async def test_two_workers_sharing_one_bucket_never_over_admit(
    pg_url: URL,
    settings: TaskQSettings,
    runs_file: Path,
    tmp_path: Path,
    procs: list[Any],
    unique_name: str,
) -> None:
    """A fixed quota of 10 tokens (no refill) and 30 jobs, two workers: exactly 10 run,
    once each. The other 20 were never claimed: ``pending``, no attempt, no attempt rows,
    no denial (the workers' gates left them out of every claim)."""
    engine = make_engine(pg_url, settings=settings)
    try:
        client = JobsClient(SqlBackend(engine, settings=settings))
        await client.enqueue_many(
            [EnqueueArgs(waiting.throttled, waiting.Work(n=n)) for n in range(30)]
        )
        env = {"TASKQ_W_BUCKET": unique_name, "TASKQ_W_CAPACITY": "10", "TASKQ_W_RATE": "0"}
        procs.extend(_spawn(pg_url, tmp_path, env, n) for n in range(2))

        async def ten_done() -> bool:
            return await _count(engine, "succeeded") >= 10

        await wait_until(ten_done, timeout=60)
        # Both workers keep running claim rounds against the spent bucket a while longer.
        await asyncio.sleep(1.0)
        for proc in procs:
            assert stop_worker(proc) == 0

        rows = await support.job_rows(engine)
        attempts = await support.attempt_rows(engine)
        ran = [r for r in rows.values() if r.status == "succeeded"]
        held = [r for r in rows.values() if r.status != "succeeded"]
        assert len(ran) == 10
        assert all(r.attempt == 1 and len(attempts[r.id]) == 1 for r in ran)
        assert len(held) == 20
        assert {r.status for r in held} == {"pending"}
        assert all(r.attempt == 0 and r.denials == 0 and not attempts[r.id] for r in held)
        assert sum(len(v) for v in support.runs(runs_file).values()) == 10
    finally:
        await engine.dispose()


async def test_a_one_slot_reservation_runs_back_to_back_across_two_workers(
    pg_url: URL,
    settings: TaskQSettings,
    runs_file: Path,
    tmp_path: Path,
    procs: list[Any],
    unique_name: str,
) -> None:
    """20 jobs of 0.2 s behind ``ConcurrencyReservation(slots=1)`` with a 300 s lease, two
    worker processes: never two at once, each job runs once, and each starts right after
    the previous one ended: every hand-over took a small fraction of the lease (before,
    a denied job waited for the holder's lease to end)."""
    engine = make_engine(pg_url, settings=settings)
    try:
        client = JobsClient(SqlBackend(engine, settings=settings))
        await client.enqueue_many(
            [EnqueueArgs(waiting.mutex, waiting.Work(n=n, seconds=0.2)) for n in range(20)]
        )
        env = {"TASKQ_W_MUTEX": unique_name, "TASKQ_W_MUTEX_LEASE": "300"}
        procs.extend(_spawn(pg_url, tmp_path, env, n) for n in range(2))

        async def all_done() -> bool:
            return await _count(engine, "succeeded") == 20

        await wait_until(all_done, timeout=120)
        for proc in procs:
            assert stop_worker(proc) == 0

        recorded = support.runs(runs_file)
        spans = sorted(
            (
                min(t for _, _, e, t in events if e == "start"),
                max(t for _, _, e, t in events if e == "end"),
            )
            for events in recorded.values()
        )
        assert len(spans) == 20
        # The mutex held: each job started after the previous one ended.
        assert all(nxt[0] >= cur[1] for cur, nxt in itertools.pairwise(spans))
        # Back to back: a hand-over is a release and a claim, not a 300 s lease.
        gaps = [nxt[0] - cur[1] for cur, nxt in itertools.pairwise(spans)]
        assert max(gaps) < 300 / 100, gaps
        async with engine.connect() as conn:
            attempts = (
                await conn.execute(select(func.count()).select_from(job_attempts))
            ).scalar_one()
            parked = (await conn.execute(select(func.sum(jobs.c.denials)))).scalar_one()
        assert attempts == 20  # one attempt each: nothing was run twice or parked as one
        assert parked == 0  # the slot is taken before the claim: nobody was denied a job
    finally:
        await engine.dispose()
