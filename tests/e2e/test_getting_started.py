"""docs/getting-started.md's first real app, followed as a reader follows it.

The page's files (its ``title="..."`` blocks: ``myapp/actors.py``, ``enqueue.py``,
``enqueue_sync.py``) are written into an empty directory, and its commands run there with
the installed console script and this interpreter, on the page's default database
(``./taskq.db``): ``taskq migrate up``, both producers, then ``taskq worker
myapp.actors:registry -q emails`` as a real process. The worker must import the app from
the current directory, log what the page says it logs (JSON lines: stderr is a pipe
here), run both jobs and stop cleanly on SIGTERM.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.engine("sqlite")]

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "getting-started.md"


def _titled_blocks(page: Path) -> dict[str, str]:
    """The page's ``title="file"`` blocks, read by the doc-block runner's own parser."""
    spec = importlib.util.spec_from_file_location(
        "run_doc_blocks", ROOT / "tools" / "run_doc_blocks.py"
    )
    assert spec is not None
    assert spec.loader is not None
    tool: Any = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("run_doc_blocks", tool)  # its dataclasses look their module up
    spec.loader.exec_module(tool)
    return {b.title: b.code for b in tool.extract_blocks(page.read_text()) if b.title}


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TASKQ_")}
    env.pop("PYTHONPATH", None)  # the app is found from the current directory alone
    return env


def _taskq(cwd: Path, *args: str) -> str:
    taskq = str(Path(sys.executable).with_name("taskq"))
    proc = subprocess.run(
        [taskq, *args], cwd=cwd, env=_env(), capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def _python(cwd: Path, script: str) -> str:
    proc = subprocess.run(
        [sys.executable, script], cwd=cwd, env=_env(), capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_first_real_app(tmp_path: Path) -> None:
    files = _titled_blocks(PAGE)
    assert sorted(files) == ["enqueue.py", "enqueue_sync.py", "myapp/actors.py"]
    for name, code in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(code)

    _taskq(tmp_path, "migrate", "up")
    assert (tmp_path / "taskq.db").is_file()
    enqueued = [
        _python(tmp_path, "enqueue.py").split(),
        _python(tmp_path, "enqueue_sync.py").split(),
    ]
    assert [(words[0], words[-1]) for words in enqueued] == [("enqueued", "pending")] * 2
    ids = {words[1] for words in enqueued}

    taskq = str(Path(sys.executable).with_name("taskq"))
    worker = subprocess.Popen(
        [taskq, "worker", "myapp.actors:registry", "-q", "emails"],
        cwd=tmp_path,
        env=_env(),
        stderr=subprocess.PIPE,
        text=True,
    )
    events: list[dict[str, Any]] = []
    try:
        assert worker.stderr is not None
        deadline = time.monotonic() + 120
        for line in worker.stderr:
            events.append(json.loads(line))  # every line is one JSON object
            sent = {e["job_id"] for e in events if e["event"] == "sending"}
            if sent == ids or time.monotonic() > deadline:
                break
        worker.send_signal(signal.SIGTERM)
        _, rest = worker.communicate(timeout=60)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
    events += [json.loads(line) for line in rest.splitlines()]
    assert worker.returncode == 0, events

    names = [e["event"] for e in events]
    assert "worker-started" in names
    started = next(e for e in events if e["event"] == "worker-started")
    assert (started["queues"], started["actors"]) == (["emails"], ["send_welcome"])
    sending = [e for e in events if e["event"] == "sending"]
    assert {e["job_id"] for e in sending} == ids
    assert sorted(e["to"] for e in sending) == ["ada@example.com", "grace@example.com"]
    assert names.index("worker-started") < names.index("sending")
    assert names[-1] == "worker-stopped"

    listed = json.loads(_taskq(tmp_path, "jobs", "list", "--json"))["jobs"]
    assert {(j["id"], j["status"]) for j in listed} == {(i, "succeeded") for i in ids}
