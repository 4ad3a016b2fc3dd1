"""How long the distiller remembers a closed session, and what happens to events that come later.

A closed session leaves a small marker in the worker's state so that a late or republished event
of it is recognised. Kept forever, those markers grow with every session a fleet ever ran (about
700 bytes a session in memory, the distiller's marker and working memory's, and the same in the
changelogs the worker recovers from). So a marker is kept for ``retention`` of *stream time* after
the session closed, then forgotten (a tombstone in both tables).

Stream time is per source partition: the latest event time (``ts``) among the events applied on
that partition so far. An event stamped later than its record's timestamp (the broker's append time,
on a traces topic Somnus created) plus the allowed clock skew (``SOMNUS_MAX_CLOCK_SKEW_S``, 5 minutes
by default) is not applied: it is a dead letter of kind ``future`` (``future_reason``). So a runtime
whose clock runs ahead, or that stamps local time as UTC, or a record dated year 2999, can neither
move a partition's stream time into the future (and so expire other sessions' markers, or abandon
other sessions, early) nor put its events into any projection. Stream time is stored with the
partition's position (``somnus.streams.ordering``), so a redelivered record is judged against exactly the
stream time it was first judged against, and every decision here is a function of the partition's
records alone (replays and restarts agree). Records that decode to no event (dead letters) move
neither stream time nor anything else: the worker carries each partition's stream time over a
batch that holds only such records.

For each event, in arrival order (``sift``), with ``w`` the partition's stream time before it and
``clock`` the stream time with it (``max(w, ts)``):

- stamped ahead of its record's time by more than the skew allowed: a dead letter (``future``);

- its session is open: applied;
- its session has a marker that has not expired (``clock <= closed_clock + retention``): a republished
  event (``seq`` already applied) is a duplicate and dropped; one whose ``seq`` the session skipped
  is out of order, and anything else is *late* (the session had ended): both go to the dead-letter
  topic with that reason (``somnus.processors.sessions.distiller.seq_verdict``);
- its session is unknown, or its marker has expired (an expired marker counts as unknown whether or
  not it was removed yet, so removal can happen at any time): the event starts a session unless it
  is older than ``w - retention`` and is not a ``session_start``. Such an event is too late to
  tell from a late event of a forgotten session, and goes to the dead-letter topic. A backfill
  (old sessions imported into a live topic) is accepted: each session begins with its start.

With an idle time (``SOMNUS_SESSION_IDLE_S``, off by default), an open session whose latest event is
older than its partition's stream time by more than it is *abandoned* at the event that moved stream
time there: the distiller closes it as a failure (``somnus.processors.sessions.distiller.abandon``) and it gets a
marker like any session that ended. A runtime that died mid-session no longer leaves its session
open, unlearned from and in the worker's memory, forever.

A session that ends in a batch is judged by its marker for the rest of that batch, as it would be
in a later one; one that starts again after its marker expired starts a new ``Round``, so the
distiller never mixes the two sessions.

A marker is *removed* once ``closed_clock + retention`` is below its partition's stream time
(``expired``), after the batch's position is on the broker (``somnus.streams.app.MarkerRetention``): no
redelivery can meet its absence. Every batch removes every marker that has expired by its end, so
when the stream is idle the set of markers left is a function of the records alone.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone

from somnus.processors.sessions.distiller import (
    APPLY,
    DUPLICATE,
    OUT_OF_ORDER,
    SessionState,
    ended_reason,
    out_of_order_reason,
    event_verdict,
    remember_id,
    seq_verdict,
    session_key,
    skip_to,
)
from somnus.schemas.events import SessionEnded, SessionStarted, TraceEvent, type_name

_US_PER_S = 1_000_000


def micros(ts: datetime) -> int:
    """Microseconds since the epoch of an aware datetime (the unit of stream time)."""
    return int(ts.timestamp()) * _US_PER_S + ts.microsecond


@dataclass
class Round:
    """Events the distiller applies together, after forgetting the markers of ``forget``."""

    events: list[TraceEvent] = field(default_factory=list)
    forget: set[str] = field(default_factory=set)  # sessions to treat as unknown (their marker expired)
    closing: dict[str, int] = field(default_factory=dict)  # session -> stream time right after its end
    # Open sessions closed as abandoned after the round's events (idle too long): session -> the index
    # in the input of the event whose stream time closed it (its time is in ``closing``).
    abandon: dict[str, int] = field(default_factory=dict)
    # Their place among the round's events: how many of them came before it closed (its episode and
    # memory unit go there, so where a batch is cut does not move them).
    abandoned_at: dict[str, int] = field(default_factory=dict)


@dataclass
class Sifted:
    # Usually one round; a session that ends and starts again (same id, marker expired) within the
    # batch starts the next round, so the distiller never mixes the two.
    rounds: list[Round] = field(default_factory=lambda: [Round()])
    late: list[tuple[int, str]] = field(default_factory=list)  # (index in the input, reason): dead letters
    duplicates: int = 0  # republished events of a closed session: dropped
    clocks: dict[int, int] = field(default_factory=dict)  # partition -> stream time (µs) after the batch
    idle_us: int = 0  # the idle time after which an open session was abandoned (0: never)
    future: int = 0  # events stamped ahead of their record's time by more than the clock skew allowed (in late)

    @property
    def admitted(self) -> list[TraceEvent]:
        return [ev for r in self.rounds for ev in r.events]


def expired(marker: SessionState, clock: int | None, retention_us: int) -> bool:
    """Whether a closed session's marker no longer counts at stream time ``clock``."""
    return (
        retention_us > 0
        and clock is not None
        and marker.closed_clock is not None
        and clock > marker.closed_clock + retention_us
    )


