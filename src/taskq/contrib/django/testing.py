"""Test helpers for Django projects that use taskq.

* :class:`TaskQTestMixin` closes taskq's connections after each test class, so the test
  runner can drop the test database, and empties taskq's tables after each test of a
  ``TransactionTestCase`` (Django's flush only knows its own models);
* :func:`run_jobs_immediately` is an immediate mode: inside it,
  :func:`taskq.contrib.django.enqueue` runs the actor in-process and writes nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from sqlalchemy import text

from taskq.actor import ActorRef, get_actor
from taskq.contrib.django.client import close_taskq, get_taskq

__all__ = ["ImmediateJob", "TaskQTestMixin", "clear_jobs", "immediate_mode", "run_jobs_immediately"]

_IMMEDIATE = threading.local()


@dataclass(frozen=True)
class ImmediateJob:
    """What :func:`~taskq.contrib.django.enqueue` returns in immediate mode: the result."""

    actor: str
    result: Any


def immediate_mode() -> bool:
    """Whether :func:`run_jobs_immediately` is active in this thread."""
    return bool(getattr(_IMMEDIATE, "on", False))


@contextlib.contextmanager
def run_jobs_immediately() -> Iterator[None]:
    """Run enqueued jobs in-process (the actor's handler, its payload validated) instead
    of writing them; exceptions propagate to the caller."""
    before = immediate_mode()
    _IMMEDIATE.on = True
    try:
        yield
    finally:
        _IMMEDIATE.on = before


def run_now(actor: ActorRef[Any, Any] | str, payload: Any) -> ImmediateJob:
    """Run ``actor`` on ``payload`` in-process (immediate mode's enqueue)."""
    ref = actor if isinstance(actor, ActorRef) else get_actor(actor)
    model = (
        payload
        if isinstance(payload, ref.payload_type)
        else ref.payload_type.model_validate(payload)
    )
    if ref.wants_ctx:
        raise TypeError(f"actor {ref.name!r} takes a JobContext: it cannot run in immediate mode")
    if inspect.iscoroutinefunction(ref.fn):
        return ImmediateJob(ref.name, asyncio.run(ref(model)))
    # A sync handler runs in this thread: on this thread's Django connection, so it sees
    # the test's (uncommitted) rows and opens no connection the runner cannot close.
    return ImmediateJob(ref.name, ref.fn(model))


def clear_jobs() -> None:
    """Delete every job (and what hangs off it) from taskq's tables."""
    tq = get_taskq()
    schema = tq.settings.schema_name
    with tq.engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            conn.execute(text(f'TRUNCATE "{schema}".jobs CASCADE'))
        else:
            conn.execute(text("DELETE FROM jobs"))


class TaskQTestMixin:
    """Mix into a ``TestCase``/``TransactionTestCase``: taskq's connections are closed
    after the class; after each test of a ``TransactionTestCase`` the jobs are deleted."""

    def _post_teardown(self) -> None:
        super()._post_teardown()  # type: ignore[misc]
        from django.test import TestCase

        if not isinstance(self, TestCase):
            clear_jobs()

    @classmethod
    def tearDownClass(cls) -> None:
        super().tearDownClass()  # type: ignore[misc]
        close_taskq()
