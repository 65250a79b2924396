"""The cron metric, ``taskq.cron.ticks{schedule,actor,outcome}``, and the tick span.

Each due schedule a ticker handles is an INTERNAL span ``cron tick`` (``taskq.schedule``,
``taskq.actor``); the ``send`` span of the job it enqueues is its child, so a cron job's
trace starts at its tick.

One count per tick a worker's ticker handled: ``outcome`` is ``enqueued``,
``deduplicated``, ``refused:<reason>`` (``max_pending``, ``singleton``,
``invalid-payload``, ``error``) or ``missed`` (ticks the missed-tick policy dropped,
counted up to the plan's bound). Alert on ``refused:*`` and ``missed``. Like the other
metrics (:mod:`taskq.telemetry`), nothing is recorded until an OpenTelemetry SDK is
configured.
"""

from __future__ import annotations

import contextlib
from typing import Any

from taskq.telemetry import metrics_on, tracing_on

__all__ = ["record_ticks", "tick_span"]

try:
    from opentelemetry import metrics, trace
    from opentelemetry.trace import SpanKind
except ImportError:  # pragma: no cover - the otel extra is optional
    metrics = None  # type: ignore[assignment]
    trace = None  # type: ignore[assignment]

_NO_SPAN: contextlib.AbstractContextManager[None] = contextlib.nullcontext()


def tick_span(schedule: str, actor: str) -> contextlib.AbstractContextManager[Any]:
    """The ``cron tick`` span of one due schedule (no-op while tracing is off)."""
    if trace is None or not tracing_on():
        return _NO_SPAN
    return trace.get_tracer("taskq.cron").start_as_current_span(
        "cron tick",
        kind=SpanKind.INTERNAL,
        attributes={"taskq.schedule": schedule, "taskq.actor": actor},
    )


_ticks = (
    metrics.get_meter("taskq").create_counter(
        "taskq.cron.ticks", description="Schedule ticks handled, by outcome"
    )
    if metrics is not None
    else None
)


def record_ticks(schedule: str, actor: str, outcome: str, count: int = 1) -> None:
    """Count ``count`` ticks of ``schedule`` that ended as ``outcome``."""
    if _ticks is not None and count and metrics_on():
        _ticks.add(count, {"schedule": schedule, "actor": actor, "outcome": outcome})
