"""The missed-tick policy: which of a schedule's due ticks get a job.

Every tick from the stored ``next_run_at`` up to now is *due*. Normally that is one tick,
the one that just came. After the fleet was down, or no worker with the actor ran for a
while, it is many, and the schedule's ``missed`` policy decides:

``skip``
    Run from now: the most recent tick runs only if it is at most :data:`ON_TIME` old;
    every older one is dropped.
``latest`` (the default)
    One job, for the most recent due tick, however late; the older ones are dropped.
``all``
    One job per due tick, oldest first, but at most ``max_catchup`` of them: the most
    recent ones (the older ones are dropped).

Pure: the worker's ticker applies the plan (:mod:`taskq.cron.ticker`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Final

from taskq.cron.ticks import Timetable

__all__ = ["ON_TIME", "TickPlan", "plan_ticks"]

ON_TIME: Final = timedelta(seconds=60)
"""How late a tick may be and still count as on time for the ``skip`` policy."""
_TINY: Final = timedelta(microseconds=1)


@dataclass(frozen=True, slots=True)
class TickPlan:
    """What to do with a schedule's due ticks.

    ``run``: the ticks to enqueue, oldest first. ``dropped``: how many due ticks get no
    job (counted up to a bound: see :func:`plan_ticks`). ``next_run_at``: the first tick
    after ``now``, where the schedule goes next.
    """

    run: tuple[datetime, ...]
    dropped: int
    next_run_at: datetime


def _count_between(table: Timetable, first: datetime, last: datetime, bound: int) -> int:
    """Ticks in ``[first, last)``, counted up to ``bound``."""
    count = 0
    for tick in table.iter_after(first - _TINY):
        if tick >= last or count >= bound:
            break
        count += 1
    return count


def plan_ticks(
    table: Timetable,
    policy: str,
    *,
    due_from: datetime,
    now: datetime,
    max_catchup: int,
    count_bound: int = 1_000,
) -> TickPlan:
    """Plan the ticks due between ``due_from`` (the stored ``next_run_at``) and ``now``.

    ``dropped`` counts at most ``count_bound`` ticks (a per-second schedule down for a
    day has 86,400: the count, only logged, stops at the bound).
    """
    next_run_at = table.next_after(now)
    if due_from > now:
        return TickPlan((), 0, due_from)
    latest = table.last_at_or_before(now)
    if latest < due_from:  # the stored tick is not a tick of this timetable (it was edited)
        return TickPlan((), 0, next_run_at)
    if policy == "all":
        run: list[datetime] = []
        for tick in table.iter_before(now):
            if tick < due_from or len(run) >= max_catchup:
                break
            run.append(tick)
        run.reverse()
    elif policy == "skip":
        run = [latest] if now - latest <= ON_TIME else []
    else:
        run = [latest]
    first_run = run[0] if run else table.next_after(latest)
    dropped = _count_between(table, due_from, first_run, count_bound)
    return TickPlan(tuple(run), dropped, next_run_at)
