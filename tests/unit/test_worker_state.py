"""Worker pieces that need no database: shutdown state, attempt bookkeeping, decisions."""

from __future__ import annotations

import asyncio
import socket
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import uuid4

import pytest
import structlog

from taskq.db.engine import make_engine
from taskq.exceptions import ScheduleToCloseTimeout, Snooze
from taskq.worker.claimed import ClaimedJob
from taskq.worker.execute import _failure
from taskq.worker.progress import Progress
from taskq.worker.run import resolve_actors
from taskq.worker.shutdown import Phase, ShutdownState
from taskq.worker.state import AttemptOutcome, Outcome, OutcomeKind, RunningJob
from tests.e2e.apps import basic


def _job(ref: Any = basic.control, **columns: Any) -> RunningJob:
    base: dict[str, Any] = {
        "id": uuid4(),
        "actor": ref.name,
        "queue": "default",
        "payload": {"kind": "ok"},
        "attempt": 1,
        "budget_used": 0,
        "max_attempts": None,
        "created_at": datetime.now(UTC),
        "deadline_at": None,
        "schedule_to_close_s": None,
    }
    base.update(columns)
    return RunningJob(claimed=ClaimedJob(**base), ref=ref, worker_id=uuid4())


async def test_first_signal_starts_later_signals_escalate() -> None:
    state = ShutdownState()
    state.signal("SIGTERM")
    assert state.requested.is_set()
    assert not state.escalate.is_set()
    state.enter(Phase.CANCELLING)
    state.signal("SIGTERM")
    assert state.escalate.is_set()
    state.enter(Phase.FORCING)
    assert not state.escalate.is_set()  # each phase re-arms it
    state.enter(Phase.CANCELLING)  # never backwards
    assert state.phase is Phase.FORCING


async def test_wait_phase_returns_on_escalation() -> None:
    state = ShutdownState()
    changed = asyncio.Event()
    asyncio.get_running_loop().call_later(0.01, state.signal, "second")
    state.signal("first")
    await state.wait_phase(lambda: False, 30.0, changed)
    assert state.escalate.is_set()


def test_job_cancel_wins_over_shutdown() -> None:
    job = _job()
    seen = []
    for reason in ("shutdown", "job", "shutdown"):
        job.request_cancel(reason)
        seen.append(job.cancel_reason)
    assert seen == ["shutdown", "job", "job"]
    assert job.abort_flag.is_set()
    assert job.cancel_event.is_set()


def test_outcome_row_status() -> None:
    job = _job()
    kind, record = OutcomeKind, AttemptOutcome
    assert Outcome(job, kind.RETRY, record.RETRIED).row_status == "scheduled"
    assert Outcome(job, kind.SNOOZE, record.SNOOZED).row_status == "scheduled"
    assert Outcome(job, kind.RELEASE, record.RETRIED).row_status == "pending"
    assert Outcome(job, kind.RELEASE, record.RETRIED, hold_s=3.0).row_status == "scheduled"
    assert Outcome(job, kind.SUCCEEDED, record.SUCCEEDED).row_status == "succeeded"
    assert Outcome(job, kind.FAILED, record.FAILED).row_status == "failed"
    assert Outcome(job, kind.CANCELLED, record.ABANDONED).row_status == "cancelled"


def test_failure_decisions() -> None:
    retried = _failure(_job(), ValueError("x"), False)
    assert (retried.kind, retried.budget, retried.error_class) == ("retry", 1, "ValueError")
    assert retried.traceback is not None
    assert "ValueError" in retried.traceback
    # A per-job max_attempts tighter than the policy's ends it sooner.
    assert _failure(_job(max_attempts=1), ValueError("x"), False).kind == "failed"
    snoozed = _failure(_job(), Snooze(timedelta(seconds=3)), False)
    assert (snoozed.kind, snoozed.budget, snoozed.delay_s) == ("snooze", 0, 3.0)
    past = datetime.now(UTC) + timedelta(milliseconds=1)
    assert _failure(_job(deadline_at=past), ValueError("x"), False).kind == "failed"
    job = _job()
    assert _failure(job, ScheduleToCloseTimeout("a", job.id), False).kind == "failed"


def test_resolve_actors_accepts_mappings_and_lists() -> None:
    assert resolve_actors([basic.noop]) == {"e2e_noop": basic.noop}
    assert resolve_actors({"x": basic.echo}) == {"e2e_echo": basic.echo}
    with pytest.raises(TypeError):
        resolve_actors(["not an actor"])  # type: ignore[list-item]


async def test_hooks_are_bounded_and_cannot_raise() -> None:
    from taskq.worker.outcomes import run_hook

    forever = asyncio.Event()

    async def hangs(row: object) -> None:
        await forever.wait()

    def raises(row: object) -> None:
        raise RuntimeError("hook bug")

    await asyncio.wait_for(run_hook("on_cancel", hangs, 0.05, {}), 5)
    await run_hook("on_cancel", raises, 1.0, {})


async def test_a_failed_progress_flush_is_retried_by_the_next_one() -> None:
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    engine = make_engine(f"postgresql+psycopg://postgres@127.0.0.1:{port}/nothing")
    try:
        progress = Progress(engine, uuid4(), max_bytes=1024, redis_url=None)
        job = _job()
        await progress.sink(job)(percent=40.0)
        assert job.progress_dirty
        with structlog.testing.capture_logs() as logs:
            await progress.flush([job])
        assert [e["event"] for e in logs] == ["worker-progress-flush-failed"]
        assert job.progress_dirty  # not lost: the next flush writes it
    finally:
        await engine.dispose()
