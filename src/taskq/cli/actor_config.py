"""``taskq actor-config``: read, tune, compare and remove the stored per-actor config.

``max_concurrent``, ``max_pending`` and ``result_ttl`` are operator-owned once a worker has
synced an actor: the ``@actor(...)`` literals only seed the row. These commands are the
operator's side of that contract, over :class:`taskq.actor_config_ops.ActorsClient`::

    taskq actor-config list
    taskq actor-config get send_email
    taskq actor-config set send_email --max-concurrent 4 --clear-max-pending
    taskq actor-config diff --actors myapp.actors:registry
    taskq actor-config deregister my-actor.run-123 --force --purge-queue
"""

from __future__ import annotations

import importlib
import json
import sys
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

import click
from sqlalchemy.ext.asyncio import AsyncEngine

from taskq.actor import ActorRef, validate_actor_name
from taskq.actor_config import ActorConfigDiff, ActorConfigRow, DeregisterResult
from taskq.actor_config_ops import UNSET, ActorsClient
from taskq.cli.options import (
    database_options,
    echo_json,
    json_option,
    load_settings,
    run_db,
)
from taskq.cli.worker import load_target
from taskq.constants import validate_queue_name
from taskq.exceptions import (
    ActorDeregistrationError,
    ActorHasActiveJobsError,
    ActorHasEnabledSchedulesError,
    ActorNotFoundError,
)
from taskq.settings import TaskQSettings

__all__ = ["actor_config", "declared_actors", "format_row", "format_table", "row_to_json"]

_FAILURE = "cannot read or write actor config on"
_QUEUE_NOTE = "note: a worker's startup sync sets the queue back to the @actor(queue=...) value"


# --- rendering --------------------------------------------------------------------------


def _ttl_seconds(ttl: timedelta | None) -> float | None:
    return ttl.total_seconds() if ttl is not None else None


def _value(value: Any) -> str:
    """A stored or literal value for a table cell: ``none`` for NULL, seconds for TTLs."""
    if value is None:
        return "none"
    if isinstance(value, timedelta):
        return f"{value.total_seconds():g}s"
    return str(value)


def _json_value(value: Any) -> Any:
    return value.total_seconds() if isinstance(value, timedelta) else value


def row_to_json(row: ActorConfigRow) -> dict[str, Any]:
    """An ``actor_config`` row as a JSON object (``result_ttl_s`` in seconds, ISO time)."""
    return {
        "actor": row.actor,
        "queue": row.queue,
        "max_concurrent": row.max_concurrent,
        "max_pending": row.max_pending,
        "result_ttl_s": _ttl_seconds(row.result_ttl),
        "metadata": row.metadata,
        "updated_at": row.updated_at.isoformat(),
    }


def format_row(row: ActorConfigRow) -> str:
    """One row as ``field: value`` lines, saying what a NULL means for each field."""
    max_concurrent = (
        "none (uncapped)"
        if row.max_concurrent is None
        else f"{row.max_concurrent} (drain mode: nothing is dispatched)"
        if row.max_concurrent == 0
        else str(row.max_concurrent)
    )
    max_pending = (
        "none (the @actor(max_pending=...) literal applies)"
        if row.max_pending is None
        else str(row.max_pending)
    )
    ttl = "none (results kept)" if row.result_ttl is None else _value(row.result_ttl)
    lines = [
        ("actor", row.actor),
        ("queue", row.queue),
        ("max_concurrent", max_concurrent),
        ("max_pending", max_pending),
        ("result_ttl", ttl),
        ("metadata", json.dumps(row.metadata, sort_keys=True)),
        ("updated_at", row.updated_at.isoformat()),
    ]
    return "\n".join(f"{name + ':':<16}{value}" for name, value in lines)


def format_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Left-aligned columns separated by two spaces (trailing blanks stripped)."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip()
        for line in [header, *rows]
    )


# --- declared actors (diff) -------------------------------------------------------------


