"""A sync actor's thread still running at the end of a worker's teardown: the watchdog
stays armed until the thread is reaped. A thread that ends before the deadline lets the
process exit 0 (``worker-threads-reaped``); one that outlives it trips the watchdog:
``os._exit`` with code 70 and the reason ``tracked-actor-outlived-teardown``.

Real worker processes (``python -m taskq.worker``), SIGTERM as a deploy sends it.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

from sqlalchemy import func, select

from taskq.backends.sql import SqlBackend
from taskq.client import JobsClient
from taskq.db.engine import make_engine
from taskq.db.tables import jobs
from taskq.settings import TaskQSettings
from taskq.worker.shutdown import WATCHDOG_EXIT_CODE, WATCHDOG_TAIL_S
from tests.e2e.apps import basic
from tests.support.workers import spawn_worker, wait_until

GRACES: dict[str, Any] = {
    "cancellation_grace_period": 0.5,
    "cleanup_grace_period": 0.5,
    "termination_grace_period": 2,
    "lock_lease": 30,
}


async def _shutdown_with_a_blind_thread(
    url: str, settings: TaskQSettings, tmp_path: Path, procs: list[Any], seconds: float
) -> tuple[int, str]:
    engine = make_engine(url, settings=settings)
    try:
        client = JobsClient(SqlBackend(engine, settings=settings))
        await client.enqueue(basic.sync_blind, basic.Work(seconds=seconds))
        log = tmp_path / f"worker-{seconds}.log"
        proc = spawn_worker(url, log_path=log, **GRACES)
        procs.append(proc)

        async def running() -> bool:
            async with engine.connect() as conn:
                stmt = select(func.count()).where(jobs.c.status == "running")
                return int((await conn.execute(stmt)).scalar_one()) == 1

        await wait_until(running, timeout=30)
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=GRACES["termination_grace_period"] + WATCHDOG_TAIL_S + 20)
        return code, log.read_text()
    finally:
        await engine.dispose()


def _events(runs_file: Path) -> list[str]:
    """The start/end events the sync actor recorded (``job attempt pid event time``)."""
    return [line.split()[3] for line in runs_file.read_text().splitlines()]


async def test_a_thread_outliving_the_deadline_trips_the_watchdog(
    sqlite_url: str, settings: TaskQSettings, runs_file: Path, tmp_path: Path, procs: list[Any]
) -> None:
    code, log = await _shutdown_with_a_blind_thread(sqlite_url, settings, tmp_path, procs, 120)
    assert code == WATCHDOG_EXIT_CODE == 70, log
    assert "worker-stopped" in log
    assert "worker-awaiting-threads" in log
    assert "worker-watchdog-exit" in log
    [exit_line] = [
        json.loads(line)
        for line in log.splitlines()
        if line.startswith("{") and '"worker-watchdog-exit"' in line
    ]
    assert exit_line["reason"] == "tracked-actor-outlived-teardown"
    assert "worker-threads-reaped" not in log
    assert _events(runs_file) == ["start"]  # cut short by the process's end
    # The order: teardown finished, then the watchdog stayed armed, then it tripped.
    assert log.index("worker-stopped") < log.index("worker-awaiting-threads")
    assert log.index("worker-awaiting-threads") < log.index("worker-watchdog-exit")


async def test_a_thread_ending_before_the_deadline_exits_zero(
    sqlite_url: str, settings: TaskQSettings, runs_file: Path, tmp_path: Path, procs: list[Any]
) -> None:
    # Past the termination grace (2 s), within the watchdog's deadline (2 s + 5 s).
    code, log = await _shutdown_with_a_blind_thread(sqlite_url, settings, tmp_path, procs, 4.5)
    assert code == 0, log
    assert log.index("worker-awaiting-threads") < log.index("worker-threads-reaped")
    assert "worker-watchdog-exit" not in log
    assert _events(runs_file) == ["start", "end"]  # the thread ran to its end
