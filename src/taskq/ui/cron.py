"""What the cron page needs from a schedule source: list, enable, disable, run now.

By default the page reads and acts on the stored schedules (``cron_schedules``) through
:mod:`taskq.cron.ops`, the same operations ``taskq cron`` and ``tq.schedules`` use
(:class:`StoredSchedules`). Hand ``create_router(cron=...)`` any other object with these
methods to show another source.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from taskq.cron import ops as cron_ops

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

    from taskq.cron.records import ScheduleRecord
    from taskq.settings import TaskQSettings

__all__ = ["CronScheduleView", "CronSource", "StoredSchedules"]


@dataclass(frozen=True, slots=True)
class CronScheduleView:
    """One schedule as the cron page shows it."""

    id: str
    actor: str
    cron_expression: str
    timezone: str
    enabled: bool
    next_run_at: datetime | None
    last_run_at: datetime | None
    queue: str | None = None


@runtime_checkable
class CronSource(Protocol):
    """The schedule operations the cron page calls (``LookupError`` for an unknown id)."""

    async def list(self) -> list[CronScheduleView]:
        """Every schedule, by id."""
        ...

    async def enable(self, schedule_id: str) -> None:
        """Let the schedule fire again."""
        ...

    async def disable(self, schedule_id: str) -> None:
        """Stop the schedule firing (its history stays)."""
        ...

    async def run_now(self, schedule_id: str) -> str:
        """Enqueue the schedule's job at once; the new job's id."""
        ...


def _view(record: ScheduleRecord) -> CronScheduleView:
    return CronScheduleView(
        id=record.id,
        actor=record.actor,
        cron_expression=record.cron_expression,
        timezone=record.timezone,
        enabled=record.enabled,
        next_run_at=record.next_run_at,
        last_run_at=record.last_run_at,
        queue=record.queue,
    )


class StoredSchedules:
    """The stored schedules as a :class:`CronSource`, through :mod:`taskq.cron.ops`.

    Enable and disable work for every schedule; run now needs the schedule's actor declared
    in the process serving the UI (its payload is validated against the actor's model), and
    answers ``LookupError`` (a 404) for an unknown id.
    """

    def __init__(self, engine: AsyncEngine, settings: TaskQSettings | None = None) -> None:
        self.engine = engine
        self.settings = settings

    async def list(self) -> list[CronScheduleView]:
        """Every stored schedule, by id."""
        return [_view(r) for r in await cron_ops.list_schedules(self.engine)]

    async def enable(self, schedule_id: str) -> None:
        """Let the schedule fire again."""
        await cron_ops.enable_schedule(self.engine, schedule_id)

    async def disable(self, schedule_id: str) -> None:
        """Stop the schedule firing (its history stays)."""
        await cron_ops.disable_schedule(self.engine, schedule_id)

    async def run_now(self, schedule_id: str) -> str:
        """Enqueue the schedule's job at once; the new job's id."""
        handle = await cron_ops.run_schedule_now(self.engine, schedule_id, self.settings)
        return str(handle.job_id)
