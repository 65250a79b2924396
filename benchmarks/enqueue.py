"""Enqueue throughput on Postgres, taskq side by side with procrastinate and pgqueuer.

Usage::

    python benchmarks/enqueue.py [--url postgresql://postgres@127.0.0.1:5432/postgres]
                                 [-n 1000] [--batches 10] [--rounds 5] [--no-peers]
                                 [--gc-freeze]

Measures, on one Postgres server in one run:

* taskq: single ``enqueue`` from one async client, the same through the ``taskq_sync``
  facade, ``enqueue_many`` in batches of 1,000;
* procrastinate: ``defer_async`` and ``batch_defer_async`` (batches of 1,000);
* pgqueuer: ``Queries.enqueue`` with scalars and with lists of 1,000 (asyncpg).

Every system gets a throwaway database of its own next to ``--url``, dropped at the end.
The peers run as subprocesses (``benchmarks/peers.py``) of a virtualenv this script
creates under ``.cache/bench-peers`` (gitignored; reused while its pinned requirements
match), so nothing of theirs is installed into taskq's environment.

The machine is shared and noisy, so the systems are measured in ``--rounds`` interleaved
rounds (taskq, pgqueuer, procrastinate, again ...); the table shows each row's best round
and its median. The targets of issue 5 are checked on the best rounds: single async
enqueue >= pgqueuer's single rate, ``enqueue_many`` >= 2x pgqueuer's batch rate.

``--gc-freeze`` moves every object alive after start-up out of the cyclic collector's
reach (``gc.freeze()``), in every process, peers included: a producer that enqueues
thousands of jobs a second pays for full collections that walk all of SQLAlchemy and
pydantic otherwise. It is an application's choice, so it is off by default.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import statistics
import subprocess
import sys
import time
import uuid
import venv
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pydantic import BaseModel
from sqlalchemy import create_engine, text
from sqlalchemy.engine import URL, make_url

from taskq import TaskQ, actor
from taskq.db import migrate
from taskq.db.engine import make_engine
from taskq.settings import TaskQSettings

ROOT = Path(__file__).resolve().parent.parent
PEER_VENV = ROOT / ".cache" / "bench-peers"
PEER_REQUIREMENTS = ("procrastinate==3.10.0", "pgqueuer==1.6.0", "asyncpg==0.32.0")
BATCH = 1000

SINGLE = "taskq enqueue, async (single)"
SYNC = "taskq enqueue, sync facade (single)"
MANY = "taskq enqueue_many x1000 (async)"
PGQ_SINGLE = "pgqueuer enqueue (single)"
PGQ_BATCH = "pgqueuer enqueue list x1000"
PROC_SINGLE = "procrastinate defer_async (single)"
PROC_BATCH = "procrastinate batch_defer_async x1000"
ORDER = (SINGLE, SYNC, MANY, PGQ_SINGLE, PGQ_BATCH, PROC_SINGLE, PROC_BATCH)


class Payload(BaseModel):
    n: int


@actor(name="bench_enqueue")
async def bench(payload: Payload) -> None: ...


async def _taskq_async(url: str, n: int, batches: int, settings: TaskQSettings) -> dict[str, float]:
    rates: dict[str, float] = {}
    async with TaskQ(url, settings=settings) as tq:
        for i in range(50):  # warm-up: pool, prepared statements
            await tq.jobs.enqueue(bench, Payload(n=i))
        start = time.perf_counter()
        for i in range(n):
            await tq.jobs.enqueue(bench, Payload(n=i))
        rates[SINGLE] = n / (time.perf_counter() - start)
        start = time.perf_counter()
        for b in range(batches):
            await tq.jobs.enqueue_many(
                [(bench, Payload(n=i)) for i in range(b * BATCH, (b + 1) * BATCH)]
            )
        rates[MANY] = batches * BATCH / (time.perf_counter() - start)
    return rates


def _taskq_sync(url: str, n: int, settings: TaskQSettings) -> float:
    from taskq_sync import TaskQ as SyncTaskQ

    with SyncTaskQ(url, settings=settings) as tq:
        for i in range(50):
            tq.jobs.enqueue(bench, Payload(n=i))
        start = time.perf_counter()
        for i in range(n):
            tq.jobs.enqueue(bench, Payload(n=i))
        return n / (time.perf_counter() - start)


def _peer_python() -> Path:
    """The peers' virtualenv interpreter, creating or refreshing the venv when needed."""
    python = PEER_VENV / "bin" / "python"
    marker = PEER_VENV / "requirements.txt"
    wanted = "\n".join(PEER_REQUIREMENTS) + "\n"
    if python.exists() and marker.exists() and marker.read_text() == wanted:
        return python
    print(f"creating the peers' virtualenv in {PEER_VENV} ...", file=sys.stderr)
    venv.EnvBuilder(with_pip=True, clear=True).create(PEER_VENV)
    done = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", *PEER_REQUIREMENTS],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        sys.exit(f"installing {' '.join(PEER_REQUIREMENTS)} failed:\n{done.stderr}")
    marker.write_text(wanted)
    return python


