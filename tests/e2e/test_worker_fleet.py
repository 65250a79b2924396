"""Real worker processes (``python -m taskq.worker tests.e2e.apps.basic:registry``).

Each test keeps well under a minute: the fleet sizes are chosen to exercise the paths
(batches, retries, reclaim, reconnection), not to load-test.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from sqlalchemy import select, text
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncEngine

from taskq.backends.sql import SqlBackend
from taskq.client import JobsClient
from taskq.db.engine import make_engine, transaction
from taskq.db.queries import dispatch as dq
from taskq.db.tables import jobs, workers
from taskq.records import EnqueueArgs
from taskq.settings import TaskQSettings
from taskq.worker.outcomes import _columns
from tests.e2e import support
from tests.e2e.apps import basic
from tests.support.workers import count_jobs, spawn_worker, stop_worker, wait_until


async def _enqueue(client: JobsClient, items: list[EnqueueArgs]) -> list[Any]:
    handles: list[Any] = []
    for start in range(0, len(items), 1000):
        handles.extend(await client.enqueue_many(items[start : start + 1000]))
    return handles


async def test_ten_thousand_jobs_four_processes_one_percent_failing(
    engine_url: str | URL,
    settings: TaskQSettings,
    runs_file: Path,
    tmp_path: Path,
    procs: list[Any],
) -> None:
    """Every job ends exactly once, no two attempts of a job overlap, attempts add up."""
    url = engine_url
    engine = make_engine(url, settings=settings)
    try:
        client = JobsClient(SqlBackend(engine, settings=settings))
        total = 10_000
        items = [
            EnqueueArgs(basic.record, basic.Work(n=n, fail_first=n % 100 == 7))
            for n in range(total)
        ]
        await _enqueue(client, items)
        for i in range(4):
            procs.append(
                spawn_worker(
                    url, log_path=tmp_path / f"w{i}.log", max_concurrency=50, claim_batch_size=50
                )
            )
        # Generous: ~15 s on an idle 2-core machine, several times that under load.
        await wait_until(lambda: _done(engine, total), timeout=600, interval=0.25)
        for proc in procs:
            assert stop_worker(proc) == 0

        rows = await support.job_rows(engine)
        attempts = await support.attempt_rows(engine)
        recorded = support.runs(runs_file)
        assert len(rows) == total
        for job_id, row in rows.items():
            planned = row.payload["fail_first"]
            assert row.status == "succeeded"
            assert row.attempt == (2 if planned else 1)
            outcomes = [a.outcome for a in attempts[job_id]]
            assert outcomes == (["retried", "succeeded"] if planned else ["succeeded"])
            events = recorded[str(job_id)]
            assert sum(1 for e in events if e[2] == "start") == row.attempt
            assert not support.overlapping(events), job_id
        # The work really was shared.
        pids = {e[1] for events in recorded.values() for e in events}
        assert len(pids) == 4
    finally:
        await engine.dispose()


async def _done(engine: AsyncEngine, total: int) -> bool:
    return await count_jobs(engine, "succeeded", "failed") >= total


async def _worker_id(engine: AsyncEngine, pid: int) -> Any:
    async with engine.connect() as conn:
        return (await conn.execute(select(workers.c.id).where(workers.c.pid == pid))).scalar()


async def test_kill_9_reclaims_running_jobs_and_fences_the_dead_worker(
    engine_url: str | URL,
    settings: TaskQSettings,
    runs_file: Path,
    tmp_path: Path,
    procs: list[Any],
) -> None:
    url = engine_url
    engine = make_engine(url, settings=settings)
    lease: dict[str, Any] = {"lock_lease": 2, "heartbeat_interval": 0.3, "max_concurrency": 20}
    try:
        client = JobsClient(SqlBackend(engine, settings=settings))
        victim = spawn_worker(url, log_path=tmp_path / "victim.log", **lease)
        procs.append(victim)
        handles = await _enqueue(
            client, [EnqueueArgs(basic.slow_first, basic.Work(seconds=120)) for _ in range(20)]
        )
        await wait_until(lambda: _running_on(engine, victim.pid, 20), timeout=120)
        victim_id = await _worker_id(engine, victim.pid)

        survivor = spawn_worker(url, log_path=tmp_path / "survivor.log", **lease)
        procs.append(survivor)
        await wait_until(lambda: _worker_id(engine, survivor.pid), timeout=120)
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        await wait_until(lambda: _done(engine, 20), timeout=120)

        survivor_id = await _worker_id(engine, survivor.pid)
        rows = await support.job_rows(engine)
        attempts = await support.attempt_rows(engine)
        for handle in handles:
            row = rows[handle.job_id]
            assert row.status == "succeeded"
            assert row.result == {"doubled": 2}
            history = attempts[handle.job_id]
            assert [(a.attempt, a.outcome) for a in history] == [(1, "crashed"), (2, "succeeded")]
            assert history[0].worker_id == victim_id
            assert history[1].worker_id == survivor_id

        # A late write from the killed worker's attempt, carrying its stale fencing token.
        stale = {
            "b_id": handles[0].job_id,
            "b_worker": victim_id,
            "b_attempt": 1,
            "b_outcome": "succeeded",
            "b_status": "failed",
            "b_result": None,
            "b_error_class": "Stale",
            "b_error": "late write",
            "b_traceback": None,
            "b_budget": 1,
            "b_delay_s": None,
            "b_ttl_s": None,
            "b_has_progress": 0,
            "b_progress": None,
            "b_seq": 0,
        }
        dialect = engine.dialect.name
        async with transaction(engine) as conn:
            await conn.execute(dq.record_attempts(dialect), stale)
            finished = await conn.execute(dq.finish_jobs(dialect), stale)
            if dialect == "postgresql":  # ... and the batched statement used on Postgres
                await conn.execute(dq.finish_jobs_batch_pg(), _columns([stale], victim_id))
        assert finished.rowcount == 0
        after = (await support.job_rows(engine))[handles[0].job_id]
        assert (after.status, after.error_class, after.result) == (
            "succeeded",
            None,
            {"doubled": 2},
        )
        assert len((await support.attempt_rows(engine))[handles[0].job_id]) == 2
    finally:
        await engine.dispose()


async def _running_on(engine: AsyncEngine, pid: int, n: int) -> bool:
    worker_id = await _worker_id(engine, pid)
    if worker_id is None:
        return False
    return await _count_locked(engine, worker_id) >= n


async def _count_locked(engine: AsyncEngine, worker_id: Any) -> int:
    async with engine.connect() as conn:
        stmt = select(jobs.c.id).where(jobs.c.locked_by == worker_id, jobs.c.status == "running")
        return len((await conn.execute(stmt)).all())


async def test_workers_reconnect_after_their_connections_are_terminated(
    pg_url: URL, settings: TaskQSettings, runs_file: Path, tmp_path: Path, procs: list[Any]
) -> None:
    """Stands in for a Postgres restart: every worker backend is killed, twice, mid-queue.

    (A real ``pg_ctlcluster restart`` would disturb other test runs sharing the server;
    ``pg_terminate_backend`` drops the same connections the same way from the workers'
    point of view.)
    """
    engine = make_engine(pg_url, settings=settings)
    try:
        client = JobsClient(SqlBackend(engine, settings=settings))
        total = 3000
        await _enqueue(
            client,
            [EnqueueArgs(basic.record, basic.Work(n=n, seconds=0.005)) for n in range(total)],
        )
        for i in range(2):
            procs.append(
                spawn_worker(
                    pg_url, log_path=tmp_path / f"w{i}.log", lock_lease=3, max_concurrency=20
                )
            )
        for threshold in (total // 5, total // 2):
            await wait_until(lambda t=threshold: _done(engine, t), timeout=60)  # type: ignore[misc]
            killed = await _terminate_others(engine)
            assert killed > 0
        await wait_until(lambda: _done(engine, total), timeout=60)
        codes = [stop_worker(proc) for proc in procs]
        logs = "".join((tmp_path / f"w{i}.log").read_text() for i in range(2))
        assert codes == [0, 0], logs
        rows = await support.job_rows(engine)
        recorded = support.runs(runs_file)
        assert len(rows) == total
        assert all(row.status == "succeeded" for row in rows.values())
        for job_id in rows:
            assert not support.overlapping(recorded[str(job_id)])
        # Both workers really lost their connections (and their LISTEN) and carried on.
        assert logs.count("worker-listen-lost") >= 2
        assert "worker-claim-failed" in logs or "worker-complete-failed" in logs
    finally:
        await engine.dispose()


async def _terminate_others(engine: AsyncEngine) -> int:
    stmt = text(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
        "WHERE datname = current_database() AND pid <> pg_backend_pid()"
    )
    async with engine.connect() as conn:
        value = (await conn.execute(stmt)).scalar_one()
        await conn.commit()
    return int(value)


async def test_sigterm_during_long_async_and_sync_jobs(
    engine_url: str | URL,
    settings: TaskQSettings,
    runs_file: Path,
    tmp_path: Path,
    procs: list[Any],
) -> None:
    url = engine_url
    engine = make_engine(url, settings=settings)
    graces: dict[str, Any] = {
        "cancellation_grace_period": 1,
        "cleanup_grace_period": 1,
        "termination_grace_period": 8,
        "lock_lease": 30,
    }
    try:
        client = JobsClient(SqlBackend(engine, settings=settings))
        async_job = await client.enqueue(basic.sleep_async, basic.Work(seconds=120))
        polling = await client.enqueue(basic.sync_polling, basic.Work(seconds=120))
        blind = await client.enqueue(basic.sync_blind, basic.Work(seconds=4))
        log = tmp_path / "worker.log"
        proc = spawn_worker(url, log_path=log, **graces)
        procs.append(proc)
        await wait_until(lambda: _count_status(engine, "running", 3), timeout=30)

        proc.send_signal(signal.SIGTERM)
        # Bounded by the configured graces plus the watchdog tail (5 s).
        code = proc.wait(timeout=8 + 5 + 5)
        assert code == 0

        text_log = log.read_text()
        phases = [
            p
            for p in ("DRAINING", "CANCELLING", "FORCING", "RELEASING", "STOPPED")
            if f'"phase": "{p}"' in text_log  # the worker logs JSON lines when piped
        ]
        assert phases == ["DRAINING", "CANCELLING", "FORCING", "RELEASING", "STOPPED"]
        positions = [text_log.index(f'"phase": "{p}"') for p in phases]
        assert positions == sorted(positions)

        rows = await support.job_rows(engine)
        attempts = await support.attempt_rows(engine)
        for handle in (async_job, polling, blind):
            row = rows[handle.job_id]
            assert row.status == "pending", handle
            assert row.locked_by is None
            assert row.budget_used == 0
            assert [(a.outcome, a.error_class) for a in attempts[handle.job_id]] == [
                ("retried", "WorkerShutdown")
            ]
        events = support.runs(runs_file)
        assert any(e[2] == "aborted" for e in events[str(polling.job_id)])
        # The blind thread ran to its own end before its row was handed back.
        assert any(e[2] == "end" for e in events[str(blind.job_id)])
    finally:
        await engine.dispose()


async def _count_status(engine: AsyncEngine, status: str, n: int) -> bool:
    return await count_jobs(engine, status) >= n


def test_python_m_worker_rejects_a_bad_target(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "taskq.worker", "no_colon_here"],
        capture_output=True,
        check=False,
    )
    assert proc.returncode == 2
    assert b"MODULE:ATTR" in proc.stderr


async def test_second_signal_escalates_and_a_live_thread_keeps_its_row_held(
    pg_url: URL, settings: TaskQSettings, runs_file: Path, tmp_path: Path, procs: list[Any]
) -> None:
    """A sync actor that never polls outlives the teardown: its row stays held, not pending,
    and the process ends by the watchdog (exit 70), not as a clean stop."""
    engine = make_engine(pg_url, settings=settings)
    graces: dict[str, Any] = {
        "cancellation_grace_period": 30,
        "cleanup_grace_period": 30,
        "termination_grace_period": 3,
        "lock_lease": 60,
    }
    try:
        client = JobsClient(SqlBackend(engine, settings=settings))
        blind = await client.enqueue(basic.sync_blind, basic.Work(seconds=60))
        log = tmp_path / "worker.log"
        proc = spawn_worker(pg_url, log_path=log, **graces)
        procs.append(proc)
        await wait_until(lambda: _count_status(engine, "running", 1), timeout=30)

        proc.send_signal(signal.SIGTERM)
        await wait_until(lambda: _logged(log, '"phase": "CANCELLING"'), timeout=10)
        proc.send_signal(signal.SIGTERM)  # skip the 30 s cooperative grace
        await wait_until(lambda: _logged(log, '"phase": "RELEASING"'), timeout=10)
        proc.send_signal(signal.SIGTERM)  # ... and the 30 s forced grace
        code = proc.wait(timeout=3 + 5 + 5)
        # The thread outlives the teardown, so the watchdog stays armed and trips at
        # termination_grace_period + 5 s: exit 70, the reason naming the thread.
        assert code == 70

        text_log = log.read_text()
        assert "worker-shutdown-escalated" in text_log
        assert "tracked-actor-outlived-teardown" in text_log
        row = (await support.job_rows(engine))[blind.job_id]
        assert row.status == "scheduled"
        assert row.locked_by is None
        assert row.budget_used == 0
        events = support.runs(runs_file)[str(blind.job_id)]
        assert [e[2] for e in events] == ["start"]  # the thread died with the process
    finally:
        await engine.dispose()


async def _logged(path: Path, needle: str) -> bool:
    return needle in await asyncio.to_thread(path.read_text)


def test_worker_on_an_unmigrated_store_says_what_to_run(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "taskq.worker",
            "tests.e2e.apps.basic:registry",
            "--database-url",
            f"sqlite:///{tmp_path / 'empty.db'}",
        ],
        capture_output=True,
        check=False,
        cwd=Path(__file__).resolve().parents[2],
        timeout=60,
    )
    assert proc.returncode == 1, proc.stderr
    assert b"taskq migrate up" in proc.stderr
