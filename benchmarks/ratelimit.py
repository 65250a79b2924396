#!/usr/bin/env python
"""Rate-limit throughput: acquires/second per primitive, backend and API, one client.

Prints one table, with the raw baseline measured in the same run: one ``EVALSHA`` of a
trivial script from redis-py (sync and asyncio, one connection), and the ``limits``
library's moving-window ``hit()`` (installed with ``redis<8`` into a throwaway venv the
benchmark creates; shown as n/a when that cannot be installed).

    python benchmarks/ratelimit.py [--seconds 1.5]

Redis: ``TASKQ_REDIS_URL`` (default ``redis://127.0.0.1:6379/0``). Postgres:
``TASKQ_BENCH_DATABASE_URL`` (default: a ``taskq_bench`` database on the local server,
created and migrated if missing).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import redis
import redis.asyncio as aredis
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

import taskq.ratelimit as arl
import taskq_sync.ratelimit as srl
from taskq.db import migrate
from taskq.db.engine import make_engine as make_async_engine
from taskq.settings import TaskQSettings
from taskq.testing.clock import FakeClock
from taskq_sync.db.engine import make_engine as make_sync_engine

REDIS_URL = os.environ.get("TASKQ_REDIS_URL", "redis://127.0.0.1:6379/0")
PG_URL = os.environ.get(
    "TASKQ_BENCH_DATABASE_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/taskq_bench"
)
TRIVIAL = "return 1"
BIG = 1e12


def rate_sync(fn: Callable[[], Any], seconds: float) -> float:
    for _ in range(50):
        fn()
    n, start = 0, time.perf_counter()
    deadline = start + seconds
    while True:
        for _ in range(100):
            fn()
        n += 100
        now = time.perf_counter()
        if now >= deadline:
            return n / (now - start)


async def rate_async(fn: Callable[[], Awaitable[Any]], seconds: float) -> float:
    for _ in range(50):
        await fn()
    n, start = 0, time.perf_counter()
    deadline = start + seconds
    while True:
        for _ in range(100):
            await fn()
        n += 100
        now = time.perf_counter()
        if now >= deadline:
            return n / (now - start)


def primitives(rl: Any, backend: str) -> dict[str, Any]:
    tag = uuid.uuid4().hex[:8]
    return {
        "token bucket": rl.TokenBucket(
            f"bench_tb_{tag}", capacity=BIG, refill_per_second=BIG, backend=backend
        ),
        "gcra": rl.SlidingWindow(
            f"bench_gcra_{tag}",
            limit=10**9,
            window=timedelta(seconds=1),
            backend=backend,
            style="gcra",
        ),
        "log": rl.SlidingWindow(
            f"bench_log_{tag}",
            limit=10**9,
            window=timedelta(seconds=1),
            backend=backend,
            style="log",
        ),
    }


def ensure_pg(settings: TaskQSettings) -> str:
    url = make_url(PG_URL)
    admin = create_engine(url.set(database="postgres"), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        exists = conn.execute(
            text("SELECT 1 FROM pg_database WHERE datname = :d"), {"d": url.database}
        ).scalar()
        if not exists:
            conn.execute(text(f'CREATE DATABASE "{url.database}"'))
    admin.dispose()

    async def up() -> None:
        engine = make_async_engine(url, settings=settings)
        await migrate.upgrade(engine, settings=settings)
        await engine.dispose()

    asyncio.run(up())
    return url.render_as_string(hide_password=False)


def limits_rate(seconds: float) -> float | None:
    """``limits`` moving-window hit()/s from a throwaway venv (it needs redis<8)."""
    venv = Path(tempfile.gettempdir()) / "taskq-bench-limits-venv"
    py = venv / "bin" / "python"
    try:
        if not py.exists():
            subprocess.run(
                [sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True
            )
            subprocess.run(
                [str(py), "-m", "pip", "install", "-q", "limits[redis]", "redis<8"],
                check=True,
                capture_output=True,
                timeout=300,
            )
        code = f"""