def declared_actors(target: str) -> list[ActorRef[Any, Any]]:
    """The actors ``target`` declares: ``MODULE:ATTR`` (a mapping or list of actors, or one
    actor) or ``MODULE`` (every actor bound at the module's top level).

    Problems are ``click.BadParameter`` errors on ``--actors``.
    """
    from taskq.worker.run import resolve_actors

    if ":" in target:
        obj = load_target(target, param_hint="--actors")
        if isinstance(obj, ActorRef):
            return [obj]
        if not isinstance(obj, Mapping) and not isinstance(obj, list | tuple | set | frozenset):
            raise click.BadParameter(
                f"{target!r} is a {type(obj).__name__}, not a dict or list of actors",
                param_hint="--actors",
            )
        try:
            return list(resolve_actors(obj).values())
        except TypeError as exc:
            raise click.BadParameter(str(exc), param_hint="--actors") from None
    if "" not in sys.path:
        sys.path.insert(0, "")
    try:
        module = importlib.import_module(target)
    except ImportError as exc:
        raise click.BadParameter(
            f"cannot import {target!r}: {exc}", param_hint="--actors"
        ) from None
    found = {v.name: v for v in vars(module).values() if isinstance(v, ActorRef)}
    if not found:
        raise click.BadParameter(
            f"module {target!r} binds no actors at its top level; "
            "name the registry with MODULE:ATTR",
            param_hint="--actors",
        )
    return [found[name] for name in sorted(found)]


# --- commands ---------------------------------------------------------------------------


@click.group("actor-config")
def actor_config() -> None:
    """Read and tune the stored per-actor config (the actor_config rows).

    Once a worker has synced an actor, the stored max_concurrent, max_pending and
    result_ttl win over the @actor(...) literals; change them here.
    """


def _settings(database_url: str | None, schema_name: str | None) -> TaskQSettings:
    return load_settings(database_url, schema_name)


@actor_config.command("get")
@click.argument("actor")
@database_options
@json_option
def get_cmd(actor: str, database_url: str | None, schema_name: str | None, as_json: bool) -> None:
    """Show the stored config of ACTOR (exit 1 when it has no row)."""
    settings = _settings(database_url, schema_name)
    row = run_db(
        settings, lambda e: ActorsClient(e, settings=settings).get(actor), failure=_FAILURE
    )
    if row is None:
        raise click.ClickException(
            f"no actor_config row for {actor!r}: no worker has synced it and nobody set it"
        )
    if as_json:
        echo_json(row_to_json(row))
    else:
        click.echo(format_row(row))


@actor_config.command("list")
@database_options
@json_option
def list_cmd(database_url: str | None, schema_name: str | None, as_json: bool) -> None:
    """List every stored actor config, by actor name."""
    settings = _settings(database_url, schema_name)
    rows = run_db(settings, lambda e: ActorsClient(e, settings=settings).list(), failure=_FAILURE)
    if as_json:
        echo_json([row_to_json(r) for r in rows])
        return
    if not rows:
        click.echo("no actor_config rows (workers create them at startup)")
        return
    header = ("ACTOR", "QUEUE", "MAX_CONCURRENT", "MAX_PENDING", "RESULT_TTL", "UPDATED_AT")
    cells = [
        (
            r.actor,
            r.queue,
            _value(r.max_concurrent),
            _value(r.max_pending),
            _value(r.result_ttl),
            r.updated_at.isoformat(timespec="seconds"),
        )
        for r in rows
    ]
    click.echo(format_table(header, cells))


def _pick(name: str, value: Any, clear: bool) -> Any:
    if value is not None and clear:
        raise click.UsageError(f"--{name} and --clear-{name} are mutually exclusive")
    if clear:
        return None
    return value if value is not None else UNSET


