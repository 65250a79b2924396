"""``ScheduleRecord``: a stored schedule as the API and the CLI show it, and the row a
:class:`~taskq.cron.schedule.Schedule` is written as."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from taskq.cron.schedule import Schedule, parse_spec

__all__ = ["ScheduleRecord", "ScheduleRun", "schedule_row"]


def schedule_row(
    actor: str, schedule: Schedule, *, origin: str, next_run_at: datetime | None
) -> dict[str, Any]:
    """The ``cron_schedules`` values of a bound ``schedule`` (its ``id`` resolved)."""
    assert schedule.id is not None, "bind the schedule to its actor first"
    payload = schedule.payload
    return {
        "id": schedule.id,
        "actor": actor,
        "queue": schedule.queue,
        "cron_expression": schedule.spec,
        "timezone": schedule.tz,
        "payload": dict(payload) if isinstance(payload, Mapping) else {},
        "enabled": schedule.enabled,
        "next_run_at": next_run_at if schedule.enabled else None,
        "jitter_s": schedule.jitter_s,
        "missed": schedule.missed,
        "max_catchup": schedule.max_catchup,
        "priority": schedule.priority,
        "tags": list(schedule.tags) if schedule.tags else None,
        "identity_key": schedule.identity_key,
        "origin": origin,
    }


@dataclass(frozen=True, slots=True)
class ScheduleRecord:
    """One ``cron_schedules`` row: the definition, the state and the last tick's outcome.

    ``last_outcome`` is what the last tick or run-now did: ``enqueued``,
    ``deduplicated`` (the enqueue matched an existing job: the tick's own, or one in the
    actor's ``unique_for`` window for the schedule's ``identity_key``), ``refused:max_pending``,
    ``refused:singleton``, ``refused:invalid-payload``, ``refused:error`` or
    ``invalid`` (the stored definition no longer parses; ``next_run_at`` is then empty).
    ``last_job_status`` is the current status of ``last_job_id``'s job, when read.
    """

    id: str
    actor: str
    queue: str | None
    cron_expression: str
    timezone: str
    payload: dict[str, Any]
    enabled: bool
    next_run_at: datetime | None
    last_run_at: datetime | None
    last_job_id: UUID | None
    jitter_s: float | None
    missed: str
    max_catchup: int
    priority: int | None
    tags: list[str]
    identity_key: str | None
    origin: str
    last_tick_at: datetime | None
    last_outcome: str | None
    last_error: str | None
    enqueued_count: int
    refused_count: int
    created_at: datetime
    updated_at: datetime
    last_job_status: str | None = None

    @property
    def cron(self) -> str | None:
        """The cron expression, or ``None`` for an interval schedule."""
        return parse_spec(self.cron_expression)[0]

    @property
    def every(self) -> timedelta | None:
        """The interval, or ``None`` for a cron schedule."""
        return parse_spec(self.cron_expression)[1]

    def schedule(self) -> Schedule:
        """The row's definition as a :class:`Schedule` (``ValueError`` if it no longer
        parses, e.g. after a hand edit)."""
        return Schedule.from_spec(
            self.cron_expression,
            payload=self.payload,
            tz=self.timezone,
            id=self.id,
            jitter=timedelta(seconds=self.jitter_s) if self.jitter_s else None,
            missed=self.missed,
            max_catchup=self.max_catchup,
            queue=self.queue,
            priority=self.priority,
            tags=tuple(self.tags),
            identity_key=self.identity_key,
            enabled=self.enabled,
        )

    @classmethod
    def from_mapping(
        cls, row: Mapping[Any, Any], *, last_job_status: str | None = None
    ) -> ScheduleRecord:
        """Build from a result row's mapping."""
        values = {name: row[name] for name in cls.__dataclass_fields__ if name != "last_job_status"}
        values["tags"] = list(values["tags"] or [])
        values["payload"] = dict(values["payload"] or {})
        return cls(**values, last_job_status=last_job_status)

    def as_json(self) -> dict[str, Any]:
        """A JSON-ready dict (``--json`` output): times in ISO 8601, ids as text."""
        out: dict[str, Any] = {}
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            if isinstance(value, datetime):
                value = value.isoformat()
            elif isinstance(value, UUID):
                value = str(value)
            out[name] = value
        return out


@dataclass(frozen=True, slots=True)
class ScheduleRun:
    """One job a schedule made: ``tick`` is its tick's UTC time, or ``None`` for a run-now."""

    job_id: UUID
    status: str
    tick: datetime | None
    scheduled_at: datetime
    created_at: datetime
    finished_at: datetime | None
    error_class: str | None

    def as_json(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "job_id": str(self.job_id),
            "status": self.status,
            "tick": self.tick.isoformat() if self.tick else None,
            "scheduled_at": self.scheduled_at.isoformat(),
            "created_at": self.created_at.isoformat(),
            "finished_at": self.finished_at.isoformat() if self.finished_at else None,
            "error_class": self.error_class,
        }
