"""A call cancelled inside a SQLite write transaction gives the write lock back at once.

A task cancelled while aiosqlite runs one of its statements (a caller's
``asyncio.timeout`` around ``enqueue``, ``handle.cancel()`` or a SQL rate-limit acquire;
the worker cancelling a job that awaits one) makes SQLAlchemy invalidate the connection
and close it without closing the statement's cursor, a row-returning statement's rows
unread. ``sqlite3`` (Python 3.11+) then keeps the closed connection alive, with its
``BEGIN IMMEDIATE`` transaction and the database's write lock, until the garbage
collector frees that cursor: every other writer waited out the busy timeout (30 s) or
failed with "database is locked". ``install_sqlite_hooks`` now closes the cursor and
rolls the transaction back on the connection's own thread before the close
(``taskq.db.dialect``).

The cancellation tests hold a write mid-statement in a SQLite function (:class:`Gate`)
that waits on an event, cancel the call while it is held, let the statement finish, and
then need a second writer on another connection to commit within a short busy timeout
(2 s, so the old behaviour fails in 2 s rather than 30), and nothing of the cancelled
write to be visible. The last test closes a connection with a result unread on the
blocking engine.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel
from sqlalchemy import event, func, select, text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine

from taskq import TaskQ, actor
from taskq._compat import aiosqlite as compat_aiosqlite
from taskq._compat import sqlalchemy as compat_sqlalchemy
from taskq.db import dialect, tables
from taskq.db.engine import make_engine, transaction
from taskq.handle import JobHandle
from taskq.ratelimit import TokenBucket
from taskq.settings import TaskQSettings
from taskq_sync.db.engine import make_engine as make_sync_engine

_GATE = "taskq_test_gate"
_HOLD_BOUND_S = 15.0
"""The longest the gate holds a statement (a test that never releases it fails, not hangs)."""
_STEP_BOUND_S = 10.0
"""The longest a test waits for any one step that should be immediate."""
_SECOND_WRITER_BUSY_MS = 2000
"""The second writer's busy timeout: a write lock leaked by the cancelled call fails it."""


class Note(BaseModel):
    n: int


@actor(name="sqlite_cancel_note")
async def sqlite_cancel_note(payload: Note) -> None: ...


class Gate:
    """The SQLite function ``taskq_test_gate()``: once armed, it holds the statement calling it.

    It runs on the connection's aiosqlite thread, inside the statement and so inside its
    ``BEGIN IMMEDIATE`` transaction, with the write lock held. :attr:`entered` (set from
    that thread) says a statement is held; :attr:`release` lets it finish. It holds one
    statement per arming.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.armed = threading.Event()
        self.entered = asyncio.Event()
        self.release = threading.Event()
        self.invalidated = False
        """SQLAlchemy invalidated a connection of the engine (its answer to a cancellation)."""

    def __call__(self) -> int:
        if self.armed.is_set():
            self.armed.clear()
            self._loop.call_soon_threadsafe(self.entered.set)
            self.release.wait(_HOLD_BOUND_S)
        return 0

    def install(self, engine: AsyncEngine, triggers: Sequence[tuple[str, str]] = ()) -> None:
        """Register the function on every connection of ``engine``, and a TEMP trigger
        calling it after each ``(operation, table)`` (TEMP: only this engine's statements
        reach the gate; a second engine on the file writes the same tables freely).

        The gate opens when SQLAlchemy invalidates a connection of ``engine``: that is how
        it handles a task cancelled mid-statement, so the held statement ends only after
        the cancellation reached the call, never before.
        """

        @event.listens_for(engine.sync_engine, "connect")
        def _on_connect(dbapi_connection: Any, _record: Any) -> None:
            dbapi_connection.create_function(_GATE, 0, self)
            cursor = dbapi_connection.cursor()
            for i, (operation, table) in enumerate(triggers):
                cursor.execute(
                    f"CREATE TEMP TRIGGER {_GATE}_{i} AFTER {operation} ON {table} "
                    f"BEGIN SELECT {_GATE}(); END"
                )
            cursor.close()

        @event.listens_for(engine.sync_engine, "invalidate")
        def _on_invalidate(_dbapi_connection: Any, _record: Any, _exc: Any) -> None:
            self.invalidated = True
            self.release.set()


@dataclass
class Files:
    """The test's SQLite file and the engines on it."""

    url: str
    settings: TaskQSettings
    gated: AsyncEngine
    """Where the cancelled calls run (its connections carry the gate)."""
    other: AsyncEngine
    """The second writer's engine, with a short busy timeout."""

    @property
    def path(self) -> str:
        database = make_url(self.url).database
        assert database is not None
        return database


