"""Django Tasks run by taskq's backend."""

from __future__ import annotations

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
