"""One trace from a web request to a job's attempt in another process.

The test process enqueues inside a ``request`` span (its SDK: :mod:`tests.support.otel`);
a real worker process, whose application configured its own SDK
(:mod:`tests.e2e.apps.otel_app`), exports its spans to a file. The attempt's
``process`` span is in the request's trace, a child of the ``send`` span, and the
worker's JSON log line for it carries the same trace id and the bound job fields.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from opentelemetry import trace
from sqlalchemy.engine import URL

from taskq.backends.sql import SqlBackend
from taskq.client import JobsClient
from taskq.db.engine import make_engine
from taskq.settings import TaskQSettings
from tests.e2e.apps import otel_actors
from tests.support.otel import otel
from tests.support.workers import spawn_worker, stop_worker, wait_until


def _json_lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.startswith("{")]


async def test_a_job_enqueued_in_a_request_is_processed_in_the_same_trace(
    pg_url: URL, settings: TaskQSettings, tmp_path: Path, procs: list[subprocess.Popen[bytes]]
) -> None:
    sdk = otel()
    sdk.spans.clear()
    spans_file = tmp_path / "spans.jsonl"
    log = tmp_path / "worker.log"
    engine = make_engine(pg_url, settings=settings)
    try:
        client = JobsClient(SqlBackend(engine, settings=settings))
        with trace.get_tracer("web").start_as_current_span("POST /orders") as request:
            handle = await client.enqueue(otel_actors.order, otel_actors.Order(n=7))
        job_id = str(handle.job_id)
        [send] = [s for s in sdk.spans.get_finished_spans() if s.name == "send default"]
        proc = spawn_worker(
            pg_url,
            "tests.e2e.apps.otel_app:registry",
            log_path=log,
            env={"TASKQ_E2E_SPANS": str(spans_file)},
        )
        procs.append(proc)

        def settled() -> list[dict[str, Any]]:
            return [
                s
                for s in _json_lines(spans_file)
                if s["name"] == "settle default" and s["kind"] == "CLIENT"
            ]

        async def written() -> bool:
            return bool(settled())

        await wait_until(written, timeout=60)
        assert stop_worker(proc) == 0, log.read_text()[-4000:]
    finally:
        await engine.dispose()

    exported = _json_lines(spans_file)
    [process] = [s for s in exported if s["name"] == "process default"]
    trace_id = f"{request.get_span_context().trace_id:032x}"
    assert process["kind"] == "CONSUMER"
    assert process["trace_id"] == trace_id
    assert process["parent_id"] == f"{send.context.span_id:016x}"
    assert process["attributes"]["messaging.message.id"] == job_id
    assert process["attributes"]["taskq.outcome"] == "succeeded"
    assert process["attributes"]["taskq.actor"] == "otel_e2e_order"
    [receive] = [s for s in exported if s["name"] == "receive default"]
    assert receive["attributes"]["messaging.batch.message_count"] == 1
    assert process["links"] == []  # related to its creation (the parent), not the claim
    assert any(process["span_id"] in s["links"] for s in settled())

    [line] = [entry for entry in _json_lines(log) if entry.get("event") == "order-processed"]
    assert line["trace_id"] == trace_id
    assert line["span_id"] == process["span_id"]  # ctx.log inside ctx.span
    assert (line["job_id"], line["actor"], line["attempt"], line["n"]) == (
        job_id,
        "otel_e2e_order",
        1,
        7,
    )
    assert line["worker_id"]