@pytest.fixture
async def files(sqlite_url: str, settings: TaskQSettings) -> AsyncIterator[Files]:
    gated = make_engine(sqlite_url, settings=settings)
    short = settings.model_copy(update={"sqlite_busy_timeout_ms": _SECOND_WRITER_BUSY_MS})
    other = make_engine(sqlite_url, settings=short)
    yield Files(sqlite_url, settings, gated, other)
    await gated.dispose()
    await other.dispose()


async def _second_writer_commits(files: Files) -> None:
    """A job enqueued through the other engine commits (within its 2 s busy timeout)."""
    tq = TaskQ(engine=files.other, settings=files.settings)
    try:
        async with asyncio.timeout(_STEP_BOUND_S):
            handle = await tq.jobs.enqueue(sqlite_cancel_note, Note(n=2))
    finally:
        await tq.aclose()
    assert handle.record is not None
    assert handle.record.status == "pending"


async def _cancel_by_timeout_while_held(gate: Gate, call: Callable[[], Awaitable[object]]) -> None:
    """Run ``call`` under the caller's ``asyncio.timeout`` and make the timeout expire while
    the gate holds the call's statement; the call must end in ``TimeoutError``, the
    cancellation having reached it mid-statement (SQLAlchemy invalidated its connection,
    which let the statement finish)."""
    loop = asyncio.get_running_loop()
    deadlines: list[asyncio.Timeout] = []

    async def under_timeout() -> None:
        async with asyncio.timeout(None) as deadline:
            deadlines.append(deadline)
            await call()

    gate.armed.set()
    task = asyncio.create_task(under_timeout())
    try:
        await asyncio.wait_for(gate.entered.wait(), _STEP_BOUND_S)
        deadlines[0].reschedule(loop.time())  # the caller's timeout expires now
        done, _ = await asyncio.wait({task}, timeout=_STEP_BOUND_S)
    finally:
        gate.release.set()
    assert done, "the cancelled call did not end"
    assert gate.invalidated, "the cancellation did not reach the call mid-statement"
    with pytest.raises(TimeoutError):
        task.result()


async def _count(files: Files, stmt: Any) -> int:
    async with transaction(files.other, readonly=True) as conn:
        return int((await conn.execute(stmt)).scalar_one())


async def test_an_enqueue_cancelled_by_the_callers_timeout_releases_the_write_lock(
    files: Files,
) -> None:
    gate = Gate(asyncio.get_running_loop())
    gate.install(files.gated, [("INSERT", tables.jobs.name)])
    tq = TaskQ(engine=files.gated, settings=files.settings)
    try:
        # Held after the INSERT of the job row, inside the enqueue's BEGIN IMMEDIATE.
        await _cancel_by_timeout_while_held(
            gate, lambda: tq.jobs.enqueue(sqlite_cancel_note, Note(n=1))
        )
        await _second_writer_commits(files)
    finally:
        await tq.aclose()
    # The cancelled enqueue's row was rolled back: only the second writer's job exists.
    assert await _count(files, select(func.count()).select_from(tables.jobs)) == 1


async def test_a_job_cancel_cancelled_by_the_callers_timeout_releases_the_write_lock(
    files: Files,
) -> None:
    gate = Gate(asyncio.get_running_loop())
    gate.install(files.gated, [("UPDATE", tables.jobs.name)])
    tq = TaskQ(engine=files.gated, settings=files.settings)
    try:
        handle: JobHandle[Any] = await tq.jobs.enqueue(sqlite_cancel_note, Note(n=1))
        await _cancel_by_timeout_while_held(gate, handle.cancel)
        await _second_writer_commits(files)
    finally:
        await tq.aclose()
    # The cancelled cancel's UPDATE was rolled back: the job is still pending.
    status = select(func.count()).where(
        tables.jobs.c.id == handle.job_id, tables.jobs.c.status == "pending"
    )
    assert await _count(files, status) == 1


