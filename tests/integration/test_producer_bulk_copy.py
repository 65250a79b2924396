"""The bulk COPY of an ``enqueue_many`` of ``(actor, model)`` pairs on Postgres.

Such a batch is held column by column (``BulkRows``) and written as ids, payloads and
each actor's shared fields. It must store exactly what the per-request COPY stores for
the same jobs, give records equal to a re-read of the rows and handles typed by each
job's actor, and write nothing when a payload cannot be serialised; on the async and
the sync client.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any
from uuid import UUID

import psycopg
import pytest
from pydantic import BaseModel
from pydantic_core import PydanticSerializationError
from sqlalchemy.engine import URL

from taskq import RetryPolicy, TaskQ, actor
from taskq.backends import sql as sql_backend
from taskq.backends.sql import COPY_MIN_ROWS
from taskq.records import JobRecord
from taskq.settings import TaskQSettings
from tests.support.pg import count_jobs, libpq, listen, notes_until

pytestmark = pytest.mark.integration

N = COPY_MIN_ROWS + 60  # a small first chunk, then full ones
TEXTS = ["back\\slash", "\\N", "tab\there", "new\nline", "é 漢字 🙂", "quote \" '", ""]


class Doc(BaseModel):
    n: int
    text: str = ""
    items: list[str] = []


class Loose(BaseModel):
    n: int
    extra: Any = None


class Out(BaseModel):
    n: int


@actor(name="bulk_one", queue="bulk_q1", priority=4, start_to_close=timedelta(seconds=9))
async def bulk_one(payload: Doc) -> Out:
    return Out(n=payload.n)


@actor(name="bulk_two", queue="bulk_q2", retry=RetryPolicy(max_attempts=3))
async def bulk_two(payload: Doc) -> None: ...


@actor(name="bulk_loose", queue="bulk_bad")
async def bulk_loose(payload: Loose) -> None: ...


@contextmanager
def _bulk_writes(module: Any = sql_backend) -> Iterator[list[int]]:
    """The size of each batch ``module`` (taskq's or taskq_sync's backend) wrote in bulk."""
    real = module._write_bulk
    sizes: list[int] = []

    def spy(copy: Any, rows: Any, encoder: Any, now: Any) -> Any:
        sizes.append(rows.size)
        return real(copy, rows, encoder, now)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(module, "_write_bulk", spy)
        yield sizes


def _pairs(dicts: bool = False) -> list[Any]:
    """N pairs over two actors (one in three of ``bulk_two``), as models or as dicts."""
    out: list[Any] = []
    for i in range(N):
        doc = Doc(n=i, text=TEXTS[i % len(TEXTS)], items=TEXTS[: i % 4])
        out.append((bulk_two if i % 3 == 2 else bulk_one, doc.model_dump() if dicts else doc))
    return out


def _stored(url: URL, ids: list[UUID]) -> list[tuple[Any, ...]]:
    """Every column of the rows, in ``ids`` order, with JSON as the server prints it and
    timestamps relative to ``created_at`` (the trace context only as set or not: each
    enqueue has its own span when a test installed an SDK)."""
    with psycopg.connect(libpq(url), autocommit=True) as conn:
        rows = conn.execute(
            "SELECT actor, queue, status, priority, max_attempts, start_to_close_s, "
            "schedule_to_close_s, payload::text, tags::text, metadata::text, trace_context IS NULL, "
            "identity_key, parent_job_id, scheduled_at - created_at, updated_at - created_at, "
            "deadline_at, attempt, cancel_phase FROM taskq.jobs "
            "WHERE id = ANY(%s) ORDER BY array_position(%s, id)",
            [ids, ids],
        ).fetchall()
    return [tuple(row) for row in rows]


async def test_a_bulk_batch_stores_what_the_per_request_copy_stores(
    pg_url: URL, settings: TaskQSettings
) -> None:
    async with TaskQ(pg_url, settings=settings) as tq:
        with _bulk_writes() as sizes:
            bulk = await tq.jobs.enqueue_many(_pairs())
            validated = await tq.jobs.enqueue_many(_pairs(dicts=True))  # one by one
        assert sizes == [N]
        assert _stored(pg_url, [h.job_id for h in bulk]) == _stored(
            pg_url, [h.job_id for h in validated]
        )
        readings = set()
        for i, handle in enumerate(bulk):
            ref = bulk_two if i % 3 == 2 else bulk_one
            assert handle.result_adapter is ref.result_adapter
            assert not handle.was_existing
            assert not handle.deduplicated_onto_terminal
            assert isinstance(handle.record, JobRecord)
            assert handle.record == await handle.refresh()
            readings.add(handle.record.created_at)
        assert len(readings) == 1
    ids = [h.job_id for h in bulk]
    assert len(set(ids)) == N
    assert ids == sorted(ids)  # time-ordered


async def test_bulk_handles_wait_for_their_typed_results(
    pg_url: URL, settings: TaskQSettings
) -> None:
    """A bulk handle is a full handle: status, cancel, and a result typed by its actor."""
    async with TaskQ(pg_url, settings=settings) as tq:
        handles = await tq.jobs.enqueue_many(_pairs())
        first, second = handles[0], handles[2]
        assert await first.status() == "pending"
        cancelled = await second.cancel()
        assert cancelled.status == "cancelled"
        assert second.record == cancelled
        async with tq.engine.begin() as conn:
            await conn.exec_driver_sql(
                "UPDATE taskq.jobs SET status = 'succeeded', result = '{\"n\": 41}' "
                "WHERE id = %(id)s",
                {"id": first.job_id},
            )
        assert await first.wait(timeout=5) == Out(n=41)


async def test_a_payload_that_cannot_be_serialised_writes_nothing_and_wakes_nobody(
    pg_url: URL, settings: TaskQSettings
) -> None:
    """Found while the rows before it are already sent: the COPY is aborted."""
    listener = await listen(pg_url, settings.schema_name)
    items: list[Any] = [(bulk_loose, Loose(n=i)) for i in range(N)]
    items[N - 5] = (bulk_loose, Loose(n=-1, extra=object()))
    async with TaskQ(pg_url, settings=settings) as tq:
        with _bulk_writes() as sizes, pytest.raises(PydanticSerializationError):
            await tq.jobs.enqueue_many(items)
        assert sizes == [N]
        assert count_jobs(pg_url, "bulk_loose") == 0
        items[N - 5] = (bulk_loose, Loose(n=-1, extra="fine"))
        handles = await tq.jobs.enqueue_many(items)
    assert await notes_until(listener, "bulk_bad") == ["bulk_bad"]
    await listener.close()
    assert count_jobs(pg_url, "bulk_loose") == N
    record = handles[N - 5].record
    assert record is not None
    assert record.payload == {"n": -1, "extra": "fine"}


async def test_a_subclass_payload_is_validated_one_by_one(
    pg_url: URL, settings: TaskQSettings
) -> None:
    """Only instances of exactly the actor's model skip validation: a subclass instance
    (which may carry more fields) sends the batch down the per-request path."""

    class MoreDoc(Doc):
        secret: str = "not stored"

    items: list[Any] = [(bulk_one, Doc(n=i)) for i in range(N)]
    items[7] = (bulk_one, MoreDoc(n=7))
    async with TaskQ(pg_url, settings=settings) as tq:
        with _bulk_writes() as sizes:
            handles = await tq.jobs.enqueue_many(items)
        record = await handles[7].refresh()
    assert sizes == []
    assert record.payload == {"n": 7, "text": "", "items": []}


def test_the_sync_client_writes_bulk_batches(pg_url: URL, settings: TaskQSettings) -> None:
    from taskq_sync import TaskQ as SyncTaskQ
    from taskq_sync.backends import sql as sync_backend

    with SyncTaskQ(pg_url, settings=settings) as tq:
        with _bulk_writes(sync_backend) as sizes:
            bulk = tq.jobs.enqueue_many(_pairs())
            validated = tq.jobs.enqueue_many(_pairs(dicts=True))
        assert sizes == [N]
        for handle in bulk[::50]:
            assert handle.record == handle.refresh()
    assert _stored(pg_url, [h.job_id for h in bulk]) == _stored(
        pg_url, [h.job_id for h in validated]
    )
