"""``taskq queues``: inspect queues and set their fleet-wide concurrency cap.

The cap is ``queues.max_concurrent`` (``NULL``: uncapped). Workers read it once, at
startup, and enforce it with a ``taskq:global:queue:{queue}`` concurrency reservation
(leased slots, a hard cap), so a change applies as the workers claiming the queue
restart. Over :class:`taskq.actor_config_ops.QueuesClient`::

    taskq queues list
    taskq queues get external-api
    taskq queues set-max-concurrent external-api --max-concurrent 20
    taskq queues set-max-concurrent external-api --clear
    taskq queues pause external-api
    taskq queues resume external-api
"""

from __future__ import annotations

from typing import Any

import click
from sqlalchemy.ext.asyncio import AsyncEngine

from taskq.actor_config_ops import QueueConfig, QueuesClient
from taskq.cli.actor_config import format_table
from taskq.cli.ops_support import run_ops
from taskq.cli.options import (
    database_options,
    echo_json,
    json_option,
    load_settings,
    run_db,
)
from taskq.constants import validate_queue_name

__all__ = ["format_queue", "queue_to_json", "queues"]

_FAILURE = "cannot read or write queue settings on"
_RESTART = (
    "workers read queue caps at startup: restart the workers that claim {queue!r} for this to apply"
)


def _cap(value: int | None) -> str:
    return "none (uncapped)" if value is None else str(value)


def queue_to_json(queue: QueueConfig) -> dict[str, Any]:
    """A queue's settings as a JSON object."""
    return {
        "name": queue.name,
        "mode": queue.mode,
        "max_concurrent": queue.max_concurrent,
        "paused": queue.paused,
        "actors": list(queue.actors),
        "stored": queue.stored,
        "updated_at": queue.updated_at.isoformat() if queue.updated_at is not None else None,
    }


def format_queue(queue: QueueConfig) -> str:
    """A queue's settings as ``field: value`` lines."""
    lines = [
        ("queue", queue.name),
        ("max_concurrent", _cap(queue.max_concurrent)),
        ("mode", queue.mode),
        ("paused", "yes" if queue.paused else "no"),
        ("actors", ", ".join(queue.actors) or "none stored"),
        (
            "updated_at",
            queue.updated_at.isoformat()
            if queue.updated_at is not None
            else "none (no queues row)",
        ),
    ]
    return "\n".join(f"{name + ':':<16}{value}" for name, value in lines)


def _queue_name(value: str) -> str:
    try:
        return validate_queue_name(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="QUEUE") from None


@click.group("queues")
def queues() -> None:
    """Inspect queues and set their fleet-wide concurrency cap (the queues table)."""


@queues.command("list")
@database_options
@json_option
def list_cmd(database_url: str | None, schema_name: str | None, as_json: bool) -> None:
    """List every queue that has a queues row or a stored actor."""
    settings = load_settings(database_url, schema_name)
    rows = run_db(settings, lambda e: QueuesClient(e, settings=settings).list(), failure=_FAILURE)
    if as_json:
        echo_json([queue_to_json(q) for q in rows])
        return
    if not rows:
        click.echo("no queues (no queues rows and no stored actors)")
        return
    header = ("QUEUE", "MAX_CONCURRENT", "MODE", "PAUSED", "ACTORS")
    cells = [
        (
            q.name,
            "none" if q.max_concurrent is None else str(q.max_concurrent),
            q.mode,
            "yes" if q.paused else "no",
            str(len(q.actors)),
        )
        for q in rows
    ]
    click.echo(format_table(header, cells))


@queues.command("get")
@click.argument("queue")
@database_options
@json_option
def get_cmd(queue: str, database_url: str | None, schema_name: str | None, as_json: bool) -> None:
    """Show QUEUE's settings (exit 1 when no queues row nor stored actor names it)."""
    name = _queue_name(queue)
    settings = load_settings(database_url, schema_name)
    row = run_db(settings, lambda e: QueuesClient(e, settings=settings).get(name), failure=_FAILURE)
    if row is None:
        raise click.ClickException(f"unknown queue {name!r}: no queues row and no stored actor")
    if as_json:
        echo_json(queue_to_json(row))
    else:
        click.echo(format_queue(row))


@queues.command("set-max-concurrent")
@click.argument("queue")
@click.option(
    "--max-concurrent",
    type=int,
    default=None,
    metavar="N",
    help="At most N jobs of QUEUE run at once, fleet-wide (N >= 1).",
)
@click.option("--clear", is_flag=True, help="Remove the cap (store NULL: uncapped).")
@database_options
def set_max_concurrent_cmd(
    queue: str,
    max_concurrent: int | None,
    clear: bool,
    database_url: str | None,
    schema_name: str | None,
) -> None:
    """Set QUEUE's fleet-wide concurrency cap (creates its queues row if needed).

    A hard cap (leased slots), unlike an actor's max_concurrent. 0 is rejected: for a
    queue, uncapped is --clear, and a hard stop belongs at the actor level
    (taskq actor-config set ACTOR --max-concurrent 0).
    """
    name = _queue_name(queue)
    if clear and max_concurrent is not None:
        raise click.UsageError("--max-concurrent and --clear are mutually exclusive")
    if not clear and max_concurrent is None:
        raise click.UsageError("give --max-concurrent N (N >= 1) or --clear")
    if max_concurrent is not None and max_concurrent < 1:
        raise click.BadParameter(
            f"{max_concurrent} is not >= 1: a queue cap must be at least 1 (remove the cap "
            "with --clear; drain an actor with `taskq actor-config set ACTOR "
            "--max-concurrent 0`)",
            param_hint="--max-concurrent",
        )
    settings = load_settings(database_url, schema_name)

    async def _set(engine: AsyncEngine) -> tuple[QueueConfig | None, QueueConfig]:
        client = QueuesClient(engine, settings=settings)
        before = await client.get(name)
        return before, await client.set_max_concurrent(name, max_concurrent)

    try:
        before, after = run_db(settings, _set, failure=_FAILURE)
    except ValueError as exc:  # the service's own check; the ones above catch it first
        raise click.BadParameter(str(exc)) from None
    old = before.max_concurrent if before is not None else None
    if old == after.max_concurrent:
        click.echo(f"queue {name!r}: max_concurrent {_cap(old)} (unchanged)")
        return
    click.echo(f"queue {name!r}: max_concurrent {_cap(old)} -> {_cap(after.max_concurrent)}")
    click.echo(_RESTART.format(queue=name))


def _pause_or_resume(
    queue: str, database_url: str | None, schema_name: str | None, *, paused: bool
) -> None:
    name = _queue_name(queue)
    settings = load_settings(database_url, schema_name)

    async def go(engine: AsyncEngine) -> QueueConfig:
        client = QueuesClient(engine, settings=settings)
        return await (client.pause(name) if paused else client.resume(name))

    run_ops(settings, go)
    click.echo(
        f"queue {name!r}: " + ("paused: workers claim none of its jobs" if paused else "resumed")
    )


@queues.command("pause")
@click.argument("queue")
@database_options
def pause_cmd(queue: str, database_url: str | None, schema_name: str | None) -> None:
    """Stop workers claiming QUEUE's jobs (running ones finish; enqueue still works).

    Applies at the next claim of every worker, no restart.
    """
    _pause_or_resume(queue, database_url, schema_name, paused=True)


@queues.command("resume")
@click.argument("queue")
@database_options
def resume_cmd(queue: str, database_url: str | None, schema_name: str | None) -> None:
    """Let workers claim QUEUE's jobs again."""
    _pause_or_resume(queue, database_url, schema_name, paused=False)
