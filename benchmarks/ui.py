#!/usr/bin/env python
"""Admin UI page times on a large Postgres jobs table: every list and count page.

Creates a throwaway database, fills ``jobs`` with ``--rows`` rows (default 1,000,000:
50 actors with ``actor_config`` rows, 10 queues with ``queues`` rows, 8 statuses, tags,
identity keys, error classes, finishes spread over the last ``--rows`` seconds), runs
``VACUUM ANALYZE`` (the state autovacuum keeps a live table in), then requests each page ``--repeat`` times through the ASGI app in process
(``httpx.ASGITransport``: the server's own time, no network) with the UI's short cache
off (``cache_ttl=0``: every request reads the store), after one untimed request per page
(Jinja compiles each template once), and prints the median and the slowest request per
page against the 100 ms target.

    python benchmarks/ui.py [--rows 1000000] [--repeat 10]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
from sqlalchemy import create_engine, text
from sqlalchemy.engine import URL, make_url

from taskq.db import migrate
from taskq.db.engine import make_engine
from taskq.settings import TaskQSettings
from taskq.ui import create_router

TARGET_MS = 100.0

_FILL = """
INSERT INTO jobs (id, actor, queue, status, payload, scheduled_at, created_at, updated_at,
                  started_at, finished_at, tags, identity_key, error_class)
SELECT gen_random_uuid(), 'actor_' || (g % 50), 'q' || (g % 10),
       (ARRAY['pending','scheduled','running','succeeded','succeeded','succeeded',
              'failed','cancelled'])[1 + g % 8],
       '{}'::jsonb, now() - g * interval '1 second', now() - g * interval '1 second',
       now() - g * interval '1 second',
       CASE WHEN g % 8 >= 2 THEN now() - g * interval '1 second' END,
       CASE WHEN g % 8 >= 3 THEN now() - g * interval '1 second' + (g % 7) * interval '1 second' END,
       jsonb_build_array('t' || (g % 100), 'c' || (g % 7)),
       CASE WHEN g % 3 = 0 THEN 'id' || (g % 1000) END,
       CASE WHEN g % 8 = 6 THEN 'Err' || (g % 5) END
FROM generate_series(1, :rows) AS g
"""
_ACTORS = """
INSERT INTO actor_config (actor, queue, metadata, updated_at)
SELECT 'actor_' || a, 'q' || (a % 10), '{}'::jsonb, now() FROM generate_series(0, 49) AS a
"""
_QUEUES = """
INSERT INTO queues (name, max_concurrent, updated_at)
SELECT 'q' || n, 10, now() FROM generate_series(0, 9) AS n
"""


@contextmanager
def _database(admin_url: URL) -> Iterator[URL]:
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    name = f"bench_ui_{uuid.uuid4().hex[:8]}"
    quoted = admin.dialect.identifier_preparer.quote(name)
    try:
        with admin.connect() as conn:
            conn.execute(text(f"CREATE DATABASE {quoted}"))
        yield admin_url.set(database=name)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f"DROP DATABASE IF EXISTS {quoted} WITH (FORCE)"))
        admin.dispose()


async def _run(url: str, rows: int, repeat: int) -> list[tuple[str, float, float]]:
    settings = TaskQSettings.load(database_url=url)
    engine = make_engine(url, settings=settings)
    await migrate.upgrade(engine, settings=settings)
    started = time.perf_counter()
    async with engine.begin() as conn:
        await conn.execute(text(f"SET LOCAL search_path TO {settings.schema_name}"))
        await conn.execute(text(_FILL), {"rows": rows})
        await conn.execute(text(_ACTORS))
        await conn.execute(text(_QUEUES))
    # VACUUM (outside a transaction) leaves the table as autovacuum keeps a live one:
    # statistics current and the visibility map set, so index-only scans apply.
    async with engine.execution_options(isolation_level="AUTOCOMMIT").connect() as conn:
        await conn.exec_driver_sql("VACUUM ANALYZE")
    async with engine.connect() as conn:
        await conn.execute(text(f"SET search_path TO {settings.schema_name}"))
        some_id = (await conn.execute(text("SELECT id FROM jobs LIMIT 1"))).scalar_one()
    print(f"filled {rows:,} rows in {time.perf_counter() - started:.1f} s", file=sys.stderr)
    # cache_ttl=0: every request reads the store (the UI's short cache would otherwise
    # answer the repeats of the overview, queues and actors pages from memory).
    app = create_router(engine=engine, settings=settings, cache_ttl=0)
    out = []
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://bench"
    ) as client:
        first = (await client.get("/jobs?status=failed&limit=50")).text
        cursor = first.split("after=", 1)[1].split('"', 1)[0] if "after=" in first else ""
        pages = {
            "overview /": "/",
            "jobs (all)": "/jobs",
            "jobs status=failed": "/jobs?status=failed",
            "jobs status=failed page 2": f"/jobs?status=failed&limit=50&after={cursor}",
            "jobs actor": "/jobs?actor=actor_7",
            "jobs actor+status": "/jobs?actor=actor_7&status=failed",
            "jobs queue": "/jobs?queue=q3",
            "jobs tag": "/jobs?tag=t7",
            "jobs identity_key": "/jobs?identity_key=id33",
            "jobs error_class": "/jobs?error_class=Err1",
            "job detail": f"/jobs/{some_id}",
            "confirm cancel (count)": "/jobs/confirm?action=cancel&actor=actor_7",
            "queues": "/queues",
            "actors (24h)": "/actors?window=24h",
            "workers": "/workers",
            "rate-limits": "/rate-limits",
        }
        for path in pages.values():  # compile each template once (a one-time cost)
            await client.get(path)
        for label, path in pages.items():
            times = []
            for _ in range(repeat):
                t0 = time.perf_counter()
                response = await client.get(path)
                times.append((time.perf_counter() - t0) * 1000)
                # The confirm page is refused with actions off: still a count, timed.
                assert response.status_code in (200, 403), (path, response.status_code)
            out.append((label, statistics.median(times), max(times)))
    await engine.dispose()
    return out


def main() -> None:
    """Fill, measure, print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=10)
    args = parser.parse_args()
    admin_url = make_url(args.url).set(drivername="postgresql+psycopg")
    with _database(admin_url) as url:
        results = asyncio.run(
            _run(url.render_as_string(hide_password=False), args.rows, args.repeat)
        )
    print(f"admin UI pages on {args.rows:,} jobs ({args.repeat} requests each, in process)")
    print(f"| page | median ms | slowest ms | under {TARGET_MS:.0f} ms |")
    print("|---|---:|---:|---|")
    for label, median, worst in results:
        print(f"| {label} | {median:.1f} | {worst:.1f} | {'yes' if worst < TARGET_MS else 'NO'} |")


if __name__ == "__main__":
    main()
