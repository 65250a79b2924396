"""Fixtures for tests that start real worker processes."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.workers import stop_worker


@pytest.fixture
def runs_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Where the test actors record their start/end lines (inherited by the workers)."""
    path = tmp_path / "runs.txt"
    monkeypatch.setenv("TASKQ_E2E_RUNS", str(path))
    return path


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Worker processes started by the test; any still alive are stopped (then killed)."""
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            try:
                stop_worker(proc, timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
