"""Every module of ``examples/actors`` runs as a user runs it and does what its docstring says.

Each example is started as ``python -m examples.actors.NAME --database-url URL`` in a
fresh process (nothing of the test process leaks in), on each SQL engine. The test then
reads the job store itself and checks the outcome the module's docstring promises, and
the lines it prints about it.
"""

from __future__ import annotations

import itertools
import os
import re
import subprocess
import sys
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.engine import URL

from taskq.db.tables import cron_schedules, job_attempts, jobs
from taskq_sync.db.engine import make_engine, transaction

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Stored:
    """One job row and its attempts, as the test reads them."""

    row: Any
    outcomes: list[str]
    attempt_errors: list[str | None]
    started: list[Any]


def assert_within_bucket(starts: list[Any], *, capacity: int, rate: float) -> None:
    """No stretch of time saw more starts than a full bucket plus its refill allows (one
    token of slack for the store's clock resolution)."""
    times = sorted(starts)
    for i, first in enumerate(times):
        for j in range(i + 1, len(times)):
            elapsed = (times[j] - first).total_seconds()
            assert j - i + 1 <= capacity + rate * elapsed + 1, (i, j, elapsed)


def _url(url: str | URL) -> str:
    return url if isinstance(url, str) else url.render_as_string(hide_password=False)


