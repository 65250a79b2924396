"""``taskq cron list | get | create | enable | disable | run-now | delete`` against real
Postgres and SQLite, the state checked in the database; and ``actor-config deregister``
refusing while a schedule is enabled, ``--force`` disabling it."""

from __future__ import annotations

import json
from typing import Any

from click.testing import CliRunner
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from taskq.actor_config_ops import sync_actor_config
from taskq.cli import main
from taskq.db.engine import transaction
from taskq.db.tables import cron_schedules, jobs
from taskq.settings import TaskQSettings
from tests.e2e.apps import cron as app
from tests.support.cli import db

APP = "tests.e2e.apps.cron"


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    return result.exit_code, result.output


def schedule_rows(url: str, settings: TaskQSettings) -> dict[str, Any]:
    async def go(engine: AsyncEngine) -> dict[str, Any]:
        async with engine.connect() as conn:
            return {r.id: r for r in (await conn.execute(select(cron_schedules))).all()}

    return db(url, settings, go)


def job_rows(url: str, settings: TaskQSettings) -> list[Any]:
    async def go(engine: AsyncEngine) -> list[Any]:
        async with engine.connect() as conn:
            return list((await conn.execute(select(jobs))).all())

    return db(url, settings, go)


def create(url: str, *extra: str) -> tuple[int, str]:
    return run(
        "cron", "create", "nightly", "--actor", "cli-cron-target", "--cron", "30 2 * * *",
        "--tz", "Europe/Berlin", "--payload", '{"n": 7}', "--tag", "a", "--tag", "b",
        "--priority", "5", "--missed", "all", "--max-catchup", "3", "--jitter", "30s",
        "--actors", APP, "--database-url", url, *extra,
    )  # fmt: skip


def test_create_get_list_and_the_switches(url: str, settings: TaskQSettings) -> None:
    code, out = run("cron", "list", "--database-url", url)
    assert (code, out) == (0, "no schedules\n")
    code, out = create(url)
    assert code == 0, out
    assert out.startswith("created schedule 'nightly'; next run ")
    row = schedule_rows(url, settings)["nightly"]
    assert (row.actor, row.cron_expression, row.timezone, row.payload) == (
        "cli-cron-target",
        "30 2 * * *",
        "Europe/Berlin",
        {"n": 7},
    )
    assert (row.tags, row.priority, row.missed, row.max_catchup, row.jitter_s) == (
        ["a", "b"],
        5,
        "all",
        3,
        30.0,
    )
    assert (row.origin, row.enabled) == ("api", True)
    assert row.next_run_at is not None

    code, out = create(url)
    assert code == 1
    assert "already exists (pass --replace to overwrite it)" in out

    code, out = run("cron", "list", "--database-url", url)
    assert code == 0
    header, line = out.splitlines()
    assert header.split() == [
        "SCHEDULE", "ACTOR", "WHEN", "TZ", "ENABLED", "NEXT_RUN", "LAST_RUN", "LAST_OUTCOME"
    ]  # fmt: skip
    assert line.split()[:2] == ["nightly", "cli-cron-target"]
    assert "never" in line
    code, out = run("cron", "list", "--json", "--database-url", url)
    [doc] = json.loads(out)
    assert (doc["id"], doc["enabled"], doc["tags"]) == ("nightly", True, ["a", "b"])

    code, out = run("cron", "disable", "nightly", "--database-url", url)
    assert (code, out) == (0, "schedule 'nightly' disabled\n")
    assert schedule_rows(url, settings)["nightly"].enabled is False
    code, out = run("cron", "list", "--disabled", "--json", "--database-url", url)
    assert [d["id"] for d in json.loads(out)] == ["nightly"]
    code, out = run("cron", "enable", "nightly", "--json", "--database-url", url)
    assert code == 0
    assert json.loads(out)["enabled"] is True
    assert schedule_rows(url, settings)["nightly"].enabled is True

    code, out = run("cron", "get", "nightly", "--database-url", url)
    assert code == 0
    assert "schedule:     nightly" in out
    assert "missed:       all (max_catchup 3)" in out
    assert "last_run:     never" in out
    [next_run] = [line for line in out.splitlines() if line.startswith("next_run:")]
    assert "02:30:00 CE" in next_run  # the UTC instant, then Berlin's wall clock (CET/CEST)


