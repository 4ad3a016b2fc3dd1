"""somnus.processors.prediction.rhythms: temporal bins (time zones, DST), marks, and the commutative count index."""

from __future__ import annotations

import doctest
import uuid
from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import msgspec
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from somnus.processors.prediction import rhythms as scn
from somnus.processors.prediction.rhythms import (
    BIN_KINDS,
    BIN_SIZES,
    WEEKDAYS,
    WEEKEND,
    Bins,
    TemporalIndex,
    TemporalMark,
    around,
    bins_of,
    index_of,
    marks_of_episode,
    marks_of_event,
)
from somnus.processors.sessions.distiller import distill
from somnus.sample import generate
from somnus.schemas.causal import TemporalBinCounted
from somnus.schemas.codec import decode_trace
from somnus.schemas.episodes import CallSeen, EpisodeDistilled
from somnus.schemas.events import (
    Delegated,
    Delegation,
    DelegationResult,
    DelegationReturned,
    Message,
    Outcome,
    SessionEnd,
    SessionEnded,
    SessionStart,
    SessionStarted,
    ToolCall,
    ToolCalled,
    ToolResult,
    ToolReturned,
    UserMessaged,
)

UTC = timezone.utc
PROPERTY = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def test_the_module_examples_run():
    assert doctest.testmod(scn).failed == 0


def test_pinned_bins():
    assert BIN_SIZES == {"hour": 24, "weekday": 7, "week_of_month": 4, "month": 12, "weekhour": 168}
    assert BIN_KINDS == ("hour", "weekday", "week_of_month", "month", "weekhour")
    assert (WEEKDAYS, WEEKEND) == ((0, 1, 2, 3, 4), (5, 6))


# ---- bins of hand-made timestamps -------------------------------------------------------------


def tz(hours: float) -> timezone:
    return timezone(timedelta(hours=hours))


@pytest.mark.parametrize(
    ("ts", "zone", "bins"),
    [
        # the event's own offset
        (datetime(2024, 5, 13, 9, 15, tzinfo=UTC), None, Bins(9, 0, 1, 4, 9)),
        (datetime(2024, 5, 13, 9, 15, tzinfo=tz(5.5)), None, Bins(9, 0, 1, 4, 9)),  # 03:45 UTC, binned at 09 local
        (datetime(2024, 12, 31, 23, 59, tzinfo=tz(-8)), None, Bins(23, 1, 3, 11, 47)),
        # converted to a zone
        (datetime(2024, 12, 31, 23, 59, tzinfo=tz(-8)), "UTC", Bins(7, 2, 0, 0, 55)),  # Wed Jan 1 07:59 UTC
        (datetime(2024, 5, 13, 3, 45, tzinfo=UTC), "Asia/Kolkata", Bins(9, 0, 1, 4, 9)),
        (datetime(2024, 5, 13, 3, 45, tzinfo=UTC), "Pacific/Kiritimati", Bins(17, 0, 1, 4, 17)),  # UTC+14
        (datetime(2024, 5, 13, 3, 45, tzinfo=UTC), "Pacific/Pago_Pago", Bins(16, 6, 1, 4, 160)),  # UTC-11: Sunday 12th
        # New York, spring forward (2024-03-10 02:00 EST -> 03:00 EDT): no 2 AM that day
        (datetime(2024, 3, 10, 6, 59, tzinfo=UTC), "America/New_York", Bins(1, 6, 1, 2, 145)),
        (datetime(2024, 3, 10, 7, 0, tzinfo=UTC), "America/New_York", Bins(3, 6, 1, 2, 147)),
        # New York, fall back (2024-11-03 02:00 EDT -> 01:00 EST): 1 AM happens twice, both in bin 1
        (datetime(2024, 11, 3, 5, 30, tzinfo=UTC), "America/New_York", Bins(1, 6, 0, 10, 145)),
        (datetime(2024, 11, 3, 6, 30, tzinfo=UTC), "America/New_York", Bins(1, 6, 0, 10, 145)),
        (datetime(2024, 11, 3, 7, 30, tzinfo=UTC), "America/New_York", Bins(2, 6, 0, 10, 146)),
        # Berlin, summer time from 2024-03-31 01:00 UTC
        (datetime(2024, 3, 31, 0, 59, tzinfo=UTC), "Europe/Berlin", Bins(1, 6, 3, 2, 145)),
        (datetime(2024, 3, 31, 1, 0, tzinfo=UTC), "Europe/Berlin", Bins(3, 6, 3, 2, 147)),
        # the southern hemisphere: Sydney leaves daylight time on 2024-04-07 (03:00 AEDT -> 02:00 AEST)
        (datetime(2024, 4, 6, 15, 30, tzinfo=UTC), "Australia/Sydney", Bins(2, 6, 0, 3, 146)),
        (datetime(2024, 4, 6, 16, 30, tzinfo=UTC), "Australia/Sydney", Bins(2, 6, 0, 3, 146)),
        # a zone object works as well as its name
        (datetime(2024, 7, 1, 12, 0, tzinfo=UTC), ZoneInfo("America/Los_Angeles"), Bins(5, 0, 0, 6, 5)),
    ],
    ids=lambda v: v.isoformat() if isinstance(v, datetime) else None,
)
def test_bins_of_hand_made_timestamps(ts, zone, bins):
    assert bins_of(ts, zone) == bins


