"""Read-only statistics the admin UI shows: a job's progress row, recent throughput, an
actor's executor statistics over a window, schedule counts per actor.

Every read is bounded (``LIMIT`` on an index walk from the newest finish down), so a page
built from them stays fast on a table of millions of rows; a bounded read says so
(``sampled``) when the window held more rows than it looked at.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from sqlalchemy.ext.asyncio import AsyncEngine

from taskq.db.engine import transaction
from taskq.db.queries import admin as q
from taskq.db.queries.job_ops import store_now
from taskq.ops.results import JobCount
from taskq.records import JobRecord

__all__ = [
    "ActorStats",
    "ProgressSnapshot",
    "StatsClient",
    "Throughput",
    "percentile",
]

SAMPLE_LIMIT = 10_000
"""The most finished rows one statistics read looks at."""
CHILDREN_LIMIT = 1000
"""The most children :meth:`StatsClient.children` reads."""
WINDOW_SAMPLE = 20_000
"""The most finishes :meth:`StatsClient.actors_stats` aggregates (the newest in the window)."""
_FAILED = frozenset({"failed", "crashed", "abandoned"})


@dataclass(frozen=True, slots=True)
class ProgressSnapshot:
    """A job's progress as its row holds it: ``seq`` is the last stream event's number."""

    job_id: UUID
    status: str
    state: dict[str, Any]
    seq: int
    error_class: str | None


@dataclass(frozen=True, slots=True)
class Throughput:
    """Finishes over a window, in ``len(succeeded)`` equal buckets, oldest first."""

    since: datetime
    bucket: timedelta
    succeeded: list[int]
    failed: list[int]
    sampled: bool
    """True when the window held more than :data:`SAMPLE_LIMIT` finishes (the oldest buckets
    are then undercounted)."""

    @property
    def total(self) -> int:
        """Every finish counted."""
        return sum(self.succeeded) + sum(self.failed)

    @property
    def total_failed(self) -> int:
        """Failed, crashed and abandoned finishes counted."""
        return sum(self.failed)


@dataclass(frozen=True, slots=True)
class ActorStats:
    """An actor's executions finished in a window: counts, share of failures, the last
    error class and duration percentiles (seconds; ``None`` when nothing finished)."""

    actor: str
    window: timedelta
    completed: int
    failures: int
    last_error_class: str | None
    p50_s: float | None
    p95_s: float | None
    p99_s: float | None
    sampled: bool
    by_status: dict[str, int] = field(default_factory=dict)

    @property
    def failure_share(self) -> float | None:
        """Failures over completed, ``None`` when nothing completed."""
        return self.failures / self.completed if self.completed else None


def percentile(values: Sequence[float], p: float) -> float | None:
    """The ``p``-th percentile (0..100) of ``values`` by nearest rank; ``None`` if empty."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(p / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


