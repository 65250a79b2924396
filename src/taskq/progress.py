"""The progress stream's wire format, shared by the worker (publisher) and
``JobHandle.progress_stream()`` (consumer). Pure: no I/O here.

Each job publishes its events on the Redis pub/sub channel :func:`progress_channel` as
JSON objects (see :func:`event_message`). ``seq`` is a total order over the job's whole
stream, across attempts: ``running`` (the claim), ``progress`` (each ``ctx.progress()``),
``retried``, ``snoozed``, ``released`` (handed back at a worker shutdown), and the
terminal ``succeeded``, ``failed``, ``cancelled``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from taskq.records import JobRecord

__all__ = ["TERMINAL_EVENTS", "ProgressEvent", "event_message", "progress_channel"]

TERMINAL_EVENTS = frozenset({"succeeded", "failed", "cancelled"})
"""Events after which a job publishes nothing more."""


def progress_channel(job_id: UUID) -> str:
    """The Redis pub/sub channel carrying a job's progress events."""
    return f"taskq:progress:{job_id}"


def event_message(
    job_id: UUID,
    seq: int,
    event: str,
    status: str,
    state: dict[str, Any],
    *,
    error_class: str | None = None,
) -> str:
    """One stream event as published: JSON ``{"job_id", "seq", "event", "status",
    "terminal", "state", "error_class"}``. ``state`` is the job's progress state as of
    the event; ``terminal`` is true for the last event a job will ever publish."""
    return json.dumps(
        {
            "job_id": str(job_id),
            "seq": seq,
            "event": event,
            "status": status,
            "terminal": event in TERMINAL_EVENTS,
            "state": state,
            "error_class": error_class,
        },
        default=str,
    )


@dataclass(frozen=True, slots=True)
class ProgressEvent:
    """One event of a job's progress stream, as ``JobHandle.progress_stream()`` yields it.

    ``seq`` is ``None`` only for an event built from the job's row rather than received
    (the job had already ended when the stream opened, or its terminal publish was lost).
    """

    job_id: UUID
    seq: int | None
    event: str
    status: str
    terminal: bool
    state: dict[str, Any] = field(default_factory=dict)
    error_class: str | None = None

    @classmethod
    def from_message(cls, data: bytes | str) -> ProgressEvent:
        """Parse a published message (see :func:`event_message`)."""
        raw = json.loads(data)
        event = str(raw.get("event", "progress"))
        return cls(
            job_id=UUID(raw["job_id"]),
            seq=int(raw["seq"]),
            event=event,
            status=str(raw.get("status", "running")),
            terminal=bool(raw.get("terminal", event in TERMINAL_EVENTS)),
            state=dict(raw.get("state") or {}),
            error_class=raw.get("error_class"),
        )

    @classmethod
    def from_record(cls, record: JobRecord) -> ProgressEvent:
        """The event a job's current row stands for (used when no message was received)."""
        return cls(
            job_id=record.id,
            seq=None,
            event=record.status,
            status=record.status,
            terminal=record.is_terminal,
            state=dict(record.progress or {}),
            error_class=record.error_class,
        )
