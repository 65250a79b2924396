"""Shared fixtures: real Postgres, real SQLite files and real Redis, one set per xdist worker.

Postgres and Redis must answer: a test that needs them fails (never skips) when they do
not. The ``engine_url`` fixture is parametrised over both SQL engines so one behavioural
test runs on each.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncEngine

from taskq.db import migrate
from taskq.db.engine import make_engine
from taskq.settings import TaskQSettings
from tests.support import databases


@pytest.fixture(scope="session")
def worker_id_str(request: pytest.FixtureRequest) -> str:
    return str(getattr(request.config, "workerinput", {}).get("workerid", "master"))


@pytest.fixture(scope="session")
def settings() -> TaskQSettings:
    return TaskQSettings.load(database_url=None, redis_url=None, schema_name="taskq")


@pytest.fixture(scope="session")
def pg_session_url(worker_id_str: str, settings: TaskQSettings) -> Iterator[URL]:
    """A Postgres database migrated to head, private to this xdist worker."""
    name = f"taskq_test_{databases.RUN_ID}_{worker_id_str}"
    url = databases.create_database(name)

    async def _migrate() -> None:
        engine = make_engine(url, settings=settings)
        await migrate.upgrade(engine, settings=settings)
        await engine.dispose()

    asyncio.run(_migrate())
    yield url
    databases.drop_database(name)


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory, settings: TaskQSettings) -> Path:
    """A SQLite file migrated to head; tests get copies of it."""
    path = tmp_path_factory.mktemp("sqlite-template") / "template.db"

    async def _migrate() -> None:
        engine = make_engine(f"sqlite:///{path}", settings=settings)
        await migrate.upgrade(engine, settings=settings)
        await engine.dispose()

    asyncio.run(_migrate())
    return path


@pytest.fixture
def pg_url(pg_session_url: URL) -> Iterator[URL]:
    """The worker's migrated Postgres database, emptied after the test."""
    yield pg_session_url
    databases.truncate_all(pg_session_url)


@pytest.fixture
def sqlite_url(sqlite_template: Path, tmp_path: Path) -> str:
    """A fresh migrated SQLite file for this test."""
    target = databases.copy_sqlite(sqlite_template, tmp_path / "taskq.db")
    return f"sqlite:///{target}"


@pytest.fixture(params=["postgres", "sqlite"])
def engine_url(request: pytest.FixtureRequest) -> str | URL:
    """A migrated database URL, once per SQL engine."""
    if request.param == "postgres":
        return request.getfixturevalue("pg_url")  # type: ignore[no-any-return]
    return request.getfixturevalue("sqlite_url")  # type: ignore[no-any-return]


@pytest.fixture
async def engine(engine_url: str | URL, settings: TaskQSettings) -> AsyncIterator[AsyncEngine]:
    """An async engine on each SQL engine in turn."""
    eng = make_engine(engine_url, settings=settings)
    yield eng
    await eng.dispose()


@pytest.fixture
def redis_url() -> str:
    """The test Redis. Shared by concurrent runs: tests name their keys with ``unique_name``."""
    return databases.REDIS_URL


@pytest.fixture
def unique_name(request: pytest.FixtureRequest) -> str:
    """A bucket/queue/actor name no other test (or concurrent test run) uses."""
    import re
    import uuid

    base = re.sub(r"[^A-Za-z0-9_]", "_", request.node.name)[:60]
    return f"{base}_{uuid.uuid4().hex[:8]}"


# --- TASKQ_TEST_ENGINES: engine selection for `nox -s tests` / `nox -s matrix` ---------------
# Owned by noxfile.py (see docs/testing-matrix.md); keep this block self-contained.
#
# TASKQ_TEST_ENGINES is a comma-separated subset of "postgres,sqlite". Unset or empty: no
# filtering. Set: a test bound to an engine runs only when that engine is selected; a test
# bound to none (unit tests, Redis-only tests, ...) runs only when "postgres" is selected,
# so `tests(engine='postgres')` + `tests(engine='sqlite')` run every test exactly once.
# A test is bound to an engine when one of its parametrised fixtures took the value
# "postgres"/"sqlite" (engine_url, and any fixture with params=["postgres", "sqlite"]), or
# when it uses pg_url/pg_session_url (postgres) or sqlite_url/sqlite_template (sqlite), or
# when it is marked ``@pytest.mark.engine("sqlite")``.

_ENGINES = ("postgres", "sqlite")
_ENGINE_FIXTURES = {
    "pg_url": "postgres",
    "pg_session_url": "postgres",
    "sqlite_url": "sqlite",
    "sqlite_template": "sqlite",
}


def _selected_engines() -> set[str] | None:
    import os

    raw = os.environ.get("TASKQ_TEST_ENGINES", "").strip()
    if not raw:
        return None
    chosen = {part.strip() for part in raw.split(",") if part.strip()}
    unknown = chosen - set(_ENGINES)
    if unknown:
        raise pytest.UsageError(
            f"TASKQ_TEST_ENGINES: unknown engine(s) {sorted(unknown)}; use {', '.join(_ENGINES)}"
        )
    return chosen


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "engine(*names): the test runs on these SQL engines without taking one of the engine "
        "fixtures (e.g. the quickstart on its default SQLite file)",
    )


def _item_engines(item: pytest.Item) -> set[str]:
    bound: set[str] = set()
    for mark in item.iter_markers("engine"):
        bound.update(str(name) for name in mark.args)
    callspec = getattr(item, "callspec", None)
    if callspec is not None:
        bound |= {v for v in callspec.params.values() if isinstance(v, str) and v in _ENGINES}
    for name in getattr(item, "fixturenames", ()):
        if name in _ENGINE_FIXTURES:
            bound.add(_ENGINE_FIXTURES[name])
    return bound


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect tests bound to engines TASKQ_TEST_ENGINES does not select."""
    chosen = _selected_engines()
    if chosen is None:
        return
    keep: list[pytest.Item] = []
    dropped: list[pytest.Item] = []
    for item in items:
        bound = _item_engines(item)
        wanted = bool(bound & chosen) if bound else "postgres" in chosen
        (keep if wanted else dropped).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep
