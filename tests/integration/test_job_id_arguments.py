"""The operations layer's job-id arguments without a sync twin (the admin UI's reads)
take a UUID or its string and refuse anything else naming the argument."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy.engine import URL

from taskq.client import TaskQ
from taskq.ops.progress_sse import ProgressFeed
from taskq.ops.stats import StatsClient
from taskq.settings import TaskQSettings
from tests.support.client_actors import Item, double

pytestmark = pytest.mark.integration


async def test_progress_and_children_take_a_uuid_string(
    engine_url: str | URL, settings: TaskQSettings
) -> None:
    async with TaskQ(engine_url, settings=settings) as tq:
        handle = await tq.jobs.enqueue(double, Item(n=1))
        stats = StatsClient(tq.engine)
        text_id = str(handle.job_id)
        snap = await stats.progress(text_id)
        assert snap is not None
        assert (snap.job_id, snap.status) == (handle.job_id, "pending")
        assert await stats.children(text_id) == ([], False)
        assert (await ProgressFeed(stats).snapshot(text_id)).job_id == handle.job_id


@pytest.mark.parametrize(
    ("bad", "error"), [("nope", ValueError), (7, TypeError), (None, TypeError)]
)
async def test_progress_and_children_refuse_what_is_not_a_job_id(
    engine_url: str | URL, settings: TaskQSettings, bad: Any, error: type[Exception]
) -> None:
    async with TaskQ(engine_url, settings=settings) as tq:
        stats = StatsClient(tq.engine)
        for call in (stats.progress, stats.children, ProgressFeed(stats).snapshot):
            with pytest.raises(error, match="job_id"):
                await call(bad)
