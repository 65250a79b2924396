#!/usr/bin/env python
"""Admin UI page times on a 1,000,000-row Postgres jobs table: every list and count page.

Creates a throwaway database and fills it server-side (``INSERT ... SELECT
generate_series``, a few seconds per 100,000 rows) with a realistic shape:

- ``jobs``: ``--rows`` rows created over the last 48 hours (finishes spread over those
  hours: an hour holds about 2 % of the table); 92 % succeeded, 3 % failed, 1.5 %
  cancelled, 0.3 % crashed, 0.05 % abandoned, a backlog of 2 % pending and 1 %
  scheduled, and 160 running (20 workers x 8); 50 actors on a skewed distribution
  (the busiest has about a quarter of the jobs, the quietest under 1 %) on 10 queues;
  70 % tagged (one of 100 tags, skewed, and one of 7 categories); identity keys on 30 %
  (50,000 distinct); error classes on the failures (7 classes, skewed); durations
  from milliseconds to seconds, per actor.
- ``job_attempts`` for the failures, a job with children, ``actor_config`` (50),
  ``queues`` (10), ``workers`` (20 running, 300 stopped), a leader lease, 40 cron
  schedules.

Then ``VACUUM ANALYZE`` (the state autovacuum keeps a live table in: statistics current,
visibility map set) and requests each page ``--repeat`` times through the ASGI app **in
process** (``httpx.ASGITransport``: the server's own time, no network or uvicorn), after
one untimed request per page (Jinja compiles each template once). Two passes:

- **cold**: ``cache_ttl=0``: every request reads the store (the target applies here);
- **cached**: the default ``cache_ttl`` (5 s): the overview's, queues' and actors'
  figures come from memory on repeats.

It prints the median and the slowest request per page against the 100 ms target.

    python benchmarks/ui.py [--rows 1000000] [--repeat 20] [--keep NAME | --reuse NAME]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime

import httpx
from sqlalchemy import create_engine, text
from sqlalchemy.engine import URL, make_url
from sqlalchemy.ext.asyncio import AsyncEngine

from taskq.db import migrate
from taskq.db.engine import make_engine
from taskq.job_filter import encode_cursor
from taskq.settings import TaskQSettings
from taskq.ui import create_router

TARGET_MS = 100.0
SPAN_HOURS = 48

# r1: status, r2: actor, r3: tag, r4: identity key, r5: duration, r6: error class.
_FILL = """
INSERT INTO jobs (id, actor, queue, status, payload, attempt, scheduled_at, created_at,
                  updated_at, started_at, finished_at, tags, identity_key, error_class, error)
SELECT gen_random_uuid(), 'actor_' || a, 'q' || (a % 10), st,
       jsonb_build_object('n', g, 'user', 'u' || (g % 9973)),
       CASE WHEN st IN ('pending', 'scheduled') THEN 0 ELSE 1 END,
       CASE WHEN st = 'scheduled' THEN now() + r5 * interval '1 hour' ELSE created END,
       created, coalesce(finished, created),
       CASE WHEN st NOT IN ('pending', 'scheduled') THEN finished - dur END,
       finished,
       CASE WHEN r3 < 0.7 THEN jsonb_build_array('t' || floor(100 * (r3 / 0.7) ^ 2)::int,
                                                 'c' || (g % 7))
            ELSE '[]'::jsonb END,
       CASE WHEN r4 < 0.3 THEN 'user-' || floor(r4 / 0.3 * 50000)::int END,
       CASE WHEN st IN ('failed', 'crashed', 'abandoned')
            THEN (ARRAY['TimeoutError', 'TimeoutError', 'TimeoutError', 'ConnectionError',
                        'ConnectionError', 'ValueError', 'KeyError', 'HTTPError',
                        'RateLimited', 'WorkerCrashed'])[1 + floor(r6 * 10)::int]
            WHEN st = 'cancelled' THEN 'Cancelled' END,
       CASE WHEN st IN ('failed', 'crashed', 'abandoned') THEN 'something went wrong' END
