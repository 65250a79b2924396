"""A claimed job is a typed value built once from the claim's row, and outcomes are enums."""

from __future__ import annotations

import json
from dataclasses import fields
from datetime import UTC, datetime
from typing import Any
from uuid import uuid4

from taskq.constants import ATTEMPT_OUTCOMES
from taskq.db.queries.dispatch import ATTEMPT_MAX, CLAIM_COLUMNS
from taskq.worker.claimed import COLUMN_NAMES, ClaimedJob
from taskq.worker.progress import _EVENT_NAMES
from taskq.worker.state import AttemptOutcome, OutcomeKind

_NOTES = ("undecodable", "result_ttl_s", "prepaid", "receive")


def _row(**changes: Any) -> dict[str, Any]:
    """A row as the claim returns it: every claim column, JSON columns as text."""
    now = datetime.now(UTC)
    row: dict[str, Any] = {
        "id": uuid4(),
        "actor": "a",
        "queue": "default",
        "payload": json.dumps({"n": 1}),
        "attempt": 1,
        "budget_used": 0,
        "max_attempts": None,
        "priority": 0,
        "identity_key": None,
        "start_to_close_s": None,
        "schedule_to_close_s": None,
        "deadline_at": None,
        "created_at": now,
        "scheduled_at": now,
        "started_at": now,
        "cancel_phase": 0,
        "progress_seq": 1,
        "trace_context": json.dumps({"traceparent": "00-x-y-01"}),
        "waiting_on": None,
    }
    row.update(changes)
    return row


def test_its_column_fields_are_the_claims_columns_in_order() -> None:
    names = tuple(f.name for f in fields(ClaimedJob))
    assert tuple(col.name for col in CLAIM_COLUMNS) == COLUMN_NAMES
    assert names == (*COLUMN_NAMES, *_NOTES)


def test_from_row_decodes_the_json_columns_once() -> None:
    row = _row()
    job = ClaimedJob.from_row(row)
    assert job.payload == {"n": 1}
    assert job.trace_context == {"traceparent": "00-x-y-01"}
    assert (job.id, job.actor, job.queue, job.attempt) == (row["id"], "a", "default", 1)
    assert job.undecodable is None
    assert job.columns() == {**row, "payload": {"n": 1}, "trace_context": job.trace_context}


def test_a_trace_context_that_does_not_decode_is_dropped_not_fatal() -> None:
    job = ClaimedJob.from_row(_row(trace_context="{not json"))
    assert job.trace_context is None
    assert job.undecodable is None


def test_rows_that_cannot_run_say_why() -> None:
    cases = {
        "payload": _row(payload="{not json"),
        "attempt": _row(attempt=ATTEMPT_MAX),
        "start_to_close_s": _row(start_to_close_s=float("nan")),
    }
    for column, row in cases.items():
        problem = ClaimedJob.from_row(row).undecodable
        assert problem is not None, column
        assert problem.job_id == row["id"]
        assert problem.column == column
    deep = _row(payload="[" * 100_000 + "]" * 100_000)
    problem = ClaimedJob.from_row(deep).undecodable
    assert problem is not None
    assert problem.column == "payload"


def test_the_hook_row_has_the_columns_and_none_of_the_workers_notes() -> None:
    job = ClaimedJob.from_row(_row())
    job.result_ttl_s = 5.0
    job.prepaid = [object()]  # type: ignore[list-item]
    job.receive = object()
    assert set(job.columns()) == set(COLUMN_NAMES)


def test_prepaid_is_taken_once() -> None:
    job = ClaimedJob.from_row(_row())
    handles: Any = ["token"]
    job.prepaid = handles
    taken: Any = job.take_prepaid()
    assert taken == ["token"]
    assert job.take_prepaid() == ()
    assert not job.prepaid


def test_outcome_enums_cover_the_records_and_events() -> None:
    assert {str(o) for o in AttemptOutcome} <= set(ATTEMPT_OUTCOMES)
    assert set(_EVENT_NAMES) == set(OutcomeKind)
    # Stored and logged as their plain values.
    assert json.dumps([OutcomeKind.RETRY, AttemptOutcome.RETRIED]) == '["retry", "retried"]'
