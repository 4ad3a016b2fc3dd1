"""The episodic memory projection: the capture fold over the one-partition ``memory`` topic.

The worker publishes memory units (episodes, and the messages of conversational sessions) on
``memory``; the projector (the only writer) folds them in offset order with
``somnus.processors.episodic.capture.capture``: every decision (stored, merged, linked) and every access (published
back on ``memory`` by recall) is appended to ``memory_log`` in the transaction of the batch that
consumed it. The in-memory index that answers recall is rebuilt at start by replaying the log, never
by deciding again, so a restarted or replayed projector holds the same memory.

Derived tables: ``memories`` (one row per stored memory), ``memory_merges``, ``memory_edges``,
``memory_access`` — each a plain projection of the log.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

import duckdb
import msgspec
import pyarrow as pa

from somnus.processors.episodic.capture import MemoryState, apply, capture
from somnus.processors.episodic.index import IndexConfig
from somnus.processors.prediction.oscillators import OscillatorState, observe
from somnus.processors.sleep.schedule import bounded_time
from somnus.schemas.lifecycle import KIND_SLEEP
from somnus.schemas.lifecycle import SleepRequested, SleepTrigger
from somnus.projections.frames import registered
from somnus.projections.goals import KINDS as GOAL_KINDS
from somnus.projections.goals import GoalsProjection
from somnus.schemas.memory import (
    KIND_ACCESS,
    CaptureAction,
    CaptureDecided,
    MemoryAccessed,
    MemoryEvent,
    MemoryLinked,
    MemoryUnit,
)
import functools
import snowballstemmer

log = logging.getLogger("somnus.projector")

_units_decoder = msgspec.json.Decoder(list[MemoryUnit])
_access_decoder = msgspec.json.Decoder(list[MemoryAccessed])
_event_decoder = msgspec.json.Decoder(MemoryEvent)
_sleep_decoder = msgspec.json.Decoder(SleepRequested)
_encoder = msgspec.json.Encoder()
# Records of a batch folded and inserted at once (``MemoryProjection.write``): at 20,000 (a whole
# batch) the decoded units, their analyses and log rows added 400 MB to the projector's peak.
MEMORY_CHUNK = 1_000


def stemmer() -> Any:
    """The English Snowball stemmer (fixed: the index of a replay must tokenise the same way).

    Memoised: it is pure Python (~100 µs a word) and a fleet's vocabulary repeats."""
    return functools.lru_cache(maxsize=1 << 18)(snowballstemmer.stemmer("english").stemWord)


def new_state() -> MemoryState:
    return MemoryState.empty(IndexConfig(stem=stemmer()))


def _record_time(record: Any) -> datetime | None:
    """The record's timestamp (in the log, so a replay sees the same), or None without one."""
    ms = getattr(record, "timestamp", None)
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc) if ms is not None and ms >= 0 else None


def _ts(record: Any, units: Sequence[MemoryUnit]) -> datetime:
    """The decision time: the record's timestamp, else its units' latest time."""
    at = _record_time(record)
    if at is not None:
        return at
    return max((u.occurred_at for u in units), default=datetime(1970, 1, 1, tzinfo=timezone.utc))


def at_event_time(decided: Sequence[MemoryEvent]) -> list[MemoryEvent]:
    """Capture's decisions stamped with the event time of the unit decided (a link with that of the
    unit whose decision formed it), not with the record's timestamp: that is the worker's wall clock
    at send, so two live runs of the same input never agreed on ``decided_at`` or ``formed_at``
    (docs/design/scale-out.md). ``apply`` reads neither, so the state is the same either way.

    >>> from datetime import datetime, timezone
    >>> from somnus.schemas.memory import MemoryKind
    >>> t = datetime(2024, 5, 1, tzinfo=timezone.utc)
    >>> u = MemoryUnit(memory_id="m", kind=MemoryKind.MESSAGE, agent="a", scope="agent:a", run_id="s",
    ...                position=0, occurred_at=t, perception="hi")
    >>> ev = CaptureDecided(schema_version=1, unit=u, action=CaptureAction.STORED, memory_id="m", reasons=[],
    ...                     prediction_error=1.0, decided_at=datetime.now(timezone.utc))
    >>> at_event_time([ev])[0].decided_at == t
    True
    """
    out: list[MemoryEvent] = []
    at: datetime | None = None
    for ev in decided:
        if isinstance(ev, CaptureDecided):
            at = ev.unit.occurred_at
            ev = msgspec.structs.replace(ev, decided_at=at)
        elif isinstance(ev, MemoryLinked) and at is not None:
            ev = msgspec.structs.replace(ev, formed_at=at)
        out.append(ev)
    return out


