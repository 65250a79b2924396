"""Fixtures of the fault suite: the audit table, worker processes, private servers, scale.

Short form (the default; what CI runs): every scenario small and bounded. Long form:
``TASKQ_CHAOS_LONG=1`` (``nox -s chaos -- --long``): the outside run's sizes.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support import servers
from tests.support.workers import stop_worker

LONG = os.environ.get("TASKQ_CHAOS_LONG", "") not in ("", "0")


@dataclass(frozen=True)
class Scale:
    """Sizes of one form of the suite."""

    jobs: int
    kills: int
    outage_s: float
    soak_s: float
    timeout_s: float


SCALE = (
    Scale(jobs=6000, kills=24, outage_s=15.0, soak_s=1800.0, timeout_s=900.0)
    if LONG
    else Scale(jobs=400, kills=3, outage_s=3.0, soak_s=15.0, timeout_s=120.0)
)


@pytest.fixture
def scale() -> Scale:
    return SCALE


@pytest.fixture
def audit_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The audit table the actors append to (inherited by the worker processes)."""
    path = tmp_path / "audit.txt"
    monkeypatch.setenv("TASKQ_CHAOS_AUDIT", str(path))
    return path


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Worker processes the scenario started; any still alive are resumed and stopped."""
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            try:
                os.kill(proc.pid, signal.SIGCONT)
                stop_worker(proc, timeout=20)
            except (subprocess.TimeoutExpired, ProcessLookupError):
                proc.kill()
                proc.wait()


@pytest.fixture
def private_postgres() -> Iterator[servers.Server]:
    """A private PostgreSQL (this machine's version) on a free port: a scenario may stop it."""
    server = servers.private_server("postgres")
    try:
        yield server
    finally:
        servers.stop(server)


@pytest.fixture
def private_redis() -> Iterator[servers.Server]:
    """A private Redis on a free port: a scenario may stop or freeze it."""
    server = servers.private_server("redis")
    try:
        yield server
    finally:
        if server.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(server.pid, signal.SIGCONT)
        servers.stop(server)
