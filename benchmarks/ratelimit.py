#!/usr/bin/env python
"""Rate-limit throughput: acquires/second per primitive, backend and API, one client.

Prints one table, with the raw baseline measured in the same run: one ``EVALSHA`` of a
trivial script from redis-py (sync and asyncio, one connection), and the ``limits``
library's moving-window ``hit()`` (installed with ``redis<8`` into a throwaway venv the
benchmark creates; shown as n/a when that cannot be installed).

On a shared machine one long measurement per cell mostly measures the neighbours, so
each cell is measured in ``--rounds`` short slices, interleaved with the raw baseline
(raw, cell, raw, cell, ...) and the best slice of each is reported: the raw rate and the
cell it is compared with see the same moments of load. The table ends with the issue's
targets, each marked met or not, and the load average the run saw.

    python benchmarks/ratelimit.py [--seconds 1.5] [--rounds 5]

Redis: ``TASKQ_REDIS_URL`` (default ``redis://127.0.0.1:6379/0``). Postgres:
``TASKQ_BENCH_DATABASE_URL`` (default: a ``taskq_bench`` database on the local server,
created and migrated if missing).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import statistics
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
    for _ in range(20):
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
    for _ in range(20):
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


_LIMITS_PEER = f"""
import sys, time, uuid
from limits import parse
from limits.storage import RedisStorage
from limits.strategies import MovingWindowRateLimiter
lim = MovingWindowRateLimiter(RedisStorage({REDIS_URL!r}))
item = parse("1000000000/second")
key = "taskq-bench-" + uuid.uuid4().hex
for _ in range(50): lim.hit(item, key)
print("ready", flush=True)
for line in sys.stdin:
    seconds = float(line)
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for _ in range(100): lim.hit(item, key)
        n += 100
    print(n / (time.perf_counter() - start), flush=True)
