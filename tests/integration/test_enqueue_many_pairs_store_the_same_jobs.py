"""The bulk COPY of an ``enqueue_many`` of ``(actor, model)`` pairs on Postgres.

Such a batch is held column by column (``BulkRows``) and written as ids, payloads and
each actor's shared fields. It must store exactly what the per-request COPY stores for
the same jobs, give records equal to a re-read of the rows and handles typed by each
job's actor, and write nothing when a payload cannot be serialised; on the async and
the sync client.
"""

from __future__ import annotations

from collections.abc import Iterator, MutableMapping
from contextlib import contextmanager
from datetime import timedelta
from typing import Any
from uuid import UUID

import psycopg
import pytest
from pydantic import BaseModel
from pydantic_core import PydanticSerializationError
from sqlalchemy.engine import URL
from structlog.testing import capture_logs

from taskq import RetryPolicy, TaskQ, actor
from taskq.backends import sql as sql_backend
from taskq.backends.sql import COPY_MIN_ROWS
from taskq.handle import JobHandles
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

    def spy(copy: Any, rows: Any, encoder: Any) -> Any:
        sizes.append(rows.size)
        return real(copy, rows, encoder)

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


async def test_bulk_handles_are_a_sequence_made_as_it_is_read(
    pg_url: URL, settings: TaskQSettings
) -> None:
    """The handles of a bulk batch: one per item, in order, each made on first read and
    then the same object; the jobs they name are the rows written; a list is a list away."""
    async with TaskQ(pg_url, settings=settings) as tq:
        handles = await tq.jobs.enqueue_many(_pairs())
        assert isinstance(handles, JobHandles)
        assert len(handles) == N
        assert handles[-1] is handles[N - 1] is handles[N - 1 :][0]
        as_list = list(handles)
        assert as_list == [handles[i] for i in range(N)]
        assert count_jobs(pg_url, "bulk_one") + count_jobs(pg_url, "bulk_two") >= N
        stored = _stored(pg_url, [h.job_id for h in as_list])
        assert [row[0] for row in stored] == [
            "bulk_two" if i % 3 == 2 else "bulk_one" for i in range(N)
        ]
        with pytest.raises(IndexError):
            handles[N]
        small = await tq.jobs.enqueue_many([(bulk_one, Doc(n=1))])  # not a COPY: a list
        assert isinstance(small, list)


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
    from taskq_sync.handle import JobHandles as SyncJobHandles

    with SyncTaskQ(pg_url, settings=settings) as tq:
        with _bulk_writes(sync_backend) as sizes:
            bulk = tq.jobs.enqueue_many(_pairs())
            validated = tq.jobs.enqueue_many(_pairs(dicts=True))
        assert sizes == [N]
        assert isinstance(bulk, SyncJobHandles)
        assert bulk[3] is bulk[3]
        for handle in bulk[::50]:
            assert handle.record == handle.refresh()
    assert _stored(pg_url, [h.job_id for h in bulk]) == _stored(
        pg_url, [h.job_id for h in validated]
    )


