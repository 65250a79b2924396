"""Fixtures for the producer-side behavioural suite (see tests/support/producer.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy.engine import URL

from taskq.client import JobsClient, TaskQ
from taskq.db.engine import make_engine
from taskq.settings import TaskQSettings
from taskq.testing.clock import FakeClock
from taskq.testing.in_memory import InMemoryBackend
from tests.support.producer import STORES_AND_MODES, Env


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "producer_env" in metafunc.fixturenames:
        metafunc.parametrize(
            ("store", "mode"), STORES_AND_MODES, ids=[f"{s}-{m}" for s, m in STORES_AND_MODES]
        )


@pytest.fixture
def producer_url(request: pytest.FixtureRequest, store: str) -> str | None:
    """The migrated database URL for ``store`` (resolved outside the event loop)."""
    if store == "memory":
        return None
    url: str = request.getfixturevalue("pg_url" if store == "postgres" else "sqlite_url")
    return url


@pytest.fixture
async def producer_env(
    producer_url: str | None, store: str, mode: str, settings: TaskQSettings
) -> AsyncIterator[Env]:
    if store == "memory":
        backend = InMemoryBackend(clock=FakeClock(datetime(2025, 1, 1, tzinfo=UTC)))
        yield Env(store, mode, JobsClient(backend), memory=backend)
        return
    url = producer_url
    engine = make_engine(url, settings=settings)
    async_tq = TaskQ(engine=engine, settings=settings)
    sync_tq = None
    client: Any = async_tq.jobs  # the async or the sync facade's JobsClient, by mode
    if mode == "sync":
        from taskq_sync import TaskQ as SyncTaskQ

        sync_tq = SyncTaskQ(url, settings=settings)
        client = sync_tq.jobs
    yield Env(store, mode, client, engine=engine, sync_tq=sync_tq, async_tq=async_tq)
    if sync_tq is not None:
        sync_tq.close()
    await async_tq.aclose()  # its held connections; the engine is the fixture's
    await engine.dispose()


@pytest.fixture
def url(engine_url: str | URL) -> str:
    """A migrated database (each engine in turn) as the string the CLI takes."""
    if isinstance(engine_url, URL):
        return engine_url.render_as_string(hide_password=False)
    return engine_url
