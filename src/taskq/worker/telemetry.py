"""OpenTelemetry for the worker: receive, process and settle spans, and the job metrics.

On OpenTelemetry's messaging conventions (:mod:`taskq.otel_semconv`):

- ``receive {queue}`` (CLIENT): one per claim that returned jobs, with
  ``messaging.batch.message_count``; an empty poll makes no span.
- ``process {queue}`` (CONSUMER): one per attempt, the parent of everything the actor
  does (``ctx.span``). Its parent is the context stored on the job at enqueue (the
  ``send`` span), or, with ``otel_process_parent="link"``, a new trace linked to it; the
  baggage stored with the job is current either way. It does not link to its
  ``receive`` span (a link per attempt is not free; the batch is in the settle span).
  Attributes: ``taskq.actor``, ``taskq.attempt``, ``taskq.outcome``, ``error.type``; the
  actor's exception is recorded as an event.
- ``settle {queue}``: each batched terminal write, one span per batch with
  ``messaging.batch.message_count`` (or the job's ``messaging.message.id``), linked to
  the (sampled) process spans of the attempts it settles, the first 128.
- ``admit {queue}`` (INTERNAL): the dispatcher's admission of a claimed job with limits
  (a queue cap, the actor's reservations or rate limits), a child of the job's creation
  context; the ``rate_limit acquire`` spans it makes are its children.
  ``taskq.admission`` is ``admitted`` or ``parked``; a parked job (not an attempt: no
  ``process`` span) also carries ``taskq.waiting_on`` (the denying bucket, reservation or
  cap), ``taskq.throttled.primitive`` and ``taskq.throttled.delay_s``.

Metrics: ``messaging.client.consumed.messages``, ``messaging.client.operation.duration``
(receive, settle), ``messaging.process.duration`` (with ``taskq.actor``);
``taskq.jobs.completed{actor,status}`` and ``taskq.job.retries{actor,queue}`` (one ``add``
per attribute set and settled batch), ``taskq.job.queue_latency{actor,queue}`` (time a
ready job waited for a worker; recorded per claimed batch, one point per job).

Per job, with an SDK, the worker makes one span (``process``), sets its outcome, and
records two histogram points (``messaging.process.duration``, recorded per written batch
in one loop, and ``taskq.job.queue_latency``, per claimed batch); everything else is per
batch. Attribute dicts are cached per queue, actor (and error class), never built per
job; a job stored without a trace context costs no propagator call.

``taskq.job.throttled.duration{primitive,actor,queue}`` (the time a denied job is put back
for: one point per park, and per in-attempt denial of a limit the actor acquires itself), ``taskq.jobs.reclaimed{actor,disposition}``, ``taskq.queue.depth{queue,status}``
(read by the fleet's leader at each sweep and reported by it alone, so the fleet reports
each queue once) and ``taskq.reservation.slots.held{reservation}``. Without the ``otel``
extra everything here is a no-op, and so it is with the API but no SDK configured
(``tracing_on`` and ``metrics_on`` of :mod:`taskq.telemetry`).
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from taskq import otel_semconv as sc
from taskq.telemetry import denied_primitive, metrics_on, record_operation, tracing_on

if TYPE_CHECKING:
    from taskq.worker.claimed import ClaimedJob

__all__ = [
    "admission_span",
    "claim_started",
    "mark_admission",
    "mark_span",
    "process_span",
    "publish_queue_depth",
    "record_exception",
    "record_received",
    "record_reclaimed",
    "record_throttled",
    "settle_span",
    "watch_slots",
]

_depth: dict[tuple[str, str], int] = {}
"""The leader's last reading of the queue depth, by ``(queue, status)``."""
_depth_owner: list[object] = []
"""The worker whose reading ``_depth`` is (none, or one: the process's leader)."""
_slot_sources: dict[int, Callable[[], Iterable[Any]]] = {}
"""Each running worker's held reservation slots (``SlotHold``), by ``id(worker)``."""

try:
    from opentelemetry import baggage, context, metrics, trace
    from opentelemetry.propagate import extract
    from opentelemetry.trace import Link, SpanKind, Status, StatusCode
except ImportError:  # pragma: no cover - the otel extra is optional
    trace = None  # type: ignore[assignment]

_NO_SPAN: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
"""What a span helper returns when tracing is off (shared: nothing made per job)."""

