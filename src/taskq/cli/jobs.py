"""``taskq jobs``: find, inspect, cancel, retry, purge and enqueue jobs.

Every subcommand is a thin shell over ``tq.jobs`` (:class:`taskq.ops.jobs.JobOperations`),
so the CLI, the admin UI and application code act the same way::

    taskq jobs list --status failed --actor send_email
    taskq jobs get 0193...
    taskq jobs cancel-where --tag campaign-42 --yes
    taskq jobs retry-where --status failed --error-class TimeoutError --yes
    taskq jobs purge --older-than 30d --yes
    taskq jobs enqueue send_email --payload '{"to": "a@example.com"}' --actors myapp.actors
"""

from __future__ import annotations

import json
import sys
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any, TypeVar

import click
from pydantic import BaseModel, ConfigDict
from sqlalchemy.ext.asyncio import AsyncEngine

from taskq.actor import ActorRef, actor, find_actor, validate_actor_name
from taskq.backends.sql import SqlBackend
from taskq.cli.actor_config import declared_actors
from taskq.cli.ops_support import (
    confirm,
    filter_from_options,
    filter_options,
    job_id_argument,
    parse_duration,
    progress,
    run_ops,
    table,
)
from taskq.cli.options import database_options, echo_json, json_option, load_settings
from taskq.client import JobsClient
from taskq.constants import TERMINAL_STATUSES
from taskq.exceptions import JobNotFoundError
from taskq.job_filter import JobFilter
from taskq.ops.results import job_to_json
from taskq.records import JobRecord
from taskq.settings import TaskQSettings

__all__ = ["jobs"]


def _client(engine: AsyncEngine, settings: TaskQSettings) -> JobsClient:
    return JobsClient(SqlBackend(engine, settings=settings))


def _when(job: JobRecord) -> str:
    return job.created_at.strftime("%Y-%m-%d %H:%M:%S")


def _state(job: JobRecord) -> str:
    """``waiting (scheduled)`` for a job parked on a limit, else its status."""
    return f"waiting ({job.status})" if job.waiting else job.status


@click.group("jobs")
def jobs() -> None:
    """Find, inspect, cancel, retry, purge and enqueue jobs."""


@jobs.command("list")
@filter_options
@click.option(
    "--limit", type=click.IntRange(1, 1000), default=50, show_default=True, help="Jobs per page."
)
@click.option(
    "--after", default=None, metavar="CURSOR", help="The next_cursor of the previous page."
)
@database_options
@json_option
def list_cmd(
    limit: int,
    after: str | None,
    database_url: str | None,
    schema_name: str | None,
    as_json: bool,
    **options: Any,
) -> None:
    """List jobs matching the filter, newest first, one page at a time.

    --json prints {"jobs": [...], "next_cursor": ...}; pass next_cursor to --after for
    the next page.
    """
    flt = filter_from_options(options)
    settings = load_settings(database_url, schema_name)
    try:
        page = run_ops(settings, lambda e: _client(e, settings).list(flt, limit=limit, after=after))
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--after") from None
    if as_json:
        echo_json(page.to_json())
        return
    if not page.jobs:
        click.echo("no jobs match")
        return
    header = ("ID", "ACTOR", "QUEUE", "STATUS", "ATTEMPT", "CREATED", "ERROR_CLASS")
    rows = [
        (str(j.id), j.actor, j.queue, _state(j), str(j.attempt), _when(j), j.error_class or "")
        for j in page.jobs
    ]
    click.echo(table(header, rows))
    if page.next_cursor is not None:
        click.echo(f"more: --after {page.next_cursor}")


@jobs.command("count")
@filter_options
@click.option(
    "--cap",
    type=click.IntRange(min=1),
    default=10_000,
    show_default=True,
    help="Stop counting here.",
)
@database_options
@json_option
def count_cmd(
    cap: int, database_url: str | None, schema_name: str | None, as_json: bool, **options: Any
) -> None:
    """Count jobs matching the filter, stopping at --cap (printed as N+ when reached)."""
    flt = filter_from_options(options)
    settings = load_settings(database_url, schema_name)
    counted = run_ops(settings, lambda e: _client(e, settings).count(flt, cap=cap))
    if as_json:
        echo_json(counted.to_json())
    else:
        click.echo(str(counted))


