"""``tq.jobs`` operations (JobFilter, list, count, detail, cancel_where, retry, purge) on real
Postgres and SQLite, through the async client and the generated ``taskq_sync`` one."""

from __future__ import annotations

import asyncio
import inspect
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pydantic import BaseModel
from sqlalchemy import update
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncEngine

from taskq import actor
from taskq.client import TaskQ
from taskq.db.tables import jobs
from taskq.exceptions import JobNotFoundError, JobNotRetryableError, SingletonCollisionError
from taskq.job_filter import JobFilter
from taskq.ops import CancelResult, JobCount
from taskq.settings import TaskQSettings
from tests.support import ops as s


@dataclass
class Ops:
    """``tq.jobs`` of the async or the blocking client, called the same way."""

    mode: str
    jobs: Any
    engine: AsyncEngine

    async def __call__(self, method: str, *args: Any, **kwargs: Any) -> Any:
        fn: Callable[..., Any] = getattr(self.jobs, method)
        if self.mode == "sync":
            return await asyncio.to_thread(fn, *args, **kwargs)
        result = fn(*args, **kwargs)
        return await result if inspect.isawaitable(result) else result


@pytest.fixture(params=["async", "sync"])
async def ops(
    request: pytest.FixtureRequest,
    engine: AsyncEngine,
    engine_url: str | URL,
    settings: TaskQSettings,
) -> AsyncIterator[Ops]:
    if request.param == "async":
        tq = TaskQ(engine=engine, settings=settings)
        yield Ops("async", tq.jobs, engine)
        await tq.aclose()
        return
    from taskq_sync import TaskQ as SyncTaskQ

    sync_tq = SyncTaskQ(engine_url, settings=settings)
    yield Ops("sync", sync_tq.jobs, engine)
    await asyncio.to_thread(sync_tq.close)


async def ids_of(ops: Ops, flt: JobFilter) -> set[Any]:
    page = await ops("list", flt, limit=1000)
    assert page.next_cursor is None
    count = await ops("count", flt)
    assert count == JobCount(len(page.jobs), False, 10_000)
    return {j.id for j in page.jobs}


async def test_each_filter_selects_exactly_its_jobs(ops: Ops) -> None:
    e = ops.engine
    parent = (await s.seed(e, actor="ops_parent", status="succeeded"))[0]
    a = await s.seed(e, 3, actor="ops_a", tags=["red", "big"], identity_key="cust-1")
    b = await s.seed(e, 2, actor="ops_b", queue="other", tags=["red"], parent_job_id=parent)
    failed = await s.seed(
        e, 2, actor="ops_b", status="failed", error_class="Boom", start=s.BASE + timedelta(hours=1)
    )
    every = {parent, *a, *b, *failed}
    assert await ids_of(ops, JobFilter()) == every
    assert await ids_of(ops, JobFilter(status="pending")) == {*a, *b}
    assert await ids_of(ops, JobFilter(status=["failed", "succeeded"])) == {parent, *failed}
    assert await ids_of(ops, JobFilter(actor="ops_a")) == set(a)
    assert await ids_of(ops, JobFilter(actor=["ops_a", "ops_parent"])) == {parent, *a}
    assert await ids_of(ops, JobFilter(queue="other")) == set(b)
    assert await ids_of(ops, JobFilter(tags=["red"])) == {*a, *b}
    assert await ids_of(ops, JobFilter(tags=["red", "big"])) == set(a)  # all-of
    assert await ids_of(ops, JobFilter(tags=["big", "blue"])) == set()
    assert await ids_of(ops, JobFilter(identity_key="cust-1")) == set(a)
    assert await ids_of(ops, JobFilter(parent_job_id=parent)) == set(b)
    assert await ids_of(ops, JobFilter(error_class="Boom")) == set(failed)
    late = s.BASE + timedelta(minutes=30)
    assert await ids_of(ops, JobFilter(created_after=late)) == set(failed)
    assert await ids_of(ops, JobFilter(created_before=late)) == {parent, *a, *b}
    # finished-time bounds match finished jobs only
    assert await ids_of(ops, JobFilter(finished_before=late)) == {parent}
    assert await ids_of(ops, JobFilter(finished_after=late)) == set(failed)
    assert await ids_of(ops, JobFilter(actor="ops_b", status="pending", tags=["red"])) == set(b)


async def test_waiting_on_filters_on_the_column_or_says_it_is_missing(ops: Ops) -> None:
    if "waiting_on" in jobs.c:
        held = await s.seed(ops.engine, 2, status="scheduled", waiting_on="bucket-a")
        await s.seed(ops.engine, 1, status="scheduled")
        assert await ids_of(ops, JobFilter(waiting_on="bucket-a")) == set(held)
    else:
        with pytest.raises(ValueError, match=r"no jobs\.waiting_on column"):
            await ops("list", JobFilter(waiting_on="bucket-a"))


