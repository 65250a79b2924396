"""The admin UI's reads on a 1,000,000-row Postgres jobs table: the overview's and the
queues page's capped counts, the actors page's counts and executor statistics, the
throughput and drain-rate reads, the jobs page's lists and the progress row are all
index scans, never a sequential scan of ``jobs`` (``EXPLAIN``, after ``ANALYZE``)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.engine import URL

from taskq.db.engine import make_engine
from taskq.db.queries import admin as qa
from taskq.db.queries import job_ops as q
from taskq.job_filter import JobFilter
from taskq.settings import TaskQSettings
from taskq.ui.pages import ACTIVE, CONFIRM_CAP, LIST_CAP, OVERVIEW_CAP
from tests.integration.test_ops_explain import _FILL, ROWS
from tests.support.explain import Explain

pytestmark = pytest.mark.integration


def _statements(now: datetime) -> dict[str, Any]:
    hour = now - timedelta(hours=1)
    week = now - timedelta(days=7)
    out: dict[str, Any] = {}
    for status in ACTIVE:  # the overview, the queues page and a job's drain estimate
        out[f"count queue {status}"] = qa.active_count((status,), OVERVIEW_CAP, queue="q3")
    out["count actor active"] = qa.active_count(ACTIVE, OVERVIEW_CAP, actor="actor_7")
    out["confirm count"] = q.count_capped(
        "postgresql", JobFilter(actor="actor_7", status="failed"), CONFIRM_CAP
    )
    out["throughput last hour"] = qa.recent_finishes(hour, 10_000)
    out["drain rate of a queue"] = qa.finished_count(hour, "q3", 10_000)
    out["actor stats 1h"] = qa.actor_recent("actor_7", hour, 10_000)
    out["actor stats 7d"] = qa.actor_recent("actor_7", week, 10_000)
    out["progress row"] = qa.progress_row(uuid.uuid4())
    out["job children"] = qa.children_of(uuid.uuid4(), 1000)
    for label, since in (("1h", hour), ("7d", week)):
        sample = qa.window_sample(since, 20_000)
        out[f"actors summary {label}"] = qa.actors_summary(sample)
        out[f"actors last error {label}"] = qa.actors_last_error(sample)
    for name, flt in {
        "jobs page": JobFilter(),
        "jobs page statuses": JobFilter(status=["failed", "crashed"]),
        "jobs page actor+status": JobFilter(actor="actor_7", status="failed"),
        "jobs page tag": JobFilter(tags=["t7"]),
        "jobs page error_class": JobFilter(error_class="Err1"),
    }.items():
        out[f"list {name}"] = q.list_page("postgresql", flt, 51, None)
        out[f"count {name}"] = q.count_capped("postgresql", flt, LIST_CAP)
    return out


@pytest.mark.slow
async def test_no_ui_read_scans_the_whole_jobs_table(pg_url: URL, settings: TaskQSettings) -> None:
    engine = make_engine(pg_url, settings=settings)
    try:
        async with engine.begin() as conn:
            await conn.execute(text(f"SET LOCAL search_path TO {settings.schema_name}"))
            await conn.execute(text(_FILL), {"rows": ROWS})
        async with engine.connect() as conn:
            await conn.execute(text(f"SET search_path TO {settings.schema_name}"))
            await conn.execute(text("ANALYZE jobs"))
            plans = {
                name: list((await conn.execute(Explain(stmt))).scalars())
                for name, stmt in _statements(datetime.now(UTC)).items()
            }
            count = (await conn.execute(text("SELECT count(*) FROM jobs"))).scalar_one()
    finally:
        await engine.dispose()
    assert count == ROWS
    scanning = {name: plan for name, plan in plans.items() if any("Seq Scan" in p for p in plan)}
    assert scanning == {}
    for name, plan in plans.items():
        assert any("Index" in p for p in plan), (name, plan)
