"""The benchmark's worker app with an OpenTelemetry SDK configured, as an application
would: every span through a ``BatchSpanProcessor`` and every metric through a periodic
reader, both to exporters that drop what they get (the cost measured is taskq's
instrumentation plus the SDK's, not a collector's network).

    python -m taskq.worker benchmarks.otel_worker:registry

``TASKQ_BENCH_OTEL`` picks the signals: ``traces,metrics`` (default), ``traces``,
``metrics`` or ``off`` (no SDK: the same app, the baseline). ``TASKQ_BENCH_SAMPLE``, a
ratio, samples traces with ``ParentBased(TraceIdRatioBased(ratio))`` (default: every
trace). The registry is the test apps' plus :func:`work`, an actor that spends 1 ms of
CPU per job.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Sequence
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    MetricExporter,
    MetricExportResult,
    MetricsData,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from tests.e2e.apps.basic import registry as _registry

from benchmarks.otel_actors import work


class DropSpans(SpanExporter):
    """Counts and drops spans."""

    exported = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        DropSpans.exported += len(spans)
        return SpanExportResult.SUCCESS


class DropMetrics(MetricExporter):
    """Drops metric batches."""

    def export(
        self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any
    ) -> MetricExportResult:
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        return None


def install(signals: str = "traces,metrics", sample: str | None = None) -> None:
    """Configure the global tracer and/or meter providers (once per process)."""
    if "traces" in signals:
        sampler = ParentBased(TraceIdRatioBased(float(sample))) if sample else None
        provider = TracerProvider(sampler=sampler)
        provider.add_span_processor(BatchSpanProcessor(DropSpans()))
        trace.set_tracer_provider(provider)
    if "metrics" in signals:
        reader = PeriodicExportingMetricReader(DropMetrics(), export_interval_millis=5_000)
        metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))


install(os.environ.get("TASKQ_BENCH_OTEL", "traces,metrics"), os.environ.get("TASKQ_BENCH_SAMPLE"))
if os.environ.get("TASKQ_BENCH_GC_FREEZE"):
    # What an application can do after its imports: the objects made so far are left out
    # of every later collection (a full one no longer walks them).
    gc.freeze()
registry: dict[str, Any] = {**_registry, work.name: work}