@jobs.command("get")
@click.argument("job_id")
@database_options
@json_option
def get_cmd(job_id: str, database_url: str | None, schema_name: str | None, as_json: bool) -> None:
    """Show JOB_ID with every attempt (outcome, error, traceback)."""
    jid = job_id_argument(job_id)
    settings = load_settings(database_url, schema_name)
    detail = run_ops(settings, lambda e: _client(e, settings).detail(jid))
    if as_json:
        echo_json(detail.to_json())
        return
    job = detail.job
    lines = [
        ("id", str(job.id)),
        ("actor", job.actor),
        ("queue", job.queue),
        ("status", _state(job)),
        (
            "attempt",
            f"{job.attempt} (budget used {job.budget_used} of {job.max_attempts or 'default'})",
        ),
        ("priority", str(job.priority)),
        ("tags", ", ".join(job.tags) or "none"),
        ("created_at", job.created_at.isoformat()),
        ("scheduled_at", job.scheduled_at.isoformat()),
        ("waiting_on", f"{job.waiting_on} (denials {job.denials})" if job.waiting else "none"),
        ("finished_at", job.finished_at.isoformat() if job.finished_at else "not finished"),
        ("error_class", job.error_class or "none"),
        ("error", job.error or "none"),
        ("payload", json.dumps(job.payload, sort_keys=True)),
    ]
    click.echo("\n".join(f"{name + ':':<14}{value}" for name, value in lines))
    for entry in detail.manual_retries:
        click.echo(f"retried:      at {entry.get('at')} from {entry.get('from_status')}")
    click.echo(f"attempts:     {len(detail.attempts)}")
    for a in detail.attempts:
        rec = a.attempt
        click.echo(
            f"  #{rec.attempt} {rec.outcome} {rec.error_class or ''} {rec.error or ''}".rstrip()
        )
        if a.traceback:
            click.echo("    " + a.traceback.strip().replace("\n", "\n    "))


def _outcome(before: JobRecord, after: JobRecord) -> str:
    if before.is_terminal:
        return f"already {before.status}: nothing to cancel"
    if after.status == "cancelled":
        return "cancelled before start"
    if before.cancel_phase:
        return "cancel already requested: its worker is walking the cancel ladder"
    return "cancel requested: its worker walks the cancel ladder (cooperative, forced, abandoned)"


@jobs.command("cancel")
@click.argument("job_id")
@database_options
@json_option
def cancel_cmd(
    job_id: str, database_url: str | None, schema_name: str | None, as_json: bool
) -> None:
    """Cancel JOB_ID: at once if it has not started, through its worker if it runs."""
    jid = job_id_argument(job_id)
    settings = load_settings(database_url, schema_name)

    async def go(engine: AsyncEngine) -> tuple[JobRecord, JobRecord]:
        client = _client(engine, settings)
        before = (await client.detail(jid)).job
        return before, await client.cancel(jid)

    before, after = run_ops(settings, go)
    outcome = _outcome(before, after)
    if as_json:
        echo_json({"job": job_to_json(after), "outcome": outcome})
    else:
        click.echo(f"job {jid}: {outcome}")


def _matching(settings: TaskQSettings, flt: JobFilter, *, needed: bool) -> int:
    """How many jobs ``flt`` matches (capped at a million), for the question and the
    progress bar; 0 without counting when neither will be shown."""
    if not needed and not sys.stdout.isatty():
        return 0
    counted = run_ops(settings, lambda e: _client(e, settings).count(flt, cap=1_000_000))
    return counted.count


T = TypeVar("T")


