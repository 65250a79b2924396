"""Actors with schedules for the cron tests: real worker processes and the CLI."""

from __future__ import annotations

from pydantic import BaseModel

from taskq import actor
from taskq.cron import Schedule


class Beat(BaseModel):
    n: int = 0


@actor(
    name="e2e-cron-beat",
    schedules=[Schedule(cron="*/1 * * * * *", id="every-second", missed="all", max_catchup=1000)],
)
async def beat(payload: Beat) -> None:
    """Does nothing: the test counts the jobs the schedule made."""


@actor(name="cli-cron-target", max_pending=1)
async def target(payload: Beat) -> None:
    """No schedule of its own: the CLI tests create them."""


registry = {beat.name: beat}
