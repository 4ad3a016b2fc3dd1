"""The trace records' one order across partitions (streams/sequencer.py): whatever order the fetches
deliver the partitions' records in, and wherever the hand-overs fall, the same order comes out."""

from __future__ import annotations

import random
from datetime import datetime, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from somnus.streams.sequencer import Sequencer, latest_time


def _sequencer(
    partitions: int,
    high: dict[int, int] | None = None,
    quiet_s: float = 2.0,
    max_hold_s: float = 10.0,
    confirm: bool = False,
) -> Sequencer:
    return Sequencer(
        owned=lambda: frozenset(range(partitions)),
        start_clock=lambda p: None,
        high_water=lambda p: (high or {}).get(p),
        quiet_s=quiet_s,
        max_hold_s=max_hold_s,
        confirm=confirm,
    )


# Each partition: the latest event time of each of its records, in offset order (times go back too).
partition_times = st.lists(st.lists(st.integers(0, 50), min_size=1, max_size=12), min_size=1, max_size=4)


@given(partition_times, st.randoms(use_true_random=False), st.integers(1, 6))
def test_the_order_is_the_same_whatever_the_interleaving_of_the_partitions(times, rng, chunk):
    def run(rng: random.Random | None) -> list[tuple[int, int]]:
        high = {p: len(ts) for p, ts in enumerate(times)}
        s = _sequencer(len(times), high)
        pending = {p: list(enumerate(ts)) for p, ts in enumerate(times)}
        out: list[tuple[int, int]] = []
        now = 0.0
        while any(pending.values()):
            p = rng.choice([q for q in pending if pending[q]]) if rng else min(q for q in pending if pending[q])
            take, pending[p] = pending[p][:chunk], pending[p][chunk:]  # a fetch: a few records of one partition
            for offset, t in take:
                s.push(p, offset, t, (p, offset), now)
            out += s.ready(now)
            now += 0.01
        out += s.ready(now + 60.0)  # the end of the input: every partition caught up and quiet
        assert s.forced == 0 and not s.held
        return out

    canonical = run(None)
    assert run(rng) == canonical
    assert sorted(canonical) == sorted((p, o) for p, ts in enumerate(times) for o in range(len(ts)))
    for p in range(len(times)):  # a partition's records keep their offset order
        assert [o for q, o in canonical if q == p] == list(range(len(times[p])))


def test_stream_time_orders_the_partitions_and_never_goes_back():
    s = _sequencer(2, {0: 3, 1: 2})
    for offset, t in enumerate((10, 30, 20)):  # the third record's events are older: its partition stays at 30
        s.push(0, offset, t, f"a{offset}", now=0.0)
    for offset, t in enumerate((15, 25)):
        s.push(1, offset, t, f"b{offset}", now=0.0)
    assert s.ready(now=0.0) == ["a0", "b0", "b1"]  # a1 (30) waits: partition 1 may still show a record before it
    assert s.ready(now=1.0) == []
    assert s.ready(now=2.0) == ["a1", "a2"]  # partition 1 caught up and quiet for 2 s


def test_a_partition_that_is_not_caught_up_is_waited_for_then_passed_and_counted():
    s = _sequencer(2, {0: 1, 1: 5}, max_hold_s=10.0)  # partition 1 has records on the broker not fetched yet
    s.push(0, 0, 10, "a0", now=0.0)
    assert s.ready(now=9.9) == []
    assert s.ready(now=10.0) == ["a0"] and s.forced == 1


def test_a_partition_none_of_whose_records_came_yet_is_caught_up_only_at_its_high_water():
    """The consumer had fetched every partition (high waters known) but handed one partition's
    records to the stream first: the others, unseen, were taken for caught up and quiet after 2 s,
    and that partition went first entirely (two live runs of one input differed in 18 tables)."""
    start = {1: 0, 2: 7}
    s = Sequencer(
        owned=lambda: frozenset({0, 1, 2}),
        start_clock=lambda p: None,
        high_water=lambda p: {0: 2, 1: 5, 2: 7}[p],
        quiet_s=2.0,
        max_hold_s=10.0,
        start_offset=lambda p: start.get(p, 0),
    )
    s.push(0, 0, 10, "a0", now=100.0)
    s.push(0, 1, 20, "a1", now=100.0)
    assert s.ready(now=105.0) == []  # partition 1 has 5 records on the broker from offset 0; 2 is at its end
    s.push(1, 0, 15, "b0", now=105.0)
    assert s.ready(now=105.0) == ["a0", "b0"] and s.forced == 0
    start[1] = 5  # a restart: partition 1 handled up to its high water before
    fresh = Sequencer(
        owned=lambda: frozenset({0, 1}),
        start_clock=lambda p: None,
        high_water=lambda p: {0: 1, 1: 5}[p],
        quiet_s=2.0,
        max_hold_s=10.0,
        start_offset=lambda p: start.get(p, 0),
    )
    fresh.push(0, 0, 10, "a0", now=100.0)
    assert fresh.ready(now=102.0) == ["a0"] and fresh.forced == 0


