"""Django Tasks run by taskq's backend."""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

from taskq.ratelimit import TokenBucket

try:
    from django.tasks import task
    from django.tasks.signals import task_enqueued, task_finished, task_started
except ImportError:
    from django_tasks import task
    from django_tasks.signals import task_enqueued, task_finished, task_started


def _record(name: str) -> Any:
    """A receiver appending ``name id status pid`` to ``$DJ_SIGNALS_FILE`` (if set)."""

    def receiver(sender: Any, task_result: Any, **_: Any) -> None:
        path = os.environ.get("DJ_SIGNALS_FILE")
        if path:
            with open(path, "a") as out:
                out.write(f"{name} {task_result.id} {task_result.status} {os.getpid()}\n")

    return receiver


# Connected in the test process and in the worker (taskq_worker imports this module).
_RECEIVERS = {name: _record(name) for name in ("enqueued", "started", "finished")}
task_enqueued.connect(_RECEIVERS["enqueued"])
task_started.connect(_RECEIVERS["started"])
task_finished.connect(_RECEIVERS["finished"])


@task()
def add(a: int, b: int) -> int:
    return a + b


@task()
def boom() -> None:
    raise ValueError("boom from a task")


# taskq's own options on @task: Django 6.1 and the django-tasks backport (>= 0.11) pass the
# options they do not know to the backend's task class.
LIMITED_API = TokenBucket("dj_task_api", capacity=5, refill_per_second=1, backend="postgres")


@task(rate_limits=[LIMITED_API], queue_name="limited", priority=20)
def limited(n: int) -> int:
    return n * 10


# On Redis (a refund of what the dispatcher prepaid and did not use is exact there), named
# per run: its state outlives the test database.
THROTTLED_API = TokenBucket(
    f"dj_task_throttled_{os.environ.get('DJ_UNIQUE', 'x')}", capacity=2, refill_per_second=0.0001
)


@task(rate_limits=[THROTTLED_API])
def throttled(n: int) -> int:
    return n


@task(unique_for=timedelta(minutes=5))
def refresh_feed(feed: str, full: bool = False) -> str:
    return feed


@task(unique_for=timedelta(minutes=5), unique_key=lambda user_id, reason="": f"user:{user_id}")
def notify(user_id: int, reason: str = "") -> int:
    return user_id


def undecorated(n: int) -> int:
    """Decorated by a test (a ``unique_key`` without ``unique_for`` is refused)."""
    return n
