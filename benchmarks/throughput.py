"""Worker throughput and pickup latency, printed as one table.

    python benchmarks/throughput.py                    # Postgres (TASKQ_BENCH_DATABASE_URL)
    python benchmarks/throughput.py --engine sqlite    # the embedded engine, then Postgres
                                                       # as the reference row (--no-reference
                                                       # skips it)

Measures, on a fresh database: no-op jobs/second drained by one worker process from a
backlog (default 20,000), the same with two processes, and the median and p99 delay from
enqueue to start at a steady offered load (default 200 jobs/s). Drain rate is computed
from the store's own timestamps: jobs / (last ``finished_at`` - first ``started_at``).
Pickup latency is ``started_at - created_at`` per job, both stamped by the store's clock.
``--compare`` adds procrastinate/pgqueuer rows measured by ``benchmarks/compare.py`` when
their results file exists.

    python benchmarks/throughput.py --otel             # drain with OpenTelemetry off vs on

``--otel`` drains a backlog with one worker process, alternately without an SDK and
with one configured (``benchmarks/otel_worker.py``: spans and metrics on, exported to
exporters that drop them; every trace sampled, or 10 % of them; metrics alone), for two
workloads: no-op jobs (``--backlog``) and jobs that spend 1 ms of CPU each (a fifth of
the backlog). ``--repeat`` rounds, every setup in each, interleaved so that the
machine's other load falls on all alike; it prints the medians. Besides the drain rate
it prints the worker's CPU time per job (the slope of its ``/proc`` CPU time against
jobs done while draining, boot excluded): on a shared machine the drain rate moves with
the others' load, the CPU a job costs much less. ``--gc-freeze`` adds the no-SDK and the
every-trace setups again with ``gc.freeze()`` after the app's imports.
"""

from __future__ import annotations

import argparse
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
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, func, select, text
from sqlalchemy.engine import URL, make_url

from taskq.backends.sql import SqlBackend
from taskq.client import JobsClient
from taskq.db import migrate
from taskq.db.engine import make_engine
from taskq.db.tables import jobs
from taskq.records import EnqueueArgs
from taskq.settings import TaskQSettings

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the benchmark's actors live in the test apps
    sys.path.insert(0, str(ROOT))
APP = "tests.e2e.apps.basic:registry"
OTEL_APP = "benchmarks.otel_worker:registry"
ADMIN = os.environ.get(
    "TASKQ_BENCH_DATABASE_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
)