class StatsClient:
    """The admin UI's statistics reads on ``engine``."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine

    async def now(self) -> datetime:
        """The store's clock (the one every timestamp in the tables is written on)."""
        async with transaction(self.engine, readonly=True) as conn:
            value: datetime = (await conn.execute(store_now(self.engine.dialect.name))).scalar_one()
        return value

    async def progress(self, job_id: UUID) -> ProgressSnapshot | None:
        """The job's progress row, ``None`` when there is no such job."""
        async with transaction(self.engine, readonly=True) as conn:
            row = (await conn.execute(q.progress_row(job_id))).mappings().first()
        if row is None:
            return None
        state = row["progress"] if isinstance(row["progress"], dict) else {}
        return ProgressSnapshot(
            row["id"], str(row["status"]), dict(state), int(row["progress_seq"]), row["error_class"]
        )

    async def throughput(
        self, window: timedelta = timedelta(hours=1), buckets: int = 12, *, queue: str | None = None
    ) -> Throughput:
        """Successes and failures over the last ``window`` in ``buckets`` buckets."""
        if buckets < 1:
            raise ValueError("buckets must be >= 1")
        async with transaction(self.engine, readonly=True) as conn:
            now: datetime = (await conn.execute(store_now(self.engine.dialect.name))).scalar_one()
            since = now - window
            rows = (await conn.execute(q.recent_finishes(since, SAMPLE_LIMIT, queue))).all()
        width = window / buckets
        ok = [0] * buckets
        bad = [0] * buckets
        for _queue, status, finished in rows:
            index = min(int((finished - since) / width), buckets - 1)
            if index < 0:
                continue
            if status == "succeeded":
                ok[index] += 1
            elif status in _FAILED:
                bad[index] += 1
        return Throughput(since, width, ok, bad, len(rows) >= SAMPLE_LIMIT)

    async def actor_stats(self, actor: str, window: timedelta) -> ActorStats:
        """``actor``'s executor statistics over the last ``window``."""
        async with transaction(self.engine, readonly=True) as conn:
            now: datetime = (await conn.execute(store_now(self.engine.dialect.name))).scalar_one()
            rows = (await conn.execute(q.actor_recent(actor, now - window, SAMPLE_LIMIT))).all()
        return _summarise(actor, window, rows, len(rows) >= SAMPLE_LIMIT)

    async def children(self, job_id: UUID, limit: int = 50) -> tuple[list[JobRecord], bool]:
        """The newest ``limit`` children of ``job_id`` (of the first 1,000 found), and
        whether there are more."""
        async with transaction(self.engine, readonly=True) as conn:
            rows = (await conn.execute(q.children_of(job_id, CHILDREN_LIMIT))).mappings().all()
        records = sorted(
            (JobRecord.from_mapping(r) for r in rows), key=lambda j: j.created_at, reverse=True
        )
        return records[:limit], len(records) > limit

    async def active_count(
        self,
        statuses: tuple[str, ...],
        *,
        queue: str | None = None,
        actor: str | None = None,
        cap: int = 1000,
    ) -> JobCount:
        """How many of ``queue``'s (or ``actor``'s) jobs are in ``statuses``, to ``cap``."""
        return (await self.active_counts([(statuses, queue, actor)], cap=cap))[0]

    async def active_counts(
        self,
        keys: Sequence[tuple[tuple[str, ...], str | None, str | None]],
        *,
        cap: int = 1000,
    ) -> list[JobCount]:
        """:meth:`active_count` for each ``(statuses, queue, actor)``, in one read-only
        transaction (one connection, no per-count transaction round trips)."""
        if cap < 1:
            raise ValueError("cap must be >= 1")
        out: list[JobCount] = []
        async with transaction(self.engine, readonly=True) as conn:
            for statuses, queue, actor in keys:
                stmt = q.active_count(statuses, cap, queue=queue, actor=actor)
                n = int((await conn.execute(stmt)).scalar_one())
                out.append(JobCount(min(n, cap), n > cap, cap))
        return out

    async def finished_since(self, window: timedelta, queue: str) -> tuple[int, bool]:
        """How many of ``queue``'s jobs finished over the last ``window`` (counted to
        :data:`SAMPLE_LIMIT`), and whether the count stopped there."""
        async with transaction(self.engine, readonly=True) as conn:
            now: datetime = (await conn.execute(store_now(self.engine.dialect.name))).scalar_one()
            stmt = q.finished_count(now - window, queue, SAMPLE_LIMIT)
            n = int((await conn.execute(stmt)).scalar_one())
        return min(n, SAMPLE_LIMIT), n > SAMPLE_LIMIT

    async def actors_stats(self, window: timedelta) -> dict[str, ActorStats]:
        """Every actor's executor statistics over the last ``window``, from one read of the
        newest :data:`WINDOW_SAMPLE` finishes (aggregated in Postgres; in Python on
        SQLite). Actors with no finish in the window are absent."""
        dialect = self.engine.dialect.name
        async with transaction(self.engine, readonly=True) as conn:
            now: datetime = (await conn.execute(store_now(dialect))).scalar_one()
            since = now - window
            if dialect == "postgresql":
                sample = q.window_sample(since, WINDOW_SAMPLE)
                summary = (await conn.execute(q.actors_summary(sample))).all()
                last = dict((await conn.execute(q.actors_last_error(sample))).all())
                sampled = sum(int(r[1]) for r in summary) >= WINDOW_SAMPLE
                return {
                    str(actor): ActorStats(
                        actor=str(actor),
                        window=window,
                        completed=int(n),
                        failures=int(failures),
                        last_error_class=last.get(actor),
                        p50_s=_float(p50),
                        p95_s=_float(p95),
                        p99_s=_float(p99),
                        sampled=sampled,
                    )
                    for actor, n, failures, p50, p95, p99 in summary
                }
            rows = (await conn.execute(q.recent_rows(since, WINDOW_SAMPLE))).all()
        grouped: dict[str, list[Any]] = {}
        for row in rows:
            grouped.setdefault(str(row[0]), []).append(row[1:])
        sampled = len(rows) >= WINDOW_SAMPLE
        return {
            actor: _summarise(actor, window, items, sampled) for actor, items in grouped.items()
        }

    async def schedule_counts(self) -> dict[str, tuple[int, int]]:
        """Per actor: ``(schedules, enabled schedules)``."""
        async with transaction(self.engine, readonly=True) as conn:
            rows = (await conn.execute(q.schedule_counts())).all()
        return {str(a): (int(n), int(e or 0)) for a, n, e in rows}


def _float(value: Any) -> float | None:
    return float(value) if value is not None else None


def _summarise(actor: str, window: timedelta, rows: Sequence[Any], sampled: bool) -> ActorStats:
    """Statistics of ``(status, error_class, started_at, finished_at)`` rows, newest first."""
    by_status: dict[str, int] = {}
    durations: list[float] = []
    last_error: str | None = None
    failures = 0
    for status, error_class, started, finished in rows:
        by_status[str(status)] = by_status.get(str(status), 0) + 1
        if status in _FAILED:
            failures += 1
            if last_error is None and error_class is not None:
                last_error = str(error_class)  # rows come newest first
        if started is not None and finished is not None:
            durations.append(max((finished - started).total_seconds(), 0.0))
    return ActorStats(
        actor=actor,
        window=window,
        completed=len(rows),
        failures=failures,
        last_error_class=last_error,
        p50_s=percentile(durations, 50),
        p95_s=percentile(durations, 95),
        p99_s=percentile(durations, 99),
        sampled=sampled,
        by_status=by_status,
    )
