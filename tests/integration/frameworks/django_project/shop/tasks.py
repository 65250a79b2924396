"""Django Tasks run by taskq's backend."""

from __future__ import annotations

import django

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


if django.VERSION >= (6, 1):  # Django 6.1 passes @task's other options to the backend
    from taskq.ratelimit import TokenBucket

    LIMITED_API = TokenBucket("dj_task_api", capacity=5, refill_per_second=1, backend="postgres")

    @task(rate_limits=[LIMITED_API])
    def limited(n: int) -> int:
        return n * 10
