"""A backlog held back by a limit: what it costs, printed as one table.

    python benchmarks/throttled.py              # Postgres (TASKQ_BENCH_DATABASE_URL), Redis
                                                # (TASKQ_BENCH_REDIS_URL)
    python benchmarks/throttled.py --window 15  # longer measuring windows

For backlogs of 2,000 and 20,000 jobs of an actor behind a Redis ``TokenBucket`` of 5/s
and of 200/s (capacity: one second of refill), with one and with two ``taskq worker``
processes, it measures:

- the admitted rate against the bucket's: jobs started per second in the window (the
  store's ``started_at``), after a warm-up (the bucket is emptied before the workers
  start, so its initial burst is not counted);
- ``jobs`` row writes per admitted job: the job's insert plus the updates the run made to
  the ``jobs`` table (``pg_stat_user_tables.n_tup_upd``), divided by the jobs that ran;
- attempt-history rows per admitted job (``job_attempts`` rows written in the run);
- worker CPU as % of wall: user + system time of each worker process over the window
  (``/proc/<pid>/stat``; CPU time, not wall, because the machine may be shared).

Then the "real mutex": a ``ConcurrencyReservation(slots=1)`` actor whose jobs hold it
for 0.2 s, with one and two workers: jobs/s against the serial limit (1 / 0.2 s).
Statistics are read after the workers exit (a backend flushes its counters on exit).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, func, select, text
from sqlalchemy.engine import URL, Engine, make_url

from taskq.backends.sql import SqlBackend
from taskq.client import JobsClient
from taskq.db import migrate
from taskq.db.engine import make_engine
from taskq.db.tables import job_attempts, jobs
from taskq.records import EnqueueArgs
from taskq.settings import TaskQSettings

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the benchmark's actors live in the test apps
    sys.path.insert(0, str(ROOT))
APP = "tests.e2e.apps.waiting:registry"
ADMIN = os.environ.get(
    "TASKQ_BENCH_DATABASE_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
)
REDIS = os.environ.get("TASKQ_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
MUTEX_SECONDS = 0.2
TICK = os.sysconf("SC_CLK_TCK")


@dataclass
class Row:
    """One line of the table."""

    case: str
    backlog: int
    workers: int
    target: float
    admitted: float
    writes: float
    attempts: float
    cpu: float
    window: float


def _fresh_database() -> str:
    name = f"taskq_bench_{uuid.uuid4().hex[:8]}"
    admin = create_engine(make_url(ADMIN), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    admin.dispose()
    return make_url(ADMIN).set(database=name).render_as_string(hide_password=False)


def _drop_database(url: str) -> None:
    name = make_url(url).database
    admin = create_engine(make_url(ADMIN), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


def _settings(url: str) -> TaskQSettings:
    return TaskQSettings.load(database_url=url, redis_url=None, schema_name="taskq")


def _sync(url: str) -> URL:
    return (
        make_url(url)
        .set(drivername="postgresql+psycopg")
        .update_query_dict({"options": "-csearch_path=taskq"})
    )


async def _migrate(url: str) -> None:
    engine = make_engine(url, settings=_settings(url))
    await migrate.upgrade(engine, settings=_settings(url))
    await engine.dispose()


async def _enqueue(url: str, actor_name: str, count: int) -> None:
    from tests.e2e.apps import waiting

    ref = waiting.registry[actor_name]
    payload = waiting.Work(seconds=MUTEX_SECONDS if actor_name == "w_mutex" else 0.0)
    engine = make_engine(url, settings=_settings(url))
    client = JobsClient(SqlBackend(engine, settings=_settings(url)))
    for start in range(0, count, 1000):
        await client.enqueue_many(
            [EnqueueArgs(ref, payload) for _ in range(min(1000, count - start))]
        )
    await engine.dispose()


async def _empty_bucket(name: str, rate: float) -> None:
    """Take whatever the bucket holds (its initial burst, or what refilled while the
    workers booted), so the window sees only its refill."""
    from redis.asyncio import Redis

    from taskq.ratelimit import TokenBucket

    client = Redis.from_url(REDIS)
    bucket = TokenBucket(name, capacity=rate, refill_per_second=rate)
    try:
        left = (await bucket.peek(redis_client=client)).tokens_remaining
        if left >= 1:
            await bucket.acquire(float(int(left)), redis_client=client)
    finally:
        await client.aclose()


def _counters(engine: Engine) -> tuple[int, int]:
    """``jobs`` updates so far and ``job_attempts`` rows."""
    with engine.connect() as conn:
        upd = conn.execute(
            text(
                "SELECT n_tup_upd FROM pg_stat_user_tables "
                "WHERE schemaname = 'taskq' AND relname = 'jobs'"
            )
        ).scalar_one()
        attempts = conn.execute(select(func.count()).select_from(job_attempts)).scalar_one()
    return int(upd), int(attempts)


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def _spawn(url: str, env_extra: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    env = dict(os.environ)
    env.update(
        {
            "TASKQ_DATABASE_URL": url,
            "TASKQ_REDIS_URL": REDIS,
            "TASKQ_SCHEMA_NAME": "taskq",
            "TASKQ_LOG_LEVEL": os.environ.get("TASKQ_BENCH_LOG_LEVEL", "WARNING"),
            "PYTHONPATH": str(ROOT),
            **env_extra,
        }
    )
    return subprocess.Popen(
        [sys.executable, "-m", "taskq.worker", APP],
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


def _wait_booted(engine: Engine, count: int, timeout_s: float = 120.0) -> None:
    """Until ``count`` workers have registered (a loaded machine boots them slowly)."""
    deadline = time.monotonic() + timeout_s
    while True:
        with engine.connect() as conn:
            running = conn.execute(
                text("SELECT count(*) FROM workers WHERE status = 'running'")
            ).scalar_one()
        if int(running) >= count:
            return
        if time.monotonic() > deadline:
            raise SystemExit(f"{count} workers did not boot within {timeout_s:.0f} s")
        time.sleep(0.1)


def _db_now(engine: Engine) -> Any:
    with engine.connect() as conn:
        return conn.execute(select(func.clock_timestamp())).scalar_one()


def _started_between(engine: Engine, lo: Any, hi: Any) -> int:
    """Jobs started in [lo, hi) by the store's clock."""
    with engine.connect() as conn:
        count = conn.execute(
            select(func.count()).where(
                jobs.c.status.in_(("succeeded", "running")),
                jobs.c.started_at >= lo,
                jobs.c.started_at < hi,
            )
        ).scalar_one()
    return int(count)