def test_a_rebalance_forgets_what_is_held():
    s = _sequencer(2)
    s.push(0, 0, 10, "a0", now=0.0)
    s.clear()
    assert s.held == 0 and s.ready(now=100.0) == []


def test_the_latest_time_leaves_out_events_later_than_the_cap():
    raw = b'[{"ts": "2024-05-01T00:00:00Z"}, {"ts": "2024-05-02T00:00:00Z"}]'
    first, second = 1714521600000000, 1714608000000000
    assert latest_time(raw) == second
    assert latest_time(raw, cap=first) == first
    assert latest_time(b'{"ts": "2024-05-01T00:00:00Z", "seq": 1}') == first
    assert latest_time(b'[{"ts": 3}]') is None and latest_time(None) is None


def test_a_partition_sought_back_drops_what_comes_again_and_restarts_its_stream_time():
    stored = {0: 5}
    s = Sequencer(
        owned=lambda: frozenset({0}),
        start_clock=lambda p: stored.get(p),
        high_water=lambda p: None,
        quiet_s=2.0,
        max_hold_s=10.0,
    )
    for offset, t in enumerate((10, 40, 20)):
        s.push(0, offset, t, f"a{offset}", now=0.0)
    s.push(0, 1, 20, "a1 again", now=0.0)  # the guard rewound to offset 1: a1 and a2 come again, in order
    assert [(key, item) for key, _, item in s.queues[0]] == [((10, 0, 0), "a0"), ((20, 0, 1), "a1 again")]
    s.push(0, 0, 7, "a0 again", now=0.0)  # back to the start: the stored stream time again
    assert [(key, item) for key, _, item in s.queues[0]] == [((7, 0, 0), "a0 again")]


@pytest.mark.parametrize(
    "value",
    [
        b"[" * 100_000 + b"]" * 100_000,  # RecursionError in msgspec, not a DecodeError
        b'{"ts": "2024-05-01T00:00:01Z", "x": ' + b"[" * 5_000 + b"]" * 5_000 + b"}",
        b'{"ts": "\xff\xfe"}',  # invalid UTF-8
        b'{"ts": "\\ud800"}',  # a lone surrogate
        b'[{"ts": "9999-12-31T23:59:59Z"}]',
        b"",
    ],
)
def test_a_hostile_record_moves_no_stream_time_and_raises_nothing(value: bytes) -> None:
    got = latest_time(value, cap=int(datetime(2030, 1, 1, tzinfo=timezone.utc).timestamp() * 1_000_000))
    assert got is None


def test_a_partition_whose_fetched_high_water_is_stale_is_waited_for_until_the_broker_says_caught_up():
    """The consumer stopped fetching partition 1 for a while: by its last fetch it is caught up, but the
    broker holds more of it. Passed over as quiet after 2 s, its records came after the other
    partition's later ones (two live runs' memory orders parted at unit 331 of 1500)."""
    s = _sequencer(2, {0: 2, 1: 1}, confirm=True)  # partition 1's last fetch said 1
    s.push(1, 0, 5, "b0", now=0.0)
    s.push(0, 0, 10, "a0", now=0.0)
    s.push(0, 1, 30, "a1", now=0.0)
    assert s.ready(now=0.0) == ["b0"]
    assert s.unconfirmed(now=0.5) == []  # silent for less than quiet_s / 2: not asked yet
    assert s.unconfirmed(now=1.5) == [1]
    s.confirmed(1, 3, asked_at=1.5)  # the broker has offsets 1 and 2 still to come
    assert s.unconfirmed(now=2.5) == [] and s.ready(now=2.5) == []  # not quiet: a0 waits
    s.push(1, 1, 20, "b1", now=3.0)
    assert s.ready(now=3.0) == ["a0", "b1"]  # b1 (20) before a1 (30): the order the records give
    s.push(1, 2, 40, "b2", now=3.0)
    assert s.ready(now=3.0) == ["a1"]
    assert s.ready(now=6.0) == []  # partition 0 has nothing held: b2 waits for it to be confirmed quiet
    assert s.unconfirmed(now=6.0) == [0]
    s.confirmed(0, 2, asked_at=6.0)
    assert s.ready(now=6.0) == ["b2"] and s.forced == 0


def test_an_old_answer_of_the_broker_does_not_make_a_partition_quiet():
    s = _sequencer(2, {0: 1, 1: 2}, confirm=True)
    s.push(1, 0, 5, "b0", now=0.0)
    s.confirmed(1, 1, asked_at=0.5)
    s.push(1, 1, 6, "b1", now=1.0)  # arrived after the broker was asked
    s.push(0, 0, 10, "a0", now=1.0)
    assert s.ready(now=4.0) == ["b0", "b1"]  # a0 waits: partition 1's answer predates its last record
    assert s.unconfirmed(now=4.0) == [1]
    s.confirmed(1, 2, asked_at=4.0)
    assert s.ready(now=4.0) == ["a0"]
