"""OpenTelemetry's messaging semantic conventions (v1.44) as taskq applies them.

Span names are ``{operation} {destination}`` (``send orders``); the destination is the
queue. ``messaging.system`` is ``taskq``, ``messaging.message.id`` the job id (on spans
only: a metric never carries an unbounded value). Durations are in seconds with the
conventions' advised histogram buckets.

``OTEL_SEMCONV_STABILITY_OPT_IN`` is read once, at import: its ``messaging`` value is what
taskq emits anyway (the current conventions); ``messaging/dup`` also sets the pre-1.26
``messaging.operation`` attribute (``publish``/``receive``/``process``/``settle``) on
spans, for dashboards built on the older conventions.

Pure: the async and the generated sync code share it.
"""

from __future__ import annotations

import os
from typing import Final

__all__ = [
    "DURATION_BUCKETS",
    "ERROR_TYPE",
    "OPERATION_NAME",
    "OPERATION_TYPE",
    "SYSTEM",
    "span_attributes",
]

SYSTEM: Final = "messaging.system"
OPERATION_NAME: Final = "messaging.operation.name"
OPERATION_TYPE: Final = "messaging.operation.type"
DESTINATION: Final = "messaging.destination.name"
MESSAGE_ID: Final = "messaging.message.id"
BATCH_COUNT: Final = "messaging.batch.message_count"
CONSUMER_GROUP: Final = "messaging.consumer.group.name"
ERROR_TYPE: Final = "error.type"
LEGACY_OPERATION: Final = "messaging.operation"

SYSTEM_NAME: Final = "taskq"

DURATION_BUCKETS: Final = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
)
"""The conventions' advised boundaries for ``messaging.*.duration`` (seconds)."""

_LEGACY = {"send": "publish", "receive": "receive", "process": "process", "settle": "settle"}


def opt_in(value: str | None) -> frozenset[str]:
    """The entries of an ``OTEL_SEMCONV_STABILITY_OPT_IN`` value (comma-separated)."""
    return frozenset(part.strip() for part in (value or "").split(",") if part.strip())


DUPLICATE_LEGACY: Final = "messaging/dup" in opt_in(os.environ.get("OTEL_SEMCONV_STABILITY_OPT_IN"))
"""True when the older attribute names are emitted next to the current ones."""


def span_name(operation: str, queues: object) -> str:
    """``{operation} {queue}`` when the operation concerns one queue, else ``operation``."""
    if isinstance(queues, str):
        return f"{operation} {queues}"
    names = set(queues) if queues is not None else set()  # type: ignore[call-overload]
    return f"{operation} {names.pop()}" if len(names) == 1 else operation


def span_attributes(
    operation: str, queue: str | None, *, legacy: bool = DUPLICATE_LEGACY
) -> dict[str, str | int | bool]:
    """The messaging attributes every taskq span of ``operation`` on ``queue`` carries."""
    attributes: dict[str, str | int | bool] = {
        SYSTEM: SYSTEM_NAME,
        OPERATION_NAME: operation,
        OPERATION_TYPE: operation,
    }
    if queue is not None:
        attributes[DESTINATION] = queue
    if legacy:
        attributes[LEGACY_OPERATION] = _LEGACY.get(operation, operation)
    return attributes


def metric_attributes(
    operation: str, queue: str | None, error_type: str | None = None
) -> dict[str, str]:
    """The attributes of a ``messaging.client.*`` / ``messaging.process.*`` point: all
    bounded (the system, the operation, the queue, an exception's class name)."""
    attributes = {SYSTEM: SYSTEM_NAME, OPERATION_NAME: operation}
    if queue is not None:
        attributes[DESTINATION] = queue
    if error_type is not None:
        attributes[ERROR_TYPE] = error_type
    return attributes
