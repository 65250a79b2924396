"""The admin UI on a store it cannot use answers 503 with what is wrong, never a bare 500:
an unmigrated database (an empty SQLite file, an empty Postgres database) names
``SchemaNotReady`` and ``taskq migrate up``; an unreachable one names ``StoreUnavailable``.
The problem is logged once at ERROR, not once per request."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy.engine import URL

from taskq.db.engine import make_engine
from taskq.settings import TaskQSettings
from tests.support import databases
from tests.support.ui import ui_client

pytestmark = pytest.mark.integration

PAGES = ["/", "/jobs", "/queues", "/workers", "/actors", "/cron"]


@pytest.fixture(params=["postgres", "sqlite"])
def empty_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str | URL]:
    """A database with no taskq table: an empty Postgres database, an empty SQLite file."""
    if request.param == "sqlite":
        path = tmp_path / "empty.db"
        path.touch()
        yield f"sqlite:///{path}"
        return
    with databases.temporary_database("ui_empty") as url:
        yield url


def _ui_errors(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "taskq.ui" and r.levelno >= logging.WARNING]


async def test_unmigrated_database_answers_503_naming_the_fix(
    empty_url: str | URL, settings: TaskQSettings, caplog: pytest.LogCaptureFixture
) -> None:
    engine = make_engine(empty_url, settings=settings)
    try:
        with caplog.at_level(logging.DEBUG, logger="taskq.ui"):
            async with ui_client(engine, settings) as ui:
                for page in PAGES:
                    response = await ui.get(page)
                    assert response.status_code == 503, (page, response.text)
                    assert "text/html" in response.headers["content-type"]
                    assert "the taskq schema is not ready" in response.text
                    assert "SchemaNotReady" in response.text
                    assert "run `taskq migrate up`" in response.text
                as_json = await ui.get("/jobs", headers={"accept": "application/json"})
                assert as_json.status_code == 503
                assert "taskq migrate up" in as_json.json()["error"]
    finally:
        await engine.dispose()
    logged = _ui_errors(caplog)
    assert len(logged) == 1, [r.getMessage() for r in logged]
    assert logged[0].levelno == logging.ERROR
    assert "SchemaNotReady" in logged[0].getMessage()
    assert "taskq migrate up" in logged[0].getMessage()


async def test_unreachable_store_answers_503_naming_it(
    settings: TaskQSettings, caplog: pytest.LogCaptureFixture
) -> None:
    # Port 1 on the loopback address: nothing listens there, the connection is refused.
    engine = make_engine(databases.admin_url().set(port=1), settings=settings)
    try:
        with caplog.at_level(logging.DEBUG, logger="taskq.ui"):
            async with ui_client(engine, settings) as ui:
                for page in ("/", "/jobs"):
                    response = await ui.get(page)
                    assert response.status_code == 503, (page, response.text)
                    assert "the job store cannot be reached" in response.text
                    assert "StoreUnavailable" in response.text
    finally:
        await engine.dispose()
    logged = _ui_errors(caplog)
    assert len(logged) == 1, [r.getMessage() for r in logged]
    assert logged[0].levelno == logging.ERROR
    assert "StoreUnavailable" in logged[0].getMessage()
