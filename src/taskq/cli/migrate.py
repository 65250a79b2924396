"""``taskq migrate``: apply, revert, inspect and print the schema migrations."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

import click
from sqlalchemy.ext.asyncio import AsyncEngine

from taskq.cli.options import database_options, load_settings, run_db, where
from taskq.db import migrate as migrations
from taskq.db.migrations import head_revision, offline_sql
from taskq.settings import TaskQSettings

T = TypeVar("T")


def _run(settings: TaskQSettings, action: Callable[[AsyncEngine], Awaitable[T]]) -> T:
    return run_db(settings, action, failure="cannot migrate")


def _where(settings: TaskQSettings) -> str:
    return where(settings)


@click.group()
def migrate() -> None:
    """Create, upgrade and inspect taskq's tables (Postgres or the embedded SQLite)."""


@migrate.command("up")
@click.argument("revision", default="head")
@database_options
def up(revision: str, database_url: str | None, schema_name: str | None) -> None:
    """Migrate up to REVISION (default: head, the newest)."""
    settings = load_settings(database_url, schema_name)
    _run(settings, lambda e: migrations.upgrade(e, revision, settings=settings))
    status = _run(settings, lambda e: migrations.status(e, settings=settings))
    click.echo(f"{_where(settings)}: at revision {status.current} (head {status.head})")


@migrate.command("down")
@click.argument("revision", default="-1")
@database_options
def down(revision: str, database_url: str | None, schema_name: str | None) -> None:
    """Migrate down to REVISION (default: -1, one step; `base` removes every taskq table)."""
    settings = load_settings(database_url, schema_name)
    _run(settings, lambda e: migrations.downgrade(e, revision, settings=settings))
    status = _run(settings, lambda e: migrations.status(e, settings=settings))
    click.echo(f"{_where(settings)}: at revision {status.current or 'base (no tables)'}")


@migrate.command("status")
@database_options
@click.option("--exit-code", is_flag=True, help="Exit 1 when the database is not at head.")
def status_cmd(database_url: str | None, schema_name: str | None, exit_code: bool) -> None:
    """Show the database's revision and whether migrations are pending."""
    settings = load_settings(database_url, schema_name)
    status = _run(settings, lambda e: migrations.status(e, settings=settings))
    state = "up to date" if status.up_to_date else "migrations pending: run `taskq migrate up`"
    click.echo(f"database: {_where(settings)}")
    click.echo(f"schema:   {settings.schema_name}")
    click.echo(f"current:  {status.current or 'none (not migrated)'}")
    click.echo(f"head:     {status.head}")
    click.echo(f"status:   {state}")
    if exit_code and not status.up_to_date:
        raise SystemExit(1)


@migrate.command("sql")
@click.argument("revision", default="head")
@click.option("--down", "down_", is_flag=True, help="Print the downgrade from head to REVISION.")
@database_options
def sql(revision: str, down_: bool, database_url: str | None, schema_name: str | None) -> None:
    """Print the SQL that `migrate up` (or `--down`) would run, without connecting."""
    settings = load_settings(database_url, schema_name)
    if down_ and revision == "head":
        revision = "base"
    try:
        text = offline_sql(
            settings.effective_database_url,
            schema=settings.schema_name,
            revision=revision,
            down=down_,
        )
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--database-url") from None
    click.echo(text, nl=False)


__all__ = ["head_revision", "migrate"]
