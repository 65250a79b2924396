"""The cron metric: ``taskq.cron.ticks{schedule,actor,outcome}``.

One count per tick a worker's ticker handled: ``outcome`` is ``enqueued``,
``deduplicated``, ``refused:<reason>`` (``max_pending``, ``singleton``,
``invalid-payload``, ``error``) or ``missed`` (ticks the missed-tick policy dropped,
counted up to the plan's bound). Alert on ``refused:*`` and ``missed``. Like the other
metrics (:mod:`taskq.telemetry`), nothing is recorded until an OpenTelemetry SDK is
configured.
"""

from __future__ import annotations

from taskq.telemetry import metrics_on

__all__ = ["record_ticks"]

try:
    from opentelemetry import metrics
except ImportError:  # pragma: no cover - the otel extra is optional
    metrics = None  # type: ignore[assignment]

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