def record_cap(timestamp_s: float | None, skew_us: int) -> int | None:
    """The stream-time bound of a record's events (µs): its timestamp (Kafka's, milliseconds, given in
    seconds as Faust does) plus ``skew_us``. None when the record has no timestamp."""
    if timestamp_s is None or timestamp_s < 0:
        return None
    return round(timestamp_s * 1000) * 1000 + skew_us


def is_future(ts: int, cap: int | None) -> bool:
    """Whether an event of time ``ts`` (µs) is later than ``cap`` (its record's broker time plus the
    allowed clock skew; None: no bound): such an event is a dead letter of kind ``future``."""
    return cap is not None and ts > cap


def future_reason(ev: TraceEvent, cap: int) -> str:
    """The dead-letter reason of an event stamped too far ahead of its record (``is_future``)."""
    bound = datetime.fromtimestamp(cap / _US_PER_S, tz=timezone.utc)
    return (
        f"future: this {type_name(ev)} event of session {ev.session_id!r} of agent {ev.agent!r} is stamped "
        f"{ev.ts.isoformat()}, later than its record's broker time plus the clock skew allowed "
        f"(SOMNUS_MAX_CLOCK_SKEW_S): {bound.isoformat()}"
    )


def stream_times(
    events: Sequence[TraceEvent],
    partitions: Sequence[int],
    clocks: Mapping[int, int],
    caps: Sequence[int | None] | None = None,
) -> dict[int, int]:
    """Each partition's stream time after ``events`` (``partitions[i]`` is the partition of ``events[i]``),
    from ``clocks`` before them: what ``sift`` leaves in ``Sifted.clocks`` (``future`` events move nothing)."""
    out = dict(clocks)
    for i, (ev, p) in enumerate(zip(events, partitions)):
        ts = micros(ev.ts)
        if is_future(ts, caps[i] if caps is not None else None):
            continue
        w = out.get(p)
        out[p] = ts if w is None else max(w, ts)
    return out


def abandoned_reason(idle_us: int) -> str:
    """Why a session closed by idleness failed (its episode's failure lesson says it)."""
    return f"abandoned: no event for {idle_us / _US_PER_S:g} s of stream time"


