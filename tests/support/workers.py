"""Running workers in tests: in this process (a task) or as real ``taskq worker`` processes."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncEngine

from taskq.db.tables import jobs
from taskq.settings import WorkerSettings
from taskq.worker.run import Worker

ROOT = Path(__file__).resolve().parents[2]


def worker_settings(url: str | URL, **overrides: Any) -> WorkerSettings:
    """Worker settings for tests: fast polls and short graces unless overridden."""
    raw = url.render_as_string(hide_password=False) if isinstance(url, URL) else url
    values: dict[str, Any] = {
        "database_url": raw,
        "redis_url": None,
        "schema_name": "taskq",
        "poll_interval": 0.05,
        "heartbeat_interval": 0.5,
        "sweep_interval": 0.5,
        "lock_lease": 5.0,
        "cancellation_grace_period": 1.0,
        "cleanup_grace_period": 1.0,
        "termination_grace_period": 5.0,
        "max_concurrency": 10,
    }
    values.update(overrides)
    return WorkerSettings.load(**values)


@asynccontextmanager
async def running_worker(
    settings: WorkerSettings, actors: Mapping[str, Any], **kwargs: Any
) -> AsyncIterator[Worker]:
    """A worker running as a task of this event loop; stopped (SIGTERM path) on exit."""
    worker = Worker(settings=settings, actors=actors, hard_exit=False, **kwargs)
    task = asyncio.ensure_future(worker.run())
    try:
        yield worker
    finally:
        worker.state.signal("test-exit")
        await asyncio.wait_for(task, 30)


async def wait_until(
    check: Callable[[], Awaitable[bool]],
    *,
    timeout: float = 30.0,  # noqa: ASYNC109
    interval: float = 0.05,
) -> None:
    """Poll ``check`` until it is true; ``AssertionError`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        if await check():
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        await asyncio.sleep(interval)


async def count_jobs(engine: AsyncEngine, *statuses: str, actor: str | None = None) -> int:
    """Jobs in ``statuses`` (all statuses when none given)."""
    stmt = select(func.count()).select_from(jobs)
    if statuses:
        stmt = stmt.where(jobs.c.status.in_(statuses))
    if actor is not None:
        stmt = stmt.where(jobs.c.actor == actor)
    async with engine.connect() as conn:
        return int((await conn.execute(stmt)).scalar_one())


def spawn_worker(
    url: str | URL,
    app: str = "tests.e2e.apps.basic:registry",
    *,
    log_path: Path,
    env: Mapping[str, str] | None = None,
    module: str | None = None,
    **settings: Any,
) -> subprocess.Popen[bytes]:
    """Start ``python -m taskq.worker APP`` with ``TASKQ_*`` settings from ``settings``
    (``module``: ``python -m MODULE`` instead, a script that runs its own worker)."""
    raw = url.render_as_string(hide_password=False) if isinstance(url, URL) else url
    child_env = dict(os.environ)
    child_env.update(
        {
            "TASKQ_DATABASE_URL": raw,
            "TASKQ_SCHEMA_NAME": "taskq",
            "TASKQ_POLL_INTERVAL": "0.05",
            "TASKQ_HEARTBEAT_INTERVAL": "0.5",
            "TASKQ_SWEEP_INTERVAL": "0.5",
            "PYTHONPATH": str(ROOT),
        }
    )
    for key, value in settings.items():
        child_env[f"TASKQ_{key.upper()}"] = str(value)
    child_env.update(env or {})
    log = log_path.open("ab")
    return subprocess.Popen(
        [sys.executable, "-m", module] if module else [sys.executable, "-m", "taskq.worker", app],
        cwd=ROOT,
        env=child_env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )


def stop_worker(proc: subprocess.Popen[bytes], timeout: float = 30.0) -> int:
    """SIGTERM a worker process and wait for it."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    return proc.wait(timeout)
