"""``taskq worker MODULE:ATTR``: run a worker process for the actors at ``MODULE:ATTR``."""

from __future__ import annotations

import sys
from typing import Any

import click

from taskq.cli.options import database_options
from taskq.exceptions import ConfigurationError, MissingProvider, SchemaNotReady
from taskq.worker import target as target_module


def load_target(target: str, *, param_hint: str = "TARGET") -> Any:
    """Import ``MODULE:ATTR`` and return the attribute (an actor registry).

    Problems are ``click.BadParameter`` errors naming ``param_hint``.
    """
    try:
        return target_module.load_target(target)
    except target_module.TargetError as exc:
        raise click.BadParameter(str(exc), param_hint=param_hint) from None


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

    try:
        settings = target_module.worker_settings(
            database_url=database_url,
            schema_name=schema_name,
            queues=queues,
            concurrency=concurrency,
        )
    except ConfigurationError as exc:
        raise click.UsageError(str(exc)) from None
    verbose = (click.get_current_context().obj or {}).get("log_level")
    if verbose is not None:  # `taskq -v worker`: INFO, `-vv`: DEBUG
        settings = settings.model_copy(update={"log_level": verbose})
    registry = load_target(target)
    try:
        code = worker_main(settings=settings, actor_registry=registry)
    except (SchemaNotReady, MissingProvider) as exc:
        raise click.ClickException(str(exc)) from None
    sys.exit(code)
