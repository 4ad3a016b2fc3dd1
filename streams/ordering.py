"""Every source record applied once, in offset order, with no hole: the guard of a stateful agent.

Exactly-once results rest on one invariant: the state of a partition (a Faust table, recovered from
its changelog) reflects exactly the records of that partition below some offset, and the next
record applied is the one at that offset. Faust does not guarantee it. Seen in the failover test
(a worker SIGKILLed, the survivor taking over): right after recovery Faust resumes the source
partitions *before* seeking them to their committed offsets, and clears its stream queues when it
resumes the flow; a record sitting in a queue at that moment is never delivered, while the
records after it are. A session whose first record was lost that way was distilled from its
later records only (task empty, 2 of 10 events), and the episode was final. Faust's fetch loop
also marks offsets as read (and, through its "gap" bookkeeping, as acknowledged) when they were
never delivered, so its commits can pass a record that was never applied.

So the agent keeps its own position, in its own table: the key ``position_key(topic, partition)``
holds the next offset to apply. It is written after the states of the same batch, to the same
changelog partition, so a recovered table never has a position ahead of its states (a partition's
records are ordered). ``admit`` splits a batch by that position: records below it were applied
already (redelivered: acknowledged, not applied again), the records that continue it are applied,
and a record beyond it reveals a hole: it and everything after it in that partition are neither
applied nor acknowledged, and ``OffsetGuard`` seeks the partition back to the position. A hole
that survives a rewind is checked against the broker: offsets that hold no record (a transaction
marker, compaction, retention) are stepped over; anything else is fetched again. Commits are
capped at the position (``somnus.streams.kafka_compat.consumer.RewindingConsumer``), so the group's lag is what the
state has not applied, and a lost last record shows as lag the watchdog rewinds.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from faust.types import TP, EventT

log = logging.getLogger("somnus.ordering")

POSITION_PREFIX = b"\x00position\x1f"


def position_key(topic: str, partition: int) -> bytes:
    """Table key of a source partition's position (never a session key: those start with an agent name)."""
    return POSITION_PREFIX + f"{topic}\x1f{partition}".encode()


def encode_position(offset: int, clock: int | None = None) -> bytes:
    """A position, and optionally the partition's stream time (µs) at it (``somnus.processors.sessions.session_retention``):
    written in one record, so a recovered position and its stream time always agree."""
    return str(offset).encode() if clock is None else f"{offset} {clock}".encode()


def decode_position(raw: bytes | None) -> int | None:
    return None if raw is None else int(raw.split(b" ", 1)[0])


def decode_clock(raw: bytes | None) -> int | None:
    """The stream time stored with a position (None: none stored)."""
    parts = raw.split(b" ", 1) if raw is not None else []
    return int(parts[1]) if len(parts) == 2 else None


@dataclass
class Admitted:
    handle: list[EventT] = field(default_factory=list)  # to apply, in arrival order
    done: list[EventT] = field(default_factory=list)  # applied before (redelivered): acknowledge only
    positions: dict[TP, int] = field(default_factory=dict)  # partitions whose next offset moved: the new one
    holes: dict[TP, int] = field(default_factory=dict)  # partition -> the missing offset (refused from there on)


def admit(
    events: Sequence[EventT], start: Mapping[TP, int], gaps: Mapping[TP, tuple[int, int]] | None = None
) -> Admitted:
    """Split ``events`` by the next offset to apply of each partition (``start``).

    ``gaps`` maps a partition to ``(missing, next)``: offsets ``missing .. next-1`` are known to hold
    no record, so the position steps from ``missing`` to ``next``. A pure function.
    """
    gaps = gaps or {}
    by_tp: dict[TP, list[tuple[int, int]]] = {}
    for i, ev in enumerate(events):
        by_tp.setdefault(ev.message.tp, []).append((ev.message.offset, i))
    out = Admitted()
    take: set[int] = set()
    done: set[int] = set()
    for tp, items in by_tp.items():
        expected = start[tp]
        items.sort()
        for offset, i in items:
            gap = gaps.get(tp)
            if gap is not None and gap[0] <= expected < gap[1]:
                expected = gap[1]  # known to hold no record
            if offset < expected:
                done.add(i)  # applied already, or a second copy of one admitted just now
            elif offset == expected:
                take.add(i)
                expected = offset + 1
            else:
                out.holes[tp] = expected
                break
        if expected != start[tp]:
            out.positions[tp] = expected
    out.handle = [ev for i, ev in enumerate(events) if i in take]
    out.done = [ev for i, ev in enumerate(events) if i in done]
    return out


