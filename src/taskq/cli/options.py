"""Options shared by several subcommands, and turning settings errors into usage errors."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from taskq.exceptions import ConfigurationError
from taskq.settings import TaskQSettings

F = TypeVar("F", bound=Callable[..., Any])


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