@pytest.mark.parametrize(
    ("day", "week"), [(1, 0), (7, 0), (8, 1), (14, 1), (15, 2), (21, 2), (22, 3), (28, 3), (29, 3), (30, 3), (31, 3)]
)
def test_week_of_month_puts_days_29_to_31_in_the_last_bin(day, week):
    assert bins_of(datetime(2024, 1, day, tzinfo=UTC)).week_of_month == week


@PROPERTY
@given(
    st.datetimes(min_value=datetime(1971, 1, 1), max_value=datetime(2100, 1, 1), timezones=st.just(UTC)),
    st.sampled_from([None, "UTC", "America/New_York", "Europe/Berlin", "Asia/Kathmandu", "Australia/Lord_Howe"]),
)
def test_bins_are_in_range_and_consistent(ts, zone):
    b = bins_of(ts, zone)
    for kind, value in zip(BIN_KINDS, b):
        assert 0 <= value < BIN_SIZES[kind]
    assert b.weekhour == b.weekday * 24 + b.hour
    local = ts.astimezone(ZoneInfo(zone)) if zone else ts
    assert (b.hour, b.weekday, b.month) == (local.hour, local.weekday(), local.month - 1)


def test_a_naive_time_is_refused():
    with pytest.raises(ValueError, match="naive"):
        bins_of(datetime(2024, 1, 1, 9))


def test_around_wraps_the_clock_face():
    assert around(9) == [8, 9, 10] and around(0) == [23, 0, 1] and around(23, 2) == [21, 22, 23, 0, 1]


# ---- marks ------------------------------------------------------------------------------------

T = datetime(2024, 5, 13, 9, 0, tzinfo=UTC)


def _ev(cls, payload, seq=0, at=T):
    return cls(
        event_id=uuid.UUID(int=seq + 1), schema_version=1, ts=at, agent="ops", session_id="s", seq=seq, payload=payload
    )


def test_marks_of_raw_events():
    cases = [
        (_ev(SessionStarted, SessionStart(task="x")), [("session_start", None)]),
        (_ev(UserMessaged, Message(text="hi")), [("user_message", None)]),
        (_ev(ToolCalled, ToolCall(tool="helm", call_id="c")), [("tool_call", None), ("tool_call:helm", None)]),
        (
            _ev(ToolReturned, ToolResult(call_id="c", ok=False, tool="helm")),
            [("tool_result", False), ("tool_result:helm", False)],
        ),
        (_ev(ToolReturned, ToolResult(call_id="c", ok=True)), [("tool_result", True)]),
        (
            _ev(Delegated, Delegation(to_agent="deployer", task="t")),
            [("delegation", None), ("delegation:deployer", None)],
        ),
        (
            _ev(DelegationReturned, DelegationResult(to_agent="deployer", outcome=Outcome.SUCCESS)),
            [("delegation_result", True), ("delegation_result:deployer", True)],
        ),
        (
            _ev(SessionEnded, SessionEnd(outcome=Outcome.PARTIAL)),
            [("session_end", False), ("session_end:partial", None)],
        ),
    ]
    for event, expected in cases:
        marks = marks_of_event(event)
        assert [(m.kind, m.success) for m in marks] == expected
        assert all(m.agent == "ops" and m.at == T for m in marks)


