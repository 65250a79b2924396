"""What one OpenTelemetry SDK call costs on this machine, and what taskq adds to it.

    python benchmarks/otel_floor.py

Measured in CPU time of this thread (``time.thread_time``: other processes' load on a
shared machine moves it much less than wall time), best of several repeats, with the
SDK as ``benchmarks/otel_worker.py`` configures it (a ``BatchSpanProcessor`` and a
periodic metric reader, both exporting to exporters that drop what they get):

- the SDK's floor: a bare ``tracer.start_span(name, kind, attributes=<5 attrs>)`` +
  ``end()``; one ``histogram.record``; one ``counter.add``;
- taskq's ``process`` span (its context manager: the cached attributes, the link to the
  receive span, the job's id and attempt, one context attach/detach) with every trace
  sampled, and with ``ParentBased(TraceIdRatioBased(0.1))``;
- a histogram point recorded between other work (as if each attempt recorded its own)
  against the same points recorded in one loop (as taskq records them per written batch).

The figures are per call, in microseconds. Compare them with a no-op job's whole cost
(``benchmarks/throughput.py --otel``, worker CPU per job with no SDK).
"""

from __future__ import annotations

import json
import time
import timeit
import uuid
from collections.abc import Callable
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import SpanKind

from benchmarks.otel_worker import DropSpans  # configures the SDK, as the worker's app does
from taskq import otel_semconv as sc
from taskq import telemetry
from taskq.worker import telemetry as worker_telemetry
from taskq.worker.claimed import ClaimedJob

N = 2_000
"""Calls per timing; each figure is the best of ``REPEAT`` timings."""
REPEAT = 7


def per_call_us(fn: Callable[[], Any], calls: int = N) -> float:
    """The best per-call CPU time of ``fn`` over :data:`REPEAT` timings, in microseconds."""
    best = min(timeit.repeat(fn, timer=time.thread_time, number=calls, repeat=REPEAT))
    return best / calls * 1e6


def _job(n: int) -> ClaimedJob:
    return ClaimedJob(id=uuid.uuid4(), actor="noop", queue="default", payload={}, attempt=n)


def main() -> None:
    telemetry.tracing_on.recheck()
    telemetry.metrics_on.recheck()
    tracer = trace.get_tracer("bench")
    meter = metrics.get_meter("bench")
    histogram = meter.create_histogram(
        "bench.duration", unit="s", explicit_bucket_boundaries_advisory=sc.DURATION_BUCKETS
    )
    counter = meter.create_counter("bench.count")
    span_attributes = {**sc.span_attributes("process", "default"), "taskq.actor": "noop"}
    point = {**sc.metric_attributes("process", "default"), "taskq.actor": "noop"}
    receive = tracer.start_span("receive default")
    receive.end()
    jobs = [_job(i) for i in range(100)]
    for job in jobs:
        job.receive = receive.get_span_context()

    def bare_span() -> None:
        tracer.start_span(
            "process default", kind=SpanKind.CONSUMER, attributes=span_attributes
        ).end()

    def process_spans() -> None:
        for job in jobs:
            with worker_telemetry.process_span(job, "noop"):
                pass

    def other_work() -> None:  # a stand-in for the rest of an attempt's path
        for _ in range(4):
            json.loads('{"a": 1}')

    def interleaved() -> None:
        for job in jobs:
            with worker_telemetry.process_span(job, "noop"):
                other_work()
            histogram.record(0.001, point)

    def looped() -> None:
        for job in jobs:
            with worker_telemetry.process_span(job, "noop"):
                other_work()
        for _ in jobs:
            histogram.record(0.001, point)

    rows: list[tuple[str, float]] = [
        ("SDK span, 5 attributes, start + end", per_call_us(bare_span)),
        ("SDK histogram.record", per_call_us(lambda: histogram.record(0.001, point))),
        ("SDK counter.add", per_call_us(lambda: counter.add(1, point))),
        ("taskq process span, every trace sampled", per_call_us(process_spans, 20) / 100),
    ]
    interleaved_us = per_call_us(interleaved, 20) / 100
    looped_us = per_call_us(looped, 20) / 100
    sampled = TracerProvider(sampler=ParentBased(TraceIdRatioBased(0.1)))
    sampled.add_span_processor(BatchSpanProcessor(DropSpans()))
    saved = worker_telemetry._tracer
    worker_telemetry._tracer = sampled.get_tracer("taskq.worker")
    try:
        rows.append(
            ("taskq process span, 10 % of traces sampled", per_call_us(process_spans, 20) / 100)
        )
    finally:
        worker_telemetry._tracer = saved
    rows.append(
        (
            "a histogram point recorded between attempts' work, minus in one loop",
            interleaved_us - looped_us,
        )
    )
    width = max(len(label) for label, _ in rows)
    print(f"{'call':<{width}} | CPU per call")
    print(f"{'-' * width}-+-------------")
    for label, us in rows:
        print(f"{label:<{width}} | {us:8.1f} us")


if __name__ == "__main__":
    main()