async def test_a_sql_rate_limit_acquire_cancelled_mid_transaction_releases_the_write_lock(
    files: Files, unique_name: str
) -> None:
    # The job's view of a worker's FORCING cancel: the acquire awaits the SQLite store.
    gate = Gate(asyncio.get_running_loop())
    bucket_table = tables.rate_limit_buckets.name
    gate.install(files.gated, [("INSERT", bucket_table), ("UPDATE", bucket_table)])
    bucket = TokenBucket(unique_name, capacity=5, refill_per_second=1, backend="postgres")
    await _cancel_by_timeout_while_held(
        gate, lambda: bucket.acquire(pg_pool=files.gated, settings=files.settings)
    )
    await _second_writer_commits(files)
    # The bucket row the cancelled acquire wrote was rolled back (the file had none).
    assert await _count(files, select(func.count()).select_from(tables.rate_limit_buckets)) == 0


@pytest.mark.parametrize("compat", [True, False], ids=["compat", "public-fallback"])
async def test_a_raw_write_transaction_cancelled_mid_statement_releases_the_write_lock(
    files: Files, unique_name: str, monkeypatch: pytest.MonkeyPatch, compat: bool
) -> None:
    # public-fallback: a library version taskq._compat does not know. The rollback and the
    # cursor close then go through the public, waiting calls (after the held statement).
    monkeypatch.setattr(compat_aiosqlite, "SUPPORTED", compat)
    monkeypatch.setattr(compat_sqlalchemy, "SUPPORTED", compat)
    public: list[object] = []
    original = dialect._roll_back_driver

    async def spy(driver: Any) -> None:
        public.append(driver)
        await original(driver)

    monkeypatch.setattr(dialect, "_roll_back_driver", spy)
    gate = Gate(asyncio.get_running_loop())
    gate.install(files.gated)

    async def write() -> None:
        async with files.gated.begin() as conn:
            await conn.execute(tables.queues.insert().values(name=unique_name, mode="fifo"))
            await conn.execute(text(f"SELECT {_GATE}()"))  # held here, the row written

    gate.armed.set()
    task = asyncio.create_task(write())
    try:
        await asyncio.wait_for(gate.entered.wait(), _STEP_BOUND_S)
        task.cancel()  # abandons aiosqlite's future at once: the result is never read
    finally:
        gate.release.set()
    done, _ = await asyncio.wait({task}, timeout=_STEP_BOUND_S)
    assert done, "the cancelled write did not end"
    assert task.cancelled()
    # A writer outside SQLAlchemy altogether gets the lock within its busy timeout.
    other = await asyncio.to_thread(
        sqlite3.connect,
        files.path,
        timeout=_SECOND_WRITER_BUSY_MS / 1000,
        isolation_level=None,
        check_same_thread=False,
    )
    try:
        await asyncio.to_thread(other.execute, "BEGIN IMMEDIATE")
        await asyncio.to_thread(other.execute, "COMMIT")
    finally:
        other.close()
    await _second_writer_commits(files)
    rows = select(func.count()).where(tables.queues.c.name == unique_name)
    assert await _count(files, rows) == 0
    # The cancelled statement's cursor was closed too, so its connection really closed
    # (``task`` still references that cursor through its traceback): once the engines
    # close theirs, the last connection out checkpoints and removes the WAL file.
    await files.gated.dispose()
    await files.other.dispose()
    assert not await asyncio.to_thread(Path(f"{files.path}-wal").exists)
    assert bool(public) is not compat  # the fallback ran exactly where it should


def test_the_blocking_engine_releases_the_write_lock_of_an_invalidated_connection(
    sqlite_url: str, settings: TaskQSettings, unique_name: str
) -> None:
    # The blocking facade's pysqlite engine has no cancellation, but the same close: the
    # pool closes a connection (here invalidated) whose cursor is still referenced, an
    # INSERT ... RETURNING not yet read, and sqlite3 kept its transaction open with it.
    engine = make_sync_engine(sqlite_url, settings=settings)
    database = make_url(sqlite_url).database
    assert database is not None
    other = sqlite3.connect(database, timeout=_SECOND_WRITER_BUSY_MS / 1000, isolation_level=None)
    try:
        with engine.connect() as conn:
            conn.begin()
            result = conn.execute(
                tables.queues.insert()
                .values(name=unique_name, mode="fifo")
                .returning(tables.queues.c.name)
            )
            conn.invalidate()
            other.execute("BEGIN IMMEDIATE")
            found = other.execute(
                "SELECT count(*) FROM queues WHERE name = ?", (unique_name,)
            ).fetchone()
            other.execute("COMMIT")
            del result
        assert found == (0,)
    finally:
        other.close()
        engine.dispose()
