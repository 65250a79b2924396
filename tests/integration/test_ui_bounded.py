"""The admin UI's bounded reads give the figures their pages promise: batched capped
counts equal one count per key, actor statistics are exact within their sample and
estimated (and marked) past it, the throughput chart counts every finish of its window,
and the actors page shows an estimate as one."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from taskq.actor_config_ops import ActorsClient
from taskq.ops.results import JobCount
from taskq.ops.stats import StatsClient
from taskq.settings import TaskQSettings
from tests.support import ops as s
from tests.support.ui import settings_with, ui_client

pytestmark = pytest.mark.integration


async def test_batched_active_counts_equal_one_count_per_key(engine: AsyncEngine) -> None:
    await s.seed(engine, 3, actor="a1", queue="qa", status="pending")
    await s.seed(engine, 1, actor="a1", queue="qa", status="running")
    await s.seed(engine, 2, actor="a2", queue="qb", status="scheduled")
    await s.seed(engine, 4, actor="a2", queue="qb", status="succeeded")
    stats = StatsClient(engine)
    active = ("pending", "scheduled", "running")
    keys = [
        (("pending",), "qa", None),
        (("running",), "qa", None),
        (("scheduled",), "qb", None),
        (("pending",), "nowhere", None),
        (active, None, "a1"),
        (active, None, "a2"),
        (active, None, "nobody"),
    ]
    counts = await stats.active_counts(keys, cap=3)
    assert counts == [
        JobCount(3, False, 3),
        JobCount(1, False, 3),
        JobCount(2, False, 3),
        JobCount(0, False, 3),
        JobCount(3, True, 3),  # 4 active: past the cap
        JobCount(2, False, 3),
        JobCount(0, False, 3),
    ]
    singles = [await stats.active_count(st, queue=q, actor=a, cap=3) for st, q, a in keys]
    assert singles == counts


async def test_actor_statistics_exact_in_the_sample_and_estimated_past_it(
    engine: AsyncEngine,
) -> None:
    now = datetime.now(UTC)
    # 12 finishes a minute apart over the last 12 minutes (each ran 5 s), the newest failed.
    start = now - timedelta(minutes=12)
    await s.seed(
        engine,
        11,
        actor="busy",
        status="succeeded",
        start=start,
        step=timedelta(minutes=1),
        started_at=start,
    )
    await s.seed(
        engine,
        1,
        actor="busy",
        status="failed",
        error_class="Boom",
        start=now - timedelta(minutes=1),
    )
    stats = StatsClient(engine)
    exact = await stats.actors_stats(timedelta(hours=1), ["busy", "idle"], per_actor=100)
    assert set(exact) == {"busy"}  # no finish, no row
    busy = exact["busy"]
    assert (busy.completed, busy.failures, busy.last_error_class) == (12, 1, "Boom")
    assert (busy.estimated, busy.sampled, busy.sample_size) == (False, False, 12)
    sampled = (await stats.actors_stats(timedelta(hours=1), ["busy"], per_actor=4))["busy"]
    assert (sampled.estimated, sampled.sampled, sampled.sample_size) == (True, True, 4)
    # The newest 4 finished over about the last 4 minutes: about 60 in the hour.
    assert 40 <= sampled.completed <= 80
    assert sampled.last_error_class == "Boom"
    assert sampled.failures == round(sampled.completed / 4)


async def test_throughput_counts_every_finish_of_the_hour(engine: AsyncEngine) -> None:
    now = datetime.now(UTC)
    await s.seed(engine, 30, status="succeeded", start=now - timedelta(minutes=50))
    await s.seed(engine, 5, status="failed", start=now - timedelta(minutes=20))
    await s.seed(engine, 7, status="succeeded", start=now - timedelta(hours=3))
    chart = await StatsClient(engine).throughput(timedelta(hours=1), 12)
    assert (chart.total, chart.total_failed, chart.sampled) == (35, 5, False)
    assert len(chart.succeeded) == 12


async def test_actors_page_marks_estimated_counts(
    engine: AsyncEngine, settings: TaskQSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    import taskq.ops.stats as stats_module

    monkeypatch.setattr(stats_module, "ACTOR_SAMPLE", 3)
    monkeypatch.setattr(stats_module, "ACTOR_SAMPLE_MIN", 1)
    now = datetime.now(UTC)
    await s.seed(engine, 6, actor="sampled", status="succeeded", start=now - timedelta(minutes=30))
    await s.seed(engine, 2, actor="exact", status="succeeded", start=now - timedelta(minutes=30))
    await ActorsClient(engine).set("sampled", queue="default")
    await ActorsClient(engine).set("exact", queue="default")
    async with ui_client(engine, settings_with(settings)) as ui:
        page = await ui.get("/actors?window=1h")
    assert page.status_code == 200
    assert "newest 3 finishes in the window" in page.text
    sampled = page.text.split('data-actor="sampled"', 1)[1].split("</tr>", 1)[0]
    exact = page.text.split('data-actor="exact"', 1)[1].split("</tr>", 1)[0]
    assert "≈" in sampled
    assert "≈" not in exact
    assert ">2<" in exact


async def test_workers_page_lists_live_workers_and_the_newest_stopped_ones(
    engine: AsyncEngine, settings: TaskQSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    import uuid

    from sqlalchemy import insert

    import taskq.ui.pages as pages
    from taskq.db.tables import workers

    monkeypatch.setattr(pages, "STOPPED_SHOWN", 2)
    base = datetime.now(UTC) - timedelta(hours=1)
    rows = [
        {
            "id": uuid.uuid4(),
            "hostname": f"host-{n}",
            "pid": 100 + n,
            "queues": ["default"],
            "concurrency": 5,
            "status": "running" if n == 0 else "stopped",
            "started_at": base + timedelta(minutes=n),
            "last_heartbeat_at": base + timedelta(minutes=n),
        }
        for n in range(5)
    ]
    async with engine.begin() as conn:
        await conn.execute(insert(workers), rows)
    await s.seed(engine, 2, status="running", locked_by=rows[0]["id"])
    async with ui_client(engine, settings) as ui:
        live = await ui.get("/workers")
        everyone = await ui.get("/workers?stopped=1")
    assert [h for h in ("host-0", "host-1", "host-4") if h in live.text] == ["host-0"]
    shown = [f"host-{n}" for n in range(5) if f"host-{n}</td>" in everyone.text]
    assert shown == ["host-0", "host-3", "host-4"]  # live, then the newest 2 stopped
    assert "the newest 2 stopped workers are listed" in everyone.text
    row = live.text.split("host-0</td>", 1)[1].split("</tr>", 1)[0]
    assert "<td>5</td><td>running</td><td>2</td>" in row  # concurrency, status, running jobs