async def test_list_pages_by_keyset_newest_first(ops: Ops) -> None:
    made = await s.seed(ops.engine, 25)
    seen: list[Any] = []
    after = None
    pages = 0
    while True:
        page = await ops("list", JobFilter(), limit=10, after=after)
        pages += 1
        seen.extend(j.id for j in page.jobs)
        if pages == 1:
            # A job inserted between pages is newer than every one listed: no shift.
            await s.seed(ops.engine, 1, start=s.BASE + timedelta(days=1))
        if page.next_cursor is None:
            break
        after = page.next_cursor
    assert pages == 3
    assert seen == list(reversed(made))
    with pytest.raises(ValueError, match="invalid cursor"):
        await ops("list", JobFilter(), after="not-a-cursor")


class Item(BaseModel):
    n: int


@actor(name="ops_paged_item")
async def paged_item(payload: Item) -> None: ...


async def test_list_pages_jobs_that_share_a_timestamp(ops: Ops) -> None:
    """Enqueued together, jobs share ``created_at`` (one clock reading on Postgres, the
    same millisecond on SQLite): the id breaks the tie and no page repeats or skips one."""
    await ops("enqueue_many", [(paged_item, Item(n=i)) for i in range(40)])
    for i in range(5):
        await ops("enqueue", paged_item, Item(n=100 + i))
    seen: list[Any] = []
    after = None
    while True:
        page = await ops("list", JobFilter(actor="ops_paged_item"), limit=7, after=after)
        seen.extend(j.id for j in page.jobs)
        if page.next_cursor is None:
            break
        after = page.next_cursor
    assert len(seen) == len(set(seen)) == 45
    everything = await ops("list", JobFilter(actor="ops_paged_item"), limit=1000)
    assert seen == [j.id for j in everything.jobs]


async def test_count_stops_at_the_cap(ops: Ops) -> None:
    await s.seed(ops.engine, 30)
    assert await ops("count", JobFilter(), cap=10) == JobCount(10, True, 10)
    assert str(await ops("count", JobFilter(), cap=10)) == "10+"
    assert await ops("count", JobFilter(), cap=30) == JobCount(30, False, 30)
    assert await ops("count", JobFilter(status="failed")) == JobCount(0, False, 10_000)


async def test_detail_has_every_attempt(ops: Ops) -> None:
    [job_id] = await s.seed(ops.engine, status="failed", attempt=2, error_class="Boom")
    await s.add_attempt(ops.engine, job_id, 1, "retried")
    await s.add_attempt(ops.engine, job_id, 2, "failed")
    detail = await ops("detail", job_id)
    assert detail.job.id == job_id
    assert [(a.attempt.attempt, a.attempt.outcome) for a in detail.attempts] == [
        (1, "retried"),
        (2, "failed"),
    ]
    assert detail.attempts[1].traceback is not None
    assert detail.to_json()["attempts"][0]["outcome"] == "retried"
    with pytest.raises(JobNotFoundError):
        await ops("detail", uuid.uuid4())


async def test_cancel_where_cancels_queued_and_asks_running_jobs(ops: Ops) -> None:
    e = ops.engine
    pending = await s.seed(e, 5, tags=["t1"])
    scheduled = await s.seed(e, 2, status="scheduled", tags=["t1"])
    running = await s.seed(e, 3, status="running", tags=["t1"], attempt=1)
    done = await s.seed(e, 2, status="succeeded", tags=["t1"])
    other = await s.seed(e, 2, tags=["t2"])
    before = await s.rows(e)
    progress: list[int] = []
    result = await ops(
        "cancel_where", JobFilter(tags=["t1"]), batch_size=2, on_batch=progress.append
    )
    assert result == CancelResult(cancelled_before_start=7, cancel_requested=3, not_reached=0)
    assert progress == sorted(progress)
    assert progress[-1] == 10
    after = await s.rows(e)
    for job_id in (*pending, *scheduled):
        assert (after[job_id].status, after[job_id].error_class) == (
            "cancelled",
            "CancelledBeforeStart",
        )
        assert after[job_id].finished_at is not None
    for job_id in running:
        assert (after[job_id].status, after[job_id].cancel_phase) == ("running", 1)
        assert after[job_id].cancel_requested_at is not None
    for job_id in (*done, *other):
        assert after[job_id] == before[job_id]
    # Again: nothing left to cancel, the running ones are not stamped twice.
    assert await ops("cancel_where", JobFilter(tags=["t1"])) == CancelResult()
    # A filter on a status that cannot be cancelled changes nothing.
    assert await ops("cancel_where", JobFilter(status="failed")) == CancelResult()


async def test_retry_puts_a_failed_job_back_with_a_fresh_budget(ops: Ops) -> None:
    [job_id] = await s.seed(
        ops.engine, status="failed", attempt=3, budget_used=3, error_class="Boom", error="boom"
    )
    record = await ops("retry", job_id)
    assert record.status == "pending"
    assert (record.budget_used, record.attempt) == (0, 3)
    assert (record.error_class, record.error, record.finished_at) == (None, None, None)
    [entry] = record.metadata["taskq.retries"]
    assert (entry["from_status"], entry["error_class"], entry["after_attempt"]) == (
        "failed",
        "Boom",
        3,
    )
    assert (await ops("detail", job_id)).manual_retries == [entry]