def test_run_now_records_the_job_and_get_shows_it(url: str, settings: TaskQSettings) -> None:
    assert create(url)[0] == 0
    code, out = run("cron", "run-now", "nightly", "--actors", APP, "--json", "--database-url", url)
    assert code == 0, out
    job_id = json.loads(out)["job_id"]
    [job] = job_rows(url, settings)
    assert str(job.id) == job_id
    assert (job.actor, job.payload, job.priority, job.tags) == (
        "cli-cron-target",
        {"n": 7},
        5,
        ["a", "b"],
    )
    assert job.idempotency_key.startswith("cron:manual-")
    assert job.idempotency_key.endswith(":nightly")
    row = schedule_rows(url, settings)["nightly"]
    assert (str(row.last_job_id), row.last_outcome) == (job_id, "run-now")

    code, out = run("cron", "get", "nightly", "--json", "--database-url", url)
    doc = json.loads(out)
    assert (doc["last_job_id"], doc["last_job_status"]) == (job_id, "pending")
    assert [(r["job_id"], r["tick"]) for r in doc["runs"]] == [(job_id, None)]
    code, out = run("cron", "get", "nightly", "--database-url", url)
    assert "recent runs:" in out
    assert f"{job_id}  pending  run-now" in out

    # A refusal (max_pending=1: the first job is still pending) changes nothing.
    code, out = run("cron", "run-now", "nightly", "--actors", APP, "--database-url", url)
    assert code == 1
    assert "the enqueue was refused" in out
    assert len(job_rows(url, settings)) == 1

    code, out = run("cron", "delete", "nightly", "--database-url", url)
    assert (code, out) == (0, "deleted schedule 'nightly' (its jobs stay)\n")
    assert schedule_rows(url, settings) == {}
    assert len(job_rows(url, settings)) == 1


def test_unknown_schedules_and_bad_input_change_nothing(url: str, settings: TaskQSettings) -> None:
    for command in ("get", "enable", "disable", "delete"):
        code, out = run("cron", command, "nope", "--database-url", url)
        assert (code, out) == (1, "Error: unknown schedule 'nope'\n")
    code, out = run("cron", "get", "a:b", "--database-url", url)
    assert code == 2
    assert "no ':'" in out
    code, out = run(
        "cron", "create", "x", "--actor", "cli-cron-target", "--cron", "61 * * * *",
        "--database-url", url,
    )  # fmt: skip
    assert code == 2
    assert "invalid cron expression" in out
    code, out = run(
        "cron", "create", "x", "--actor", "cli-cron-target", "--every", "5m", "--payload",
        '{"n": "seven"}', "--actors", APP, "--database-url", url,
    )  # fmt: skip
    assert code == 1
    assert "payload for actor 'cli-cron-target' is invalid" in out
    code, out = run(
        "cron", "create", "x", "--actor", "not-declared", "--every", "5m", "--database-url", url
    )
    assert code == 1
    assert "is not declared in this process" in out
    assert schedule_rows(url, settings) == {}


def test_deregister_refuses_an_enabled_schedule_and_force_disables_it(
    url: str, settings: TaskQSettings
) -> None:
    async def seed(engine: AsyncEngine) -> None:
        async with transaction(engine) as conn:
            await sync_actor_config(conn, [app.target])

    db(url, settings, seed)
    assert create(url)[0] == 0
    code, out = run("actor-config", "deregister", "cli-cron-target", "--database-url", url)
    assert code == 1
    assert "enabled cron schedules reference it" in out
    assert "nightly" in out
    assert schedule_rows(url, settings)["nightly"].enabled is True
    code, out = run(
        "actor-config", "deregister", "cli-cron-target", "--force", "--database-url", url
    )
    assert code == 0, out
    assert "schedules disabled:               1" in out
    assert schedule_rows(url, settings)["nightly"].enabled is False
