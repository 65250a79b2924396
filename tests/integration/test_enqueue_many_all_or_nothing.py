"""A large ``enqueue_many`` is all or nothing and writes each job once: the COPY path of a
large plain batch on Postgres (``SqlBackend._enqueue_copy``).

What it must keep from the one-statement path it replaces: records equal to a re-read of
the rows (timestamps from the server's clock, delays rounded as ``make_interval`` rounds),
JSON that round-trips exactly, all-or-nothing batches, one wake-up per queue at commit,
exactly one job per request after a lost connection; on the async and the sync client.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

import psycopg
import pytest
from pydantic import BaseModel
from sqlalchemy.engine import URL
from sqlalchemy.exc import DBAPIError
from structlog.testing import capture_logs

from taskq import TaskQ, actor
from taskq._ids import new_job_id
from taskq.backends import sql as sql_backend
from taskq.backends.sql import COPY_MIN_ROWS, SqlBackend
from taskq.db.queries import copy_rows as copy_queries
from taskq.db.queries.dispatch import notify_channel
from taskq.exceptions import MaxPendingExceededError
from taskq.records import EnqueueArgs, EnqueueRequest, JobRecord
from taskq.settings import TaskQSettings
from tests.support.pg import (
    count_jobs,
    kill_other_backends,
    libpq,
    listen,
    notes_until,
    refusing,
)

pytestmark = pytest.mark.integration

N = COPY_MIN_ROWS  # the smallest batch that takes the COPY path

AWKWARD = [
    "back\\slash",
    "\\N",
    "\\.",
    "\\",
    "tab\there",
    "new\nline",
    "carriage\rreturn",
    "\r\n",
    "quote \" and ' both",
    "unicode: é ß 漢字 🙂 \u200b \u202e",
    "PGCOPY\n\xff\r\n",
    "\x01\x1f\x7f",
    "",
    "x" * 5000,
]


class Doc(BaseModel):
    n: int
    text: str = ""
    items: list[str] = []


@actor(name="copy_plain", queue="copy_a", priority=3)
async def copy_plain(payload: Doc) -> None: ...


def _stored_json(url: URL, job_id: UUID) -> tuple[str, str, str, str | None]:
    """The stored JSON documents of a row, as the server prints them."""
    with psycopg.connect(libpq(url), autocommit=True) as conn:
        row = conn.execute(
            "SELECT payload::text, tags::text, metadata::text, identity_key "
            "FROM taskq.jobs WHERE id = %s",
            [job_id],
        ).fetchone()
    assert row is not None
    return row[0], row[1], row[2], row[3]


@contextmanager
def _copy_calls(module: Any = sql_backend) -> Iterator[list[int]]:
    """Count the COPYs ``module`` (taskq's or taskq_sync's backend) runs, of both kinds:
    in a transaction from a clock reading, or committing on its own."""
    real = module._copy_on_driver
    real_committing = module._copy_committing
    calls: list[int] = []

    def spy(conn: Any, clock: str, params: Any, copy: str, batch: Any) -> Any:
        calls.append(batch.size)
        return real(conn, clock, params, copy, batch)

    def spy_committing(conn: Any, copy: str, done: str, params: Any, rows: Any, **kw: Any) -> Any:
        calls.append(rows.size)
        return real_committing(conn, copy, done, params, rows, **kw)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(module, "_copy_on_driver", spy)
        mp.setattr(module, "_copy_committing", spy_committing)
        yield calls


def _varied(n: int, parent: UUID) -> list[EnqueueRequest]:
    """``n`` plain requests with every option the COPY writes, in every combination."""
    at = datetime(2031, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
    delays = [0.1, 1 / 3, 2.5e-6, 3.5e-6, 1e-7, 12345.6789015, 86400.0 * 365 * 50]
    out = []
    for i in range(n):
        kind = i % 7
        out.append(
            EnqueueRequest(
                job_id=new_job_id(),
                actor="copy_plain",
                queue=f"copy_q{i % 3}",
                payload={"n": i, "text": AWKWARD[i % len(AWKWARD)], "f": 2.5e-5 * i},
                priority=(i % 5) - 2,
                scheduled_at=at + timedelta(microseconds=i) if kind == 1 else None,
                delay_s=delays[i % len(delays)] if kind in (2, 3) else None,
                identity_key=f"id\t{i}\\" if kind == 4 else None,
                tags=("t\\1", f"t{i}") if kind in (3, 4, 5) else (),
                metadata={"k": [1, 2.5, None], "s": AWKWARD[i % len(AWKWARD)]} if kind else {},
                max_attempts=i % 4 or None,
                start_to_close_s=1.5 if i % 2 else None,
                schedule_to_close_s=delays[(i + 3) % len(delays)] if kind in (3, 5, 6) else None,
                trace_context={"traceparent": f"00-{i:032x}-{i:016x}-01"} if kind == 6 else None,
                parent_job_id=parent if kind in (1, 5) else None,
            )
        )
    return out


async def test_copy_records_equal_the_rows_and_the_statement_path(
    pg_url: URL, settings: TaskQSettings
) -> None:
    """Every column the COPY writes is what the one statement writes for the same request,
    timestamps relative to the server's clock reading included, to the microsecond."""
    async with TaskQ(pg_url, settings=settings) as tq:
        backend = tq.backend
        parent = new_job_id()
        requests = _varied(N, parent)
        with _copy_calls() as calls:
            outcomes = await backend.enqueue(requests)
        assert calls == [N]
        twins = [dataclasses.replace(req, job_id=new_job_id()) for req in requests]
        backend.copy_min_rows = len(twins) + 1
        with _copy_calls() as calls:
            statement = await backend.enqueue(twins)
        assert calls == []
        assert len({o.record.created_at for o in outcomes}) == 1
        for req, outcome, twin in zip(requests, outcomes, statement, strict=True):
            stored = await backend.get_job(req.job_id)
            assert outcome.record == stored
            assert outcome.was_existing is False
            assert stored is not None
            other = await backend.get_job(twin.job_id)
            assert other is not None
            assert _relative(stored) == _relative(other)
            assert _stored_json(pg_url, req.job_id) == _stored_json(pg_url, twin.job_id)
            assert stored.payload == req.payload
            assert stored.metadata == req.metadata
            assert stored.tags == list(req.tags)
            assert stored.identity_key == req.identity_key
        kinds = {(r.status, r.deadline_at is not None) for r in (o.record for o in outcomes)}
        assert kinds == {
            ("pending", False),
            ("pending", True),
            ("scheduled", False),
            ("scheduled", True),
        }


