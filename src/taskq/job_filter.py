"""``JobFilter``: which jobs an operation applies to, validated once at the boundary.

A filter is a plain value (no I/O). Every field is optional; the ones given are ANDed.
Fields that take several values (``status``, ``actor``, ``queue``) match any of them;
``tags`` matches jobs that carry every tag listed. Names are checked against the same
patterns enqueue uses, so a filter that could never match a stored row (a typo'd
status, an actor name with a space) is a ``ValueError`` instead of an empty result.

The keyset cursor of :meth:`taskq.ops.jobs.JobOperations.list` is here too: an opaque
string holding the ``(created_at, id)`` of the last job of a page.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Sequence
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any
from uuid import UUID

from taskq.actor import validate_actor_name
from taskq.constants import JOB_STATUSES, MAX_NAME_LENGTH, validate_name, validate_queue_name

__all__ = ["JobFilter", "decode_cursor", "encode_cursor"]


def _names(value: str | Sequence[str] | None, what: str, check: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    items: Sequence[object] = (value,) if isinstance(value, str) else value
    if not isinstance(items, Sequence):
        raise TypeError(f"JobFilter.{what} must be a str or a sequence of str")
    out = []
    for item in items:
        if not isinstance(item, str):
            raise TypeError(f"JobFilter.{what} must hold str values, got {type(item).__name__}")
        out.append(check(item))
    if not out:
        raise ValueError(f"JobFilter.{what} is empty: pass None to not filter on it")
    return tuple(dict.fromkeys(out))


def _status(value: str) -> str:
    if value not in JOB_STATUSES:
        raise ValueError(f"unknown job status {value!r}: expected one of {', '.join(JOB_STATUSES)}")
    return value


def _text(value: str, what: str) -> str:
    if not value or len(value) > MAX_NAME_LENGTH:
        raise ValueError(f"JobFilter.{what} must be 1 to {MAX_NAME_LENGTH} characters")
    return value


def _aware(value: object, what: str) -> datetime | None:
    if value is None:
        return None
    if not isinstance(value, datetime):
        raise TypeError(f"JobFilter.{what} must be a datetime, got {type(value).__name__}")
    if value.tzinfo is None:
        raise ValueError(f"JobFilter.{what} is a naive datetime; pass an aware one (UTC)")
    return value


@dataclass(frozen=True, slots=True, init=False)
class JobFilter:
    """Which jobs to list, count, cancel or retry (every given field must match).

    - ``status``, ``actor``, ``queue``: one value or several (any of them).
    - ``tags``: the job carries every one of them (all-of).
    - ``identity_key``, ``parent_job_id``, ``error_class``, ``waiting_on``: equality.
    - ``waiting``: ``True`` only jobs parked on a limit (any ``waiting_on``, not yet
      claimed again), ``False`` only the others (so ``status="scheduled",
      waiting=False`` is "scheduled for later": delays, backoffs, snoozes).
    - ``created_after`` / ``created_before``, ``finished_after`` / ``finished_before``:
      aware datetimes; ``after`` is inclusive, ``before`` exclusive. A finished-time bound
      matches only jobs that have finished.

    ``JobFilter()`` matches every job. Bad values raise ``ValueError`` (``TypeError`` for
    the wrong type) here, before anything runs.
    """

    status: tuple[str, ...]
    actor: tuple[str, ...]
    queue: tuple[str, ...]
    tags: tuple[str, ...]
    identity_key: str | None
    parent_job_id: UUID | None
    error_class: str | None
    waiting_on: str | None
    waiting: bool | None
    created_after: datetime | None
    created_before: datetime | None
    finished_after: datetime | None
    finished_before: datetime | None

    def __init__(
        self,
        *,
        status: str | Sequence[str] | None = None,
        actor: str | Sequence[str] | None = None,
        queue: str | Sequence[str] | None = None,
        tags: str | Sequence[str] | None = None,
        identity_key: str | None = None,
        parent_job_id: UUID | str | None = None,
        error_class: str | None = None,
        waiting_on: str | None = None,
        waiting: bool | None = None,
        created_after: datetime | None = None,
        created_before: datetime | None = None,
        finished_after: datetime | None = None,
        finished_before: datetime | None = None,
    ) -> None:
        values: dict[str, Any] = {
            "status": _names(status, "status", _status),
            "actor": _names(actor, "actor", validate_actor_name),
            "queue": _names(queue, "queue", validate_queue_name),
            "tags": _names(tags, "tags", lambda t: _text(t, "tags")),
            "identity_key": None,
            "parent_job_id": None,
            "error_class": None,
            "waiting_on": None,
            "waiting": None,
            "created_after": _aware(created_after, "created_after"),
            "created_before": _aware(created_before, "created_before"),
            "finished_after": _aware(finished_after, "finished_after"),
            "finished_before": _aware(finished_before, "finished_before"),
        }
        for name, raw in (("identity_key", identity_key), ("error_class", error_class)):
            if raw is not None:
                if not isinstance(raw, str):
                    raise TypeError(f"JobFilter.{name} must be a str")
                values[name] = _text(raw, name)
        if waiting_on is not None:
            values["waiting_on"] = validate_name(waiting_on, kind="waiting_on")
        if waiting is not None:
            if not isinstance(waiting, bool):
                raise TypeError("JobFilter.waiting must be a bool")
            values["waiting"] = waiting
        if parent_job_id is not None:
            values["parent_job_id"] = _uuid(parent_job_id, "parent_job_id")
        for low, high in (
            ("created_after", "created_before"),
            ("finished_after", "finished_before"),
        ):
            if values[low] is not None and values[high] is not None and values[low] >= values[high]:
                raise ValueError(f"JobFilter.{low} must be earlier than {high}")
        for name, value in values.items():
            object.__setattr__(self, name, value)

    def to_json(self) -> dict[str, Any]:
        """The fields that are set, as a JSON-ready object (lists, ISO times, string ids)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None or value == ():
                continue
            if isinstance(value, bool):
                out[f.name] = value
            elif isinstance(value, tuple):
                out[f.name] = list(value)
            elif isinstance(value, datetime):
                out[f.name] = value.isoformat()
            else:
                out[f.name] = str(value)
        return out


def _uuid(value: object, what: str) -> UUID:
    if isinstance(value, UUID):
        return value
    if isinstance(value, str):
        try:
            return UUID(value)
        except ValueError:
            raise ValueError(f"JobFilter.{what}: {value!r} is not a UUID") from None
    raise TypeError(f"JobFilter.{what} must be a UUID or a str")


def encode_cursor(created_at: str, job_id: UUID) -> str:
    """The opaque cursor after the job with id ``job_id`` created at ``created_at`` (the
    timestamp as the store orders it: ISO 8601 on Postgres, the stored text on SQLite)."""
    raw = json.dumps([created_at, str(job_id)]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[str, UUID]:
    """``(created_at, id)`` from :func:`encode_cursor`'s string; ``ValueError`` if it is not one."""
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        created, job_id = json.loads(base64.urlsafe_b64decode(padded.encode()))
        datetime.fromisoformat(created)  # a timestamp, whichever store wrote it
        return str(created), UUID(job_id)
    except (ValueError, TypeError, binascii.Error, json.JSONDecodeError):
        raise ValueError(f"invalid cursor {cursor!r}: pass the next_cursor of a page") from None
