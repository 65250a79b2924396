"""Read-only statistics the admin UI shows: a job's progress row, recent throughput, an
actor's executor statistics over a window, schedule counts per actor.

Every read is bounded (``LIMIT`` on an index walk from the newest finish down, index-only
on Postgres; counts stop at a cap), so a page built from them stays fast on a table of
millions of rows; a bounded read says so (``sampled``, ``estimated``) when the window held
more rows than it looked at.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
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
    "actor_sample_size",
    "percentile",
]

SAMPLE_LIMIT = 10_000
"""The most finished rows one drain-rate count (and, on SQLite, the chart) looks at."""
THROUGHPUT_LIMIT = 100_000
"""The most finishes the throughput chart counts on Postgres (an index-only range scan,
aggregated in the store); a window holding more is ``sampled``."""
CHILDREN_LIMIT = 1000
"""The most children :meth:`StatsClient.children` reads."""
ACTOR_SAMPLE = 1_000
"""The most finishes per actor :meth:`StatsClient.actors_stats` looks at: the actor's
newest in the window. An actor whose window holds more has its statistics from these and
its counts estimated (``ActorStats.estimated``)."""
ACTORS_SAMPLE_TOTAL = 25_000
"""The most finishes one :meth:`StatsClient.actors_stats` read looks at over all the
actors it is given: each actor's share is ``ACTORS_SAMPLE_TOTAL // len(actors)``, between
:data:`ACTOR_SAMPLE_MIN` and :data:`ACTOR_SAMPLE` (500 each for 50 actors)."""
ACTOR_SAMPLE_MIN = 100
"""The fewest finishes per actor a statistics read looks at, however many actors."""


def actor_sample_size(actors: int) -> int:
    """How many of each actor's newest finishes one statistics read over ``actors``
    actors looks at (see :data:`ACTORS_SAMPLE_TOTAL`)."""
    return max(ACTOR_SAMPLE_MIN, min(ACTOR_SAMPLE, ACTORS_SAMPLE_TOTAL // max(actors, 1)))


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
    """True when the window held more finishes than were looked at."""
    by_status: dict[str, int] = field(default_factory=dict)
    sample_size: int = 0
    """How many finishes the percentiles, the share and the last error class come from."""
    estimated: bool = False
    """True when ``completed`` and ``failures`` are estimates: the sample's rate over its
    own time span, extended to the whole window (the window held more than the sample)."""

    @property
    def failure_share(self) -> float | None:
        """Failures over completed, ``None`` when nothing completed."""
        return self.failures / self.completed if self.completed else None


def _estimate(count: int, window: timedelta, span: timedelta) -> int:
    """``count`` finishes seen over ``span`` (the newest part of ``window``), extended to
    the whole window at the same rate; never below ``count``."""
    seconds = span.total_seconds()
    if seconds <= 0:
        return count
    return max(count, round(count * window.total_seconds() / seconds))


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
        """Successes and failures over the last ``window`` in ``buckets`` buckets.

        Postgres (no ``queue``): counted in the store over an index-only range of
        ``ix_jobs_finished``, up to :data:`THROUGHPUT_LIMIT` finishes; otherwise the newest
        :data:`SAMPLE_LIMIT` rows are bucketed here."""
        if buckets < 1:
            raise ValueError("buckets must be >= 1")
        width = window / buckets
        ok = [0] * buckets
        bad = [0] * buckets
        dialect = self.engine.dialect.name
        async with transaction(self.engine, readonly=True) as conn:
            now: datetime = (await conn.execute(store_now(dialect))).scalar_one()
            since = now - window
            if dialect == "postgresql" and queue is None:
                stmt = q.throughput_buckets(since, width.total_seconds(), THROUGHPUT_LIMIT)
                counted = 0
                for index, status, n in (await conn.execute(stmt)).all():
                    counted += int(n)
                    slot = min(int(index), buckets - 1)
                    if slot < 0:
                        continue
                    if status == "succeeded":
                        ok[slot] += int(n)
                    elif status in _FAILED:
                        bad[slot] += int(n)
                return Throughput(since, width, ok, bad, counted >= THROUGHPUT_LIMIT)
            rows = (await conn.execute(q.recent_finishes(since, SAMPLE_LIMIT, queue))).all()
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
        """:meth:`active_count` for each ``(statuses, queue, actor)``: on Postgres one
        statement for the queue keys and one for the actor keys (planned once, however
        many counts a page shows); one statement per key on SQLite or for a key giving
        both a queue and an actor (or neither)."""
        if cap < 1:
            raise ValueError("cap must be >= 1")
        if not keys:
            return []
        async with transaction(self.engine, readonly=True) as conn:
            if self.engine.dialect.name != "postgresql" or any(
                (queue is None) == (actor is None) for _statuses, queue, actor in keys
            ):
                out = []
                for statuses, queue, actor in keys:
                    stmt = q.active_count(statuses, cap, queue=queue, actor=actor)
                    n = int((await conn.execute(stmt)).scalar_one())
                    out.append(JobCount(min(n, cap), n > cap, cap))
                return out
            found: dict[tuple[str, str, str], int] = {}
            for column in ("queue", "actor"):
                pairs = [
                    (value, status)
                    for statuses, queue, actor in keys
                    if (value := queue if column == "queue" else actor) is not None
                    for status in statuses
                ]
                if pairs:
                    stmt = q.active_counts(column, pairs, cap)
                    for value, status, n in (await conn.execute(stmt)).all():
                        found[(column, str(value), str(status))] = int(n)
        out = []
        for statuses, queue, actor in keys:
            column, value = ("queue", queue) if queue is not None else ("actor", actor)
            # Each status counted to cap + 1: the sum passes cap exactly when the total does.
            n = sum(found.get((column, str(value), status), 0) for status in set(statuses))
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

    async def actors_stats(
        self, window: timedelta, actors: Sequence[str], *, per_actor: int | None = None
    ) -> dict[str, ActorStats]:
        """Executor statistics over the last ``window`` for each of ``actors``, from each
        actor's newest ``per_actor`` finishes in the window (default
        :func:`actor_sample_size`; one statement on Postgres, an index-only range per
        actor; one read per actor on SQLite).

        An actor whose window held fewer finishes has exact figures; one that held more
        has its percentiles, failure share and last error class from those finishes and
        ``completed``/``failures`` estimated (``estimated``, ``sample_size``). Actors with
        no finish in the window are absent."""
        names = sorted(set(actors))
        if not names:
            return {}
        if per_actor is None:
            per_actor = actor_sample_size(len(names))
        if per_actor < 1:
            raise ValueError("per_actor must be >= 1")
        dialect = self.engine.dialect.name
        out: dict[str, ActorStats] = {}
        async with transaction(self.engine, readonly=True) as conn:
            now: datetime = (await conn.execute(store_now(dialect))).scalar_one()
            since = now - window
            if dialect == "postgresql":
                stmt = q.actors_window(names, since, per_actor)
                for actor, n, failures, last, points, oldest in (await conn.execute(stmt)).all():
                    if not n:
                        continue
                    p50, p95, p99 = points or (None, None, None)
                    full = int(n) >= per_actor
                    completed, failed = int(n), int(failures)
                    if full:
                        completed = _estimate(int(n), window, now - oldest)
                        failed = round(completed * int(failures) / int(n))
                    out[str(actor)] = ActorStats(
                        actor=str(actor),
                        window=window,
                        completed=completed,
                        failures=failed,
                        last_error_class=last,
                        p50_s=_float(p50),
                        p95_s=_float(p95),
                        p99_s=_float(p99),
                        sampled=full,
                        sample_size=int(n),
                        estimated=full,
                    )
                return out
            for actor in names:
                rows = (await conn.execute(q.actor_recent(actor, since, per_actor))).all()
                if rows:
                    full = len(rows) >= per_actor
                    stats = _summarise(actor, window, rows, full)
                    if full:
                        completed = _estimate(len(rows), window, now - rows[-1][3])
                        stats = replace(
                            stats,
                            completed=completed,
                            failures=round(completed * stats.failures / len(rows)),
                            estimated=True,
                        )
                    out[actor] = stats
        return out

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
        sample_size=len(rows),
    )