def _relative(record: JobRecord) -> tuple[Any, ...]:
    """A record with its timestamps as offsets from its ``created_at`` (the clock reading)."""
    base = record.created_at
    fields = dataclasses.asdict(record)
    fields.pop("id")
    for name in ("scheduled_at", "deadline_at", "updated_at", "created_at"):
        value = fields[name]
        fields[name] = value - base if value is not None else None
    if record.scheduled_at.year == 2031:  # an explicit time is absolute
        fields["scheduled_at"] = record.scheduled_at
    return tuple(sorted(fields.items()))


async def test_client_enqueue_many_takes_the_copy_path(
    pg_url: URL, settings: TaskQSettings
) -> None:
    async with TaskQ(pg_url, settings=settings) as tq:
        items: list[Any] = [
            (copy_plain, Doc(n=i, text=AWKWARD[i % len(AWKWARD)])) for i in range(N - 2)
        ]
        items += [
            EnqueueArgs(copy_plain, {"n": -1}, {"delay": timedelta(seconds=1.5)}),
            EnqueueArgs(
                copy_plain,
                {"n": -2, "items": AWKWARD},
                {"tags": ["a\\b", "c\td"], "metadata": {"m": AWKWARD}, "queue": "copy_b"},
            ),
        ]
        with _copy_calls() as calls:
            handles = await tq.jobs.enqueue_many(items)
        assert calls == [N]
        for handle in handles:
            assert handle.record == await handle.refresh()
        assert handles[-2].record is not None
        assert handles[-2].record.status == "scheduled"
        with _copy_calls() as calls:
            small = await tq.jobs.enqueue_many([(copy_plain, Doc(n=i)) for i in range(N - 1)])
        assert calls == []  # below the threshold: the one statement
        assert len(small) == N - 1
        assert count_jobs(pg_url, "copy_plain") == 2 * N - 1


