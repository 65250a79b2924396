"""COPYs of ``ROW_AT_A_TIME_ROWS`` rows are written row at a time by the server.

The COPY's ``WHERE pg_catalog.random() >= 0`` holds for every row and only changes how
Postgres inserts them (see ``taskq.db.queries.copy_rows.ROW_AT_A_TIME_ROWS``). These
tests pin which batches get it, on every COPY path and both clients, and that the rows
it writes are exactly those of the buffered COPY.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import pytest
from pydantic import BaseModel
from sqlalchemy.engine import URL

from taskq import TaskQ, actor
from taskq.db.queries import copy_rows as cq
from taskq.records import EnqueueArgs
from taskq.settings import TaskQSettings
from tests.integration.test_enqueue_many_pairs_store_the_same_jobs import _stored
from tests.support.pg import count_jobs

pytestmark = pytest.mark.integration


class Row(BaseModel):
    n: int
    text: str = ""


@actor(name="one_by_one", queue="rows_q", priority=2)
async def one_by_one(payload: Row) -> None: ...


@contextmanager
def _copies() -> Iterator[list[str]]:
    """The COPY statements the backends make (each made once per backend and shape)."""
    real = cq.copy_rows_sql
    made: list[str] = []

    def spy(*args: Any, **kwargs: Any) -> str:
        sql = real(*args, **kwargs)
        made.append(sql)
        return sql

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cq, "copy_rows_sql", spy)
        yield made


def _items(size: int, *, later: bool = False) -> list[Any]:
    """``size`` (actor, model) pairs; with ``later``, the first job is scheduled (so the
    batch takes the COPY in a transaction, with a clock reading, not the bulk one)."""
    if not later:
        return [(one_by_one, Row(n=i, text=f"t{i}")) for i in range(size)]
    first: list[Any] = [EnqueueArgs(one_by_one, Row(n=-1), {"delay": timedelta(hours=1)})]
    return first + [(one_by_one, Row(n=i, text=f"t{i}")) for i in range(size - 1)]


def _row_at_a_time(sql: str) -> bool:
    return sql.endswith(" WHERE pg_catalog.random() >= 0")


@pytest.mark.parametrize("later", [False, True], ids=["bulk", "in-transaction"])
async def test_which_copies_are_row_at_a_time(
    pg_url: URL, settings: TaskQSettings, later: bool
) -> None:
    low, high = cq.ROW_AT_A_TIME_ROWS[0], cq.ROW_AT_A_TIME_ROWS[-1]
    sizes = [low - 1, low, 1000, high, high + 1]
    async with TaskQ(pg_url, settings=settings) as tq:
        with _copies() as made:
            for size in sizes:
                handles = await tq.jobs.enqueue_many(_items(size, later=later))
                assert len(handles) == size
    assert [_row_at_a_time(sql) for sql in made] == [False, True]  # one of each, cached
    assert count_jobs(pg_url, "one_by_one") == sum(sizes)


def test_the_sync_facade_makes_the_same_choice(pg_url: URL, settings: TaskQSettings) -> None:
    from taskq_sync import TaskQ as SyncTaskQ

    with SyncTaskQ(pg_url, settings=settings) as tq, _copies() as made:
        tq.jobs.enqueue_many(_items(1000))
        tq.jobs.enqueue_many(_items(cq.ROW_AT_A_TIME_ROWS[-1] + 1))
    assert [_row_at_a_time(sql) for sql in made] == [True, False]
    assert count_jobs(pg_url, "one_by_one") == 1000 + cq.ROW_AT_A_TIME_ROWS[-1] + 1


@pytest.mark.parametrize("later", [False, True], ids=["bulk", "in-transaction"])
async def test_row_at_a_time_stores_what_the_buffered_copy_stores(
    pg_url: URL, settings: TaskQSettings, later: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with TaskQ(pg_url, settings=settings) as tq:
        with _copies() as made:
            one = await tq.jobs.enqueue_many(_items(1000, later=later))
    monkeypatch.setattr(cq, "ROW_AT_A_TIME_ROWS", range(0))
    async with TaskQ(pg_url, settings=settings) as tq:
        with _copies() as buffered_made:
            buffered = await tq.jobs.enqueue_many(_items(1000, later=later))
    assert [_row_at_a_time(sql) for sql in made + buffered_made] == [True, False]
    stored = _stored(pg_url, [h.job_id for h in one])
    assert len(stored) == 1000
    assert stored == _stored(pg_url, [h.job_id for h in buffered])


async def test_a_row_at_a_time_copy_in_the_callers_transaction_commits_and_rolls_back_with_it(
    pg_url: URL, settings: TaskQSettings
) -> None:
    async with TaskQ(pg_url, settings=settings) as tq:
        with _copies() as made:
            async with tq.engine.connect() as conn:
                await conn.begin()
                await tq.jobs.enqueue_many(_items(1000), connection=conn)
                await conn.rollback()
            assert count_jobs(pg_url, "one_by_one") == 0
            async with tq.engine.connect() as conn:
                await conn.begin()
                handles = await tq.jobs.enqueue_many(_items(1000), connection=conn)
                await conn.commit()
        assert [_row_at_a_time(sql) for sql in made] == [True]
        assert await handles[999].status() == "pending"
    assert count_jobs(pg_url, "one_by_one") == 1000
