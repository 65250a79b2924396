"""``taskq worker MODULE:ATTR``: run a worker process for the actors at ``MODULE:ATTR``."""

from __future__ import annotations

import importlib
import sys
from typing import Any

import click

from taskq.cli.options import database_options
from taskq.exceptions import ConfigurationError, MissingProvider, SchemaNotReady
from taskq.settings import WorkerSettings


def load_target(target: str, *, param_hint: str = "TARGET") -> Any:
    """Import ``MODULE:ATTR`` and return the attribute (an actor registry).

    Problems are ``click.BadParameter`` errors naming ``param_hint``.
    """
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise click.BadParameter(
            "expected MODULE:ATTR, e.g. myapp.actors:registry", param_hint=param_hint
        )
    if "" not in sys.path:
        sys.path.insert(0, "")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise click.BadParameter(
            f"cannot import {module_name!r}: {exc}", param_hint=param_hint
        ) from None
    try:
        return getattr(module, attr)
    except AttributeError:
        raise click.BadParameter(
            f"{module_name!r} has no attribute {attr!r}", param_hint=param_hint
        ) from None


@click.command("worker")
@click.argument("target")
@database_options
@click.option(
    "-q",
    "--queue",
    "queues",
    multiple=True,
    help="Queue to claim (repeatable) [env: TASKQ_QUEUES].",
)
@click.option(
    "-c",
    "--concurrency",
    type=int,
    default=None,
    help="Jobs run at once [env: TASKQ_MAX_CONCURRENCY].",
)
def worker(
    target: str,
    database_url: str | None,
    schema_name: str | None,
    queues: tuple[str, ...],
    concurrency: int | None,
) -> None:
    """Run a worker for the actors at TARGET (MODULE:ATTR: a dict or list of actors)."""
    from taskq.worker.run import worker_main

    overrides: dict[str, Any] = {}
    if database_url is not None:
        overrides["database_url"] = database_url
    if schema_name is not None:
        overrides["schema_name"] = schema_name
    if queues:
        overrides["queues"] = queues
    if concurrency is not None:
        overrides["max_concurrency"] = concurrency
    try:
        settings = WorkerSettings.load(**overrides)
    except ConfigurationError as exc:
        raise click.UsageError(str(exc)) from None
    registry = load_target(target)
    try:
        code = worker_main(settings=settings, actor_registry=registry)
    except (SchemaNotReady, MissingProvider) as exc:
        raise click.ClickException(str(exc)) from None
    sys.exit(code)
