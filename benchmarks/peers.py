"""Peer enqueue rates for ``benchmarks/enqueue.py``: procrastinate and pgqueuer.

Runs inside the throwaway virtualenv that ``enqueue.py`` creates (it imports only the
peer under test, never taskq), against a database of its own that it is handed (the
peer's schema is installed on first use), and prints one JSON object
``{"single": jobs_per_s, "batch": jobs_per_s}`` on stdout.

Usage (normally only from ``enqueue.py``)::

    python benchmarks/peers.py pgqueuer postgresql://postgres@127.0.0.1:5432/db -n 2000

Each peer is driven the way its documentation shows: pgqueuer's ``Queries.enqueue`` on an
asyncpg connection (scalar arguments for one job, lists for a batch); procrastinate's
``defer_async`` / ``batch_defer_async`` through an opened ``PsycopgConnector`` app.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import importlib
import json
import time
from typing import Any

BATCH = 1000


async def _pgqueuer(dsn: str, n: int, batches: int) -> dict[str, float]:
    import asyncpg
    from pgqueuer.queries import Queries

    conn = await asyncpg.connect(dsn)
    try:
        queries = Queries.from_asyncpg_connection(conn)
        if not await queries.schema_is_installed():
            await queries.install()
        for i in range(50):  # warm-up: prepared statements, caches
            await queries.enqueue("bench", json.dumps({"n": i}).encode(), 0)
        start = time.perf_counter()
        for i in range(n):
            await queries.enqueue("bench", json.dumps({"n": i}).encode(), 0)
        single = n / (time.perf_counter() - start)
        start = time.perf_counter()
        for b in range(batches):
            payloads = [json.dumps({"n": b * BATCH + i}).encode() for i in range(BATCH)]
            await queries.enqueue(["bench"] * BATCH, payloads, [0] * BATCH)
        batch = batches * BATCH / (time.perf_counter() - start)
    finally:
        await conn.close()
    return {"single": single, "batch": batch}


async def _procrastinate(dsn: str, n: int, batches: int) -> dict[str, float]:
    import procrastinate

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=dsn))

    async def _bench(n: int) -> None: ...

    bench: Any = app.task(name="bench")(_bench)

    async with app.open_async():
        found = await app.connector.execute_query_one_async(
            "SELECT to_regclass('procrastinate_jobs') IS NOT NULL AS installed"
        )
        if not found["installed"]:
            await app.schema_manager.apply_schema_async()
        for i in range(50):
            await bench.defer_async(n=i)
        start = time.perf_counter()
        for i in range(n):
            await bench.defer_async(n=i)
        single = n / (time.perf_counter() - start)
        start = time.perf_counter()
        for b in range(batches):
            await bench.batch_defer_async(*({"n": b * BATCH + i} for i in range(BATCH)))
        batch = batches * BATCH / (time.perf_counter() - start)
    return {"single": single, "batch": batch}


def main() -> None:
    """Parse the command line, run one peer, print its rates as JSON."""
    parser = argparse.ArgumentParser()
    parser.add_argument("peer", choices=["pgqueuer", "procrastinate"])
    parser.add_argument("dsn", help="a libpq URL of a database the peer may own")
    parser.add_argument("-n", type=int, default=2000, help="single enqueues to time")
    parser.add_argument("--batches", type=int, default=20, help="batches of 1,000 to time")
    parser.add_argument("--gc-freeze", action="store_true", help="gc.freeze() after imports")
    args = parser.parse_args()
    if args.gc_freeze:  # load the peer first, as the taskq side loads taskq
        for module in (
            ("asyncpg", "pgqueuer.queries") if args.peer == "pgqueuer" else ("procrastinate",)
        ):
            importlib.import_module(module)
        gc.freeze()
    run: Any = _pgqueuer if args.peer == "pgqueuer" else _procrastinate
    print(json.dumps(asyncio.run(run(args.dsn, args.n, args.batches))))


if __name__ == "__main__":
    main()
