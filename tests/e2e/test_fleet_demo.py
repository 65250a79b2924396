"""``python -m examples.fleet_demo.run_demo`` runs to completion and narrates every event
it promises (rate-limit parks, an operator's cancel, cron budgets, a SIGTERM deploy), from
a real worker process's log lines, and the store agrees."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.engine import URL

from taskq.db.tables import cron_schedules, job_attempts, jobs
from taskq_sync.db.engine import make_engine, transaction

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]


def _in_order(text: str, *needles: str) -> None:
    at = 0
    for needle in needles:
        found = text.find(needle, at)
        assert found >= 0, f"{needle!r} missing (after offset {at}) in:\n{text}"
        at = found + len(needle)


def test_run_demo(engine_url: str | URL, tmp_path: Path) -> None:
    url = engine_url if isinstance(engine_url, str) else engine_url.render_as_string(False)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TASKQ_")}
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.run(
        [sys.executable, "-m", "examples.fleet_demo.run_demo", "--database-url", url],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr

    # Act 1: the keyed bucket (2 at once, 2 a second) held six of eight jobs back by
    # parking them, named in waiting_on; no denial was an attempt, and the rate held.
    assert "store: 2 admitted, 6 parked" in out
    parked = re.findall(
        r"^store: parked fleet_call_partner_api status=scheduled "
        r"waiting_on=fleet\.partner_api:acme denials=1 attempt=0 ready_at=\+[\d.]+s$",
        out,
        re.M,
    )
    assert len(parked) == 6
    admitted = re.findall(
        r"^\[worker A\] job-finished: fleet_call_partner_api attempt=1 outcome=succeeded",
        out,
        re.M,
    )
    assert len(admitted) == 8
    assert "outcome=snooze" not in out
    assert (
        "store: 8 jobs ['succeeded'], 8 attempts, 0 snoozed, 6 denials, retry budget spent: 0"
        in out
    )
    window = re.search(
        r"^store: at most (\d+) calls started in any 1 s \(the bucket allows 4", out, re.M
    )
    assert window is not None
    assert 1 <= int(window.group(1)) <= 4

    # Acts 2, 3 and 4, in the order they happen.
    _in_order(
        out,
        "[worker A] worker-started: queues=['fleet', 'fleet.inventory']",
        "== act 2: an operator cancels a running job ==",
        "operator: cancel job",
        "[worker A] job-cancel-requested: fleet_build_report attempt=1 phase=1",
        "[worker A] job-finished: fleet_build_report attempt=1 outcome=cancelled "
        "error_class=CancelledCooperatively",
        "store: fleet_build_report cancelled / CancelledCooperatively",
        "== act 3: cron budgets ==",
        "operator: the warehouse API is down for maintenance: pause queue fleet.inventory",
        "operator: schedule fleet_sync_inventory every second as fleet-inventory-sync "
        "(missed='all', max_catchup=2); the actor allows max_pending=6",
        *["[worker A] cron-tick-enqueued: fleet-inventory-sync tick="] * 6,
        *["[worker A] cron-tick-refused: fleet-inventory-sync tick="] * 2,
        "store: fleet-inventory-sync enqueued=6 refused=",
        "operator: maintenance is over: resume queue fleet.inventory",
        *["[worker A] job-finished: fleet_sync_inventory attempt=1 outcome=succeeded"] * 6,
        "[worker A] cron-tick-enqueued: fleet-inventory-sync tick=",
        "store: fleet-inventory-sync last_outcome=enqueued, enqueued=",
        "== act 4: a SIGTERM deploy ==",
        "deploy: SIGTERM to worker A while fleet_migrate_tenant is running",
        "[worker A] worker-shutdown-requested: signal=SIGTERM",
        "[worker A] worker-shutdown-phase: DRAINING",
        "[worker A] worker-shutdown-phase: CANCELLING",
        "[worker A] job-finished: fleet_migrate_tenant attempt=1 outcome=release "
        "error_class=WorkerShutdown",
        "[worker A] worker-shutdown-phase: STOPPED",
        "[worker A] worker-stopped",
        "demo: worker A exited with code 0",
        "store: fleet_migrate_tenant is pending after attempt 1 (retry budget spent: 0)",
        "store: no worker is running: fleet-inventory-sync's ticks have been falling due",
        "[worker B] worker-started",
        "[worker B] cron-ticks-missed: fleet-inventory-sync policy=all dropped=",
        "[worker B] job-finished: fleet_migrate_tenant attempt=2 outcome=succeeded",
        "store: fleet_migrate_tenant succeeded on attempt 2: retried/WorkerShutdown, "
        "succeeded/None",
        "operator: disable schedule fleet-inventory-sync (it stays stored",
        "demo: worker B exited with code 0",
    )
    # Act 3: six jobs filled the backlog budget of the paused queue, so the ticks after
    # them were refused, by worker A alone (no refusal after the resume).
    store = re.search(
        r"^store: fleet-inventory-sync enqueued=6 refused=(\d+) "
        r"last_outcome=refused:max_pending; 6 jobs pending on the paused queue$",
        out,
        re.M,
    )
    assert store is not None
    assert int(store.group(1)) >= 2
    assert "[worker B] cron-tick-refused" not in out
    # Act 4: B found the ticks due while no worker ran, and caught up the two most recent.
    missed = re.search(
        r"^\[worker B\] cron-ticks-missed: fleet-inventory-sync policy=all "
        r"dropped=(\d+) running=2$",
        out,
        re.M,
    )
    assert missed is not None
    dropped = int(missed.group(1))
    assert dropped >= 1  # the demo waited for three ticks to fall due
    caught = re.search(
        rf"^store: worker B found {dropped + 2} ticks due \(from (\S+)\) and enqueued the "
        rf"2 most recent, (\S+) and (\S+); it dropped the other {dropped}$",
        out,
        re.M,
    )
    assert caught is not None
    since, first, second = (datetime.strptime(t, "%H:%M:%S") for t in caught.groups())
    assert (first - since).total_seconds() % 86400 == dropped  # one tick a second
    assert (second - first).total_seconds() % 86400 == 1

    engine = make_engine(url)
    try:
        with transaction(engine, readonly=True) as conn:
            every = conn.execute(select(jobs)).all()
            rows = {r.actor: r for r in every}
            calls = [r for r in every if r.actor == "fleet_call_partner_api"]
            call_attempts = conn.execute(
                select(job_attempts).where(job_attempts.c.job_id.in_([r.id for r in calls]))
            ).all()
            tenant = rows["fleet_migrate_tenant"]
            inventory = [r for r in every if r.actor == "fleet_sync_inventory"]
            [schedule] = conn.execute(select(cron_schedules)).all()
            outcomes = [
                (a.outcome, a.error_class)
                for a in conn.execute(
                    select(job_attempts)
                    .where(job_attempts.c.job_id == tenant.id)
                    .order_by(job_attempts.c.attempt)
                ).all()
            ]
    finally:
        engine.dispose()
    assert (rows["fleet_build_report"].status, rows["fleet_build_report"].error_class) == (
        "cancelled",
        "CancelledCooperatively",
    )
    assert (tenant.status, tenant.budget_used) == ("succeeded", 0)
    # The store agrees with act 1: one attempt per call, six parks, nothing left waiting.
    assert sorted(a.outcome for a in call_attempts) == ["succeeded"] * 8
    assert sum(r.denials for r in calls) == 6
    assert {(r.status, r.attempt, r.waiting_on) for r in calls} == {("succeeded", 1, None)}
    starts = sorted(a.started_at for a in call_attempts)
    for i, first in enumerate(starts):  # never more starts than 2 + 2/s (+1 for clocks)
        for j in range(i + 1, len(starts)):
            assert j - i + 1 <= 2 + 2 * (starts[j] - first).total_seconds() + 1
    assert outcomes == [("retried", "WorkerShutdown"), ("succeeded", None)]
    # The schedule's jobs: one per enqueued tick, every one run once, none left waiting;
    # the schedule is disabled and kept, its refusals recorded.
    assert (schedule.id, schedule.enabled, schedule.origin) == (
        "fleet-inventory-sync",
        False,
        "api",
    )
    assert schedule.enqueued_count == len(inventory)
    assert schedule.refused_count >= 2
    assert {(r.status, r.attempt) for r in inventory} == {("succeeded", 1)}
    tick_keys = [r.idempotency_key for r in inventory]
    assert len(set(tick_keys)) == len(tick_keys)
    assert all(k.startswith("cron:") and k.endswith(":fleet-inventory-sync") for k in tick_keys)
