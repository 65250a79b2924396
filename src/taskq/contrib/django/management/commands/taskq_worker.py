"""``manage.py taskq_worker [MODULE:ATTR] [-q QUEUE ...] [-c N]``: a taskq worker in Django.

The worker runs with the project's taskq settings (:mod:`taskq.contrib.django.conf`:
``settings.TASKQ``/``TASKQ_*``, the database from ``DATABASES``). Its actors are
``MODULE:ATTR`` (a dict or list of actors) when given, else every actor defined in an
``actors`` module of an installed app (plus the Django Tasks runner when the
:class:`~taskq.contrib.django.tasks.TaskQBackend` is configured). Without ``-q`` it
claims the queues of those actors (and the Tasks backend's ``QUEUES``).
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils.module_loading import autodiscover_modules

from taskq.actor import registered_actors
from taskq.contrib.django.conf import taskq_settings
from taskq.settings import WorkerSettings


class Command(BaseCommand):
    """Run a taskq worker until SIGTERM/SIGINT."""

    help = "Run a taskq worker for this project's actors."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("target", nargs="?", help="MODULE:ATTR, a dict or list of actors")
        parser.add_argument("-q", "--queue", action="append", dest="queues", default=None)
        parser.add_argument("-c", "--concurrency", type=int, default=None)

    def handle(self, *args: Any, **options: Any) -> None:
        from taskq.contrib.django.tasks import configured_backends, runner_actor, task_actors
        from taskq.worker.run import worker_main

        actors: dict[str, Any]
        target = options.get("target")
        if target:
            module_name, _, attr = str(target).partition(":")
            try:
                found = getattr(importlib.import_module(module_name), attr)
            except (ImportError, AttributeError) as exc:
                raise CommandError(f"cannot load {target!r}: {exc}") from exc
            refs = list(found.values()) if isinstance(found, dict) else list(found)
            actors = {ref.name: ref for ref in refs}
        else:
            autodiscover_modules("actors")
            actors = dict(registered_actors())
        backends = configured_backends()
        extra_queues: set[str] = set()
        if backends:
            autodiscover_modules("tasks")  # each @task declaring taskq options makes its actor
            actors[runner_actor.name] = runner_actor
            for ref in task_actors():
                actors[ref.name] = ref
            for backend in backends:
                extra_queues |= set(backend.queues or ())
        settings = taskq_settings(WorkerSettings)
        assert isinstance(settings, WorkerSettings)
        update: dict[str, Any] = {}
        if options.get("queues"):
            update["queues"] = tuple(options["queues"])
        elif extra_queues and "queues" not in settings.model_fields_set:
            update["queues"] = tuple(sorted({ref.queue for ref in actors.values()} | extra_queues))
        if options.get("concurrency"):
            update["max_concurrency"] = options["concurrency"]
        if update:
            settings = WorkerSettings.load(**{**settings.model_dump(exclude_unset=True), **update})
        if not actors:
            raise CommandError("no actors: give MODULE:ATTR or define actors in an app's actors.py")
        sys.exit(worker_main(settings=settings, actor_registry=actors))