@actor_config.command("set")
@click.argument("actor")
@click.option(
    "--max-concurrent",
    type=click.IntRange(min=0),
    default=None,
    help="Fleet-wide best-effort cap on running jobs; 0 = drain mode (dispatch nothing).",
)
@click.option(
    "--clear-max-concurrent", is_flag=True, help="Store NULL: uncapped (the literal is NOT used)."
)
@click.option(
    "--max-pending",
    type=click.IntRange(min=0),
    default=None,
    help="Backpressure cap on pending jobs; enqueue raises MaxPendingExceededError beyond it.",
)
@click.option(
    "--clear-max-pending",
    is_flag=True,
    help="Store NULL: the @actor(max_pending=...) literal applies again.",
)
@click.option(
    "--result-ttl",
    type=click.FloatRange(min=0, min_open=True, max=1e12),
    default=None,
    metavar="SECONDS",
    help="How long a succeeded job's result is kept.",
)
@click.option("--clear-result-ttl", is_flag=True, help="Store NULL: results are kept.")
@click.option(
    "--queue",
    default=None,
    help="Move the actor to this queue (a worker's startup sync sets it back to the "
    "@actor(queue=...) value).",
)
@database_options
def set_cmd(
    actor: str,
    max_concurrent: int | None,
    clear_max_concurrent: bool,
    max_pending: int | None,
    clear_max_pending: bool,
    result_ttl: float | None,
    clear_result_ttl: bool,
    queue: str | None,
    database_url: str | None,
    schema_name: str | None,
) -> None:
    """Overwrite ACTOR's stored fields (create its row if missing). Idempotent.

    max_concurrent applies at the next dispatch cycle; max_pending within the enqueue
    side's cache TTL (TASKQ_ACTOR_CONFIG_CACHE_TTL, 5 s by default).
    """
    changes: dict[str, Any] = {
        "max_concurrent": _pick("max-concurrent", max_concurrent, clear_max_concurrent),
        "max_pending": _pick("max-pending", max_pending, clear_max_pending),
        "result_ttl_s": _pick("result-ttl", result_ttl, clear_result_ttl),
    }
    if queue is None and all(v is UNSET for v in changes.values()):
        raise click.UsageError(
            "nothing to set: give --max-concurrent, --max-pending, --result-ttl, --queue "
            "or a --clear-* option"
        )
    try:
        validate_actor_name(actor)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="ACTOR") from None
    if queue is not None:
        try:
            validate_queue_name(queue)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--queue") from None
    settings = _settings(database_url, schema_name)

    async def _set(engine: AsyncEngine) -> tuple[ActorConfigRow | None, ActorConfigRow]:
        client = ActorsClient(engine, settings=settings)
        before = await client.get(actor)
        after = await client.set(actor, queue=queue, **changes)
        return before, after

    try:
        before, after = run_db(settings, _set, failure=_FAILURE)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    if before is None:
        click.echo(f"created the actor_config row for {after.actor!r} on queue {after.queue!r}")
    else:
        diffs = [
            (name, getattr(before, name), getattr(after, name))
            for name in ("queue", "max_concurrent", "max_pending", "result_ttl")
            if getattr(before, name) != getattr(after, name)
        ]
        if diffs:
            click.echo(f"updated {after.actor!r}:")
            for name, old, new in diffs:
                click.echo(f"  {name}: {_value(old)} -> {_value(new)}")
        else:
            click.echo(f"{after.actor!r} unchanged (already set)")
    if queue is not None:
        click.echo(_QUEUE_NOTE)
    click.echo(format_row(after))


def _diff_json(d: ActorConfigDiff) -> dict[str, Any]:
    return {
        "actor": d.actor,
        "field": d.field,
        "literal": _json_value(d.literal),
        "stored": _json_value(d.stored),
        "enforced": d.enforced,
        "differs": d.differs,
    }


@actor_config.command("diff")
@click.option(
    "--actors",
    "target",
    required=True,
    metavar="MODULE[:ATTR]",
    help="The declared actors: MODULE:ATTR (a dict or list of actors, as `taskq worker` "
    "takes) or MODULE (every actor bound at its top level).",
)
@database_options
@json_option
@click.option("--exit-code", is_flag=True, help="Exit 1 when any literal differs from the store.")
def diff_cmd(
    target: str,
    database_url: str | None,
    schema_name: str | None,
    as_json: bool,
    exit_code: bool,
) -> None:
    """Compare the @actor(...) literals with the stored rows, per actor and field.

    For each seed-only field (max_concurrent, max_pending, result_ttl): the literal,
    the stored value, and which one is enforced (stored; literal, for a NULL stored
    max_pending; unregistered, when no worker has synced the actor yet).
    """
    refs = declared_actors(target)
    settings = _settings(database_url, schema_name)

    async def _diff(engine: AsyncEngine) -> tuple[list[ActorConfigDiff], list[ActorConfigRow]]:
        client = ActorsClient(engine, settings=settings)
        return await client.diff(refs), await client.list()

    diffs, rows = run_db(settings, _diff, failure=_FAILURE)
    declared = {ref.name for ref in refs}
    undeclared = [r.actor for r in rows if r.actor not in declared]
    differing = [d for d in diffs if d.differs]
    if as_json:
        echo_json({"fields": [_diff_json(d) for d in diffs], "stored_not_declared": undeclared})
    else:
        header = ("ACTOR", "FIELD", "LITERAL", "STORED", "ENFORCED", "DIFFERS")
        cells = [
            (
                d.actor,
                d.field,
                _value(d.literal),
                "-" if d.enforced == "unregistered" else _value(d.stored),
                d.enforced,
                "yes" if d.differs else "",
            )
            for d in diffs
        ]
        click.echo(format_table(header, cells))
        click.echo("")
        click.echo(
            f"{len(differing)} of {len(diffs)} fields differ across {len(refs)} declared actors"
        )
        unregistered = sorted({d.actor for d in diffs if d.enforced == "unregistered"})
        if unregistered:
            click.echo(
                "no stored row yet (the literals seed it at the next worker boot): "
                + ", ".join(unregistered)
            )
        if undeclared:
            click.echo("stored but not declared by --actors: " + ", ".join(undeclared))
    if exit_code and differing:
        sys.exit(1)


