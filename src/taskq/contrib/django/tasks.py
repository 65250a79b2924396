"""A Django Tasks backend on taskq: ``TASKS = {"default": {"BACKEND":
"taskq.contrib.django.TaskQBackend"}}``.

Django's ``django.tasks`` (Django 6, Python >= 3.12) and the ``django-tasks`` backport
(Django 5.2, Python 3.11) share one API; this backend works with whichever is installed.

A task's call is one taskq job of the runner actor :data:`runner_actor` (``"django.task"``):
the payload names the task (its module path) and carries the JSON arguments. The job is
enqueued on Django's connection (:func:`taskq.contrib.django.enqueue`), so
``task.enqueue()`` inside ``transaction.atomic()`` is part of the transaction. Mapped:

* ``queue_name`` -> the job's queue (``QUEUES`` in the backend's settings limits them, and
  is what ``manage.py taskq_worker`` claims besides its actors' queues);
* ``priority`` (-100..100, higher first) -> the job's priority (taskq claims higher first);
* ``run_after`` -> ``scheduled_at``;
* statuses: pending/scheduled -> ``READY``, running -> ``RUNNING``, succeeded ->
  ``SUCCESSFUL``, anything else terminal -> ``FAILED``;
* the return value is stored as the job's result; a failure keeps the exception's class
  path and traceback (``TaskResult.errors``);
* ``task_enqueued`` is sent where the task is enqueued, ``task_started`` and
  ``task_finished`` in the worker that runs it.

taskq's own options go on ``@task(...)`` itself: Django 6.1 and the backport (from
``django-tasks`` 0.11) pass the options they do not know to the backend's task class
(:class:`TaskQTask`). ``rate_limits``, ``reservations``, ``max_pending``,
``max_concurrent``, ``start_to_close``, ``unique_for`` and ``unique_states`` mean what
they mean on ``@actor``; a task declaring any of them runs as its own actor.
``unique_for``'s identity is the call's arguments (or ``unique_key(*args, **kwargs)``):
a second enqueue of the same call inside the window returns the first job's result.

A Django task runs once (no retries: Django Tasks has no retry semantics of its own).
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import importlib.util
import json
import traceback
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

from django.utils.module_loading import import_string
from pydantic import BaseModel

from taskq import actor
from taskq.context import JobContext
from taskq.records import JobRecord
from taskq.retry import RetryPolicy


def _tasks_package() -> str:
    """``django.tasks`` (Django >= 6.0), else the ``django_tasks`` backport (Django 5.2)."""
    try:
        found = importlib.util.find_spec("django.tasks")
    except ImportError:  # pragma: no cover - no django at all
        found = None
    return "django.tasks" if found is not None else "django_tasks"


_PKG = _tasks_package()
_base: Any = importlib.import_module(f"{_PKG}.base")
_signals: Any = importlib.import_module(f"{_PKG}.signals")
_exceptions: Any = importlib.import_module(f"{_PKG}.exceptions")
BaseTaskBackend: Any = importlib.import_module(f"{_PKG}.backends.base").BaseTaskBackend
task_backends: Any = importlib.import_module(_PKG).task_backends
Task: Any = _base.Task
TaskContext: Any = _base.TaskContext
TaskError: Any = _base.TaskError
TaskResult: Any = _base.TaskResult
TaskResultStatus: Any = _base.TaskResultStatus
TaskResultDoesNotExist: Any = _exceptions.TaskResultDoesNotExist
# InvalidTask on Django 6, InvalidTaskError in the backport.
InvalidTaskError: Any = getattr(_exceptions, "InvalidTask", None) or _exceptions.InvalidTaskError
task_enqueued: Any = _signals.task_enqueued
task_started: Any = _signals.task_started
task_finished: Any = _signals.task_finished

__all__ = [
    "RUNNER_ACTOR",
    "TaskQBackend",
    "TaskQTask",
    "call_identity",
    "configured_backends",
    "runner_actor",
    "task_actor",
    "task_actors",
]

RUNNER_ACTOR = "django.task"


class TaskCall(BaseModel):
    """The payload of a Django task's job: which task, with what arguments."""

    task: str
    positional: list[Any]
    keywords: dict[str, Any]
    backend: str


class TaskReturn(BaseModel):
    """A Django task's return value, as the job's result."""

    value: Any = None


class TaskFailed(Exception):
    """A Django task raised: the message keeps its class path and traceback, for
    ``TaskResult.errors``."""