FROM (
    SELECT g, a, r3, r4, r5, r6, created, st,
           (-ln(1 - r5) * 0.05 * (1 + a % 7)) * interval '1 second' AS dur,
           CASE WHEN st NOT IN ('pending', 'scheduled')
                THEN created + (0.2 + r6 * 2 - ln(1 - r5) * 0.05 * (1 + a % 7))
                               * interval '1 second' END AS finished
    FROM (
        SELECT g, floor(50 * r2 ^ 3)::int AS a, r3, r4, r5, r6,
               now() - (g::float8 / :rows * :span) * interval '1 hour' AS created,
               CASE WHEN r1 < 0.02 THEN 'pending' WHEN r1 < 0.03 THEN 'scheduled'
                    WHEN r1 < 0.95 THEN 'succeeded' WHEN r1 < 0.98 THEN 'failed'
                    WHEN r1 < 0.995 THEN 'cancelled' WHEN r1 < 0.9995 THEN 'crashed'
                    ELSE 'abandoned' END AS st
        FROM (
            SELECT g, random() AS r1, random() AS r2, random() AS r3, random() AS r4,
                   random() AS r5, random() AS r6
            FROM generate_series(1, :rows) AS g
        ) AS draws
    ) AS shaped
) AS timed
"""
_ATTEMPTS = """
INSERT INTO job_attempts (job_id, attempt, outcome, error_class, error, traceback,
                          started_at, finished_at)
SELECT id, 1, status, error_class, error, 'Traceback (most recent call last): ...',
       started_at, finished_at
FROM jobs WHERE status IN ('failed', 'crashed', 'abandoned')
"""
_WORKERS = """
INSERT INTO workers (id, hostname, pid, queues, concurrency, status, version, started_at,
                     last_heartbeat_at, stopped_at)
SELECT gen_random_uuid(), 'host-' || (n % 5), 1000 + n,
       jsonb_build_array('q' || (n % 10), 'q' || ((n + 1) % 10)), 8,
       CASE WHEN n < 20 THEN 'running' ELSE 'stopped' END, '1.0',
       now() - (n + 1) * interval '10 minutes', now() - (n % 3) * interval '1 second',
       CASE WHEN n >= 20 THEN now() - n * interval '1 minute' END
FROM generate_series(0, 319) AS n
"""
# 160 of the backlog are running, 8 per live worker (a fleet's running rows are bounded
# by its concurrency).
_RUNNING = """
WITH w AS (SELECT id, row_number() OVER (ORDER BY id) - 1 AS k
           FROM workers WHERE status = 'running'),
     j AS (SELECT id, row_number() OVER (ORDER BY created_at DESC) - 1 AS k
           FROM jobs WHERE status = 'pending' ORDER BY created_at DESC LIMIT 160)
UPDATE jobs SET status = 'running', attempt = 1, started_at = now(), locked_by = w.id,
                lease_expires_at = now() + interval '1 minute'
FROM j JOIN w ON w.k = j.k % 20 WHERE jobs.id = j.id
"""
_LEASE = """
INSERT INTO leader_leases (name, holder, acquired_at, expires_at)
SELECT 'cron', id, now(), now() + interval '30 seconds' FROM workers
WHERE status = 'running' ORDER BY id LIMIT 1
"""
_ACTORS = """
INSERT INTO actor_config (actor, queue, metadata, updated_at)
SELECT 'actor_' || a, 'q' || (a % 10), '{}'::jsonb, now() FROM generate_series(0, 49) AS a
"""
_QUEUES = """
INSERT INTO queues (name, max_concurrent, updated_at)
SELECT 'q' || n, 10, now() FROM generate_series(0, 9) AS n
"""
_CRON = """
INSERT INTO cron_schedules (id, actor, cron_expression, enabled, next_run_at, origin)
SELECT 'sched-' || n, 'actor_' || (n % 50), '*/5 * * * *', n % 4 <> 0,
       now() + interval '5 minutes', 'api'
