"""The job's transaction in real worker processes (``python -m tests.e2e.apps.transactional``).

200 parents at ``TASKQ_MAX_CONCURRENCY=8``, each inserting an application row through
its injected connection and enqueuing two children, 10 % raising: the rows and the
children exist for exactly the parents that succeeded. Then the same with ``kill -9`` of
the worker mid-run and a second worker finishing: no succeeded parent without its row and
its two children, nothing of a parent that did not succeed, and no row twice (the killed
attempts' writes died with their transactions). On Postgres the tables are in a
non-default schema (``app_jobs``) and the producer uses a plain ``create_async_engine``.
"""

from __future__ import annotations

import signal
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from taskq import TaskQ
from taskq.db.dialect import async_url
from taskq.settings import TaskQSettings
from tests.e2e.apps import transactional as app
from tests.support import databases
from tests.support.workers import spawn_worker, stop_worker, wait_until

SCHEMA = "app_jobs"
PARENTS = 200
MODULE = "tests.e2e.apps.transactional"


@pytest.fixture(scope="module")
def pg_app_url() -> Iterator[URL]:
    with databases.migrated_database("e2ejobtx", SCHEMA) as url:
        yield url


@pytest.fixture(params=["postgres", "sqlite"])
def db_url(request: pytest.FixtureRequest, pg_app_url: URL, sqlite_url: str) -> Iterator[URL]:
    if request.param == "postgres":
        yield async_url(pg_app_url)
        databases.truncate_all(pg_app_url, schema=SCHEMA)
    else:
        yield async_url(sqlite_url)


@pytest.fixture
async def user_engine(db_url: URL) -> AsyncIterator[AsyncEngine]:
    engine = create_async_engine(db_url)
    async with engine.begin() as conn:
        await conn.execute(text("DROP TABLE IF EXISTS app_rows"))
        await conn.execute(text(app.APP_TABLE))
    yield engine
    await engine.dispose()


def _jobs(engine: AsyncEngine) -> str:
    return f"{SCHEMA}.jobs" if engine.dialect.name == "postgresql" else "jobs"


def _attempts(engine: AsyncEngine) -> str:
    return f"{SCHEMA}.job_attempts" if engine.dialect.name == "postgresql" else "job_attempts"


def _key(value: Any) -> str:
    return str(value).replace("-", "").lower()


async def _rows(engine: AsyncEngine, sql: str) -> list[Any]:
    async with engine.connect() as conn:
        return list((await conn.execute(text(sql))).all())


async def _enqueue(engine: AsyncEngine, seconds: float) -> dict[str, int]:
    """The parents, by job id (as a key) to their ``n``; every tenth one (n % 10 == 3) fails."""
    settings = TaskQSettings.load(database_url=None, redis_url=None, schema_name=SCHEMA)
    async with TaskQ(engine=engine, settings=settings) as tq:
        handles = await tq.enqueue_many(
            [
                (app.tx_parent, app.Parent(n=n, fail=n % 10 == 3, seconds=seconds))
                for n in range(PARENTS)
            ]
        )
    return {_key(h.job_id): n for h, n in zip(handles, range(PARENTS), strict=True)}


async def _unfinished(engine: AsyncEngine) -> int:
    rows = await _rows(
        engine,
        f"SELECT count(*) FROM {_jobs(engine)} WHERE status NOT IN ('succeeded', 'failed')",
    )
    return int(rows[0][0])


async def _succeeded_parents(engine: AsyncEngine) -> int:
    rows = await _rows(
        engine,
        f"SELECT count(*) FROM {_jobs(engine)} "
        "WHERE actor = 'e2e_tx_parent' AND status = 'succeeded'",
    )
    return int(rows[0][0])


