"""The worker's startup sync of the schedules declared in code (``@actor(schedules=...)``).

Code seeds, operators own the switch: a new schedule is inserted whole; an existing one
takes the code's definition but keeps its ``enabled`` flag, so a schedule an operator
disabled stays disabled across deploys. ``next_run_at`` is recomputed only when the
timing changed. A schedule removed from code is not deleted (another worker may still
run the old code during a rolling deploy): the sync logs ``cron-schedule-not-in-code``
and an operator deletes it (``taskq cron delete``).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

import structlog
from sqlalchemy.ext.asyncio import AsyncConnection

from taskq.actor import ActorRef
from taskq.cron.records import schedule_row
from taskq.db.queries import cron as q
from taskq.exceptions import ConfigurationError

__all__ = ["sync_schedules"]

_log = structlog.get_logger("taskq.cron")


async def sync_schedules(
    conn: AsyncConnection, actors: Iterable[ActorRef[Any, Any]], *, now: datetime | None = None
) -> list[str]:
    """Upsert every code schedule of ``actors`` on ``conn``; return their ids.

    A new schedule's first tick is the first after ``now`` (default: the store's clock).

    Raises ``ConfigurationError`` (variable ``schedules``) when one id is declared by two
    actors, or is stored for another actor: a schedule id names one schedule fleet-wide.
    """
    refs = list(actors)
    owner: dict[str, str] = {}
    for ref in refs:
        for schedule in ref.schedules:
            assert schedule.id is not None
            if owner.setdefault(schedule.id, ref.name) != ref.name:
                raise ConfigurationError(
                    "schedules",
                    f"schedule id {schedule.id!r} is declared by actors "
                    f"{owner[schedule.id]!r} and {ref.name!r}",
                )
    dialect = conn.dialect.name
    if now is None:
        now = (await conn.execute(q.store_now(dialect))).scalar_one()
    for ref in refs:
        for schedule in ref.schedules:
            row = schedule_row(
                ref.name, schedule, origin="code", next_run_at=schedule.timetable.next_after(now)
            )
            if (await conn.execute(q.upsert_code(dialect, row))).first() is None:
                stored = (await conn.execute(q.get(str(schedule.id)))).mappings().one()
                raise ConfigurationError(
                    "schedules",
                    f"schedule id {schedule.id!r} of actor {ref.name!r} is stored for actor "
                    f"{stored['actor']!r}; rename one of them",
                )
    names = {ref.name for ref in refs}
    for row in (await conn.execute(q.list_all())).mappings():
        if row["origin"] == "code" and row["actor"] in names and row["id"] not in owner:
            _log.warning("cron-schedule-not-in-code", schedule=row["id"], actor=row["actor"])
    return sorted(owner)
