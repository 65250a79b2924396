# sync twin: tests/integration/test_progress_stream_race_sync.py
"""``JobHandle.progress_stream()`` never skips a ``seq``: the race a loaded machine hit
in the SSE feed (``tests/integration/test_ui.py``), on the client's own stream.

Written against ``taskq``; ``tools/generate_sync.py`` writes its twin,
``test_progress_stream_race_sync.py``, which runs it on ``taskq_sync``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any
from uuid import UUID

import pytest
from redis.asyncio import Redis
from sqlalchemy import update
from sqlalchemy.engine import URL

from taskq.backends.sql import SqlBackend
from taskq.client import JobsClient
from taskq.db.engine import make_engine, transaction
from taskq.db.tables import jobs
from taskq.handle import JobHandle
from taskq.progress import event_message, progress_channel
from taskq.records import JobRecord
from taskq.settings import TaskQSettings
from tests.support.client_actors import Item, double

pytestmark = pytest.mark.integration


class RaceAtTheFirstQuietPoll(SqlBackend):
    """A store whose second read of the job (the stream's first quiet poll, after the
    read that follows the subscription) comes after the worker published seq 4, then
    ended the job and lost its terminal publish."""

    redis: Any = None
    reads = 0

    async def get_job(self, job_id: UUID) -> JobRecord | None:
        self.reads += 1
        if self.reads == 2:
            message = event_message(job_id, 4, "progress", "running", {"percent": 50})
            await self.redis.publish(progress_channel(job_id), message)
            async with transaction(self.engine) as conn:
                await conn.execute(
                    update(jobs)
                    .where(jobs.c.id == job_id)
                    .values(status="succeeded", progress_seq=5, progress={"percent": 100})
                )
        return await super().get_job(job_id)


@pytest.fixture
async def race(
    engine_url: str | URL, settings: TaskQSettings, redis_url: str
) -> AsyncIterator[RaceAtTheFirstQuietPoll]:
    engine = make_engine(engine_url, settings=settings)
    backend = RaceAtTheFirstQuietPoll(engine)
    backend.redis = Redis.from_url(redis_url)
    try:
        yield backend
    finally:
        await backend.redis.aclose()
        await engine.dispose()


async def test_the_stream_yields_what_was_published_before_a_quiet_poll_finds_the_end(
    race: RaceAtTheFirstQuietPoll,
) -> None:
    """The channel is quiet for one poll interval; before the row is re-read the worker
    publishes seq 4, ends the job and its terminal publish is lost. The stream yields 4,
    then the end from the row: never the end alone."""
    queued = await JobsClient(race).enqueue(double, Item(n=1))
    handle: JobHandle[Any] = JobHandle(race, queued.job_id)
    events = [e async for e in handle.progress_stream(race.redis, poll_interval=0.05)]
    assert [(e.seq, e.event) for e in events] == [(4, "progress"), (None, "succeeded")]
    assert events[0].state == {"percent": 50}
    assert events[-1].terminal
    assert events[-1].state == {"percent": 100}
