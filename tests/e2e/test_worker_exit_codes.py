"""A worker whose own code crashes shuts down and exits non-zero (EXIT_INTERNAL_ERROR)."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

from sqlalchemy.engine import URL

from taskq.worker.run import EXIT_INTERNAL_ERROR, Worker
from tests.e2e.apps import basic
from tests.support.workers import spawn_worker, worker_settings


def test_an_internal_crash_exits_with_the_internal_error_code(
    pg_url: URL, tmp_path: Path, procs: list[subprocess.Popen[bytes]]
) -> None:
    log = tmp_path / "worker.log"
    proc = spawn_worker(pg_url, "tests.e2e.apps.crashing:registry", log_path=log)
    procs.append(proc)
    code = proc.wait(timeout=60)
    text = log.read_text()
    assert "worker-claim-loop-crashed" in text, text[-4000:]
    assert "a planned bug in the claim loop" in text
    assert code == EXIT_INTERNAL_ERROR != 0, text[-4000:]


async def test_a_crashed_background_loop_shuts_the_worker_down_non_zero(pg_url: URL) -> None:
    worker = Worker(settings=worker_settings(pg_url), actors=basic.registry, hard_exit=False)

    async def broken_beat() -> None:
        raise RuntimeError("a planned bug in the heartbeat")

    setattr(worker.heartbeat, "beat", broken_beat)  # noqa: B010
    code = await asyncio.wait_for(worker.run(), 60)
    assert (code, worker.crashed) == (EXIT_INTERNAL_ERROR, "heartbeat")
