"""A real PostgreSQL restart under two running worker processes: nothing is lost.

The server is a private cluster of this machine's PostgreSQL version (started from its own
binaries on a free port, in a temporary data directory), so restarting it disturbs no other
test run sharing the system server.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select
from sqlalchemy.engine import make_url

from taskq.backends.sql import SqlBackend
from taskq.client import JobsClient
from taskq.db import migrate
from taskq.db.engine import make_engine
from taskq.db.tables import workers
from taskq.records import EnqueueArgs
from taskq.settings import TaskQSettings
from tests.e2e import support
from tests.e2e.apps import basic
from tests.support import servers
from tests.support.workers import count_jobs, spawn_worker, stop_worker, wait_until


@pytest.fixture
def private_postgres() -> Iterator[servers.Server]:
    spec = servers.get_spec("postgres", "15")
    server = servers.start(spec, servers.system_postgres_bindir())
    try:
        yield server
    finally:
        servers.stop(server)


async def test_workers_finish_the_queue_across_a_real_postgres_restart(
    private_postgres: servers.Server,
    settings: TaskQSettings,
    runs_file: Path,
    tmp_path: Path,
    procs: list[Any],
) -> None:
    url = make_url(private_postgres.url)
    engine = make_engine(url, settings=settings)
    try:
        await migrate.upgrade(engine, settings=settings)
        for i in range(2):
            procs.append(
                spawn_worker(url, log_path=tmp_path / f"w{i}.log", lock_lease=5, max_concurrency=20)
            )

        async def both_running() -> bool:
            async with engine.connect() as conn:
                count = await conn.scalar(
                    select(func.count()).select_from(workers).where(workers.c.status == "running")
                )
            return count == 2

        await wait_until(both_running, timeout=90)  # both booted before the server goes away
        client = JobsClient(SqlBackend(engine, settings=settings))
        total = 2000
        items = [EnqueueArgs(basic.record, basic.Work(n=n, seconds=0.005)) for n in range(total)]
        for start in range(0, total, 1000):
            await client.enqueue_many(items[start : start + 1000])

        async def done(threshold: int) -> bool:
            return await count_jobs(engine, "succeeded", "failed") >= threshold

        def logs() -> str:
            return "".join((tmp_path / f"w{i}.log").read_text() for i in range(2))

        try:
            await wait_until(lambda: done(total // 4), timeout=90)
            await engine.dispose()  # our own pooled connections die with the restart too
            await asyncio.to_thread(servers.restart_postgres, private_postgres)
            await wait_until(lambda: done(total), timeout=120)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; worker logs:\n{logs()[-6000:]}") from None

        for proc in procs:
            assert proc.poll() is None, f"a worker died instead of reconnecting:\n{logs()[-8000:]}"
            assert stop_worker(proc) == 0
        rows = await support.job_rows(engine)
        recorded = support.runs(runs_file)
        assert len(rows) == total
        assert all(row.status == "succeeded" for row in rows.values())
        for job_id in rows:
            assert not support.overlapping(recorded[str(job_id)])
        for i in range(2):  # each worker really lost the server and carried on
            log = (tmp_path / f"w{i}.log").read_text()
            lost = ("worker-listen-lost", "worker-claim-failed", "worker-heartbeat-failed")
            assert any(event in log for event in lost), log[-4000:]
    finally:
        await engine.dispose()
