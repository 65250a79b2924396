"""Options shared by several subcommands, turning settings errors into usage errors, and
running one database action with the errors an operator can act on as clean messages."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import click
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, OperationalError
from sqlalchemy.ext.asyncio import AsyncEngine

from taskq.db.engine import make_engine
from taskq.exceptions import ConfigurationError, SchemaNotReady, StoreUnavailable
from taskq.settings import TaskQSettings

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")

__all__ = [
    "DatabaseUnavailable",
    "database_options",
    "echo_json",
    "json_option",
    "load_settings",
    "run_db",
    "where",
]


class DatabaseUnavailable(click.ClickException):
    """The database cannot be reached or its schema is not migrated: exit 3, the message
    naming the fix (``taskq migrate up``, or the URL to check)."""

    exit_code = 3


def database_options(fn: F) -> F:
    """Add ``--database-url`` and ``--schema`` (each falling back to its ``TASKQ_*`` variable)."""
    fn = click.option(
        "--schema",
        "schema_name",
        default=None,
        help="Postgres schema for taskq's tables [env: TASKQ_SCHEMA_NAME; default: taskq].",
    )(fn)
    fn = click.option(
        "--database-url",
        default=None,
        help="SQLAlchemy URL of the job store [env: TASKQ_DATABASE_URL; "
        "default: the embedded sqlite+aiosqlite:///./taskq.db].",
    )(fn)
    return fn


def load_settings(database_url: str | None, schema_name: str | None) -> TaskQSettings:
    """Settings from the environment, overridden by whatever was given on the command line."""
    overrides: dict[str, Any] = {}
    if database_url is not None:
        overrides["database_url"] = database_url
    if schema_name is not None:
        overrides["schema_name"] = schema_name
    try:
        return TaskQSettings.load(**overrides)
    except ConfigurationError as exc:
        option = {"database_url": "--database-url", "schema_name": "--schema"}.get(exc.variable)
        raise click.UsageError(str(exc).replace(exc.variable, option or exc.variable, 1)) from None


def json_option(fn: F) -> F:
    """Add ``--json`` (stored as ``as_json``): print one JSON document instead of text."""
    return click.option(
        "--json", "as_json", is_flag=True, help="Print one JSON document instead of text."
    )(fn)


def echo_json(document: Any) -> None:
    """Print ``document`` as ``--json`` output: indented, keys sorted."""
    click.echo(json.dumps(document, indent=2, sort_keys=True))


def where(settings: TaskQSettings) -> str:
    """The configured database URL with its password hidden, for messages."""
    return make_url(settings.effective_database_url).render_as_string(hide_password=True)


def run_db(
    settings: TaskQSettings,
    action: Callable[[AsyncEngine], Awaitable[T]],
    *,
    failure: str = "cannot reach",
) -> T:
    """Run ``action`` on a fresh engine for ``settings`` and dispose of it; return its result.

    A URL the engine cannot use is a usage error on ``--database-url`` (exit 2); a
    database that refuses the connection or the statement is ``{failure} {url}: ...``
    and an unmigrated one says to run ``taskq migrate up`` (both exit 3). Anything else the
    action raises (``ValueError`` for bad input, the library's refusals) propagates for
    the command to turn into its own message.
    """
    url = settings.effective_database_url
    try:
        engine = make_engine(url, settings=settings)
    except (ArgumentError, ValueError) as exc:
        raise click.BadParameter(str(exc), param_hint="--database-url") from None

    async def _go() -> T:
        try:
            return await action(engine)
        finally:
            await engine.dispose()

    try:
        return asyncio.run(_go())
    except SchemaNotReady as exc:
        raise DatabaseUnavailable(f"{where(settings)}: {exc}") from None
    except StoreUnavailable as exc:
        raise DatabaseUnavailable(f"{failure} {where(settings)}: {exc.reason}") from None
    except (OperationalError, DBAPIError) as exc:
        raise DatabaseUnavailable(f"{failure} {where(settings)}: {exc.orig}") from None
