"""When a schedule fires: its tick times as UTC instants, DST-correct in its time zone.

A cron expression is matched against the *wall clock* of the schedule's time zone
(``zoneinfo``), then each matching wall time is turned into an instant:

* a wall time that does not exist (skipped by a spring-forward transition) fires once,
  shifted forward by the length of the gap (02:30 on a day that jumps from 02:00 to
  03:00 fires at 03:30): the choice of ``java.time`` and JavaScript's Temporal;
* a wall time that happens twice (fall-back) fires once, at its first occurrence, unless
  the expression's hour field is ``*``: then it fires in both passes, so an every-15-minutes
  job keeps running through the repeated hour (the Vixie cron rule).

Several wall times that land on one instant (a gap's shifted times meeting real ones)
fire once: a tick *is* its instant. Intervals (``every=``) are aligned to the Unix epoch
in UTC, so every worker computes the same ticks without sharing any state.
"""

from __future__ import annotations

import copy
import heapq
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Final, Protocol
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter

__all__ = [
    "ALIASES",
    "CronTimetable",
    "IntervalTimetable",
    "Timetable",
    "parse_cron",
    "parse_zone",
    "tick_id",
]

ALIASES: Final = frozenset(
    {"@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly"}
)
_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
_DAY: Final = timedelta(days=1)
_SECOND: Final = timedelta(seconds=1)
_MAX_CANDIDATES: Final = 10_000
"""Wall times examined without finding a tick before giving up (one that never fires)."""


class Timetable(Protocol):
    """The tick times of one schedule."""

    def next_after(self, at: datetime) -> datetime:
        """The first tick strictly after ``at`` (aware, UTC)."""
        ...

    def last_at_or_before(self, at: datetime) -> datetime:
        """The latest tick at or before ``at`` (aware, UTC)."""
        ...

    def iter_after(self, at: datetime) -> Iterator[datetime]:
        """The ticks strictly after ``at``, in order."""
        ...

    def iter_before(self, at: datetime) -> Iterator[datetime]:
        """The ticks at or before ``at``, latest first."""
        ...


def tick_id(tick: datetime) -> str:
    """A tick's stable text form, ``YYYY-MM-DDTHH:MM:SSZ`` (ticks are whole seconds)."""
    return tick.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_zone(name: object) -> ZoneInfo:
    """The ``zoneinfo`` zone named ``name``; ``ValueError`` for an unknown name."""
    if not isinstance(name, str):
        raise TypeError(f"tz must be a str (an IANA zone such as 'Europe/Berlin'), got {name!r}")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise ValueError(f"unknown time zone {name!r} (use an IANA name such as 'UTC')") from exc


def parse_cron(expression: object) -> tuple[str, bool]:
    """Normalise a cron expression; return it and whether it has a seconds field.

    Five fields (minute hour day-of-month month day-of-week), six fields with a leading
    seconds field (``*/10 * * * * *`` is every ten seconds), or one of :data:`ALIASES`.
    Anything else raises ``ValueError``.
    """
    if not isinstance(expression, str):
        raise TypeError(f"cron must be a str, got {type(expression).__name__}")
    fields = expression.split()
    text = " ".join(fields)
    if len(fields) == 1 and text.lower() in ALIASES:
        return text.lower(), False
    if len(fields) not in (5, 6):
        raise ValueError(
            f"invalid cron expression {expression!r}: expected 5 fields (minute hour day "
            "month weekday), 6 with a leading seconds field, or an alias such as @daily"
        )
    seconds = len(fields) == 6
    if not croniter.is_valid(text, second_at_beginning=seconds):
        raise ValueError(f"invalid cron expression {expression!r}")
    return text, seconds


class CronTimetable:
    """Ticks of a cron expression on the wall clock of ``tz`` (see the module docstring)."""

    def __init__(self, expression: str, tz: str = "UTC") -> None:
        self.expression, self.seconds = parse_cron(expression)
        self.zone = parse_zone(tz)
        if self.expression.startswith("@"):
            self.wildcard_hour = self.expression == "@hourly"
        else:
            fields = self.expression.split()
            self.wildcard_hour = fields[2 if self.seconds else 1] in ("*", "*/1")
        self._parsed = croniter(
            self.expression, datetime(2000, 1, 1), second_at_beginning=self.seconds
        )
        # Fail now, not at the first tick, for an expression that never matches (30 Feb).
        self.next_after(datetime(2000, 1, 1, tzinfo=UTC))

    def __repr__(self) -> str:
        return f"CronTimetable({self.expression!r}, tz={self.zone.key!r})"

    def _offset(self, at: datetime) -> timedelta:
        return at.astimezone(self.zone).utcoffset() or timedelta(0)

    def _span(self, at: datetime) -> tuple[timedelta, timedelta]:
        """The smallest and largest offsets in effect within a day of ``at``."""
        offsets = [self._offset(at + d) for d in (-_DAY, timedelta(0), _DAY)]
        return min(offsets), max(offsets)

    def _instants(self, wall: datetime) -> list[datetime]:
        """The instants a naive wall time of the zone stands for (see the module docstring)."""
        first = wall.replace(tzinfo=self.zone, fold=0).astimezone(UTC)
        second = wall.replace(tzinfo=self.zone, fold=1).astimezone(UTC)
        if first >= second:
            # Equal: an ordinary time. Greater: a time in a gap, where fold=0 reads it with
            # the offset from before the jump, i.e. shifted forward by the gap.
            return [first]
        return [first, second] if self.wildcard_hour else [first]

    def _walls(self, start: datetime) -> croniter:
        """A walk over the expression's wall times from ``start`` (naive).

        Parsing an expression costs far more than a step, so each walk is a copy of one
        parsed ``croniter`` moved to ``start``.
        """
        walls = copy.copy(self._parsed)
        walls.set_current(start, force=True)
        return walls

    def iter_after(self, at: datetime) -> Iterator[datetime]:
        """The ticks strictly after ``at``, in order (one ``croniter`` walk)."""
        at = at.astimezone(UTC)
        # A wall time w stands for an instant i = w - offset(i): start from the smallest
        # wall time any instant after ``at`` can have.
        low, _ = self._span(at)
        walls = self._walls((at + low).replace(tzinfo=None))
        pending: list[datetime] = []  # instants seen, not yet known to be the next
        last: datetime | None = None
        idle = 0
        while True:
            wall = walls.get_next(datetime)
            for instant in self._instants(wall):
                if instant > at:
                    heapq.heappush(pending, instant)
            idle = idle + 1 if not pending else 0
            if idle > _MAX_CANDIDATES:
                raise ValueError(f"cron expression {self.expression!r} never fires")
            # A later wall time w stands for an instant w - o, o one of the zone's offsets
            # around that instant (for a time in a gap: the offset before the jump). An
            # unseen instant before the earliest pending one is within a day of it, so o is
            # at most the largest offset of that span: below w - that, the pending is final.
            while pending:
                first = pending[0]
                _, high = self._span(first)
                if wall - high <= first.replace(tzinfo=None):
                    break
                heapq.heappop(pending)
                if first != last:
                    last = first
                    yield first

    def iter_before(self, at: datetime) -> Iterator[datetime]:
        """The ticks at or before ``at``, latest first (one ``croniter`` walk)."""
        at = at.astimezone(UTC)
        _, high = self._span(at)
        walls = self._walls((at + high).replace(tzinfo=None) + _SECOND)
        pending: list[tuple[float, datetime]] = []  # a max-heap by instant
        last: datetime | None = None
        idle = 0
        while True:
            wall = walls.get_prev(datetime)
            for instant in self._instants(wall):
                if instant <= at:
                    heapq.heappush(pending, (-instant.timestamp(), instant))
            idle = idle + 1 if not pending else 0
            if idle > _MAX_CANDIDATES:
                raise ValueError(f"cron expression {self.expression!r} never fired")
            while pending:  # the mirror image of iter_after's rule
                first = pending[0][1]
                low, _ = self._span(first)
                if wall - low >= first.replace(tzinfo=None):
                    break
                heapq.heappop(pending)
                if first != last:
                    last = first
                    yield first

    def next_after(self, at: datetime) -> datetime:
        """The first tick strictly after ``at``."""
        return next(self.iter_after(at))

    def last_at_or_before(self, at: datetime) -> datetime:
        """The latest tick at or before ``at``."""
        return next(self.iter_before(at))


class IntervalTimetable:
    """Ticks every ``every`` (whole seconds, at least one), aligned to the Unix epoch."""

    def __init__(self, every: timedelta) -> None:
        if not isinstance(every, timedelta):
            raise TypeError(f"every must be a timedelta, got {type(every).__name__}")
        if every < _SECOND or every % _SECOND:
            raise ValueError(f"every must be a whole number of seconds >= 1, got {every}")
        self.every = every

    def __repr__(self) -> str:
        return f"IntervalTimetable({self.every!r})"

    def next_after(self, at: datetime) -> datetime:
        """The first tick strictly after ``at``."""
        return _EPOCH + ((at - _EPOCH) // self.every + 1) * self.every

    def last_at_or_before(self, at: datetime) -> datetime:
        """The latest tick at or before ``at``."""
        return _EPOCH + ((at - _EPOCH) // self.every) * self.every

    def iter_after(self, at: datetime) -> Iterator[datetime]:
        """The ticks strictly after ``at``, in order."""
        tick = self.next_after(at)
        while True:
            yield tick
            tick += self.every

    def iter_before(self, at: datetime) -> Iterator[datetime]:
        """The ticks at or before ``at``, latest first."""
        tick = self.last_at_or_before(at)
        while True:
            yield tick
            tick -= self.every
