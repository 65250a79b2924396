"""Execution outcomes through a real worker on each SQL engine."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select, text
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncEngine
from structlog.testing import capture_logs

from taskq.backends.sql import SqlBackend
from taskq.client import JobsClient
from taskq.db.tables import job_attempts, jobs
from tests.e2e.apps import basic
from tests.support.workers import count_jobs, running_worker, wait_until, worker_settings


async def _rows(engine: AsyncEngine) -> dict[Any, Any]:
    async with engine.connect() as conn:
        return {r.id: r for r in (await conn.execute(select(jobs))).all()}


async def _attempts(engine: AsyncEngine, job_id: Any) -> list[Any]:
    async with engine.connect() as conn:
        stmt = (
            select(job_attempts)
            .where(job_attempts.c.job_id == job_id)
            .order_by(job_attempts.c.attempt)
        )
        return list((await conn.execute(stmt)).all())


async def test_jobs_succeed_with_results(engine: AsyncEngine, engine_url: str | URL) -> None:
    client = JobsClient(SqlBackend(engine))
    handles = [await client.enqueue(basic.echo, basic.Echo(value=i)) for i in range(50)]
    async with running_worker(worker_settings(engine_url), basic.registry):
        await wait_until(lambda: _all_done(engine, 50))
    rows = await _rows(engine)
    for i, handle in enumerate(handles):
        row = rows[handle.job_id]
        assert row.status == "succeeded"
        assert row.result == {"doubled": i * 2}
        assert row.attempt == 1
        assert row.locked_by is None
        attempts = await _attempts(engine, handle.job_id)
        assert [a.outcome for a in attempts] == ["succeeded"]


async def _all_done(engine: AsyncEngine, n: int) -> bool:
    return await count_jobs(engine, "succeeded", "failed", "cancelled") >= n


async def test_retry_snooze_and_failure_outcomes(
    engine: AsyncEngine, engine_url: str | URL
) -> None:
    client = JobsClient(SqlBackend(engine))
    kinds = ["snooze", "retry_after_free", "always_fail", "non_retryable", "ok"]
    handles = {
        k: await client.enqueue(basic.control, basic.Control(kind=k, delay_ms=10)) for k in kinds
    }
    async with running_worker(worker_settings(engine_url), basic.registry):
        await wait_until(lambda: _all_done(engine, len(kinds)))
    rows = await _rows(engine)
    outcomes = {
        k: [a.outcome for a in await _attempts(engine, h.job_id)] for k, h in handles.items()
    }
    assert rows[handles["snooze"].job_id].status == "succeeded"
    assert outcomes["snooze"] == ["snoozed", "succeeded"]
    assert rows[handles["snooze"].job_id].budget_used == 0
    assert outcomes["retry_after_free"] == ["retried", "succeeded"]
    assert rows[handles["retry_after_free"].job_id].budget_used == 0
    assert outcomes["always_fail"] == ["retried", "retried", "failed"]
    failed = rows[handles["always_fail"].job_id]
    assert failed.status == "failed"
    assert failed.error_class == "ValueError"
    assert failed.budget_used == 3
    attempts = await _attempts(engine, handles["always_fail"].job_id)
    assert all(a.error_class == "ValueError" and "Traceback" in a.traceback for a in attempts)
    assert outcomes["ok"] == ["succeeded"]


async def test_a_non_finite_result_fails_its_job_and_no_other(
    engine: AsyncEngine, engine_url: str | URL
) -> None:
    """A handler that returns an infinite float fails its attempt with a ValueError that
    says why (JSON has no Infinity): its result is never written, so the completer's
    batch, which holds the other jobs' outcomes too, is not refused by Postgres."""
    client = JobsClient(SqlBackend(engine))
    bad = await client.enqueue(basic.ratio, basic.Echo(value=1))
    fine = await client.enqueue(basic.ratio, basic.Echo(value=0))
    echoes = [await client.enqueue(basic.echo, basic.Echo(value=i)) for i in range(5)]
    async with running_worker(worker_settings(engine_url), basic.registry):
        await wait_until(lambda: _all_done(engine, 7))
    rows = await _rows(engine)
    failed = rows[bad.job_id]
    assert (failed.status, failed.error_class, failed.result) == ("failed", "ValueError", None)
    assert "returned a result that cannot be stored: inf at ratio" in failed.error
    assert "no Infinity or NaN" in failed.error
    assert (rows[fine.job_id].status, rows[fine.job_id].result) == ("succeeded", {"ratio": 0.5})
    assert [rows[h.job_id].status for h in echoes] == ["succeeded"] * 5


