# sync twin: src/taskq_sync/cron/__init__.py
"""Periodic jobs: :class:`Schedule` values, their tick times, and the stored schedules.

Importing this package loads only the model (no engine, no client): ``taskq.actor``
depends on it. The services live in :mod:`taskq.cron.client` (``tq.schedules``),
:mod:`taskq.cron.ticker` (what a worker runs) and :mod:`taskq.cron.ops` (the functions
the CLI and the operations layer call).
"""

from __future__ import annotations

from taskq.cron.schedule import MISSED_POLICIES, MissedPolicy, Schedule
from taskq.cron.ticks import CronTimetable, IntervalTimetable, Timetable

__all__ = [
    "MISSED_POLICIES",
    "CronTimetable",
    "IntervalTimetable",
    "MissedPolicy",
    "Schedule",
    "Timetable",
]
