"""``taskq quickstart``: see taskq work end to end on the embedded engine in a few seconds.

Migrates the database (``./taskq.db`` unless ``--database-url`` says otherwise), enqueues
the demo workload of :mod:`taskq.examples.quickstart`, drains it with a worker running in
this process behind a live progress bar, and prints what the store recorded: jobs
succeeded and failed, attempts retried and snoozed, time taken and jobs per second.
``--json`` prints the same figures as one JSON object instead (for scripts and CI).

``TASKQ_DATABASE_URL`` is deliberately not read: the demo writes only where it is told
to, never into a store that happens to be configured in the environment.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    from taskq.examples.quickstart import Progress, Summary

# The demo's actors are imported only when the command runs, so that other subcommands
# (``taskq worker`` in particular) never register them.
DEFAULT_DATABASE_URL = "sqlite+aiosqlite:///./taskq.db"

__all__ = ["format_summary", "quickstart"]


def format_summary(summary: Summary) -> str:
    """The summary table printed at the end of a run."""
    rows = [
        ("succeeded", str(summary.succeeded), str(summary.succeeded)),
        ("failed", str(summary.failed), str(summary.failed)),
        ("retried", "-", str(summary.retried)),
        ("snoozed", "-", str(summary.snoozed)),
    ]
    if summary.cancelled:
        rows.append(("cancelled", str(summary.cancelled), str(summary.cancelled)))
    rows.append(("total", str(summary.jobs), str(summary.attempts)))
    parked = f"  parked by the rate limit: {summary.rate_limited} (a denial is not an attempt)"
    lines = [f"  {'outcome':<10} {'jobs':>5}  attempts"]
    lines += [f"  {name:<10} {jobs:>5}  {attempts}" for name, jobs, attempts in rows]
    lines += [
        parked,
        "",
        f"  time taken  {summary.seconds:.2f} s",
        f"  throughput  {summary.jobs_per_second:.1f} jobs/s",
        f"  database    {summary.database_url}",
    ]
    return "\n".join(lines)


class _Bar:
    """Feeds :class:`Progress` snapshots into a Click progress bar (on stderr)."""

    def __init__(self, bar: Any) -> None:
        self._bar = bar
        self._shown = 0
        self.status = ""

    def __call__(self, progress: Progress) -> None:
        report = (
            f" | reports {progress.report_percent:.0f}%"
            if progress.report_percent is not None
            else ""
        )
        self.status = (
            f"running {progress.running:>2} | retried {progress.retried:>2}"
            f" | snoozed {progress.snoozed:>2}{report}"
        )
        self._bar.update(progress.finished - self._shown, self.status)
        self._shown = progress.finished


@click.command("quickstart")
@click.option(
    "--database-url",
    default=DEFAULT_DATABASE_URL,
    show_default=True,
    help="Where to run the demo (TASKQ_DATABASE_URL is not read).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the summary as one JSON object.")
def quickstart(database_url: str, as_json: bool) -> None:
    """Run a small demo workload through a worker in this process and summarise it."""
    from taskq.examples.quickstart import WorkerStopped, run

    if not as_json:
        click.echo(f"taskq quickstart: migrating and enqueueing on {database_url}")
    try:
        summary = asyncio.run(run(database_url)) if as_json else _run_with_bar(database_url)
    except WorkerStopped as exc:
        click.echo(f"interrupted: {exc}", err=True)
        sys.exit(130)
    except KeyboardInterrupt:  # Ctrl-C before the worker (and its signal handlers) started
        click.echo("interrupted", err=True)
        sys.exit(130)
    except TimeoutError as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        click.echo(json.dumps(summary.as_dict()))
        return
    click.echo("")
    click.echo(format_summary(summary))
    click.echo("")
    click.echo("Next: Getting started (docs/getting-started.md) builds a first app and runs its")
    click.echo("worker as its own process (taskq worker MODULE:ATTR); Storage engines")
    click.echo("(docs/engines.md) says when to move from this SQLite file to PostgreSQL.")


class _Lines:
    """The live display when stderr is not a terminal (CI logs): a status line per second."""

    def __init__(self) -> None:
        self._last = 0.0

    def __call__(self, progress: Progress) -> None:
        now = time.monotonic()
        done = progress.finished >= progress.total
        if not done and now - self._last < 1.0:
            return
        self._last = now
        click.echo(
            f"draining: {progress.finished}/{progress.total} finished | running "
            f"{progress.running} | retried {progress.retried} | snoozed {progress.snoozed}",
            err=True,
        )


def _run_with_bar(database_url: str) -> Summary:
    from taskq.examples.quickstart import run, workload

    if not sys.stderr.isatty():
        return asyncio.run(run(database_url, on_progress=_Lines()))
    with click.progressbar(
        length=len(workload()),
        label="draining",
        show_pos=True,
        item_show_func=lambda status: status,
        file=sys.stderr,
    ) as bar:
        sink = _Bar(bar)
        return asyncio.run(run(database_url, on_progress=sink))