_REFUSE_PG = (
    "ALTER TABLE taskq.jobs ADD CONSTRAINT test_refuse_fourteen "
    "CHECK (result IS NULL OR result->>'doubled' <> '14')"
)
_REFUSE_SQLITE = (
    "CREATE TRIGGER test_refuse_fourteen BEFORE UPDATE OF result ON jobs "
    "WHEN json_extract(NEW.result, '$.doubled') = 14 "
    "BEGIN SELECT RAISE(ABORT, 'a result of 14 is refused'); END"
)


async def test_an_outcome_the_database_refuses_holds_back_no_other(
    engine: AsyncEngine, engine_url: str | URL
) -> None:
    """The server refuses one success's result (an operator's CHECK here): that job is
    written as failed with ``OutcomeNotStorable`` and the server's reason, and every
    outcome written in the same flush as it lands as it was. (Before, the flush failed
    as a whole and was retried until the lock lease ran out: no job of it ended.)"""
    async with engine.begin() as conn:
        await conn.execute(
            text(_REFUSE_PG if engine.dialect.name == "postgresql" else _REFUSE_SQLITE)
        )
    client = JobsClient(SqlBackend(engine))
    handles = [await client.enqueue(basic.echo, basic.Echo(value=i)) for i in range(30)]
    with capture_logs() as logs:
        async with running_worker(worker_settings(engine_url), basic.registry):
            await wait_until(lambda: _all_done(engine, 30))
    rows = await _rows(engine)
    refused = rows[handles[7].job_id]
    assert (refused.status, refused.error_class, refused.result) == (
        "failed",
        "OutcomeNotStorable",
        None,
    )
    assert refused.error.startswith("the database refused this attempt's outcome: ")
    reason = (
        "test_refuse_fourteen"
        if engine.dialect.name == "postgresql"
        else "a result of 14 is refused"
    )
    assert reason in refused.error
    attempts = await _attempts(engine, handles[7].job_id)
    assert [(a.outcome, a.error_class) for a in attempts] == [("failed", "OutcomeNotStorable")]
    others = [rows[h.job_id] for i, h in enumerate(handles) if i != 7]
    assert [(r.status, r.result) for r in others] == [
        ("succeeded", {"doubled": 2 * i}) for i in range(30) if i != 7
    ]
    events = [e for e in logs if e["event"] == "worker-outcome-refused"]
    assert [e["job_id"] for e in events] == [str(handles[7].job_id)]


async def test_an_error_message_with_a_nul_is_stored_with_it_escaped(
    engine: AsyncEngine, engine_url: str | URL
) -> None:
    """A Postgres text column cannot hold NUL: an exception whose message has one is
    stored with ``\\x00`` in its place (it failed the worker's whole flush before)."""
    client = JobsClient(SqlBackend(engine))
    bad = await client.enqueue(basic.control, basic.Control(kind="nul_message"))
    echoes = [await client.enqueue(basic.echo, basic.Echo(value=i)) for i in range(5)]
    async with running_worker(worker_settings(engine_url), basic.registry):
        await wait_until(lambda: _all_done(engine, 6))
    rows = await _rows(engine)
    assert (rows[bad.job_id].status, rows[bad.job_id].error) == (
        "failed",
        "a NUL \\x00 in the message",
    )
    attempts = await _attempts(engine, bad.job_id)
    assert [a.error for a in attempts] == ["a NUL \\x00 in the message"] * 3
    assert all("\x00" not in a.traceback for a in attempts)
    assert [rows[h.job_id].status for h in echoes] == ["succeeded"] * 5
