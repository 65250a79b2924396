"""Redis down under the progress publisher: one line per state change, not one per event."""

from __future__ import annotations

import asyncio
import socket
from uuid import uuid4

import structlog
from sqlalchemy.ext.asyncio import AsyncEngine

from taskq.worker.claimed import ClaimedJob
from taskq.worker.progress import Progress
from taskq.worker.state import RunningJob
from tests.e2e.apps import basic


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_a_redis_outage_logs_once_and_counts_the_dropped_events(engine: AsyncEngine) -> None:
    progress = Progress(
        engine,
        uuid4(),
        max_bytes=8192,
        redis_url=f"redis://127.0.0.1:{_closed_port()}/0",
        cooldown_s=600.0,
    )
    jobs = [
        RunningJob(
            claimed=ClaimedJob(
                id=uuid4(), actor=basic.record.name, queue="default", payload={}, attempt=1
            ),
            ref=basic.record,
            worker_id=uuid4(),
        )
        for _ in range(20)
    ]
    try:
        with structlog.testing.capture_logs() as lines:
            for step in range(10):
                for job in jobs:
                    await progress.sink(job)(step=str(step))
                    await asyncio.sleep(0)
            for _ in range(200):  # let every job's publisher drain its queue
                if not progress._publishing:
                    break
                await asyncio.sleep(0.01)
        events = [line["event"] for line in lines if "progress-publish" in line["event"]]
        assert events == ["worker-progress-publish-down"]
        totals = progress.outage.totals
        # At most one publish per job was in flight when Redis first failed; every
        # later event was dropped without waiting on Redis.
        assert totals["failures"] <= len(jobs)
        # (Waiting progress updates coalesce, so not every one reaches the publisher.)
        assert totals["dropped"] >= len(jobs)
    finally:
        await progress.close()
