"""The ordering guard: records applied once, in offset order, with no hole (somnus.streams.ordering).

Unit tests of the pure ``admit`` and of the guard's wiring with fake I/O; the end-to-end proof is
the failover and SIGKILL tests in tests/integration/test_spine.py.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass

from faust.types import TP
from hypothesis import given, settings
from hypothesis import strategies as st

from somnus.streams.ordering import (
    OffsetGuard,
    admit,
    decode_clock,
    decode_position,
    encode_position,
    position_key,
    positions_writer,
)

A = TP("traces", 0)
B = TP("traces", 1)


@dataclass(frozen=True)
class Msg:
    tp: TP
    offset: int


@dataclass(frozen=True)
class Ev:
    message: Msg


def evs(tp: TP, *offsets: int) -> list[Ev]:
    return [Ev(Msg(tp, o)) for o in offsets]


def offs(events) -> list[int]:
    return [e.message.offset for e in events]


def test_records_that_continue_the_position_are_applied_and_move_it():
    out = admit(evs(A, 10, 11, 12), {A: 10})
    assert offs(out.handle) == [10, 11, 12] and out.done == [] and out.positions == {A: 13} and out.holes == {}


def test_a_hole_refuses_the_record_after_it_and_everything_later():
    out = admit(evs(A, 10, 11, 13, 14), {A: 10})
    assert offs(out.handle) == [10, 11]
    assert out.positions == {A: 12} and out.holes == {A: 12}
    assert out.done == []  # 13 and 14 are neither applied nor acknowledged


def test_redelivered_records_are_acknowledged_not_applied_again():
    out = admit(evs(A, 3, 4, 5, 5, 6), {A: 5})
    assert offs(out.handle) == [5, 6]
    assert offs(out.done) == [3, 4, 5]  # the second copy of 5 too
    assert out.positions == {A: 7}


def test_a_batch_that_was_all_applied_before_moves_nothing():
    out = admit(evs(A, 1, 2), {A: 3})
    assert out.handle == [] and offs(out.done) == [1, 2] and out.positions == {} and out.holes == {}


def test_out_of_order_arrival_is_applied_in_offset_order_and_kept_in_arrival_order():
    batch = evs(A, 12, 13) + evs(A, 10, 11)  # what arrives after a rewind: stale records, then the refetch
    out = admit(batch, {A: 10})
    assert sorted(offs(out.handle)) == [10, 11, 12, 13]
    assert offs(out.handle) == [12, 13, 10, 11]  # the processor sorts a session's events by seq
    assert out.positions == {A: 14}


def test_partitions_are_independent():
    out = admit(evs(A, 0, 2) + evs(B, 7, 8), {A: 0, B: 7})
    assert offs(out.handle) == [0, 7, 8]
    assert out.holes == {A: 1} and out.positions == {A: 1, B: 9}


def test_a_known_gap_is_stepped_over():
    out = admit(evs(A, 5, 6), {A: 3}, gaps={A: (3, 5)})
    assert offs(out.handle) == [5, 6] and out.positions == {A: 7} and out.holes == {}


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 60), salt=st.integers(0, 2**32))
def test_any_mix_of_lost_duplicated_and_stale_deliveries_applies_each_record_once_in_order(n, salt):
    """A lossy consumer: each round delivers a chunk from its cursor, dropping and duplicating
    records at random, sometimes replaying stale ones; the guard's rewinds move the cursor back."""
    seed = random.Random(salt)
    applied: list[int] = []
    position = 0
    cursor = 0
    for _ in range(2000):
        if position == n:
            break
        chunk = list(range(cursor, min(n, cursor + seed.randint(1, 8))))
        cursor = chunk[-1] + 1 if chunk else cursor
        delivered = [o for o in chunk if seed.random() > 0.2]
        delivered += [o for o in delivered if seed.random() < 0.1]
        if seed.random() < 0.2 and position:
            delivered = [seed.randrange(0, position)] + delivered
        out = admit(evs(A, *delivered), {A: position})
        applied.extend(sorted(offs(out.handle)))
        position = out.positions.get(A, position)
        if A in out.holes or cursor >= n:
            cursor = position  # the rewind (or the watchdog, for a lost last record)
    assert applied == list(range(n))


