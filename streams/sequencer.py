"""One order of the trace records across partitions, whatever order the fetches return them in.

The distiller writes memory units and facts onto one-partition topics, and observations onto
signature partitions, in the order it handles trace records. Handled as fetched, that order is how
the fetches happened to interleave the trace partitions: two live runs of the same input folded
their memories, facts and causal links in different orders, and left different projections
(docs/design/scale-out.md). The sequencer hands the records on in one order that depends on the
records alone: by the stream time each record brings its partition to (the latest event time seen
on the partition, which never goes back), then partition, then offset. Where batches cut that
order changes nothing (``tests/processors/sessions/test_batch.py``).

A record is handed on once every other partition of the worker has shown a record that sorts
after it, or is *quiet*: its records so far all taken, the broker's high water reached, and
nothing new for ``quiet_s``. A partition that is not quiet is waited for at most ``max_hold_s``;
handing a record on then (``forced``, counted) is the one timing-dependent decision left, taken
only when a partition stalls while others flow, as Kafka Streams' ``max.task.idle.ms`` does.

The high water a fetch reported goes stale when the consumer stops fetching a partition for a while
(flow control, a loaded machine): the partition then looks caught up while the broker holds more of
it. With ``confirm`` on, "caught up" is also asked of the broker once the partition has fallen
silent (``unconfirmed``, then ``confirmed`` with the broker's end offset), so such a partition is
waited for rather than silently passed over (docs/design/scale-out.md).

>>> s = Sequencer(owned=lambda: frozenset({0, 1}), start_clock=lambda p: None, high_water=lambda p: None,
...               quiet_s=1.0, max_hold_s=5.0)
>>> s.push(0, 0, 30, "a0", now=0.0); s.push(0, 1, 50, "a1", now=0.0)
>>> s.ready(now=0.1)  # partition 1 has shown nothing yet: a record of it may sort first
[]
>>> s.push(1, 0, 40, "b0", now=0.2)
>>> s.ready(now=0.2)  # b0 (40) sorts before a1 (50): a1 waits for what partition 1 shows next
['a0', 'b0']
>>> s.ready(now=5.2)  # partition 1 shows nothing for max_hold_s
['a1']
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

import msgspec

from somnus.processors.sessions.session_retention import is_future, micros


class _Stamped(msgspec.Struct):
    ts: datetime


_one = msgspec.json.Decoder(_Stamped)
_many = msgspec.json.Decoder(list[_Stamped])


def latest_time(value: Any, cap: int | None = None) -> int | None:
    """The latest event time (µs) of a trace record's plaintext (one event or a JSON array of them),
    leaving out events later than ``cap`` (they move no stream time: the worker dead-letters them);
    None when there is none or the record cannot be read (it moves no stream time here either).

    >>> latest_time(b'[{"ts": "2024-05-01T00:00:01Z"}, {"ts": "2024-05-01T00:00:00Z"}]')
    1714521601000000
    >>> latest_time(b'not json') is None
    True
    """
    if not isinstance(value, (bytes, bytearray)):
        return None
    try:  # any record, however hostile (nesting deep enough for RecursionError): the worker's
        # dead-letter boundary judges it later, here it only moves no stream time
        items: Sequence[_Stamped] = _many.decode(value) if value.lstrip()[:1] == b"[" else [_one.decode(value)]
        times = [t for t in (micros(it.ts) for it in items if it.ts.tzinfo is not None) if not is_future(t, cap)]
    except Exception:
        return None
    return max(times, default=None)


class Sequencer:
    """Holds records per partition and hands them on in ``(stream time, partition, offset)`` order.

    ``owned()``: the partitions the worker owns now; ``start_clock(p)``: the stream time stored with
    partition p's position (where its running stream time starts after a start or a rebalance);
    ``high_water(p)``: the broker's end offset of p as last fetched (None: unknown); ``start_offset(p)``:
    the offset p is consumed from (the one stored with its position; 0 for a partition never handled),
    what a partition none of whose records has come yet is caught up at."""

    def __init__(
        self,
        owned: Callable[[], frozenset[int]],
        start_clock: Callable[[int], int | None],
        high_water: Callable[[int], int | None],
        quiet_s: float,
        max_hold_s: float,
        start_offset: Callable[[int], int] = lambda p: 0,
        confirm: bool = False,
    ) -> None:
        self.owned, self.start_clock, self.high_water = owned, start_clock, high_water
        self.start_offset = start_offset
        self.quiet_s, self.max_hold_s = quiet_s, max_hold_s
        self.confirm = confirm
        self.ends: dict[int, tuple[int, float]] = {}  # the broker's end offset of a partition, and when asked
        self.queues: dict[int, deque[tuple[tuple[int, int, int], float, Any]]] = {}
        self.clocks: dict[int, int | None] = {}  # running stream time of each partition seen
        self.next_offset: dict[int, int] = {}  # after the last record seen of each partition
        self.last_arrival: dict[int, float] = {}
        self.since: float | None = None  # when the first record since the start (or a rebalance) came
        self.forced = 0  # records handed on because a partition stalled (max_hold_s)

    @property
    def held(self) -> int:
        return sum(len(q) for q in self.queues.values())

    def clear(self) -> None:
        """Forget everything held (a rebalance: the records are delivered again, to their owner)."""
        self.queues.clear()
        self.clocks.clear()
        self.next_offset.clear()
        self.last_arrival.clear()
        self.ends.clear()
        self.since = None

    def push(self, partition: int, offset: int, latest: int | None, item: Any, now: float) -> None:
        """Hold ``item``, the record at ``offset`` of ``partition`` whose latest event time is ``latest``."""
        if self.since is None:
            self.since = now
        if offset < self.next_offset.get(partition, offset):
            self._rewound(partition, offset)
        if partition not in self.clocks:
            self.clocks[partition] = self.start_clock(partition)
        clock = self.clocks[partition]
        if latest is not None and (clock is None or latest > clock):
            clock = self.clocks[partition] = latest
        key = (clock if clock is not None else -1, partition, offset)
        self.queues.setdefault(partition, deque()).append((key, now, item))
        self.next_offset[partition] = offset + 1
        self.last_arrival[partition] = now

    def _rewound(self, partition: int, offset: int) -> None:
        """The partition was sought back to ``offset`` (the ordering guard's rewind to its position):
        what is held from there on comes again, in order, and its stream time starts again from the
        last record kept, or from the one stored with the position."""
        queue = self.queues.get(partition, deque())
        kept = deque(entry for entry in queue if entry[0][2] < offset)
        self.queues[partition] = kept
        if kept:
            self.clocks[partition] = kept[-1][0][0]
        else:
            self.clocks.pop(partition, None)

    def ready(self, now: float) -> list[Any]:
        """The items that may be handed on now, in order."""
        heads = [(q[0][0], p) for p, q in self.queues.items() if q]
        heapq.heapify(heads)
        out: list[Any] = []
        owned = self.owned()
        while heads:
            key, p = heads[0]
            queue = self.queues[p]
            _, arrived, item = queue[0]
            waiting = [q for q in owned if q != p and not self.queues.get(q) and not self._quiet(q, now)]
            if waiting:
                if now - arrived < self.max_hold_s:
                    break
                self.forced += 1
            queue.popleft()
            out.append(item)
            if queue:
                heapq.heapreplace(heads, (queue[0][0], p))
            else:
                heapq.heappop(heads)
        return out

    def _quiet(self, partition: int, now: float) -> bool:
        """Nothing of ``partition`` held, its high water reached, and nothing new for ``quiet_s``.

        A partition none of whose records has come yet is caught up only if the broker has nothing
        after where it is consumed from: taking it for caught up whatever its high water let one
        partition's records go first, all of them, while the consumer had fetched the others but
        not yet handed them to the stream (two live runs differed in 18 tables)."""
        # a partition not seen since the start is given quiet_s from the first record of any
        silent_since = self._silent_since(partition, now)
        if not (self._at_fetched_end(partition) and now - silent_since >= self.quiet_s):
            return False
        if not self.confirm:
            return True
        end = self._asked_since(partition, silent_since)
        return end is not None and self._seen(partition) >= end

    def unconfirmed(self, now: float) -> list[int]:
        """The owned partitions that look quiet by their fetched high water but whose end the broker has
        not been asked for since they fell silent: ask it (``confirmed``) before passing them over."""
        if not self.confirm:
            return []
        out = []
        for p in sorted(self.owned()):
            silent_since = self._silent_since(p, now)
            if self.queues.get(p) or self._asked_since(p, silent_since) is not None:
                continue
            if now - silent_since >= self.quiet_s / 2 and self._at_fetched_end(p):  # silent a while: ask
                out.append(p)
        return out

    def confirmed(self, partition: int, end: int, asked_at: float) -> None:
        """The broker's end offset of ``partition``, asked at ``asked_at`` (before the request went out)."""
        self.ends[partition] = (end, asked_at)

    def _seen(self, partition: int) -> int:
        """The offset after the last record of ``partition`` seen, or where it is consumed from."""
        seen = self.next_offset.get(partition)
        return self.start_offset(partition) if seen is None else seen

    def _at_fetched_end(self, partition: int) -> bool:
        high = self.high_water(partition)
        return high is not None and self._seen(partition) >= high

    def _silent_since(self, partition: int, now: float) -> float:
        return self.last_arrival.get(partition, self.since or now)

    def _asked_since(self, partition: int, silent_since: float) -> int | None:
        """The broker's end offset of ``partition`` if it was asked since ``silent_since``."""
        end = self.ends.get(partition)
        return end[0] if end is not None and end[1] >= silent_since else None
