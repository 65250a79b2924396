"""The operations' statements on a 1,000,000-row Postgres jobs table: every ``list`` filter,
every capped ``count`` and the bulk actions' batch selections are index scans, never a
sequential scan of ``jobs`` (``EXPLAIN``, after ``ANALYZE``)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.engine import URL
from sqlalchemy.sql.dml import UpdateBase

from taskq.db.engine import make_engine
from taskq.db.queries import job_ops as q
from taskq.job_filter import JobFilter
from taskq.settings import TaskQSettings
from tests.support.explain import Explain

ROWS = 1_000_000

# 50 actors, 10 queues, 8 statuses (succeeded x3), two tags per job out of 100 and 7,
# an identity key on a third of them, an error class on the failed ones.
_FILL = """
INSERT INTO jobs (id, actor, queue, status, payload, scheduled_at, created_at, updated_at,
                  finished_at, tags, identity_key, error_class)
SELECT gen_random_uuid(), 'actor_' || (g % 50), 'q' || (g % 10),
       (ARRAY['pending','scheduled','running','succeeded','succeeded','succeeded',
              'failed','cancelled'])[1 + g % 8],
       '{}'::jsonb, now() - g * interval '1 second', now() - g * interval '1 second',
       now() - g * interval '1 second',
       CASE WHEN g % 8 >= 3 THEN now() - g * interval '1 second' + interval '5 seconds' END,
       jsonb_build_array('t' || (g % 100), 'c' || (g % 7)),
       CASE WHEN g % 3 = 0 THEN 'id' || (g % 1000) END,
       CASE WHEN g % 8 = 6 THEN 'Err' || (g % 5) END
FROM generate_series(1, :rows) AS g
"""

NOW = datetime.now(UTC)
FILTERS = {
    "everything": JobFilter(),
    "status": JobFilter(status="failed"),
    "statuses": JobFilter(status=["pending", "scheduled"]),
    "rare status": JobFilter(status="abandoned"),
    "actor": JobFilter(actor="actor_7"),
    "rare actor": JobFilter(actor="nobody"),
    "queue": JobFilter(queue="q3"),
    "rare queue": JobFilter(queue="nowhere"),
    "tag": JobFilter(tags=["t7"]),
    "tags all-of": JobFilter(tags=["t7", "c3"]),
    "rare tag": JobFilter(tags=["none-such"]),
    "identity_key": JobFilter(identity_key="id33"),
    "parent_job_id": JobFilter(parent_job_id=uuid.uuid4()),
    "error_class": JobFilter(error_class="Err1"),
    "rare error_class": JobFilter(error_class="NoSuchError"),
    "created range": JobFilter(
        created_after=NOW - timedelta(days=2), created_before=NOW - timedelta(days=1)
    ),
    "finished range": JobFilter(
        finished_after=NOW - timedelta(days=2), finished_before=NOW - timedelta(days=1)
    ),
    "combined": JobFilter(actor="actor_7", status="failed", tags=["t7"]),
}


def _statements() -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for name, flt in FILTERS.items():
        out.append((f"list {name}", q.list_page("postgresql", flt, 51, None)))
        out.append((f"count {name}", q.count_capped("postgresql", flt, 10_000)))
    page_2 = ((NOW - timedelta(days=3)).isoformat(), uuid.uuid4())
    out.append(("list page 2", q.list_page("postgresql", FILTERS["status"], 51, page_2)))
    tagged = JobFilter(tags=["t7"])
    by_actor = JobFilter(actor="actor_7")  # the DML below is explained with literal values
    out.append(("cancel queued batch", q.cancel_queued_batch("postgresql", by_actor, 1000)))
    out.append(("request cancel batch", q.request_cancel_batch("postgresql", by_actor, 1000)))
    out.append(("retry candidates", q.retry_candidates("postgresql", tagged, 1000, after=None)))
    out.append(
        ("purge batch", q.purge_batch_ids("postgresql", timedelta(days=7), ("succeeded",), 1000))
    )
    return out


@pytest.mark.slow
async def test_no_operation_scans_the_whole_jobs_table(
    pg_url: URL, settings: TaskQSettings
) -> None:
    engine = make_engine(pg_url, settings=settings)
    try:
        async with engine.begin() as conn:
            await conn.execute(text(f"SET LOCAL search_path TO {settings.schema_name}"))
            await conn.execute(text(_FILL), {"rows": ROWS})
        async with engine.connect() as conn:
            await conn.execute(text(f"SET search_path TO {settings.schema_name}"))
            await conn.execute(text("ANALYZE jobs"))
            plans = {}
            for name, stmt in _statements():
                assert stmt is not None, name
                if isinstance(stmt, UpdateBase):
                    # EXPLAIN (without ANALYZE) plans the UPDATE and runs nothing.
                    sql = stmt.compile(dialect=conn.dialect, compile_kwargs={"literal_binds": True})
                    explain: Any = text(f"EXPLAIN {sql}")
                else:
                    explain = Explain(stmt)
                plans[name] = list((await conn.execute(explain)).scalars())
            count = (await conn.execute(text("SELECT count(*) FROM jobs"))).scalar_one()
    finally:
        await engine.dispose()
    assert count == ROWS
    scanning = {name: plan for name, plan in plans.items() if any("Seq Scan" in p for p in plan)}
    assert scanning == {}
    # Each plan does read jobs through an index (the test would pass vacuously otherwise).
    for name, plan in plans.items():
        assert any("Index" in p for p in plan), (name, plan)