_tracer: Any = None
_completed: Any = None
_reclaimed: Any = None
_consumed: Any = None
_process: Any = None
_retries: Any = None
_latency: Any = None
_throttled: Any = None
_EMPTY: Any = context.Context() if trace is not None else None
"""The empty context: the parent of a span that starts a trace (no ``get_current`` call)."""
_CACHE_MAX = 1024
"""Attribute dicts cached per key (queue, actor, error class): all bounded values, but a
cache never grows past this (what is not cached is built per call, as before)."""


def _cached(cache: dict[Any, Any], key: tuple[Any, ...], build: Callable[..., Any]) -> Any:
    """``cache[key]``, made by ``build(*key)`` the first time."""
    value = cache.get(key)
    if value is None:
        value = build(*key)
        if len(cache) < _CACHE_MAX:
            cache[key] = value
    return value


def _bind_tracer() -> None:
    global _tracer
    _tracer = trace.get_tracer("taskq.worker")


def _instruments() -> None:
    """Make (or, once an SDK is installed, fetch again) the synchronous instruments (and,
    :func:`_bind_tracer`, the tracer). Until an SDK is installed OpenTelemetry hands out proxies, each call
    then delegating to the real one; once it is, the real ones are used directly."""
    global _completed, _reclaimed, _consumed, _process, _retries, _latency, _throttled
    meter = metrics.get_meter("taskq.worker")
    _completed = meter.create_counter("taskq.jobs.completed", description="Attempts ended")
    _reclaimed = meter.create_counter("taskq.jobs.reclaimed", description="Expired leases swept")
    _consumed = meter.create_counter(
        "messaging.client.consumed.messages", unit="{message}", description="Jobs claimed"
    )
    _process = meter.create_histogram(
        "messaging.process.duration",
        unit="s",
        description="Duration of one attempt",
        explicit_bucket_boundaries_advisory=sc.DURATION_BUCKETS,
    )
    _retries = meter.create_counter(
        "taskq.job.retries", unit="{retry}", description="Attempts that ended in a retry"
    )
    _latency = meter.create_histogram(
        "taskq.job.queue_latency",
        unit="s",
        description="Time a ready job waited for a worker (from its scheduled time to its claim)",
        explicit_bucket_boundaries_advisory=sc.DURATION_BUCKETS,
    )
    _throttled = meter.create_histogram(
        "taskq.job.throttled.duration",
        unit="s",
        description="Time a job is put back for because a limit denied it",
        explicit_bucket_boundaries_advisory=sc.DURATION_BUCKETS,
    )


if trace is not None:
    _bind_tracer()
    _instruments()
    _meter = metrics.get_meter("taskq.worker")
    tracing_on.when_on(_bind_tracer)
    metrics_on.when_on(_instruments)

    def _observe_depth(options: metrics.CallbackOptions) -> Iterator[metrics.Observation]:
        for (queue, status), count in list(_depth.items()):
            yield metrics.Observation(count, {"queue": queue, "status": status})

    def _observe_slots(options: metrics.CallbackOptions) -> Iterator[metrics.Observation]:
        held: Counter[str] = Counter()
        for source in list(_slot_sources.values()):
            for hold in source():
                reservation = hold.reservation
                held[str(getattr(reservation, "metrics_name", None) or reservation.name)] += 1
        for name, count in held.items():
            yield metrics.Observation(count, {"reservation": name})

    _meter.create_observable_gauge(
        "taskq.queue.depth",
        callbacks=[_observe_depth],
        description="Jobs waiting to run (pending or scheduled), per queue",
    )
    _meter.create_observable_up_down_counter(
        "taskq.reservation.slots.held",
        callbacks=[_observe_slots],
        unit="{slot}",
        description="Reservation slots this process's running jobs hold",
    )


# -- receive ------------------------------------------------------------------------


def claim_started() -> int:
    """When a claim began (``time_ns``); 0 when neither tracing nor metrics is on."""
    return time.time_ns() if tracing_on() or metrics_on() else 0


