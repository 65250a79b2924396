"""Measure procrastinate and pgqueuer the way benchmarks/throughput.py measures taskq.

Run with the interpreter of a throwaway venv holding the library under test:

    /tmp/venv-pgq/bin/python -m benchmarks.compare.run pgqueuer
    /tmp/venv-proc/bin/python -m benchmarks.compare.run procrastinate

Each run merges its figures into ``benchmarks/compare.json``, which
``benchmarks/throughput.py`` prints beside taskq's row. Drain: a 20,000-job no-op
backlog, jobs/s between the first job leaving the queue and the last (sampled every
20 ms). Pickup latency: enqueue-to-start at 200 jobs/s offered, median and p99.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "compare.json"
ADMIN = os.environ.get("BENCH_ADMIN_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")
BIN = Path(sys.executable).parent


def _database() -> str:
    name = f"bench_cmp_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(ADMIN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return ADMIN.rsplit("/", 1)[0] + f"/{name}"


def _drop(dsn: str) -> None:
    name = dsn.rsplit("/", 1)[1]
    with psycopg.connect(ADMIN, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _scalar(dsn: str, sql: str) -> Any:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(sql).fetchone()
    return row[0] if row else None


def _watch(dsn: str, remaining_sql: str, total: int, timeout: float = 120) -> float:
    """Seconds from the first job leaving the queue to the last."""
    start: float | None = None
    deadline = time.monotonic() + timeout
    with psycopg.connect(dsn, autocommit=True) as conn:
        while time.monotonic() < deadline:
            row = conn.execute(remaining_sql).fetchone()
            assert row is not None
            left = row[0]
            now = time.perf_counter()
            if start is None and left < total:
                start = now
            if left == 0:
                assert start is not None
                return now - start
            time.sleep(0.02)
    raise SystemExit("timed out")


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


def _pct(values: list[float]) -> dict[str, float]:
    values.sort()
    return {
        "p50": statistics.median(values),
        "p99": values[min(len(values) - 1, int(len(values) * 0.99))],
    }


# --- pgqueuer -------------------------------------------------------------------------


def _pgq_env(dsn: str, **extra: str) -> dict[str, str]:
    return {**os.environ, "PGDSN": dsn, "PYTHONPATH": str(ROOT), **extra}


def _pgq_setup(dsn: str) -> None:
    subprocess.run(
        [BIN / "pgq", "install", "--durability", "durable"],
        env=_pgq_env(dsn),
        check=True,
        capture_output=True,
    )


async def _pgq_enqueue(dsn: str, total: int, rate: float | None = None) -> None:
    import asyncpg
    from pgqueuer.db import AsyncpgDriver
    from pgqueuer.queries import Queries

    conn = await asyncpg.connect(dsn)
    queries = Queries(AsyncpgDriver(conn))
    if rate is None:
        for start in range(0, total, 1000):
            n = min(1000, total - start)
            await queries.enqueue(["noop"] * n, [None] * n, [0] * n)
    else:
        begin = time.perf_counter()
        for i in range(total):
            delay = begin + i / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            await queries.enqueue("noop", None)
    await conn.close()


PGQ_BATCH = os.environ.get("BENCH_PGQ_BATCH", "100")
PGQ_TASKS = ["--max-concurrent-tasks", "200"] if PGQ_BATCH != "10" else []


def _pgq_worker(dsn: str, log: Path, **extra: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [BIN / "pgq", "run", "benchmarks.compare.pgq_app:main", "--batch-size", PGQ_BATCH,
         *PGQ_TASKS, "--log-level", "WARNING"],
        env=_pgq_env(dsn, **extra), cwd=ROOT, stdout=log.open("ab"), stderr=subprocess.STDOUT,
    )  # fmt: skip


def pgqueuer(backlog: int, rate: float, seconds: float) -> dict[str, float]:
    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for procs_n in (1, 2):
            dsn = _database()
            try:
                _pgq_setup(dsn)
                asyncio.run(_pgq_enqueue(dsn, backlog))
                procs = [_pgq_worker(dsn, Path(tmp) / f"d{procs_n}{i}.log") for i in range(procs_n)]
                try:
                    elapsed = _watch(dsn, "SELECT count(*) FROM pgqueuer", backlog)
                finally:
                    _stop(procs)
                out[f"drain_{procs_n}"] = backlog / elapsed
            finally:
                _drop(dsn)
        dsn = _database()
        latency_file = Path(tmp) / "latency.txt"
        try:
            _pgq_setup(dsn)
            proc = _pgq_worker(dsn, Path(tmp) / "lat.log", BENCH_LATENCY_FILE=str(latency_file))
            try:
                time.sleep(2.0)
                total = int(rate * seconds)
                asyncio.run(_pgq_enqueue(dsn, total, rate))
                _watch(dsn, "SELECT count(*) FROM pgqueuer", total)
            finally:
                _stop([proc])
            out.update(_pct([float(x) for x in latency_file.read_text().split()]))
        finally:
            _drop(dsn)
    return out


# --- procrastinate --------------------------------------------------------------------


def _proc_cmd(*args: str) -> list[str]:
    return [str(BIN / "procrastinate"), "--app=benchmarks.compare.procrastinate_app.app", *args]


def _proc_env(dsn: str) -> dict[str, str]:
    return {**os.environ, "PGDSN": dsn, "PYTHONPATH": str(ROOT)}


async def _proc_enqueue(dsn: str, total: int, rate: float | None = None) -> None:
    import importlib

    sys.path.insert(0, str(ROOT))
    os.environ["PGDSN"] = dsn  # the app module reads it at import: reload per database
    module = importlib.reload(importlib.import_module("benchmarks.compare.procrastinate_app"))
    app, noop = module.app, module.noop
    async with app.open_async():
        if rate is None:
            for start in range(0, total, 1000):
                await noop.batch_defer_async(*({} for _ in range(min(1000, total - start))))
        else:
            begin = time.perf_counter()
            for i in range(total):
                delay = begin + i / rate - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                await noop.defer_async()


def _proc_worker(dsn: str, log: Path, concurrency: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        _proc_cmd("worker", f"--concurrency={concurrency}"),
        env=_proc_env(dsn), cwd=ROOT, stdout=log.open("ab"), stderr=subprocess.STDOUT,
    )  # fmt: skip


_PROC_LEFT = "SELECT count(*) FROM procrastinate_jobs WHERE status IN ('todo', 'doing')"


def procrastinate(backlog: int, rate: float, seconds: float, concurrency: int) -> dict[str, float]:
    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for procs_n in (1, 2):
            dsn = _database()
            try:
                subprocess.run(
                    _proc_cmd("schema", "--apply"),
                    env=_proc_env(dsn),
                    cwd=ROOT,
                    check=True,
                    capture_output=True,
                )
                asyncio.run(_proc_enqueue(dsn, backlog))
                procs = [
                    _proc_worker(dsn, Path(tmp) / f"d{procs_n}{i}.log", concurrency)
                    for i in range(procs_n)
                ]
                try:
                    elapsed = _watch(dsn, _PROC_LEFT, backlog)
                finally:
                    _stop(procs)
                out[f"drain_{procs_n}"] = backlog / elapsed
            finally:
                _drop(dsn)
        dsn = _database()
        try:
            subprocess.run(
                _proc_cmd("schema", "--apply"),
                env=_proc_env(dsn),
                cwd=ROOT,
                check=True,
                capture_output=True,
            )
            proc = _proc_worker(dsn, Path(tmp) / "lat.log", concurrency)
            try:
                time.sleep(2.0)
                total = int(rate * seconds)
                asyncio.run(_proc_enqueue(dsn, total, rate))
                _watch(dsn, _PROC_LEFT, total)
            finally:
                _stop([proc])
            with psycopg.connect(dsn) as conn:
                rows = conn.execute(
                    "SELECT extract(epoch FROM s.at - d.at) * 1000 FROM procrastinate_events d "
                    "JOIN procrastinate_events s ON s.job_id = d.job_id AND s.type = 'started' "
                    "WHERE d.type = 'deferred'"
                ).fetchall()
            out.update(_pct([float(r[0]) for r in rows]))
        finally:
            _drop(dsn)
    return out


def main() -> None:
    which = sys.argv[1]
    backlog = int(os.environ.get("BENCH_BACKLOG", "20000"))
    if which == "pgqueuer":
        figures = pgqueuer(backlog, 200.0, 15.0)
        name = (
            "pgqueuer (defaults: batch 10)"
            if PGQ_BATCH == "10"
            else f"pgqueuer (batch {PGQ_BATCH}, 200 tasks)"
        )
    else:
        concurrency = int(os.environ.get("BENCH_CONCURRENCY", "10"))
        figures = procrastinate(backlog, 200.0, 15.0, concurrency)
        name = f"procrastinate (concurrency {concurrency})"
    data = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    data[name] = figures
    RESULTS.write_text(json.dumps(data, indent=2) + "\n")
    print(name, figures)


if __name__ == "__main__":
    main()
