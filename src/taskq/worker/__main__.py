"""``python -m taskq.worker MODULE:ATTR [options]``: the same as ``taskq worker``.

It takes the same arguments and exits the same way (2 for a usage error, 1 when the
store is not ready or a provider is missing, else the worker's own exit code), without
the CLI package: the worker is usable where only its own layer is imported.
"""

from __future__ import annotations

import argparse
import sys

from taskq.exceptions import ConfigurationError, MissingProvider, SchemaNotReady
from taskq.worker.target import TargetError, load_target, worker_settings


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv``, load the actors and settings, run the worker; return the exit code."""
    parser = argparse.ArgumentParser(
        prog="python -m taskq.worker",
        description="Run a worker for the actors at TARGET (MODULE:ATTR: a dict or list of actors).",
    )
    parser.add_argument("target", metavar="TARGET")
    parser.add_argument(
        "--database-url", help="SQLAlchemy URL of the job store [env: TASKQ_DATABASE_URL]."
    )
    parser.add_argument(
        "--schema", dest="schema_name", help="Postgres schema [env: TASKQ_SCHEMA_NAME]."
    )
    parser.add_argument(
        "-q",
        "--queue",
        dest="queues",
        action="append",
        default=[],
        help="Queue to claim (repeatable) [env: TASKQ_QUEUES].",
    )
    parser.add_argument(
        "-c", "--concurrency", type=int, help="Jobs run at once [env: TASKQ_MAX_CONCURRENCY]."
    )
    args = parser.parse_args(argv)
    try:
        settings = worker_settings(
            database_url=args.database_url,
            schema_name=args.schema_name,
            queues=tuple(args.queues),
            concurrency=args.concurrency,
        )
    except ConfigurationError as exc:
        parser.error(str(exc))
    try:
        registry = load_target(args.target)
    except TargetError as exc:
        parser.error(f"TARGET: {exc}")
    from taskq.worker.run import worker_main

    try:
        return worker_main(settings=settings, actor_registry=registry)
    except (SchemaNotReady, MissingProvider) as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
