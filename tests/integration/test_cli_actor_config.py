"""``taskq actor-config get | list | set | diff | deregister`` against real Postgres and SQLite."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from pydantic import BaseModel
from sqlalchemy import insert, select
from sqlalchemy.ext.asyncio import AsyncEngine

from taskq import actor
from taskq.actor_config_ops import ActorsClient, sync_actor_config
from taskq.cli import main
from taskq.client import TaskQ
from taskq.db.engine import transaction
from taskq.db.tables import actor_config, cron_schedules, jobs, queues
from taskq.settings import TaskQSettings
from tests.support.cli import db


class Msg(BaseModel):
    n: int


@actor(name="cli_mail", queue="cli_mailq", max_concurrent=2, max_pending=100)
async def cli_mail(payload: Msg) -> None: ...


@actor(name="cli_plain", queue="cli_mailq")
async def cli_plain(payload: Msg) -> None: ...


REGISTRY = {"cli_mail": cli_mail, "cli_plain": cli_plain}
ONLY_MAIL = [cli_mail]
NOT_ACTORS = 42


def seed(url: str, settings: TaskQSettings, *refs: Any) -> None:
    """What a worker's startup sync does: insert the actors' rows from their literals."""

    async def go(engine: AsyncEngine) -> None:
        async with transaction(engine) as conn:
            await sync_actor_config(conn, refs)

    db(url, settings, go)


def snapshot(
    url: str, settings: TaskQSettings
) -> tuple[list[Any], list[Any], list[Any], list[Any]]:
    """Every row of the tables the commands may write, to prove a refusal changed nothing."""

    async def go(engine: AsyncEngine) -> tuple[list[Any], list[Any], list[Any], list[Any]]:
        async with engine.connect() as conn:
            return (
                list((await conn.execute(select(actor_config).order_by("actor"))).all()),
                list((await conn.execute(select(queues).order_by("name"))).all()),
                list((await conn.execute(select(jobs).order_by("id"))).all()),
                list((await conn.execute(select(cron_schedules).order_by("id"))).all()),
            )

    return db(url, settings, go)


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    return result.exit_code, result.output


def test_set_creates_then_updates_and_get_list_show_it(url: str, settings: TaskQSettings) -> None:
    code, out = run("actor-config", "get", "cli_mail", "--database-url", url)
    assert code == 1
    assert "no actor_config row for 'cli_mail'" in out
    code, out = run("actor-config", "list", "--database-url", url)
    assert (code, out.strip()) == (0, "no actor_config rows (workers create them at startup)")

    seed(url, settings, cli_mail)
    code, out = run(
        "actor-config", "set", "cli_mail", "--max-concurrent", "4", "--database-url", url
    )
    assert code == 0, out
    assert "max_concurrent: 2 -> 4" in out
    code, out = run(
        "actor-config", "set", "cli_mail", "--clear-max-pending", "--result-ttl", "3600",
        "--database-url", url,
    )  # fmt: skip
    assert code == 0, out
    assert "max_pending: 100 -> none" in out
    assert "result_ttl: none -> 3600s" in out
    code, out = run(
        "actor-config", "set", "cli_mail", "--max-concurrent", "4", "--database-url", url
    )
    assert code == 0, out
    assert "'cli_mail' unchanged (already set)" in out

    stored = db(url, settings, lambda e: ActorsClient(e).get("cli_mail"))
    assert stored is not None
    assert (stored.queue, stored.max_concurrent, stored.max_pending, stored.result_ttl) == (
        "cli_mailq",
        4,
        None,
        timedelta(hours=1),
    )

    code, out = run("actor-config", "get", "cli_mail", "--database-url", url)
    assert code == 0, out
    assert "max_concurrent: 4\n" in out
    assert "max_pending:    none (the @actor(max_pending=...) literal applies)" in out
    assert "result_ttl:     3600s" in out
    code, out = run("actor-config", "get", "cli_mail", "--json", "--database-url", url)
    document = json.loads(out)
    assert {k: document[k] for k in ("actor", "queue", "max_concurrent", "max_pending")} == {
        "actor": "cli_mail",
        "queue": "cli_mailq",
        "max_concurrent": 4,
        "max_pending": None,
    }
    assert document["result_ttl_s"] == 3600.0

    # A row nobody seeded yet: created, on the given queue; 0 is drain mode.
    code, out = run(
        "actor-config", "set", "cli_new", "--queue", "elsewhere", "--max-concurrent", "0",
        "--database-url", url,
    )  # fmt: skip
    assert code == 0, out
    assert "created the actor_config row for 'cli_new' on queue 'elsewhere'" in out
    assert "drain mode" in out
    code, out = run("actor-config", "list", "--database-url", url)
    lines = out.splitlines()
    assert lines[0].split() == [
        "ACTOR",
        "QUEUE",
        "MAX_CONCURRENT",
        "MAX_PENDING",
        "RESULT_TTL",
        "UPDATED_AT",
    ]
    assert [line.split()[:5] for line in lines[1:]] == [
        ["cli_mail", "cli_mailq", "4", "none", "3600s"],
        ["cli_new", "elsewhere", "0", "none", "none"],
    ]
    code, out = run("actor-config", "list", "--json", "--database-url", url)
    assert [r["actor"] for r in json.loads(out)] == ["cli_mail", "cli_new"]


def test_set_moves_the_queue(url: str, settings: TaskQSettings) -> None:
    seed(url, settings, cli_mail)
    code, out = run("actor-config", "set", "cli_mail", "--queue", "newq", "--database-url", url)
    assert code == 0, out
    assert "queue: cli_mailq -> newq" in out
    assert "startup sync sets the queue back" in out
    stored = db(url, settings, lambda e: ActorsClient(e).get("cli_mail"))
    assert stored is not None
    assert (stored.queue, stored.max_concurrent, stored.max_pending) == ("newq", 2, 100)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["bad name", "--max-concurrent", "1"], "invalid actor name 'bad name'"),
        (["cli_mail", "--queue", "a:b"], "invalid queue name 'a:b'"),
        (["cli_mail", "--max-concurrent", "-1"], "-1 is not in the range x>=0"),
        (["cli_mail", "--max-pending", "-5"], "-5 is not in the range x>=0"),
        (["cli_mail", "--max-pending", "3", "--clear-max-pending"], "mutually exclusive"),
        (["cli_mail", "--max-concurrent", "3", "--clear-max-concurrent"], "mutually exclusive"),
        (["cli_mail", "--result-ttl", "0"], "--result-ttl"),
        (["cli_mail", "--max-concurrent", "two"], "'two' is not a valid integer"),
        (["cli_mail"], "nothing to set"),
        (["cli_unseen", "--queue", ""], "invalid queue name ''"),
    ],
    ids=[
        "actor-space",
        "queue-colon",
        "negative-concurrent",
        "negative-pending",
        "set-and-clear-pending",
        "set-and-clear-concurrent",
        "zero-ttl",
        "not-int",
        "nothing",
        "empty-queue",
    ],
)
def test_set_rejects_bad_input_and_changes_nothing(
    url: str, settings: TaskQSettings, args: list[str], message: str
) -> None:
    seed(url, settings, cli_mail)
    before = snapshot(url, settings)
    code, out = run("actor-config", "set", *args, "--database-url", url)
    assert code == 2, out
    assert message in out
    assert "Traceback" not in out
    assert snapshot(url, settings) == before


def test_diff_shows_literal_stored_and_enforced(url: str, settings: TaskQSettings) -> None:
    seed(url, settings, cli_mail)
    target = f"{__name__}:REGISTRY"
    code, out = run("actor-config", "diff", "--actors", target, "--database-url", url)
    assert code == 0, out
    assert "0 of 6 fields differ across 2 declared actors" in out
    assert "no stored row yet (the literals seed it at the next worker boot): cli_plain" in out

    run("actor-config", "set", "cli_mail", "--max-concurrent", "4", "--clear-max-pending",
        "--database-url", url)  # fmt: skip
    run("actor-config", "set", "cli_stray", "--max-concurrent", "1", "--database-url", url)
    code, out = run(
        "actor-config", "diff", "--actors", target, "--exit-code", "--database-url", url
    )
    assert code == 1, out
    rows = [line.split() for line in out.splitlines()]
    assert rows[0] == ["ACTOR", "FIELD", "LITERAL", "STORED", "ENFORCED", "DIFFERS"]
    assert ["cli_mail", "max_concurrent", "2", "4", "stored", "yes"] in rows
    assert ["cli_mail", "max_pending", "100", "none", "literal", "yes"] in rows
    assert ["cli_mail", "result_ttl", "none", "none", "stored"] in rows
    assert ["cli_plain", "max_concurrent", "none", "-", "unregistered"] in rows
    assert "2 of 6 fields differ across 2 declared actors" in out
    assert "stored but not declared by --actors: cli_stray" in out

    # The module form finds the actors bound at the module's top level; --json for scripts.
    code, out = run("actor-config", "diff", "--actors", __name__, "--json", "--database-url", url)
    assert code == 0, out
    document = json.loads(out)
    fields = {(f["actor"], f["field"]): f for f in document["fields"]}
    assert fields["cli_mail", "max_concurrent"] == {
        "actor": "cli_mail",
        "field": "max_concurrent",
        "literal": 2,
        "stored": 4,
        "enforced": "stored",
        "differs": True,
    }
    assert fields["cli_plain", "max_pending"]["enforced"] == "unregistered"
    assert document["stored_not_declared"] == ["cli_stray"]
    code, out = run(
        "actor-config", "diff", "--actors", f"{__name__}:ONLY_MAIL", "--database-url", url
    )
    assert code == 0, out
    assert "across 1 declared actors" in out


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("no_such_module_xyz:registry", "cannot import 'no_such_module_xyz'"),
        (f"{__name__}:MISSING", "has no attribute 'MISSING'"),
        (f"{__name__}:NOT_ACTORS", "is a int, not a dict or list of actors"),
        ("json", "binds no actors at its top level"),
    ],
    ids=["no-module", "no-attr", "not-actors", "module-without-actors"],
)
def test_diff_bad_actors_target_is_a_usage_error(url: str, target: str, message: str) -> None:
    code, out = run("actor-config", "diff", "--actors", target, "--database-url", url)
    assert code == 2, out
    assert message in out
    assert "--actors" in out


def test_diff_requires_the_declared_actors(url: str) -> None:
    code, out = run("actor-config", "diff", "--database-url", url)
    assert code == 2
    assert "Missing option '--actors'" in out


def _enqueue_jobs(url: str, settings: TaskQSettings) -> tuple[Any, Any, Any]:
    """Three cli_mail jobs: one left pending, one running, one succeeded; plus a schedule."""

    async def go(engine: AsyncEngine) -> tuple[Any, Any, Any]:
        async with TaskQ(engine=engine, settings=settings) as tq:
            handles = [await tq.jobs.enqueue(cli_mail, Msg(n=i)) for i in range(3)]
        queued, running, done = (h.job_id for h in handles)
        async with transaction(engine) as conn:
            await conn.execute(jobs.update().where(jobs.c.id == running).values(status="running"))
            await conn.execute(jobs.update().where(jobs.c.id == done).values(status="succeeded"))
            await conn.execute(
                insert(cron_schedules).values(
                    id="nightly", actor="cli_mail", cron_expression="0 0 * * *"
                )
            )
            await conn.execute(insert(queues).values(name="cli_mailq", max_concurrent=3))
        return queued, running, done

    return db(url, settings, go)


def _status(url: str, settings: TaskQSettings, job_id: Any) -> tuple[str, str | None]:
    async def go(engine: AsyncEngine) -> tuple[str, str | None]:
        async with engine.connect() as conn:
            row = (
                await conn.execute(
                    select(jobs.c.status, jobs.c.error_class).where(jobs.c.id == job_id)
                )
            ).one()
        return str(row.status), row.error_class

    return db(url, settings, go)


def test_deregister_refuses_changing_nothing_then_forces(url: str, settings: TaskQSettings) -> None:
    seed(url, settings, cli_mail, cli_plain)
    queued, running, _ = _enqueue_jobs(url, settings)
    before = snapshot(url, settings)

    code, out = run("actor-config", "deregister", "cli_mail", "--database-url", url)
    assert code == 1, out
    assert (
        "cannot deregister 'cli_mail': 2 non-terminal job(s) reference it (pending 1, running 1); "
        "cancel them, or pass --force" in out
    )
    assert snapshot(url, settings) == before

    code, out = run("actor-config", "deregister", "cli_mail", "--force", "--database-url", url)
    assert code == 1, out
    assert "cannot deregister 'cli_mail', even with --force: 1 job(s) are running" in out
    assert snapshot(url, settings) == before

    # The running job finishes: without --force the pending job still refuses, and once no
    # job is active the enabled schedule refuses.
    db(url, settings, lambda e: _set_status(e, running, "succeeded"))
    db(url, settings, lambda e: _set_status(e, queued, "succeeded"))
    before = snapshot(url, settings)
    code, out = run("actor-config", "deregister", "cli_mail", "--database-url", url)
    assert code == 1, out
    assert "enabled cron schedules reference it (nightly); disable them, or pass --force" in out
    assert snapshot(url, settings) == before

    db(url, settings, lambda e: _set_status(e, queued, "pending"))
    code, out = run(
        "actor-config", "deregister", "cli_mail", "--force", "--purge-queue",
        "--database-url", url,
    )  # fmt: skip
    assert code == 0, out
    assert out.splitlines() == [
        "deregistered 'cli_mail' (queue 'cli_mailq')",
        "  pending/scheduled jobs cancelled: 1",
        "  schedules disabled:               1",
        "  terminal jobs kept:               3",
        "  queues row:                       kept (another actor uses the queue, or it had no row)",
    ]
    assert _status(url, settings, queued) == ("cancelled", "ActorDeregistered")
    assert db(url, settings, lambda e: ActorsClient(e).get("cli_mail")) is None

    code, out = run("actor-config", "deregister", "cli_mail", "--database-url", url)
    assert code == 1, out
    assert "it has no actor_config row (already deregistered?)" in out
    code, out = run("actor-config", "deregister", "cli_mail", "--missing-ok", "--database-url", url)
    assert code == 0, out
    assert "nothing to deregister" in out

    code, out = run(
        "actor-config", "deregister", "cli_plain", "--purge-queue", "--json", "--database-url", url
    )
    assert code == 0, out
    assert json.loads(out) == {
        "actor": "cli_plain",
        "queue": "cli_mailq",
        "actor_config_deleted": True,
        "schedules_disabled": 0,
        "jobs_cancelled": 0,
        "terminal_jobs_remaining": 0,
        "queue_purged": True,
    }
    assert snapshot(url, settings)[1] == []  # the queues row went with the last actor on it


async def _set_status(engine: AsyncEngine, job_id: Any, status: str) -> None:
    async with transaction(engine) as conn:
        await conn.execute(jobs.update().where(jobs.c.id == job_id).values(status=status))


def test_database_problems_are_clear_errors(tmp_path: Path) -> None:
    code, out = run("actor-config", "list", "--database-url", "postgresql://postgres@127.0.0.1:1/x")
    assert code == 3
    assert "cannot read or write actor config on postgresql://postgres@127.0.0.1:1/x: " in out
    code, out = run("actor-config", "list", "--database-url", f"sqlite:///{tmp_path / 'empty.db'}")
    assert code == 3
    assert "does not exist; run: taskq migrate up" in out
    code, out = run("actor-config", "get", "x", "--database-url", "mysql://u@h/db")
    assert code == 2
    assert "unsupported database URL" in out
    assert "Traceback" not in out