def run_case(
    url: str,
    *,
    actor_name: str,
    backlog: int,
    workers: int,
    rate: float,
    warm_s: float,
    window_s: float,
    workdir: Path,
) -> Row:
    """Enqueue, run ``workers`` processes for warm-up + window, stop, read the counters.

    The window is shortened when the backlog would run out in it (2,000 jobs at 200/s).
    """
    window_s = min(window_s, max(2.0, backlog / rate - warm_s - 2.0))
    engine = create_engine(_sync(url))
    with engine.begin() as conn:
        conn.execute(text("TRUNCATE jobs, job_attempts, reservation_slots, workers CASCADE"))
    asyncio.run(_enqueue(url, actor_name, backlog))
    upd0, att0 = _counters(engine)
    tag = uuid.uuid4().hex[:8]
    env = {
        "TASKQ_W_BUCKET": f"bench_{tag}",
        "TASKQ_W_CAPACITY": str(rate),
        "TASKQ_W_RATE": str(rate),
        "TASKQ_W_MUTEX": f"bench_mutex_{tag}",
    }
    asyncio.run(_empty_bucket(env["TASKQ_W_BUCKET"], rate))
    procs = [_spawn(url, env, workdir / f"{tag}-{i}.log") for i in range(workers)]
    try:
        _wait_booted(engine, workers)
        if actor_name == "w_throttled":
            asyncio.run(_empty_bucket(env["TASKQ_W_BUCKET"], rate))
        time.sleep(warm_s)
        cpu0 = [_cpu_s(p.pid) for p in procs]
        wall0 = time.monotonic()
        lo = _db_now(engine)
        time.sleep(window_s)
        hi = _db_now(engine)
        cpu1 = [_cpu_s(p.pid) for p in procs]
        wall = time.monotonic() - wall0
    finally:
        _stop(procs)
    time.sleep(0.5)  # the exited backends' counters reach the shared statistics
    upd1, att1 = _counters(engine)
    with engine.connect() as conn:
        admitted = int(
            conn.execute(
                select(func.count()).where(jobs.c.status.in_(("succeeded", "running")))
            ).scalar_one()
        )
    # The bucket started empty; the warm-up began once every worker had booted.
    started = _started_between(engine, lo, hi)
    measured_s = (hi - lo).total_seconds()
    engine.dispose()
    cpu = sum(b - a for a, b in zip(cpu0, cpu1, strict=True)) / len(procs) / wall * 100
    case = "mutex 0.2 s" if actor_name == "w_mutex" else f"bucket {rate:g}/s"
    return Row(
        case=case,
        backlog=backlog,
        workers=workers,
        target=rate,
        admitted=started / measured_s,
        writes=1 + (upd1 - upd0) / max(1, admitted),
        attempts=(att1 - att0) / max(1, admitted),
        cpu=cpu,
        window=measured_s,
    )


