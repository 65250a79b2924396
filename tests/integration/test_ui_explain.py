"""The admin UI's reads on a 1,000,000-row Postgres jobs table (the benchmark's realistic
fill, ``benchmarks/ui.py``): the overview's and the queues page's batched capped counts,
the throughput chart, the actors page's counts and per-actor window statistics, the
workers page's running counts, the jobs page's list and count for every filter (common
and rare values, deep keyset pages), a job's detail, children, drain rate and progress
row are index scans, never a sequential scan of ``jobs`` (``EXPLAIN``, after ``VACUUM
ANALYZE``), and the window reads are index-only."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from benchmarks.ui import fill
from sqlalchemy import text
from sqlalchemy.engine import URL

from taskq.db.engine import make_engine
from taskq.db.queries import admin as qa
from taskq.db.queries import fleet
from taskq.db.queries import job_ops as q
from taskq.job_filter import JobFilter
from taskq.ops.stats import THROUGHPUT_LIMIT, actor_sample_size
from taskq.settings import TaskQSettings
from taskq.ui.pages import ACTIVE, CONFIRM_CAP, LIST_CAP, OVERVIEW_CAP
from tests.support.explain import Explain

pytestmark = pytest.mark.integration

ROWS = 1_000_000
ACTORS = [f"actor_{n}" for n in range(50)]
QUEUES = [f"q{n}" for n in range(10)] + ["default"]

# Every filter the jobs page offers, with a common and a rare value where it matters.
FILTERS = {
    "all": JobFilter(),
    "status pending": JobFilter(status="pending"),
    "status failed": JobFilter(status="failed"),
    "status abandoned (rare)": JobFilter(status="abandoned"),
    "statuses failed+crashed": JobFilter(status=["failed", "crashed"]),
    "actor busiest": JobFilter(actor="actor_0"),
    "actor quietest": JobFilter(actor="actor_49"),
    "actor none": JobFilter(actor="nobody"),
    "actor+status": JobFilter(actor="actor_7", status="failed"),
    "queue": JobFilter(queue="q3"),
    "queue+status": JobFilter(queue="q3", status="pending"),
    "tag category": JobFilter(tags=["c3"]),
    "tag rare": JobFilter(tags=["t99"]),
    "tag none": JobFilter(tags=["none-such"]),
    "identity_key": JobFilter(identity_key="user-33"),
    "error_class": JobFilter(error_class="TimeoutError"),
    "error_class rare": JobFilter(error_class="WorkerCrashed"),
}


def _statements(now: datetime) -> dict[str, Any]:
    hour = now - timedelta(hours=1)
    out: dict[str, Any] = {}
    overview = [(queue, status) for queue in QUEUES for status in ACTIVE]
    out["overview counts (33, one statement)"] = qa.active_counts("queue", overview, OVERVIEW_CAP)
    actors = [(actor, status) for actor in ACTORS for status in ACTIVE]
    out["actors active counts (150, one statement)"] = qa.active_counts(
        "actor", actors, OVERVIEW_CAP
    )
    out["throughput last hour"] = qa.throughput_buckets(hour, 300.0, THROUGHPUT_LIMIT)
    out["drain rate of a queue"] = qa.finished_count(hour, "q3", 10_000)
    out["actor stats 1h"] = qa.actor_recent("actor_7", hour, 10_000)
    for label, window in (("1h", 1), ("24h", 24), ("7d", 24 * 7)):
        since = now - timedelta(hours=window)
        out[f"actors window {label}"] = qa.actors_window(
            ACTORS, since, actor_sample_size(len(ACTORS))
        )
    out["workers with running counts"] = fleet.list_workers("postgresql", include_stopped=True)
    out["progress row"] = qa.progress_row(uuid.uuid4())
    out["job detail"] = q.select_job(uuid.uuid4())
    out["job children"] = qa.children_of(uuid.uuid4(), 1000)
    out["confirm count"] = q.count_capped(
        "postgresql", JobFilter(actor="actor_7", status="failed"), CONFIRM_CAP
    )
    deep = ((now - timedelta(hours=40)).isoformat(), uuid.uuid4())
    for name, flt in FILTERS.items():
        out[f"list {name}"] = q.list_page("postgresql", flt, 51, None)
        out[f"list {name} deep page"] = q.list_page("postgresql", flt, 51, deep)
        out[f"count {name}"] = q.count_capped("postgresql", flt, LIST_CAP)
    return out


@pytest.mark.slow
async def test_no_ui_read_scans_the_whole_jobs_table(pg_url: URL, settings: TaskQSettings) -> None:
    engine = make_engine(pg_url, settings=settings)
    try:
        await fill(engine, settings.schema_name, ROWS)
        async with engine.connect() as conn:
            await conn.execute(text(f"SET search_path TO {settings.schema_name}"))
            plans = {
                name: list((await conn.execute(Explain(stmt))).scalars())
                for name, stmt in _statements(datetime.now(UTC)).items()
            }
            count = (await conn.execute(text("SELECT count(*) FROM jobs"))).scalar_one()
    finally:
        await engine.dispose()
    assert count == ROWS
    scanning = {
        name: plan for name, plan in plans.items() if any("Seq Scan on jobs" in p for p in plan)
    }
    assert scanning == {}
    for name, plan in plans.items():
        assert any("Index" in p for p in plan), (name, plan)
    # The window reads never touch the heap for their rows: index-only ranges.
    for name in ("throughput last hour", "actors window 24h", "actors window 7d"):
        assert any("Index Only Scan" in p for p in plans[name]), (name, plans[name])
