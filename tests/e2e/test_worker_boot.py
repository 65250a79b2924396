"""A worker whose database connection drops while it boots retries its boot, not exits.

The boot is held at its ``workers`` insert by a lock this test owns, so the worker's
backend is provably mid-boot when it is terminated.
"""

from __future__ import annotations

import socket
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import select, text
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from taskq.backends.sql import SqlBackend
from taskq.client import JobsClient
from taskq.db.engine import make_engine
from taskq.db.tables import workers
from taskq.settings import TaskQSettings
from tests.e2e.apps import basic
from tests.support.workers import spawn_worker, stop_worker, wait_until


async def _blocked_pids(engine: AsyncEngine, holder: int) -> list[int]:
    stmt = text(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
        "AND :holder = ANY(pg_blocking_pids(pid))"
    )
    async with engine.connect() as conn:
        return list((await conn.execute(stmt, {"holder": holder})).scalars())


async def _terminate(engine: AsyncEngine, pids: list[int]) -> None:
    async with engine.connect() as conn:
        for pid in pids:
            await conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})


async def _lock_workers(conn: AsyncConnection) -> int:
    await conn.execute(text("LOCK TABLE taskq.workers IN ACCESS EXCLUSIVE MODE"))
    return int((await conn.execute(text("SELECT pg_backend_pid()"))).scalar_one())


@asynccontextmanager
async def _retrying_boot(
    engine: AsyncEngine, pg_url: URL, log: Path, procs: list[Any]
) -> AsyncIterator[subprocess.Popen[bytes]]:
    """A worker whose boot lost its connection at the ``workers`` insert and is queued
    behind the same lock again; the lock is released when the block exits."""
    async with engine.connect() as holder_conn:
        holder = await _lock_workers(holder_conn)
        proc = spawn_worker(pg_url, log_path=log)
        procs.append(proc)

        async def blocked() -> bool:
            return bool(await _blocked_pids(engine, holder))

        await wait_until(blocked, timeout=120)
        first = await _blocked_pids(engine, holder)
        await _terminate(engine, first)

        async def blocked_again() -> bool:  # a new backend: the terminated one may linger
            pids = await _blocked_pids(engine, holder)
            return bool(pids) and not set(pids) & set(first)

        await wait_until(blocked_again, timeout=60)
        assert proc.poll() is None, "the worker exited instead of retrying its boot"
        yield proc
        await holder_conn.rollback()


async def test_a_connection_lost_during_boot_is_retried(
    pg_url: URL, settings: TaskQSettings, runs_file: Path, tmp_path: Path, procs: list[Any]
) -> None:
    engine = make_engine(pg_url, settings=settings)
    log = tmp_path / "w.log"
    try:
        async with _retrying_boot(engine, pg_url, log, procs) as proc:
            pass
        client = JobsClient(SqlBackend(engine, settings=settings))
        handle = await client.enqueue(basic.record, basic.Work(n=1))
        assert await handle.wait(timeout=60) is None
        assert await handle.status() == "succeeded"
        assert stop_worker(proc) == 0, log.read_text()
        text_ = log.read_text()
        assert "worker-boot-retry" in text_
        assert text_.count("worker-started") == 1
    finally:
        await engine.dispose()


async def test_sigterm_while_boot_waits_for_the_database_exits_cleanly(
    pg_url: URL, settings: TaskQSettings, runs_file: Path, tmp_path: Path, procs: list[Any]
) -> None:
    engine = make_engine(pg_url, settings=settings)
    log = tmp_path / "w.log"
    try:
        async with _retrying_boot(engine, pg_url, log, procs) as proc:
            assert stop_worker(proc) == 0, log.read_text()
        text_ = log.read_text()
        assert "worker-boot-retry" in text_
        assert "worker-stopped-during-boot" in text_
        assert "worker-started" not in text_
        async with engine.connect() as conn:  # it had not registered: no row left behind
            rows = await conn.execute(select(workers.c.id).where(workers.c.pid == proc.pid))
            assert rows.all() == []
    finally:
        await engine.dispose()


async def test_a_database_that_never_answers_fails_the_boot_after_the_timeout(
    tmp_path: Path, procs: list[Any]
) -> None:
    log = tmp_path / "w.log"
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"postgresql+psycopg://postgres@127.0.0.1:{port}/nothing"
    proc = spawn_worker(url, log_path=log, boot_retry_timeout=1)
    procs.append(proc)
    assert proc.wait(timeout=120) == 1, log.read_text()
    text_ = log.read_text()
    assert text_.count("worker-boot-retry") >= 2
    assert "worker-boot-failed" in text_
    assert "worker-started" not in text_
