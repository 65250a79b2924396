"""The teardown ends the background loops between two rounds, never inside one (but
cancels one still busy when the termination grace runs out).

On SQLite a loop task cancelled while aiosqlite runs a row-returning statement inside
``BEGIN IMMEDIATE`` (the heartbeat's leader renewal, an ``INSERT ... RETURNING``) leaves
the write lock held by its closed connection until the garbage collector frees the
cursor: the leader release and the ``stopped`` write of the teardown then waited for the
busy timeout (30 s), and ``running_worker`` gave up on the worker (a flaky
``test_the_leader_reports_each_queues_depth[sqlite]``).
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from sqlalchemy import event, select, text
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncEngine

from taskq.db.engine import make_engine, transaction
from taskq.db.tables import leader_leases, workers
from taskq.settings import TaskQSettings
from taskq.worker.run import Worker
from taskq.worker.shutdown import Phase
from tests.e2e.apps import basic
from tests.support.workers import worker_settings

_GATE = "taskq_test_gate"


class Gate:
    """A SQLite function that holds the statement calling it, in aiosqlite's thread."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.open = threading.Event()
        self.passed = 0

    def __call__(self) -> int:
        self.entered.set()
        self.open.wait(10)  # bounded, so a regression fails instead of hanging
        self.passed += 1
        return 0

    def install(self, engine: AsyncEngine) -> None:
        @event.listens_for(engine.sync_engine, "connect")
        def _on_connect(dbapi_connection: Any, _record: Any) -> None:
            dbapi_connection.create_function(_GATE, 0, self)


async def test_a_leader_renewal_in_flight_at_shutdown_commits_before_the_teardown_writes(
    sqlite_url: str, settings: TaskQSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every renewal of the leader lease (the upsert's UPDATE; taking it is an INSERT)
    # stops in the gate, inside the heartbeat's BEGIN IMMEDIATE, until the shutdown
    # reaches RELEASING: the heartbeat is then inside its round when the teardown
    # begins, awaiting aiosqlite, with the write lock held (nothing yields between
    # RELEASING and the teardown when no job runs, so the gate opens in the very step
    # the teardown begins in). A short busy timeout makes a teardown write that queues
    # behind a leaked write lock fail in 1 s, not 30.
    s = worker_settings(sqlite_url, sqlite_busy_timeout_ms=1000)
    admin = make_engine(sqlite_url, settings=settings)
    async with admin.begin() as conn:
        await conn.execute(
            text(
                f"CREATE TRIGGER {_GATE} AFTER UPDATE ON {leader_leases.name} "
                f"BEGIN SELECT {_GATE}(); END"
            )
        )
    engine = make_engine(sqlite_url, settings=s)
    gate = Gate()
    gate.install(engine)
    worker = Worker(settings=s, actors=basic.registry, engine=engine, hard_exit=False)
    enter = worker.state.enter

    def enter_and_open_the_gate(phase: Phase) -> None:
        enter(phase)
        if phase is Phase.RELEASING:
            gate.open.set()

    monkeypatch.setattr(worker.state, "enter", enter_and_open_the_gate)
    task = asyncio.ensure_future(worker.run())
    try:
        assert await asyncio.to_thread(gate.entered.wait, 20), "no leader renewal began"
        worker.state.signal("test-exit")
        assert await asyncio.wait_for(task, 30) == 0
        async with transaction(admin, readonly=True) as conn:
            status = (
                await conn.execute(select(workers.c.status).where(workers.c.id == worker.worker_id))
            ).scalar_one()
            leases = (await conn.execute(select(leader_leases.c.holder))).scalars().all()
        # One renewal was held and then ran to its commit; the teardown's own writes
        # then got the write lock: the lease is given up and the worker row is stopped.
        # (Cancelled mid-statement, the renewal's closed connection kept the lock, and
        # both writes failed with "database is locked".)
        assert gate.passed == 1
        assert leases == []
        assert status == "stopped"
    finally:
        gate.open.set()
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        await engine.dispose()
        await admin.dispose()


async def test_a_loop_still_busy_when_the_termination_grace_runs_out_is_cancelled(
    engine_url: str | URL, engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The wait for the loops is bounded: a sweep that never ends its round is cancelled
    # once the termination grace is spent, and the teardown's writes still happen.
    s = worker_settings(
        engine_url,
        cancellation_grace_period=0.2,
        cleanup_grace_period=0.2,
        termination_grace_period=1.5,
    )
    worker = Worker(settings=s, actors=basic.registry, hard_exit=False)
    entered = asyncio.Event()
    cancelled = asyncio.Event()

    async def stuck_sweep() -> None:
        entered.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    monkeypatch.setattr(worker.sweeper, "run_once", stuck_sweep)
    task = asyncio.ensure_future(worker.run())
    try:
        await asyncio.wait_for(entered.wait(), 20)
        worker.state.signal("test-exit")
        assert await asyncio.wait_for(task, 30) == 0
        assert cancelled.is_set()
        async with transaction(engine, readonly=True) as conn:
            status = (
                await conn.execute(select(workers.c.status).where(workers.c.id == worker.worker_id))
            ).scalar_one()
        assert status == "stopped"
    finally:
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
