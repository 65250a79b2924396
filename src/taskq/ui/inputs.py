"""Parsing the admin UI's query strings and forms into validated values.

Every malformed value is a :class:`BadInput` (answered 400 with its message) raised
before anything is read or written.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import Any
from urllib.parse import urlencode
from uuid import UUID

from taskq.job_filter import JobFilter

__all__ = [
    "FILTER_FIELDS",
    "WINDOWS",
    "BadInput",
    "filter_query",
    "job_filter",
    "job_id",
    "job_ids",
    "page_limit",
    "parse_bool",
    "queue_cap",
    "safe_next",
    "window",
]

FILTER_FIELDS = ("status", "actor", "queue", "tag", "identity_key", "error_class")
"""The job filters the jobs page takes (``status`` may repeat)."""
WINDOWS = {"1h": timedelta(hours=1), "24h": timedelta(hours=24), "7d": timedelta(days=7)}
"""The recency windows of the actors page."""
MAX_SELECTED = 1000


class BadInput(ValueError):
    """A query or form value the UI cannot use; its message says which and why."""


def _values(data: Any, name: str) -> list[str]:
    getlist = getattr(data, "getlist", None)
    raw = getlist(name) if getlist is not None else [data.get(name)]
    out: list[str] = []
    for value in raw:
        if value is None:
            continue
        if not isinstance(value, str):
            raise BadInput(f"{name}: expected text")
        value = value.strip()
        if value:
            out.append(value)
    return out


def _one(data: Any, name: str) -> str | None:
    values = _values(data, name)
    if len(values) > 1:
        raise BadInput(f"{name}: give it once")
    return values[0] if values else None


def job_filter(data: Any) -> JobFilter:
    """The :class:`JobFilter` a query string or form describes."""
    statuses = _values(data, "status")
    try:
        return JobFilter(
            status=statuses or None,
            actor=_one(data, "actor"),
            queue=_one(data, "queue"),
            tags=_one(data, "tag"),
            identity_key=_one(data, "identity_key"),
            error_class=_one(data, "error_class"),
        )
    except (TypeError, ValueError) as exc:
        raise BadInput(str(exc)) from None


def filter_query(data: Any) -> str:
    """The filter part of a query string, re-encoded (for links and hidden fields)."""
    pairs = [(name, value) for name in FILTER_FIELDS for value in _values(data, name)]
    return urlencode(pairs)


def page_limit(data: Any, default: int = 50, maximum: int = 500) -> int:
    """``limit``: rows per page."""
    raw = _one(data, "limit")
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise BadInput(f"limit: {raw!r} is not a whole number") from None
    if not 1 <= value <= maximum:
        raise BadInput(f"limit must be between 1 and {maximum}")
    return value


def job_id(value: str) -> UUID:
    """A job id from a path or form."""
    try:
        return UUID(value)
    except (ValueError, TypeError, AttributeError):
        raise BadInput(f"{value!r} is not a job id (a UUID)") from None


def job_ids(data: Any) -> list[UUID]:
    """The selected ``job_id`` values of a bulk form (at least one, at most 1000)."""
    values = _values(data, "job_id")
    if not values:
        raise BadInput("select at least one job")
    if len(values) > MAX_SELECTED:
        raise BadInput(f"select at most {MAX_SELECTED} jobs at once, or act on the filter")
    return list(dict.fromkeys(job_id(v) for v in values))


def parse_bool(data: Any, name: str) -> bool:
    """A checkbox: present with ``on``/``true``/``1`` means true."""
    value = _one(data, name)
    if value is None:
        return False
    if value.lower() in ("on", "true", "1", "yes"):
        return True
    if value.lower() in ("off", "false", "0", "no"):
        return False
    raise BadInput(f"{name}: expected a checkbox value, got {value!r}")


def queue_cap(data: Any) -> int | None:
    """``max_concurrent``: a whole number >= 1, or empty to clear the cap."""
    raw = _one(data, "max_concurrent")
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError:
        raise BadInput(f"max_concurrent: {raw!r} is not a whole number") from None
    if value < 1:
        raise BadInput("max_concurrent must be at least 1 (leave it empty for no cap)")
    return value


def window(data: Mapping[str, Any]) -> tuple[str, timedelta]:
    """The actors page's ``window`` (``1h``, ``24h`` or ``7d``; default ``24h``)."""
    raw = data.get("window") or "24h"
    if raw not in WINDOWS:
        raise BadInput(f"window must be one of {', '.join(WINDOWS)}")
    return str(raw), WINDOWS[raw]


def safe_next(value: object, default: str) -> str:
    """A redirect target from a form: a path inside the UI, never another site."""
    if not isinstance(value, str) or not value.startswith("/") or value.startswith("//"):
        return default
    if "\\" in value or any(ord(c) < 32 for c in value):
        return default
    return value
