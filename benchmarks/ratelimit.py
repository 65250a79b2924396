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

Next to ``limits`` it measures the ceiling of any blocking client: the same trivial
``EVALSHA`` written and read on a plain socket, with no client library at all. Its ratio
to ``limits`` bounds what any one-round-trip client can show against ``limits`` in that
run.

Where the client and Redis run matters more than either's code on a small VM: with the
two on different CPUs, every round trip pays two cross-CPU wake-ups (tens of
microseconds on a virtual machine that halts idle vCPUs), the same for every client, so
the comparison mostly measures the hypervisor. ``--placement same-cpu`` pins this process,
the ``limits`` peer and a private ``redis-server`` it starts (``--save "" --appendonly
no``, on a free port) to one CPU, so a round trip costs what the client and the script
cost in CPU; ``free`` (the default) leaves placement to the scheduler and uses
``TASKQ_REDIS_URL``. The Postgres server is never pinned.

    python benchmarks/ratelimit.py [--seconds 1.5] [--rounds 5] [--placement free|same-cpu]

Redis: ``TASKQ_REDIS_URL`` (default ``redis://127.0.0.1:6379/0``). Postgres:
``TASKQ_BENCH_DATABASE_URL`` (default: a ``taskq_bench`` database on the local server,
created and migrated if missing).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

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


_LIMITS_PEER = """
import sys, time, uuid
from limits import parse
from limits.storage import RedisStorage
from limits.strategies import MovingWindowRateLimiter
lim = MovingWindowRateLimiter(RedisStorage(sys.argv[1]))
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

    def __init__(self, redis_url: str) -> None:
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
            [str(py), "-c", _LIMITS_PEER, redis_url],
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


def limits_peer(redis_url: str) -> LimitsPeer | None:
    """A running :class:`LimitsPeer`, or ``None`` when ``limits`` cannot be installed."""
    try:
        return LimitsPeer(redis_url)
    except (subprocess.SubprocessError, OSError, ValueError):
        return None


class RawSocket:
    """The trivial ``EVALSHA`` on a plain blocking socket: no client library at all, the
    fastest any one-connection blocking client can make the round trip."""

    def __init__(self, redis_url: str, sha: bytes) -> None:
        url = urlsplit(redis_url)
        self.sock = socket.create_connection((url.hostname or "127.0.0.1", url.port or 6379))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.command = b"*3\r\n$7\r\nEVALSHA\r\n$%d\r\n%s\r\n$1\r\n0\r\n" % (len(sha), sha)
        self.call()

    def call(self) -> None:
        """One round trip; the reply is ``:1\\r\\n``."""
        self.sock.sendall(self.command)
        reply = self.sock.recv(64)
        if reply != b":1\r\n":
            raise OSError(f"unexpected reply {reply!r}")

    def close(self) -> None:
        """Close the socket."""
        self.sock.close()


@contextmanager
def placement(kind: str) -> Iterator[str]:
    """The Redis URL to measure against, with this process placed as ``kind`` says.

    ``free``: ``TASKQ_REDIS_URL``, placement left to the scheduler. ``same-cpu``: this
    process (and every process it starts from now on: the ``limits`` peer) is pinned to
    its last allowed CPU, and a private ``redis-server`` is started there on a free port,
    then stopped at the end.
    """
    if kind == "free":
        yield REDIS_URL
        return
    server = shutil.which("redis-server")
    if server is None:
        raise SystemExit("--placement same-cpu needs redis-server on PATH")
    cpu = max(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpu})
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    args = ["--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    proc = subprocess.Popen([server, *args], stdout=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}/0"
    try:
        client = redis.Redis.from_url(url)
        for _ in range(100):
            try:
                client.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.05)
        else:
            raise SystemExit(f"the private redis-server on port {port} did not answer")
        client.close()
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


LIMITS = ("limits moving-window hit()", "limits")
RAW = ("raw EVALSHA (trivial script)", "redis")
RAW_SOCKET = ("raw socket EVALSHA (no client)", "redis")
SOCKET_RATIO = ("raw socket / limits", "ratio")
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
    seconds: float, rounds: int, settings: TaskQSettings, pg_url: str, redis_url: str
) -> dict[tuple[str, str], float]:
    """Best-slice acquires/s of every cell from one asyncio client, raw EVALSHA interleaved."""
    client = aredis.Redis.from_url(redis_url)
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
    seconds: float,
    rounds: int,
    settings: TaskQSettings,
    pg_url: str,
    redis_url: str,
    peer: LimitsPeer | None,
) -> dict[tuple[str, str], float]:
    """Best-slice acquires/s of every cell from one blocking client, raw EVALSHA interleaved.

    With ``peer``, a ``limits`` slice follows every slice of the Redis token bucket, and a
    slice of :class:`RawSocket` follows it.
    """
    client = redis.Redis.from_url(redis_url)
    sha = client.script_load(TRIVIAL)
    bare = RawSocket(redis_url, sha.encode() if isinstance(sha, str) else sha)
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
                ceiling = rate_sync(bare.call, slice_s)
                rows[RAW_SOCKET] = max(rows.get(RAW_SOCKET, 0.0), ceiling)
                pairs.setdefault(SOCKET_RATIO, []).append(ceiling / lim)
    bare.close()
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
    parser.add_argument(
        "--placement",
        choices=("free", "same-cpu"),
        default="free",
        help="where the client and Redis run (see the module docstring)",
    )
    args = parser.parse_args()
    settings = TaskQSettings.load(database_url=None, redis_url=None)
    pg_url = ensure_pg(settings)
    load_before = os.getloadavg()
    with placement(args.placement) as redis_url:
        a = asyncio.run(async_rows(args.seconds, args.rounds, settings, pg_url, redis_url))
        peer = None if args.no_limits else limits_peer(redis_url)
        try:
            s = sync_rows(args.seconds, args.rounds, settings, pg_url, redis_url, peer)
        finally:
            if peer is not None:
                peer.close()
    lim = s.pop(LIMITS, None)
    bare = s.pop(RAW_SOCKET, None)
    s.setdefault(LIMITS_RATIO, 0.0)
    load_after = os.getloadavg()
    if args.placement == "free":
        print("placement: free (the scheduler places the client and Redis)")
    else:
        cpu = next(iter(os.sched_getaffinity(0)))
        print(
            f"placement: same-cpu (this process, the limits peer and a private redis-server "
            f"on CPU {cpu}; Postgres not pinned)"
        )
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
    if bare is not None:
        print(f"{RAW_SOCKET[0]:<30} {'redis':<9} {'':>10} {bare:>10,.0f}")
    if lim:
        print(f"taskq sync token bucket / limits: {s[('token bucket', 'redis')] / lim:.2f}x")
    if lim and bare:
        print(
            f"raw socket / limits: {bare / lim:.2f}x (the most any one-round-trip client "
            f"could show against limits in this run)"
        )
    print(
        f"rates: best of {args.rounds} slices per cell; 'vs raw': the cell's best slice / the "
        f"best of the raw slices interleaved with it ('its raw'); load average (1 min) "
        f"{load_before[0]:.2f} before, {load_after[0]:.2f} after, on {os.cpu_count()} CPUs"
    )
    medians = ", ".join(
        f"{label} {a[ratio((label, 'redis'))]:.0%}/{s[ratio((label, 'redis'))]:.0%}"
        for label in ("token bucket", "gcra", "log")
    )
    limits_median = (
        f", token bucket / limits {s[LIMITS_RATIO]:.2f}x, raw socket / limits "
        f"{s[SOCKET_RATIO]:.2f}x"
        if lim
        else ""
    )
    print(f"median of paired slices (a/s), a noisier view: {medians}{limits_median}")
    for target, met in targets(a, s, lim):
        print(f"  [{'met' if met else 'n/a' if met is None else 'MISSED'}] {target}")


if __name__ == "__main__":
    main()