FROM generate_series(0, 39) AS n
"""
# A job with 30 children (the detail page lists them).
_CHILDREN = """
UPDATE jobs SET parent_job_id = :parent
WHERE id IN (SELECT id FROM jobs ORDER BY created_at DESC OFFSET 500 LIMIT 30)
"""


@contextmanager
def _database(admin_url: URL, keep: str | None, reuse: str | None) -> Iterator[tuple[URL, bool]]:
    """A database for the run: a new one (dropped after unless ``keep`` names it) or the
    ``reuse`` one filled by an earlier ``--keep`` run."""
    if reuse:
        yield admin_url.set(database=reuse), False
        return
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    name = keep or f"bench_ui_{uuid.uuid4().hex[:8]}"
    quoted = admin.dialect.identifier_preparer.quote(name)
    try:
        with admin.connect() as conn:
            conn.execute(text(f"DROP DATABASE IF EXISTS {quoted} WITH (FORCE)"))
            conn.execute(text(f"CREATE DATABASE {quoted}"))
        yield admin_url.set(database=name), True
    finally:
        if not keep:
            with admin.connect() as conn:
                conn.execute(text(f"DROP DATABASE IF EXISTS {quoted} WITH (FORCE)"))
        admin.dispose()


async def fill(engine: AsyncEngine, schema: str, rows: int) -> None:
    """Fill the migrated database of ``engine`` with ``rows`` jobs and the tables around
    them (the shape the module docstring describes), then ``VACUUM ANALYZE``."""
    started = time.perf_counter()
    async with engine.begin() as conn:
        await conn.execute(text(f"SET LOCAL search_path TO {schema}"))
        await conn.execute(text("SELECT setseed(0.24)"))
        await conn.execute(text(_FILL), {"rows": rows, "span": SPAN_HOURS})
        await conn.execute(text(_ATTEMPTS))
        await conn.execute(text(_WORKERS))
        await conn.execute(text(_RUNNING))
        await conn.execute(text(_LEASE))
        await conn.execute(text(_ACTORS))
        await conn.execute(text(_QUEUES))
        await conn.execute(text(_CRON))
        parent = (
            await conn.execute(text("SELECT id FROM jobs ORDER BY created_at DESC LIMIT 1"))
        ).scalar_one()
        await conn.execute(text(_CHILDREN), {"parent": parent})
    # VACUUM (outside a transaction) leaves the table as autovacuum keeps a live one:
    # statistics current and the visibility map set, so index-only scans apply.
    async with engine.execution_options(isolation_level="AUTOCOMMIT").connect() as conn:
        await conn.exec_driver_sql(f"SET search_path TO {schema}")
        await conn.exec_driver_sql("VACUUM ANALYZE")
    print(f"filled {rows:,} rows in {time.perf_counter() - started:.1f} s", file=sys.stderr)


async def _pages(engine: AsyncEngine, schema: str) -> dict[str, str]:
    async with engine.connect() as conn:
        await conn.execute(text(f"SET search_path TO {schema}"))

        async def one(sql: str) -> tuple[object, ...]:
            return tuple((await conn.execute(text(sql))).one())

        (parent,) = await one(
            "SELECT parent_job_id FROM jobs WHERE parent_job_id IS NOT NULL LIMIT 1"
        )
        (failed_job,) = await one(
            "SELECT id FROM jobs WHERE status = 'failed' ORDER BY created_at DESC LIMIT 1"
        )
        # A cursor 900,000 rows deep (pages 40 hours back), and one deep in the failures.
        deep_at, deep_id = await one(
            "SELECT created_at, id FROM jobs ORDER BY created_at DESC, id DESC OFFSET 900000 LIMIT 1"
        )
        fail_at, fail_id = await one(
            "SELECT created_at, id FROM jobs WHERE status = 'failed' "
            "ORDER BY created_at DESC, id DESC OFFSET 25000 LIMIT 1"
        )
        (rare_actor,) = await one("SELECT actor FROM jobs GROUP BY actor ORDER BY count(*) LIMIT 1")
        (rare_tag,) = await one(
            "SELECT t FROM (SELECT tags->>0 AS t FROM jobs WHERE tags <> '[]') s "
            "GROUP BY t ORDER BY count(*) LIMIT 1"
        )
        (user,) = await one("SELECT identity_key FROM jobs WHERE identity_key IS NOT NULL LIMIT 1")
    assert isinstance(deep_at, datetime)
    assert isinstance(fail_at, datetime)
    deep = encode_cursor(deep_at.isoformat(), uuid.UUID(str(deep_id)))
    deep_failed = encode_cursor(fail_at.isoformat(), uuid.UUID(str(fail_id)))
    return {
        "overview /": "/",
        "jobs (all)": "/jobs",
        "jobs deep page (900,000 back)": f"/jobs?after={deep}",
        "jobs status=pending": "/jobs?status=pending",
        "jobs status=failed": "/jobs?status=failed",
        "jobs status=failed deep page": f"/jobs?status=failed&after={deep_failed}",
        "jobs status=abandoned (rare)": "/jobs?status=abandoned",
        "jobs status=failed,crashed": "/jobs?status=failed&status=crashed",
        "jobs actor (busiest)": "/jobs?actor=actor_0",
        f"jobs actor (quietest, {rare_actor})": f"/jobs?actor={rare_actor}",
        "jobs actor+status": "/jobs?actor=actor_7&status=failed",
        "jobs queue": "/jobs?queue=q3",
        "jobs queue+status": "/jobs?queue=q3&status=pending",
        "jobs tag (category, 1/7)": "/jobs?tag=c3",
        f"jobs tag (rare, {rare_tag})": f"/jobs?tag={rare_tag}",
        "jobs identity_key": f"/jobs?identity_key={user}",
        "jobs error_class": "/jobs?error_class=TimeoutError",
        "jobs error_class (rare)": "/jobs?error_class=WorkerCrashed",
        "job detail (failed)": f"/jobs/{failed_job}",
        "job detail (30 children)": f"/jobs/{parent}",
        "confirm cancel (count to 100,000)": "/jobs/confirm?action=cancel&actor=actor_7",
        "queues": "/queues",
        "actors (1h)": "/actors?window=1h",
        "actors (24h)": "/actors?window=24h",
        "actors (7d)": "/actors?window=7d",
        "workers": "/workers",
        "workers (with stopped)": "/workers?stopped=1",
        "rate-limits": "/rate-limits",
        "cron": "/cron",
    }


async def _time(
    engine: AsyncEngine, settings: TaskQSettings, pages: dict[str, str], repeat: int, ttl: float
) -> dict[str, list[float]]:
    app = create_router(engine=engine, settings=settings, cache_ttl=ttl)
    out: dict[str, list[float]] = {}
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://bench"
    ) as client:
        for path in pages.values():  # compile each template once (a one-time cost)
            await client.get(path)
        for label, path in pages.items():
            times = []
            for _ in range(repeat):
                t0 = time.perf_counter()
                response = await client.get(path)
                times.append((time.perf_counter() - t0) * 1000)
                assert response.status_code == 200, (path, response.status_code)
            out[label] = times
    return out


async def _run(
    url: str, rows: int, repeat: int, fresh: bool
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    # Actions on: the confirmation page counts (to 100,000) instead of answering 403.
    settings = TaskQSettings.load(database_url=url, admin_actions_enabled=True)
    engine = make_engine(url, settings=settings)
    try:
        if fresh:
            await migrate.upgrade(engine, settings=settings)
            await fill(engine, settings.schema_name, rows)
        pages = await _pages(engine, settings.schema_name)
        cold = await _time(engine, settings, pages, repeat, 0.0)
        cached = await _time(engine, settings, pages, repeat, 5.0)
    finally:
        await engine.dispose()
    return cold, cached


def main() -> None:
    """Fill, measure, print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--keep", help="fill this database and leave it for --reuse")
    parser.add_argument("--reuse", help="time the pages on a database an earlier --keep filled")
    args = parser.parse_args()
    admin_url = make_url(args.url).set(drivername="postgresql+psycopg")
    load_before = os.getloadavg()[0]
    with _database(admin_url, args.keep, args.reuse) as (url, fresh):
        cold, cached = asyncio.run(
            _run(url.render_as_string(hide_password=False), args.rows, args.repeat, fresh)
        )
    load_after = os.getloadavg()[0]
    print(
        f"admin UI pages on {args.rows:,} jobs: {args.repeat} requests each, in process "
        f"(httpx.ASGITransport); load average {load_before:.1f} before, {load_after:.1f} after"
    )
    print(
        f"| page | cold median ms | cold slowest ms | cached median ms | "
        f"cold under {TARGET_MS:.0f} ms |"
    )
    print("|---|---:|---:|---:|---|")
    for label, times in cold.items():
        worst = max(times)
        print(
            f"| {label} | {statistics.median(times):.1f} | {worst:.1f} | "
            f"{statistics.median(cached[label]):.1f} | {'yes' if worst < TARGET_MS else 'NO'} |"
        )


if __name__ == "__main__":
    main()