def test_positions_are_written_to_the_table_partition_they_belong_to():
    class Table(dict):
        key_partitions: dict = {}

    table = Table()
    table.key_partitions = {}
    positions_writer(table)({B: 42})
    key = position_key("traces", 1)
    assert decode_position(table[key]) == 42 and table.key_partitions[key] == 1
    assert encode_position(42) == b"42" and decode_position(None) is None
    assert not key.decode(errors="replace")[0].isalnum()  # cannot be a session key (agent\x1fsession)
    # with the partition's stream time (somnus.processors.sessions.session_retention), in the same record
    positions_writer(table)({B: 43}, {1: 1_700_000_000_123_456, 2: 5})
    assert table[key] == b"43 1700000000123456"
    assert decode_position(table[key]) == 43 and decode_clock(table[key]) == 1_700_000_000_123_456
    assert decode_clock(b"42") is None and decode_clock(None) is None
    # a position written without a stream time keeps the one stored
    positions_writer(table)({B: 44})
    assert table[key] == b"44 1700000000123456"


class FakeIO:
    def __init__(self, positions: dict[TP, int | None], earliest: int = 0, first_at: int | None = None) -> None:
        self.positions, self.earliest_offset, self.first_at = positions, earliest, first_at
        self.rewinds: list[tuple[TP, int]] = []
        self.asked: list[tuple[TP, int]] = []
        self.now = 100.0

    def guard(self) -> OffsetGuard:
        async def earliest(tp):
            return self.earliest_offset

        async def rewind(tp, offset):
            self.rewinds.append((tp, offset))

        async def first_record_at(tp, offset):
            self.asked.append((tp, offset))
            return self.first_at

        return OffsetGuard(
            position=self.positions.get,
            earliest=earliest,
            rewind=rewind,
            first_record_at=first_record_at,
            clock=lambda: self.now,
            rewind_every_s=1.0,
        )


def test_a_partition_never_applied_starts_at_the_earliest_offset_the_broker_holds():
    io = FakeIO({}, earliest=40)
    out = asyncio.run(io.guard().admit(evs(A, 40, 41)))
    assert offs(out.handle) == [40, 41] and out.positions == {A: 42} and io.rewinds == []


def test_a_hole_rewinds_once_while_stale_records_keep_coming():
    io = FakeIO({A: 10})
    guard = io.guard()
    asyncio.run(guard.admit(evs(A, 12)))
    io.now += 0.3
    asyncio.run(guard.admit(evs(A, 13, 14)))  # fetched before the seek
    assert io.rewinds == [(A, 10)] and guard.holes == 1 and io.asked == []


def test_a_hole_that_survives_a_rewind_is_checked_and_fetched_again_when_the_record_exists():
    io = FakeIO({A: 10}, first_at=10)
    guard = io.guard()
    asyncio.run(guard.admit(evs(A, 12)))
    io.now += 2.0
    asyncio.run(guard.admit(evs(A, 12)))
    assert io.asked == [(A, 10)] and io.rewinds == [(A, 10), (A, 10)] and guard.gaps_stepped == 0


def test_offsets_that_hold_no_record_are_stepped_over():
    io = FakeIO({A: 10}, first_at=12)  # 10 and 11: transaction markers, say
    guard = io.guard()
    asyncio.run(guard.admit(evs(A, 12)))
    io.now += 2.0
    asyncio.run(guard.admit(evs(A, 12)))
    assert guard.gaps_stepped == 1 and io.rewinds[-1] == (A, 12)
    out = asyncio.run(guard.admit(evs(A, 12, 13)))
    assert offs(out.handle) == [12, 13] and out.positions == {A: 14}
    assert guard.gaps == {}


def test_the_workers_rewind_to_offset_0_forgets_fausts_read_offset():
    # Faust's seek_wait (emulated here as it is) moves the read offset only for an offset > 0; the
    # fetch loop drops records below the read offset as already read, so a hole at offset 0 stayed
    # a hole (a stalled SIGKILL test: committed 0, read offset 1206, end 1207).
    from types import SimpleNamespace

    from somnus.streams.app import make_guard

    tp = TP("traces", 1)

    class FaustLikeConsumer:
        def __init__(self) -> None:
            self._gap: dict = {}
            self._read_offset: dict = {tp: 1206}
            self.seeks: list = []

        async def seek_wait(self, partitions: dict) -> None:
            for part, offset in partitions.items():
                self.seeks.append((part, offset))
                if offset > 0:
                    self._read_offset[part] = offset

    consumer = FaustLikeConsumer()
    guard = make_guard(SimpleNamespace(consumer=consumer), "127.0.0.1:9", SimpleNamespace(get=lambda key: None))
    asyncio.run(guard.rewind(tp, 0))
    assert consumer.seeks == [(tp, 0)] and consumer._read_offset[tp] is None
    consumer._read_offset[tp] = 1206
    asyncio.run(guard.rewind(tp, 7))
    assert consumer._read_offset[tp] == 7