def record_received(queues: Sequence[str], rows: Sequence[ClaimedJob], started_ns: int) -> None:
    """The ``receive`` span and metrics of one claim of ``rows`` (none when it was empty):
    one span, one ``add`` and one operation point per queue, and the one per-job cost, a
    ``taskq.job.queue_latency`` point per row, recorded here in one loop."""
    if not started_ns or not rows:
        return
    first = str(rows[0].queue)
    by_queue = Counter(str(row.queue) for row in rows) if len(rows) > 1 else {first: 1}
    if tracing_on():
        names = set(by_queue) if by_queue else set(queues)
        one = first if len(names) == 1 else None
        attributes = {**_span_base("receive", one), sc.BATCH_COUNT: len(rows)}
        span = _tracer.start_span(
            sc.span_name("receive", names),
            context=_EMPTY,
            kind=SpanKind.CLIENT,
            start_time=started_ns,
            attributes=attributes,
        )
        span.end()
        receive = span.get_span_context()
        for row in rows:
            row.receive = receive
    if metrics_on():
        seconds = (time.time_ns() - started_ns) / 1e9
        now = datetime.now(UTC)
        for queue, n in by_queue.items():
            _consumed.add(n, _metric_base("receive", queue))
            record_operation("receive", queue, seconds)
        for row in rows:
            ready = row.scheduled_at
            if ready is not None:
                waited = (now - ready).total_seconds()
                actor, queue = row.actor, row.queue
                point = _LATENCY.get((actor, queue)) or _latency_point(actor, queue)
                _latency.record(waited if waited > 0.0 else 0.0, point)


_SPANS: dict[tuple[str, str | None], dict[str, str | int | bool]] = {}
_METRICS: dict[tuple[str, str | None], dict[str, str]] = {}
_LATENCY: dict[tuple[str, str], dict[str, str]] = {}
_PROCESS: dict[tuple[str, str], tuple[str, dict[str, str | int | bool]]] = {}
_POINTS: dict[tuple[str, str, str | None], dict[str, str]] = {}


def _latency_point(actor: str, queue: str) -> dict[str, str]:
    point: dict[str, str] = _cached(_LATENCY, (actor, queue), lambda a, q: {"actor": a, "queue": q})
    return point


def _span_base(operation: str, queue: str | None) -> dict[str, str | int | bool]:
    """The messaging attributes of a span (shared: copy before adding to it)."""
    key = (operation, queue)
    found = _SPANS.get(key)
    if found is None:
        found = _cached(_SPANS, key, sc.span_attributes)
    return found


def _metric_base(operation: str, queue: str | None) -> dict[str, str]:
    """The attributes of a ``messaging.client.*`` point (shared, never mutated)."""
    key = (operation, queue)
    found = _METRICS.get(key)
    if found is None:
        found = _cached(_METRICS, key, sc.metric_attributes)
    return found


# -- process ------------------------------------------------------------------------


def process_span(
    row: ClaimedJob, actor: str, *, link: bool = False
) -> contextlib.AbstractContextManager[Any]:
    """The ``process {queue}`` span of one attempt, current while it runs (``None`` when
    tracing is off). ``link``: a new trace linked to the creation context, not its child."""
    if not tracing_on():
        return _NO_SPAN  # no SDK configured: skip even OpenTelemetry's no-op span machinery
    return _ProcessSpan(row, actor, link)


def _process_base(queue: str, actor: str) -> tuple[str, dict[str, str | int | bool]]:
    """The span name and the attributes every attempt of ``actor`` on ``queue`` shares."""
    key = (queue, actor)
    found = _PROCESS.get(key)
    if found is None:
        found = _cached(
            _PROCESS,
            key,
            lambda q, a: (
                sc.span_name("process", q),
                {**sc.span_attributes("process", q), "taskq.actor": a},
            ),
        )
    return found


class _ProcessSpan:
    """The process span's context manager: a class, not a generator (one object per
    attempt), entering one context (the span's, over the creation context's baggage)."""

    __slots__ = ("_actor", "_link", "_row", "_span", "_token")

    def __init__(self, row: ClaimedJob, actor: str, link: bool) -> None:
        self._row = row
        self._actor = actor
        self._link = link
        self._span: Any = None
        self._token: Any = None

    def __enter__(self) -> Any:
        row = self._row
        name, shared = _process_base(str(row.queue), self._actor)
        carrier = row.trace_context
        # A job stored without a trace context starts a trace: no propagator call.
        base = extract(carrier) if carrier else _EMPTY
        links = None
        if carrier and self._link:
            created = trace.get_current_span(base).get_span_context()
            if created.is_valid:
                links = [Link(created, {"taskq.link": "creation"})]
            creation, base = base, _EMPTY
            for key, value in baggage.get_all(creation).items():
                base = baggage.set_baggage(key, value, base)
        # No link to the receive span: the conventions relate an attempt to its job's
        # creation context (the parent, or the link above), and a span's first link costs
        # about a third of the span itself (docs/observability.md, "Cost").
        span = self._span = _tracer.start_span(
            name,
            context=base,
            kind=SpanKind.CONSUMER,
            attributes={**shared, sc.MESSAGE_ID: str(row.id), "taskq.attempt": int(row.attempt)},
            links=links,
            record_exception=False,
            set_status_on_exception=False,
        )
        # Current for the actor (its spans are children, its log lines carry the ids),
        # with the stored baggage: one attach.
        self._token = context.attach(trace.set_span_in_context(span, base))
        return span

    def __exit__(self, *exc: object) -> None:
        context.detach(self._token)
        self._span.end()


