"""The fault suite: real worker processes under kills, outages, freezes and poison rows.

Every scenario is bounded (each wait has a deadline) and stops everything it started.
Servers a scenario stops or freezes are private ones on free ports
(:mod:`tests.support.servers`), never the machine's shared ones. Every scenario ends with
:func:`tests.chaos.audit.check`: no job lost, attempts equal runs, no overlapping runs
outside the documented freeze window. Sizes: :data:`tests.chaos.conftest.SCALE`.
"""

from __future__ import annotations

import asyncio
import functools
import os
import random
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Text, bindparam, cast, func, select, update
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.engine import URL, make_url
from sqlalchemy.ext.asyncio import AsyncEngine

from taskq.actor import ActorRef
from taskq.backends.sql import SqlBackend
from taskq.client import JobsClient
from taskq.db import migrate
from taskq.db.engine import make_engine
from taskq.db.tables import jobs, workers
from taskq.records import EnqueueArgs
from taskq.settings import TaskQSettings
from tests.chaos import apps
from tests.chaos.audit import Faults, check, read
from tests.chaos.conftest import Scale
from tests.support import servers
from tests.support.workers import count_jobs, spawn_worker, stop_worker, wait_until

APP = "tests.chaos.apps:registry"
WORKER: dict[str, Any] = {
    "lock_lease": 2.0,
    "heartbeat_interval": 0.5,
    "sweep_interval": 0.5,
    "max_concurrency": 10,
    "claim_batch_size": 10,
    "cancellation_grace_period": 1.0,
    "cleanup_grace_period": 1.0,
    "termination_grace_period": 5.0,
}


class Fleet:
    """The scenario's worker processes and their logs."""

    def __init__(self, url: str | URL, tmp_path: Path, procs: list[subprocess.Popen[bytes]]):
        self.url = url
        self.tmp_path = tmp_path
        self.procs = procs
        self.live: list[subprocess.Popen[bytes]] = []
        self._n = 0

    def spawn(self, **extra: Any) -> subprocess.Popen[bytes]:
        self._n += 1
        settings = {**WORKER, **extra}
        proc = spawn_worker(self.url, APP, log_path=self.tmp_path / f"w{self._n}.log", **settings)
        self.procs.append(proc)
        self.live.append(proc)
        return proc

    def logs(self) -> str:
        return "".join(p.read_text() for p in sorted(self.tmp_path.glob("w*.log")))

    def stop_all(self) -> None:
        for proc in self.live:
            assert proc.poll() is None, f"a worker died:\n{self.logs()[-6000:]}"
        for proc in self.live:
            assert stop_worker(proc) == 0, self.logs()[-6000:]


async def _enqueue(
    engine: AsyncEngine, settings: TaskQSettings, ref: ActorRef[Any, Any], n: int, seconds: float
) -> set[Any]:
    client = JobsClient(SqlBackend(engine, settings=settings))
    ids: set[Any] = set()
    for start in range(0, n, 1000):
        items = [
            EnqueueArgs(ref, apps.Work(n=i, seconds=seconds))
            for i in range(start, min(n, start + 1000))
        ]
        ids.update(h.job_id for h in await client.enqueue_many(items))
    return ids


async def _running_workers(engine: AsyncEngine, count: int) -> None:
    async def ready() -> bool:
        async with engine.connect() as conn:
            n = await conn.scalar(
                select(func.count()).select_from(workers).where(workers.c.status == "running")
            )
        return n is not None and n >= count

    await wait_until(ready, timeout=90)


async def _until_done(engine: AsyncEngine, fleet: Fleet, total: int, limit_s: float) -> None:
    async def done() -> bool:
        return await count_jobs(engine, "succeeded", "failed", "abandoned") >= total

    try:
        await wait_until(done, timeout=limit_s, interval=0.2)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; worker logs:\n{fleet.logs()[-6000:]}") from None