def _refusal(exc: ActorDeregistrationError, force: bool) -> str:
    if isinstance(exc, ActorNotFoundError):
        return (
            f"cannot deregister {exc.actor!r}: it has no actor_config row (already "
            "deregistered?); pass --missing-ok to treat that as success"
        )
    if isinstance(exc, ActorHasActiveJobsError):
        counts = ", ".join(f"{s} {n}" for s, n in sorted(exc.status_counts.items()))
        running = exc.status_counts.get("running", 0)
        if force and running:
            return (
                f"cannot deregister {exc.actor!r}, even with --force: {running} job(s) are "
                f"running ({counts}); running jobs cannot be force-cancelled, so stop the "
                "workers or wait for them to finish"
            )
        return (
            f"cannot deregister {exc.actor!r}: {exc.active_count} non-terminal job(s) "
            f"reference it ({counts}); cancel them, or pass --force to cancel the pending "
            "and scheduled ones"
        )
    if isinstance(exc, ActorHasEnabledSchedulesError):
        return (
            f"cannot deregister {exc.actor!r}: enabled cron schedules reference it "
            f"({', '.join(exc.schedule_ids)}); disable them, or pass --force to disable them"
        )
    return f"cannot deregister {exc.actor!r}: {exc}"


def _result_json(result: DeregisterResult) -> dict[str, Any]:
    return {
        "actor": result.actor,
        "queue": result.queue,
        "actor_config_deleted": result.actor_config_deleted,
        "schedules_disabled": result.schedules_disabled,
        "jobs_cancelled": result.jobs_cancelled,
        "terminal_jobs_remaining": result.terminal_jobs_remaining,
        "queue_purged": result.queue_purged,
    }


@actor_config.command("deregister")
@click.argument("actor")
@click.option(
    "--force",
    is_flag=True,
    help="Cancel pending/scheduled jobs and disable enabled schedules (still refuses "
    "while jobs are running).",
)
@click.option(
    "--purge-queue",
    is_flag=True,
    help="Also delete the actor's queues row, unless another actor uses the queue.",
)
@click.option(
    "--missing-ok",
    is_flag=True,
    help="Exit 0 when the actor has no row (already deregistered).",
)
@database_options
@json_option
def deregister_cmd(
    actor: str,
    force: bool,
    purge_queue: bool,
    missing_ok: bool,
    database_url: str | None,
    schema_name: str | None,
    as_json: bool,
) -> None:
    """Delete ACTOR's actor_config row. Terminal job history is never deleted.

    Without --force it refuses (exit 1, nothing changed) while non-terminal jobs or
    enabled cron schedules reference the actor. Stop enqueuing to the actor and stop
    its workers first: a worker's startup sync re-creates the row.
    """
    settings = _settings(database_url, schema_name)
    try:
        result = run_db(
            settings,
            lambda e: ActorsClient(e, settings=settings).deregister(
                actor, force=force, purge_queue=purge_queue
            ),
            failure=_FAILURE,
        )
    except ActorNotFoundError as exc:
        if not missing_ok:
            raise click.ClickException(_refusal(exc, force)) from None
        if as_json:
            echo_json(None)
        else:
            click.echo(f"{actor!r} has no actor_config row: nothing to deregister")
        return
    except ActorDeregistrationError as exc:
        raise click.ClickException(_refusal(exc, force)) from None
    if as_json:
        echo_json(_result_json(result))
        return
    if result.queue_purged:
        purged = "deleted"
    elif purge_queue:
        purged = "kept (another actor uses the queue, or it had no row)"
    else:
        purged = "kept (--purge-queue not given)"
    click.echo(f"deregistered {result.actor!r} (queue {result.queue!r})")
    click.echo(f"  pending/scheduled jobs cancelled: {result.jobs_cancelled}")
    click.echo(f"  schedules disabled:               {result.schedules_disabled}")
    click.echo(f"  terminal jobs kept:               {result.terminal_jobs_remaining}")
    click.echo(f"  queues row:                       {purged}")
