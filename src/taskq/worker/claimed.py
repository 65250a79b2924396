"""A claimed job: the row a claim returned, decoded once, plus the worker's notes on it.

A row can be written by SQL or by another producer, so the worker cannot assume taskq's
enqueue checks held: a payload nested deeper than the JSON decoder's recursion allows, an
``attempt`` counter already at the top of its column, a ``start_to_close_s`` that is
negative, zero, NaN or infinite. The claim returns the JSON columns as text so that each
row is decoded here, on its own: a row that cannot be used is failed with ``error_class``
``UndecodableJob`` (without running its actor) while the rest of its batch runs. One bad
row never stops a queue.

:class:`ClaimedJob` is built once per claimed row (:meth:`ClaimedJob.from_row`), on the
claim's hot path: a slotted dataclass, no validation beyond the checks above.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final
from uuid import UUID

from taskq.db.queries.dispatch import ATTEMPT_MAX, CLAIM_COLUMNS
from taskq.exceptions import UndecodableJob
from taskq.ratelimit.composition import AcquiredResource

__all__ = ["COLUMN_NAMES", "ClaimedJob", "decode_document"]

COLUMN_NAMES: Final[tuple[str, ...]] = tuple(col.name for col in CLAIM_COLUMNS)
"""The claim's columns, in order: :class:`ClaimedJob`'s column fields (a test holds them
equal)."""


def decode_document(text: Any) -> Any:
    """A JSON column's value from its text (``None`` stays ``None``; a value a driver
    already decoded is returned as it is). Raises ``ValueError`` (or ``RecursionError``
    for a document nested past the decoder's depth)."""
    if text is None or not isinstance(text, (str, bytes, bytearray)):
        return text
    return json.loads(text)


@dataclass(slots=True, eq=False)
class ClaimedJob:
    """One claimed row's columns (``payload`` and ``trace_context`` decoded) and what the
    worker notes about the claim.

    The column fields are those of :data:`~taskq.db.queries.dispatch.CLAIM_COLUMNS` and are
    not changed after :meth:`from_row`. The notes after them are set by the stage that
    knows them: the dispatcher (``result_ttl_s``), the limits' gate (``prepaid``) and
    telemetry (``receive``).
    """

    id: UUID
    actor: str
    queue: str
    payload: Any
    attempt: int
    budget_used: int = 0
    max_attempts: int | None = None
    priority: int = 0
    identity_key: str | None = None
    start_to_close_s: float | None = None
    schedule_to_close_s: float | None = None
    deadline_at: datetime | None = None
    created_at: datetime | None = None
    scheduled_at: datetime | None = None
    started_at: datetime | None = None
    cancel_phase: int = 0
    progress_seq: int = 0
    trace_context: Any = None
    waiting_on: str | None = None
    # -- the worker's notes -----------------------------------------------------------
    undecodable: UndecodableJob | None = None
    """Why the row cannot run as stored (see the module docstring): it is failed unrun,
    without admission, and the rest of its batch runs."""
    result_ttl_s: float | None = None
    """How long a success's result is kept (seconds; ``None``: forever): the actor's stored
    ``result_ttl`` when its config row has one, else the declared one. Set at claim."""
    prepaid: Sequence[AcquiredResource] = ()
    """Slots and tokens the gate took for this job before its claim (handed to the job's
    admission, or refunded when it will not start: :meth:`take_prepaid`)."""
    receive: Any = None
    """The OpenTelemetry span context of the claim's ``receive`` span (``None`` when tracing
    is off): the ``process`` and ``admit`` spans link to it."""

    @classmethod
    def from_row(cls, row: Mapping[Any, Any]) -> ClaimedJob:
        """Build a claimed job from a claim's row mapping, decoding its JSON columns.

        ``trace_context`` that does not decode is dropped (the attempt then starts a new
        trace); it never fails a job. Any other reason the row cannot run is recorded in
        :attr:`undecodable`.
        """
        job_id = row["id"]
        problem: UndecodableJob | None = None
        try:
            trace_context = decode_document(row["trace_context"])
        except (ValueError, RecursionError):
            trace_context = None
        payload = row["payload"]
        try:
            payload = decode_document(payload)
        except RecursionError:
            problem = UndecodableJob(
                job_id, "payload", "JSON nested deeper than the decoder allows"
            )
        except ValueError as exc:
            problem = UndecodableJob(job_id, "payload", f"not JSON: {exc}")
        attempt = row["attempt"]
        start_to_close = row["start_to_close_s"]
        if problem is not None:
            pass
        elif int(attempt or 0) >= ATTEMPT_MAX:
            problem = UndecodableJob(
                job_id, "attempt", f"{attempt} is the column's maximum; it cannot run again"
            )
        elif start_to_close is not None and not (
            math.isfinite(float(start_to_close)) and float(start_to_close) > 0
        ):
            problem = UndecodableJob(
                job_id,
                "start_to_close_s",
                f"{start_to_close!r} is not a positive, finite number of seconds",
            )
        return cls(
            id=job_id,
            actor=row["actor"],
            queue=row["queue"],
            payload=payload,
            attempt=attempt,
            budget_used=row["budget_used"],
            max_attempts=row["max_attempts"],
            priority=row["priority"],
            identity_key=row["identity_key"],
            start_to_close_s=start_to_close,
            schedule_to_close_s=row["schedule_to_close_s"],
            deadline_at=row["deadline_at"],
            created_at=row["created_at"],
            scheduled_at=row["scheduled_at"],
            started_at=row["started_at"],
            cancel_phase=row["cancel_phase"],
            progress_seq=row["progress_seq"],
            trace_context=trace_context,
            waiting_on=row["waiting_on"],
            undecodable=problem,
        )

    def take_prepaid(self) -> Sequence[AcquiredResource]:
        """What :attr:`prepaid` holds, which is left empty (taken once: by the job's
        admission or by the refund of a job that will not start)."""
        prepaid = self.prepaid
        self.prepaid = ()
        return prepaid

    def columns(self) -> dict[str, Any]:
        """The claimed row as a dict of its columns (decoded): what the ``on_success``,
        ``on_retry_exhausted`` and ``on_cancel`` hooks are given, with the outcome's
        ``status`` and ``error_class``."""
        return {name: getattr(self, name) for name in COLUMN_NAMES}
