"""Turning a claimed row into something an attempt can run, one row at a time.

A row can be written by SQL or by another producer, so the worker cannot assume taskq's
enqueue checks held: a payload nested deeper than the JSON decoder's recursion allows, an
``attempt`` counter already at the top of its column, a ``start_to_close_s`` that is
negative, zero, NaN or infinite. The claim returns the JSON columns as text so that each
row is decoded here, on its own: a row that cannot be used is failed with ``error_class``
``UndecodableJob`` (without running its actor) while the rest of its batch runs. One bad
row never stops a queue.
"""

from __future__ import annotations

import json
import math
from typing import Any

from taskq.db.queries.dispatch import ATTEMPT_MAX
from taskq.exceptions import UndecodableJob

__all__ = ["decode_claimed", "decode_document"]


def decode_document(text: Any) -> Any:
    """A JSON column's value from its text (``None`` stays ``None``; a value a driver
    already decoded is returned as it is). Raises ``ValueError`` (or ``RecursionError``
    for a document nested past the decoder's depth)."""
    if text is None or not isinstance(text, (str, bytes, bytearray)):
        return text
    return json.loads(text)


def decode_claimed(row: dict[str, Any]) -> UndecodableJob | None:
    """Decode ``row`` (a claimed job) in place; the reason it cannot run, or ``None``.

    ``trace_context`` that does not decode is dropped (the attempt then starts a new
    trace); it never fails a job.
    """
    job_id = row.get("id")
    try:
        row["trace_context"] = decode_document(row.get("trace_context"))
    except (ValueError, RecursionError):
        row["trace_context"] = None
    try:
        row["payload"] = decode_document(row.get("payload"))
    except RecursionError:
        return UndecodableJob(job_id, "payload", "JSON nested deeper than the decoder allows")
    except ValueError as exc:
        return UndecodableJob(job_id, "payload", f"not JSON: {exc}")
    if int(row.get("attempt") or 0) >= ATTEMPT_MAX:
        return UndecodableJob(
            job_id, "attempt", f"{row['attempt']} is the column's maximum; it cannot run again"
        )
    start_to_close = row.get("start_to_close_s")
    if start_to_close is not None and not (
        math.isfinite(float(start_to_close)) and float(start_to_close) > 0
    ):
        return UndecodableJob(
            job_id,
            "start_to_close_s",
            f"{start_to_close!r} is not a positive, finite number of seconds",
        )
    return None
