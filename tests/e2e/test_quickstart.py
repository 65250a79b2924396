"""``taskq quickstart`` from the installed console script, in an empty directory.

Runs the command the README tells a new user to run, as a subprocess (so nothing of the
test process leaks in), on its default embedded database ``./taskq.db``, and checks that
the numbers it prints add up and agree with what the store recorded.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from taskq.examples.quickstart import workload

pytestmark = [pytest.mark.e2e, pytest.mark.engine("sqlite")]

_ROW = re.compile(r"^\s+(succeeded|failed|retried|snoozed|cancelled|total)\s+(\S+)\s+(\d+)", re.M)


def _console_script() -> str:
    """The ``taskq`` entry point installed next to this interpreter (the venv's bin)."""
    script = Path(sys.executable).with_name("taskq")
    found = str(script) if script.exists() else shutil.which("taskq")
    assert found, "the taskq console script is not installed (pip install -e '.[all]')"
    return found


def _run(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TASKQ_")}
    return subprocess.run(
        [_console_script(), "quickstart", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _check_adds_up(s: dict[str, Any]) -> None:
    expected = len(workload())
    assert s["jobs"] == expected
    assert s["succeeded"] + s["failed"] + s["cancelled"] == s["jobs"]
    assert (
        s["succeeded"] + s["failed"] + s["cancelled"] + s["retried"] + s["snoozed"]
        == (s["attempts"])
    )
    # What the workload is built to do: 8 flaky pages retried once, 5 cards retried then
    # failed, 5 exports snoozed once; the token bucket parks some geocodes, which is not
    # an attempt (no snoozed attempt row for it).
    assert s["failed"] == 5
    assert s["retried"] == 8 + 5
    assert s["snoozed"] == 5
    assert s["rate_limited"] > 0
    assert s["cancelled"] == 0


def test_quickstart_summary_adds_up_and_matches_the_store(tmp_path: Path) -> None:
    human = _run(tmp_path)
    assert human.returncode == 0, human.stderr
    rows = {name: (jobs, int(attempts)) for name, jobs, attempts in _ROW.findall(human.stdout)}
    assert set(rows) >= {"succeeded", "failed", "retried", "snoozed", "total"}, human.stdout
    s = {
        "jobs": int(rows["total"][0]),
        "succeeded": int(rows["succeeded"][0]),
        "failed": int(rows["failed"][0]),
        "cancelled": int(rows.get("cancelled", ("0", 0))[0]),
        "retried": rows["retried"][1],
        "snoozed": rows["snoozed"][1],
        "attempts": rows["total"][1],
        "rate_limited": int(re.search(r"parked by the rate limit: (\d+) ", human.stdout)[1]),  # type: ignore[index]
    }
    _check_adds_up(s)
    seconds = float(re.search(r"time taken\s+([\d.]+) s", human.stdout)[1])  # type: ignore[index]
    rate = float(re.search(r"throughput\s+([\d.]+) jobs/s", human.stdout)[1])  # type: ignore[index]
    assert 0 < seconds < 60
    assert rate == pytest.approx(s["jobs"] / seconds, rel=0.05)
    assert "draining" in human.stderr  # the live display (line mode: stderr is not a tty)

    db = tmp_path / "taskq.db"
    assert db.exists()
    with sqlite3.connect(db) as conn:
        by_status = dict(conn.execute("SELECT status, count(*) FROM jobs GROUP BY status"))
        by_outcome = dict(
            conn.execute("SELECT outcome, count(*) FROM job_attempts GROUP BY outcome")
        )
        workers = dict(conn.execute("SELECT status, count(*) FROM workers GROUP BY status"))
    assert by_status == {"succeeded": s["succeeded"], "failed": s["failed"]}
    assert by_outcome.get("retried") == s["retried"]
    assert by_outcome.get("snoozed") == s["snoozed"]
    assert sum(by_outcome.values()) == s["attempts"]
    assert "running" not in by_outcome
    assert workers == {"stopped": 1}  # the in-process worker shut down cleanly

    # A second run on the same file counts only its own jobs; --json is machine-readable.
    again = _run(tmp_path, "--json")
    assert again.returncode == 0, again.stderr
    summary = json.loads(again.stdout.strip().splitlines()[-1])
    _check_adds_up(summary)
    assert summary["database_url"] == "sqlite+aiosqlite:///./taskq.db"
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT count(*) FROM jobs").fetchone()[0] == 2 * s["jobs"]
        assert (
            conn.execute("SELECT count(*) FROM workers WHERE status != 'stopped'").fetchone()[0]
            == 0
        )
