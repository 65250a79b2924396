"""``taskq workers list``: the fleet as its ``workers`` rows and the jobs table see it."""

from __future__ import annotations

import click

from taskq.cli.ops_support import run_ops, table
from taskq.cli.options import database_options, echo_json, json_option, load_settings
from taskq.ops.workers import WorkersClient

__all__ = ["workers"]


@click.group("workers")
def workers() -> None:
    """Inspect the worker fleet."""


@workers.command("list")
@click.option("--all", "include_stopped", is_flag=True, help="Include stopped workers.")
@database_options
@json_option
def list_cmd(
    include_stopped: bool, database_url: str | None, schema_name: str | None, as_json: bool
) -> None:
    """List workers: id, host, pid, status (running, stopping, isolated, stopped), last
    heartbeat, running jobs, and the leader leases each holds."""
    settings = load_settings(database_url, schema_name)
    rows = run_ops(settings, lambda e: WorkersClient(e).list(include_stopped=include_stopped))
    if as_json:
        echo_json([w.to_json() for w in rows])
        return
    if not rows:
        click.echo(
            "no workers" + ("" if include_stopped else " running (--all shows stopped ones)")
        )
        return
    header = ("ID", "HOST", "PID", "STATUS", "STARTED", "HEARTBEAT", "RUNNING", "LEADER", "QUEUES")
    cells = [
        (
            str(w.id),
            w.hostname,
            str(w.pid),
            w.status,
            w.started_at.strftime("%Y-%m-%d %H:%M:%S"),
            f"{w.heartbeat_age_s:.0f}s ago",
            f"{w.running_jobs}/{w.concurrency}",
            ",".join(w.leader_of) or "-",
            ",".join(w.queues),
        )
        for w in rows
    ]
    click.echo(table(header, cells))