async def _check_exactly_the_succeeded(engine: AsyncEngine, parents: dict[str, int]) -> None:
    """Rows and children for exactly the succeeded parents: one row, two children each."""
    statuses = {
        _key(r.id): r.status
        for r in await _rows(
            engine, f"SELECT id, status FROM {_jobs(engine)} WHERE actor = 'e2e_tx_parent'"
        )
    }
    assert set(statuses) == set(parents)
    succeeded = {job for job, status in statuses.items() if status == "succeeded"}
    failed = {job for job, status in statuses.items() if status == "failed"}
    assert succeeded | failed == set(parents)  # every parent ended
    assert {parents[job] for job in failed} == {n for n in range(PARENTS) if n % 10 == 3}
    app_rows = Counter(_key(r.job_id) for r in await _rows(engine, "SELECT job_id FROM app_rows"))
    assert set(app_rows) == succeeded
    assert set(app_rows.values()) == {1}  # no row written twice, none kept from a lost attempt
    children = Counter(
        _key(r.parent_job_id)
        for r in await _rows(
            engine, f"SELECT parent_job_id FROM {_jobs(engine)} WHERE actor = 'e2e_tx_child'"
        )
    )
    assert set(children) == succeeded
    assert set(children.values()) == {2}


async def test_two_hundred_parents_rows_and_children_for_exactly_the_succeeded(
    user_engine: AsyncEngine, db_url: URL, tmp_path: Path, procs: list[Any]
) -> None:
    parents = await _enqueue(user_engine, seconds=0.0)
    url = db_url.render_as_string(hide_password=False)
    worker = spawn_worker(
        url, module=MODULE, log_path=tmp_path / "w.log", max_concurrency=8, schema_name=SCHEMA
    )
    procs.append(worker)
    await wait_until(lambda: _all_done(user_engine), timeout=300, interval=0.25)
    assert stop_worker(worker) == 0
    await _check_exactly_the_succeeded(user_engine, parents)
    attempts = Counter(
        r.outcome
        for r in await _rows(
            user_engine,
            f"SELECT a.outcome FROM {_attempts(user_engine)} a "
            f"JOIN {_jobs(user_engine)} j ON j.id = a.job_id WHERE j.actor = 'e2e_tx_parent'",
        )
    )
    assert attempts == Counter({"succeeded": PARENTS - PARENTS // 10, "failed": PARENTS // 10})


async def test_kill_9_mid_run_leaves_no_parent_without_children_nor_orphans(
    user_engine: AsyncEngine, db_url: URL, tmp_path: Path, procs: list[Any]
) -> None:
    parents = await _enqueue(user_engine, seconds=0.1)
    url = db_url.render_as_string(hide_password=False)
    lease: dict[str, Any] = {
        "max_concurrency": 8,
        "schema_name": SCHEMA,
        "lock_lease": 2,
        "heartbeat_interval": 0.3,
    }
    victim = spawn_worker(url, module=MODULE, log_path=tmp_path / "victim.log", **lease)
    procs.append(victim)

    async def some_done() -> bool:
        return await _succeeded_parents(user_engine) >= 30

    await wait_until(some_done, timeout=300, interval=0.05)
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    assert await _succeeded_parents(user_engine) < PARENTS - PARENTS // 10  # mid-run
    survivor = spawn_worker(url, module=MODULE, log_path=tmp_path / "survivor.log", **lease)
    procs.append(survivor)
    await wait_until(lambda: _all_done(user_engine), timeout=300, interval=0.25)
    assert stop_worker(survivor) == 0
    await _check_exactly_the_succeeded(user_engine, parents)
    crashed = await _rows(
        user_engine, f"SELECT count(*) FROM {_attempts(user_engine)} WHERE outcome = 'crashed'"
    )
    assert int(crashed[0][0]) > 0  # the kill landed on running attempts


async def _all_done(engine: AsyncEngine) -> bool:
    parents = await _rows(
        engine, f"SELECT count(*) FROM {_jobs(engine)} WHERE actor = 'e2e_tx_parent'"
    )
    return int(parents[0][0]) == PARENTS and await _unfinished(engine) == 0
