"""Soak: a long steady stream of mixed jobs through a small fleet; memory and connections flat.

On a fresh Postgres database, ``--workers`` worker processes drain a mix of jobs
(:mod:`benchmarks.soak_app`: async sleeps, sync work in threads, a retried failure,
progress reports): ``--jobs`` jobs that a producer enqueues at a steady rate over
``--duration`` seconds. It is a paced workload, not a throughput test: at the default
pace (111 jobs/s) the fleet is mostly idle. Every ``--sample`` seconds it reads each
worker's RSS (``/proc/<pid>/status``) and the connections the workers hold to the soak's
own database (``pg_stat_activity``, the producer's own connections left out).

The checks, none of them on timings (a busy machine slows the soak, it does not fail it):

* **no job lost**: every job ends ``succeeded``;
* **the audit table** the actors write (job, attempt, pid, start, end): attempts equal
  runs, no attempt run twice, no overlapping runs of one job; re-runs are counted;
* **worker RSS flat**: after the warm-up (``--warmup``, a fraction of the run) each
  worker's RSS grows less than 10 %;
* **no connection growth**: after the warm-up, the most connections held in the second
  half of the run is no more than the most held before it plus one per worker. A
  worker's engine opens a connection when its loops (claim, completer, heartbeat,
  progress, sweep) first meet on the database at once, up to the number of its loops,
  so on a busy machine one more may open late in a short run; a leak opens connections
  in proportion to the work, past that allowance.

The run starts with a **saturation burst** (``--burst``: two 0.5 s jobs per worker slot)
that fills every slot at once during the warm-up, so the RSS baseline already holds what
a full worker holds: a backlog that builds on a busy machine and then drains at full
concurrency is not mistaken for growth.

    python benchmarks/soak.py                                # 200,000 jobs, 4 workers, 30 min
    python benchmarks/soak.py --jobs 33000 --duration 300    # the 5-minute form (CI)
    python benchmarks/soak.py --json soak.json               # also write the figures

Exit status 1 when a check fails. ``tests/chaos`` runs a 15 s form of it.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Coroutine, Sequence
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
PRODUCER = "taskq-soak-producer"
"""The ``application_name`` of the soak's own connections (left out of the counts)."""
_CONNECTIONS = text(
    "SELECT count(*) FROM pg_stat_activity"
    " WHERE datname = current_database() AND application_name <> :me"
).bindparams(me=PRODUCER)
_BACKEND_PIDS = text(
    "SELECT pid FROM pg_stat_activity"
    " WHERE datname = current_database() AND application_name <> :me"
).bindparams(me=PRODUCER)
_SCHEDULED_ROWS = text("SELECT id::text, attempt, status, (payload->>'n')::int FROM taskq.jobs")


@dataclass
class Sample:
    """One sample: seconds since the start, worker connections, each worker's RSS (KiB),
    jobs enqueued so far."""

    t_s: float
    connections: int
    rss_kib: list[int]
    enqueued: int


@dataclass
class Figures:
    """What a soak measured (``rss_kib``: per worker, at the warm-up's end and the run's)."""

    jobs: int
    workers: int
    duration_s: float
    burst_jobs: int = 0
    warmup_s: float = 0.0
    elapsed_s: float = 0.0
    completed: int = 0
    lost: int = 0
    jobs_per_s: float = 0.0
    runs: int = 0
    planned_runs: int = 0
    re_runs: int = 0
    duplicate_runs: int = 0
    """Runs of an attempt that had already run (never legitimate)."""
    attempts_without_run: int = 0
    runs_without_attempt: int = 0
    overlaps: int = 0
    rss_kib_after_warmup: list[int] = field(default_factory=list)
    rss_kib_end: list[int] = field(default_factory=list)
    rss_growth: list[float] = field(default_factory=list)
    rss_growth_max: float = 0.0
    connections_after_warmup: int = 0
    connections_first_half_max: int = 0
    """The most held before the second half of the post-warm-up period (the warm-up and
    its saturation burst included)."""
    connections_second_half_median: float = 0.0
    connections_second_half_max: int = 0
    connections_end: int = 0
    cpu_s_workers: float = 0.0
    cpu_s_producer: float = 0.0
    cpu_s_postgres: float = 0.0
    samples: list[Sample] = field(default_factory=list)
    unfinished: list[str] = field(default_factory=list)
    """A few jobs that did not succeed: ``id actor status attempt error_class``."""

    @property
    def connections_flat(self) -> bool:
        """No connection growth (see the module docstring)."""
        allowance = self.connections_first_half_max + self.workers
        return self.connections_second_half_max <= allowance

    @property
    def audit_ok(self) -> bool:
        """Attempts equal runs, no attempt run twice, no overlapping runs of one job."""
        return not (
            self.duplicate_runs
            or self.attempts_without_run
            or self.runs_without_attempt
            or self.overlaps
        )

    @property
    def ok(self) -> bool:
        return (
            self.lost == 0
            and self.audit_ok
            and self.rss_growth_max < RSS_GROWTH_LIMIT
            and self.connections_flat
        )

    def failures(self) -> list[str]:
        """What failed, in words (empty when :attr:`ok`)."""
        out = []
        if self.lost:
            out.append(f"{self.lost} jobs lost")
        if not self.audit_ok:
            out.append("audit: attempts differ from runs, or runs overlap")
        if self.rss_growth_max >= RSS_GROWTH_LIMIT:
            out.append(f"worker RSS grew {self.rss_growth_max:.1%} after the warm-up")
        if not self.connections_flat:
            out.append("connections grew")
        return out