@contextmanager
def _copy_kinds(module: Any = sql_backend) -> Iterator[list[str]]:
    """The kind of each COPY ``module`` runs: ``committing`` (on its own, timestamps from
    the server's defaults) or ``transaction`` (BEGIN, a clock reading, COPY, COMMIT)."""
    kinds: list[str] = []
    real, real_committing = module._copy_on_driver, module._copy_committing

    def transaction(*args: Any) -> Any:
        kinds.append("transaction")
        return real(*args)

    def committing(*args: Any, **kwargs: Any) -> Any:
        kinds.append("committing")
        return real_committing(*args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(module, "_copy_on_driver", transaction)
        mp.setattr(module, "_copy_committing", committing)
        yield kinds


def _times(url: URL, ids: list[UUID]) -> set[tuple[Any, ...]]:
    """The distinct (created_at, updated_at, scheduled_at, status, deadline_at) of rows."""
    with psycopg.connect(libpq(url), autocommit=True) as conn:
        rows = conn.execute(
            "SELECT created_at, updated_at, scheduled_at, status, deadline_at "
            "FROM taskq.jobs WHERE id = ANY(%s)",
            [ids],
        ).fetchall()
    assert len(rows) == len(ids)
    return {tuple(row) for row in rows}


async def test_a_batch_that_runs_now_is_one_copy_committing_on_its_own(
    pg_url: URL, settings: TaskQSettings
) -> None:
    """No clock reading before it: every row takes the transaction's timestamp from the
    column defaults, the records carry that reading (read back), and each queue is woken."""
    listener = await listen(pg_url, settings.schema_name)
    async with TaskQ(pg_url, settings=settings) as tq:
        with _copy_kinds() as kinds:
            handles = await tq.jobs.enqueue_many(_pairs())
        assert kinds == ["committing"]
        [(created, updated, scheduled, status, deadline)] = _times(
            pg_url, [h.job_id for h in handles]
        )
        assert created == updated == scheduled
        assert (status, deadline) == ("pending", None)
        for handle in handles[::40]:
            assert handle.record is not None
            assert handle.record.created_at == created
            assert handle.record == await handle.refresh()
        await tq.jobs.enqueue(bulk_one, Doc(n=0), queue="bulk_end")
    notes = await notes_until(listener, "bulk_end")
    await listener.close()
    assert sorted(notes[:2]) == ["bulk_q1", "bulk_q2"]


@contextmanager
def _without_scheduled_default(url: URL) -> Iterator[None]:
    """The ``jobs`` table as before migration 0002 (no default for ``scheduled_at``)."""
    alter = "ALTER TABLE taskq.jobs ALTER COLUMN scheduled_at {} DEFAULT"
    with psycopg.connect(libpq(url), autocommit=True) as admin:
        admin.execute(alter.format("DROP"))
        try:
            yield
        finally:
            admin.execute(alter.format("SET") + " CURRENT_TIMESTAMP")


def _bulk_jobs(url: URL) -> int:
    return count_jobs(url, "bulk_one") + count_jobs(url, "bulk_two")


def _fell_back_once(kinds: list[str], logs: list[MutableMapping[str, Any]]) -> None:
    """The first batch tried the committing COPY, which wrote nothing, then the
    transaction; the second went straight to the transaction; one warning said so."""
    assert kinds == ["committing", "transaction", "transaction"]
    assert [e["event"] for e in logs if e["log_level"] == "warning"] == [
        "enqueue_copy_without_defaults"
    ]


async def test_without_the_scheduled_at_default_a_batch_takes_the_transaction(
    pg_url: URL, settings: TaskQSettings
) -> None:
    """A schema before migration 0002: the COPY that leaves ``scheduled_at`` to a default
    fails and writes nothing, and the same batch is written in a transaction instead."""
    before = _bulk_jobs(pg_url)
    with _without_scheduled_default(pg_url), capture_logs() as logs:
        async with TaskQ(pg_url, settings=settings) as tq:
            with _copy_kinds() as kinds:
                first = await tq.jobs.enqueue_many(_pairs())
                second = await tq.jobs.enqueue_many(_pairs())
            for handle in (first[0], first[-1], second[-1]):
                assert handle.record == await handle.refresh()
    _fell_back_once(kinds, logs)
    assert _bulk_jobs(pg_url) - before == 2 * N


def test_the_sync_client_without_the_default_takes_the_transaction(
    pg_url: URL, settings: TaskQSettings
) -> None:
    from taskq_sync import TaskQ as SyncTaskQ
    from taskq_sync.backends import sql as sync_backend

    before = _bulk_jobs(pg_url)
    with (
        _without_scheduled_default(pg_url),
        capture_logs() as logs,
        SyncTaskQ(pg_url, settings=settings) as tq,
    ):
        with _copy_kinds(sync_backend) as kinds:
            first = tq.jobs.enqueue_many(_pairs())
            second = tq.jobs.enqueue_many(_pairs())
        for handle in (first[0], first[-1], second[-1]):
            assert handle.record == handle.refresh()
    _fell_back_once(kinds, logs)
    assert _bulk_jobs(pg_url) - before == 2 * N
