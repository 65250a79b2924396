"""What the operations return: pages, capped counts, job details and bulk-action tallies.

Plain frozen values (no I/O), shared by ``taskq`` and ``taskq_sync``. Each has
``to_json()``: the one JSON shape the CLI's ``--json`` prints and the admin UI serves,
so the surfaces cannot disagree on field names.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from uuid import UUID

from taskq.records import AttemptRecord, JobRecord

__all__ = [
    "AttemptDetail",
    "CancelResult",
    "JobCount",
    "JobDetail",
    "JobPage",
    "PurgeResult",
    "RetryResult",
    "job_to_json",
]


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def job_to_json(job: JobRecord) -> dict[str, Any]:
    """A job row as a JSON object: every column of :class:`~taskq.records.JobRecord`,
    ids as strings and times as ISO 8601, plus the derived ``state`` and ``waiting``
    (a job parked on a limit reads ``state: "waiting"``; its ``status`` stays stored)."""
    out: dict[str, Any] = {}
    for name in JobRecord.__dataclass_fields__:
        value = getattr(job, name)
        if isinstance(value, datetime):
            value = value.isoformat()
        elif isinstance(value, UUID):
            value = str(value)
        out[name] = value
    out["state"] = job.state
    out["waiting"] = job.waiting
    return out


@dataclass(frozen=True, slots=True)
class JobPage:
    """One page of :meth:`~taskq.ops.jobs.JobOperations.list`, newest first.

    ``next_cursor`` is the ``after=`` of the following page, ``None`` on the last one.
    """

    jobs: list[JobRecord]
    next_cursor: str | None

    def to_json(self) -> dict[str, Any]:
        """``{"jobs": [...], "next_cursor": ...}``."""
        return {"jobs": [job_to_json(j) for j in self.jobs], "next_cursor": self.next_cursor}


@dataclass(frozen=True, slots=True)
class JobCount:
    """A count that stopped at ``cap``: ``count`` is exact when ``capped`` is False, and a
    lower bound ("at least ``cap``") when it is True."""

    count: int
    capped: bool
    cap: int

    def to_json(self) -> dict[str, Any]:
        """``{"count", "capped", "cap"}``."""
        return {"count": self.count, "capped": self.capped, "cap": self.cap}

    def __str__(self) -> str:
        return f"{self.count}+" if self.capped else str(self.count)


@dataclass(frozen=True, slots=True)
class AttemptDetail:
    """One attempt of a job, with its traceback when it failed."""

    attempt: AttemptRecord
    traceback: str | None

    def to_json(self) -> dict[str, Any]:
        """The attempt's columns, times as ISO 8601."""
        a = self.attempt
        return {
            "attempt": a.attempt,
            "worker_id": str(a.worker_id) if a.worker_id is not None else None,
            "outcome": a.outcome,
            "error_class": a.error_class,
            "error": a.error,
            "traceback": self.traceback,
            "started_at": _iso(a.started_at),
            "finished_at": _iso(a.finished_at),
        }


@dataclass(frozen=True, slots=True)
class JobDetail:
    """A job and its whole attempt history, read in one transaction."""

    job: JobRecord
    attempts: list[AttemptDetail]

    @property
    def manual_retries(self) -> list[dict[str, Any]]:
        """The operator retries recorded on the job (``metadata["taskq.retries"]``), oldest first."""
        value = self.job.metadata.get(RETRIES_KEY, [])
        return list(value) if isinstance(value, list) else []

    def to_json(self) -> dict[str, Any]:
        """``{"job": {...}, "attempts": [...], "manual_retries": [...]}``."""
        return {
            "job": job_to_json(self.job),
            "attempts": [a.to_json() for a in self.attempts],
            "manual_retries": self.manual_retries,
        }


RETRIES_KEY = "taskq.retries"
"""The ``jobs.metadata`` key under which operator retries are recorded."""


@dataclass(frozen=True, slots=True)
class CancelResult:
    """What a :meth:`~taskq.ops.jobs.JobOperations.cancel_where` did, by outcome.

    - ``cancelled_before_start``: pending/scheduled jobs ended ``cancelled`` at once.
    - ``cancel_requested``: running jobs stamped for their workers' cancel ladder (they
      end ``cancelled`` with ``CancelledCooperatively``, ``CancelledForced`` or
      ``CancelAbandoned``, or succeed if the actor returns normally).
    - ``not_reached``: matching jobs still uncancelled at the end, held by a concurrent
      transaction on every pass (run the operation again).
    """

    cancelled_before_start: int = 0
    cancel_requested: int = 0
    not_reached: int = 0

    @property
    def total(self) -> int:
        """Jobs this call changed."""
        return self.cancelled_before_start + self.cancel_requested

    def to_json(self) -> dict[str, Any]:
        """The three counts and ``total``."""
        return {
            "cancelled_before_start": self.cancelled_before_start,
            "cancel_requested": self.cancel_requested,
            "not_reached": self.not_reached,
            "total": self.total,
        }


@dataclass(frozen=True, slots=True)
class RetryResult:
    """What a retry did: ``retried`` jobs back to ``pending``, by the status they left
    (``by_status``); ``singleton_blocked`` lists singleton jobs left alone because their
    actor already has an active job."""

    retried: int = 0
    by_status: dict[str, int] = field(default_factory=dict)
    singleton_blocked: list[UUID] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """``{"retried", "by_status", "singleton_blocked"}``."""
        return {
            "retried": self.retried,
            "by_status": dict(sorted(self.by_status.items())),
            "singleton_blocked": [str(i) for i in self.singleton_blocked],
        }


@dataclass(frozen=True, slots=True)
class PurgeResult:
    """How many finished jobs a purge deleted, in how many batches."""

    deleted: int = 0
    batches: int = 0

    def to_json(self) -> dict[str, Any]:
        """``{"deleted", "batches"}``."""
        return {"deleted": self.deleted, "batches": self.batches}
