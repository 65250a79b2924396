"""Constants shared across layers (names, patterns, defaults, statuses)."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Final, Literal

JobStatus = Literal[
    "pending", "scheduled", "running", "succeeded", "failed", "cancelled", "crashed", "abandoned"
]

JOB_STATUSES: Final[tuple[str, ...]] = (
    "pending",
    "scheduled",
    "running",
    "succeeded",
    "failed",
    "cancelled",
    "crashed",
    "abandoned",
)
ACTIVE_STATUSES: Final[tuple[str, ...]] = ("pending", "scheduled", "running")
TERMINAL_STATUSES: Final[tuple[str, ...]] = (
    "succeeded",
    "failed",
    "cancelled",
    "crashed",
    "abandoned",
)
DEFAULT_UNIQUE_STATES: Final[tuple[str, ...]] = ("pending", "scheduled", "running", "succeeded")

ATTEMPT_OUTCOMES: Final[tuple[str, ...]] = (
    "running",
    "succeeded",
    "failed",
    "retried",
    "snoozed",
    "cancelled",
    "crashed",
    "abandoned",
)

QUEUE_MODES: Final[tuple[str, ...]] = ("fifo", "fair")

DEFAULT_QUEUE: Final = "default"
DEFAULT_SCHEMA: Final = "taskq"
DEFAULT_SQLITE_URL: Final = "sqlite+aiosqlite:///./taskq.db"
DEFAULT_RESERVATION_BACKOFF: Final = timedelta(seconds=5)

QUEUE_NAME_RE: Final = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
"""Queue names: no ``:`` (it separates segments of ``taskq:global:queue:{queue}``)."""
PRIMITIVE_NAME_RE: Final = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:-]*")
"""Bucket, reservation and keyed concrete names."""
SCHEMA_NAME_RE: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
MAX_NAME_LENGTH: Final = 200
SMALLINT_MIN: Final = -32768
SMALLINT_MAX: Final = 32767


def validate_name(value: object, *, kind: str, pattern: re.Pattern[str] = PRIMITIVE_NAME_RE) -> str:
    """Return ``value`` when it is a valid identifier of ``kind``; raise ``ValueError`` otherwise.

    Names reach Redis keys and SQL parameters, so they are checked here, at the boundary.
    """
    if not isinstance(value, str):
        raise TypeError(f"{kind} name must be a str, got {type(value).__name__}")
    if not value or len(value) > MAX_NAME_LENGTH or pattern.fullmatch(value) is None:
        raise ValueError(
            f"invalid {kind} name {value!r}: must match {pattern.pattern} "
            f"and be at most {MAX_NAME_LENGTH} characters"
        )
    return value


def validate_queue_name(value: object) -> str:
    """Validate a queue name: ``[A-Za-z0-9_][A-Za-z0-9_.-]*``, no ``:`` (docs/actors.md)."""
    return validate_name(value, kind="queue", pattern=QUEUE_NAME_RE)