class OffsetGuard:
    """``admit`` against a table's positions, plus what to do about holes.

    ``position`` reads a partition's position (None: nothing applied yet), ``earliest`` the first
    offset the broker holds for a partition, ``rewind`` seeks a partition back, ``first_record_at``
    asks the broker which offset at or after the given one holds the next record (None: none yet),
    ``clock`` is monotonic seconds. A rewind to an offset is repeated at most every
    ``rewind_every_s``: records fetched before it keep arriving for a moment, and they are beyond
    the hole too.
    """

    def __init__(
        self,
        position: Callable[[TP], int | None],
        earliest: Callable[[TP], Awaitable[int]],
        rewind: Callable[[TP, int], Awaitable[None]],
        first_record_at: Callable[[TP, int], Awaitable[int | None]],
        clock: Callable[[], float],
        rewind_every_s: float = 1.0,
    ) -> None:
        self.position, self.earliest, self.rewind = position, earliest, rewind
        self.first_record_at, self.clock, self.rewind_every_s = first_record_at, clock, rewind_every_s
        self.rewound: dict[TP, tuple[int, float]] = {}  # partition -> (offset, when) of its last rewind
        self.gaps: dict[TP, tuple[int, int]] = {}
        self.holes = 0  # holes found (each rewind counts once)
        self.gaps_stepped = 0  # offsets ranges that held no record, stepped over

    async def start_of(self, tps: set[TP]) -> dict[TP, int]:
        out = {}
        for tp in tps:
            pos = self.position(tp)
            out[tp] = pos if pos is not None else await self.earliest(tp)
        return out

    async def admit(self, events: Sequence[EventT]) -> Admitted:
        start = await self.start_of({ev.message.tp for ev in events})
        out = admit(events, start, self.gaps)
        for tp, missing in out.holes.items():
            await self._on_hole(tp, missing)
        for tp, pos in out.positions.items():
            gap = self.gaps.get(tp)
            if gap is not None and pos >= gap[1]:
                del self.gaps[tp]
        return out

    async def _on_hole(self, tp: TP, missing: int) -> None:
        now = self.clock()
        last = self.rewound.get(tp)
        if last is not None and last[0] == missing:
            if now - last[1] < self.rewind_every_s:
                return  # a rewind to it is under way
            # Rewound to it before and it still did not come: does the broker hold a record there?
            found = await self.first_record_at(tp, missing)
            if found is not None and found > missing:
                log.warning(
                    "%s: offsets %d..%d hold no record (transaction marker, compaction or retention): "
                    "stepping over them",
                    tp,
                    missing,
                    found - 1,
                )
                self.gaps[tp] = (missing, found)
                self.gaps_stepped += 1
                self.rewound.pop(tp, None)
                await self.rewind(tp, found)
                return
        else:
            self.holes += 1
            log.warning("%s: record %d was not delivered but later ones were: rewinding to it", tp, missing)
        self.rewound[tp] = (missing, now)
        await self.rewind(tp, missing)

    def forget(self) -> None:
        """After a rebalance: pending rewinds belong to the old assignment."""
        self.rewound.clear()
        self.gaps.clear()


def positions_writer(table: Any) -> Callable[..., None]:
    """Writes positions into a ``BatchedTable`` (queued after the states already set in this batch),
    each with its partition's stream time when ``clocks`` (partition -> µs) has one, else with the one
    stored: a position never forgets its partition's stream time (a batch of records that decoded to
    no event once wrote positions without it, and order checks then changed after bad records)."""

    def write(positions: Mapping[TP, int], clocks: Mapping[int, int] | None = None) -> None:
        for tp, offset in positions.items():
            key = position_key(tp.topic, tp.partition)
            clock = (clocks or {}).get(tp.partition)
            if clock is None:
                clock = decode_clock(table.get(key))
            table.key_partitions[key] = tp.partition
            table[key] = encode_position(offset, clock)

    return write