def _print(rows: list[Row]) -> None:
    print(
        "| case | backlog | workers | window | admitted/s | vs limit | jobs row writes / job "
        "| attempt rows / job | worker CPU % of wall |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r.case} | {r.backlog:,} | {r.workers} | {r.window:.0f} s | {r.admitted:.2f} "
            f"| {r.admitted / r.target * 100:.1f} % | {r.writes:.2f} | {r.attempts:.2f} "
            f"| {r.cpu:.1f} % |"
        )


def main(argv: list[str] | None = None) -> int:
    """Run every case on a fresh database and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--window", type=float, default=12.0, help="seconds measured per case")
    parser.add_argument(
        "--warm", type=float, default=2.0, help="seconds between boot and measuring"
    )
    parser.add_argument("--backlogs", default="2000,20000")
    parser.add_argument("--rates", default="5,200")
    parser.add_argument("--workers", default="1,2")
    parser.add_argument("--no-mutex", action="store_true", help="skip the mutex cases")
    parser.add_argument("--logs", type=Path, default=None, help="keep worker logs here")
    args = parser.parse_args(argv)
    url = _fresh_database()
    rows: list[Row] = []
    try:
        asyncio.run(_migrate(url))
        with tempfile.TemporaryDirectory() as tmp:
            workdir = args.logs or Path(tmp)
            workdir.mkdir(parents=True, exist_ok=True)
            counts = [int(w) for w in args.workers.split(",")]
            common: dict[str, Any] = {"warm_s": args.warm, "window_s": args.window}
            for backlog in (int(b) for b in args.backlogs.split(",")):
                for rate in (float(r) for r in args.rates.split(",")):
                    for workers in counts:
                        rows.append(
                            run_case(
                                url,
                                actor_name="w_throttled",
                                backlog=backlog,
                                workers=workers,
                                rate=rate,
                                workdir=workdir,
                                **common,
                            )
                        )
                        print(rows[-1], file=sys.stderr)
            for workers in [] if args.no_mutex else counts:
                rows.append(
                    run_case(
                        url,
                        actor_name="w_mutex",
                        backlog=200,
                        workers=workers,
                        rate=1 / MUTEX_SECONDS,
                        workdir=workdir,
                        **common,
                    )
                )
                print(rows[-1], file=sys.stderr)
    finally:
        _drop_database(url)
    _print(rows)
    with open("/proc/loadavg") as f:
        print(f"\nload average during the run: {f.read().split()[0:3]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
