"""The worker's logging: structlog through the standard library, JSON or console lines.

Every taskq module logs with ``structlog.get_logger("taskq....")``, one event name per
line (``job-failed``, ``worker-claim-failed``) with its fields as key/values. When the
application has not configured structlog itself, :func:`configure_logging` routes
structlog through :mod:`logging` (so the application's handlers, and OpenTelemetry's
log bridge, see every line) and installs one stderr handler rendering JSON objects, or
the console renderer on a terminal. Lines logged inside a span carry its ``trace_id`` and
``span_id``. An application that configured structlog, or gave the root logger handlers,
keeps its configuration: taskq only sets the ``taskq`` logger's level.
"""

from __future__ import annotations

import logging
import sys
from typing import Any, Literal

import structlog

__all__ = ["add_trace_ids", "configure_logging", "wants_json"]

LogFormat = Literal["auto", "json", "console"]

try:
    from opentelemetry import trace
except ImportError:  # pragma: no cover - the otel extra is optional
    trace = None  # type: ignore[assignment]


def add_trace_ids(_logger: Any, _name: str, event: dict[str, Any]) -> dict[str, Any]:
    """structlog processor: the current span's ``trace_id``/``span_id`` (hex), if any."""
    if trace is not None:
        span_context = trace.get_current_span().get_span_context()
        if span_context.is_valid:
            event.setdefault("trace_id", f"{span_context.trace_id:032x}")
            event.setdefault("span_id", f"{span_context.span_id:016x}")
    return event


def wants_json(fmt: LogFormat, stream: Any = None) -> bool:
    """JSON for ``json``; for ``auto``, unless ``stream`` (stderr) is a terminal."""
    if fmt != "auto":
        return fmt == "json"
    stream = sys.stderr if stream is None else stream
    isatty = getattr(stream, "isatty", None)
    return not (isatty is not None and isatty())


def configure_logging(level: str, fmt: LogFormat = "auto") -> None:
    """Set up structlog and stdlib logging for a worker process (see the module doc)."""
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        raise ValueError(f"unknown log level {level!r}")
    logging.getLogger("taskq").setLevel(numeric)
    if structlog.is_configured():
        return
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_logger_name,
        structlog.stdlib.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        add_trace_ids,
    ]
    structlog.configure(
        processors=[
            structlog.stdlib.filter_by_level,
            *shared,
            structlog.stdlib.PositionalArgumentsFormatter(),
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            structlog.processors.UnicodeDecoder(),
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )
    root = logging.getLogger()
    if root.handlers:  # the application's handlers get the lines, formatted their way
        return
    renderer: Any = (
        structlog.processors.JSONRenderer(default=str)
        if wants_json(fmt)
        else structlog.dev.ConsoleRenderer(colors=False)
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=shared,
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
        )
    )
    root.addHandler(handler)