async def test_kill_storm(
    pg_url: URL,
    settings: TaskQSettings,
    audit_path: Path,
    tmp_path: Path,
    procs: list[subprocess.Popen[bytes]],
    scale: Scale,
) -> None:
    """``kill -9`` a worker again and again while the queue drains; a new one replaces it."""
    engine = make_engine(pg_url, settings=settings)
    try:
        fleet = Fleet(pg_url, tmp_path, procs)
        for _ in range(3):
            fleet.spawn()
        await _running_workers(engine, 3)
        ids = await _enqueue(engine, settings, apps.work_async, scale.jobs * 3 // 4, 0.2)
        ids |= await _enqueue(engine, settings, apps.work_sync, scale.jobs // 4, 0.2)
        faults = Faults()
        rng = random.Random(26)
        for k in range(scale.kills):
            threshold = (k + 1) * len(ids) // (scale.kills + 2)
            await wait_until(
                functools.partial(_at_least, engine, threshold),
                timeout=scale.timeout_s,
                interval=0.1,
            )
            victim = rng.choice([p for p in fleet.live if p.poll() is None])
            os.kill(victim.pid, signal.SIGKILL)
            faults.killed[victim.pid] = time.time()
            victim.wait()
            fleet.live.remove(victim)
            fleet.spawn()
        await _until_done(engine, fleet, len(ids), scale.timeout_s)
        fleet.stop_all()
        await check(engine, audit_path, ids, faults, scenario="kill storm")
    finally:
        await engine.dispose()


async def _at_least(engine: AsyncEngine, threshold: int) -> bool:
    return await count_jobs(engine, "succeeded") >= threshold


@pytest.mark.parametrize("fault", ["restart", "outage"])
async def test_postgres_restart_and_outage_longer_than_the_lease(
    fault: str,
    private_postgres: servers.Server,
    settings: TaskQSettings,
    audit_path: Path,
    tmp_path: Path,
    procs: list[subprocess.Popen[bytes]],
    scale: Scale,
) -> None:
    """The database restarts (every connection dropped mid-work, back at once), or goes
    away for longer than the lock lease, then comes back."""
    url = make_url(private_postgres.url)
    engine = make_engine(url, settings=settings)
    try:
        await migrate.upgrade(engine, settings=settings)
        fleet = Fleet(url, tmp_path, procs)
        fleet.spawn()
        fleet.spawn()
        await _running_workers(engine, 2)
        ids = await _enqueue(engine, settings, apps.work_async, scale.jobs // 2, 0.1)
        await wait_until(lambda: _at_least(engine, len(ids) // 4), timeout=scale.timeout_s)
        await engine.dispose()
        before = private_postgres.pid
        outage_s = scale.outage_s if fault == "outage" else 0.0
        await asyncio.to_thread(servers.pause_postgres, private_postgres, outage_s)
        assert private_postgres.pid != before  # a new postmaster: every connection was cut
        await _until_done(engine, fleet, len(ids), scale.timeout_s)
        fleet.stop_all()
        faults = Faults(other=1)
        figures = await check(engine, audit_path, ids, faults, scenario=f"postgres {fault}")
        assert figures["jobs"] == len(ids)
        if fault == "outage":
            assert "worker-heartbeat-failed" in fleet.logs()  # the outage really happened
    finally:
        await engine.dispose()


async def _rate_limited(
    pg_url: URL,
    settings: TaskQSettings,
    redis: servers.Server,
    tmp_path: Path,
    procs: list[subprocess.Popen[bytes]],
    audit_path: Path,
    scale: Scale,
    *,
    freeze: bool,
) -> str:
    engine = make_engine(pg_url, settings=settings)
    try:
        fleet = Fleet(pg_url, tmp_path, procs)
        fleet.spawn(redis_url=redis.url)
        fleet.spawn(redis_url=redis.url)
        await _running_workers(engine, 2)
        ids = await _enqueue(engine, settings, apps.limited, 200, 0.0)
        await wait_until(lambda: _at_least(engine, 40), timeout=scale.timeout_s)
        assert redis.pid is not None
        faults = Faults(other=1)
        extra: dict[str, Any] = {}
        if freeze:
            os.kill(redis.pid, signal.SIGSTOP)
            frozen_at, done_before = time.monotonic(), await count_jobs(engine, "succeeded")
            try:
                # Jobs keep flowing on the Postgres fallback while Redis is frozen.
                await wait_until(lambda: _at_least(engine, 120), timeout=scale.timeout_s)
            finally:
                os.kill(redis.pid, signal.SIGCONT)
            during = await count_jobs(engine, "succeeded") - done_before
            extra["jobs_per_s_while_frozen"] = round(during / (time.monotonic() - frozen_at), 1)
        else:
            servers.stop(redis)
        await _until_done(engine, fleet, len(ids), scale.timeout_s)
        fleet.stop_all()
        name = "redis " + ("frozen" if freeze else "stopped")
        await check(engine, audit_path, ids, faults, scenario=name, extra=extra)
        return fleet.logs()
    finally:
        await engine.dispose()


async def test_redis_stopped(
    pg_url: URL,
    settings: TaskQSettings,
    private_redis: servers.Server,
    tmp_path: Path,
    procs: list[subprocess.Popen[bytes]],
    audit_path: Path,
    scale: Scale,
) -> None:
    """Redis is killed mid-queue and stays down: rate-limited work goes on via Postgres,
    with one outage warning per worker instead of one per acquire."""
    logs = await _rate_limited(
        pg_url, settings, private_redis, tmp_path, procs, audit_path, scale, freeze=False
    )
    downs = logs.count("ratelimit.redis_down")
    assert 1 <= downs <= 4, logs[-4000:]
    assert logs.count("ratelimit.redis") <= 20


async def test_redis_frozen(
    pg_url: URL,
    settings: TaskQSettings,
    private_redis: servers.Server,
    tmp_path: Path,
    procs: list[subprocess.Popen[bytes]],
    audit_path: Path,
    scale: Scale,
) -> None:
    """Redis is frozen (SIGSTOP: connections open, no replies), then resumed: the circuit
    sends acquires to Postgres after one timeout, and closes again when Redis answers."""
    logs = await _rate_limited(
        pg_url, settings, private_redis, tmp_path, procs, audit_path, scale, freeze=True
    )
    assert "ratelimit.redis_down" in logs, logs[-4000:]
    assert logs.count("ratelimit.redis") <= 40


async def test_worker_frozen_past_its_lease(
    pg_url: URL,
    settings: TaskQSettings,
    audit_path: Path,
    tmp_path: Path,
    procs: list[subprocess.Popen[bytes]],
    scale: Scale,
) -> None:
    """SIGSTOP one worker longer than its lease: its jobs re-run elsewhere; resumed, it
    stops them before their actors finish (overlap only inside the freeze window)."""
    engine = make_engine(pg_url, settings=settings)
    try:
        fleet = Fleet(pg_url, tmp_path, procs)
        frozen = fleet.spawn()
        await _running_workers(engine, 1)
        ids = await _enqueue(engine, settings, apps.work_async, 10, 3.0)

        async def started() -> bool:
            runs = read(audit_path)
            return sum(1 for j in runs.values() for r in j.values() if r.pid == frozen.pid) == 10

        await wait_until(started, timeout=60)
        faults = Faults()
        os.kill(frozen.pid, signal.SIGSTOP)
        stopped_at = time.time()
        try:
            fleet.spawn()

            async def rerun() -> bool:
                runs = read(audit_path)
                return (
                    sum(1 for j in runs.values() for r in j.values() if r.pid != frozen.pid) == 10
                )

            await wait_until(rerun, timeout=90)
            await asyncio.sleep(3.5)  # past the frozen actors' own end
        finally:
            os.kill(frozen.pid, signal.SIGCONT)
            faults.frozen[frozen.pid] = (stopped_at, time.time())
        await _until_done(engine, fleet, len(ids), scale.timeout_s)
        runs = read(audit_path)
        ended = [
            r for j in runs.values() for r in j.values() if r.pid == frozen.pid and r.event == "end"
        ]
        assert not ended, "the resumed worker finished jobs it had lost"
        fleet.stop_all()
        await check(engine, audit_path, ids, faults, scenario="worker frozen past its lease")
    finally:
        await engine.dispose()


async def test_sigterm_during_long_async_and_sync_jobs(
    pg_url: URL,
    settings: TaskQSettings,
    audit_path: Path,
    tmp_path: Path,
    procs: list[subprocess.Popen[bytes]],
    scale: Scale,
) -> None:
    """SIGTERM a worker running long jobs: it stops them, hands them back and exits 0; the
    next worker runs them, never at the same time as the first."""
    engine = make_engine(pg_url, settings=settings)
    try:
        fleet = Fleet(pg_url, tmp_path, procs)
        first = fleet.spawn()
        await _running_workers(engine, 1)
        ids = await _enqueue(engine, settings, apps.work_async, 5, 3.0)
        ids |= await _enqueue(engine, settings, apps.work_sync, 5, 3.0)

        async def all_started() -> bool:
            return sum(len(j) for j in read(audit_path).values()) == 10

        await wait_until(all_started, timeout=60)
        assert stop_worker(first) == 0, fleet.logs()[-4000:]
        fleet.live.remove(first)
        runs = read(audit_path)
        assert all(r.event == "stop" for j in runs.values() for r in j.values())
        fleet.spawn()
        await _until_done(engine, fleet, len(ids), scale.timeout_s)
        fleet.stop_all()
        await check(engine, audit_path, ids, Faults(other=1), scenario="sigterm during long jobs")
    finally:
        await engine.dispose()


async def test_poison_rows_do_not_stop_the_fleet(
    pg_url: URL,
    settings: TaskQSettings,
    audit_path: Path,
    tmp_path: Path,
    procs: list[subprocess.Popen[bytes]],
    scale: Scale,
) -> None:
    """Rows written by SQL that cannot run (deep JSON, a top attempt counter, a negative, NaN
    or infinite timeout) fail alone as ``UndecodableJob``; the good jobs all run; no worker
    dies."""
    engine = make_engine(pg_url, settings=settings)
    try:
        poison = await _enqueue(engine, settings, apps.work_async, 5, 0.0)
        deep, top, negative, nan, inf = sorted(poison)
        deep_json = '{"data": ' + "[" * 1500 + "]" * 1500 + "}"
        async with engine.begin() as conn:
            await conn.execute(
                update(jobs)
                .where(jobs.c.id == deep)
                .values(payload=cast(bindparam("raw", type_=Text()), JSONB())),
                {"raw": deep_json},
            )
            await conn.execute(update(jobs).where(jobs.c.id == top).values(attempt=2147483647))
            for bad, timeout in ((negative, -5.0), (nan, float("nan")), (inf, float("inf"))):
                await conn.execute(
                    update(jobs).where(jobs.c.id == bad).values(start_to_close_s=timeout)
                )
            await conn.execute(update(jobs).where(jobs.c.id.in_(poison)).values(priority=10))
        ids = await _enqueue(engine, settings, apps.work_async, 200, 0.01)
        fleet = Fleet(pg_url, tmp_path, procs)
        fleet.spawn()
        fleet.spawn()
        await _until_done(engine, fleet, len(ids) + len(poison), scale.timeout_s)
        async with engine.connect() as conn:
            rows = (
                await conn.execute(
                    select(jobs.c.status, jobs.c.error_class).where(jobs.c.id.in_(poison))
                )
            ).all()
        assert [tuple(r) for r in rows] == [("failed", "UndecodableJob")] * len(poison)
        fleet.stop_all()
        await check(engine, audit_path, ids, Faults(other=len(poison)), scenario="poison rows")
        assert not (read(audit_path).keys() & {str(p) for p in poison})  # never ran
    finally:
        await engine.dispose()


async def test_soak_memory_and_connections_stay_flat(pg_url: URL, scale: Scale) -> None:
    """A steady stream of mixed jobs (``benchmarks/soak.py``): nothing lost, the audit table
    shows attempts equal to runs and no overlapping runs, worker RSS grows less than 10 %
    after the warm-up, the connection count does not grow."""
    from benchmarks.soak import RSS_GROWTH_LIMIT, run_soak, table

    long = scale.soak_s > 60
    figures = await run_soak(
        pg_url.render_as_string(hide_password=False),
        total=200_000 if long else 2000,
        workers=4 if long else 2,
        duration_s=scale.soak_s,
        warmup=0.2 if long else 0.5,
        sample_s=5.0 if long else 1.0,
    )
    print(table(figures))
    assert figures.lost == 0, table(figures)
    assert figures.runs >= figures.planned_runs > 0, table(figures)
    assert figures.audit_ok, table(figures)
    assert figures.rss_growth_max < RSS_GROWTH_LIMIT, table(figures)
    assert figures.connections_flat, table(figures)