def test_sync_client_takes_the_copy_path(pg_url: URL, settings: TaskQSettings) -> None:
    from taskq_sync import TaskQ as SyncTaskQ
    from taskq_sync.backends import sql as sync_backend

    with SyncTaskQ(pg_url, settings=settings) as tq:
        items: list[Any] = [(copy_plain, Doc(n=i, text=AWKWARD[i % 5])) for i in range(N)]
        items.append(EnqueueArgs(copy_plain, {"n": 1}, {"schedule_to_close": timedelta(5)}))
        with _copy_calls(sync_backend) as calls:
            handles = tq.jobs.enqueue_many(items)
        assert calls == [N + 1]
        for handle in handles:
            assert handle.record == handle.refresh()
    assert count_jobs(pg_url, "copy_plain") == N + 1


async def test_awkward_json_and_text_round_trip_exactly(
    pg_url: URL, settings: TaskQSettings
) -> None:
    """Binary COPY fields are length-prefixed: every string comes back as it went in."""
    async with TaskQ(pg_url, settings=settings) as tq:
        requests = [
            EnqueueRequest(
                job_id=new_job_id(),
                actor="copy_plain",
                queue="copy_a",
                payload={"text": text, "all": AWKWARD, text: i},
                identity_key=text[:200] or None,
                tags=(text,) if text else (),
                metadata={"m": text, "nested": {text: [text]}},
            )
            for i, text in enumerate(AWKWARD * (N // len(AWKWARD) + 1))
        ]
        with _copy_calls() as calls:
            await tq.backend.enqueue(requests)
        assert calls == [len(requests)]
        for req in requests:
            stored = await tq.backend.get_job(req.job_id)
            assert stored is not None
            assert stored.payload == req.payload
            assert stored.identity_key == req.identity_key
            assert stored.tags == list(req.tags)
            assert stored.metadata == req.metadata


@pytest.mark.parametrize("where", ["payload", "tag", "identity_key"])
async def test_a_nul_character_fails_the_whole_batch_as_the_statement_does(
    pg_url: URL, settings: TaskQSettings, where: str
) -> None:
    """jsonb refuses "\\u0000" and text refuses NUL: a DBAPIError, nothing written, as on the
    one-statement path; the held connection is fine afterwards."""
    async with TaskQ(pg_url, settings=settings) as tq:
        for copy_min_rows in (N, 10**9):  # COPY, then the one statement
            tq.backend.copy_min_rows = copy_min_rows
            requests = [
                EnqueueRequest(
                    job_id=new_job_id(), actor="copy_plain", queue="copy_a", payload={"n": i}
                )
                for i in range(N)
            ]
            bad = requests[N // 2]
            if where == "payload":
                bad.payload = {"text": "nul\x00"}
            elif where == "tag":
                bad.tags = ("nul\x00",)
            else:
                bad.identity_key = "nul\x00"
            with pytest.raises(DBAPIError) as caught:
                await tq.backend.enqueue(requests)
            assert isinstance(caught.value.orig, psycopg.DataError)
            assert caught.value.connection_invalidated is False
            assert count_jobs(pg_url, "copy_plain") == 0
        handles = await tq.jobs.enqueue_many([(copy_plain, Doc(n=i)) for i in range(N)])
        assert len(handles) == N
        assert count_jobs(pg_url, "copy_plain") == N


@contextmanager
def _failing_trigger(url: URL, *, n: int, deferred: bool = False) -> Iterator[None]:
    """Make the insert of the job whose payload ``n`` is ``n`` fail on the server (at the row,
    or at COMMIT with ``deferred``), in this test's database only, for the block."""
    kind = "CONSTRAINT TRIGGER" if deferred else "TRIGGER"
    when = "AFTER INSERT" if deferred else "BEFORE INSERT"
    timing = "DEFERRABLE INITIALLY DEFERRED" if deferred else ""
    with psycopg.connect(libpq(url), autocommit=True) as conn:
        conn.execute(
            "CREATE FUNCTION taskq.copy_test_fail() RETURNS trigger LANGUAGE plpgsql AS $$ "
            f"BEGIN IF (NEW.payload->>'n')::int = {n} THEN "
            "RAISE EXCEPTION 'copy_test_fail' USING ERRCODE = 'check_violation'; END IF; "
            "RETURN NEW; END $$"
        )
        conn.execute(
            f"CREATE {kind} copy_test_fail {when} ON taskq.jobs {timing} "
            "FOR EACH ROW EXECUTE FUNCTION taskq.copy_test_fail()"
        )
        try:
            yield
        finally:
            conn.execute("DROP TRIGGER copy_test_fail ON taskq.jobs")
            conn.execute("DROP FUNCTION taskq.copy_test_fail()")


@pytest.mark.parametrize(
    ("size", "fail_at", "deferred"),
    [
        (N, N // 2, False),  # mid-batch
        (N, N - 1, False),  # the last row, after every buffer was sent
        (N, 0, True),  # at COMMIT
        (6001, 6000, False),  # more than the one statement takes at once
    ],
)
async def test_a_failing_row_writes_nothing_and_wakes_nobody(
    pg_url: URL, settings: TaskQSettings, size: int, fail_at: int, deferred: bool
) -> None:
    listener = await psycopg.AsyncConnection.connect(libpq(pg_url), autocommit=True)
    channel = notify_channel(settings.schema_name)
    await listener.execute(psycopg.sql.SQL("LISTEN {}").format(psycopg.sql.Identifier(channel)))
    async with TaskQ(pg_url, settings=settings) as tq:
        with _failing_trigger(pg_url, n=fail_at, deferred=deferred), _copy_calls() as calls:
            with pytest.raises(DBAPIError) as caught:
                await tq.jobs.enqueue_many(
                    [EnqueueArgs(copy_plain, {"n": i}, {"queue": "copy_bad"}) for i in range(size)]
                )
            assert calls == [size]
        assert isinstance(caught.value.orig, psycopg.errors.CheckViolation)
        assert count_jobs(pg_url, "copy_plain") == 0
        await tq.jobs.enqueue_many(
            [EnqueueArgs(copy_plain, {"n": i}, {"queue": "copy_ok"}) for i in range(N)]
        )
    seen: list[str] = []

    async def until_ok() -> None:
        async for note in listener.notifies():
            seen.append(note.payload)
            if note.payload == "copy_ok":
                return

    await asyncio.wait_for(until_ok(), timeout=5)
    await listener.close()
    assert seen == ["copy_ok"]
    assert count_jobs(pg_url, "copy_plain") == N


async def test_one_notification_per_queue_at_commit(pg_url: URL, settings: TaskQSettings) -> None:
    listener = await psycopg.AsyncConnection.connect(libpq(pg_url), autocommit=True)
    channel = notify_channel(settings.schema_name)
    await listener.execute(psycopg.sql.SQL("LISTEN {}").format(psycopg.sql.Identifier(channel)))
    async with TaskQ(pg_url, settings=settings) as tq:
        with _copy_calls() as calls:
            await tq.jobs.enqueue_many(
                [(copy_plain, Doc(n=i)) for i in range(N)]
                + [EnqueueArgs(copy_plain, {"n": 7}, {"queue": "copy_c"})]
                + [EnqueueArgs(copy_plain, {"n": 8}, {"delay": timedelta(hours=1)})]
            )
        assert calls == [N + 2]
    seen: list[str] = []

    async def collect() -> None:
        async for note in listener.notifies():
            assert note.channel == channel
            seen.append(note.payload)
            if len(seen) == 2:
                return

    await asyncio.wait_for(collect(), timeout=5)
    await asyncio.sleep(0.2)  # nothing else arrives: one per distinct queue
    await listener.close()
    assert sorted(seen) == ["copy_a", "copy_c"]


async def test_copy_survives_a_dead_held_connection(pg_url: URL, settings: TaskQSettings) -> None:
    async with TaskQ(pg_url, settings=settings) as tq:
        await tq.jobs.enqueue_many([(copy_plain, Doc(n=i)) for i in range(N)])  # caps cached
        assert kill_other_backends(pg_url) >= 1
        with capture_logs() as logs, _copy_calls() as calls:
            handles = await tq.jobs.enqueue_many([(copy_plain, Doc(n=i)) for i in range(N)])
        assert calls == [N]
        assert [e["event"] for e in logs] == ["enqueue_retry_after_disconnect"]
        assert [await h.status() for h in handles[:3]] == ["pending"] * 3
        for handle in handles:
            assert handle.record == await handle.refresh()
        assert count_jobs(pg_url, "copy_plain") == 2 * N


async def test_a_connection_found_dead_before_the_copy_copies_on_a_fresh_one(
    pg_url: URL, settings: TaskQSettings
) -> None:
    """Dead at the stored-cap read (nothing sent yet): the same COPY, once, elsewhere."""
    async with TaskQ(pg_url, settings=settings) as tq:
        await tq.jobs.enqueue_many([(copy_plain, Doc(n=i)) for i in range(N)])
        tq.backend._stored_cap.clear()  # the next enqueue reads the caps first
        assert kill_other_backends(pg_url) >= 1
        with capture_logs() as logs, _copy_calls() as calls:
            handles = await tq.jobs.enqueue_many([(copy_plain, Doc(n=i)) for i in range(N)])
        assert calls == [N]
        assert [e["event"] for e in logs] == ["enqueue_retry_after_disconnect"]
        assert handles[0].record == await handles[0].refresh()
    assert count_jobs(pg_url, "copy_plain") == 2 * N


def test_sync_copy_survives_a_dead_held_connection(pg_url: URL, settings: TaskQSettings) -> None:
    from taskq_sync import TaskQ as SyncTaskQ
    from taskq_sync.backends import sql as sync_backend

    with SyncTaskQ(pg_url, settings=settings) as tq:
        tq.jobs.enqueue_many([(copy_plain, Doc(n=i)) for i in range(N)])
        assert kill_other_backends(pg_url) >= 1
        with capture_logs() as logs, _copy_calls(sync_backend) as calls:
            handles = tq.jobs.enqueue_many([(copy_plain, Doc(n=i)) for i in range(N)])
        assert calls == [N]
        assert [e["event"] for e in logs] == ["enqueue_retry_after_disconnect"]
        assert handles[-1].record == handles[-1].refresh()
    assert count_jobs(pg_url, "copy_plain") == 2 * N


def _dead(sql: str) -> DBAPIError:
    return DBAPIError(
        sql,
        None,
        psycopg.OperationalError("server closed the connection unexpectedly"),
        connection_invalidated=True,
    )


def _lose_copies(monkeypatch: pytest.MonkeyPatch, before_commit: bool) -> None:
    """Both kinds of COPY (``_copy_on_driver``, ``_copy_committing``) find their connection
    dead before they run, or after they committed."""
    real = sql_backend._copy_on_driver
    real_committing = sql_backend._copy_committing

    async def copy(conn: Any, clock: str, params: Any, sql: str, requests: Any) -> Any:
        if not before_commit:
            await real(conn, clock, params, sql, requests)
        raise _dead(sql)

    async def committing(conn: Any, sql: str, done: str, params: Any, rows: Any, **kw: Any) -> Any:
        if not before_commit:
            await real_committing(conn, sql, done, params, rows, **kw)
        raise _dead(sql)

    monkeypatch.setattr(sql_backend, "_copy_on_driver", copy)
    monkeypatch.setattr(sql_backend, "_copy_committing", committing)


@pytest.mark.parametrize("bulk", [False, True], ids=["transaction", "committing"])
@pytest.mark.parametrize("before_commit", [True, False])
async def test_retry_after_a_lost_copy_writes_each_job_once(
    pg_url: URL,
    settings: TaskQSettings,
    monkeypatch: pytest.MonkeyPatch,
    before_commit: bool,
    bulk: bool,
) -> None:
    """The last item, delayed, makes the batch one for a COPY in a transaction; without
    it, all pairs that run now, the COPY commits on its own. Lost either way, before or
    after the commit: each job exactly once."""
    _lose_copies(monkeypatch, before_commit)
    statements: list[str] = []
    real_sql = SqlBackend._plain_sql

    def plain_sql(self: SqlBackend, conn: Any, *, skip_existing: bool) -> str:
        sql = real_sql(self, conn, skip_existing=skip_existing)
        statements.append(sql)
        return sql

    monkeypatch.setattr(SqlBackend, "_plain_sql", plain_sql)
    async with TaskQ(pg_url, settings=settings) as tq:
        size = 5000 + N  # the retry takes two statements, in one transaction
        last: Any = (copy_plain, Doc(n=1))
        if not bulk:
            last = EnqueueArgs(copy_plain, {"n": 1}, {"delay": timedelta(seconds=5)})
        handles = await tq.jobs.enqueue_many(
            [(copy_plain, Doc(n=i)) for i in range(size - 1)] + [last]
        )
        assert len(statements) == 1
        assert "ON CONFLICT (id) DO NOTHING" in statements[0]
        assert count_jobs(pg_url, "copy_plain") == size
        for handle in [*handles[:: N // 4], handles[-1]]:
            assert handle.record == await handle.refresh()
            assert handle.was_existing is False
        assert handles[-1].record is not None
        assert handles[-1].record.status == ("pending" if bulk else "scheduled")


async def test_a_failed_retry_is_raised(
    pg_url: URL, settings: TaskQSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    _lose_copies(monkeypatch, before_commit=True)
    monkeypatch.setattr(
        SqlBackend, "_plain_sql", lambda self, conn, skip_existing: "SELEC %(rows)s, %(channel)s"
    )
    async with TaskQ(pg_url, settings=settings) as tq:
        with pytest.raises(DBAPIError) as caught:
            await tq.jobs.enqueue_many([(copy_plain, Doc(n=i)) for i in range(N)])
        assert isinstance(caught.value.orig, psycopg.errors.SyntaxError)
    assert count_jobs(pg_url, "copy_plain") == 0


async def test_a_capped_actor_takes_the_transactional_path(
    pg_url: URL, settings: TaskQSettings
) -> None:
    async with TaskQ(pg_url, settings=settings) as tq:
        await tq.actors.set("copy_plain", max_pending=N + 10)
        with _copy_calls() as calls:
            with pytest.raises(MaxPendingExceededError):
                await tq.jobs.enqueue_many([(copy_plain, Doc(n=i)) for i in range(N + 11)])
            assert count_jobs(pg_url, "copy_plain") == 0
            handles = await tq.jobs.enqueue_many([(copy_plain, Doc(n=i)) for i in range(N + 10)])
        assert calls == []
        assert len(handles) == N + 10


async def test_a_timestamp_out_of_python_range_falls_back(
    pg_url: URL, settings: TaskQSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A deadline of 9,000 years cannot be computed client-side: the COPY is abandoned (with
    nothing written) and the one statement does what it always did."""
    fallbacks: list[int] = []
    real = SqlBackend._enqueue_plain

    async def plain(self: SqlBackend, requests: Any) -> Any:
        fallbacks.append(len(requests))
        return await real(self, requests)

    monkeypatch.setattr(SqlBackend, "_enqueue_plain", plain)
    async with TaskQ(pg_url, settings=settings) as tq:
        requests = [
            EnqueueRequest(job_id=new_job_id(), actor="copy_plain", queue="copy_a", payload={})
            for _ in range(N)
        ]
        requests[-1].schedule_to_close_s = 86400.0 * 365 * 9000
        # the statement path's own failure, after its insert:
        with _copy_calls() as calls, pytest.raises(ValueError):
            await tq.backend.enqueue(requests)
        assert calls == [N]
        assert fallbacks == [N]


async def test_every_timestamp_derives_from_the_server_clock_reading(
    pg_url: URL, settings: TaskQSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rows' created_at/updated_at/scheduled_at/deadline_at are the reading of the clock
    statement (here made to read a fixed instant) plus the delays, never the client's clock."""
    reading = datetime(2001, 2, 3, 4, 5, 6, 789012, tzinfo=UTC)
    real = copy_queries.copy_clock_sql

    def fixed_clock(dialect: Any) -> str:
        sql = real(dialect)
        assert sql.count("clock_timestamp()") == 1
        return sql.replace("clock_timestamp()", f"'{reading.isoformat()}'::timestamptz")

    monkeypatch.setattr(copy_queries, "copy_clock_sql", fixed_clock)
    async with TaskQ(pg_url, settings=settings) as tq:
        with _copy_calls() as calls:
            handles = await tq.jobs.enqueue_many(
                [(copy_plain, Doc(n=i)) for i in range(N - 1)]
                + [
                    EnqueueArgs(
                        copy_plain,
                        {"n": 1},
                        {"delay": timedelta(seconds=90), "schedule_to_close": timedelta(hours=2)},
                    )
                ]
            )
        assert calls == [N]
        for handle in handles:
            assert handle.record == await handle.refresh()
        first, last = handles[0].record, handles[-1].record
        assert first is not None
        assert last is not None
        assert first.created_at == first.updated_at == first.scheduled_at == reading
        assert last.created_at == reading
        assert last.scheduled_at == reading + timedelta(seconds=90)
        assert last.deadline_at == reading + timedelta(hours=2)


@pytest.mark.parametrize("bulk", [True, False], ids=["models", "dicts"])
@pytest.mark.parametrize("after_chunks", [1, 3])
async def test_a_cancelled_copy_writes_nothing_and_the_next_enqueue_works(
    pg_url: URL,
    settings: TaskQSettings,
    monkeypatch: pytest.MonkeyPatch,
    after_chunks: int,
    bulk: bool,
) -> None:
    """Cancelled mid-COPY (between two buffers): the COPY is aborted and rolled back, the
    connection is not reused in an unknown state. Model payloads take the bulk encoding,
    dict payloads (validated one by one) the per-request one."""
    sent = asyncio.Event()
    encoded: list[int] = []

    class Encoder(copy_queries.CopyEncoder):
        def encode(self, requests: Any) -> bytes:
            self._count(len(requests))
            return super().encode(requests)

        def encode_bulk(self, ids: Any, documents: Any, tails: Any) -> bytes:
            self._count(len(ids))
            return super().encode_bulk(ids, documents, tails)

        def _count(self, rows: int) -> None:
            encoded.append(rows)
            if len(encoded) == after_chunks + 1:
                sent.set()

    monkeypatch.setattr(copy_queries, "CopyEncoder", Encoder)
    async with TaskQ(pg_url, settings=settings) as tq:
        task = asyncio.create_task(
            tq.jobs.enqueue_many(
                [(copy_plain, Doc(n=i) if bulk else {"n": i}) for i in range(4000)]
            )
        )
        await sent.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert count_jobs(pg_url, "copy_plain") == 0
        handles = await tq.jobs.enqueue_many([(copy_plain, Doc(n=i)) for i in range(N)])
        assert handles[0].record == await handles[0].refresh()
    assert count_jobs(pg_url, "copy_plain") == N


# --- COPY inside a transaction: the caller's (connection=) or the backend's own -----------


@actor(name="copy_unique", unique_for=timedelta(minutes=5))
async def copy_unique(payload: Doc) -> None: ...


@contextmanager
def _chunk_calls() -> Iterator[list[int]]:
    """Count the rows of each COPY of any path (each makes one ``CopyEncoder``)."""
    calls: list[int] = []

    class Encoder(copy_queries.CopyEncoder):
        def __init__(self, now: datetime, *, extras: bool = True) -> None:
            super().__init__(now, extras=extras)
            calls.append(0)

        def encode(self, requests: Any) -> bytes:
            calls[-1] += len(requests)
            return super().encode(requests)

        def encode_bulk(self, ids: Any, documents: Any, tails: Any) -> bytes:
            calls[-1] += len(ids)
            return super().encode_bulk(ids, documents, tails)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(copy_queries, "CopyEncoder", Encoder)
        yield calls


async def test_copy_in_the_callers_transaction_commits_and_rolls_back_with_it(
    pg_url: URL, settings: TaskQSettings
) -> None:
    listener = await listen(pg_url, settings.schema_name)
    async with TaskQ(pg_url, settings=settings) as tq:
        items = [EnqueueArgs(copy_plain, {"n": i}, {"queue": "copy_tx"}) for i in range(N)]
        day = timedelta(days=1)
        with _chunk_calls() as calls:
            async with tq.engine.connect() as conn:
                request = await conn.begin()
                await tq.jobs.enqueue_many(items, connection=conn)
                await request.rollback()
            assert count_jobs(pg_url, "copy_plain") == 0
            async with tq.engine.connect() as conn:
                request = await conn.begin()
                handles = await tq.jobs.enqueue_many(
                    [*items, EnqueueArgs(copy_plain, {"n": 1}, {"queue": "copy_tx", "delay": day})],
                    connection=conn,
                )
                assert count_jobs(pg_url, "copy_plain") == 0  # not before the caller commits
                await request.commit()
        assert calls == [N, N + 1]
        assert count_jobs(pg_url, "copy_plain") == N + 1
        for handle in handles:
            assert handle.record == await handle.refresh()
        await tq.jobs.enqueue(copy_plain, Doc(n=0), queue="copy_end")
    assert await notes_until(listener, until="copy_end") == ["copy_tx", "copy_end"]
    await listener.close()


async def test_copy_on_a_connection_that_had_not_begun_is_committed_by_its_commit(
    pg_url: URL, settings: TaskQSettings
) -> None:
    """The stored caps are cached, so the COPY may be the first thing the caller's connection
    runs: it begins the transaction as SQLAlchemy would, and ``commit()`` commits it."""
    async with TaskQ(pg_url, settings=settings) as tq:
        await tq.jobs.enqueue(copy_plain, Doc(n=0))  # caches the stored cap
        with _chunk_calls() as calls:
            async with tq.engine.connect() as conn:
                await tq.jobs.enqueue_many(
                    [(copy_plain, Doc(n=i)) for i in range(N)], connection=conn
                )
                assert conn.in_transaction()
                await conn.commit()
        assert calls == [N]
    assert count_jobs(pg_url, "copy_plain") == N + 1


async def test_a_failed_copy_in_the_callers_transaction_leaves_it_to_roll_back(
    pg_url: URL, settings: TaskQSettings
) -> None:
    async with TaskQ(pg_url, settings=settings) as tq:
        items: list[Any] = [(copy_plain, Doc(n=i)) for i in range(N)]
        items[N // 2] = (copy_plain, Doc(n=-1, text="refused"))
        with _chunk_calls() as calls, refusing(pg_url, "refused"):
            async with tq.engine.connect() as conn:
                request = await conn.begin()
                with pytest.raises(DBAPIError) as caught:
                    await tq.jobs.enqueue_many(items, connection=conn)
                assert isinstance(caught.value.orig, psycopg.errors.CheckViolation)
                await request.rollback()
        assert calls == [N]
    assert count_jobs(pg_url, "copy_plain") == 0


async def test_an_autocommit_callers_connection_gets_the_statement(
    pg_url: URL, settings: TaskQSettings
) -> None:
    async with TaskQ(pg_url, settings=settings) as tq:
        engine = tq.engine.execution_options(isolation_level="AUTOCOMMIT")
        with _chunk_calls() as calls:
            async with engine.connect() as conn:
                handles = await tq.jobs.enqueue_many(
                    [(copy_plain, Doc(n=i)) for i in range(N)], connection=conn
                )
        assert calls == []
        assert handles[0].record == await handles[0].refresh()
    assert count_jobs(pg_url, "copy_plain") == N


async def test_a_mixed_batch_copies_its_plain_items_in_the_backends_transaction(
    pg_url: URL, settings: TaskQSettings
) -> None:
    """One checked item sends the whole batch down the transactional path; its plain items
    are still one COPY, in that transaction, and all or nothing with the checked one."""
    async with TaskQ(pg_url, settings=settings) as tq:
        first = await tq.jobs.enqueue(copy_unique, Doc(n=0), identity_key="k")
        items: list[Any] = [(copy_plain, Doc(n=i)) for i in range(N)]
        items.append(EnqueueArgs(copy_unique, {"n": 1}, {"identity_key": "k"}))
        with _chunk_calls() as calls:
            handles = await tq.jobs.enqueue_many(items)
        assert calls == [N]
        assert handles[-1].job_id == first.job_id
        assert handles[-1].was_existing is True
        for handle in handles[:-1]:
            assert handle.was_existing is False
            assert handle.record == await handle.refresh()
        with _failing_trigger(pg_url, n=2), _chunk_calls() as calls:
            items[-1] = EnqueueArgs(copy_unique, {"n": 2}, {"identity_key": "other"})
            with pytest.raises(DBAPIError):
                await tq.jobs.enqueue_many(items)
        assert calls == [N]
    assert count_jobs(pg_url, "copy_plain") == N
    assert count_jobs(pg_url, "copy_unique") == 1


def test_sync_copy_in_the_callers_transaction(pg_url: URL, settings: TaskQSettings) -> None:
    from taskq_sync import TaskQ as SyncTaskQ

    with SyncTaskQ(pg_url, settings=settings) as tq:
        items = [(copy_plain, Doc(n=i, text=AWKWARD[i % 5])) for i in range(N)]
        with _chunk_calls() as calls:
            with tq.engine.connect() as conn:
                request = conn.begin()
                tq.jobs.enqueue_many(items, connection=conn)
                request.rollback()
            assert count_jobs(pg_url, "copy_plain") == 0
            with tq.engine.begin() as conn:
                handles = tq.jobs.enqueue_many(items, connection=conn)
        assert calls == [N, N]
        for handle in handles:
            assert handle.record == handle.refresh()
    assert count_jobs(pg_url, "copy_plain") == N
