"""``taskq cron``: list, inspect, create and operate periodic-job schedules.

Over :mod:`taskq.cron.ops` (the same operations as ``tq.schedules``)::

    taskq cron list
    taskq cron get nightly-report --history 5
    taskq cron disable nightly-report
    taskq cron enable nightly-report
    taskq cron run-now nightly-report --actors myapp.jobs
    taskq cron create cleanup --actor cleanup --every 10m --actors myapp.jobs
    taskq cron delete cleanup

Every command takes ``--json``. ``create`` and ``run-now`` validate the payload against
the actor, so the module declaring it must be importable (``--actors MODULE``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any, TypeVar
from zoneinfo import ZoneInfo

import click
from sqlalchemy.ext.asyncio import AsyncEngine

from taskq.cli.actor_config import declared_actors, format_table
from taskq.cli.options import database_options, echo_json, json_option, load_settings, run_db
from taskq.cron import ops
from taskq.cron.records import ScheduleRecord, ScheduleRun
from taskq.cron.schedule import MISSED_POLICIES, Schedule, parse_every, validate_schedule_id
from taskq.exceptions import (
    MaxPendingExceededError,
    PayloadValidationError,
    ScheduleExistsError,
    ScheduleNotFoundError,
    SingletonCollisionError,
)
from taskq.settings import TaskQSettings

__all__ = ["cron", "format_schedule"]

T = TypeVar("T")
_FAILURE = "cannot read or write schedules on"


def _when(value: datetime | None, empty: str = "-") -> str:
    return value.isoformat() if value is not None else empty


def _local(record: ScheduleRecord) -> str:
    """`` (the same on the schedule's wall clock)`` for a cron schedule outside UTC."""
    if record.next_run_at is None or record.timezone == "UTC" or record.every is not None:
        return ""
    try:
        local = record.next_run_at.astimezone(ZoneInfo(record.timezone))
    except (ValueError, KeyError):
        return ""
    return f" ({local.strftime('%Y-%m-%d %H:%M:%S %Z')}, {record.timezone})"


def format_schedule(record: ScheduleRecord, runs: Sequence[ScheduleRun] = ()) -> str:
    """A schedule as ``field: value`` lines, then its recent runs."""
    outcome = record.last_outcome or "-"
    if record.last_error:
        outcome += f" ({record.last_error})"
    lines = [
        ("schedule", record.id),
        ("actor", record.actor),
        ("when", record.cron_expression),
        ("timezone", record.timezone),
        ("enabled", "yes" if record.enabled else "no"),
        ("next_run", _when(record.next_run_at, "none") + _local(record)),
        ("last_run", _when(record.last_run_at, "never")),
        ("last_tick", _when(record.last_tick_at)),
        ("last_outcome", outcome),
        ("last_job", f"{record.last_job_id} ({record.last_job_status or 'gone'})"
         if record.last_job_id else "-"),
        ("enqueued", str(record.enqueued_count)),
        ("refused", str(record.refused_count)),
        ("missed", f"{record.missed} (max_catchup {record.max_catchup})"),
        ("jitter", f"{record.jitter_s:g}s" if record.jitter_s else "none"),
        ("queue", record.queue or "(the actor's)"),
        ("priority", "(the actor's)" if record.priority is None else str(record.priority)),
        ("tags", ", ".join(record.tags) or "none"),
        ("identity_key", record.identity_key or "none"),
        ("payload", json.dumps(record.payload, sort_keys=True)),
        ("origin", record.origin),
    ]  # fmt: skip
    text = "\n".join(f"{name + ':':<14}{value}" for name, value in lines)
    if runs:
        header = ("JOB", "STATUS", "TICK", "CREATED")
        cells = [
            (str(r.job_id), r.status, _when(r.tick, "run-now"), r.created_at.isoformat())
            for r in runs
        ]
        text += "\n\nrecent runs:\n" + format_table(header, cells)
    return text


def _id(value: str) -> str:
    try:
        return validate_schedule_id(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="SCHEDULE") from None


def _run(settings: TaskQSettings, action: Callable[[AsyncEngine], Any]) -> Any:
    try:
        return run_db(settings, action, failure=_FAILURE)
    except ScheduleNotFoundError as exc:
        raise click.ClickException(f"unknown schedule {exc.schedule_id!r}") from None


@click.group("cron")
def cron() -> None:
    """List, inspect, create and operate periodic-job schedules (cron_schedules)."""


@cron.command("list")
@click.option("--actor", default=None, help="Only this actor's schedules.")
@click.option("--enabled/--disabled", "enabled", default=None, help="Only enabled/disabled ones.")
@database_options
@json_option
def list_cmd(
    actor: str | None,
    enabled: bool | None,
    database_url: str | None,
    schema_name: str | None,
    as_json: bool,
) -> None:
    """List schedules with their next run, last run and last outcome."""
    settings = load_settings(database_url, schema_name)
    rows: list[ScheduleRecord] = _run(
        settings, lambda e: ops.list_schedules(e, actor=actor, enabled=enabled)
    )
    if as_json:
        echo_json([r.as_json() for r in rows])
        return
    if not rows:
        click.echo("no schedules")
        return
    header = ("SCHEDULE", "ACTOR", "WHEN", "TZ", "ENABLED", "NEXT_RUN", "LAST_RUN", "LAST_OUTCOME")
    cells = [
        (
            r.id,
            r.actor,
            r.cron_expression,
            r.timezone,
            "yes" if r.enabled else "no",
            _when(r.next_run_at),
            _when(r.last_run_at, "never"),
            r.last_outcome or "-",
        )
        for r in rows
    ]
    click.echo(format_table(header, cells))


@cron.command("get")
@click.argument("schedule")
@click.option("--history", "history", type=click.IntRange(min=0), default=10, show_default=True,
              help="How many recent runs to show.")  # fmt: skip
@database_options
@json_option
def get_cmd(
    schedule: str, history: int, database_url: str | None, schema_name: str | None, as_json: bool
) -> None:
    """Show one schedule and its recent runs (exit 1 when there is none)."""
    sid = _id(schedule)
    settings = load_settings(database_url, schema_name)

    async def go(engine: AsyncEngine) -> tuple[ScheduleRecord, list[ScheduleRun]]:
        record = await ops.get_schedule(engine, sid)
        runs = await ops.schedule_history(engine, sid, limit=history) if history else []
        return record, runs

    record, runs = _run(settings, go)
    if as_json:
        echo_json(record.as_json() | {"runs": [r.as_json() for r in runs]})
    else:
        click.echo(format_schedule(record, runs))


def _switch(name: str, verb: str, op: Callable[[AsyncEngine, str], Any]) -> click.Command:
    @click.argument("schedule")
    @database_options
    @json_option
    def command(
        schedule: str, database_url: str | None, schema_name: str | None, as_json: bool
    ) -> None:
        sid = _id(schedule)
        settings = load_settings(database_url, schema_name)
        record: ScheduleRecord = _run(settings, lambda e: op(e, sid))
        if as_json:
            echo_json(record.as_json())
            return
        if name == "delete":
            click.echo(f"deleted schedule {sid!r} (its jobs stay)")
            if record.origin == "code":
                click.echo(
                    "it is declared in code: the next worker start re-creates it "
                    "(disable it instead to keep it off)"
                )
            return
        if record.enabled:
            click.echo(f"schedule {sid!r} enabled; next run {_when(record.next_run_at, 'none')}")
        else:
            click.echo(f"schedule {sid!r} disabled")

    command.__doc__ = verb
    return click.command(name)(command)


cron.add_command(
    _switch(
        "enable",
        "Enable SCHEDULE from its next tick on (missed ticks are not caught up).",
        ops.enable_schedule,
    )
)
cron.add_command(
    _switch(
        "disable",
        "Disable SCHEDULE: no tick is enqueued until it is enabled.",
        ops.disable_schedule,
    )
)
cron.add_command(_switch("delete", "Delete SCHEDULE (its jobs stay).", ops.delete_schedule))


def _import_actors(target: str | None) -> None:
    if target is not None:
        declared_actors(target)


@cron.command("run-now")
@click.argument("schedule")
@click.option("--actors", "actors_target", default=None, metavar="MODULE[:ATTR]",
              help="Import the module that declares the schedule's actor.")  # fmt: skip
@database_options
@json_option
def run_now_cmd(
    schedule: str,
    actors_target: str | None,
    database_url: str | None,
    schema_name: str | None,
    as_json: bool,
) -> None:
    """Enqueue one job from SCHEDULE now, outside its timetable."""
    sid = _id(schedule)
    _import_actors(actors_target)
    settings = load_settings(database_url, schema_name)
    try:
        handle = _run(settings, lambda e: ops.run_schedule_now(e, sid, settings))
    except LookupError as exc:
        raise click.ClickException(str(exc).strip("'\"")) from None
    except (MaxPendingExceededError, SingletonCollisionError, PayloadValidationError) as exc:
        raise click.ClickException(f"the enqueue was refused: {exc}") from None
    if as_json:
        echo_json({"schedule": sid, "job_id": str(handle.job_id)})
    else:
        click.echo(f"enqueued job {handle.job_id} from schedule {sid!r}")


def _duration(value: str | None, param: str) -> timedelta | None:
    if value is None:
        return None
    try:
        return parse_every(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint=param) from None


@cron.command("create")
@click.argument("schedule")
@click.option("--actor", "actor_name", required=True, help="The actor each tick enqueues.")
@click.option(
    "--cron", "cron_expr", default=None, help="Cron expression (5 fields, or 6 with seconds first)."
)
@click.option("--every", default=None, help="Plain interval instead: 90s, 5m, 1h30m, 2d.")
@click.option(
    "--tz", default="UTC", show_default=True, help="IANA time zone of the cron expression."
)
@click.option("--payload", default="{}", show_default=True, help="The payload, a JSON object.")
@click.option("--queue", default=None, help="Queue (default: the actor's).")
@click.option("--priority", type=int, default=None, help="Priority (default: the actor's).")
@click.option("--tag", "tags", multiple=True, help="Tag every job (repeatable).")
@click.option("--identity-key", default=None, help="identity_key of every job.")
@click.option("--jitter", default=None, help="Delay each job by up to this much (e.g. 30s).")
@click.option(
    "--missed",
    type=click.Choice(MISSED_POLICIES),
    default="latest",
    show_default=True,
    help="What to do with ticks missed while no worker ran the schedule.",
)
@click.option(
    "--max-catchup",
    type=click.IntRange(min=1),
    default=10,
    show_default=True,
    help="With --missed all: at most this many missed ticks run.",
)
@click.option("--disabled", is_flag=True, help="Create it disabled.")
@click.option("--replace", is_flag=True, help="Overwrite an existing schedule of that id.")
@click.option(
    "--actors",
    "actors_target",
    default=None,
    metavar="MODULE[:ATTR]",
    help="Import the module that declares the actor.",
)
@database_options
@json_option
def create_cmd(
    schedule: str,
    actor_name: str,
    cron_expr: str | None,
    every: str | None,
    tz: str,
    payload: str,
    queue: str | None,
    priority: int | None,
    tags: tuple[str, ...],
    identity_key: str | None,
    jitter: str | None,
    missed: str,
    max_catchup: int,
    disabled: bool,
    replace: bool,
    actors_target: str | None,
    database_url: str | None,
    schema_name: str | None,
    as_json: bool,
) -> None:
    """Create SCHEDULE for an actor (validated against the actor: see --actors)."""  # fmt: skip
    sid = _id(schedule)
    if (cron_expr is None) == (every is None):
        raise click.UsageError("give exactly one of --cron and --every")
    try:
        body = json.loads(payload)
    except json.JSONDecodeError as exc:
        raise click.BadParameter(f"not JSON: {exc}", param_hint="--payload") from None
    if not isinstance(body, dict):
        raise click.BadParameter("must be a JSON object", param_hint="--payload")
    try:
        value = Schedule(
            cron=cron_expr,
            every=_duration(every, "--every"),
            payload=body,
            tz=tz,
            id=sid,
            jitter=_duration(jitter, "--jitter"),
            missed=missed,  # type: ignore[arg-type]  # a click.Choice of MISSED_POLICIES
            max_catchup=max_catchup,
            queue=queue,
            priority=priority,
            tags=tags,
            identity_key=identity_key,
            enabled=not disabled,
        )
    except (TypeError, ValueError) as exc:
        raise click.UsageError(str(exc)) from None
    _import_actors(actors_target)
    settings = load_settings(database_url, schema_name)
    try:
        record = _run(
            settings, lambda e: ops.create_schedule(e, actor_name, value, replace=replace)
        )
    except ScheduleExistsError as exc:
        raise click.ClickException(f"{exc} (pass --replace to overwrite it)") from None
    except LookupError as exc:
        raise click.ClickException(str(exc).strip("'\"")) from None
    except (TypeError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        echo_json(record.as_json())
    else:
        click.echo(f"created schedule {sid!r}; next run {_when(record.next_run_at, 'none')}")
