"""The demo's worker process: ``taskq worker examples.fleet_demo.actors:registry`` with
its log lines rendered as JSON (one object per line on stdout) so ``run_demo`` can read
them. Settings come from ``TASKQ_*`` as for any worker.
"""

from __future__ import annotations

import logging
import sys

import structlog

from examples.fleet_demo.actors import registry
from taskq.settings import WorkerSettings
from taskq.worker.run import worker_main


def main() -> int:
    settings = WorkerSettings.load()
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.JSONRenderer(default=str),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.getLevelName(settings.log_level)
        ),
        logger_factory=structlog.PrintLoggerFactory(sys.stdout),
    )
    return worker_main(settings=settings, actor_registry=registry)


if __name__ == "__main__":
    sys.exit(main())
