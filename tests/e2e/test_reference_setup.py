"""The complete setup of ``docs/rate-limiting.md`` (``actors.py`` + ``worker.py``) runs as
written: both blocks are written into a directory, ``python worker.py`` boots a real
worker (its actors name primitives that ``import actors`` registered; a missing one
would fail the boot), SIGTERM stops it, and it exits 0."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
SECTION = "### A complete setup: `actors.py` and `worker.py`"


def _blocks() -> dict[str, str]:
    """The section's Python blocks that start with a ``# <file>.py`` line, by file name."""
    page = (ROOT / "docs" / "rate-limiting.md").read_text()
    section = page[page.index(SECTION) :]
    section = section[: section.index("\n## ", len(SECTION))]
    found = {}
    for body in re.findall(r"```python[^\n]*\n(.*?)```", section, re.S):
        first = body.splitlines()[0]
        if re.fullmatch(r"# \w+\.py", first):
            found[first[2:]] = body
    return found


def test_the_complete_setup_boots_and_stops(
    sqlite_url: str, redis_url: str, tmp_path: Path
) -> None:
    blocks = _blocks()
    assert set(blocks) == {"actors.py", "worker.py"}
    for name, body in blocks.items():
        (tmp_path / name).write_text(body)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TASKQ_")}
    env.update(
        {
            "TASKQ_DATABASE_URL": sqlite_url,
            "TASKQ_SCHEMA_NAME": "taskq",
            "TASKQ_REDIS_URL": redis_url,
            "TASKQ_QUEUES": '["payments"]',
            "PYTHONPATH": str(tmp_path),
        }
    )
    log = tmp_path / "worker.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "worker.py"],
            cwd=tmp_path,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        try:
            deadline = time.monotonic() + 60
            while "worker-started" not in log.read_text():
                assert proc.poll() is None, log.read_text()
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.1)
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    text = log.read_text()
    assert code == 0, text
    assert "worker-stopped" in text
    assert "NameError" not in text
    assert "ConfigurationError" not in text


def test_the_pages_own_worker_py_fails_as_written(tmp_path: Path) -> None:
    """Why the docs carry their own version: ``import actors`` binds no ``charge_card``."""
    (tmp_path / "actors.py").write_text(_blocks()["actors.py"])
    (tmp_path / "worker.py").write_text(PAGE_WORKER)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TASKQ_")}
    env["TASKQ_DATABASE_URL"] = f"sqlite:///{tmp_path / 'unused.db'}"
    proc = subprocess.run(
        [sys.executable, "worker.py"], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 1
    assert "NameError: name 'charge_card' is not defined" in proc.stderr


PAGE_WORKER = """\
from taskq.worker.run import worker_main
from taskq.settings import WorkerSettings
import actors  # noqa: F401

settings = WorkerSettings.load()
exit_code = worker_main(
    settings=settings,
    actor_registry={"charge_card": charge_card},
)
"""
