# sync twin: tests/integration/test_client_api_sync.py
"""The producer API as an application calls it: ``TaskQ``, ``JobsClient`` and ``JobHandle``.

Written against ``taskq``; ``tools/generate_sync.py`` writes its twin,
``test_client_api_sync.py``, which runs the same tests on ``taskq_sync`` with plain
blocking calls (no event loop, no thread).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any
from uuid import uuid4

import pytest
from sqlalchemy.engine import URL

from taskq.client import TaskQ
from taskq.exceptions import JobCancelledError, JobNotFoundError, WaitTimeout
from taskq.handle import JobHandle
from taskq.records import EnqueueArgs
from taskq.settings import TaskQSettings
from tests.support.client_actors import Item, double, unique

pytestmark = pytest.mark.integration


@pytest.fixture
async def tq(engine_url: str | URL, settings: TaskQSettings) -> AsyncIterator[TaskQ]:
    async with TaskQ(engine_url, settings=settings) as tq:
        yield tq


async def test_an_enqueued_job_is_pending_with_its_actors_defaults(tq: TaskQ) -> None:
    handle = await tq.jobs.enqueue(double, Item(n=2))
    record = await handle.refresh()
    assert (record.actor, record.queue, record.priority, record.status) == (
        "client_api_double",
        "client_api",
        4,
        "pending",
    )
    assert record.payload == {"n": 2}
    assert await handle.status() == "pending"
    assert await handle.attempts() == []


async def test_get_finds_the_job_and_an_unknown_id_is_reported(tq: TaskQ) -> None:
    handle = await tq.jobs.enqueue(double, Item(n=3), priority=9)
    found: JobHandle[Any] = await tq.jobs.get(handle.job_id)
    assert (await found.refresh()).priority == 9
    with pytest.raises(JobNotFoundError):
        await tq.jobs.get(uuid4())


async def test_enqueue_many_keeps_each_item_in_its_place(tq: TaskQ) -> None:
    handles = await tq.jobs.enqueue_many(
        [(double, Item(n=1)), EnqueueArgs(double, Item(n=2), {"priority": 7}), (double, Item(n=3))]
    )
    records = [await h.refresh() for h in handles]
    assert [r.payload for r in records] == [{"n": 1}, {"n": 2}, {"n": 3}]
    assert [r.priority for r in records] == [4, 7, 4]


async def test_unique_for_returns_the_existing_job(tq: TaskQ) -> None:
    first = await tq.jobs.enqueue(unique, Item(n=1), identity_key="same")
    again = await tq.jobs.enqueue(unique, Item(n=1), identity_key="same")
    assert (first.was_existing, again.was_existing) == (False, True)
    assert again.job_id == first.job_id


async def test_wait_times_out_on_a_pending_job(tq: TaskQ) -> None:
    handle = await tq.jobs.enqueue(double, Item(n=1))
    with pytest.raises(WaitTimeout):
        await handle.wait(timeout=0.05)
    assert await handle.status() == "pending"


async def test_a_cancelled_job_is_cancelled_and_waiting_on_it_raises(tq: TaskQ) -> None:
    handle = await tq.jobs.enqueue(double, Item(n=1))
    record = await tq.jobs.cancel(handle.job_id)
    assert record.status == "cancelled"
    with pytest.raises(JobCancelledError):
        await handle.wait(timeout=1)


async def test_status_says_what_a_parked_job_waits_on_and_when_it_can_run(tq: TaskQ) -> None:
    """A job a limit parked (as the worker leaves it: ``scheduled``, ``waiting_on`` and
    ``denials`` set) reports that through ``status()``; a job scheduled for later does not."""
    from sqlalchemy import update

    from taskq.db.tables import jobs

    parked = await tq.jobs.enqueue(double, Item(n=1), delay=timedelta(seconds=30))
    later = await tq.jobs.enqueue(double, Item(n=2), delay=timedelta(seconds=30))
    async with tq.engine.begin() as conn:
        await conn.execute(
            update(jobs)
            .where(jobs.c.id == parked.job_id)
            .values(waiting_on="tenant-api:acme", denials=2)
        )
    status = await parked.status()
    record = await parked.refresh()
    assert status == "scheduled"
    assert (status.waiting, status.state) == (True, "waiting")
    assert (status.waiting_on, status.denials) == ("tenant-api:acme", 2)
    assert status.ready_at == record.scheduled_at
    plain = await later.status()
    assert plain == "scheduled"
    assert (plain.waiting, plain.state, plain.waiting_on, plain.ready_at) == (
        False,
        "scheduled",
        None,
        None,
    )
    assert (plain.denials, str(plain)) == (0, "scheduled")
