"""The schedule operations as plain functions on an engine: what the CLI calls, and what
the operations layer (``taskq.ops``) and the admin UI re-export.

Each is a one-line use of :class:`~taskq.cron.client.SchedulesClient`, so the rules live
in one place; they exist so a surface needs only an engine (and, for ``run_now`` and
``create``, the actor declared in the process).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from taskq.actor import ActorRef
from taskq.backends.sql import SqlBackend
from taskq.client import JobsClient
from taskq.cron.client import SchedulesClient
from taskq.cron.records import ScheduleRecord, ScheduleRun
from taskq.cron.schedule import Schedule
from taskq.handle import JobHandle
from taskq.settings import TaskQSettings

__all__ = [
    "create_schedule",
    "delete_schedule",
    "disable_schedule",
    "enable_schedule",
    "get_schedule",
    "list_schedules",
    "run_schedule_now",
    "schedule_counts",
    "schedule_history",
    "schedules_client",
]


def schedules_client(engine: AsyncEngine, settings: TaskQSettings | None = None) -> SchedulesClient:
    """A :class:`SchedulesClient` on ``engine`` (its run-now jobs go through a plain backend)."""
    return SchedulesClient(engine, JobsClient(SqlBackend(engine, settings=settings)))


async def list_schedules(
    engine: AsyncEngine, *, actor: str | None = None, enabled: bool | None = None
) -> list[ScheduleRecord]:
    """Every schedule (optionally one actor's, or only enabled/disabled ones), by id."""
    return await schedules_client(engine).list(actor=actor, enabled=enabled)


async def get_schedule(engine: AsyncEngine, schedule_id: str) -> ScheduleRecord:
    """One schedule; ``ScheduleNotFoundError`` if there is none."""
    return await schedules_client(engine).get(schedule_id)


async def create_schedule(
    engine: AsyncEngine,
    actor: ActorRef[Any, Any] | str,
    schedule: Schedule,
    *,
    replace: bool = False,
) -> ScheduleRecord:
    """Store a schedule for ``actor`` (see :meth:`SchedulesClient.create`)."""
    return await schedules_client(engine).create(actor, schedule, replace=replace)


async def enable_schedule(engine: AsyncEngine, schedule_id: str) -> ScheduleRecord:
    """Enable a schedule from its next tick on."""
    return await schedules_client(engine).enable(schedule_id)


async def disable_schedule(engine: AsyncEngine, schedule_id: str) -> ScheduleRecord:
    """Disable a schedule."""
    return await schedules_client(engine).disable(schedule_id)


async def delete_schedule(engine: AsyncEngine, schedule_id: str) -> ScheduleRecord:
    """Delete a schedule (its jobs stay); returns what it was."""
    return await schedules_client(engine).delete(schedule_id)


async def run_schedule_now(
    engine: AsyncEngine, schedule_id: str, settings: TaskQSettings | None = None
) -> JobHandle[Any]:
    """Enqueue one job from the schedule now (its actor must be declared in the process)."""
    return await schedules_client(engine, settings).run_now(schedule_id)


async def schedule_history(
    engine: AsyncEngine, schedule_id: str, *, limit: int = 20
) -> list[ScheduleRun]:
    """The schedule's most recent jobs, newest first."""
    return await schedules_client(engine).history(schedule_id, limit=limit)


async def schedule_counts(engine: AsyncEngine) -> dict[str, dict[str, int]]:
    """Per actor: ``{"enabled": n, "disabled": m}`` schedules."""
    return await schedules_client(engine).counts()
