"""somnus.processors.sleep.schedule: the cron on stream time, catch-up, validation, ``off``."""

from __future__ import annotations

import doctest
from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from somnus.processors.sleep import schedule
from somnus.processors.sleep.config import (
    SleepConfig,
)
from somnus.processors.sleep.plan import SleepInputs, plan_sleep
from somnus.processors.sleep.schedule import (
    SleepClock,
    advance,
    fire_times,
    next_fire,
    validate_schedule,
)
from tests.processors.sleep.memories import frame, mem


def test_doctests() -> None:
    assert doctest.testmod(schedule).failed == 0


# --- the schedule on event time ---------------------------------------------------------------------


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=timezone.utc)


def test_fire_times_are_strictly_between() -> None:
    got, dropped = fire_times("0 3 * * *", utc(2024, 5, 1, 3), utc(2024, 5, 4, 3))
    assert got == [utc(2024, 5, 2, 3), utc(2024, 5, 3, 3)] and dropped == 0
    assert fire_times("0 */6 * * *", utc(2024, 5, 1, 0), utc(2024, 5, 1, 13))[0] == [
        utc(2024, 5, 1, 6),
        utc(2024, 5, 1, 12),
    ]


def test_fire_times_follow_the_schedule_zone_across_dst() -> None:
    got, _ = fire_times("0 3 * * *", utc(2024, 3, 8), utc(2024, 3, 12), tz="America/New_York")
    assert got == [utc(2024, 3, 8, 8), utc(2024, 3, 9, 8), utc(2024, 3, 10, 7), utc(2024, 3, 11, 7)]
    # 02:30 does not exist on the day DST starts: that run happens at 03:00 local, once
    spring, _ = fire_times("30 2 * * *", utc(2024, 3, 9, 12), utc(2024, 3, 11, 12), tz="America/New_York")
    assert spring == [utc(2024, 3, 10, 7), utc(2024, 3, 11, 6, 30)]


def test_catch_up_is_limited_to_the_last_runs() -> None:
    got, dropped = fire_times("0 3 * * *", utc(2024, 1, 1), utc(2024, 2, 1), limit=7)
    assert got[0] == utc(2024, 1, 25, 3) and got[-1] == utc(2024, 1, 31, 3) and dropped == 24


def test_advance_drives_runs_from_stream_time() -> None:
    clock, due, _ = advance(SleepClock(), utc(2024, 5, 1, 10))
    assert due == [] and clock.last_fired == utc(2024, 5, 1, 10)  # no runs before the stream began
    clock, due, _ = advance(clock, utc(2024, 5, 2, 3))
    assert due == []  # an event exactly at the fire time still belongs to that window
    clock, due, _ = advance(clock, utc(2024, 5, 2, 3, 0, 1))
    assert due == [utc(2024, 5, 2, 3)]
    clock, due, _ = advance(clock, utc(2024, 5, 1, 23))  # a late event: nothing more
    assert due == [] and clock.last_fired == utc(2024, 5, 2, 3)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(0, 10 * 24 * 60), min_size=1, max_size=30))
def test_replay_in_any_batching_fires_the_same_runs(minutes: list[int]) -> None:
    times = [utc(2024, 5, 1) + timedelta(minutes=m) for m in sorted(minutes)]
    config = SleepConfig(max_catch_up=1000)
    clock, live = SleepClock(), []
    for t in times:
        clock, due, _ = advance(clock, t, config)
        live += due
    # a replay sees the same records in the same order: only first and last matter for what fires
    replay_clock, _, _ = advance(SleepClock(), times[0], config)
    _, replayed, _ = advance(replay_clock, times[-1], config)
    assert live == replayed
    assert all(times[0] < f < times[-1] for f in live)


def test_schedule_validation_and_naive_times() -> None:
    assert validate_schedule("0 */6 * * *") == "0 */6 * * *"
    with pytest.raises(ValueError, match="invalid sleep schedule"):
        validate_schedule("61 3 * * *")
    with pytest.raises(ValueError, match="timezone-aware"):
        advance(SleepClock(utc(2024, 5, 1)), datetime(2024, 5, 2))
    with pytest.raises(ValueError, match="timezone-aware"):
        plan_sleep(SleepInputs(frame([mem("m")])), now=datetime(2024, 5, 2))


def test_schedule_off_never_fires_but_the_clock_still_starts() -> None:
    assert validate_schedule(" OFF ") == "off"
    config = SleepConfig(schedule=validate_schedule("off"))
    clock, due, _ = advance(SleepClock(), utc(2024, 5, 1), config)
    assert clock.last_fired == utc(2024, 5, 1) and due == []
    later, due, dropped = advance(clock, utc(2024, 9, 1), config)
    assert (later, due, dropped) == (clock, [], 0)
    # the same span under the default schedule would have fired (so the test can fail)
    assert advance(clock, utc(2024, 9, 1), SleepConfig())[1]


@settings(max_examples=60, deadline=None)
@given(
    st.sampled_from(["0 3 * * *", "*/20 * * * *", "30 2 * * 1", "0 0 1 * *"]),
    st.sampled_from(["UTC", "America/New_York"]),
    st.integers(0, 60 * 24 * 40),
    st.integers(0, 60 * 24 * 40),
)
def test_next_fire_bounds_the_event_times_that_make_nothing_due(cron: str, tz: str, start: int, later: int) -> None:
    """SleepJob.due answers 'nothing due' without a cron walk up to next_fire: what advance says too."""
    after = utc(2024, 3, 1) + timedelta(minutes=start)
    upcoming = next_fire(cron, after, tz=tz)
    assert upcoming is not None and upcoming > after
    config = SleepConfig(schedule=cron, schedule_tz=tz)
    event_time = after + timedelta(minutes=later, seconds=7)
    _, due, _ = advance(SleepClock(after), event_time, config)
    assert (due == []) == (event_time <= upcoming)
    assert advance(SleepClock(after), upcoming, config)[1] == []
