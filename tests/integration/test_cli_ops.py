"""``taskq jobs | queues pause/resume | workers | ratelimit`` through Click's runner against real
Postgres and SQLite: output, ``--json`` documents and the database state they leave; and a
few through the installed console script for the exit codes."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import structlog
from click.testing import CliRunner
from sqlalchemy import insert, select
from sqlalchemy.ext.asyncio import AsyncEngine

from taskq.cli import main
from taskq.db.tables import leader_leases, queues, workers
from taskq.settings import TaskQSettings
from tests.support import ops as s
from tests.support.cli import db


def run(*args: str, input: str | None = None) -> tuple[int, str]:
    # A fresh `taskq` process starts with structlog unconfigured; an earlier test in this
    # process may have left it configured (capture_logs does), printing to stdout.
    structlog.reset_defaults()
    result = CliRunner().invoke(main, list(args), input=input, catch_exceptions=False)
    return result.exit_code, result.output


def seed(url: str, settings: TaskQSettings, n: int = 1, **kw: Any) -> list[Any]:
    return db(url, settings, lambda e: s.seed(e, n, **kw))


def rows(url: str, settings: TaskQSettings) -> dict[Any, Any]:
    return db(url, settings, s.rows)


def test_jobs_list_filters_pages_and_json(url: str, settings: TaskQSettings) -> None:
    made = seed(url, settings, 5, actor="cli_a", tags=["x"])
    other = seed(url, settings, 2, actor="cli_b", status="failed", error_class="Boom")
    code, out = run("jobs", "list", "--actor", "cli_a", "--limit", "3", "--database-url", url)
    assert code == 0, out
    lines = out.splitlines()
    assert lines[0].split() == [
        "ID",
        "ACTOR",
        "QUEUE",
        "STATUS",
        "ATTEMPT",
        "CREATED",
        "ERROR_CLASS",
    ]
    assert [line.split()[0] for line in lines[1:4]] == [str(i) for i in reversed(made[2:])]
    assert lines[4].startswith("more: --after ")
    cursor = lines[4].split()[-1]
    code, out = run(
        "jobs", "list", "--actor", "cli_a", "--after", cursor, "--json", "--database-url", url
    )
    doc = json.loads(out)
    assert [j["id"] for j in doc["jobs"]] == [str(made[1]), str(made[0])]
    assert doc["next_cursor"] is None
    assert doc["jobs"][0]["tags"] == ["x"]
    code, out = run(
        "jobs",
        "list",
        "--status",
        "failed",
        "--error-class",
        "Boom",
        "--json",
        "--database-url",
        url,
    )
    assert {j["id"] for j in json.loads(out)["jobs"]} == {str(i) for i in other}
    code, out = run("jobs", "count", "--tag", "x", "--json", "--database-url", url)
    assert json.loads(out) == {"count": 5, "capped": False, "cap": 10000}
    code, out = run("jobs", "count", "--cap", "2", "--database-url", url)
    assert (code, out.strip()) == (0, "2+")
    code, out = run("jobs", "list", "--actor", "nobody", "--database-url", url)
    assert (code, out.strip()) == (0, "no jobs match")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["list", "--status", "done"], "unknown job status 'done'"),
        (["list", "--queue", "a:b"], "invalid queue name"),
        (["list", "--after", "zzz"], "invalid cursor"),
        (["list", "--limit", "0"], "0 is not in the range"),
        (["list", "--created-after", "yesterday"], "is not a duration"),
        (["get", "nope"], "is not a job id"),
        (["purge", "--older-than", "7"], "is not a duration"),
        (["purge", "--older-than", "1.5h"], "is not a duration"),
        (["purge", "--older-than", "7d", "--status", "pending"], "'pending' is not one of"),
        (["cancel-where"], "give at least one filter option"),
        (["retry-where"], "give at least one filter option"),
        (["enqueue", "x", "--payload", "[1]"], "must be a JSON object"),
        (["enqueue", "x", "--payload", "{"], "not JSON"),
    ],
)
def test_bad_input_is_a_usage_error_and_changes_nothing(
    url: str, settings: TaskQSettings, args: list[str], message: str
) -> None:
    seed(url, settings, 2)
    seed(url, settings, 1, status="succeeded")
    before = rows(url, settings)
    code, out = run("jobs", *args, "--database-url", url)
    assert code == 2, out
    assert message in out
    assert "Traceback" not in out
    assert rows(url, settings) == before


def test_get_shows_the_job_and_its_attempts(url: str, settings: TaskQSettings) -> None:
    [job_id] = seed(url, settings, status="failed", attempt=2, error_class="Boom", error="boom")
    db(url, settings, lambda e: s.add_attempt(e, job_id, 1, "retried"))
    db(url, settings, lambda e: s.add_attempt(e, job_id, 2, "failed"))
    code, out = run("jobs", "get", str(job_id), "--database-url", url)
    assert code == 0, out
    assert f"id:           {job_id}" in out
    assert "status:       failed" in out
    assert "attempts:     2" in out
    assert "  #1 retried Boom boom" in out
    code, out = run("jobs", "get", str(job_id), "--json", "--database-url", url)
    doc = json.loads(out)
    assert doc["job"]["id"] == str(job_id)
    assert [a["outcome"] for a in doc["attempts"]] == ["retried", "failed"]
    assert doc["manual_retries"] == []
    missing = uuid.uuid4()
    code, out = run("jobs", "get", str(missing), "--database-url", url)
    assert code == 1
    assert f"JobNotFoundError: job {missing} does not exist [job_id={missing}]" in out


def test_cancel_and_cancel_where(url: str, settings: TaskQSettings) -> None:
    [queued] = seed(url, settings)
    [running] = seed(url, settings, status="running")
    [done] = seed(url, settings, status="succeeded")
    code, out = run("jobs", "cancel", str(queued), "--database-url", url)
    assert (code, out.strip()) == (0, f"job {queued}: cancelled before start")
    code, out = run("jobs", "cancel", str(running), "--json", "--database-url", url)
    doc = json.loads(out)
    assert doc["outcome"].startswith("cancel requested")
    assert doc["job"]["cancel_phase"] == 1
    code, out = run("jobs", "cancel", str(done), "--database-url", url)
    assert "already succeeded: nothing to cancel" in out

    tagged = seed(url, settings, 4, tags=["camp"])
    [tagged_running] = seed(url, settings, status="running", tags=["camp"])
    untouched = seed(url, settings, 2, tags=["other"])
    before = rows(url, settings)
    # Without a TTY and without --yes: refused, nothing changed.
    code, out = run("jobs", "cancel-where", "--tag", "camp", "--database-url", url)
    assert code == 1
    assert "refused: not a terminal; pass --yes" in out
    assert rows(url, settings) == before
    code, out = run(
        "jobs", "cancel-where", "--tag", "camp", "--yes", "--json", "--database-url", url
    )
    assert code == 0, out
    assert json.loads(out) == {
        "cancelled_before_start": 4,
        "cancel_requested": 1,
        "not_reached": 0,
        "total": 5,
    }
    after = rows(url, settings)
    assert {after[i].error_class for i in tagged} == {"CancelledBeforeStart"}
    assert after[tagged_running].cancel_phase == 1
    assert all(after[i] == before[i] for i in untouched)


def test_retry_and_retry_where(url: str, settings: TaskQSettings) -> None:
    [one] = seed(url, settings, status="failed", budget_used=3)
    code, out = run("jobs", "retry", str(one), "--database-url", url)
    assert code == 0, out
    assert "pending again" in out
    assert rows(url, settings)[one].budget_used == 0
    code, out = run("jobs", "retry", str(one), "--database-url", url)
    assert code == 1
    assert f"JobNotRetryableError: job {one} is pending" in out
    assert "status=pending" in out

    crashed = seed(url, settings, 3, status="crashed", actor="cli_r")
    code, out = run(
        "jobs", "retry-where", "--actor", "cli_r", "--yes", "--json", "--database-url", url
    )
    assert json.loads(out) == {"retried": 3, "by_status": {"crashed": 3}, "singleton_blocked": []}
    assert {rows(url, settings)[i].status for i in crashed} == {"pending"}


def test_purge_asks_then_deletes_in_batches(url: str, settings: TaskQSettings) -> None:
    old = seed(url, settings, 5, status="succeeded")
    failed = seed(url, settings, 2, status="failed")
    active = seed(url, settings, 1)
    code, out = run("jobs", "purge", "--older-than", "1d", "--database-url", url)
    assert code == 1
    assert set(rows(url, settings)) == {*old, *failed, *active}
    code, out = run(
        "jobs", "purge", "--older-than", "1d", "--status", "succeeded", "--batch-size", "2",
        "--yes", "--json", "--database-url", url,
    )  # fmt: skip
    assert json.loads(out) == {"deleted": 5, "batches": 3}
    code, out = run("jobs", "purge", "--older-than", "1d", "--yes", "--database-url", url)
    assert out.strip() == "deleted 2 job(s) in 1 batch(es)"
    assert set(rows(url, settings)) == set(active)


def test_enqueue_validates_against_the_actors_model(
    url: str, settings: TaskQSettings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = f"cli_ops_app_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(
        "from pydantic import BaseModel\n"
        "from taskq import actor\n"
        "class Mail(BaseModel):\n"
        "    to: str\n"
        f"@actor(name='{module}_send')\n"
        "async def send(payload: Mail) -> None: ...\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    name = f"{module}_send"
    code, out = run(
        "jobs", "enqueue", name, "--payload", '{"to": 5}', "--actors", module, "--database-url", url
    )
    assert code == 2, out
    assert "--payload" in out
    assert rows(url, settings) == {}
    code, out = run(
        "jobs", "enqueue", name, "--payload", '{"to": "a@b.c"}', "--actors", module,
        "--tag", "cli", "--json", "--database-url", url,
    )  # fmt: skip
    assert code == 0, out
    doc = json.loads(out)
    assert (doc["actor"], doc["payload"], doc["tags"], doc["status"]) == (
        name,
        {"to": "a@b.c"},
        ["cli"],
        "pending",
    )
    # Without --actors the JSON object is stored as given.
    code, out = run(
        "jobs",
        "enqueue",
        "cli_unknown_actor",
        "--payload",
        '{"k": [1]}',
        "--delay",
        "1h",
        "--json",
        "--database-url",
        url,
    )
    doc = json.loads(out)
    assert (doc["status"], doc["payload"]) == ("scheduled", {"k": [1]})
    assert len(rows(url, settings)) == 2


def test_queues_pause_and_resume(url: str, settings: TaskQSettings) -> None:
    code, out = run("queues", "pause", "mail", "--database-url", url)
    assert (code, out.strip()) == (0, "queue 'mail': paused: workers claim none of its jobs")

    async def paused(engine: AsyncEngine) -> dict[str, bool]:
        async with engine.connect() as conn:
            return {r.name: r.paused for r in (await conn.execute(select(queues))).all()}

    assert db(url, settings, paused) == {"mail": True}
    code, out = run("queues", "get", "mail", "--json", "--database-url", url)
    assert json.loads(out)["paused"] is True
    code, out = run("queues", "resume", "mail", "--database-url", url)
    assert code == 0
    assert db(url, settings, paused) == {"mail": False}
    code, out = run("queues", "pause", "bad:q", "--database-url", url)
    assert code == 2
    assert db(url, settings, paused) == {"mail": False}


def test_workers_list(url: str, settings: TaskQSettings) -> None:
    code, out = run("workers", "list", "--database-url", url)
    assert (code, out.strip()) == (0, "no workers running (--all shows stopped ones)")
    live, isolated, stopped = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    now = datetime.now(UTC)

    async def add(engine: AsyncEngine) -> None:
        async with engine.begin() as conn:
            for wid, status, age in (
                (live, "running", 0),
                (isolated, "isolated", 1),
                (stopped, "stopped", 2),
            ):
                await conn.execute(
                    insert(workers).values(
                        id=wid, hostname="box1", pid=100 + age, queues=["default"], concurrency=4,
                        status=status, started_at=now - timedelta(minutes=10 - age),
                        last_heartbeat_at=now,
                    )
                )  # fmt: skip
            await conn.execute(
                insert(leader_leases).values(
                    name="sweep", holder=live, acquired_at=now, expires_at=now + timedelta(hours=1)
                )
            )

    db(url, settings, add)
    seed(url, settings, 2, status="running", locked_by=live)
    code, out = run("workers", "list", "--database-url", url)
    assert code == 0, out
    lines = [line.split() for line in out.splitlines()]
    assert lines[0][:4] == ["ID", "HOST", "PID", "STATUS"]
    assert [(line[0], line[3]) for line in lines[1:]] == [
        (str(live), "running"),
        (str(isolated), "isolated"),
    ]
    assert "2/4" in lines[1]
    assert "sweep" in lines[1]
    code, out = run("workers", "list", "--all", "--json", "--database-url", url)
    doc = {w["id"]: w for w in json.loads(out)}
    assert set(doc) == {str(live), str(isolated), str(stopped)}
    assert (doc[str(live)]["running_jobs"], doc[str(live)]["leader"]) == (2, True)
    assert doc[str(live)]["leader_of"] == ["sweep"]
    assert (doc[str(isolated)]["running_jobs"], doc[str(isolated)]["leader"]) == (0, False)


def test_ratelimit_list_peek_reset(
    url: str, settings: TaskQSettings, redis_url: str, unique_name: str, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    module = f"cli_rl_app_{uuid.uuid4().hex[:8]}"
    bucket = f"{unique_name}_tb"
    (tmp_path / f"{module}.py").write_text(
        "from pydantic import BaseModel\n"
        "from taskq import actor\n"
        "from taskq.ratelimit import TokenBucket\n"
        f"BUCKET = TokenBucket('{bucket}', capacity=5, refill_per_second=0)\n"
        "class P(BaseModel):\n"
        "    n: int = 0\n"
        f"@actor(name='{module}_a', rate_limits=[BUCKET])\n"
        "async def a(payload: P) -> None: ...\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    common = ["--actors", module, "--redis-url", redis_url, "--database-url", url]
    code, out = run("ratelimit", "peek", bucket, "--json", *common)
    assert code == 0, out
    doc = json.loads(out)
    assert (doc["kind"], doc["backend"], doc["source"]) == ("token_bucket", "redis", "registry")
    assert doc["state"]["tokens_remaining"] == 5

    async def drain() -> None:
        from importlib import import_module

        from redis.asyncio import Redis

        prim = import_module(module).BUCKET
        rc = Redis.from_url(redis_url)
        try:
            for _ in range(5):
                assert (await prim.acquire(redis_client=rc)).allowed
        finally:
            await rc.aclose()

    asyncio.run(drain())
    code, out = run("ratelimit", "list", "--json", *common)
    [listed] = [i for i in json.loads(out) if i["name"] == bucket]
    assert listed["state"]["is_exhausted"] is True
    code, out = run("ratelimit", "reset", bucket, *common)
    assert code == 1  # no TTY, no --yes
    code, out = run("ratelimit", "reset", bucket, "--yes", "--json", *common)
    assert code == 0, out
    assert json.loads(out)["state"]["tokens_remaining"] == 5
    code, out = run("ratelimit", "peek", "no_such_bucket", *common)
    assert code == 1
    assert "no rate limit named 'no_such_bucket'" in out


@pytest.mark.engine("sqlite")
def test_console_script_exit_codes(tmp_path: Path) -> None:
    exe = shutil.which("taskq", path=str(Path(sys.executable).parent))
    assert exe is not None
    url = f"sqlite:///{tmp_path / 'fresh.db'}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TASKQ_")}

    def call(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [exe, *args, "--database-url", url], capture_output=True, text=True, env=env, timeout=60
        )

    done = call("jobs", "list")
    assert done.returncode == 3
    assert "run: taskq migrate up" in done.stderr
    assert call("migrate", "up").returncode == 0
    assert call("jobs", "list", "--json").returncode == 0
    assert call("jobs", "purge", "--older-than", "soon").returncode == 2
    refused = call("jobs", "purge", "--older-than", "1d")
    assert refused.returncode == 1
    assert "pass --yes" in refused.stderr
    missing = call("jobs", "retry", str(uuid.uuid4()))
    assert missing.returncode == 1
    assert "JobNotFoundError" in missing.stderr