def _run(payload: TaskCall, ctx: JobContext[TaskCall]) -> TaskReturn:
    """Run the Django task the payload names, sending ``task_started``/``task_finished``."""
    from django.db import close_old_connections

    close_old_connections()
    backend = task_backends[payload.backend]
    task = _task(payload.task, backend.alias)
    result = _result(task, str(ctx.job_id), payload, TaskResultStatus.RUNNING, backend.alias)
    object.__setattr__(result, "started_at", datetime.now(UTC))
    object.__setattr__(result, "last_attempted_at", result.started_at)
    result.worker_ids.append(str(ctx.worker_id))
    task_started.send(sender=type(backend), task_result=result)
    try:
        if task.takes_context:
            value = task.call(
                TaskContext(task_result=result), *payload.positional, **payload.keywords
            )
        else:
            value = task.call(*payload.positional, **payload.keywords)
    except Exception as exc:
        object.__setattr__(result, "status", TaskResultStatus.FAILED)
        object.__setattr__(result, "finished_at", datetime.now(UTC))
        path = f"{type(exc).__module__}.{type(exc).__qualname__}"
        text = "".join(traceback.format_exception(exc))
        result.errors.append(TaskError(exception_class_path=path, traceback=text))
        task_finished.send(sender=type(backend), task_result=result)
        raise TaskFailed(f"{path}\n{text}") from exc
    finally:
        close_old_connections()
    object.__setattr__(result, "status", TaskResultStatus.SUCCESSFUL)
    object.__setattr__(result, "finished_at", datetime.now(UTC))
    object.__setattr__(result, "_return_value", value)
    task_finished.send(sender=type(backend), task_result=result)
    return TaskReturn(value=value)


runner_actor = actor(name=RUNNER_ACTOR, retry=RetryPolicy(max_attempts=1))(_run)
"""The actor that runs every Django task declared without taskq options."""

TASKQ_OPTIONS = (
    "rate_limits",
    "reservations",
    "max_pending",
    "max_concurrent",
    "start_to_close",
    "unique_for",
    "unique_states",
)
"""The ``@task(...)`` options (Django 6.1 and ``django-tasks`` >= 0.11 pass them to the
backend's task class) that are taskq's own ``@actor`` options: a task declaring any of
them runs as its own actor, with them."""

_TASK_ACTORS: dict[str, Any] = {}


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class TaskQTask(Task):
    """A Django task with taskq's options: ``@task(rate_limits=[API])``,
    ``@task(unique_for=timedelta(minutes=5))`` (Django 6.1, or the ``django-tasks``
    backport from 0.11 on Django 5.2).

    ``unique_key(*args, **kwargs) -> str`` names a call's identity for ``unique_for``
    (default: a digest of the call's JSON arguments, so the same call is one job per
    window).
    """

    rate_limits: tuple[Any, ...] = ()
    reservations: tuple[Any, ...] = ()
    max_pending: int | None = None
    max_concurrent: int | None = None
    start_to_close: timedelta | None = None
    unique_for: timedelta | None = None
    unique_states: tuple[str, ...] | None = None
    unique_key: Callable[..., str] | None = None


def call_identity(task: Any, args: Any, kwargs: Any) -> str | None:
    """The ``identity_key`` of a call of ``task`` (``None`` unless it has ``unique_for``):
    ``task.unique_key(*args, **kwargs)``, or a SHA-256 of the call's JSON arguments."""
    if getattr(task, "unique_for", None) is None:
        return None
    unique_key = getattr(task, "unique_key", None)
    if unique_key is not None:
        key = unique_key(*args, **kwargs)
        if not isinstance(key, str):
            raise TypeError(
                f"unique_key of task {task.module_path!r} must return a str, "
                f"got {type(key).__name__}"
            )
        return key
    canonical = json.dumps([list(args), dict(kwargs)], sort_keys=True, separators=(",", ":"))
    return "args:" + hashlib.sha256(canonical.encode()).hexdigest()


def task_actor(task: Any) -> Any:
    """The taskq actor that runs ``task``: its own (``django.task.<module path>``, with the
    task's taskq options) when it declares any, else :data:`runner_actor`."""
    options = {
        name: getattr(task, name)
        for name in TASKQ_OPTIONS
        if getattr(task, name, None) not in (None, ())
    }
    if not options:
        return runner_actor
    name = f"{RUNNER_ACTOR}.{task.module_path}"
    found = _TASK_ACTORS.get(name)
    if found is None:
        for key in ("rate_limits", "reservations"):
            if key in options:
                options[key] = list(options[key])
        found = _TASK_ACTORS[name] = actor(
            name=name, queue=task.queue_name, retry=RetryPolicy(max_attempts=1), **options
        )(_run)
    return found


