"""Every exception derives from TaskQError and carries its machine-readable fields."""

from __future__ import annotations

import inspect
import uuid
from datetime import timedelta

import pytest

from taskq import exceptions
from taskq.exceptions import (
    ActorDeregistrationError,
    ActorHasActiveJobsError,
    ActorHasEnabledSchedulesError,
    ActorNotFoundError,
    MaxPendingExceededError,
    ReservationUnavailable,
    RetryAfter,
    SingletonCollisionError,
    Snooze,
    TaskQError,
)


def test_every_exported_exception_is_a_taskq_error_or_a_control_flow_signal() -> None:
    for name in exceptions.__all__:
        obj = getattr(exceptions, name)
        assert inspect.isclass(obj), name
        assert issubclass(obj, TaskQError | exceptions.ControlFlow), name
        assert not issubclass(obj, TaskQError) or not issubclass(obj, exceptions.ControlFlow)


def test_an_actors_except_taskq_error_does_not_swallow_snooze_or_retry_after() -> None:
    def actor_body(signal: Exception) -> str:
        try:
            raise signal
        except TaskQError:  # what an actor writes around its own calls into taskq
            return "swallowed"

    for signal in (Snooze(timedelta(seconds=1)), RetryAfter(timedelta(seconds=1))):
        with pytest.raises(type(signal)):
            actor_body(signal)


def test_fields() -> None:
    job = uuid.uuid4()
    s = SingletonCollisionError("report", job, timedelta(seconds=3))
    assert (s.actor, s.blocking_job_id, s.retry_after) == ("report", job, timedelta(seconds=3))
    m = MaxPendingExceededError("ingest", 10, 10)
    assert (m.actor, m.current_count, m.max_pending) == ("ingest", 10, 10)
    a = ActorHasActiveJobsError("x", 3, {"pending": 2, "running": 1})
    assert (a.actor, a.active_count, a.status_counts) == ("x", 3, {"pending": 2, "running": 1})
    e = ActorHasEnabledSchedulesError("x", ["nightly"])
    assert e.schedule_ids == ["nightly"]
    assert ActorNotFoundError("x").actor == "x"
    for exc in (a, e, ActorNotFoundError("x")):
        assert isinstance(exc, ActorDeregistrationError)
    r = ReservationUnavailable("gpu", timedelta(0))
    assert (r.bucket_name, r.retry_after) == ("gpu", timedelta(0))


def test_reservation_unavailable_never_has_a_missing_backoff() -> None:
    with pytest.raises(ValueError, match="retry_after"):
        ReservationUnavailable("gpu", None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="retry_after"):
        ReservationUnavailable("gpu", timedelta(seconds=-1))


def test_control_flow_signals_validate_delay() -> None:
    assert Snooze(timedelta(0)).delay == timedelta(0)
    with pytest.raises(ValueError, match="delay"):
        Snooze(timedelta(seconds=-1))
    assert RetryAfter(timedelta(seconds=5)).consume_budget is True
    assert RetryAfter(timedelta(seconds=5), consume_budget=False).consume_budget is False
    with pytest.raises(ValueError, match="delay"):
        RetryAfter(timedelta(microseconds=-1))