def test_marks_of_an_episode():
    ep = EpisodeDistilled(
        episode_id=uuid.UUID(int=1),
        schema_version=1,
        agent="ops",
        session_id="s",
        task="",
        goal=None,
        user_id=None,
        summary="",
        outcome=Outcome.FAILURE,
        started_at=T,
        ended_at=T + timedelta(minutes=5),
        duration_s=300.0,
        event_count=4,
        tool_calls=3,
        tools=[],
        errors=[],
        lessons=[],
        delegations=[],
        first_event_id=uuid.UUID(int=1),
        last_event_id=uuid.UUID(int=2),
        calls=[
            CallSeen(tool="helm", ok=False, at=T + timedelta(minutes=1)),
            CallSeen(tool="kubectl", at=T + timedelta(minutes=2)),
            CallSeen(tool="old", ok=True),
        ],
    )
    got = [(m.kind, m.at - T, m.success) for m in marks_of_episode(ep)]
    assert got == [
        ("session_start", timedelta(0), None),
        ("session_end", timedelta(minutes=5), False),
        ("session_end:failure", timedelta(minutes=5), None),
        ("tool_call", timedelta(minutes=1), False),
        ("tool_call:helm", timedelta(minutes=1), False),
        ("tool_call", timedelta(minutes=2), None),
        ("tool_call:kubectl", timedelta(minutes=2), None),
    ]


# ---- the index --------------------------------------------------------------------------------


def _at(day: int, hour: int, minute: int = 0) -> datetime:
    return datetime(2024, 5, day, hour, minute, tzinfo=UTC)  # May 13 2024 is a Monday


def test_counts_per_bin_and_what_usually_happens_around_9_on_weekdays():
    marks = [
        TemporalMark("a", "deploy", _at(13, 9), True),
        TemporalMark("a", "deploy", _at(14, 9, 40), False),
        TemporalMark("a", "deploy", _at(15, 10, 5), True),
        TemporalMark("a", "standup", _at(16, 8, 55)),
        TemporalMark("a", "standup", _at(17, 9)),
        TemporalMark("a", "backup", _at(18, 9), True),  # Saturday
        TemporalMark("a", "deploy", _at(13, 15), True),
        TemporalMark("b", "deploy", _at(13, 9), False),
    ]
    ix = index_of(marks)
    assert ix.cells[("a", "deploy", "hour", 9)] == [2, 1, 1]
    assert ix.cells[("a", "deploy", "weekhour", 9)] == [1, 1, 0]
    assert ix.cells[("a", "deploy", "weekday", 0)] == [2, 2, 0]
    assert ix.cells[("a", "deploy", "month", 4)] == [4, 3, 1]
    assert ix.cells[("a", "deploy", "week_of_month", 1)] == [3, 2, 1]  # the 13th and 14th (twice)
    assert ix.cells[("a", "deploy", "week_of_month", 2)] == [1, 1, 0]  # the 15th
    usual = ix.usual_at("a", around(9), WEEKDAYS)
    assert [(k.kind, k.count, k.successes, k.failures) for k in usual] == [("deploy", 3, 2, 1), ("standup", 2, 0, 0)]
    assert usual[0].success_rate == pytest.approx(2 / 3) and usual[1].success_rate is None
    assert usual[0].share == pytest.approx(3 / 5)
    assert [k.kind for k in ix.usual_at("a", [9], WEEKEND)] == ["backup"]
    assert [(k.kind, k.count) for k in ix.usual_at("a", [9])] == [("deploy", 2), ("backup", 1), ("standup", 1)]
    assert ix.usual_at("a", [9], top=1, prefix="st")[0].kind == "standup"
    assert [(k.kind, k.count) for k in ix.usual_in("a", "month", [4])][:1] == [("deploy", 4)]
    assert ix.usual_at("nobody", [9]) == []
    profile = ix.profile("a", "deploy", "hour")
    assert len(profile) == 24 and profile[9] == (9, 2, 0.5) and profile[0] == (0, 0, None)
    with pytest.raises(ValueError):
        ix.profile("a", "deploy", "fortnight")
    with pytest.raises(ValueError):
        ix.usual_in("a", "decade", [1])


def test_a_zone_per_agent_bins_each_agent_on_its_own_wall_clock():
    marks = [TemporalMark("ny", "k", _at(13, 13)), TemporalMark("berlin", "k", _at(13, 7))]
    ix = TemporalIndex()
    ix.add(marks, tz="UTC", tz_by_agent={"ny": "America/New_York", "berlin": "Europe/Berlin"})
    assert ("ny", "k", "hour", 9) in ix.cells and ("berlin", "k", "hour", 9) in ix.cells