_ERROR_KINDS = frozenset({"failed", "retry", "release"})


def mark_span(span: Any, kind: str, error_class: str | None) -> None:
    """Stamp the attempt's outcome on its span: ``error.type`` and an error status for an
    attempt that failed (``failed``, ``retry``, a ``release`` by the worker); a snooze or
    a cancel is not an error (the cancel's mode is ``taskq.cancel``)."""
    if span is None or trace is None:
        return
    span.set_attribute("taskq.outcome", kind)
    if error_class is None:
        return
    if kind in _ERROR_KINDS:
        span.set_attribute(sc.ERROR_TYPE, error_class)
        span.set_status(Status(StatusCode.ERROR, error_class))
    elif kind == "cancelled":
        span.set_attribute("taskq.cancel", error_class)
    elif kind == "snooze":
        span.set_attribute("taskq.snooze", error_class)


def record_exception(span: Any, exc: BaseException) -> None:
    """Record what the actor raised on its process span (an ``exception`` event)."""
    if span is not None:
        span.record_exception(exc)


def record_throttled(job: Any, exc: Any) -> None:
    """A limit acquired inside the attempt denied ``job`` (``ReservationUnavailable``
    reaching the worker: the attempt snoozes for ``exc.retry_after``; the limits the
    dispatcher admits a job through park it instead, :func:`record_parked`). Counted in ``taskq.job.throttled.duration{primitive}`` and
    stamped on the process span."""
    primitive = denied_primitive()
    seconds = exc.retry_after.total_seconds()
    span = job.span
    if span is not None:
        span.set_attribute("taskq.throttled.bucket", exc.bucket_name)
        span.set_attribute("taskq.throttled.primitive", primitive)
        span.set_attribute("taskq.throttled.retry_after_s", seconds)
    if metrics_on():
        _throttled.record(
            seconds, {"primitive": primitive, "actor": job.ref.name, "queue": job.claimed.queue}
        )


# -- admission (parking) --------------------------------------------------------------


def admission_span(row: ClaimedJob, actor: str) -> contextlib.AbstractContextManager[Any]:
    """The ``admit {queue}`` span of one claimed job's per-job admission, current while
    its limits are acquired (``None``, and nothing made, when tracing is off)."""
    if not tracing_on():
        return _NO_SPAN
    return _admission_span(row, actor)


@contextlib.contextmanager
def _admission_span(row: ClaimedJob, actor: str) -> Iterator[Any]:
    carrier = row.trace_context
    creation = extract(carrier) if carrier else context.Context()
    queue = str(row.queue)
    attributes = sc.span_attributes("admit", queue)
    attributes[sc.MESSAGE_ID] = str(row.id)
    attributes["taskq.actor"] = actor
    waited = row.waiting_on
    if waited is not None:  # parked before, on this
        attributes["taskq.waited_on"] = str(waited)
    receive = row.receive
    with _tracer.start_as_current_span(
        sc.span_name("admit", queue),
        context=creation,
        kind=SpanKind.INTERNAL,
        attributes=attributes,
        links=[Link(receive)] if receive is not None else [],
    ) as span:
        yield span


def mark_admission(span: Any, parked: tuple[str, str, float] | None) -> None:
    """Stamp the admission's decision on its span: admitted, or ``parked`` as
    ``(name, primitive, delay_s)`` (what denied it, its kind, the time it is put back for)."""
    if span is None:
        return
    if parked is None:
        span.set_attribute("taskq.admission", "admitted")
        return
    name, primitive, delay_s = parked
    span.set_attribute("taskq.admission", "parked")
    span.set_attribute("taskq.waiting_on", name)
    span.set_attribute("taskq.throttled.primitive", primitive)
    span.set_attribute("taskq.throttled.delay_s", delay_s)