def _bulk(
    options: dict[str, Any],
    database_url: str | None,
    schema_name: str | None,
    yes: bool,
    *,
    verb: str,
    question: str,
    label: str,
    act: Callable[[Any, JobFilter, Callable[[int], None] | None], Awaitable[T]],
) -> T:
    """The bulk commands' one flow: the filter (an empty one refused), the count and the
    question unless ``--yes``, then ``act`` in batches behind a progress bar."""
    flt = filter_from_options(options)
    if not flt.to_json():
        raise click.UsageError(f"give at least one filter option (refusing to {verb} every job)")
    settings = load_settings(database_url, schema_name)
    total = _matching(settings, flt, needed=not yes)
    confirm(question.format(total=total), yes=yes)
    with progress(label, total) as on_batch:
        return run_ops(settings, lambda e: act(_client(e, settings), flt, on_batch))


@jobs.command("cancel-where")
@filter_options
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@click.option("--batch-size", type=click.IntRange(min=1), default=1000, show_default=True)
@database_options
@json_option
def cancel_where_cmd(
    yes: bool,
    batch_size: int,
    database_url: str | None,
    schema_name: str | None,
    as_json: bool,
    **options: Any,
) -> None:
    """Cancel every active job matching the filter (asks first unless --yes).

    Pending and scheduled jobs end cancelled at once (CancelledBeforeStart); running
    ones are asked to stop through their workers' cancel ladder. An empty filter is
    refused: name at least one field.
    """
    result = _bulk(
        options,
        database_url,
        schema_name,
        yes,
        verb="cancel",
        question="cancel the active ones among {total} matching job(s)?",
        label="cancelling",
        act=lambda client, flt, on_batch: client.cancel_where(
            flt, batch_size=batch_size, on_batch=on_batch
        ),
    )
    if as_json:
        echo_json(result.to_json())
        return
    click.echo(
        f"cancelled before start: {result.cancelled_before_start}\n"
        f"cancel requested (running): {result.cancel_requested}\n"
        f"not reached (held by another transaction; run again): {result.not_reached}"
    )


@jobs.command("retry")
@click.argument("job_id")
@database_options
@json_option
def retry_cmd(
    job_id: str, database_url: str | None, schema_name: str | None, as_json: bool
) -> None:
    """Put a failed, cancelled, crashed or abandoned JOB_ID back to pending, fresh budget."""
    jid = job_id_argument(job_id)
    settings = load_settings(database_url, schema_name)
    record = run_ops(settings, lambda e: _client(e, settings).retry(jid))
    if as_json:
        echo_json(job_to_json(record))
    else:
        click.echo(f"job {jid}: pending again (attempts so far {record.attempt}, budget reset)")


@jobs.command("retry-where")
@filter_options
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@click.option("--batch-size", type=click.IntRange(min=1), default=1000, show_default=True)
@database_options
@json_option
def retry_where_cmd(
    yes: bool,
    batch_size: int,
    database_url: str | None,
    schema_name: str | None,
    as_json: bool,
    **options: Any,
) -> None:
    """Retry every failed, cancelled, crashed or abandoned job matching the filter."""
    result = _bulk(
        options,
        database_url,
        schema_name,
        yes,
        verb="retry",
        question="retry the finished-unsuccessfully ones among {total} matching job(s)?",
        label="retrying",
        act=lambda client, flt, on_batch: client.retry_where(
            flt, batch_size=batch_size, on_batch=on_batch
        ),
    )
    if as_json:
        echo_json(result.to_json())
        return
    by = ", ".join(f"{k} {v}" for k, v in sorted(result.by_status.items())) or "none"
    click.echo(f"retried: {result.retried} ({by})")
    if result.singleton_blocked:
        click.echo(f"left alone (singleton with an active job): {len(result.singleton_blocked)}")


