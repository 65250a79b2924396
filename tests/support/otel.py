"""An OpenTelemetry SDK for the tests that read taskq's spans and metrics.

OpenTelemetry takes one tracer provider and one meter provider per process, for good, so
every test module that needs them shares the ones :func:`otel` installs (once per xdist
worker). Spans go to an in-memory exporter (clear it first), metrics to an in-memory
reader (cumulative: filter the points by a name the test owns).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from taskq import telemetry


@dataclasses.dataclass
class Otel:
    spans: InMemorySpanExporter
    reader: InMemoryMetricReader

    def points(self, metric: str, **attributes: Any) -> dict[tuple[Any, ...], int]:
        """The current value of each point of counter ``metric`` whose attributes include
        ``attributes``, keyed by the point's other attributes (sorted by name)."""
        found: dict[tuple[Any, ...], int] = {}
        data = self.reader.get_metrics_data()
        for resource in data.resource_metrics if data is not None else ():
            for scope in resource.scope_metrics:
                for m in scope.metrics:
                    if m.name != metric:
                        continue
                    for point in m.data.data_points:
                        attrs = dict(point.attributes or {})
                        if all(attrs.get(k) == v for k, v in attributes.items()):
                            rest = tuple(
                                sorted((k, v) for k, v in attrs.items() if k not in attributes)
                            )
                            found[rest] = found.get(rest, 0) + int(point.value)  # type: ignore[union-attr]
        return found

    def all_points(self) -> list[tuple[str, dict[str, Any], Any]]:
        """Every exported point of every metric, as (metric name, attributes, point)."""
        data = self.reader.get_metrics_data()
        found: list[tuple[str, dict[str, Any], Any]] = []
        for resource in data.resource_metrics if data is not None else ():
            for scope in resource.scope_metrics:
                for m in scope.metrics:
                    for point in m.data.data_points:
                        found.append((m.name, dict(point.attributes or {}), point))
        return found

    def histogram_count(self, metric: str, **attributes: Any) -> int:
        """How many values histogram ``metric`` recorded, over the series whose attributes
        include ``attributes``."""
        return sum(
            int(point.count)
            for name, attrs, point in self.all_points()
            if name == metric and all(attrs.get(k) == v for k, v in attributes.items())
        )


_OTEL: Otel | None = None


def otel() -> Otel:
    """The process's SDK providers with in-memory export, installed on first use."""
    global _OTEL
    if _OTEL is None:
        tracer_provider = trace.get_tracer_provider()
        if not isinstance(tracer_provider, TracerProvider):
            tracer_provider = TracerProvider()
            trace.set_tracer_provider(tracer_provider)
        spans = InMemorySpanExporter()
        tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
        reader = InMemoryMetricReader()
        metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
        _OTEL = Otel(spans, reader)
    telemetry.tracing_on.recheck()
    telemetry.metrics_on.recheck()
    return _OTEL