"""


class LimitsPeer:
    """The ``limits`` moving-window ``hit()`` in a throwaway venv (it needs ``redis<8``).

    A long-lived subprocess that measures a slice on request, so that its slices can be
    interleaved with taskq's own (the comparison then sees the same moments of load).
    """

    def __init__(self) -> None:
        venv = Path(tempfile.gettempdir()) / "taskq-bench-limits-venv"
        py = venv / "bin" / "python"
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
        self.proc = subprocess.Popen(
            [str(py), "-c", _LIMITS_PEER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        if self.proc.stdout.readline().strip() != "ready":
            raise OSError("the limits peer did not start")

    def rate(self, seconds: float) -> float:
        """``hit()``/s over one slice of ``seconds``."""
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        self.proc.stdin.write(f"{seconds}\n")
        self.proc.stdin.flush()
        return float(self.proc.stdout.readline())

    def close(self) -> None:
        """End the subprocess."""
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


def limits_peer() -> LimitsPeer | None:
    """A running :class:`LimitsPeer`, or ``None`` when ``limits`` cannot be installed."""
    try:
        return LimitsPeer()
    except (subprocess.SubprocessError, OSError, ValueError):
        return None


LIMITS = ("limits moving-window hit()", "limits")
RAW = ("raw EVALSHA (trivial script)", "redis")
BACKENDS = ("redis", "postgres", "memory")


LIMITS_RATIO = ("taskq sync token bucket / limits", "ratio")


def paired(key: tuple[str, str]) -> tuple[str, str]:
    """Where the best raw EVALSHA slice measured next to a Redis cell is kept."""
    return (key[0], "raw")


def ratio(key: tuple[str, str]) -> tuple[str, str]:
    """Where the median over the rounds of (cell slice / the raw slice just before it) is kept.

    A diagnostic printed under the table. The targets use best cell slice / best raw
    slice (the same number of slices each, interleaved): on a shared machine the load
    swings within a fraction of a second, so a single pair is often disturbed on one
    side only, while the best slice of each is the least disturbed estimate of its rate.
    """
    return (key[0], "ratio")


def _medians(pairs: dict[tuple[str, str], list[float]], rows: dict[tuple[str, str], float]) -> None:
    for key, values in pairs.items():
        rows[key] = statistics.median(values)


async def async_rows(
    seconds: float, rounds: int, settings: TaskQSettings, pg_url: str
) -> dict[tuple[str, str], float]:
    """Best-slice acquires/s of every cell from one asyncio client, raw EVALSHA interleaved."""
    client = aredis.Redis.from_url(REDIS_URL)
    sha = await client.script_load(TRIVIAL)
    clock = FakeClock(datetime(2025, 1, 1, tzinfo=UTC))
    engine = make_async_engine(pg_url, settings=settings)
    kws: dict[str, dict[str, Any]] = {
        "redis": {"redis_client": client, "settings": settings},
        "postgres": {"pg_pool": engine, "settings": settings},
        "memory": {"clock": clock},
    }
    cells = {
        (label, backend): (prim, kws[backend])
        for backend in BACKENDS
        for label, prim in primitives(arl, backend).items()
    }
    rows: dict[tuple[str, str], float] = {}
    pairs: dict[tuple[str, str], list[float]] = {}
    slice_s = seconds / rounds
    for _ in range(rounds):
        for key, (prim, kw) in cells.items():
            raw = 0.0
            if key[1] == "redis":
                raw = await rate_async(lambda: client.evalsha(sha, 0), slice_s)
                rows[paired(key)] = max(rows.get(paired(key), 0.0), raw)
            rate = await rate_async(functools.partial(prim.acquire, **kw), slice_s)
            rows[key] = max(rows.get(key, 0.0), rate)
            if raw:
                pairs.setdefault(ratio(key), []).append(rate / raw)
    _medians(pairs, rows)
    rows[RAW] = max(rate for key, rate in rows.items() if key[1] == "raw")  # display only
    for (_, backend), (prim, kw) in cells.items():
        await prim.reset(**({} if backend == "memory" else kw))
    await engine.dispose()
    await client.aclose()
    return rows


def sync_rows(
    seconds: float, rounds: int, settings: TaskQSettings, pg_url: str, peer: LimitsPeer | None
) -> dict[tuple[str, str], float]:
    """Best-slice acquires/s of every cell from one blocking client, raw EVALSHA interleaved.

    With ``peer``, a ``limits`` slice follows every slice of the Redis token bucket.
    """
    client = redis.Redis.from_url(REDIS_URL)
    sha = client.script_load(TRIVIAL)
    clock = FakeClock(datetime(2025, 1, 1, tzinfo=UTC))
    engine = make_sync_engine(pg_url, settings=settings)
    kws: dict[str, dict[str, Any]] = {
        "redis": {"redis_client": client, "settings": settings},
        "postgres": {"pg_pool": engine, "settings": settings},
        "memory": {"clock": clock},
    }
    cells = {
        (label, backend): (prim, kws[backend])
        for backend in BACKENDS
        for label, prim in primitives(srl, backend).items()
    }
    rows: dict[tuple[str, str], float] = {}
    pairs: dict[tuple[str, str], list[float]] = {}
    slice_s = seconds / rounds
    for _ in range(rounds):
        for key, (prim, kw) in cells.items():
            raw = 0.0
            if key[1] == "redis":
                raw = rate_sync(lambda: client.evalsha(sha, 0), slice_s)
                rows[paired(key)] = max(rows.get(paired(key), 0.0), raw)
            rate = rate_sync(functools.partial(prim.acquire, **kw), slice_s)
            rows[key] = max(rows.get(key, 0.0), rate)
            if raw:
                pairs.setdefault(ratio(key), []).append(rate / raw)
            if peer is not None and key == ("token bucket", "redis"):
                lim = peer.rate(slice_s)
                rows[LIMITS] = max(rows.get(LIMITS, 0.0), lim)
                pairs.setdefault(LIMITS_RATIO, []).append(rate / lim)
    _medians(pairs, rows)
    rows[RAW] = max(rate for key, rate in rows.items() if key[1] == "raw")  # display only
    for (_, backend), (prim, kw) in cells.items():
        prim.reset(**({} if backend == "memory" else kw))
    engine.dispose()
    client.close()
    return rows


def targets(
    a: dict[tuple[str, str], float], s: dict[tuple[str, str], float], lim: float | None
) -> list[tuple[str, bool | None]]:
    """The issue's performance targets, each with whether this run met it (None: n/a)."""
    out: list[tuple[str, bool | None]] = []
    for label in ("token bucket", "gcra"):
        for mode, rows in (("async", a), ("sync", s)):
            r = rows[(label, "redis")] / rows[paired((label, "redis"))]
            out.append((f"redis {label} {mode} >= 90% of raw EVALSHA ({r:.0%})", r >= 0.9))
    if lim:
        x = s[("token bucket", "redis")] / lim
        out.append((f"redis token bucket sync >= 1.5x limits ({x:.2f}x)", x >= 1.5))
    else:
        out.append(("redis token bucket sync >= 1.5x limits (limits n/a)", None))
    for mode, rows in (("async", a), ("sync", s)):
        low = min(rows[(label, "memory")] for label in ("token bucket", "gcra", "log"))
        out.append((f"memory >= 150,000/s {mode} (lowest {low:,.0f})", low >= 150_000))
        pg = rows[("token bucket", "postgres")]
        out.append((f"postgres token bucket >= 2,000/s {mode} ({pg:,.0f})", pg >= 2_000))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=1.5, help="measuring time per cell")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved slices per cell")
    parser.add_argument("--no-limits", action="store_true", help="skip the limits comparison")
    args = parser.parse_args()
    settings = TaskQSettings.load(database_url=None, redis_url=None)
    pg_url = ensure_pg(settings)
    load_before = os.getloadavg()
    a = asyncio.run(async_rows(args.seconds, args.rounds, settings, pg_url))
    peer = None if args.no_limits else limits_peer()
    try:
        s = sync_rows(args.seconds, args.rounds, settings, pg_url, peer)
    finally:
        if peer is not None:
            peer.close()
    lim = s.pop(LIMITS, None)
    s.setdefault(LIMITS_RATIO, 0.0)
    load_after = os.getloadavg()
    print(
        f"{'primitive':<30} {'backend':<9} {'async/s':>10} {'sync/s':>10} {'vs raw (a/s)':>14}"
        f" {'its raw (a/s)':>16}"
    )
    keys = [RAW, *(k for k in a if k != RAW and k[1] not in ("raw", "ratio"))]
    for key in keys:
        label, backend = key
        rel = its_raw = ""
        if backend == "redis" and key != RAW:
            pk = paired(key)
            rel = f"{a[key] / a[pk]:5.0%}/{s[key] / s[pk]:4.0%}"
            its_raw = f"{a[pk]:,.0f}/{s[pk]:,.0f}"
        print(f"{label:<30} {backend:<9} {a[key]:>10,.0f} {s[key]:>10,.0f} {rel:>14} {its_raw:>16}")
    lim_text = "n/a" if lim is None else f"{lim:,.0f}"
    print(f"{'limits moving-window hit()':<30} {'redis':<9} {'':>10} {lim_text:>10}")
    if lim:
        print(f"taskq sync token bucket / limits: {s[('token bucket', 'redis')] / lim:.2f}x")
    print(
        f"rates: best of {args.rounds} slices per cell; 'vs raw': the cell's best slice / the "
        f"best of the raw slices interleaved with it ('its raw'); load average (1 min) "
        f"{load_before[0]:.2f} before, {load_after[0]:.2f} after, on {os.cpu_count()} CPUs"
    )
    medians = ", ".join(
        f"{label} {a[ratio((label, 'redis'))]:.0%}/{s[ratio((label, 'redis'))]:.0%}"
        for label in ("token bucket", "gcra", "log")
    )
    limits_median = f", token bucket / limits {s[LIMITS_RATIO]:.2f}x" if lim else ""
    print(f"median of paired slices (a/s), a noisier view: {medians}{limits_median}")
    for target, met in targets(a, s, lim):
        print(f"  [{'met' if met else 'n/a' if met is None else 'MISSED'}] {target}")


if __name__ == "__main__":
    main()
