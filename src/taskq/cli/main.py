"""The ``taskq`` command group and the options every subcommand shares."""

from __future__ import annotations

import logging

import click
import structlog

from taskq import __version__
from taskq.cli.actor_config import actor_config
from taskq.cli.cron import cron
from taskq.cli.jobs import jobs
from taskq.cli.migrate import migrate
from taskq.cli.queues import queues
from taskq.cli.quickstart import quickstart
from taskq.cli.ratelimit import ratelimit
from taskq.cli.ui import ui
from taskq.cli.worker import worker
from taskq.cli.workers import workers


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="taskq")
@click.option("-v", "--verbose", help="Log at INFO (DEBUG with -vv).", count=True)
def main(verbose: int) -> None:
    """taskq: a Postgres-backed job queue with first-class rate limiting."""
    level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    ctx = click.get_current_context()
    if ctx.invoked_subcommand == "worker":
        # A worker logs as TASKQ_LOG_LEVEL / TASKQ_LOG_FORMAT say (INFO, JSON lines when
        # stderr is not a terminal: docs/workers.md), set up by the worker itself; -v and
        # -vv only raise its level.
        ctx.obj = {"log_level": None if verbose == 0 else logging.getLevelName(level)}
        return
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    # The library's structlog events go through the same logging (stderr, this level), so
    # they never mix into a command's output (--json documents above all).
    if not structlog.is_configured():
        structlog.configure(
            processors=[structlog.processors.KeyValueRenderer(key_order=["event"])],
            logger_factory=structlog.stdlib.LoggerFactory(),
            wrapper_class=structlog.make_filtering_bound_logger(level),
            cache_logger_on_first_use=False,
        )


main.add_command(migrate)
main.add_command(worker)
main.add_command(quickstart)
main.add_command(actor_config)
main.add_command(queues)
main.add_command(cron)
main.add_command(jobs)
main.add_command(workers)
main.add_command(ratelimit)
main.add_command(ui)
