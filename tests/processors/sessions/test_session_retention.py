"""somnus.processors.sessions.session_retention: closed sessions forgotten after a retention of stream time; late events judged
against the stream time they arrived at, so batch boundaries and restarts never change a decision."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from somnus.processors.sessions.distiller import SessionState, distill, session_key
from somnus.processors.sessions.session_retention import MarkerHeap, expired, micros, sift, stream_times
from tests.factories import decoded_event

HOUR_US = 3600 * 1_000_000
T0 = datetime(2026, 3, 1, 9, 0, tzinfo=timezone.utc)


def _event(session: str, seq: int, kind: str, at: datetime, agent: str = "support") -> object:
    return decoded_event(session, seq, kind, at, agent=agent)


def _closed(session: str, last_seq: int, clock: int, partition: int = 0) -> SessionState:
    return SessionState(
        agent="support", session_id=session, last_seq=last_seq, closed=True, closed_clock=clock, partition=partition
    )


def test_events_of_open_sessions_are_applied_and_each_partition_keeps_its_own_stream_time():
    evs = [
        _event("a", 0, "session_start", T0),
        _event("b", 0, "session_start", T0 + timedelta(hours=5)),
        _event("a", 1, "agent_message", T0 + timedelta(minutes=1)),
    ]
    out = sift(evs, [0, 1, 0], {}, {}, HOUR_US)
    assert out.admitted == evs and out.late == [] and len(out.rounds) == 1 and out.rounds[0].forget == set()
    assert out.clocks == {0: micros(T0 + timedelta(minutes=1)), 1: micros(T0 + timedelta(hours=5))}


def test_a_republished_event_of_a_closed_session_is_a_duplicate_and_a_new_one_is_late():
    prior = {session_key("support", "a"): _closed("a", 5, micros(T0))}
    evs = [_event("a", 3, "agent_message", T0), _event("a", 6, "agent_message", T0 + timedelta(minutes=5))]
    out = sift(evs, [0, 0], {0: micros(T0)}, prior, HOUR_US)
    assert out.admitted == [] and out.duplicates == 1
    assert [i for i, _ in out.late] == [1]
    assert "had ended (seq 5)" in out.late[0][1] and "agent_message event has seq 6" in out.late[0][1]


def test_an_expired_marker_counts_as_unknown_whether_or_not_it_was_removed():
    marker = _closed("a", 5, micros(T0))
    later = T0 + timedelta(hours=3)
    clock = {0: micros(later)}
    # an old event of the forgotten session: too late to tell, dead-lettered (same with no marker)
    old = [_event("a", 6, "agent_message", T0)]
    with_marker = sift(old, [0], clock, {session_key("support", "a"): marker}, HOUR_US)
    without = sift(old, [0], clock, {}, HOUR_US)
    assert [i for i, _ in with_marker.late] == [i for i, _ in without.late] == [0]
    assert (
        with_marker.late[0][1] == without.late[0][1] and "older than the partition's stream time" in without.late[0][1]
    )
    # a session_start with that id starts a new session, also with no marker
    again = [_event("a", 0, "session_start", T0), _event("a", 1, "agent_message", later)]
    for prior in ({session_key("support", "a"): marker}, {}):
        out = sift(again, [0, 0], clock, prior, HOUR_US)
        assert out.admitted == again and out.late == []


def test_an_unknown_session_is_accepted_unless_its_event_is_older_than_the_retention_and_not_a_start():
    clock = {0: micros(T0 + timedelta(hours=10))}
    recent = _event("n", 2, "agent_message", T0 + timedelta(hours=9, minutes=30))
    stale = _event("m", 2, "agent_message", T0)
    backfill = _event("k", 0, "session_start", T0 - timedelta(days=300))
    out = sift([recent, stale, backfill], [0, 0, 0], clock, {}, HOUR_US)
    assert out.admitted == [recent, backfill] and [i for i, _ in out.late] == [1]
    # retention 0 (keep forever): every event of an unknown session is accepted, no marker expires
    keep = sift([recent, stale, backfill], [0, 0, 0], clock, {}, 0)
    assert keep.admitted == [recent, stale, backfill]
    assert not expired(_closed("a", 1, 0), micros(T0), 0)


def test_the_marker_heap_pops_what_expired_and_is_rebuilt_from_markers_of_owned_partitions():
    heap = MarkerHeap()
    for i, clock in enumerate([5, 1, 3]):
        heap.push(0, clock * HOUR_US, f"k{i}".encode())
    heap.push(1, 0, b"other")
    assert heap.due(0, 4 * HOUR_US + 1, HOUR_US) == [(HOUR_US, b"k1"), (3 * HOUR_US, b"k2")]
    assert heap.due(0, 4 * HOUR_US + 1, HOUR_US) == [] and len(heap) == 2
    assert heap.due(0, 10 * HOUR_US, 0) == []  # retention 0: never
    rebuilt = MarkerHeap.of(
        [
            (b"x", _closed("x", 1, 7, partition=2)),
            (b"y", _closed("y", 1, 7, partition=3)),
            (b"o", SessionState(agent="support", session_id="o")),
        ],
        {2},
    )
    assert len(rebuilt) == 1 and rebuilt.due(2, 7 + HOUR_US + 1, HOUR_US) == [(7, b"x")]


def test_a_session_that_ends_is_judged_by_its_marker_for_the_rest_of_the_batch():
    start, end = _event("a", 0, "session_start", T0), _event("a", 1, "session_end", T0 + timedelta(minutes=1))
    again, more = _event("a", 1, "session_end", T0 + timedelta(minutes=1)), _event("a", 2, "agent_message", T0)
    out = sift([start, end, again, more], [0] * 4, {}, {}, HOUR_US)
    assert out.admitted == [start, end] and out.duplicates == 1 and [i for i, _ in out.late] == [3]
    assert out.rounds[0].closing == {session_key("support", "a"): micros(T0 + timedelta(minutes=1))}


def test_a_session_id_started_again_after_its_marker_expired_in_the_batch_opens_a_second_round():
    first = [_event("a", 0, "session_start", T0), _event("a", 1, "session_end", T0)]
    other = _event("b", 0, "session_start", T0 + timedelta(hours=3))
    second = [
        _event("a", 0, "session_start", T0 + timedelta(hours=3)),
        _event("a", 1, "agent_message", T0 + timedelta(hours=3)),
    ]
    out = sift([*first, other, *second], [0] * 5, {}, {}, HOUR_US)
    assert [r.events for r in out.rounds] == [[*first, other], second]
    assert out.rounds[1].forget == {session_key("support", "a")} and out.late == []
    # the same events with the batch cut after the first session: the marker path, one round
    prior = {session_key("support", "a"): _closed("a", 1, micros(T0))}
    cut = sift([other, *second], [0] * 3, {0: micros(T0)}, prior, HOUR_US)
    assert cut.admitted == [other, *second] and cut.rounds[0].forget == {session_key("support", "a")}


def test_a_seq_skipped_before_the_end_is_out_of_order_after_it_in_the_batch_and_in_a_later_one():
    start, end = _event("a", 0, "session_start", T0), _event("a", 3, "session_end", T0 + timedelta(minutes=1))
    skipped, again = _event("a", 2, "agent_message", T0), _event("a", 0, "session_start", T0)
    out = sift([start, end, skipped, again], [0] * 4, {}, {}, HOUR_US)
    assert out.admitted == [start, end] and out.duplicates == 1 and [i for i, _ in out.late] == [2]
    assert out.late[0][1].startswith("order: ") and "seq 2, skipped earlier" in out.late[0][1]
    # the marker the distiller leaves says the same in a later batch
    marker = distill({}, [start, end]).states[session_key("support", "a")]
    marker.closed_clock, marker.partition = out.rounds[0].closing[session_key("support", "a")], 0
    assert marker.skipped == [(1, 2)]
    later = sift([skipped, again], [0, 0], out.clocks, {session_key("support", "a"): marker}, HOUR_US)
    assert later.duplicates == 1 and [(i, r) for i, r in later.late] == [(0, out.late[0][1])]


def test_an_end_that_arrives_after_a_higher_seq_does_not_close_the_session():
    start, msg = _event("a", 0, "session_start", T0), _event("a", 5, "agent_message", T0)
    end = _event("a", 2, "session_end", T0 + timedelta(minutes=1))  # skipped earlier: out of order
    more = _event("a", 6, "agent_message", T0 + timedelta(minutes=2))
    out = sift([start, msg, end, more], [0] * 4, {}, {}, HOUR_US)
    # all go to the distiller (which dead-letters the end); the session stays open, no marker
    assert out.admitted == [start, msg, end, more] and out.late == [] and out.rounds[0].closing == {}


def _open(session: str, last_seq: int, latest: datetime, partition: int = 0) -> SessionState:
    return SessionState(
        agent="support", session_id=session, last_seq=last_seq, started_at=T0, ended_at=latest, partition=partition
    )


def test_an_open_session_idle_for_longer_than_the_idle_time_is_abandoned_at_the_event_that_makes_it_so():
    a, b = session_key("support", "a"), session_key("support", "b")
    prior = {a: _open("a", 1, T0), b: _open("b", 0, T0 + timedelta(minutes=30), partition=1)}
    evs = [
        _event("c", 0, "session_start", T0 + timedelta(minutes=59)),  # a: 59 min idle, still open
        _event("c", 1, "agent_message", T0 + timedelta(minutes=61)),  # a: 61 min: abandoned here
        _event("a", 2, "agent_message", T0 + timedelta(minutes=62)),  # then late
        _event("b", 1, "agent_message", T0 + timedelta(hours=5)),
    ]  # b's partition: b's own event, 4.5 h on
    out = sift(evs, [0, 0, 0, 1], {0: micros(T0), 1: micros(T0)}, prior, 0, HOUR_US, {a: 0, b: 1})
    assert out.rounds[0].abandon == {a: 1, b: 3} and out.idle_us == HOUR_US
    assert out.rounds[0].closing == {a: micros(T0 + timedelta(minutes=61)), b: micros(T0 + timedelta(hours=5))}
    assert out.admitted == evs[:2] and [i for i, _ in out.late] == [2, 3]
    assert "had ended (seq 1)" in out.late[0][1]
    # without an idle time nothing is abandoned
    never = sift(evs, [0, 0, 0, 1], {0: micros(T0), 1: micros(T0)}, prior, 0)
    assert never.rounds[0].abandon == {} and never.admitted == evs


def test_a_session_that_keeps_receiving_events_is_never_idle():
    evs = [_event("a", 0, "session_start", T0)] + [
        _event("a", k, "agent_message", T0 + timedelta(minutes=50 * k)) for k in range(1, 6)
    ]
    out = sift(evs, [0] * len(evs), {}, {}, 0, HOUR_US, {})
    assert out.rounds[0].abandon == {} and out.admitted == evs


def test_stream_times_are_the_clocks_sift_leaves():
    evs = [
        _event("a", 0, "session_start", T0 + timedelta(hours=2)),
        _event("b", 0, "session_start", T0),
        _event("a", 1, "agent_message", T0 + timedelta(hours=1)),
    ]
    clocks = {1: micros(T0 + timedelta(hours=5)), 3: 7}
    assert (
        stream_times(evs, [0, 1, 0], clocks)
        == sift(evs, [0, 1, 0], clocks, {}, HOUR_US).clocks
        == {0: micros(T0 + timedelta(hours=2)), 1: micros(T0 + timedelta(hours=5)), 3: 7}
    )


def test_an_event_stamped_ahead_of_its_record_by_more_than_the_skew_is_a_future_dead_letter_that_moves_nothing():
    from somnus.processors.sessions.session_retention import record_cap

    skew = 5 * 60 * 1_000_000
    arrival = T0 + timedelta(minutes=2)  # the records' broker time
    cap = record_cap(arrival.timestamp(), skew)
    assert cap == micros(arrival) + skew and record_cap(None, skew) is None and record_cap(-1.0, skew) is None
    a, o = session_key("support", "a"), session_key("support", "o")
    prior = {a: _closed("a", 2, micros(T0 + timedelta(seconds=30))), o: _open("o", 1, T0 + timedelta(minutes=1))}
    # a runtime whose clock is a day ahead (or that stamps local time as UTC), then a's end republished
    evs = [_event("s", 0, "session_start", T0 + timedelta(days=1), agent="skewed"), _event("a", 2, "session_end", T0)]
    parts, clocks = [0, 0], {0: micros(T0 + timedelta(minutes=1))}
    bounded = sift(evs, parts, clocks, prior, HOUR_US, HOUR_US // 6, {o: 0}, caps=[cap, cap])
    assert bounded.clocks == clocks == stream_times(evs, parts, clocks, [cap, cap]) and bounded.future == 1
    # the skewed event is a dead letter of kind future; a's marker still counts (a duplicate, dropped),
    # o is not idle
    assert [i for i, _ in bounded.late] == [0] and bounded.late[0][1].startswith("future: this session_start event")
    assert "2026-03-02T09:00:00+00:00" in bounded.late[0][1] and "2026-03-01T09:07:00+00:00" in bounded.late[0][1]
    assert bounded.duplicates == 1 and bounded.rounds[0].abandon == {} and bounded.admitted == []
    # unbounded, the one event a day ahead forgets a's marker and abandons o
    free = sift(evs, parts, clocks, prior, HOUR_US, HOUR_US // 6, {o: 0})
    assert free.clocks == {0: micros(T0 + timedelta(days=1))} and free.future == 0
    assert [i for i, _ in free.late] == [1] and "may belong to a session already forgotten" in free.late[0][1]
    assert free.rounds[0].abandon == {o: 0}
    # an event within the skew is applied and moves stream time to its own time
    near = _event("n", 0, "session_start", arrival + timedelta(minutes=4))
    assert sift([near], [0], {}, {}, HOUR_US, caps=[cap]).clocks == {0: micros(near.ts)}
    year_2999 = _event("y", 0, "session_start", datetime(2999, 1, 1, tzinfo=timezone.utc))
    assert sift([year_2999], [0], {}, {}, HOUR_US, caps=[cap]).late[0][1].startswith("future: ")


def test_an_event_sent_again_under_another_seq_is_applied_once_by_sift_and_the_distiller_alike():
    import msgspec

    start, msg = _event("r", 0, "session_start", T0), _event("r", 1, "agent_message", T0)
    copy = msgspec.structs.replace(msg, seq=2)  # msg sent again under a new seq: a duplicate by its id
    end = msgspec.structs.replace(_event("r", 3, "session_end", T0), seq=3)
    evs = [start, msg, copy, end]
    out = sift(evs, [0] * 4, {}, {}, HOUR_US)
    assert out.late == [] and list(out.rounds[0].closing) == [session_key("support", "r")]
    got = distill({}, out.admitted)
    (state,) = got.states.values()
    assert got.duplicates == 1 and state.closed and got.episodes[0].event_count == 3
    assert state.recent_ids == []  # a marker keeps no ids
    # cut anywhere, the same
    for cut in range(1, 4):
        first = sift(evs[:cut], [0] * cut, {}, {}, HOUR_US)
        mid = distill({}, first.admitted)
        second = sift(evs[cut:], [0] * (4 - cut), first.clocks, mid.states, HOUR_US)
        after = distill(mid.states, second.admitted)
        assert after.states[session_key("support", "r")] == state
        assert mid.duplicates + after.duplicates == 1 and second.late == []
