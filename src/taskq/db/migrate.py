# sync twin: src/taskq_sync/db/migrate.py
"""Apply, revert and inspect taskq's schema migrations on a live engine.

Postgres and SQLite migrate with the same calls; alembic runs on the engine's own
connection, inside one transaction per command.
"""

from __future__ import annotations

from typing import Any

from alembic import command
from alembic.runtime.migration import MigrationContext
from sqlalchemy.ext.asyncio import AsyncEngine

from taskq._acompat import arun_sync
from taskq.db.migrations import (
    MigrationStatus,
    alembic_config,
    head_revision,
    version_table_schema,
)
from taskq.settings import TaskQSettings

__all__ = ["MigrationStatus", "current_revision", "downgrade", "status", "upgrade"]


def _schema(settings: TaskQSettings | None) -> str:
    return (settings or TaskQSettings.load()).schema_name


def _upgrade(conn: Any, schema: str, revision: str) -> None:
    command.upgrade(alembic_config(schema=schema, connection=conn), revision)


def _downgrade(conn: Any, schema: str, revision: str) -> None:
    command.downgrade(alembic_config(schema=schema, connection=conn), revision)


def _current(conn: Any, schema: str) -> str | None:
    opts = {"version_table_schema": version_table_schema(conn.engine.url, schema)}
    return MigrationContext.configure(conn, opts=opts).get_current_revision()


async def upgrade(
    engine: AsyncEngine, revision: str = "head", *, settings: TaskQSettings | None = None
) -> None:
    """Migrate the database up to ``revision`` (default: the newest)."""
    async with engine.begin() as conn:
        await arun_sync(conn, _upgrade, _schema(settings), revision)


async def downgrade(
    engine: AsyncEngine, revision: str = "base", *, settings: TaskQSettings | None = None
) -> None:
    """Migrate the database down to ``revision`` (default: ``base``, removing every table)."""
    async with engine.begin() as conn:
        await arun_sync(conn, _downgrade, _schema(settings), revision)


async def current_revision(
    engine: AsyncEngine, *, settings: TaskQSettings | None = None
) -> str | None:
    """The revision the database is at, or ``None`` when it was never migrated."""
    async with engine.connect() as conn:
        return await arun_sync(conn, _current, _schema(settings))


async def status(engine: AsyncEngine, *, settings: TaskQSettings | None = None) -> MigrationStatus:
    """The current and the newest revision."""
    return MigrationStatus(
        current=await current_revision(engine, settings=settings), head=head_revision()
    )
