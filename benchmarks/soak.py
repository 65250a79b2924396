"""Soak: a long steady stream of mixed jobs through a small fleet; memory and connections flat.

On a fresh Postgres database, ``--workers`` worker processes drain a mix of jobs
(:mod:`benchmarks.soak_app`: async sleeps, sync work in threads, a retried failure,
progress reports): ``--jobs`` jobs that a producer enqueues at a steady
rate over ``--duration`` seconds. Every ``--sample`` seconds it reads each worker's RSS
(``/proc/<pid>/status``) and the database's connections (``pg_stat_activity``). After
the warm-up (``--warmup``, a fraction of the run) each worker's RSS must grow less than
10 % and the connection count must not grow (the most held in the second half of the
rest of the run no more than in its first half: pools open connections as load first
needs them, a leak keeps opening them); no job may be lost.

    python benchmarks/soak.py                                # 200,000 jobs, 4 workers, 30 min
    python benchmarks/soak.py --jobs 20000 --duration 300    # the 5-minute form
    python benchmarks/soak.py --json soak.json               # also write the figures

Exit status 1 when a check fails. ``tests/chaos`` runs a short form of it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, func, select, text
from sqlalchemy.engine import make_url

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the workers import benchmarks.soak_app
    sys.path.insert(0, str(ROOT))

from taskq.backends.sql import SqlBackend  # noqa: E402
from taskq.client import JobsClient  # noqa: E402
from taskq.db import migrate  # noqa: E402
from taskq.db.engine import make_engine  # noqa: E402
from taskq.db.tables import jobs  # noqa: E402
from taskq.db.tables import workers as worker_rows  # noqa: E402
from taskq.records import EnqueueArgs  # noqa: E402
from taskq.settings import TaskQSettings  # noqa: E402

APP = "benchmarks.soak_app:registry"
ADMIN = os.environ.get(
    "TASKQ_BENCH_DATABASE_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
)
RSS_GROWTH_LIMIT = 0.10


@dataclass
class Figures:
    """What a soak measured (``rss_kib``: per worker, at the warm-up's end and the run's)."""

    jobs: int
    workers: int
    duration_s: float
    completed: int = 0
    lost: int = 0
    jobs_per_s: float = 0.0
    rss_kib_after_warmup: list[int] = field(default_factory=list)
    rss_kib_end: list[int] = field(default_factory=list)
    rss_growth_max: float = 0.0
    connections_after_warmup: int = 0
    connections_first_half_max: int = 0
    connections_second_half_max: int = 0
    connections_end: int = 0
    samples: int = 0
    unfinished: list[str] = field(default_factory=list)
    """A few jobs that did not succeed: ``id status attempt error_class``."""

    @property
    def connections_flat(self) -> bool:
        """No connection growth: the pools may still open connections early in the run
        (each engine opens one when load first needs it, up to its size), but the most
        held in the second half of the post-warm-up period is no more than in the first."""
        return self.connections_second_half_max <= self.connections_first_half_max

    @property
    def ok(self) -> bool:
        return self.lost == 0 and self.rss_growth_max < RSS_GROWTH_LIMIT and self.connections_flat


def _settings(url: str) -> TaskQSettings:
    return TaskQSettings.load(database_url=url, redis_url=None, schema_name="taskq")


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def _spawn(url: str, log: Path, concurrency: int) -> subprocess.Popen[bytes]:
    env = dict(os.environ)
    env.update(
        {
            "TASKQ_DATABASE_URL": url,
            "TASKQ_SCHEMA_NAME": "taskq",
            "TASKQ_REDIS_URL": "",
            "TASKQ_MAX_CONCURRENCY": str(concurrency),
            "TASKQ_CLAIM_BATCH_SIZE": str(max(1, concurrency // 2)),
            "TASKQ_POLL_INTERVAL": "0.2",
            "TASKQ_LOG_LEVEL": "WARNING",
            "PYTHONPATH": str(ROOT),
        }
    )
    return subprocess.Popen(
        [sys.executable, "-m", "taskq.worker", APP],
        cwd=ROOT,
        env=env,
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
    )


async def run_soak(
    url: str,
    *,
    total: int,
    workers: int,
    duration_s: float,
    warmup: float = 0.2,
    sample_s: float = 5.0,
    concurrency: int = 20,
    logdir: Path | None = None,
) -> Figures:
    """Run one soak against the migrated database at ``url``; the figures."""
    from benchmarks import soak_app

    logdir = logdir or Path(tempfile.mkdtemp(prefix="taskq-soak-"))
    settings = _settings(url)
    engine = make_engine(url, settings=settings)
    client = JobsClient(SqlBackend(engine, settings=settings))
    procs = [_spawn(url, logdir / f"worker{i}.log", concurrency) for i in range(workers)]
    figures = Figures(jobs=total, workers=workers, duration_s=duration_s)
    connections = text("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()")
    try:
        boot_deadline = time.monotonic() + 120
        while time.monotonic() < boot_deadline:  # the clock starts once all have booted
            async with engine.connect() as conn:
                up = (
                    await conn.execute(
                        select(func.count())
                        .select_from(worker_rows)
                        .where(worker_rows.c.status == "running")
                    )
                ).scalar_one()
            if up >= workers:
                break
            await asyncio.sleep(0.2)
        started = time.monotonic()
        warm_at = started + duration_s * warmup
        enqueued = 0
        next_sample = started + sample_s
        rss_after: list[int] | None = None
        half_at = warm_at + (started + duration_s - warm_at) / 2
        while enqueued < total or time.monotonic() - started < duration_s:
            now = time.monotonic()
            due = min(total, int(total * (now - started) / duration_s) + 1)
            if due > enqueued:
                batch = min(due - enqueued, 1000)
                await client.enqueue_many(
                    [EnqueueArgs(*soak_app.item(enqueued + i)) for i in range(batch)]
                )
                enqueued += batch
            if now >= next_sample:
                next_sample += sample_s
                figures.samples += 1
                async with engine.connect() as conn:
                    conns = int((await conn.execute(connections)).scalar_one())
                if now >= warm_at:
                    if rss_after is None:
                        rss_after = [_rss_kib(p.pid) for p in procs]
                        figures.rss_kib_after_warmup = rss_after
                        figures.connections_after_warmup = conns
                    if now < half_at:
                        figures.connections_first_half_max = max(
                            figures.connections_first_half_max, conns
                        )
                    else:
                        figures.connections_second_half_max = max(
                            figures.connections_second_half_max, conns
                        )
            for proc in procs:
                if proc.poll() is not None:
                    raise RuntimeError(f"worker {proc.pid} exited with {proc.returncode}")
            await asyncio.sleep(0.05)
        drain_deadline = time.monotonic() + max(120.0, duration_s * 0.5)
        while time.monotonic() < drain_deadline:
            async with engine.connect() as conn:
                done = int(
                    (
                        await conn.execute(
                            select(func.count())
                            .select_from(jobs)
                            .where(jobs.c.status.in_(("succeeded", "failed")))
                        )
                    ).scalar_one()
                )
            if done >= total:
                break
            await asyncio.sleep(0.5)
        elapsed = time.monotonic() - started
        figures.rss_kib_end = [_rss_kib(p.pid) for p in procs]
        async with engine.connect() as conn:
            figures.connections_end = int((await conn.execute(connections)).scalar_one())
            figures.completed = int(
                (
                    await conn.execute(
                        select(func.count()).select_from(jobs).where(jobs.c.status == "succeeded")
                    )
                ).scalar_one()
            )
            left = await conn.execute(
                select(jobs.c.id, jobs.c.actor, jobs.c.status, jobs.c.attempt, jobs.c.error_class)
                .where(jobs.c.status != "succeeded")
                .limit(10)
            )
            figures.unfinished = [" ".join(map(str, row)) for row in left.all()]
        figures.lost = total - figures.completed
        figures.jobs_per_s = round(figures.completed / elapsed, 1)
        base = figures.rss_kib_after_warmup or figures.rss_kib_end
        figures.rss_growth_max = round(
            max((end / start - 1.0) for start, end in zip(base, figures.rss_kib_end, strict=True)),
            4,
        )
        return figures
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
        await engine.dispose()


def _fresh_database() -> str:
    name = f"taskq_soak_{uuid.uuid4().hex[:8]}"
    admin = create_engine(make_url(ADMIN), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    admin.dispose()
    return make_url(ADMIN).set(database=name).render_as_string(hide_password=False)


def _drop_database(url: str) -> None:
    admin = create_engine(make_url(ADMIN), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{make_url(url).database}" WITH (FORCE)'))
    admin.dispose()


def table(figures: Figures) -> str:
    """The figures as a Markdown table."""
    rows: list[tuple[str, Any]] = [
        ("jobs (completed / enqueued)", f"{figures.completed} / {figures.jobs}"),
        ("workers", figures.workers),
        ("duration", f"{figures.duration_s:.0f} s"),
        ("throughput", f"{figures.jobs_per_s} jobs/s"),
        ("lost", figures.lost),
        ("worker RSS after warm-up (KiB)", ", ".join(map(str, figures.rss_kib_after_warmup))),
        ("worker RSS at the end (KiB)", ", ".join(map(str, figures.rss_kib_end))),
        ("largest RSS growth after warm-up", f"{figures.rss_growth_max:.1%}"),
        (
            "connections (after warm-up / max 1st half / max 2nd half / end)",
            f"{figures.connections_after_warmup} / {figures.connections_first_half_max}"
            f" / {figures.connections_second_half_max} / {figures.connections_end}",
        ),
    ]
    lines = ["| measure | value |", "|---|---|"]
    lines += [f"| {name} | {value} |" for name, value in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=200_000)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--duration", type=float, default=1800.0, help="seconds")
    parser.add_argument("--warmup", type=float, default=0.2, help="fraction of the run")
    parser.add_argument("--sample", type=float, default=5.0, help="seconds between samples")
    parser.add_argument("--concurrency", type=int, default=20, help="per worker")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    url = _fresh_database()
    try:
        asyncio.run(_migrate(url))
        figures = asyncio.run(
            run_soak(
                url,
                total=args.jobs,
                workers=args.workers,
                duration_s=args.duration,
                warmup=args.warmup,
                sample_s=args.sample,
                concurrency=args.concurrency,
            )
        )
    finally:
        _drop_database(url)
    print(table(figures))
    for line in figures.unfinished:
        print("not succeeded:", line)
    if args.json is not None:
        args.json.write_text(json.dumps(asdict(figures), indent=2))
    return 0 if figures.ok else 1


async def _migrate(url: str) -> None:
    engine = make_engine(url, settings=_settings(url))
    await migrate.upgrade(engine, settings=_settings(url))
    await engine.dispose()


if __name__ == "__main__":
    sys.exit(main())