def sift(
    events: Sequence[TraceEvent],
    partitions: Sequence[int],
    clocks: Mapping[int, int],
    prior: Mapping[str, SessionState],
    retention_us: int,
    idle_us: int = 0,
    open_partitions: Mapping[str, int] | None = None,
    caps: Sequence[int | None] | None = None,
) -> Sifted:
    """Decide, event by event in arrival order, what the distiller applies (see the module's text).

    ``partitions[i]`` is the source partition of ``events[i]``; ``clocks`` the stream time of each
    partition before the batch (absent: nothing seen yet); ``retention_us`` <= 0 keeps markers
    forever and accepts every event of an unknown session. A session that ends in the batch is
    judged from then on exactly as its marker would be in a later batch, so where a batch ends
    changes nothing. A pure function.

    With ``idle_us`` > 0, an open session whose latest event is more than ``idle_us`` older than its
    partition's stream time is abandoned at the event that moved stream time there (``Round.abandon``),
    and judged by its marker from then on. ``prior`` must then hold every open session of the batch's
    partitions that can be abandoned in it, and ``open_partitions`` the partition of each open one.

    ``caps[i]`` is the latest time ``events[i]`` may have (its record's broker time plus the allowed
    clock skew; None: no bound): an event stamped later is a dead letter of kind ``future`` and
    changes nothing else (``Sifted.future`` counts them).
    """
    out = Sifted(clocks=dict(clocks), idle_us=max(idle_us, 0))
    marker: dict[str, SessionState] = {k: st for k, st in prior.items() if st.closed}
    # Open sessions: the seqs applied so far (last, skipped ranges), advanced as the distiller will,
    # so a session that ends in the batch gets the marker it will have in a later one.
    progress: dict[str, tuple[int, list[tuple[int, int]], list[int]]] = {
        k: (st.last_seq, st.skipped, st.recent_ids) for k, st in prior.items() if not st.closed
    }
    latest: dict[str, int] = {}  # open session -> event time of its latest applied event (µs)
    idle: dict[int, list[tuple[int, str]]] = {}  # partition -> heap of (latest, session); stale ones skipped
    if idle_us > 0:
        where = open_partitions or {}
        for k, known in prior.items():
            if not known.closed and known.ended_at is not None and k in where:
                latest[k] = micros(known.ended_at)
                idle.setdefault(where[k], []).append((latest[k], k))
        for partition_heap in idle.values():
            heapq.heapify(partition_heap)
    seen: set[str] = set()  # sessions with events in the current round

    def close(key: str, last: int, skipped: list[tuple[int, int]], _ids: list[int], clock: int) -> None:
        """The session is closed: its marker from now on, as the distiller will leave it."""
        del progress[key]
        latest.pop(key, None)
        agent, session_id = key.split("\x1f", 1)  # somnus.processors.sessions.distiller.session_key
        marker[key] = SessionState(
            agent=agent, session_id=session_id, last_seq=last, skipped=skipped, closed=True, closed_clock=clock
        )
        out.rounds[-1].closing[key] = clock

    for i, (ev, p) in enumerate(zip(events, partitions)):
        ts = micros(ev.ts)
        cap = caps[i] if caps is not None else None
        if is_future(ts, cap):
            assert cap is not None
            out.future += 1
            out.late.append((i, future_reason(ev, cap)))
            continue
        w = out.clocks.get(p)
        out.clocks[p] = clock = ts if w is None else max(w, ts)
        heap = idle.get(p)
        while heap and heap[0][0] + idle_us < clock:
            at, k = heapq.heappop(heap)
            if k in progress and latest.get(k) == at:  # still open, and this is its latest event
                close(k, *progress[k], clock)
                out.rounds[-1].abandon[k] = i
                out.rounds[-1].abandoned_at[k] = len(out.rounds[-1].events)
                seen.add(k)
        key = session_key(ev.agent, ev.session_id)
        if key not in progress:
            st = marker.get(key)
            if st is not None and not expired(st, clock, retention_us):
                verdict = seq_verdict(st.last_seq, st.skipped, ev.seq)
                if verdict == DUPLICATE:
                    out.duplicates += 1
                else:
                    out.late.append(
                        (
                            i,
                            out_of_order_reason(ev, st.last_seq)
                            if verdict == OUT_OF_ORDER
                            else ended_reason(ev, st.last_seq),
                        )
                    )
                continue
            if retention_us > 0 and w is not None and ts < w - retention_us and not isinstance(ev, SessionStarted):
                out.late.append(
                    (
                        i,
                        f"late: session {ev.session_id!r} of agent {ev.agent!r} is not open and this "
                        f"{type_name(ev)} event is older than the partition's stream time by more than "
                        f"the retention ({retention_us / _US_PER_S:.0f} s): it may belong to a "
                        "session already forgotten",
                    )
                )
                continue
            if st is not None:  # an expired marker: a new session with that id
                if key in seen:
                    out.rounds.append(Round())
                    seen = set()
                out.rounds[-1].forget.add(key)
                del marker[key]
            progress[key] = (-1, [], [])
        seen.add(key)
        out.rounds[-1].events.append(ev)  # the distiller applies it, or drops or dead-letters it as below
        last, skipped, ids = progress[key]
        if event_verdict(last, skipped, ids, ev) != APPLY:
            continue
        progress[key] = (ev.seq, skip_to(last, skipped, ev.seq), remember_id(ids, ev))
        if isinstance(ev, SessionEnded):
            close(key, ev.seq, skip_to(last, skipped, ev.seq), [], clock)
        elif idle_us > 0 and latest.get(key, -1) < ts:
            latest[key] = ts
            heapq.heappush(idle.setdefault(p, []), (ts, key))
    return out