@jobs.command("purge")
@click.option("--older-than", required=True, help="Finished longer ago than this (7d, 90m, 1h30m).")
@click.option(
    "--status",
    "statuses",
    multiple=True,
    type=click.Choice(TERMINAL_STATUSES),
    help="Only these terminal statuses (repeatable; default: all terminal ones).",
)
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@click.option("--batch-size", type=click.IntRange(min=1), default=1000, show_default=True)
@database_options
@json_option
def purge_cmd(
    older_than: str,
    statuses: tuple[str, ...],
    yes: bool,
    batch_size: int,
    database_url: str | None,
    schema_name: str | None,
    as_json: bool,
) -> None:
    """Delete finished jobs (and their attempts) older than --older-than, in batches."""
    age = parse_duration(older_than)
    chosen = statuses or TERMINAL_STATUSES
    settings = load_settings(database_url, schema_name)
    confirm(f"delete {'/'.join(chosen)} jobs finished more than {older_than} ago?", yes=yes)
    flt = JobFilter(status=list(chosen), finished_before=datetime.now(UTC) - age)
    with progress("purging", _matching(settings, flt, needed=False)) as on_batch:
        result = run_ops(
            settings,
            lambda e: _client(e, settings).purge(
                age, chosen, batch_size=batch_size, on_batch=on_batch
            ),
        )
    if as_json:
        echo_json(result.to_json())
    else:
        click.echo(f"deleted {result.deleted} job(s) in {result.batches} batch(es)")


@jobs.command("enqueue")
@click.argument("actor_name", metavar="ACTOR")
@click.option("--payload", default="{}", show_default=True, help="The payload, a JSON object.")
@click.option(
    "--actors",
    "target",
    default=None,
    metavar="MODULE[:ATTR]",
    help="Validate against these actors' payload models.",
)
@click.option("--queue", default=None, help="Override the actor's queue.")
@click.option("--delay", default=None, help="Run after this long (90s, 5m).")
@click.option("--tag", "tags", multiple=True, help="Tag (repeatable).")
@database_options
@json_option
def enqueue_cmd(
    actor_name: str,
    payload: str,
    target: str | None,
    queue: str | None,
    delay: str | None,
    tags: tuple[str, ...],
    database_url: str | None,
    schema_name: str | None,
    as_json: bool,
) -> None:
    """Enqueue one job of ACTOR with --payload.

    With --actors the payload is validated against ACTOR's payload model before
    anything is written; without it the actor is unknown here and the JSON object is
    stored as given.
    """
    try:
        body = json.loads(payload)
    except json.JSONDecodeError as exc:
        raise click.BadParameter(f"not JSON: {exc}", param_hint="--payload") from None
    if not isinstance(body, dict):
        raise click.BadParameter("the payload must be a JSON object", param_hint="--payload")
    wait = parse_duration(delay, param_hint="--delay") if delay is not None else None
    ref = _actor_ref(actor_name, target)
    try:
        ref.dump_payload(body)  # validated before anything is written
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--payload") from None
    settings = load_settings(database_url, schema_name)
    try:
        record = run_ops(settings, lambda e: _enqueue(e, settings, ref, body, queue, wait, tags))
    except (ValueError, TypeError) as exc:  # a bad --queue or --tag, checked by enqueue
        raise click.BadParameter(str(exc)) from None
    if as_json:
        echo_json(job_to_json(record))
    else:
        click.echo(f"enqueued {record.id} ({record.actor} on {record.queue}, {record.status})")


class AnyPayload(BaseModel):
    """The payload of an actor this process does not declare: any JSON object, as given."""

    model_config = ConfigDict(extra="allow")


async def _undeclared(payload: AnyPayload) -> None:
    """Stands for an actor the CLI was not shown (``--actors``); never run here."""


def _actor_ref(name: str, target: str | None) -> ActorRef[Any, Any]:
    """ACTOR from ``--actors`` (its payload model validates), else a stand-in that stores
    the JSON object as given."""
    try:
        validate_actor_name(name)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="ACTOR") from None
    if target is not None:
        for ref in declared_actors(target):
            if ref.name == name:
                return ref
        raise click.BadParameter(
            f"{target!r} declares no actor named {name!r}", param_hint="--actors"
        )
    existing = find_actor(name)
    if existing is not None:
        return existing
    return actor(name=name)(_undeclared)


async def _enqueue(
    engine: AsyncEngine,
    settings: TaskQSettings,
    ref: ActorRef[Any, Any],
    body: dict[str, Any],
    queue: str | None,
    delay: Any,
    tags: tuple[str, ...],
) -> JobRecord:
    client = _client(engine, settings)
    handle = await client.enqueue(ref, body, queue=queue, delay=delay, tags=list(tags) or None)
    record = handle.record
    if record is None:
        raise JobNotFoundError(handle.job_id)
    return record
