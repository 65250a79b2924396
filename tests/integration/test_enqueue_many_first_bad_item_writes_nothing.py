"""A large ``enqueue_many`` of ``(actor, payload)`` pairs is streamed: the COPY starts before
the later items are validated, each chunk made while the server inserts the one before.

What streaming must not change: the first bad item is the one raised and nothing is
written (the transaction rolls back, no worker is woken), the connection is usable
afterwards, and batches whose contents are not known up front (options, unknown actors,
capped actors) take the paths they took before; on the async and the sync client.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest
from pydantic import BaseModel
from sqlalchemy.engine import URL

from taskq import TaskQ, actor
from taskq.backends.sql import COPY_MIN_ROWS
from taskq.client import _Items
from taskq.db.queries import copy_rows as copy_queries
from taskq.exceptions import PayloadValidationError
from taskq.records import EnqueueArgs
from taskq.settings import TaskQSettings
from tests.support.pg import count_jobs, libpq, listen, notes_until
from tests.support.producer import first_error

pytestmark = pytest.mark.integration

ROWS = copy_queries.COPY_ROWS_PER_WRITE
FIRST = copy_queries.COPY_FIRST_ROWS
SIZE = 4 * ROWS
assert SIZE >= COPY_MIN_ROWS
STARTS: list[int] = [0, *range(FIRST, SIZE, ROWS)]
"""Where each streamed chunk of a SIZE batch starts: a small first one, then ROWS each."""


def _encoded_before(index: int) -> int:
    """Rows sent before the chunk that holds item ``index`` is made."""
    return max(start for start in STARTS if start <= index)


class Item(BaseModel):
    n: int


class Doubled(BaseModel):
    n: int


@actor(name="stream_a", queue="stream_q")
async def stream_a(payload: Item) -> Doubled:
    return Doubled(n=2 * payload.n)


@actor(name="stream_b", queue="stream_r", priority=2)
async def stream_b(payload: Item) -> None: ...


@contextmanager
def _events(items_class: Any = _Items) -> Iterator[list[tuple[str, int]]]:
    """What happened, in order: ``("make", start)`` for each chunk of requests made
    (by ``items_class``: taskq's or taskq_sync's), ``("encode", rows)`` for each chunk of
    rows encoded for the COPY."""
    events: list[tuple[str, int]] = []
    real_make = items_class.make

    def make(self: Any, start: int, stop: int) -> Any:
        events.append(("make", start))
        return real_make(self, start, stop)

    class Encoder(copy_queries.CopyEncoder):
        def encode(self, requests: Any) -> bytes:
            events.append(("encode", len(requests)))
            return super().encode(requests)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(items_class, "make", make)
        mp.setattr(copy_queries, "CopyEncoder", Encoder)
        yield events


def _items(bad: Mapping[int, object] | None = None) -> list[Any]:
    """SIZE pairs over two actors; mostly model instances, some plain dicts; ``bad``
    replaces the payloads at its indexes."""
    items: list[Any] = []
    for i in range(SIZE):
        ref = stream_a if i % 3 else stream_b
        items.append((ref, {"n": i} if i % 7 == 0 else Item(n=i)))
    for index, payload in (bad or {}).items():
        items[index] = (items[index][0], payload)
    return items


def _stored(url: URL) -> list[tuple[Any, ...]]:
    with psycopg.connect(libpq(url), autocommit=True) as conn:
        return conn.execute(
            "SELECT id, actor, queue, priority, payload->>'n' FROM taskq.jobs "
            "WHERE actor IN ('stream_a', 'stream_b') ORDER BY (payload->>'n')::int"
        ).fetchall()


async def test_each_chunk_is_made_after_the_one_before_was_sent(
    pg_url: URL, settings: TaskQSettings
) -> None:
    async with TaskQ(pg_url, settings=settings) as tq:
        with _events() as events:
            handles = await tq.jobs.enqueue_many(_items())
        expected: list[tuple[str, int]] = []
        for start, stop in zip(STARTS, [*STARTS[1:], SIZE], strict=True):
            expected += [("make", start), ("encode", stop - start)]
        assert events == expected
        rows = _stored(pg_url)
        assert [row[0] for row in rows] == [h.job_id for h in handles]
        for i, (row, handle) in enumerate(zip(rows, handles, strict=True)):
            ref = stream_a if i % 3 else stream_b
            assert row[1:] == (ref.name, ref.queue, ref.priority, str(i))
            assert handle.result_adapter is ref.result_adapter
        for handle in handles[:: ROWS - 1]:
            assert handle.record == await handle.refresh()


@pytest.mark.parametrize("bad_at", [ROWS + 3, SIZE - 1])
async def test_a_bad_item_after_rows_were_sent_writes_nothing_and_wakes_nobody(
    pg_url: URL, settings: TaskQSettings, bad_at: int
) -> None:
    listener = await listen(pg_url, settings.schema_name)
    async with TaskQ(pg_url, settings=settings) as tq:
        with _events() as events, pytest.raises(PayloadValidationError) as caught:
            await tq.jobs.enqueue_many(_items({bad_at: {"n": "first"}, bad_at - 1: Item(n=0)}))
        sent = sum(rows for kind, rows in events if kind == "encode")
        assert sent == _encoded_before(bad_at)  # every chunk before the bad one
        assert first_error(caught.value)["input"] == "first"
        assert count_jobs(pg_url, "stream_a") + count_jobs(pg_url, "stream_b") == 0
        # the held connection is not left in the aborted COPY
        handles = await tq.jobs.enqueue_many([(stream_a, Item(n=i)) for i in range(SIZE)])
        assert handles[-1].record == await handles[-1].refresh()
    seen = await notes_until(listener, "stream_q")
    await listener.close()
    assert seen == ["stream_q"]  # the failed batch's wake-ups were rolled back with it
    assert count_jobs(pg_url, "stream_a") == SIZE


async def test_the_first_bad_item_is_the_one_raised(pg_url: URL, settings: TaskQSettings) -> None:
    async with TaskQ(pg_url, settings=settings) as tq:
        bad = {5: {"n": "early"}, ROWS + 1: {"n": "late"}}
        with pytest.raises(PayloadValidationError) as caught:
            await tq.jobs.enqueue_many(_items(bad))
        assert first_error(caught.value)["input"] == "early"
        bad = {ROWS + 1: {"n": "in chunk two"}, 3 * ROWS: {"n": "in chunk four"}}
        with pytest.raises(PayloadValidationError) as caught:
            await tq.jobs.enqueue_many(_items(bad))
        assert first_error(caught.value)["input"] == "in chunk two"
    assert count_jobs(pg_url, "stream_a") + count_jobs(pg_url, "stream_b") == 0


async def test_an_unknown_actor_is_raised_before_anything_is_sent(
    pg_url: URL, settings: TaskQSettings
) -> None:
    async with TaskQ(pg_url, settings=settings) as tq:
        items = _items()
        items[SIZE - 2] = ("stream_nobody", {"n": 1})
        with _events() as events, pytest.raises(LookupError, match="stream_nobody"):
            await tq.jobs.enqueue_many(items)
        assert events == [("make", 0)]  # made in one go, nothing encoded
        items[SIZE - 2] = ("stream_a", {"n": SIZE - 2})  # by name: streamed too
        with _events() as events:
            handles = await tq.jobs.enqueue_many(items)
        assert events[:2] == [("make", 0), ("encode", FIRST)]
        assert handles[SIZE - 2].result_adapter is stream_a.result_adapter
    assert count_jobs(pg_url, "stream_a") + count_jobs(pg_url, "stream_b") == SIZE


async def test_items_with_options_are_made_first_then_copied(
    pg_url: URL, settings: TaskQSettings
) -> None:
    async with TaskQ(pg_url, settings=settings) as tq:
        items = _items()
        items[7] = EnqueueArgs(stream_b, {"n": 7}, {"queue": "stream_other"})
        with _events() as events:
            handles = await tq.jobs.enqueue_many(items)
        assert events[0] == ("make", 0)
        assert [e for e in events if e[0] == "make"] == [("make", 0)]
        assert sum(rows for kind, rows in events if kind == "encode") == SIZE
        record = await handles[7].refresh()
        assert (record.actor, record.queue) == ("stream_b", "stream_other")
        assert [h.job_id for h in handles] == [row[0] for row in _stored(pg_url)]


async def test_a_capped_actor_is_not_streamed(pg_url: URL, settings: TaskQSettings) -> None:
    async with TaskQ(pg_url, settings=settings) as tq:
        await tq.actors.set("stream_a", max_pending=SIZE)
        with _events() as events:
            await tq.jobs.enqueue_many(_items())
        # made in one go for the transactional path, with its locked count
        assert [e for e in events if e[0] == "make"] == [("make", 0)]
        assert count_jobs(pg_url, "stream_a") + count_jobs(pg_url, "stream_b") == SIZE


def test_the_sync_client_streams_and_rolls_back_a_bad_item(
    pg_url: URL, settings: TaskQSettings
) -> None:
    from taskq_sync import TaskQ as SyncTaskQ
    from taskq_sync.client import _Items as SyncItems

    with SyncTaskQ(pg_url, settings=settings) as tq:
        with _events(SyncItems) as events, pytest.raises(PayloadValidationError):
            tq.jobs.enqueue_many(_items({2 * ROWS + 9: {"n": []}}))
        sent = sum(rows for kind, rows in events if kind == "encode")
        assert sent == _encoded_before(2 * ROWS + 9) > 0
        assert count_jobs(pg_url, "stream_a") + count_jobs(pg_url, "stream_b") == 0
        with _events(SyncItems) as events:
            handles = tq.jobs.enqueue_many(_items())
        assert events[:4] == [("make", 0), ("encode", FIRST), ("make", FIRST), ("encode", ROWS)]
        assert handles[0].record == handles[0].refresh()
    assert [row[0] for row in _stored(pg_url)] == [h.job_id for h in handles]