def test_the_same_wall_clock_hour_across_a_dst_change():
    # a job at 09:00 New York time, written in UTC: 14:00Z in winter, 13:00Z in summer
    marks = [
        TemporalMark("a", "job", datetime(2024, 3, 8, 14, tzinfo=UTC)),
        TemporalMark("a", "job", datetime(2024, 3, 11, 13, tzinfo=UTC)),
    ]
    in_zone = index_of(marks, "America/New_York")
    assert in_zone.profile("a", "job", "hour")[9][1] == 2
    own_offset = index_of(marks)  # the events' own clock (UTC here): two different hours
    assert [h for h, c, _ in own_offset.profile("a", "job", "hour") if c] == [13, 14]


marks_st = st.lists(
    st.builds(
        TemporalMark,
        st.sampled_from(["a", "b"]),
        st.sampled_from(["x", "y", "tool_call:z"]),
        st.datetimes(
            min_value=datetime(2000, 1, 1),
            max_value=datetime(2040, 1, 1),
            timezones=st.sampled_from([UTC, timezone(timedelta(hours=-5))]),
        ),
        st.none() | st.booleans(),
    ),
    max_size=40,
)


@PROPERTY
@given(marks_st, st.randoms(use_true_random=False), st.integers(0, 40))
def test_updates_commute_any_order_any_split(marks, rnd, cut):
    whole = index_of(marks)
    shuffled = list(marks)
    rnd.shuffle(shuffled)
    cut %= len(marks) + 1
    parts = index_of(shuffled[:cut]).merge(index_of(shuffled[cut:]))
    assert parts == whole and index_of(shuffled) == whole
    assert msgspec.json.encode(parts.deltas()) == msgspec.json.encode(whole.deltas())
    assert TemporalIndex.from_deltas(whole.deltas()) == whole
    assert sum(d.count for d in whole.deltas() if d.bin_kind == "hour") == len(marks)
    for kind in BIN_KINDS:  # every mark is in exactly one bin of each kind
        assert sum(d.count for d in whole.deltas() if d.bin_kind == kind) == len(marks)


def _one_cell_at_a_time(marks, tz=None, tz_by_agent=None):
    """The index by its definition: every mark adds 1 to its cell of each bin kind (and to successes
    or failures when judged)."""
    cells = {}
    for agent, kind, at, success in marks:
        for bin_kind, value in zip(BIN_KINDS, bins_of(at, tz_by_agent.get(agent, tz) if tz_by_agent else tz)):
            cell = cells.setdefault((agent, kind, bin_kind, value), [0, 0, 0])
            cell[0] += 1
            cell[1] += success is True
            cell[2] += success is False
    return cells


@PROPERTY
@given(marks_st, st.sampled_from([None, "America/New_York", "Asia/Kolkata"]), st.booleans())
def test_counted_cells_equal_their_definition(marks, tz, per_agent):
    by_agent = {"a": "Europe/Paris"} if per_agent else None
    ix = TemporalIndex()
    ix.add(marks[: len(marks) // 2], tz, by_agent)
    ix.add(marks[len(marks) // 2 :], tz, by_agent)  # adding to cells already there
    assert ix.cells == _one_cell_at_a_time(marks, tz, by_agent)


def test_deltas_are_rows_in_key_order_and_merge_leaves_inputs_alone():
    a = index_of([TemporalMark("b", "k", _at(13, 9), True)])
    b = index_of([TemporalMark("a", "k", _at(13, 9), False)])
    before = dict(a.cells)
    merged = a.merge(b)
    assert a.cells == before and len(merged) == 10
    rows = merged.deltas()
    assert rows == sorted(rows, key=lambda r: (r.agent, r.kind, r.bin_kind, r.bin))
    assert rows[0] == TemporalBinCounted("a", "k", "hour", 9, 1, 0, 1)


# ---- footprint --------------------------------------------------------------------------------


def test_the_index_size_depends_on_kinds_and_bins_not_on_how_many_memories():
    events = list(generate(sessions=400, seed=3))
    episodes = distill({}, [decode_trace(orjson.dumps(e), 1 << 20) for e in events]).episodes  # type: ignore[arg-type]
    half = index_of(m for ep in episodes[:200] for m in marks_of_episode(ep))
    full = index_of(m for ep in episodes for m in marks_of_episode(ep))
    kinds = {(a, k) for a, k, _, _ in full.cells}
    assert len(full) <= len(kinds) * sum(BIN_SIZES.values())  # a bounded number of cells per (agent, kind)
    assert len(full) < 1.6 * len(half)  # twice the memories, far from twice the cells
    raw = msgspec.msgpack.encode([tuple(msgspec.structs.astuple(r)) for r in full.deltas()])
    assert len(raw) / len(full) < 64  # bytes per cell, as msgpack rows
