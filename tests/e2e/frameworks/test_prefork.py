"""Pre-fork safety: a ``taskq_sync.TaskQ`` used before ``fork()`` works in every child.

The parent enqueues (its pool and held connection are live), forks four children that
enqueue 100 jobs each, then enqueues once more: 402 jobs, every child exits 0, no
protocol error, no hang (each child is bounded by a deadline in the app).
"""

from __future__ import annotations

import subprocess
import sys

import psycopg
import pytest
from sqlalchemy.engine import URL

from taskq.db.dialect import sync_url

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("run", range(3))
def test_fork_four_children_after_an_enqueue(pg_url: URL, run: int) -> None:
    url = sync_url(pg_url).render_as_string(hide_password=False)
    proc = subprocess.run(
        [sys.executable, "-m", "tests.e2e.frameworks.prefork_app", url, "4", "100"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    lines = [line for line in proc.stdout.splitlines() if line.startswith("child ")]
    assert len(lines) == 4
    assert all(line.endswith(" 0") for line in lines), out
    assert "rror" not in out, out
    dsn = sync_url(pg_url).set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT count(*), count(DISTINCT payload->>'n') FROM taskq.jobs"
        ).fetchone()
    # 1 before the forks + 4 x 100 in the children + 1 after them, each exactly once
    assert row == (402, 402)