def stamp_closed(
    states: Mapping[str, SessionState], closing: Mapping[str, int], partition_of: Mapping[str, int]
) -> None:
    """Give each session its source partition, and each that closed in a round its marker's stream time
    (the worker finds the markers that expire, and the open sessions that go idle, by partition)."""
    for key, st in states.items():
        if st.closed and st.closed_clock is None:
            st.closed_clock, st.partition = closing[key], partition_of[key]
        elif st.partition is None:
            st.partition = partition_of[key]


class MarkerHeap:
    """Session keys of the owned partitions by a stream time, popped once it is more than a duration
    behind the partition's: closed sessions' markers by their closing time (expiry after the retention),
    and in the worker open sessions by their latest event (idle, ``somnus.streams.app.IdleSessions``)."""

    def __init__(self) -> None:
        self.heaps: dict[int, list[tuple[int, bytes]]] = {}

    def push(self, partition: int, closed_clock: int, key: bytes) -> None:
        heapq.heappush(self.heaps.setdefault(partition, []), (closed_clock, key))

    def due(self, partition: int, clock: int | None, retention_us: int) -> list[tuple[int, bytes]]:
        """Pop ``(closed_clock, key)`` of every marker of ``partition`` that has expired at ``clock``."""
        heap = self.heaps.get(partition)
        out: list[tuple[int, bytes]] = []
        if retention_us <= 0 or clock is None or not heap:
            return out
        while heap and clock > heap[0][0] + retention_us:
            out.append(heapq.heappop(heap))
        return out

    def __len__(self) -> int:
        return sum(len(h) for h in self.heaps.values())

    @classmethod
    def of(cls, markers: Iterable[tuple[bytes, SessionState]], partitions: set[int]) -> MarkerHeap:
        """Built from a table's closed markers on ``partitions`` (after a restart or a rebalance)."""
        out = cls()
        for key, st in markers:
            if st.closed and st.partition in partitions and st.closed_clock is not None:
                out.heaps.setdefault(st.partition, []).append((st.closed_clock, key))
        for heap in out.heaps.values():
            heapq.heapify(heap)
        return out
