"""``Schedule``: one periodic job, declared on an actor or created through ``tq.schedules``.

The same frozen value is what ``@actor(schedules=[...])`` takes, what
``tq.schedules.create(actor, schedule)`` takes and what the ``cron_schedules`` row is
written from, so a schedule has one shape wherever it is defined. Every field is checked
at construction; the payload and the enqueue options are checked against the actor when
the schedule is bound to one (:func:`bind_schedule`), so a bad schedule fails at import
or at the API call, never at its first tick.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Final, Literal, cast

from pydantic import BaseModel

from taskq.constants import SMALLINT_MAX, SMALLINT_MIN, validate_queue_name
from taskq.cron.ticks import CronTimetable, IntervalTimetable, Timetable, parse_cron, parse_zone
from taskq.records import build_request

if TYPE_CHECKING:
    from taskq.actor import ActorRef

__all__ = [
    "DEFAULT_MAX_CATCHUP",
    "MISSED_POLICIES",
    "MissedPolicy",
    "Schedule",
    "bind_schedule",
    "bind_schedules",
    "parse_every",
    "parse_spec",
    "validate_schedule_id",
]

MissedPolicy = Literal["skip", "latest", "all"]
MISSED_POLICIES: Final = ("skip", "latest", "all")
DEFAULT_MAX_CATCHUP: Final = 10
MAX_SCHEDULE_ID: Final = 150
"""The idempotency key ``cron:<tick>:<id>`` must fit the 200-character column."""
_EVERY_PREFIX: Final = "@every "
_UNITS: Final = {"d": 86400, "h": 3600, "m": 60, "s": 1}


def validate_schedule_id(value: object) -> str:
    """A schedule id: 1..150 printable characters, no spaces, no ``:``."""
    if not isinstance(value, str):
        raise TypeError(f"schedule id must be a str, got {type(value).__name__}")
    if (
        not value
        or len(value) > MAX_SCHEDULE_ID
        or not value.isprintable()
        or any(c.isspace() or c == ":" for c in value)
    ):
        raise ValueError(
            f"invalid schedule id {value!r}: 1..{MAX_SCHEDULE_ID} printable characters, "
            "no spaces and no ':'"
        )
    return value


def parse_every(text: str) -> timedelta:
    """``90s``, ``5m``, ``1h30m``, ``2d`` or a plain number of seconds, as a ``timedelta``."""
    raw = text.strip().lower()
    if raw.isdigit():
        return timedelta(seconds=int(raw))
    total, number = 0, ""
    for char in raw:
        if char.isdigit():
            number += char
        elif char in _UNITS and number:
            total += int(number) * _UNITS[char]
            number = ""
        else:
            number = "x"  # poisoned: reported below
            break
    if number or not raw:
        raise ValueError(f"invalid interval {text!r}: use e.g. 90s, 5m, 1h30m, 2d")
    return timedelta(seconds=total)


def parse_spec(spec: str) -> tuple[str | None, timedelta | None]:
    """A stored ``cron_expression`` back into ``(cron, every)``: ``@every 300s`` is an
    interval, anything else a cron expression."""
    if spec.startswith(_EVERY_PREFIX):
        return None, parse_every(spec[len(_EVERY_PREFIX) :])
    return spec, None


def _seconds(value: object, name: str) -> timedelta | None:
    if value is None:
        return None
    if not isinstance(value, timedelta):
        raise TypeError(f"{name} must be a timedelta or None, got {type(value).__name__}")
    return value


@dataclass(frozen=True, eq=False)
class Schedule:
    """A periodic job: *when* (``cron`` or ``every``), *what* (``payload``), *how* (options).

    ``cron``: 5 fields, or 6 with a leading seconds field, or an alias (``@daily``),
    matched on the wall clock of ``tz`` (see :mod:`taskq.cron.ticks` for DST).
    ``every``: a plain interval (whole seconds), aligned to the Unix epoch. Exactly one of
    the two. ``jitter``: each job is scheduled up to this much after its tick (random,
    chosen once per tick). ``missed``: what happens to ticks that came and went while no
    worker ran the schedule: ``"skip"`` (run from now), ``"latest"`` (the default: one job
    for the most recent missed tick) or ``"all"`` (one per missed tick, at most
    ``max_catchup``, the most recent ones). ``queue``, ``priority``, ``tags`` and
    ``identity_key`` are the enqueue options of every job. ``id`` names the schedule
    fleet-wide (default: the actor's name, for at most one schedule per actor).
    ``enabled`` is the state a new row starts in; after that the operator owns it.
    """

    cron: str | None = None
    every: timedelta | None = None
    payload: BaseModel | Mapping[str, Any] | None = None
    tz: str = "UTC"
    id: str | None = None
    jitter: timedelta | None = None
    missed: MissedPolicy = "latest"
    max_catchup: int = DEFAULT_MAX_CATCHUP
    queue: str | None = None
    priority: int | None = None
    tags: Sequence[str] = ()
    identity_key: str | None = None
    enabled: bool = True
    timetable: Timetable = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if (self.cron is None) == (self.every is None):
            raise ValueError("a Schedule takes exactly one of cron= and every=")
        table: Timetable
        if self.cron is not None:
            expression, _ = parse_cron(self.cron)
            object.__setattr__(self, "cron", expression)
            table = CronTimetable(expression, self.tz)
        else:
            table = IntervalTimetable(cast("timedelta", self.every))
            parse_zone(self.tz)
        object.__setattr__(self, "timetable", table)
        if self.id is not None:
            validate_schedule_id(self.id)
        jitter = _seconds(self.jitter, "jitter")
        if jitter is not None and jitter < timedelta(0):
            raise ValueError(f"jitter must be >= 0, got {jitter}")
        if self.missed not in MISSED_POLICIES:
            raise ValueError(
                f"missed must be one of {', '.join(MISSED_POLICIES)}, got {self.missed!r}"
            )
        mc = self.max_catchup
        if isinstance(mc, bool) or not isinstance(mc, int) or mc < 1:
            raise ValueError(f"max_catchup must be an int >= 1, got {mc!r}")
        if self.queue is not None:
            validate_queue_name(self.queue)
        prio = self.priority
        if prio is not None and (isinstance(prio, bool) or not isinstance(prio, int)):
            raise TypeError("priority must be an int or None")
        if prio is not None and not SMALLINT_MIN <= prio <= SMALLINT_MAX:
            raise ValueError(f"priority must be in {SMALLINT_MIN}..{SMALLINT_MAX}, got {prio}")
        if isinstance(self.tags, str) or not all(isinstance(t, str) for t in self.tags):
            raise TypeError("tags must be a sequence of str")
        object.__setattr__(self, "tags", tuple(self.tags))
        if self.identity_key is not None and not isinstance(self.identity_key, str):
            raise TypeError("identity_key must be a str or None")
        if not isinstance(self.enabled, bool):
            raise TypeError("enabled must be a bool")
        if self.payload is not None and not isinstance(self.payload, BaseModel | Mapping):
            raise TypeError("payload must be a pydantic model, a mapping or None")

    @property
    def spec(self) -> str:
        """The when, as stored in ``cron_schedules.cron_expression`` (``@every 300s`` for an
        interval)."""
        if self.cron is not None:
            return self.cron
        return f"{_EVERY_PREFIX}{int(cast('timedelta', self.every).total_seconds())}s"

    @property
    def jitter_s(self) -> float | None:
        """``jitter`` in seconds (``None`` when there is none)."""
        if self.jitter is None or not self.jitter:
            return None
        return self.jitter.total_seconds()

    @classmethod
    def from_spec(cls, spec: str, **fields: Any) -> Schedule:
        """The schedule a stored ``cron_expression`` describes (see :func:`parse_spec`)."""
        cron, every = parse_spec(spec)
        return cls(cron=cron, every=every, **fields)


def bind_schedule(ref: ActorRef[Any, Any], schedule: Schedule, *, default_id: bool) -> Schedule:
    """``schedule`` checked against ``ref``: its payload validated and stored as the JSON
    document jobs will carry, its options checked as an enqueue would check them, its id
    resolved (``default_id``: the actor's name when it has none). Raises
    ``PayloadValidationError``, ``ValueError`` or ``TypeError`` naming what is wrong."""
    if not isinstance(schedule, Schedule):
        raise TypeError(f"schedules must be Schedule objects, got {schedule!r}")
    sid = schedule.id
    if sid is None:
        if not default_id:
            raise ValueError(
                f"actor {ref.name!r} has several schedules: every one but one needs an id="
            )
        sid = validate_schedule_id(ref.name)
    request = build_request(
        ref,
        schedule.payload if schedule.payload is not None else {},
        queue=schedule.queue,
        priority=schedule.priority,
        tags=schedule.tags,
        identity_key=schedule.identity_key,
    )
    return replace(schedule, id=sid, payload=request.payload)


def bind_schedules(ref: ActorRef[Any, Any], schedules: object) -> tuple[Schedule, ...]:
    """The ``@actor(schedules=[...])`` list, each bound to ``ref`` (:func:`bind_schedule`)."""
    if schedules is None:
        return ()
    if isinstance(schedules, Schedule) or not isinstance(schedules, Sequence):
        raise TypeError("schedules must be a list of Schedule objects")
    unnamed = sum(1 for s in schedules if isinstance(s, Schedule) and s.id is None)
    bound = tuple(bind_schedule(ref, s, default_id=unnamed <= 1) for s in schedules)
    ids = [s.id for s in bound]
    duplicates = sorted({i for i in ids if ids.count(i) > 1 and i is not None})
    if duplicates:
        raise ValueError(f"duplicate schedule id(s) {duplicates}")
    return bound
