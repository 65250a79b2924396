"""OpenTelemetry for the producer side and rate limits: the enqueue span and the metrics.

- ``taskq.enqueue`` span around every ``enqueue`` / ``enqueue_many`` (async and sync).
  The trace context stored on the new jobs is taken inside it, so a job's attempt span
  is a child of the enqueue span, itself a child of whatever span the caller had open
  (the web request): one trace from the request to the job's end.
- ``taskq.jobs.enqueued{actor,queue,outcome}``: one per job an enqueue returned,
  ``outcome`` ``created`` (a new row) or ``existing`` (deduplicated onto a job that was
  already there: ``unique_for``, an idempotency key).
- ``taskq.ratelimit.decisions{bucket,backend,allowed}``: one per token-bucket or
  sliding-window acquire. A keyed bucket counts under its base name (one series per
  keyed ref, not per key).

Without the ``otel`` extra, or with the API but no SDK configured, nothing is recorded
and the cost is a flag read. Looking at OpenTelemetry's global provider costs about
2 µs (the API looks for an environment variable by catching a ``KeyError``), more than
a memory-backend acquire, so while no SDK is configured it is looked at again at most
once a second: an SDK installed later is seen within a second (at once after
``tracing_on.recheck()`` / ``metrics_on.recheck()``). Once one is, that is for good
(OpenTelemetry refuses to replace it).

Pure: the async and the generated sync code share it.
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from taskq.ratelimit.decision import RateLimitDecision
    from taskq.records import EnqueueOutcome, EnqueueRequest

__all__ = [
    "enqueue_span",
    "metrics_on",
    "record_bulk_enqueued",
    "record_decision",
    "record_enqueued",
    "stamp_actors",
    "tracing_on",
]

try:
    from opentelemetry import metrics, trace
except ImportError:  # pragma: no cover - the otel extra is optional
    metrics = None  # type: ignore[assignment]
    trace = None  # type: ignore[assignment]

_RECHECK_S = 1.0
"""How long "no SDK configured" is trusted before OpenTelemetry is asked again."""

if trace is not None:
    _tracer = trace.get_tracer("taskq")
    _meter = metrics.get_meter("taskq")
    _enqueued = _meter.create_counter("taskq.jobs.enqueued", description="Jobs enqueued")
    _decisions = _meter.create_counter(
        "taskq.ratelimit.decisions", description="Rate-limit acquires, allowed or not"
    )


class _Configured:
    """Whether an SDK provider is installed: looked up at most once per ``_RECHECK_S``
    until one is, then remembered."""

    __slots__ = ("_check", "_next", "on")

    def __init__(self, check: Any) -> None:
        self._check = check
        self._next = 0.0
        self.on = False

    def __call__(self) -> bool:
        if self.on or trace is None:
            return self.on
        now = time.monotonic()
        if now >= self._next:
            self._next = now + _RECHECK_S
            self.on = self._check()
        return self.on

    def recheck(self) -> bool:
        """Look at the provider now (after installing an SDK, to be seen at once)."""
        self._next = 0.0
        return self()


def _sdk_tracer_provider() -> bool:
    provider = trace.get_tracer_provider()
    return not isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider)


def _sdk_meter_provider() -> bool:
    # The API hands out a private proxy until an SDK MeterProvider is installed.
    provider = metrics.get_meter_provider()
    return type(provider).__name__ not in ("_ProxyMeterProvider", "NoOpMeterProvider")


tracing_on = _Configured(_sdk_tracer_provider)
"""``tracing_on()``: True when an OpenTelemetry SDK tracer provider is configured."""
metrics_on = _Configured(_sdk_meter_provider)
"""``metrics_on()``: True when an OpenTelemetry SDK meter provider is configured."""


_NO_SPAN: contextlib.AbstractContextManager[None] = contextlib.nullcontext()


def enqueue_span(actors: Iterable[str], jobs: int) -> contextlib.AbstractContextManager[Any]:
    """The ``taskq.enqueue`` span of one enqueue of ``jobs`` jobs (``None`` when tracing
    is off). ``taskq.actor`` is set when every job is of one actor.

    With tracing off (the common case) this is one shared no-op context manager: no
    generator is made on every enqueue."""
    if not tracing_on():
        return _NO_SPAN
    return _enqueue_span(actors, jobs)


@contextlib.contextmanager
def _enqueue_span(actors: Iterable[str], jobs: int) -> Iterator[Any]:
    names = set(actors)
    attributes: dict[str, str | int] = {"taskq.jobs": jobs}
    if len(names) == 1:
        attributes["taskq.actor"] = names.pop()
    with _tracer.start_as_current_span("taskq.enqueue", attributes=attributes) as span:
        yield span


def stamp_actors(span: Any, actors: Iterable[str]) -> None:
    """Set ``taskq.actor`` on an enqueue's span when every job is of one actor."""
    if span is not None:
        names = set(actors)
        if len(names) == 1:
            span.set_attribute("taskq.actor", names.pop())


def record_enqueued(
    span: Any, requests: Sequence[EnqueueRequest], outcomes: Sequence[EnqueueOutcome]
) -> None:
    """Count the jobs of one enqueue (``requests`` and their ``outcomes``, in order), and
    stamp them on its span: the actor when there is one, a single job's id and outcome."""
    if span is not None:
        stamp_actors(span, [req.actor for req in requests])
        if len(outcomes) == 1:
            span.set_attribute("taskq.job_id", str(outcomes[0].job_id))
            span.set_attribute("taskq.was_existing", outcomes[0].was_existing)
    if not metrics_on():
        return
    counts = Counter(
        (req.actor, req.queue, out.was_existing)
        for req, out in zip(requests, outcomes, strict=True)
    )
    for (actor, queue, existing), n in counts.items():
        outcome = "existing" if existing else "created"
        _enqueued.add(n, {"actor": actor, "queue": queue, "outcome": outcome})


def record_bulk_enqueued(span: Any, created: Mapping[tuple[str, str], int]) -> None:
    """Count the jobs of a bulk ``enqueue_many``, every one created: ``created`` maps
    ``(actor, queue)`` to how many (:meth:`~taskq.bulk_rows.BulkRows.counts`)."""
    stamp_actors(span, [actor for actor, _ in created])
    if metrics_on():
        for (actor, queue), n in created.items():
            _enqueued.add(n, {"actor": actor, "queue": queue, "outcome": "created"})


def record_decision(bucket: str, decision: RateLimitDecision) -> None:
    """Count one acquire's decision under ``bucket`` (a keyed bucket's base name)."""
    if metrics_on():
        _decisions.add(
            1, {"bucket": bucket, "backend": decision.backend, "allowed": decision.allowed}
        )
