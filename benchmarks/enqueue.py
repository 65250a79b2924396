"""Enqueue throughput on Postgres: single async, single sync facade, enqueue_many x1000.

Usage: python benchmarks/enqueue.py [--url postgresql://postgres@127.0.0.1:5432/postgres] [-n 2000]

Creates a throwaway database next to ``--url``, migrates it, measures, drops it.
(The peer comparison with procrastinate/pgqueuer the issue asks for is not implemented.)
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid

from pydantic import BaseModel
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from taskq import TaskQ, actor
from taskq.db import migrate
from taskq.db.engine import make_engine
from taskq.settings import TaskQSettings


class Payload(BaseModel):
    n: int


@actor(name="bench_enqueue")
async def bench(payload: Payload) -> None: ...


async def _async_runs(url: str, n: int, settings: TaskQSettings) -> dict[str, float]:
    engine = make_engine(url, settings=settings)
    await migrate.upgrade(engine, settings=settings)
    rates: dict[str, float] = {}
    async with TaskQ(engine=engine, settings=settings) as tq:
        start = time.perf_counter()
        for i in range(n):
            await tq.jobs.enqueue(bench, Payload(n=i))
        rates["single enqueue (async)"] = n / (time.perf_counter() - start)
        total = n * 10
        start = time.perf_counter()
        for b in range(0, total, 1000):
            await tq.jobs.enqueue_many([(bench, Payload(n=i)) for i in range(b, b + 1000)])
        rates["enqueue_many x1000 (async)"] = total / (time.perf_counter() - start)
    await engine.dispose()
    return rates


def _sync_run(url: str, n: int, settings: TaskQSettings) -> float:
    from taskq_sync import TaskQ as SyncTaskQ

    with SyncTaskQ(url, settings=settings) as tq:
        start = time.perf_counter()
        for i in range(n):
            tq.jobs.enqueue(bench, Payload(n=i))
        return n / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", default="postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("-n", type=int, default=2000)
    args = parser.parse_args()
    admin_url = make_url(args.url).set(drivername="postgresql+psycopg")
    name = f"taskq_bench_{uuid.uuid4().hex[:8]}"
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = admin_url.set(database=name).render_as_string(hide_password=False)
    settings = TaskQSettings.load(database_url=url)
    try:
        rates = asyncio.run(_async_runs(url, args.n, settings))
        rates["single enqueue (sync facade)"] = _sync_run(url, args.n, settings)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
    width = max(map(len, rates))
    for label, rate in rates.items():
        print(f"{label:<{width}}  {rate:>10,.0f} jobs/s")


if __name__ == "__main__":
    main()
