"""A worker app that configures an OpenTelemetry SDK itself, as an application does, and
exports every finished span as one JSON line to ``$TASKQ_E2E_SPANS``.

taskq never configures an SDK: this module (imported by ``python -m taskq.worker
tests.e2e.apps.otel_app:registry``) is the application doing it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

from tests.e2e.apps import otel_actors


class JsonLinesExporter(SpanExporter):
    """Appends each span to a file: name, kind, ids (hex), parent, links, attributes."""

    def __init__(self, path: str) -> None:
        self.path = path

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        lines = []
        for span in spans:
            assert span.context is not None
            lines.append(
                json.dumps(
                    {
                        "name": span.name,
                        "kind": span.kind.name,
                        "trace_id": f"{span.context.trace_id:032x}",
                        "span_id": f"{span.context.span_id:016x}",
                        "parent_id": f"{span.parent.span_id:016x}" if span.parent else None,
                        "links": [f"{link.context.span_id:016x}" for link in span.links],
                        "status": span.status.status_code.name,
                        "attributes": dict(span.attributes or {}),
                    }
                )
            )
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, "".join(line + "\n" for line in lines).encode())
        finally:
            os.close(fd)
        return SpanExportResult.SUCCESS


_provider = TracerProvider()
_provider.add_span_processor(SimpleSpanProcessor(JsonLinesExporter(os.environ["TASKQ_E2E_SPANS"])))
trace.set_tracer_provider(_provider)


registry: dict[str, Any] = otel_actors.registry