import time, uuid
from limits import parse
from limits.storage import RedisStorage
from limits.strategies import MovingWindowRateLimiter
lim = MovingWindowRateLimiter(RedisStorage({REDIS_URL!r}))
item = parse("1000000000/second")
key = "taskq-bench-" + uuid.uuid4().hex
for _ in range(50): lim.hit(item, key)
n, start = 0, time.perf_counter()
while time.perf_counter() - start < {seconds}:
    for _ in range(100): lim.hit(item, key)
    n += 100
print(n / (time.perf_counter() - start))
"""
        out = subprocess.run(
            [str(py), "-c", code], check=True, capture_output=True, text=True, timeout=120
        )
        return float(out.stdout.strip().splitlines()[-1])
    except (subprocess.SubprocessError, OSError, ValueError):
        return None


async def async_rows(
    seconds: float, settings: TaskQSettings, pg_url: str
) -> dict[tuple[str, str], float]:
    rows: dict[tuple[str, str], float] = {}
    client = aredis.Redis.from_url(REDIS_URL)
    sha = await client.script_load(TRIVIAL)
    rows[("raw EVALSHA (trivial script)", "redis")] = await rate_async(
        lambda: client.evalsha(sha, 0), seconds
    )
    clock = FakeClock(datetime(2025, 1, 1, tzinfo=UTC))
    engine = make_async_engine(pg_url, settings=settings)
    for backend, kw in (
        ("redis", {"redis_client": client, "settings": settings}),
        ("postgres", {"pg_pool": engine, "settings": settings}),
        ("memory", {"clock": clock}),
    ):
        for label, prim in primitives(arl, backend).items():
            rows[(label, backend)] = await rate_async(lambda p=prim, k=kw: p.acquire(**k), seconds)
            await prim.reset(**({} if backend == "memory" else kw))
    await engine.dispose()
    await client.aclose()
    return rows


def sync_rows(seconds: float, settings: TaskQSettings, pg_url: str) -> dict[tuple[str, str], float]:
    rows: dict[tuple[str, str], float] = {}
    client = redis.Redis.from_url(REDIS_URL)
    sha = client.script_load(TRIVIAL)
    rows[("raw EVALSHA (trivial script)", "redis")] = rate_sync(
        lambda: client.evalsha(sha, 0), seconds
    )
    clock = FakeClock(datetime(2025, 1, 1, tzinfo=UTC))
    engine = make_sync_engine(pg_url, settings=settings)
    for backend, kw in (
        ("redis", {"redis_client": client, "settings": settings}),
        ("postgres", {"pg_pool": engine, "settings": settings}),
        ("memory", {"clock": clock}),
    ):
        for label, prim in primitives(srl, backend).items():
            rows[(label, backend)] = rate_sync(lambda p=prim, k=kw: p.acquire(**k), seconds)
            prim.reset(**({} if backend == "memory" else kw))
    engine.dispose()
    client.close()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=1.5, help="measuring time per cell")
    parser.add_argument("--no-limits", action="store_true", help="skip the limits comparison")
    args = parser.parse_args()
    settings = TaskQSettings.load(database_url=None, redis_url=None)
    pg_url = ensure_pg(settings)
    a = asyncio.run(async_rows(args.seconds, settings, pg_url))
    s = sync_rows(args.seconds, settings, pg_url)
    lim = None if args.no_limits else limits_rate(args.seconds)
    raw_a, raw_s = (
        a[("raw EVALSHA (trivial script)", "redis")],
        s[("raw EVALSHA (trivial script)", "redis")],
    )
    print(f"{'primitive':<30} {'backend':<9} {'async/s':>10} {'sync/s':>10} {'vs raw (a/s)':>14}")
    for key in a:
        label, backend = key
        ratio = f"{a[key] / raw_a:5.0%}/{s[key] / raw_s:4.0%}" if backend == "redis" else ""
        print(f"{label:<30} {backend:<9} {a[key]:>10,.0f} {s[key]:>10,.0f} {ratio:>14}")
    lim_text = "n/a" if lim is None else f"{lim:,.0f}"
    print(f"{'limits moving-window hit()':<30} {'redis':<9} {'':>10} {lim_text:>10}")
    if lim:
        print(f"taskq sync token bucket / limits: {s[('token bucket', 'redis')] / lim:.2f}x")


if __name__ == "__main__":
    main()
