"""OpenTelemetry for the producer side and rate limits: spans and metrics.

On OpenTelemetry's messaging conventions (:mod:`taskq.otel_semconv`):

- a ``send {queue}`` span (PRODUCER) around every ``enqueue``, and one batch ``send``
  span (``send {queue}`` when every job goes to one queue) with
  ``messaging.batch.message_count`` around an ``enqueue_many`` (async and sync). The
  trace context stored on the new jobs (W3C ``traceparent``/``tracestate`` and
  ``baggage``) is taken inside it, so a job's ``process`` span continues the trace of the
  request that enqueued it.
- ``messaging.client.sent.messages`` and ``messaging.client.operation.duration``
  (``messaging.operation.name=send``) per queue; ``taskq.jobs.enqueued{actor,queue,outcome}``
  with ``outcome`` ``created`` (a new row) or ``existing`` (deduplicated onto a job that
  was already there: ``unique_for``, an idempotency key).
- ``taskq.rate_limit.decisions{bucket,backend,allowed}``: one per token-bucket or
  sliding-window acquire, which is also an INTERNAL span ``rate_limit acquire`` with the
  bucket and the decision. A keyed bucket counts under its base name (one series per
  keyed ref, not per key).

Without the ``otel`` extra, or with the API but no SDK configured, nothing is recorded
and the cost is a flag read. Looking at OpenTelemetry's global provider costs about
2 µs (the API looks for an environment variable by catching a ``KeyError``), more than
a memory-backend acquire, so while no SDK is configured it is looked at again at most
once a second: an SDK installed later is seen within a second (at once after
``tracing_on.recheck()`` / ``metrics_on.recheck()``). Once one is, that is for good
(OpenTelemetry refuses to replace it). taskq never configures an SDK itself.

Pure: the async and the generated sync code share it.
"""

from __future__ import annotations

import contextlib
import contextvars
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from taskq import otel_semconv as sc

if TYPE_CHECKING:
    from taskq.ratelimit.decision import RateLimitDecision
    from taskq.records import EnqueueOutcome, EnqueueRequest

__all__ = [
    "acquire_started",
    "denied_primitive",
    "enqueue_span",
    "metrics_on",
    "record_bulk_enqueued",
    "record_decision",
    "record_enqueued",
    "record_operation",
    "stamp_actors",
    "tracing_on",
]

try:
    from opentelemetry import metrics, trace
except ImportError:  # pragma: no cover - the otel extra is optional
    metrics = None  # type: ignore[assignment]
    trace = None  # type: ignore[assignment]
else:
    from opentelemetry.trace import SpanKind, Status, StatusCode

_RECHECK_S = 1.0
"""How long "no SDK configured" is trusted before OpenTelemetry is asked again."""

if trace is not None:
    _tracer = trace.get_tracer("taskq")
    _meter = metrics.get_meter("taskq")
    _enqueued = _meter.create_counter("taskq.jobs.enqueued", description="Jobs enqueued")
    _decisions = _meter.create_counter(
        "taskq.rate_limit.decisions", unit="{decision}", description="Rate-limit acquires"
    )
    _sent = _meter.create_counter(
        "messaging.client.sent.messages", unit="{message}", description="Jobs enqueued"
    )
    _operation = _meter.create_histogram(
        "messaging.client.operation.duration",
        unit="s",
        description="Duration of a messaging operation (send, receive, settle)",
        explicit_bucket_boundaries_advisory=sc.DURATION_BUCKETS,
    )


class _Configured:
    """Whether an SDK provider is installed: looked up at most once per ``_RECHECK_S``
    until one is, then remembered."""

    __slots__ = ("_check", "_hooks", "_next", "on")

    def __init__(self, check: Any) -> None:
        self._check = check
        self._hooks: list[Any] = []
        self._next = 0.0
        self.on = False

    def __call__(self) -> bool:
        if self.on or trace is None:
            return self.on
        now = time.monotonic()
        if now >= self._next:
            self._next = now + _RECHECK_S
            if self._check():
                for hook in self._hooks:
                    hook()
                self.on = True
        return self.on

    def when_on(self, hook: Any) -> None:
        """Call ``hook()`` once the SDK is seen (at once if it is already): a module
        swaps OpenTelemetry's proxies for the SDK's own tracer and instruments, one
        delegation less on every call."""
        self._hooks.append(hook)
        if self.on:
            hook()

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


class Send:
    """One enqueue's telemetry: its ``send`` span (``None`` when tracing is off) and its
    start, for ``messaging.client.operation.duration``."""

    __slots__ = ("error", "queues", "span", "started")

    def __init__(self, span: Any) -> None:
        self.span = span
        self.started = time.perf_counter()
        self.queues: set[str] = set()
        self.error: str | None = None


def enqueue_span(actors: Iterable[str], jobs: int) -> contextlib.AbstractContextManager[Any]:
    """The telemetry of one enqueue of ``jobs`` jobs: a :class:`Send` (``None`` when
    neither tracing nor metrics is on). The span is named ``send`` until the queue is
    known (:func:`record_enqueued` renames it ``send {queue}``).

    With both off (the common case) this is one shared no-op context manager: no
    generator is made on every enqueue."""
    traced = tracing_on()
    if not traced and not metrics_on():
        return _NO_SPAN
    return _enqueue_span(actors, jobs, traced)


