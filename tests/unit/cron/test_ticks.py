"""Tick times: DST in two zones, 6-field expressions, intervals, and the missed-tick plans."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from croniter import croniter
from pydantic import BaseModel

from taskq.actor import actor
from taskq.cron import Schedule
from taskq.cron.missed import ON_TIME, plan_ticks
from taskq.cron.schedule import parse_every
from taskq.cron.ticks import CronTimetable, IntervalTimetable, Timetable, tick_id
from taskq.testing.clock import FakeClock

BERLIN = ZoneInfo("Europe/Berlin")
NEW_YORK = ZoneInfo("America/New_York")


def _ticks(table: Timetable, start: datetime, end: datetime) -> list[datetime]:
    out: list[datetime] = []
    at = start
    while True:
        at = table.next_after(at)
        if at >= end:
            return out
        out.append(at)


def _local_day(zone: ZoneInfo, y: int, m: int, d: int) -> tuple[datetime, datetime]:
    start = datetime(y, m, d, tzinfo=zone).astimezone(UTC)
    end = datetime(y, m, d + 1, tzinfo=zone).astimezone(UTC)
    return start, end


@pytest.mark.parametrize(
    ("zone", "spring", "fall"),
    [
        (BERLIN, (2026, 3, 29), (2026, 10, 25)),
        (NEW_YORK, (2026, 3, 8), (2026, 11, 1)),
    ],
)
def test_daily_0230_runs_once_on_both_transition_days(
    zone: ZoneInfo, spring: tuple[int, int, int], fall: tuple[int, int, int]
) -> None:
    table = CronTimetable("30 2 * * *", zone.key)
    # Spring forward: 02:30 does not exist; the one run is shifted by the gap, to 03:30.
    start, end = _local_day(zone, *spring)
    [only] = _ticks(table, start - timedelta(seconds=1), end)
    local = only.astimezone(zone)
    assert (local.hour, local.minute) == (3, 30)
    # Fall back: 02:30 happens twice; it runs at the first occurrence only.
    start, end = _local_day(zone, *fall)
    [only] = _ticks(table, start - timedelta(seconds=1), end)
    local = only.astimezone(zone)
    assert (local.hour, local.minute, local.fold) == (2, 30, 0)
    assert only == datetime(*fall, 2, 30, tzinfo=zone).astimezone(UTC)
    # The days around them run at 02:30 local as usual.
    start, end = _local_day(zone, fall[0], fall[1], fall[2] + 1)
    [after] = _ticks(table, start, end)
    assert after.astimezone(zone).hour == 2


def test_wildcard_hour_keeps_running_through_the_repeated_hour() -> None:
    table = CronTimetable("*/30 * * * *", "Europe/Berlin")
    start, end = _local_day(BERLIN, 2026, 10, 25)
    ticks = _ticks(table, start - timedelta(seconds=1), end)
    assert len(ticks) == 50  # a 25-hour day, two per hour
    assert len(set(ticks)) == len(ticks)
    assert ticks == sorted(ticks)
    start, end = _local_day(BERLIN, 2026, 3, 29)
    assert len(_ticks(table, start - timedelta(seconds=1), end)) == 46  # a 23-hour day


def test_last_at_or_before_inverts_next_after_across_transitions() -> None:
    for expr, tz in (("*/30 * * * *", "Europe/Berlin"), ("30 2 * * *", "America/New_York")):
        table = CronTimetable(expr, tz)
        for day in ((2026, 3, 8), (2026, 3, 29), (2026, 10, 25), (2026, 11, 1)):
            at = datetime(*day, tzinfo=UTC) - timedelta(hours=6)
            for tick in _ticks(table, at, at + timedelta(days=2)):
                assert table.last_at_or_before(tick) == tick
                assert table.last_at_or_before(tick - timedelta(microseconds=1)) < tick
                assert (
                    table.next_after(table.last_at_or_before(tick - timedelta(seconds=1))) == tick
                )


def test_six_fields_have_a_leading_seconds_field() -> None:
    table = CronTimetable("*/15 * * * * *")
    at = datetime(2026, 1, 1, 12, 0, 7, tzinfo=UTC)
    assert [t.second for t in _ticks(table, at, at + timedelta(minutes=1))] == [15, 30, 45, 0]
    every_second = CronTimetable("*/1 * * * * *")
    assert every_second.next_after(at) == at + timedelta(seconds=1)
    table = CronTimetable("10 0 9 * * mon", "Europe/Berlin")  # Mondays 09:00:10 Berlin
    nxt = table.next_after(at)
    assert nxt.astimezone(BERLIN).isoformat() == "2026-01-05T09:00:10+01:00"


def test_intervals_are_aligned_to_the_epoch() -> None:
    table = IntervalTimetable(timedelta(minutes=5))
    at = datetime(2026, 1, 1, 12, 3, 1, tzinfo=UTC)
    assert table.next_after(at) == datetime(2026, 1, 1, 12, 5, tzinfo=UTC)
    assert table.last_at_or_before(at) == datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
    assert table.next_after(datetime(2026, 1, 1, 12, 5, tzinfo=UTC)).minute == 10
    assert parse_every("1h30m") == timedelta(minutes=90)
    with pytest.raises(ValueError, match="whole number"):
        IntervalTimetable(timedelta(milliseconds=1500))


@pytest.mark.parametrize(
    "bad", ["* * * *", "1 2 3 4 5 6 7", "61 * * * *", "@fortnightly", "0 0 30 2 *"]
)
def test_bad_expressions_fail_at_construction(bad: str) -> None:
    with pytest.raises(ValueError):
        Schedule(cron=bad)


def test_schedule_checks_its_fields() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        Schedule(cron="* * * * *", every=timedelta(minutes=1))
    with pytest.raises(ValueError, match="time zone"):
        Schedule(cron="* * * * *", tz="Mars/Olympus")
    with pytest.raises(ValueError, match="missed"):
        Schedule(cron="* * * * *", missed="some")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="schedule id"):
        Schedule(cron="* * * * *", id="a:b")
    assert Schedule(every=timedelta(seconds=90)).spec == "@every 90s"
    assert Schedule.from_spec("@every 90s").every == timedelta(seconds=90)


class Report(BaseModel):
    day: str = "today"


def test_actor_schedules_are_bound_at_decoration() -> None:
    @actor(
        name="unit-cron-report",
        schedules=[
            Schedule(cron="0 2 * * *", payload=Report(day="x")),
            Schedule(every=timedelta(hours=1), id="hourly", payload={"day": "y"}),
        ],
    )
    async def report(payload: Report) -> None: ...

    first, second = report.schedules
    assert (first.id, first.payload) == ("unit-cron-report", {"day": "x"})
    assert (second.id, second.payload) == ("hourly", {"day": "y"})
    with pytest.raises(ValueError, match="schedules"):

        @actor(name="unit-cron-bad", schedules=[Schedule(cron="* * * * *", payload={"day": 1})])
        async def bad(payload: Report) -> None: ...

    with pytest.raises(ValueError, match="needs an id"):

        @actor(
            name="unit-cron-two",
            schedules=[Schedule(cron="* * * * *"), Schedule(cron="0 * * * *")],
        )
        async def two(payload: Report) -> None: ...


# -- missed-tick policies after a 3-hour gap (FakeClock) ------------------------------------


@pytest.fixture
def gap() -> tuple[CronTimetable, datetime, FakeClock]:
    table = CronTimetable("*/15 * * * *")
    clock = FakeClock(datetime(2026, 6, 1, 12, 0, tzinfo=UTC))
    due_from = table.next_after(clock.now())  # 12:15: stored when the fleet went down
    clock.advance(timedelta(hours=3, minutes=2))  # back at 15:02
    return table, due_from, clock


def test_latest_runs_the_most_recent_missed_tick(
    gap: tuple[CronTimetable, datetime, FakeClock],
) -> None:
    table, due_from, clock = gap
    plan = plan_ticks(table, "latest", due_from=due_from, now=clock.now(), max_catchup=10)
    assert [tick_id(t) for t in plan.run] == ["2026-06-01T15:00:00Z"]
    assert plan.dropped == 11  # 12:15 .. 14:45
    assert plan.next_run_at == datetime(2026, 6, 1, 15, 15, tzinfo=UTC)


def test_skip_runs_from_now(gap: tuple[CronTimetable, datetime, FakeClock]) -> None:
    table, due_from, clock = gap
    plan = plan_ticks(table, "skip", due_from=due_from, now=clock.now(), max_catchup=10)
    assert plan.run == ()  # 15:00 is two minutes late: missed, like the eleven before it
    assert clock.now() - datetime(2026, 6, 1, 15, 0, tzinfo=UTC) > ON_TIME
    assert plan.dropped == 12
    assert plan.next_run_at == datetime(2026, 6, 1, 15, 15, tzinfo=UTC)
    on_time = plan_ticks(
        table,
        "skip",
        due_from=due_from,
        now=datetime(2026, 6, 1, 15, 0, 30, tzinfo=UTC),
        max_catchup=10,
    )
    assert [tick_id(t) for t in on_time.run] == ["2026-06-01T15:00:00Z"]


def test_all_catches_up_capped_by_max_catchup(
    gap: tuple[CronTimetable, datetime, FakeClock],
) -> None:
    table, due_from, clock = gap
    plan = plan_ticks(table, "all", due_from=due_from, now=clock.now(), max_catchup=5)
    assert [tick_id(t)[11:16] for t in plan.run] == ["14:00", "14:15", "14:30", "14:45", "15:00"]
    assert plan.dropped == 7
    everything = plan_ticks(table, "all", due_from=due_from, now=clock.now(), max_catchup=100)
    assert len(everything.run) == 12
    assert everything.dropped == 0
    assert everything.run[0] == due_from


def test_nothing_due_plans_nothing() -> None:
    table = IntervalTimetable(timedelta(minutes=1))
    now = datetime(2026, 6, 1, 12, 0, 30, tzinfo=UTC)
    nxt = table.next_after(now)
    plan = plan_ticks(table, "all", due_from=nxt, now=now, max_catchup=10)
    assert (plan.run, plan.dropped, plan.next_run_at) == ((), 0, nxt)


@pytest.mark.parametrize(
    ("expr", "tz"),
    [("*/20 * * * *", "Europe/Berlin"), ("0 30 1-3 * * *", "America/New_York"), ("@hourly", "UTC")],
)
def test_the_walks_agree_with_one_step_at_a_time(expr: str, tz: str) -> None:
    table = CronTimetable(expr, tz)
    for day in ((2026, 3, 8), (2026, 3, 29), (2026, 10, 25), (2026, 11, 1)):
        at = datetime(*day, tzinfo=UTC) - timedelta(hours=4)
        forward = list(itertools.islice(table.iter_after(at), 40))
        assert forward == _ticks(table, at, forward[-1] + timedelta(seconds=1))
        backward = list(itertools.islice(table.iter_before(forward[-1]), 40))
        assert backward == forward[::-1][: len(backward)]


def _oracle(expr: str, zone: ZoneInfo, start: datetime, end: datetime) -> list[datetime]:
    """The documented rules applied by brute force: every wall minute of the window that
    matches, mapped to instants (a gap's shifted forward, an ambiguous one at its first
    occurrence unless the hour field is ``*``), deduplicated and sorted."""
    wildcard_hour = expr.split()[1] == "*"
    wall = (start.astimezone(zone) - timedelta(hours=2)).replace(tzinfo=None, second=0)
    stop = (end.astimezone(zone) + timedelta(hours=2)).replace(tzinfo=None)
    found: set[datetime] = set()
    while wall <= stop:
        if croniter.match(expr, wall):
            first = wall.replace(tzinfo=zone, fold=0).astimezone(UTC)
            second = wall.replace(tzinfo=zone, fold=1).astimezone(UTC)
            found.add(first)
            if first < second and wildcard_hour:
                found.add(second)
        wall += timedelta(minutes=1)
    return sorted(t for t in found if start < t < end)


@pytest.mark.parametrize("zone", ["Europe/Berlin", "America/New_York", "Australia/Lord_Howe"])
@pytest.mark.parametrize("expr", ["30 2 * * *", "*/20 * * * *", "15,45 1-3 * * *"])
def test_ticks_match_a_brute_force_oracle_around_every_transition(expr: str, zone: str) -> None:
    tz = ZoneInfo(zone)
    table = CronTimetable(expr, zone)
    # The transitions of 2026 in each zone (Lord Howe shifts by 30 minutes).
    days = {
        "Europe/Berlin": ((2026, 3, 29), (2026, 10, 25)),
        "America/New_York": ((2026, 3, 8), (2026, 11, 1)),
        "Australia/Lord_Howe": ((2026, 4, 5), (2026, 10, 4)),
    }[zone]
    for day in days:
        start = datetime(*day, tzinfo=tz).astimezone(UTC) - timedelta(hours=2)
        end = start + timedelta(hours=28)
        expected = _oracle(expr, tz, start, end)
        assert expected
        assert _ticks(table, start, end) == expected
        walked = []
        for tick in table.iter_after(start):
            if tick >= end:
                break
            walked.append(tick)
        assert walked == expected
        back = []
        for tick in table.iter_before(end - timedelta(microseconds=1)):
            if tick <= start:
                break
            back.append(tick)
        assert back == expected[::-1]
