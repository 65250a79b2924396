"""Two real worker processes run an every-second schedule; the leader is ``kill -9``ed
mid-run: over the measured window there is exactly one job per tick, none twice."""

from __future__ import annotations

import asyncio
import signal
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.engine import URL

from taskq.db.engine import make_engine
from taskq.db.tables import cron_schedules, jobs, leader_leases, workers
from taskq.settings import TaskQSettings
from tests.support.workers import spawn_worker, stop_worker, wait_until

APP = "tests.e2e.apps.cron:registry"


async def test_two_workers_one_job_per_tick_through_a_kill_9_of_the_leader(
    engine_url: str | URL,
    settings: TaskQSettings,
    tmp_path: Path,
    procs: list[subprocess.Popen[bytes]],
) -> None:
    engine = make_engine(engine_url, settings=settings)
    try:
        for i in range(2):
            procs.append(spawn_worker(engine_url, APP, log_path=tmp_path / f"w{i}.log"))

        async def both_up_and_a_leader() -> bool:
            async with engine.connect() as conn:
                running = (
                    await conn.execute(select(workers.c.pid).where(workers.c.status == "running"))
                ).all()
                lease = (await conn.execute(select(leader_leases.c.holder))).first()
            return len(running) == 2 and lease is not None

        await wait_until(both_up_and_a_leader, timeout=120, interval=0.2)
        await asyncio.sleep(3)  # both tick for a while
        async with engine.connect() as conn:
            holder = (await conn.execute(select(leader_leases.c.holder))).scalar_one()
            pid = (
                await conn.execute(select(workers.c.pid).where(workers.c.id == holder))
            ).scalar_one()
        [leader] = [p for p in procs if p.pid == pid]
        leader.send_signal(signal.SIGKILL)
        leader.wait(10)
        killed_at = datetime.now(UTC)
        await asyncio.sleep(4)  # the survivor carries on alone
        [survivor] = [p for p in procs if p is not leader]
        assert stop_worker(survivor) == 0

        async with engine.connect() as conn:
            keys = (
                (
                    await conn.execute(
                        select(jobs.c.idempotency_key).where(jobs.c.actor == "e2e-cron-beat")
                    )
                )
                .scalars()
                .all()
            )
            stored = (
                await conn.execute(
                    select(cron_schedules).where(cron_schedules.c.id == "every-second")
                )
            ).one()
    finally:
        await engine.dispose()
    ticks = sorted(
        datetime.strptime(k[5:25], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC) for k in keys
    )
    assert len(ticks) == len(set(ticks))  # none twice
    # Every tick from the first to the last has its job: count jobs against elapsed ticks.
    elapsed = int((ticks[-1] - ticks[0]).total_seconds()) + 1
    assert len(ticks) == elapsed
    assert ticks[0] < killed_at - timedelta(seconds=2)  # the window spans the kill
    assert ticks[-1] > killed_at + timedelta(seconds=2)
    assert stored.enqueued_count == len(ticks)