async def test_retry_refuses_what_it_cannot_retry_and_changes_nothing(ops: Ops) -> None:
    [ok] = await s.seed(ops.engine, status="succeeded")
    [active] = await s.seed(ops.engine, status="running")
    before = await s.rows(ops.engine)
    for job_id, status in ((ok, "succeeded"), (active, "running")):
        with pytest.raises(JobNotRetryableError) as info:
            await ops("retry", job_id)
        assert (info.value.job_id, info.value.status) == (job_id, status)
    with pytest.raises(JobNotFoundError):
        await ops("retry", uuid.uuid4())
    assert await s.rows(ops.engine) == before


async def test_retry_where_in_batches_and_singletons_blocked_by_an_active_one(ops: Ops) -> None:
    e = ops.engine
    failed = await s.seed(e, 5, status="failed", actor="ops_r", budget_used=3)
    crashed = await s.seed(e, 2, status="crashed", actor="ops_r")
    cancelled = await s.seed(e, 1, status="cancelled", actor="ops_r")
    ok = await s.seed(e, 2, status="succeeded", actor="ops_r")
    await s.seed(e, 1, status="running", actor="ops_single", singleton=True)
    [blocked] = await s.seed(e, 1, status="failed", actor="ops_single", singleton=True)
    result = await ops(
        "retry_where",
        JobFilter(status=["failed", "crashed", "cancelled", "succeeded"]),
        batch_size=3,
    )
    assert result.retried == 8
    assert result.by_status == {"failed": 5, "crashed": 2, "cancelled": 1}
    assert result.singleton_blocked == [blocked]
    after = await s.rows(e)
    assert {after[i].status for i in (*failed, *crashed, *cancelled)} == {"pending"}
    assert {after[i].budget_used for i in failed} == {0}
    assert {after[i].status for i in ok} == {"succeeded"}
    assert after[blocked].status == "failed"
    with pytest.raises(SingletonCollisionError):
        await ops("retry", blocked)
    assert (await s.rows(e))[blocked].status == "failed"


async def test_purge_deletes_old_finished_jobs_in_batches(ops: Ops) -> None:
    e = ops.engine
    old = await s.seed(e, 7, status="succeeded")
    old_failed = await s.seed(e, 2, status="failed")
    for job_id in old[:2]:
        await s.add_attempt(e, job_id, 1, "succeeded")
    old_active = await s.seed(e, 2, status="pending")
    # finished just now: younger than any older_than below
    recent = await s.seed(e, 2, status="succeeded")
    async with e.begin() as conn:
        await conn.execute(
            update(jobs).where(jobs.c.id.in_(recent)).values(finished_at=datetime.now(UTC))
        )
    progress: list[int] = []
    result = await ops(
        "purge", timedelta(days=1), ("succeeded",), batch_size=3, on_batch=progress.append
    )
    assert (result.deleted, result.batches) == (7, 3)
    assert progress == [3, 6, 7]
    left = await s.rows(e)
    assert set(left) == {*old_failed, *old_active, *recent}
    assert await s.attempts(e) == []
    assert (await ops("purge", timedelta(days=1))).deleted == 2  # every terminal status
    assert set(await s.rows(e)) == {*old_active, *recent}


@pytest.mark.parametrize(
    ("method", "args", "kwargs", "error"),
    [
        ("list", (JobFilter(),), {"limit": 0}, ValueError),
        ("list", (JobFilter(),), {"limit": 1001}, ValueError),
        ("list", ("status=pending",), {}, TypeError),
        ("count", (JobFilter(),), {"cap": 0}, ValueError),
        ("cancel_where", (JobFilter(),), {"batch_size": 0}, ValueError),
        ("purge", (timedelta(days=-1),), {}, ValueError),
        ("purge", (timedelta(days=1), ("pending",)), {}, ValueError),
        ("purge", (timedelta(days=1), ()), {}, ValueError),
        ("purge", (86400,), {}, TypeError),
    ],
)
async def test_bad_arguments_raise_and_change_nothing(
    ops: Ops, method: str, args: tuple[Any, ...], kwargs: dict[str, Any], error: type[Exception]
) -> None:
    await s.seed(ops.engine, 2)
    await s.seed(ops.engine, 2, status="succeeded")
    before = await s.rows(ops.engine)
    with pytest.raises(error):
        await ops(method, *args, **kwargs)
    assert await s.rows(ops.engine) == before


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"status": "done"}, "unknown job status 'done'"),
        ({"status": []}, "is empty"),
        ({"actor": "has space"}, "invalid actor name"),
        ({"queue": "a:b"}, "invalid queue name"),
        ({"created_after": datetime(2026, 1, 1)}, "naive datetime"),
        ({"created_after": s.BASE, "created_before": s.BASE}, "earlier than"),
        ({"parent_job_id": "nope"}, "is not a UUID"),
        ({"tags": [""]}, "1 to 200 characters"),
        ({"waiting_on": "bad name"}, "invalid waiting_on name"),
    ],
)
def test_job_filter_rejects_bad_values(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        JobFilter(**kwargs)