def _settings(url: str) -> TaskQSettings:
    return TaskQSettings.load(database_url=url, redis_url=None, schema_name="taskq")


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def _cpu_s(pid: int, *, children: bool = False) -> float:
    """User + system CPU seconds of a live process (``/proc/<pid>/stat``)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = stat.rsplit(")", 1)[1].split()
    ticks = int(fields[11]) + int(fields[12])
    if children:
        ticks += int(fields[13]) + int(fields[14])
    return ticks / os.sysconf("SC_CLK_TCK")


def _spawn(url: str, log: Path, concurrency: int, audit: Path) -> subprocess.Popen[bytes]:
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
            "TASKQ_SOAK_AUDIT": str(audit),
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


def _producer_url(url: str) -> str:
    u = make_url(url)
    return u.update_query_dict({"application_name": PRODUCER}).render_as_string(hide_password=False)


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
    burst: int | None = None,
) -> Figures:
    """Run one soak against the migrated database at ``url``; the figures."""
    from benchmarks import soak_app

    logdir = logdir or Path(tempfile.mkdtemp(prefix="taskq-soak-"))
    audit = logdir / "audit.txt"
    settings = _settings(url)
    engine = make_engine(_producer_url(url), settings=settings)
    client = JobsClient(SqlBackend(engine, settings=settings))
    cpu_before = resource.getrusage(resource.RUSAGE_SELF)
    procs = [_spawn(url, logdir / f"worker{i}.log", concurrency, audit) for i in range(workers)]
    burst = workers * concurrency * 2 if burst is None else burst
    figures = Figures(jobs=total, workers=workers, duration_s=duration_s, burst_jobs=burst)
    figures.warmup_s = duration_s * warmup
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
        for start in range(0, burst, 1000):  # numbered after the paced stream
            await client.enqueue_many(
                [
                    EnqueueArgs(*soak_app.item(total + n, seconds=0.5))
                    for n in range(start, min(burst, start + 1000))
                ]
            )
        started = time.monotonic()
        warm_at = started + figures.warmup_s
        half_at = warm_at + (started + duration_s - warm_at) / 2
        enqueued = 0
        next_sample = started + sample_s
        first_half: list[int] = []
        second_half: list[int] = []
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
                async with engine.connect() as conn:
                    conns = int((await conn.execute(_CONNECTIONS)).scalar_one())
                rss = [_rss_kib(p.pid) for p in procs]
                figures.samples.append(Sample(round(now - started, 1), conns, rss, enqueued))
                if now >= warm_at and not figures.rss_kib_after_warmup:
                    figures.rss_kib_after_warmup = rss
                    figures.connections_after_warmup = conns
                (first_half if now < half_at else second_half).append(conns)
            for proc in procs:
                if proc.poll() is not None:
                    raise RuntimeError(f"worker {proc.pid} exited with {proc.returncode}")
            await asyncio.sleep(0.05)
        # Generous: the drain ends as soon as every job has ended; a busy machine may
        # have let a backlog build, which is slower, not wrong.
        drain_deadline = time.monotonic() + max(300.0, duration_s)
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
            if done >= total + burst:
                break
            await asyncio.sleep(0.5)
        figures.elapsed_s = round(time.monotonic() - started, 1)
        figures.rss_kib_end = [_rss_kib(p.pid) for p in procs]
        figures.cpu_s_workers = round(sum(_cpu_s(p.pid) for p in procs), 1)
        cpu_after = resource.getrusage(resource.RUSAGE_SELF)
        figures.cpu_s_producer = round(
            cpu_after.ru_utime - cpu_before.ru_utime + cpu_after.ru_stime - cpu_before.ru_stime,
            1,
        )
        async with engine.connect() as conn:
            figures.connections_end = int((await conn.execute(_CONNECTIONS)).scalar_one())
            backends = [int(pid) for pid in (await conn.execute(_BACKEND_PIDS)).scalars()]
            figures.cpu_s_postgres = round(sum(_cpu_s(pid) for pid in backends), 1)
            left = await conn.execute(
                select(jobs.c.id, jobs.c.actor, jobs.c.status, jobs.c.attempt, jobs.c.error_class)
                .where(jobs.c.status != "succeeded")
                .limit(10)
            )
            figures.unfinished = [" ".join(map(str, row)) for row in left.all()]
            rows = (await conn.execute(_SCHEDULED_ROWS)).all()
        figures.completed = sum(1 for r in rows if r[2] == "succeeded")
        figures.lost = total + burst - figures.completed
        figures.jobs_per_s = round(figures.completed / figures.elapsed_s, 1)
        _check_audit(figures, audit, rows, soak_app.planned_attempts)
        base = figures.rss_kib_after_warmup or figures.rss_kib_end
        figures.rss_growth = [
            round(end / start - 1.0, 4)
            for start, end in zip(base, figures.rss_kib_end, strict=True)
        ]
        figures.rss_growth_max = max(figures.rss_growth)
        figures.connections_first_half_max = max(first_half, default=0)
        figures.connections_second_half_max = max(second_half, default=0)
        figures.connections_second_half_median = (
            statistics.median(second_half) if second_half else 0.0
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


def _check_audit(
    figures: Figures, audit: Path, rows: Sequence[Any], planned: Callable[[int], int]
) -> None:
    """Compare the audit table with the job rows (see :class:`Figures`)."""
    starts: dict[str, dict[int, list[tuple[float, float]]]] = defaultdict(lambda: defaultdict(list))
    open_runs: dict[tuple[str, int, str], float] = {}
    for line in audit.read_text().splitlines() if audit.exists() else []:
        job, attempt_s, pid, event, stamp_s = line.split()
        key, stamp = (job, int(attempt_s), pid), float(stamp_s)
        if event == "start":
            open_runs[key] = stamp
            figures.runs += 1
        elif key in open_runs:
            starts[job][key[1]].append((open_runs.pop(key), stamp))
    for (job, attempt, _pid), stamp in open_runs.items():  # never ended: still counts
        starts[job][attempt].append((stamp, float("inf")))
    for job_id, attempt, _status, n in rows:
        mine = starts.get(job_id, {})
        figures.planned_runs += planned(n)
        figures.duplicate_runs += sum(len(r) - 1 for r in mine.values())
        figures.attempts_without_run += sum(1 for a in range(1, attempt + 1) if a not in mine)
        figures.runs_without_attempt += sum(1 for a in mine if not 1 <= a <= attempt)
        ordered = sorted(run for r in mine.values() for run in r)
        figures.overlaps += sum(1 for a, b in itertools.pairwise(ordered) if b[0] < a[1])
    figures.re_runs = figures.runs - figures.planned_runs


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
    """The figures as Markdown: the summary, then the samples over time."""
    cpu = figures.cpu_s_workers + figures.cpu_s_producer + figures.cpu_s_postgres
    elapsed = figures.elapsed_s or 1.0
    rows: list[tuple[str, Any]] = [
        (
            "jobs (succeeded / enqueued: paced + saturation burst)",
            f"{figures.completed} / {figures.jobs} + {figures.burst_jobs}",
        ),
        ("workers", figures.workers),
        ("duration (pace / until drained)", f"{figures.duration_s:.0f} s / {elapsed:.0f} s"),
        ("throughput", f"{figures.jobs_per_s} jobs/s"),
        ("lost", figures.lost),
        ("runs (audit) / planned", f"{figures.runs} / {figures.planned_runs}"),
        ("re-runs", figures.re_runs),
        ("duplicate runs of one attempt", figures.duplicate_runs),
        (
            "attempts without a run / runs without an attempt",
            f"{figures.attempts_without_run} / {figures.runs_without_attempt}",
        ),
        ("overlapping runs of one job", figures.overlaps),
        (
            f"worker RSS after warm-up ({figures.warmup_s:.0f} s), KiB",
            ", ".join(map(str, figures.rss_kib_after_warmup)),
        ),
        ("worker RSS at the end, KiB", ", ".join(map(str, figures.rss_kib_end))),
        ("RSS growth per worker", ", ".join(f"{g:+.1%}" for g in figures.rss_growth)),
        (
            "worker connections (after warm-up / max before the 2nd half"
            " / 2nd-half median, max / end)",
            f"{figures.connections_after_warmup} / {figures.connections_first_half_max}"
            f" / {figures.connections_second_half_median:g}, {figures.connections_second_half_max}"
            f" / {figures.connections_end}",
        ),
        (
            "CPU s (workers / producer / their Postgres backends)",
            f"{figures.cpu_s_workers} / {figures.cpu_s_producer} / {figures.cpu_s_postgres}"
            f" = {cpu / elapsed:.0%} of one core",
        ),
        ("checks", "ok" if figures.ok else "FAILED: " + "; ".join(figures.failures())),
    ]
    lines = ["| measure | value |", "|---|---|"]
    lines += [f"| {name} | {value} |" for name, value in rows]
    lines += [
        "",
        "| t (s) | enqueued | worker connections | worker RSS (KiB) |",
        "|---|---|---|---|",
    ]
    step = max(1, len(figures.samples) // 12)
    shown = figures.samples[::step]
    if figures.samples and shown[-1] is not figures.samples[-1]:
        shown.append(figures.samples[-1])
    lines += [
        f"| {s.t_s:.0f} | {s.enqueued} | {s.connections} | {', '.join(map(str, s.rss_kib))} |"
        for s in shown
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=200_000)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--duration", type=float, default=1800.0, help="seconds")
    parser.add_argument("--warmup", type=float, default=0.2, help="fraction of the run")
    parser.add_argument("--sample", type=float, default=5.0, help="seconds between samples")
    parser.add_argument("--concurrency", type=int, default=20, help="per worker")
    parser.add_argument(
        "--burst", type=int, default=None, help="saturation burst (default: 2 per slot)"
    )
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--logdir", type=Path, default=None, help="worker logs, audit table")
    args = parser.parse_args(argv)
    if args.logdir is not None:
        args.logdir.mkdir(parents=True, exist_ok=True)
    url = _fresh_database()
    try:
        asyncio.run(_migrate(url))
        figures = asyncio.run(
            _until_terminated(
                run_soak(
                    url,
                    total=args.jobs,
                    workers=args.workers,
                    duration_s=args.duration,
                    warmup=args.warmup,
                    sample_s=args.sample,
                    concurrency=args.concurrency,
                    logdir=args.logdir,
                    burst=args.burst,
                )
            )
        )
    except asyncio.CancelledError:
        print("soak terminated (SIGTERM) before it ended: no figures", flush=True)
        return 143
    finally:
        _drop_database(url)
    print(table(figures), flush=True)
    for line in figures.unfinished:
        print("not succeeded:", line)
    if args.json is not None:
        args.json.write_text(json.dumps(asdict(figures), indent=2))
    return 0 if figures.ok else 1


async def _until_terminated(soak: Coroutine[Any, Any, Figures]) -> Figures:
    """Run ``soak``; SIGTERM cancels it, so that its workers are stopped and its database
    dropped (CI runs the soak in the background and ends it when the build fails)."""
    task = asyncio.ensure_future(soak)
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    return await task


async def _migrate(url: str) -> None:
    engine = make_engine(url, settings=_settings(url))
    await migrate.upgrade(engine, settings=_settings(url))
    await engine.dispose()


if __name__ == "__main__":
    sys.exit(main())