def task_actors() -> list[Any]:
    """Every per-task actor made so far (the worker runs them with the runner)."""
    return list(_TASK_ACTORS.values())


def _task(path: str, alias: str) -> Any:
    found = import_string(path)
    if not isinstance(found, Task):
        raise TypeError(f"{path!r} is not a Django task")
    return found.using(backend=alias) if found.backend != alias else found


def _result(task: Any, result_id: str, call: TaskCall, status: Any, alias: str) -> Any:
    return TaskResult(
        task=task,
        id=result_id,
        status=status,
        enqueued_at=None,
        started_at=None,
        last_attempted_at=None,
        finished_at=None,
        args=list(call.positional),
        kwargs=dict(call.keywords),
        backend=alias,
        errors=[],
        worker_ids=[],
    )


_STATUSES = {
    "pending": "READY",
    "scheduled": "READY",
    "running": "RUNNING",
    "succeeded": "SUCCESSFUL",
}


class TaskQBackend(BaseTaskBackend):
    """Django Tasks on taskq (see the module): deferred, async, prioritised, with results."""

    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True
    task_class = TaskQTask

    def validate_task(self, task: Any) -> None:
        """Django's checks, then the task's taskq actor is made (at ``@task`` time, so a
        worker that imported the task module knows it)."""
        super().validate_task(task)
        unique_key = getattr(task, "unique_key", None)
        if unique_key is not None and not callable(unique_key):
            raise InvalidTaskError("unique_key must be a callable returning the call's identity")
        if unique_key is not None and getattr(task, "unique_for", None) is None:
            raise InvalidTaskError("unique_key has no effect without unique_for")
        task_actor(task)

    def enqueue(self, task: Any, args: Any, kwargs: Any) -> Any:
        """Enqueue ``task(*args, **kwargs)`` as a taskq job, in Django's transaction."""
        from taskq.contrib.django.client import enqueue

        self.validate_task(task)
        call = TaskCall(
            task=task.module_path, positional=list(args), keywords=dict(kwargs), backend=self.alias
        )
        handle = enqueue(
            task_actor(task),
            call,
            queue=task.queue_name,
            priority=task.priority,
            scheduled_at=task.run_after,
            identity_key=call_identity(task, args, kwargs),
        )
        if handle.was_existing:
            # unique_for matched a job already there: that job's result; nothing enqueued.
            record = handle.record
            if record is not None:
                return self._from_record(record)
            return _result(task, str(handle.job_id), call, TaskResultStatus.READY, self.alias)
        result = _result(task, str(handle.job_id), call, TaskResultStatus.READY, self.alias)
        object.__setattr__(result, "enqueued_at", datetime.now(UTC))
        task_enqueued.send(type(self), task_result=result)
        return result

    def get_result(self, result_id: str) -> Any:
        """The task's result as taskq's job row says; ``TaskResultDoesNotExist`` if none."""
        from taskq.contrib.django.client import get_taskq
        from taskq.exceptions import JobNotFoundError

        try:
            job_id = UUID(str(result_id))
            record = get_taskq().get(job_id).record
        except (ValueError, JobNotFoundError):
            raise TaskResultDoesNotExist(result_id) from None
        assert record is not None
        return self._from_record(record)

    def _from_record(self, record: JobRecord) -> Any:
        call = TaskCall.model_validate(record.payload)
        task = _task(call.task, self.alias)
        status = getattr(TaskResultStatus, _STATUSES.get(record.status, "FAILED"))
        result = _result(task, str(record.id), call, status, self.alias)
        object.__setattr__(result, "enqueued_at", record.created_at)
        object.__setattr__(result, "started_at", record.started_at)
        object.__setattr__(result, "last_attempted_at", record.started_at)
        object.__setattr__(result, "finished_at", record.finished_at)
        if record.status == "succeeded":
            value = (record.result or {}).get("value") if isinstance(record.result, dict) else None
            object.__setattr__(result, "_return_value", value)
        elif status == TaskResultStatus.FAILED:
            path, _, text = (record.error or record.error_class or "").partition("\n")
            result.errors.append(TaskError(exception_class_path=path, traceback=text))
        return result


def configured_backends() -> list[Any]:
    """The ``TASKS`` backends of this project that are taskq's."""
    from django.conf import settings

    tasks = getattr(settings, "TASKS", None) or {}
    out = []
    for alias, conf in tasks.items():
        if str(conf.get("BACKEND", "")).startswith("taskq.contrib.django"):
            out.append(task_backends[alias])
    return out