def _peer(
    python: Path, name: str, url: URL, n: int, batches: int, gc_freeze: bool
) -> dict[str, float]:
    dsn = url.set(drivername="postgresql").render_as_string(hide_password=False)
    command = [str(python), str(Path(__file__).with_name("peers.py")), name, dsn]
    command += ["-n", str(n), "--batches", str(batches)]
    command += ["--gc-freeze"] if gc_freeze else []
    done = subprocess.run(command, check=True, capture_output=True, text=True)
    rates: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return rates


@contextmanager
def _databases(admin_url: URL, names: list[str]) -> Iterator[dict[str, URL]]:
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    preparer = admin.dialect.identifier_preparer
    try:
        with admin.connect() as conn:
            for name in names:
                conn.execute(text(f"CREATE DATABASE {preparer.quote(name)}"))
        yield {name: admin_url.set(database=name) for name in names}
    finally:
        with admin.connect() as conn:
            for name in names:
                conn.execute(text(f"DROP DATABASE IF EXISTS {preparer.quote(name)} WITH (FORCE)"))
        admin.dispose()


def main() -> None:
    """Run the rounds and print the table (jobs/second, best and median round)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("-n", type=int, default=1000, help="single enqueues per round")
    parser.add_argument("--batches", type=int, default=10, help="batches of 1,000 per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--no-peers", action="store_true", help="measure taskq only")
    parser.add_argument("--gc-freeze", action="store_true", help="gc.freeze() after imports")
    args = parser.parse_args()
    if args.gc_freeze:
        import taskq_sync  # noqa: F401  (loaded before the freeze, like the rest)

        gc.freeze()
    admin_url = make_url(args.url).set(drivername="postgresql+psycopg")
    peers = [] if args.no_peers else ["pgqueuer", "procrastinate"]
    python = _peer_python() if peers else None
    tag = uuid.uuid4().hex[:8]
    names = {system: f"bench_{tag}_{system}" for system in ["taskq", *peers]}
    samples: dict[str, list[float]] = {}
    with _databases(admin_url, list(names.values())) as urls:
        url = urls[names["taskq"]].render_as_string(hide_password=False)
        settings = TaskQSettings.load(database_url=url)

        async def _migrate() -> None:
            engine = make_engine(url, settings=settings)
            await migrate.upgrade(engine, settings=settings)
            await engine.dispose()

        asyncio.run(_migrate())
        for round_no in range(1, args.rounds + 1):
            print(f"round {round_no}/{args.rounds} ...", file=sys.stderr)
            rates = asyncio.run(_taskq_async(url, args.n, args.batches, settings))
            rates[SYNC] = _taskq_sync(url, args.n, settings)
            for peer in peers:
                assert python is not None
                got = _peer(python, peer, urls[names[peer]], args.n, args.batches, args.gc_freeze)
                single, batch = (
                    (PGQ_SINGLE, PGQ_BATCH) if peer == "pgqueuer" else (PROC_SINGLE, PROC_BATCH)
                )
                rates[single], rates[batch] = got["single"], got["batch"]
            for label, rate in rates.items():
                samples.setdefault(label, []).append(rate)
    best = {label: max(values) for label, values in samples.items()}
    width = max(map(len, best))
    print(f"{'jobs/second on Postgres':<{width}}  {'best':>10}  {'median':>10}")
    for label in ORDER:
        if label in samples:
            median = statistics.median(samples[label])
            print(f"{label:<{width}}  {best[label]:>10,.0f}  {median:>10,.0f}")
    if not peers:
        return
    print()
    checks = [
        ("single async >= pgqueuer single", best[SINGLE], best[PGQ_SINGLE]),
        ("enqueue_many >= 2x pgqueuer batch", best[MANY], 2 * best[PGQ_BATCH]),
    ]
    for label, rate, need in checks:
        verdict = "met" if rate >= need else "NOT met"
        print(f"target {label}: {rate:,.0f} vs {need:,.0f} -> {verdict} ({rate / need:.2f}x)")


if __name__ == "__main__":
    main()