def record_parked(parks: Iterable[tuple[Any, str, float]]) -> None:
    """``taskq.job.throttled.duration{primitive,actor,queue}`` for parks just written:
    ``(job, primitive, delay_s)``, the time each job is put back for."""
    if not metrics_on():
        return
    for job, primitive, delay_s in parks:
        _throttled.record(
            delay_s, {"primitive": primitive, "actor": job.ref.name, "queue": job.claimed.queue}
        )


def _process_point(queue: str, actor: str, error: str | None) -> dict[str, str]:
    attributes = sc.metric_attributes("process", queue, error)
    attributes["taskq.actor"] = actor
    return attributes


def _count_settled(outcomes: Sequence[Any]) -> None:
    """The metrics of one written batch: the counts (one ``add`` per attribute set), and
    each attempt's ``messaging.process.duration`` point, from its claim to its outcome
    (an outcome of a job that never ran, undecodable or handed back at shutdown, has
    none). The points are recorded here, in one loop, not as each attempt ends: the same
    values, and on this machine about half the CPU per point (``docs/observability.md``)."""
    ended: Counter[tuple[str, str]] = Counter()
    retried: Counter[tuple[str, str]] = Counter()
    for outcome in outcomes:
        job = outcome.job
        kind = outcome.kind
        ended[(job.ref.name, kind)] += 1
        if kind == "retry":
            retried[(job.ref.name, str(job.claimed.queue))] += 1
        if job.task is not None:  # it ran: an attempt
            error = outcome.error_class if kind in _ERROR_KINDS else None
            key = (job.claimed.queue, job.ref.name, error)
            point = _POINTS.get(key) or _cached(_POINTS, key, _process_point)
            seconds = outcome.created_mono - job.claimed_mono
            _process.record(seconds if seconds > 0.0 else 0.0, point)
    for (actor, status), n in ended.items():
        _completed.add(n, {"actor": actor, "status": status})
    for (actor, queue), n in retried.items():
        _retries.add(n, {"actor": actor, "queue": queue})


# -- settle -------------------------------------------------------------------------


def settle_span(outcomes: Sequence[Any]) -> contextlib.AbstractContextManager[Any]:
    """The ``settle {queue}`` span around one terminal write of ``outcomes``, linked to
    their process spans, and its ``messaging.client.operation.duration``."""
    if not tracing_on() and not metrics_on():
        return _NO_SPAN
    return _settle_span(outcomes)


_SETTLE_LINKS = 128
"""A settle span links to at most this many of the attempts it writes (the first ones)."""


@contextlib.contextmanager
def _settle_span(outcomes: Sequence[Any]) -> Iterator[Any]:
    first = str(outcomes[0].job.claimed.queue)
    queues = {str(o.job.claimed.queue) for o in outcomes} if len(outcomes) > 1 else {first}
    one = first if len(queues) == 1 else None
    started = time.perf_counter()
    if tracing_on():
        attributes = dict(_span_base("settle", one))
        if len(outcomes) == 1:
            attributes[sc.MESSAGE_ID] = str(outcomes[0].job.id)
        else:
            attributes[sc.BATCH_COUNT] = len(outcomes)
        # Links to the attempts' process spans, those that were sampled (a link to one
        # that was not would point at nothing).
        links = []
        for outcome in outcomes[:_SETTLE_LINKS]:
            span = outcome.job.span
            if span is not None:
                linked = span.get_span_context()
                if linked.trace_flags.sampled:
                    links.append(Link(linked))
        settle = _tracer.start_span(
            sc.span_name("settle", queues),
            context=_EMPTY,
            kind=SpanKind.CLIENT,
            attributes=attributes,
            links=links,
        )
        with trace.use_span(settle, end_on_exit=True):
            yield settle
    else:
        yield None
    # Counted once written: a write that raised is retried, and counted then.
    if metrics_on():
        record_operation("settle", one, time.perf_counter() - started)
        _count_settled(outcomes)


# -- the fleet ----------------------------------------------------------------------


def record_reclaimed(actor: str, disposition: str) -> None:
    """Count one row the sweep took back from a worker presumed dead."""
    if metrics_on():
        _reclaimed.add(1, {"actor": actor, "disposition": disposition})


def watch_slots(worker: object, source: Callable[[], Iterable[Any]] | None) -> None:
    """Report the reservation slots ``worker`` holds (``source`` lists its ``SlotHold``s)
    in ``taskq.reservation.slots.held``; ``None`` stops (the worker stopped)."""
    if source is None:
        _slot_sources.pop(id(worker), None)
    else:
        _slot_sources[id(worker)] = source


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