def _fresh_database(engine_kind: str, workdir: Path) -> str:
    if engine_kind == "sqlite":
        return f"sqlite:///{workdir / 'bench.db'}"
    name = f"taskq_bench_{uuid.uuid4().hex[:8]}"
    admin = create_engine(make_url(ADMIN), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    admin.dispose()
    return make_url(ADMIN).set(database=name).render_as_string(hide_password=False)


def _drop_database(url: str) -> None:
    if not url.startswith("postgresql"):
        return
    name = make_url(url).database
    admin = create_engine(make_url(ADMIN), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


def _settings(url: str) -> TaskQSettings:
    return TaskQSettings.load(database_url=url, redis_url=None, schema_name="taskq")


async def _setup(url: str) -> None:
    engine = make_engine(url, settings=_settings(url))
    await migrate.upgrade(engine, settings=_settings(url))
    await engine.dispose()


async def _enqueue_backlog(url: str, count: int, workload: str = "noop") -> float:
    from tests.e2e.apps.basic import Empty, noop

    engine = make_engine(url, settings=_settings(url))
    client = JobsClient(SqlBackend(engine, settings=_settings(url)))
    started = time.perf_counter()
    chunk = 1000
    if workload == "noop":
        ref: Any = noop
        payload: Any = Empty()
    else:
        from benchmarks.otel_actors import Work, work

        ref, payload = work, Work()
    for start in range(0, count, chunk):
        await client.enqueue_many(
            [EnqueueArgs(ref, payload) for _ in range(min(chunk, count - start))]
        )
    elapsed = time.perf_counter() - started
    await engine.dispose()
    return count / elapsed


def _spawn(
    url: str, concurrency: int, log: Path, app: str = APP, extra: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    env = dict(os.environ)
    env.update(extra or {})
    env.update(
        {
            "TASKQ_DATABASE_URL": url,
            "TASKQ_SCHEMA_NAME": "taskq",
            "TASKQ_MAX_CONCURRENCY": str(concurrency),
            "TASKQ_CLAIM_BATCH_SIZE": os.environ.get("BENCH_BATCH", str(max(1, concurrency // 2))),
            "TASKQ_POLL_INTERVAL": "0.2",
            "PYTHONPATH": str(ROOT),
        }
    )
    return subprocess.Popen(
        [sys.executable, "-m", "taskq.worker", app],
        cwd=ROOT,
        env=env,
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
    )


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        proc.wait(60)


def _count_done(url: str) -> int:
    engine = create_engine(_sync(url))
    with engine.connect() as conn:
        value = conn.execute(
            select(func.count()).select_from(jobs).where(jobs.c.status == "succeeded")
        ).scalar_one()
    engine.dispose()
    return int(value)


def _sync(url: str) -> URL:
    u = make_url(url)
    if u.get_backend_name() == "postgresql":
        return u.set(drivername="postgresql+psycopg").update_query_dict(
            {"options": "-csearch_path=taskq"}
        )
    return u.set(drivername="sqlite+pysqlite")


def _timestamps(url: str) -> list[tuple[Any, Any, Any]]:
    engine = create_engine(_sync(url))
    with engine.connect() as conn:
        rows = conn.execute(
            select(jobs.c.created_at, jobs.c.started_at, jobs.c.finished_at).where(
                jobs.c.status == "succeeded"
            )
        ).all()
    engine.dispose()
    return [tuple(r) for r in rows]


def _wait_done(
    url: str, count: int, timeout: float, pid: int | None = None
) -> list[tuple[int, float]]:
    """Wait for ``count`` succeeded jobs; with ``pid``, ``(done, cpu_s)`` samples of that
    process's CPU time along the way."""
    deadline = time.monotonic() + timeout
    samples: list[tuple[int, float]] = []
    while True:
        done = _count_done(url)
        if pid is not None:
            samples.append((done, _cpu_s(pid)))
        if done >= count:
            return samples
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {count} jobs")
        time.sleep(0.25)


def _cpu_s(pid: int) -> float:
    """User plus system CPU time of process ``pid`` (Linux ``/proc``; 0 elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _cpu_per_job(samples: list[tuple[int, float]]) -> float:
    """CPU seconds per job while draining: from the first sample with jobs done (boot is
    over) to the first that saw them all."""
    started = [s for s in samples if s[0] > 0]
    if len(started) < 2 or started[-1][0] == started[0][0]:
        return float("nan")
    (n0, c0), (n1, c1) = started[0], started[-1]
    return (c1 - c0) / (n1 - n0)


def drain(
    engine_kind: str,
    processes: int,
    backlog: int,
    concurrency: int,
    app: str = APP,
    extra: dict[str, str] | None = None,
    workload: str = "noop",
) -> dict[str, float]:
    """Backlog first, then workers: jobs/s from the store's first start to last finish
    (and, with one process, its CPU seconds per job)."""
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        url = _fresh_database(engine_kind, workdir)
        try:
            asyncio.run(_setup(url))
            enqueue_rate = asyncio.run(_enqueue_backlog(url, backlog, workload))
            procs = [
                _spawn(url, concurrency, workdir / f"w{i}.log", app, extra)
                for i in range(processes)
            ]
            try:
                samples = _wait_done(url, backlog, 600, procs[0].pid if processes == 1 else None)
            finally:
                _stop(procs)
            rows = _timestamps(url)
        finally:
            _drop_database(url)
    first = min(r[1] for r in rows)
    last = max(r[2] for r in rows)
    return {
        "drain": len(rows) / (last - first).total_seconds(),
        "enqueue": enqueue_rate,
        "cpu": _cpu_per_job(samples),
    }


async def _offer(url: str, rate: float, seconds: float) -> int:
    from tests.e2e.apps.basic import Empty, noop

    engine = make_engine(url, settings=_settings(url))
    client = JobsClient(SqlBackend(engine, settings=_settings(url)))
    total = int(rate * seconds)
    start = time.perf_counter()
    for i in range(total):
        target = start + i / rate
        delay = target - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        await client.enqueue(noop, Empty())
    await engine.dispose()
    return total


def latency(engine_kind: str, rate: float, seconds: float, concurrency: int) -> dict[str, float]:
    """Offered load with one worker running: enqueue-to-start delay, median and p99 (ms)."""
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        url = _fresh_database(engine_kind, workdir)
        try:
            asyncio.run(_setup(url))
            proc = _spawn(url, concurrency, workdir / "w.log")
            try:
                time.sleep(2.0)  # boot (imports, actor sync) before the clock starts
                total = asyncio.run(_offer(url, rate, seconds))
                _wait_done(url, total, 120)
            finally:
                _stop([proc])
            rows = _timestamps(url)
        finally:
            _drop_database(url)
    delays = sorted((r[1] - r[0]).total_seconds() * 1000 for r in rows)
    p99 = delays[min(len(delays) - 1, int(len(delays) * 0.99))]
    return {"p50": statistics.median(delays), "p99": p99}


def _median_of(runs: int, measure: Callable[..., dict[str, float]], *args: Any) -> dict[str, float]:
    """Run ``measure(*args)`` ``runs`` times; the median of each figure (2 cores are noisy)."""
    results = [measure(*args) for _ in range(max(1, runs))]
    return {key: statistics.median(r[key] for r in results) for key in results[0]}


OFF = {"TASKQ_BENCH_OTEL": "off"}
OTEL_SETUPS: tuple[tuple[str, dict[str, str]], ...] = (
    ("otel off", OFF),
    ("traces 100 % + metrics", {}),
    ("traces 10 % + metrics", {"TASKQ_BENCH_SAMPLE": "0.1"}),
    ("metrics only", {"TASKQ_BENCH_OTEL": "metrics"}),
)
"""The worker setups, all one app (``benchmarks/otel_worker.py``): no SDK; an SDK
recording every trace; ``ParentBased(TraceIdRatioBased(0.1))``; a meter provider and no
tracer provider."""
GC_SETUPS: tuple[tuple[str, dict[str, str]], ...] = (
    ("otel off, gc.freeze()", {**OFF, "TASKQ_BENCH_GC_FREEZE": "1"}),
    ("traces 100 % + metrics, gc.freeze()", {"TASKQ_BENCH_GC_FREEZE": "1"}),
)
"""With ``--gc-freeze``: the same app calling ``gc.freeze()`` after its imports, without
and with the SDK (the SDK's spans wait in its batch queue long enough to reach the older
generations, and a full collection walks every object the process made at startup)."""
WORKLOADS: tuple[tuple[str, str, int], ...] = (("no-op", "noop", 1), ("1 ms CPU", "work", 5))
"""``(label, workload, backlog divisor)``: a 1 ms job drains ~5x slower, so a fifth of
the backlog keeps the rounds short."""


def otel_overhead(
    engine_kind: str, rounds: int, backlog: int, concurrency: int, gc_freeze: bool = False
) -> None:
    """Drain rate and worker CPU per job for each workload and each of
    :data:`OTEL_SETUPS` (and :data:`GC_SETUPS`), rounds interleaved; print the medians
    against ``otel off``."""
    setups = OTEL_SETUPS + (GC_SETUPS if gc_freeze else ())
    results: dict[tuple[str, str], list[dict[str, float]]] = {}
    for _ in range(max(1, rounds)):
        for label, workload, divisor in WORKLOADS:
            for setup, extra in setups:
                one = drain(
                    engine_kind, 1, backlog // divisor, concurrency, OTEL_APP, extra, workload
                )
                results.setdefault((label, setup), []).append(one)

    def med(key: tuple[str, str], figure: str) -> float:
        return statistics.median(r[figure] for r in results[key])

    header = ("jobs", "setup", "drain (jobs/s)", "vs off", "worker CPU / job", "vs off")
    rows: list[tuple[str, ...]] = []
    for label, _, _ in WORKLOADS:
        for setup, _ in setups:
            # a gc.freeze() setup is compared with the frozen baseline
            base = "otel off, gc.freeze()" if setup.endswith("gc.freeze()") else "otel off"
            base_drain, base_cpu = med((label, base), "drain"), med((label, base), "cpu")
            drained, cpu = med((label, setup), "drain"), med((label, setup), "cpu")
            off = setup == base
            rows.append(
                (
                    label,
                    setup,
                    f"{drained:,.0f}",
                    "-" if off else f"{(drained / base_drain - 1) * 100:+.1f} %",
                    f"{cpu * 1e6:,.0f} us",
                    "-"
                    if off
                    else f"{(cpu - base_cpu) * 1e6:+,.0f} us ({(cpu / base_cpu - 1) * 100:+.1f} %)",
                )
            )
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    print(" | ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)))
    print("-+-".join("-" * w for w in widths))
    for cells in rows:
        print(" | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)))
    print(
        f"engine={engine_kind} backlog={backlog} (1 ms jobs: {backlog // WORKLOADS[1][2]}) "
        f"concurrency={concurrency} cores={os.cpu_count()} load={os.getloadavg()[0]:.1f}; "
        f"one worker process; medians of {max(1, rounds)} interleaved rounds"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=("postgres", "sqlite"), default="postgres")
    parser.add_argument("--backlog", type=int, default=20_000)
    parser.add_argument("--concurrency", type=int, default=200)
    parser.add_argument("--rate", type=float, default=200.0)
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--compare", type=Path, default=ROOT / "benchmarks" / "compare.json")
    parser.add_argument(
        "--repeat", type=int, default=3, help="drain runs per figure; the median is printed"
    )
    parser.add_argument(
        "--no-reference",
        action="store_true",
        help="with --engine sqlite: do not add the Postgres row for comparison",
    )
    parser.add_argument(
        "--otel", action="store_true", help="drain with OpenTelemetry off vs on, and stop"
    )
    parser.add_argument(
        "--gc-freeze",
        action="store_true",
        help="with --otel: also both setups with gc.freeze() after the app's imports",
    )
    args = parser.parse_args()
    if args.otel:
        otel_overhead(args.engine, args.repeat, args.backlog, args.concurrency, args.gc_freeze)
        return

    engines = [args.engine]
    if args.engine == "sqlite" and not args.no_reference:
        engines.append("postgres")
    rows: list[tuple[str, str, str, str, str, str]] = []
    for engine_kind in engines:
        one = _median_of(args.repeat, drain, engine_kind, 1, args.backlog, args.concurrency)
        two = _median_of(args.repeat, drain, engine_kind, 2, args.backlog, args.concurrency)
        lat = latency(engine_kind, args.rate, args.seconds, min(args.concurrency, 50))
        rows.append(
            (
                f"taskq ({engine_kind})",
                f"{one['drain']:,.0f}",
                f"{two['drain']:,.0f}",
                f"{lat['p50']:.1f}",
                f"{lat['p99']:.1f}",
                f"{one['enqueue']:,.0f}",
            )
        )
    if args.compare.exists() and args.engine == "postgres":
        for name, data in json.loads(args.compare.read_text()).items():
            rows.append(
                (
                    name,
                    f"{data.get('drain_1', 0):,.0f}",
                    f"{data.get('drain_2', 0):,.0f}",
                    f"{data.get('p50', float('nan')):.1f}",
                    f"{data.get('p99', float('nan')):.1f}",
                    "-",
                )
            )
    header = ("system", "drain 1 proc (jobs/s)", "drain 2 procs (jobs/s)",
              f"p50 pickup @{args.rate:.0f}/s (ms)", "p99 pickup (ms)", "bulk enqueue (jobs/s)")  # fmt: skip
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    print(" | ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)))
    print("-+-".join("-" * w for w in widths))
    for row in rows:
        print(" | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)))
    print(
        f"backlog={args.backlog} concurrency={args.concurrency} cores={os.cpu_count()} "
        f"taskq drain = median of {args.repeat} runs; comparison rows from {args.compare.name}"
    )


if __name__ == "__main__":
    main()
