"""taskq in Django: add ``"taskq.contrib.django"`` to ``INSTALLED_APPS``.

* ``manage.py migrate`` creates taskq's tables (and the test database gets them);
* :func:`enqueue` runs on Django's connection, inside ``transaction.atomic()``;
  :func:`enqueue_on_commit` enqueues after the commit instead (a queue in another DB);
* ``manage.py taskq_worker`` runs a worker with the project's settings;
* :class:`TaskQBackend` is a Django Tasks backend
  (``TASKS = {"default": {"BACKEND": "taskq.contrib.django.TaskQBackend"}}``);
* :func:`too_many_requests` turns a rate-limit denial into a 429 with ``Retry-After``;
* :mod:`taskq.contrib.django.testing` has the test helpers.

Settings: ``settings.TASKQ`` (a dict) or ``TASKQ_*`` settings, the database from
``DATABASES`` (see :mod:`taskq.contrib.django.conf`).
"""

from __future__ import annotations

from typing import Any

from taskq.contrib.django.client import (
    close_taskq,
    enqueue,
    enqueue_many,
    enqueue_on_commit,
    get_taskq,
)
from taskq.contrib.django.responses import acquire_rate_limit, too_many_requests

__all__ = [
    "TaskQBackend",
    "acquire_rate_limit",
    "close_taskq",
    "enqueue",
    "enqueue_many",
    "enqueue_on_commit",
    "get_taskq",
    "too_many_requests",
]


def __getattr__(name: str) -> Any:
    # The Tasks backend imports django.tasks (or the backport) only when asked for.
    if name == "TaskQBackend":
        from taskq.contrib.django.tasks import TaskQBackend

        return TaskQBackend
    raise AttributeError(name)