@contextlib.contextmanager
def _enqueue_span(actors: Iterable[str], jobs: int, traced: bool) -> Iterator[Any]:
    if not traced:
        send = Send(None)
        try:
            yield send
        except BaseException as exc:
            send.error = type(exc).__qualname__
            raise
        finally:
            _record_send(send)
        return
    names = set(actors)
    attributes: dict[str, str | int | bool] = sc.span_attributes("send", None)
    if jobs != 1:
        attributes[sc.BATCH_COUNT] = jobs
    if len(names) == 1:
        attributes["taskq.actor"] = names.pop()
    with _tracer.start_as_current_span(
        "send", kind=SpanKind.PRODUCER, attributes=attributes, record_exception=False
    ) as span:
        send = Send(span)
        try:
            yield send
        except BaseException as exc:
            send.error = type(exc).__qualname__
            span.record_exception(exc)
            span.set_attribute(sc.ERROR_TYPE, send.error)
            span.set_status(Status(StatusCode.ERROR, str(exc)[:200]))
            raise
        finally:
            _record_send(send)


def _record_send(send: Send) -> None:
    if not metrics_on():
        return
    seconds = time.perf_counter() - send.started
    for queue in send.queues or (None,):
        _operation.record(seconds, sc.metric_attributes("send", queue, send.error))


def _name_queues(send: Any, queues: set[str]) -> None:
    send.queues = queues
    span = send.span
    if span is not None:
        span.update_name(sc.span_name("send", queues))
        if len(queues) == 1:
            span.set_attribute(sc.DESTINATION, next(iter(queues)))


def stamp_actors(send: Any, actors: Iterable[str]) -> None:
    """Set ``taskq.actor`` on an enqueue's span when every job is of one actor."""
    if send is not None and send.span is not None:
        names = set(actors)
        if len(names) == 1:
            send.span.set_attribute("taskq.actor", names.pop())


def record_enqueued(
    send: Any, requests: Sequence[EnqueueRequest], outcomes: Sequence[EnqueueOutcome]
) -> None:
    """Count the jobs of one enqueue (``requests`` and their ``outcomes``, in order), and
    stamp them on its span: queue, actor, a single job's id and outcome."""
    if send is None:
        return
    _name_queues(send, {req.queue for req in requests})
    span = send.span
    if span is not None:
        stamp_actors(send, [req.actor for req in requests])
        if len(outcomes) == 1:
            span.set_attribute(sc.MESSAGE_ID, str(outcomes[0].job_id))
            span.set_attribute("taskq.was_existing", outcomes[0].was_existing)
    if not metrics_on():
        return
    counts = Counter(
        (req.actor, req.queue, out.was_existing)
        for req, out in zip(requests, outcomes, strict=True)
    )
    sent: Counter[str] = Counter()
    for (actor, queue, existing), n in counts.items():
        outcome = "existing" if existing else "created"
        _enqueued.add(n, {"actor": actor, "queue": queue, "outcome": outcome})
        sent[queue] += n
    for queue, n in sent.items():
        _sent.add(n, sc.metric_attributes("send", queue))


def record_bulk_enqueued(send: Any, created: Mapping[tuple[str, str], int]) -> None:
    """Count the jobs of a bulk ``enqueue_many``, every one created: ``created`` maps
    ``(actor, queue)`` to how many (:meth:`~taskq.bulk_rows.BulkRows.counts`)."""
    if send is None:
        return
    _name_queues(send, {queue for _, queue in created})
    stamp_actors(send, [actor for actor, _ in created])
    if metrics_on():
        sent: Counter[str] = Counter()
        for (actor, queue), n in created.items():
            _enqueued.add(n, {"actor": actor, "queue": queue, "outcome": "created"})
            sent[queue] += n
        for queue, n in sent.items():
            _sent.add(n, sc.metric_attributes("send", queue))


def record_operation(operation: str, queue: str | None, seconds: float) -> None:
    """One ``messaging.client.operation.duration`` point (the worker's receive/settle)."""
    _operation.record(seconds, sc.metric_attributes(operation, queue))


def acquire_started() -> int:
    """When an acquire began (``time_ns``), for its span; 0 when tracing is off."""
    return time.time_ns() if tracing_on() else 0


_denied_kind: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "taskq_denied_kind", default=None
)
"""The kind of the primitive whose acquire was last denied in this task (an attempt is
one task), for ``taskq.job.throttled.duration{primitive}``."""


def denied_primitive() -> str:
    """The kind of the primitive that denied this task's last acquire: ``token_bucket``,
    ``sliding_window``, or ``concurrency`` (a reservation or a queue cap, which make no
    rate-limit decision)."""
    return _denied_kind.get() or "concurrency"


def record_decision(
    bucket: str, decision: RateLimitDecision, started_ns: int = 0, kind: str = "token_bucket"
) -> None:
    """Count one acquire's decision under ``bucket`` (a keyed bucket's base name); with
    ``started_ns`` (:func:`acquire_started`), also an INTERNAL span from then to now."""
    if not decision.allowed:
        _denied_kind.set(kind)
    if started_ns and tracing_on():
        retry = decision.retry_after
        span = _tracer.start_span(
            "rate_limit acquire",
            kind=SpanKind.INTERNAL,
            start_time=started_ns,
            attributes={
                "taskq.rate_limit.bucket": bucket,
                "taskq.rate_limit.name": decision.bucket_name,
                "taskq.rate_limit.primitive": kind,
                "taskq.rate_limit.backend": decision.backend,
                "taskq.rate_limit.allowed": decision.allowed,
                "taskq.rate_limit.decision": "allowed" if decision.allowed else "denied",
                "taskq.rate_limit.retry_after_s": -1.0 if retry is None else retry.total_seconds(),
            },
        )
        span.end()
    if metrics_on():
        _decisions.add(
            1, {"bucket": bucket, "backend": decision.backend, "allowed": decision.allowed}
        )