def _run(name: str, url: str | URL, cwd: Path, redis_url: str | None = None) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TASKQ_")}
    env["PYTHONPATH"] = str(ROOT)
    if redis_url is not None:
        env["TASKQ_REDIS_URL"] = redis_url
    proc = subprocess.run(
        [sys.executable, "-m", f"examples.actors.{name}", "--database-url", _url(url)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "jobs:" in proc.stdout, proc.stdout
    return proc.stdout


def _stored(url: str | URL, prefix: str) -> dict[str, list[Stored]]:
    """Every job whose actor starts with ``prefix``, by actor, in creation order."""
    engine = make_engine(_url(url))
    try:
        with transaction(engine, readonly=True) as conn:
            rows = conn.execute(
                select(jobs)
                .where(jobs.c.actor.startswith(prefix))
                .order_by(jobs.c.created_at, jobs.c.id)
            ).all()
            attempts: dict[Any, list[Any]] = defaultdict(list)
            for a in conn.execute(
                select(job_attempts).order_by(job_attempts.c.attempt, job_attempts.c.id)
            ).all():
                attempts[a.job_id].append(a)
    finally:
        engine.dispose()
    out: dict[str, list[Stored]] = defaultdict(list)
    for r in rows:
        tries = attempts.get(r.id, [])
        out[r.actor].append(
            Stored(
                r,
                [a.outcome for a in tries],
                [a.error_class for a in tries],
                [a.started_at for a in tries],
            )
        )
    return out


def _statuses(found: list[Stored]) -> list[str]:
    return [s.row.status for s in found]


def test_basic(engine_url: str | URL, tmp_path: Path) -> None:
    out = _run("basic", engine_url, tmp_path)
    found = _stored(engine_url, "examples_basic_")["examples_basic_greet"]
    assert _statuses(found) == ["succeeded"] * 4
    assert all(s.outcomes == ["succeeded"] for s in found)
    assert sorted(s.row.result["message"] for s in found) == [
        "hello, Ada",
        "hello, Barbara",
        "hello, Edsger",
        "hello, Grace",
    ]
    assert "the delayed one is 'scheduled'" in out
    assert "handle.wait() returned Greeted(message='hello, Ada')" in out
    assert "direct invocation returned 'hello, in-process' without writing a job" in out


def test_failure(engine_url: str | URL, tmp_path: Path) -> None:
    out = _run("failure", engine_url, tmp_path)
    found = _stored(engine_url, "examples_failure_")
    expected = {
        "flaky": ("succeeded", ["retried", "retried", "succeeded"], None),
        "doomed": ("failed", ["retried", "failed"], "RuntimeError"),
        "strict": ("failed", ["failed"], "ValueError"),
        "slow": ("failed", ["failed"], "StartToCloseTimeout"),
        "polite": ("succeeded", ["retried", "succeeded"], None),
    }
    for short, (status, outcomes, error_class) in expected.items():
        [job] = found[f"examples_failure_{short}"]
        assert (job.row.status, job.outcomes, job.row.error_class) == (
            status,
            outcomes,
            error_class,
        ), short
    [polite] = found["examples_failure_polite"]
    [flaky] = found["examples_failure_flaky"]
    assert flaky.row.budget_used == 2  # each retry spent one
    assert polite.row.budget_used == 0  # the RetryAfter(consume_budget=False) spent nothing
    assert "on_retry_exhausted: examples_failure_doomed gave up after RuntimeError" in out
    assert "JobFailedError(status='failed', error_class='RuntimeError')" in out


def test_ratelimit(engine_url: str | URL, tmp_path: Path) -> None:
    out = _run("ratelimit", engine_url, tmp_path)
    found = _stored(engine_url, "examples_ratelimit_")
    every = [s for group in found.values() for s in group]
    assert len(every) == 15
    assert {s.row.status for s in every} == {"succeeded"}
    renders = found["examples_ratelimit_render_pdf"]
    assert [s.row.result["in_flight"] for s in renders] == [1, 1]
    assert sorted(s.row.result["tenant"] for s in found["examples_ratelimit_sync_tenant"]) == (
        ["acme"] * 3 + ["globex"] * 2
    )
    for s in every:
        # A limit never costs an attempt: each job ran once, and no attempt row says
        # snoozed (a denial parks the job or leaves it unclaimed; it is not an attempt).
        assert (s.outcomes, s.attempt_errors) == (["succeeded"], [None]), s.outcomes
        assert (s.row.attempt, s.row.budget_used) == (1, 0)
        assert s.row.waiting_on is None  # cleared once it ran
    # The static bucket is checked before the claim: no geocode job was ever parked, and
    # the worker admitted no more than the bucket allows over any stretch of time.
    geocodes = found["examples_ratelimit_geocode"]
    assert sum(s.row.denials for s in geocodes) == 0
    assert_within_bucket([s.started[0] for s in geocodes], capacity=2, rate=10)
    # The keyed bucket (capacity 1 per tenant) is checked after the claim: acme's jobs,
    # claimed together, were parked on it (and no attempt was written for the parks).
    acme = [s for s in found["examples_ratelimit_sync_tenant"] if s.row.result["tenant"] == "acme"]
    assert sum(s.row.denials for s in acme) >= 1
    assert "attempts a limit cost (snoozed attempt rows): 0" in out
    parked = sum(s.row.denials for s in found["examples_ratelimit_sync_tenant"])
    assert (
        f"parks the store counted (jobs.denials): {parked} for examples_ratelimit_sync_tenant, "
        "0 for examples_ratelimit_geocode (held before the claim)"
    ) in out
    assert "renders in flight when each started: [1, 1]" in out


def test_chained(engine_url: str | URL, tmp_path: Path) -> None:
    out = _run("chained", engine_url, tmp_path)
    found = _stored(engine_url, "examples_chained_")
    [order] = found["examples_chained_place_order"]
    [charge] = found["examples_chained_charge_card"]
    [receipt] = found["examples_chained_send_receipt"]
    [batch] = found["examples_chained_split_batch"]
    resizes = found["examples_chained_resize"]
    assert order.row.parent_job_id is None
    assert charge.row.parent_job_id == order.row.id
    assert receipt.row.parent_job_id == charge.row.id
    assert [r.row.parent_job_id for r in resizes] == [batch.row.id] * 3
    assert sorted(r.row.result["name"] for r in resizes) == ["a.png", "b.png", "c.png"]
    assert [s.row.tags for s in (order, charge, receipt)] == [["order:1001"]] * 3
    every = [s for group in found.values() for s in group]
    assert {s.row.status for s in every} == {"succeeded"}
    assert len(every) == 7
    assert "parent of examples_chained_send_receipt: examples_chained_charge_card" in out


def test_di(engine_url: str | URL, tmp_path: Path) -> None:
    out = _run("di", engine_url, tmp_path)
    found = _stored(engine_url, "examples_di_")["examples_di_fetch"]
    assert _statuses(found) == ["succeeded"] * 3
    assert len({s.row.result["http_id"] for s in found}) == 1  # LOOP: one for all jobs
    assert len({s.row.result["request_id"] for s in found}) == 3  # TRANSIENT: one each
    lines = [line for line in out.splitlines() if "http client" in line or "request log" in line]
    http_id = found[0].row.result["http_id"]
    assert lines[0] == f"http client {http_id} opened"
    assert lines[-1] == f"http client {http_id} closed"  # torn down when the worker stopped
    assert sorted(lines[1:-1]) == sorted(
        f"request log {s.row.result['request_id']} flushed" for s in found
    )


def test_batch(engine_url: str | URL, tmp_path: Path) -> None:
    out = _run("batch", engine_url, tmp_path)
    found = _stored(engine_url, "examples_batch_")["examples_batch_square"]
    assert len(found) == 502  # the rejected batch of 11 wrote nothing
    assert {s.row.status for s in found} == {"succeeded"}
    assert all(s.outcomes == ["succeeded"] for s in found)  # none ran twice
    urgent = [s for s in found if s.row.tags == ["urgent"]]
    assert sorted(s.row.result["value"] for s in urgent) == [49, 81]
    assert {s.row.priority for s in urgent} == {5}
    expected = sum(n * n for n in range(500)) + 49 + 81
    assert sum(s.row.result["value"] for s in found) == expected
    assert "rejected batch: PayloadValidationError" in out
    assert "before 0, after 0" in out
    assert f"sum of the squares: {expected} (expected {expected})" in out


def test_advanced(engine_url: str | URL, tmp_path: Path) -> None:
    out = _run("advanced", engine_url, tmp_path)
    found = _stored(engine_url, "examples_advanced_")
    assert _statuses(found["examples_advanced_nightly_report"]) == ["succeeded"]
    assert sorted(_statuses(found["examples_advanced_sync_account"])) == [
        "cancelled",
        "succeeded",
    ]
    [cancelled] = [
        s for s in found["examples_advanced_sync_account"] if s.row.status != "succeeded"
    ]
    assert cancelled.row.error_class == "CancelledBeforeStart"
    assert cancelled.outcomes == []
    assert _statuses(found["examples_advanced_charge"]) == ["succeeded"]
    assert _statuses(found["examples_advanced_ingest"]) == ["succeeded"] * 2
    [export] = found["examples_advanced_wait_for_export"]
    assert export.outcomes == ["snoozed", "succeeded"]
    assert export.row.budget_used == 0
    for line in (
        "singleton: second enqueue refused, blocked by the first job: True",
        "unique_for: second enqueue was_existing=True, same job: True",
        "idempotency_key: second enqueue was_existing=True",
        "max_pending: enqueue 3 refused (2/2)",
        "cancelled before start: cancelled / CancelledBeforeStart",
        "on_success: examples_advanced_nightly_report finished",
    ):
        assert line in out
    assert "actor_config_unique_for_ignored" not in out


def test_progress(engine_url: str | URL, tmp_path: Path) -> None:
    out = _run("progress", engine_url, tmp_path)
    [job] = _stored(engine_url, "examples_progress_")["examples_progress_transcode"]
    assert job.row.status == "succeeded"
    assert job.row.progress == {"step": 5, "percent": 100.0, "detail": "done"}
    percents = [float(p) for p in re.findall(r"row progress: .*'percent': ([\d.]+)", out)]
    assert percents
    assert percents == sorted(percents)
    assert percents[-1] == 100.0
    [end] = re.findall(r"^stored on the row at the end: (.*)$", out, re.M)
    assert all(part in end for part in ("'step': 5", "'percent': 100.0", "'detail': 'done'"))


def test_tags(engine_url: str | URL, tmp_path: Path) -> None:
    out = _run("tags", engine_url, tmp_path)
    found = _stored(engine_url, "examples_tags_")
    inherited = ["tenant:acme", "import:7"]
    assert [s.row.tags for s in found["examples_tags_import_file"]] == [inherited]
    assert [s.row.tags for s in found["examples_tags_import_row"]] == [inherited] * 2
    assert [s.row.tags for s in found["examples_tags_audit"]] == [[*inherited, "audit"]]
    assert [s.row.tags for s in found["examples_tags_notify"]] == [["notify"]]
    assert "tags of examples_tags_notify: ['notify']" in out


def test_sync(engine_url: str | URL, tmp_path: Path) -> None:
    out = _run("sync", engine_url, tmp_path)
    found = _stored(engine_url, "examples_sync_")
    thumbs = found["examples_sync_make_thumbnail"]
    assert _statuses(thumbs) == ["succeeded"] * 4
    assert all(s.row.result["thread"] != "MainThread" for s in thumbs)
    [export] = found["examples_sync_long_export"]
    assert (export.row.status, export.row.error_class) == ("cancelled", "CancelledCooperatively")
    assert "make_thumbnail.is_sync=True" in out


def test_real_world(engine_url: str | URL, tmp_path: Path) -> None:
    out = _run("real_world", engine_url, tmp_path)
    found = _stored(engine_url, "examples_orders_")
    orders = found["examples_orders_process_order"]
    receipts = found["examples_orders_send_receipt"]
    assert len(orders) == 2  # the double click made no second job
    assert all(s.outcomes == ["retried", "succeeded"] for s in orders)
    assert sorted(r.row.parent_job_id for r in receipts) == sorted(o.row.id for o in orders)
    assert {r.row.status for r in receipts} == {"succeeded"}
    assert len(re.findall(r"^charged ", out, re.M)) == 2  # one charge per order
    assert len(re.findall(r"^OrderResult: CONF-", out, re.M)) == 2
    assert "already queued" in out


def test_cron(engine_url: str | URL, tmp_path: Path) -> None:
    out = _run("cron", engine_url, tmp_path)
    found = _stored(engine_url, "examples_cron_")

    # The code schedule: one job per tick, keyed by the tick, plus one run-now job.
    beats = found["examples_cron_heartbeat"]
    assert {s.row.status for s in beats} == {"succeeded"}
    assert {s.row.metadata["cron_schedule"] for s in beats} == {"examples-cron-heartbeat"}
    [manual] = [s for s in beats if s.row.metadata["cron_tick"] == "run-now"]
    ticked = [s for s in beats if s is not manual]
    assert len(ticked) >= 3
    ticks = [s.row.metadata["cron_tick"] for s in ticked]
    assert len(set(ticks)) == len(ticks)  # no tick has two jobs
    for s, tick in zip(ticked, ticks, strict=True):
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", tick)
        assert s.row.idempotency_key == f"cron:{tick}:examples-cron-heartbeat"
    assert manual.row.idempotency_key.startswith("cron:manual-")
    assert f"{len(ticked)} ticks, {len(ticked)} distinct idempotency keys" in out
    assert f"heartbeat: run_now made job {manual.row.id} (cron_tick='run-now'), " in out
    assert "last_outcome='run-now'" in out
    assert f"heartbeat: disabled (enabled=False, origin='code'), {len(ticked)} jobs enqueued" in out

    # Four daily ticks were due; each missed policy ran what it promises.
    nightly: dict[str, list[str]] = defaultdict(list)
    for s in found["examples_cron_nightly_rollup"]:
        assert (s.row.status, s.outcomes) == ("succeeded", ["succeeded"])
        nightly[s.row.metadata["cron_schedule"]].append(s.row.metadata["cron_tick"])
    assert sorted(nightly) == ["examples-cron-nightly-all", "examples-cron-nightly-latest"]
    caught_up = sorted(nightly["examples-cron-nightly-all"])
    assert len(caught_up) == 3
    days = [datetime.fromisoformat(t.replace("Z", "+00:00")) for t in caught_up]
    assert [b - a for a, b in itertools.pairwise(days)] == [timedelta(days=1)] * 2
    assert nightly["examples-cron-nightly-latest"] == [caught_up[-1]]  # the most recent
    assert "missed='latest': 1 job for the 4 missed ticks (days before the last one: 0d;" in out
    assert (
        "missed='all': 3 jobs for the 4 missed ticks (days before the last one: 2d, 1d, 0d;" in out
    )
    assert "missed='skip': 0 jobs for the 4 missed ticks" in out

    # The backlog budget: the waiting job made every tick a refusal until it was cancelled.
    refresh = found["examples_cron_refresh_cache"]
    blocker, *made = refresh
    assert (blocker.row.status, blocker.row.error_class, blocker.outcomes) == (
        "cancelled",
        "CancelledBeforeStart",
        [],
    )
    assert made
    assert {s.row.status for s in made} == {"succeeded"}
    assert {s.row.metadata["cron_schedule"] for s in made} == {"examples-cron-refresh"}
    refused = re.search(
        r"^refresh_cache: (\d+) ticks refused while one job waited, "
        r"last_outcome='refused:max_pending'$",
        out,
        re.M,
    )
    assert refused is not None
    assert int(refused.group(1)) >= 2
    assert "after the waiting job was cancelled, last_outcome='enqueued'" in out

    engine = make_engine(_url(engine_url))
    try:
        with transaction(engine, readonly=True) as conn:
            left = conn.execute(select(cron_schedules.c.id)).all()
    finally:
        engine.dispose()
    assert left == []  # the example deleted its schedules; their jobs stayed


def test_ratelimit_and_progress_on_redis(pg_url: URL, redis_url: str, tmp_path: Path) -> None:
    """With TASKQ_REDIS_URL the buckets are Redis ones and progress is streamed from Redis."""
    out = _run("ratelimit", pg_url, tmp_path, redis_url)
    found = _stored(pg_url, "examples_ratelimit_")
    assert {s.row.status for group in found.values() for s in group} == {"succeeded"}
    assert "renders in flight when each started: [1, 1]" in out
    out = _run("progress", pg_url, tmp_path, redis_url)
    events = re.findall(r"^seq (\d+): (\w+) ", out, re.M)
    seqs = [int(n) for n, _ in events]
    assert seqs == sorted(set(seqs))  # in seq order, no duplicate
    assert events[-1][1] == "succeeded"
    assert "progress" in {kind for _, kind in events}
    [job] = _stored(pg_url, "examples_progress_")["examples_progress_transcode"]
    assert job.row.status == "succeeded"


def test_every_example_module_is_tested() -> None:
    modules = {p.stem for p in (ROOT / "examples" / "actors").glob("*.py")} - {
        "__init__",
        "runner",
    }
    tested = {name.removeprefix("test_") for name in globals() if name.startswith("test_")}
    assert modules <= tested, modules - tested
