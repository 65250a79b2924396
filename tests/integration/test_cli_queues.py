"""``taskq queues list | get | set-max-concurrent`` against real Postgres and SQLite, and the
cap it writes being the one a booting worker reads."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from click.testing import CliRunner
from sqlalchemy import insert, select
from sqlalchemy.ext.asyncio import AsyncEngine

from taskq.actor_config_ops import ActorsClient, QueuesClient
from taskq.cli import main
from taskq.db.engine import transaction
from taskq.db.queries import worker as wq
from taskq.db.tables import queues
from taskq.settings import TaskQSettings
from tests.support.cli import db


def queue_rows(url: str, settings: TaskQSettings) -> list[Any]:
    async def go(engine: AsyncEngine) -> list[Any]:
        async with engine.connect() as conn:
            return list((await conn.execute(select(queues).order_by(queues.c.name))).all())

    return db(url, settings, go)


def worker_caps(url: str, settings: TaskQSettings, *names: str) -> dict[str, int]:
    """The caps a worker claiming ``names`` reads at startup (its own query)."""

    async def go(engine: AsyncEngine) -> dict[str, int]:
        async with transaction(engine, readonly=True) as conn:
            return {str(n): int(c) for n, c in (await conn.execute(wq.queue_caps(names))).all()}

    return db(url, settings, go)


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    return result.exit_code, result.output


def test_set_max_concurrent_upserts_the_cap_workers_read(url: str, settings: TaskQSettings) -> None:
    # Nothing in taskq inserts a queues row: the command must create it (an UPSERT).
    assert queue_rows(url, settings) == []
    code, out = run(
        "queues", "set-max-concurrent", "external-api", "--max-concurrent", "20",
        "--database-url", url,
    )  # fmt: skip
    assert code == 0, out
    assert out.splitlines() == [
        "queue 'external-api': max_concurrent none (uncapped) -> 20",
        "workers read queue caps at startup: restart the workers that claim 'external-api' "
        "for this to apply",
    ]
    assert worker_caps(url, settings, "external-api", "default") == {"external-api": 20}

    code, out = run(
        "queues", "set-max-concurrent", "external-api", "--max-concurrent", "5",
        "--database-url", url,
    )  # fmt: skip
    assert code == 0, out
    assert "max_concurrent 20 -> 5" in out
    code, out = run(
        "queues", "set-max-concurrent", "external-api", "--max-concurrent", "5",
        "--database-url", url,
    )  # fmt: skip
    assert (code, out.strip()) == (0, "queue 'external-api': max_concurrent 5 (unchanged)")
    assert worker_caps(url, settings, "external-api") == {"external-api": 5}
    [row] = queue_rows(url, settings)
    assert (row.name, row.max_concurrent, row.mode, row.paused) == (
        "external-api",
        5,
        "fifo",
        False,
    )

    code, out = run(
        "queues", "set-max-concurrent", "external-api", "--clear", "--database-url", url
    )
    assert code == 0, out
    assert "max_concurrent 5 -> none (uncapped)" in out
    assert worker_caps(url, settings, "external-api") == {}


def test_an_existing_row_keeps_its_other_settings(url: str, settings: TaskQSettings) -> None:
    async def add(engine: AsyncEngine) -> None:
        async with transaction(engine) as conn:
            await conn.execute(insert(queues).values(name="fairq", mode="fair", paused=True))

    db(url, settings, add)
    code, out = run(
        "queues", "set-max-concurrent", "fairq", "--max-concurrent", "3", "--database-url", url
    )
    assert code == 0, out
    [row] = queue_rows(url, settings)
    assert (row.max_concurrent, row.mode, row.paused) == (3, "fair", True)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["q1", "--max-concurrent", "0"], "0 is not >= 1: a queue cap must be at least 1"),
        (["q1", "--max-concurrent", "-3"], "-3 is not >= 1"),
        (["q1", "--max-concurrent", "x"], "'x' is not a valid integer"),
        (["q1"], "give --max-concurrent N (N >= 1) or --clear"),
        (["q1", "--max-concurrent", "2", "--clear"], "mutually exclusive"),
        (["bad:queue", "--max-concurrent", "2"], "invalid queue name 'bad:queue'"),
        (["", "--max-concurrent", "2"], "invalid queue name ''"),
        (["a" * 201, "--max-concurrent", "2"], "at most 200 characters"),
    ],
    ids=["zero", "negative", "not-int", "nothing", "both", "colon", "empty", "too-long"],
)
def test_bad_input_is_a_clear_error_and_writes_nothing(
    url: str, settings: TaskQSettings, args: list[str], message: str
) -> None:
    db(url, settings, lambda e: QueuesClient(e).set_max_concurrent("q1", 7))
    before = queue_rows(url, settings)
    code, out = run("queues", "set-max-concurrent", *args, "--database-url", url)
    assert code == 2, out
    assert message in out
    assert "Traceback" not in out
    assert queue_rows(url, settings) == before


@pytest.mark.parametrize("bad", [0, -1, True, 2.5, "3"])
def test_the_service_rejects_what_the_table_would_and_writes_nothing(
    url: str, settings: TaskQSettings, bad: Any
) -> None:
    with pytest.raises(ValueError, match="int >= 1"):
        db(url, settings, lambda e: QueuesClient(e).set_max_concurrent("q1", bad))
    with pytest.raises(ValueError, match="invalid queue name"):
        db(url, settings, lambda e: QueuesClient(e).set_max_concurrent("a:b", 1))
    assert queue_rows(url, settings) == []


def test_list_and_get(url: str, settings: TaskQSettings) -> None:
    code, out = run("queues", "list", "--database-url", url)
    assert (code, out.strip()) == (0, "no queues (no queues rows and no stored actors)")
    db(url, settings, lambda e: ActorsClient(e).set("cli_q_actor", queue="actorsq"))
    run("queues", "set-max-concurrent", "capped", "--max-concurrent", "4", "--database-url", url)

    code, out = run("queues", "list", "--database-url", url)
    assert code == 0, out
    assert [line.split() for line in out.splitlines()] == [
        ["QUEUE", "MAX_CONCURRENT", "MODE", "PAUSED", "ACTORS"],
        ["actorsq", "none", "fifo", "no", "1"],
        ["capped", "4", "fifo", "no", "0"],
    ]
    code, out = run("queues", "list", "--json", "--database-url", url)
    listed = {q["name"]: q for q in json.loads(out)}
    assert listed["actorsq"]["stored"] is False
    assert listed["actorsq"]["actors"] == ["cli_q_actor"]
    assert listed["capped"]["max_concurrent"] == 4

    code, out = run("queues", "get", "capped", "--database-url", url)
    assert code == 0, out
    assert "max_concurrent: 4\n" in out
    code, out = run("queues", "get", "actorsq", "--database-url", url)
    assert "max_concurrent: none (uncapped)" in out
    assert "actors:         cli_q_actor" in out
    assert "updated_at:     none (no queues row)" in out
    code, out = run("queues", "get", "capped", "--json", "--database-url", url)
    assert json.loads(out)["max_concurrent"] == 4

    missing = f"nope_{uuid.uuid4().hex[:6]}"
    code, out = run("queues", "get", missing, "--database-url", url)
    assert code == 1
    assert f"unknown queue '{missing}'" in out
    code, out = run("queues", "get", "bad:name", "--database-url", url)
    assert code == 2
    assert "invalid queue name 'bad:name'" in out
