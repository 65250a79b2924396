"""Django Tasks run by taskq's backend."""

from __future__ import annotations

import os
from datetime import timedelta

from taskq.ratelimit import TokenBucket

try:
    from django.tasks import task
except ImportError:
    from django_tasks import task


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