class MemoryProjection:
    """The capture fold's state (replayed from ``memory_log`` at start) and its writes; deep sleep
    runs inside the fold (``projections/sleep.py``) when ``sleep`` is given."""

    def __init__(
        self, con: duckdb.DuckDBPyConnection, sleep: Any = None, oscillators: Any = None, agents: Any = None
    ) -> None:
        self.state = new_state()
        self.goals = GoalsProjection(con, agents)  # goals and their forward PE (projections/goals.py)
        self.next_ord = 0
        self.sleep = sleep
        self.oscillators = oscillators  # an OscillatorConfig when enabled (SOMNUS_OSCILLATORS), else None
        self.rhythms: dict[tuple[str, str], Any] = {}  # (agent, kind) -> OscillatorState
        self.readings: list[dict[str, Any]] = []  # anomaly readings of this batch, for oscillator_readings
        self.rhythms_changed: set[tuple[str, str]] = set()
        self.reload(con)

    def reload(self, con: duckdb.DuckDBPyConnection) -> None:
        """Rebuild the state from the committed log (at start, and after a rolled-back batch)."""
        self.state = new_state()
        cur = con.execute("SELECT body FROM memory_log ORDER BY ord")
        n = 0
        while rows := cur.fetchmany(10_000):
            for (body,) in rows:
                apply(self.state, _event_decoder.decode(body))
                n += 1
        self.next_ord = n
        self.goals.reload(con)
        if self.sleep is not None:
            self.sleep.reload(con)
        self.rhythms = {
            (a, k): msgspec.json.decode(st, type=OscillatorState)
            for a, k, st in con.execute("SELECT agent, kind, state FROM oscillators").fetchall()
        }
        self.rhythms_changed.clear()
        self.readings.clear()
        if n:
            log.info("memory index rebuilt from %d logged events (%d memories)", n, len(self.state.index))

    def write(self, con: duckdb.DuckDBPyConnection, records: Sequence[tuple[bytes | None, Any]]) -> int:
        """Fold ``(kind, record)`` pairs in order and write what they decided (caller's transaction)."""
        logged = 0
        # A chunk of records at a time, decoded, folded and inserted: a batch's units, their analyses,
        # decisions and log rows are held for one chunk, not the whole batch (issue #30). The fold
        # reads none of the tables it writes, so the state and rows are the same for any chunking.
        for k in range(0, len(records), MEMORY_CHUNK):
            events = self._fold_chunk(con, records[k : k + MEMORY_CHUNK])
            if events:
                self._insert(con, events)
                logged += len(events)
        if self.sleep is not None:
            self.sleep.write(con)
        goal_rows = self.goals.write(con)
        if self.rhythms_changed:
            rows = [
                {
                    "agent": a,
                    "kind": k,
                    "events": self.rhythms[(a, k)].events,
                    "state": msgspec.json.encode(self.rhythms[(a, k)]).decode(),
                }
                for a, k in sorted(self.rhythms_changed)
            ]
            with registered(con, frame=pa.Table.from_pylist(rows)):
                con.execute("INSERT OR REPLACE INTO oscillators SELECT agent, kind, events, state::JSON FROM frame")
            self.rhythms_changed.clear()
        if self.readings:
            with registered(con, readings=pa.Table.from_pylist(self.readings)):
                con.execute(
                    "INSERT INTO oscillator_readings SELECT agent, kind, occurred_at, memory_id, anomaly, "
                    "coherence, distances, src_offset FROM readings"
                )
            self.readings.clear()
        return logged + goal_rows

    def _fold_chunk(
        self, con: duckdb.DuckDBPyConnection, records: Sequence[tuple[bytes | None, Any]]
    ) -> list[tuple[MemoryEvent, int]]:
        """Fold some records in order; the events they decided, with their source offsets."""
        events: list[tuple[MemoryEvent, int]] = []
        # Every unit record of the chunk decoded and analysed at once (tokens, fingerprints,
        # signatures: one vectorised pass, not one per record: a record is one session's units).
        batch = [
            (
                kind,
                rec,
                None
                if kind in (KIND_ACCESS, KIND_SLEEP) or kind in GOAL_KINDS
                else _units_decoder.decode(rec.value or b"[]"),
            )
            for kind, rec in records
        ]
        index = self.state.index
        index.prepare([u for _, _, units in batch for u in units or () if u.memory_id not in self.state.decided])
        try:
            self._fold(con, batch, events)
        finally:
            index.prepare(())
        return events

    def _fold(
        self,
        con: duckdb.DuckDBPyConnection,
        batch: Sequence[tuple[bytes | None, Any, Any]],
        events: list[tuple[MemoryEvent, int]],
    ) -> None:
        """The batch's records in order: accesses, sleep requests, and units (sleep first when due)."""
        for kind, rec, units in batch:
            if kind == KIND_ACCESS:
                for ev in _access_decoder.decode(rec.value or b"[]"):
                    if ev.memory_id in self.state.index.pos:
                        apply(self.state, ev)
                        events.append((ev, rec.offset))
                continue
            if kind in GOAL_KINDS:
                if rec.value:  # empty: a forgotten subject's goal (projections/forget.py)
                    self.goals.fold(self.state, kind, rec.value, rec.offset)
                continue
            if kind == KIND_SLEEP:
                if self.sleep is not None:
                    req = _sleep_decoder.decode(rec.value or b"[]")
                    events += [
                        (ev, rec.offset)
                        for ev in self.sleep.run(self.state, req.at, SleepTrigger.ON_DEMAND, rec.offset, con)
                    ]
                    self.goals.remeasure(self.state, [], req.at, rec.offset)  # a nearest memory may be gone
                continue
            if self.sleep is not None and units:  # fire times passed in stream time: sleep first
                latest = bounded_time(
                    max(u.occurred_at for u in units), _record_time(rec), self.sleep.config.max_clock_skew_s
                )
                for at in self.sleep.due(latest):
                    events += [
                        (ev, rec.offset)
                        for ev in self.sleep.run(self.state, at, SleepTrigger.SCHEDULE, rec.offset, con)
                    ]
                self.sleep.observe(units, _record_time(rec))  # then the scopes' stream times move on
            _, decided = capture(self.state, units, _ts(rec, units))
            events += [(ev, rec.offset) for ev in at_event_time(decided)]
            stored = [ev.unit for ev in decided if isinstance(ev, CaptureDecided) and ev.action is CaptureAction.STORED]
            self.goals.remeasure(self.state, stored, _ts(rec, units), rec.offset)
            if self.oscillators is not None:
                self._observe_rhythms(units, rec.offset)

    def _observe_rhythms(self, units: Sequence[MemoryUnit], offset: int) -> None:
        """Coupled oscillators (optional): each episode is an event of the patterns ``session_end`` and
        ``session_end:<outcome>`` of its agent, observed in the memory log's order (so a replay
        computes the same phases); the source coordinates make a redelivery a no-op."""
        for i, u in enumerate(units):
            if u.kind.value != "episode":
                continue
            for kind in ("session_end", f"session_end:{u.outcome}"):
                key = (u.agent, kind)
                state, reading = observe(self.rhythms.get(key), u.occurred_at, self.oscillators, source=(0, offset, i))
                self.rhythms[key] = state
                if reading is not None and reading.anomaly is not None:  # stored: how on time this event was
                    self.readings.append(
                        {
                            "agent": u.agent,
                            "kind": kind,
                            "occurred_at": u.occurred_at,
                            "memory_id": u.memory_id,
                            "anomaly": reading.anomaly,
                            "coherence": reading.coherence,
                            "distances": reading.distances,
                            "src_offset": offset,
                        }
                    )
                self.rhythms_changed.add(key)

    def _insert(self, con: duckdb.DuckDBPyConnection, events: list[tuple[MemoryEvent, int]]) -> None:
        log_rows, mem_rows, merge_rows, edge_rows, access_rows = [], [], [], [], []
        for ev, offset in events:
            log_rows.append(
                {
                    "ord": self.next_ord,
                    "kind": type(ev).__name__,
                    "body": _encoder.encode(ev).decode(),
                    "src_offset": offset,
                }
            )
            self.next_ord += 1
            if isinstance(ev, CaptureDecided):
                u = ev.unit
                if ev.action is CaptureAction.STORED:
                    mem_rows.append(
                        {
                            "memory_id": u.memory_id,
                            "kind": u.kind.value,
                            "agent": u.agent,
                            "scope": u.scope,
                            "run_id": u.run_id,
                            "position": u.position,
                            "occurred_at": u.occurred_at,
                            "perception": u.perception,
                            "summary": u.summary,
                            "outcome": u.outcome,
                            "speaker": u.speaker,
                            "refs": list(u.refs),
                            "source_event_ids": [str(x) for x in u.source_event_ids],
                            "reasons": list(ev.reasons),
                            "prediction_error": ev.prediction_error,
                            "user_interaction": u.user_interaction,
                            "decided_at": ev.decided_at,
                            "user_id": u.user_id,
                        }
                    )
                else:
                    merge_rows.append(
                        {
                            "unit_id": u.memory_id,
                            "memory_id": ev.memory_id,
                            "agent": u.agent,
                            "prediction_error": ev.prediction_error,
                            "decided_at": ev.decided_at,
                        }
                    )
            elif isinstance(ev, MemoryLinked):
                edge_rows.append(
                    {
                        "a": ev.a,
                        "b": ev.b,
                        "weight": ev.weight,
                        "shared": ev.shared,
                        "goal": ev.goal,
                        "temporal": ev.temporal,
                        "formed_at": ev.formed_at,
                    }
                )
            elif isinstance(ev, MemoryAccessed):
                access_rows.append(
                    {
                        "memory_id": ev.memory_id,
                        "agent": ev.agent,
                        "query": ev.query,
                        "rank": ev.rank,
                        "score": ev.score,
                        "accessed_at": ev.accessed_at,
                    }
                )
        for table, rows, select in (
            ("memory_log", log_rows, "ord, kind, body::JSON, src_offset"),
            ("memories", mem_rows, "*"),
            ("memory_merges", merge_rows, "*"),
            ("memory_edges", edge_rows, "*"),
            ("memory_access", access_rows, "*"),
        ):
            if rows:
                with registered(con, frame=pa.Table.from_pylist(rows)):
                    con.execute(f"INSERT INTO {table} SELECT {select} FROM frame")
