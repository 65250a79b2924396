"""What the cron page needs from a schedule source: list, enable, disable, run now.

The admin UI does not own cron: hand ``create_router(cron=...)`` any object with these
methods (the cron operations of your taskq version, or an adapter over them). Without
one the cron page says so and offers no actions.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Protocol, runtime_checkable

__all__ = ["CronScheduleView", "CronSource"]


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
