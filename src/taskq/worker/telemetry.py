"""OpenTelemetry for the worker: a span per attempt, and the job metrics.

The attempt span (``taskq.attempt``) is a child of the trace context stored on the job
row at enqueue (the ``taskq.enqueue`` span, see :mod:`taskq.telemetry`), so a job's work
shows up under the request that enqueued it. Metrics:
``taskq.jobs.completed{actor,status}``, ``taskq.job.duration{actor}`` (seconds),
``taskq.jobs.reclaimed{actor,disposition}`` and ``taskq.queue.depth{queue,status}`` (jobs
waiting to run, ``pending`` or ``scheduled``, per queue: read by the fleet's leader at
each sweep and reported by it alone, so the fleet reports each queue once). Without the ``otel`` extra everything here
is a no-op, and so it is with the API but no SDK configured (``tracing_on`` and
``metrics_on`` of :mod:`taskq.telemetry`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import Any

from taskq.telemetry import metrics_on, tracing_on

__all__ = ["attempt_span", "publish_queue_depth", "record_completed", "record_reclaimed"]

_depth: dict[tuple[str, str], int] = {}
"""The leader's last reading of the queue depth, by ``(queue, status)``."""
_depth_owner: list[object] = []
"""The worker whose reading ``_depth`` is (none, or one: the process's leader)."""

try:
    from opentelemetry import metrics, trace
    from opentelemetry.propagate import extract
    from opentelemetry.trace import Status, StatusCode
except ImportError:  # pragma: no cover - the otel extra is optional
    trace = None  # type: ignore[assignment]

if trace is not None:
    _tracer = trace.get_tracer("taskq.worker")
    _meter = metrics.get_meter("taskq.worker")
    _completed = _meter.create_counter("taskq.jobs.completed", description="Attempts ended")
    _duration = _meter.create_histogram("taskq.job.duration", unit="s", description="Attempt time")
    _reclaimed = _meter.create_counter("taskq.jobs.reclaimed", description="Expired leases swept")

    def _observe_depth(options: metrics.CallbackOptions) -> Iterator[metrics.Observation]:
        for (queue, status), count in list(_depth.items()):
            yield metrics.Observation(count, {"queue": queue, "status": status})

    _meter.create_observable_gauge(
        "taskq.queue.depth",
        callbacks=[_observe_depth],
        description="Jobs waiting to run (pending or scheduled), per queue",
    )


@contextlib.contextmanager
def attempt_span(row: dict[str, Any], actor: str) -> Iterator[Any]:
    """A ``taskq.attempt`` span around one attempt, parented by the enqueuer's context."""
    if not tracing_on():
        yield None  # no SDK configured: skip even OpenTelemetry's no-op span machinery
        return
    carrier = row.get("trace_context")
    parent = extract(carrier) if carrier else None
    attributes: dict[str, str | int] = {
        "taskq.job_id": str(row["id"]),
        "taskq.actor": actor,
        "taskq.queue": str(row.get("queue")),
        "taskq.attempt": int(row["attempt"]),
    }
    with _tracer.start_as_current_span(
        "taskq.attempt", context=parent, attributes=attributes, record_exception=False
    ) as span:
        yield span


def mark_span(span: Any, kind: str, error_class: str | None) -> None:
    """Stamp the attempt's outcome on its span (error status for failures)."""
    if span is None or trace is None:
        return
    span.set_attribute("taskq.outcome", kind)
    if error_class is not None:
        span.set_attribute("taskq.error_class", error_class)
    if kind in ("failed", "retry"):
        span.set_status(Status(StatusCode.ERROR, error_class or ""))


def record_completed(actor: str, status: str, seconds: float | None) -> None:
    """Count one ended attempt (and its duration when known)."""
    if not metrics_on():
        return
    _completed.add(1, {"actor": actor, "status": status})
    if seconds is not None:
        _duration.record(seconds, {"actor": actor})


def record_reclaimed(actor: str, disposition: str) -> None:
    """Count one row the sweep took back from a worker presumed dead."""
    if metrics_on():
        _reclaimed.add(1, {"actor": actor, "disposition": disposition})


def publish_queue_depth(worker: object, rows: Iterable[tuple[str, str, int]] | None) -> None:
    """``worker``'s new reading as the leader, ``(queue, status, count)`` rows; a queue
    and status seen before and absent now reads 0. ``None``: ``worker`` is not the leader
    (or stopped being it), so what it reported is withdrawn; another worker's reading in
    the same process stays."""
    if rows is None:
        if _depth_owner and _depth_owner[0] is worker:
            _depth.clear()
            _depth_owner.clear()
        return
    fresh = {(queue, status): count for queue, status, count in rows}
    for key in _depth:
        fresh.setdefault(key, 0)
    _depth.clear()
    _depth.update(fresh)
    _depth_owner[:] = [worker]
