"""Migrations on real Postgres and SQLite: up/down/up, the schema matches tables.py, schema name."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import Connection, inspect, select, text
from sqlalchemy.engine import URL

import taskq_sync.db.migrate as sync_migrate
from taskq.db import migrate, tables
from taskq.db.dialect import set_local_search_path
from taskq.db.engine import make_engine, transaction
from taskq.db.migrations import head_revision
from taskq.exceptions import SchemaNotReady
from taskq.settings import TaskQSettings
from taskq_sync.db.engine import make_engine as make_sync_engine
from tests.support import databases

TABLES = {t.name for t in tables.metadata.sorted_tables}


@pytest.fixture(params=["postgres", "sqlite"])
def empty_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str | URL]:
    """A database with no taskq tables at all, on each engine."""
    if request.param == "postgres":
        with databases.temporary_database("mig") as url:
            yield url
    else:
        yield f"sqlite:///{tmp_path / 'empty.db'}"


def _diff(conn: Connection, schema: str) -> list[Any]:
    if conn.dialect.name == "postgresql":
        conn.execute(set_local_search_path(schema))
    ctx = MigrationContext.configure(
        conn,
        opts={
            "compare_type": True,
            "include_name": lambda name, type_, _p: (
                not (type_ == "table" and name == "alembic_version")
            ),
        },
    )
    return list(compare_metadata(ctx, tables.metadata))


def _tables(conn: Connection, schema: str) -> set[str]:
    insp = inspect(conn)
    names = insp.get_table_names(schema=schema if conn.dialect.name == "postgresql" else None)
    return set(names) - {"alembic_version"}


async def test_upgrade_head_matches_tables_py(
    empty_url: str | URL, settings: TaskQSettings
) -> None:
    engine = make_engine(empty_url, settings=settings)
    await migrate.upgrade(engine, settings=settings)
    async with engine.begin() as conn:
        diff = await conn.run_sync(_diff, settings.schema_name)
    await engine.dispose()
    assert diff == [], f"alembic head and tables.py disagree: {diff}"


async def test_up_down_up(empty_url: str | URL, settings: TaskQSettings) -> None:
    engine = make_engine(empty_url, settings=settings)
    status = await migrate.status(engine, settings=settings)
    assert status.current is None
    assert not status.up_to_date

    await migrate.upgrade(engine, settings=settings)
    async with engine.connect() as conn:
        assert await conn.run_sync(_tables, settings.schema_name) == TABLES
    assert (await migrate.status(engine, settings=settings)).current == head_revision()

    await migrate.downgrade(engine, "base", settings=settings)
    async with engine.connect() as conn:
        assert await conn.run_sync(_tables, settings.schema_name) == set()
    assert await migrate.current_revision(engine, settings=settings) is None

    await migrate.upgrade(engine, settings=settings)
    async with engine.connect() as conn:
        assert await conn.run_sync(_tables, settings.schema_name) == TABLES
        assert await conn.run_sync(_diff, settings.schema_name) == []
    assert (await migrate.status(engine, settings=settings)).up_to_date
    await engine.dispose()


async def test_upgrade_is_idempotent(empty_url: str | URL, settings: TaskQSettings) -> None:
    engine = make_engine(empty_url, settings=settings)
    await migrate.upgrade(engine, settings=settings)
    await migrate.upgrade(engine, settings=settings)
    assert (await migrate.status(engine, settings=settings)).up_to_date
    await engine.dispose()


async def test_table_before_migrate_raises_schema_not_ready(
    empty_url: str | URL, settings: TaskQSettings
) -> None:
    engine = make_engine(empty_url, settings=settings)
    with pytest.raises(SchemaNotReady) as info:
        async with transaction(engine) as conn:
            await conn.execute(select(tables.jobs.c.id))
    await engine.dispose()
    assert info.value.table == "jobs"
    assert "taskq migrate up" in str(info.value)


async def test_custom_schema_name_places_every_table(settings: TaskQSettings) -> None:
    custom = TaskQSettings.load(schema_name=f"tq_{uuid.uuid4().hex[:6]}")
    with databases.temporary_database("schema") as url:
        engine = make_engine(url, settings=custom)
        await migrate.upgrade(engine, settings=custom)
        async with engine.connect() as conn:
            assert await conn.run_sync(_tables, custom.schema_name) == TABLES
            assert await conn.run_sync(_tables, "taskq") == set()
            assert await conn.run_sync(_diff, custom.schema_name) == []
        # Runtime statements reach the custom schema through schema_translate_map.
        job_id = uuid.uuid4()
        async with transaction(engine) as conn:
            await conn.execute(
                tables.actor_config.insert().values(actor="a", queue="default", metadata={})
            )
            await conn.execute(
                tables.jobs.insert().values(
                    id=job_id,
                    actor="a",
                    payload={"x": 1},
                    scheduled_at=__import__("datetime").datetime.now(__import__("datetime").UTC),
                )
            )
        async with engine.connect() as conn:
            found = await conn.scalar(
                text(f'SELECT count(*) FROM "{custom.schema_name}".jobs WHERE id = :i'),
                {"i": job_id},
            )
        assert found == 1
        await migrate.downgrade(engine, "base", settings=custom)
        async with engine.connect() as conn:
            assert await conn.run_sync(_tables, custom.schema_name) == set()
        await engine.dispose()


def test_sync_facade_migrates(empty_url: str | URL, settings: TaskQSettings) -> None:
    engine = make_sync_engine(empty_url, settings=settings)
    assert sync_migrate.status(engine, settings=settings).current is None
    sync_migrate.upgrade(engine, settings=settings)
    assert sync_migrate.status(engine, settings=settings).up_to_date
    with engine.connect() as conn:
        assert _tables(conn, settings.schema_name) == TABLES
    sync_migrate.downgrade(engine, "base", settings=settings)
    assert sync_migrate.current_revision(engine, settings=settings) is None
    engine.dispose()
