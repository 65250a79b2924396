"""The worker's log lines (:mod:`taskq.logs`) and the semantic-convention helpers
(:mod:`taskq.otel_semconv`). structlog's configuration is process-global, so the logging
checks run in a fresh interpreter."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import textwrap

from taskq import otel_semconv as sc
from taskq.logs import wants_json


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_json_unless_a_terminal_or_told() -> None:
    assert wants_json("auto", io.StringIO()) is True
    assert wants_json("auto", _Tty()) is False
    assert wants_json("json", _Tty()) is True
    assert wants_json("console", io.StringIO()) is False


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )


def test_worker_logging_writes_one_json_object_per_event_through_stdlib() -> None:
    done = _run(
        """
        import logging, structlog
        from taskq.logs import configure_logging
        configure_logging("INFO", "auto")
        log = structlog.get_logger("taskq.worker").bind(job_id="j1", actor="a", attempt=2)
        log.info("job-started", worker_id="w1")
        log.debug("job-noise")
        logging.getLogger("taskq.other").warning("plain stdlib line")
        """
    )
    lines = [json.loads(line) for line in done.stderr.splitlines()]
    assert [line["event"] for line in lines] == ["job-started", "plain stdlib line"]
    first = lines[0]
    assert {k: first[k] for k in ("job_id", "actor", "attempt", "worker_id")} == {
        "job_id": "j1",
        "actor": "a",
        "attempt": 2,
        "worker_id": "w1",
    }
    assert first["level"] == "info"
    assert first["logger"] == "taskq.worker"
    assert lines[1]["level"] == "warning"


def test_the_applications_handlers_see_taskq_lines_and_the_span() -> None:
    """An application with its own root handler keeps it; taskq's lines reach it as
    stdlib records, with the current span's ids."""
    done = _run(
        """
        import logging, structlog
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        seen = []
        class Keep(logging.Handler):
            def emit(self, record):
                seen.append(record)
        logging.getLogger().addHandler(Keep())
        trace.set_tracer_provider(TracerProvider())
        from taskq.logs import configure_logging
        configure_logging("INFO", "json")
        with trace.get_tracer("t").start_as_current_span("s") as span:
            structlog.get_logger("taskq.worker").info("job-started", job_id="j1")
        [record] = seen
        event = record.msg
        print(record.name, event["event"], event["trace_id"] == f"{span.get_span_context().trace_id:032x}")
        """
    )
    assert done.stdout.split() == ["taskq.worker", "job-started", "True"]
    assert done.stderr == ""  # no handler of taskq's own next to the application's


def test_opt_in_values_and_the_duplicated_legacy_attribute() -> None:
    assert sc.opt_in(" http, messaging/dup ,") == {"http", "messaging/dup"}
    assert sc.opt_in(None) == frozenset()
    current = sc.span_attributes("send", "q", legacy=False)
    assert current == {
        "messaging.system": "taskq",
        "messaging.operation.name": "send",
        "messaging.operation.type": "send",
        "messaging.destination.name": "q",
    }
    assert sc.span_attributes("send", "q", legacy=True)["messaging.operation"] == "publish"
    assert sc.span_name("process", {"a"}) == "process a"
    assert sc.span_name("receive", {"a", "b"}) == "receive"
    assert sc.metric_attributes("process", "q", "KeyError")["error.type"] == "KeyError"


def test_with_the_api_and_no_sdk_everything_is_the_shared_no_op() -> None:
    """No SDK configured (a fresh interpreter): no span is made, no metric recorded; the
    call sites get the one shared no-op context manager."""
    done = _run(
        """
        from taskq import telemetry
        from taskq.worker import telemetry as worker
        assert not telemetry.tracing_on() and not telemetry.metrics_on()
        send = telemetry.enqueue_span(["a"], 1)
        assert send is telemetry.enqueue_span(["b"], 5)
        with send as handle:
            assert handle is None
        assert worker.settle_span([]) is worker.settle_span([])
        from uuid import uuid4
        from taskq.worker.claimed import ClaimedJob
        claimed = ClaimedJob(id=uuid4(), actor="a", queue="q", payload={}, attempt=1)
        with worker.process_span(claimed, "a") as span:
            assert span is None
        assert worker.claim_started() == 0 and telemetry.acquire_started() == 0
        worker.record_received(["q"], [claimed], 0)
        print("ok")
        """
    )
    assert done.stdout.strip() == "ok"
