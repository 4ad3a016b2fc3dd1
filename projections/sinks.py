"""One sink per projected topic: it decodes that topic's records of a batch, then writes them.

The shape is quix-streams' ``BatchingSink`` and eventsourcing's ``Follower.process_event``: the
transaction driver (``projections/writer.py``'s ``apply_batch``) hands every record to its topic's
sink (``add``: decode, before the transaction), then, inside one DuckDB transaction, asks each sink
to ``write`` its rows, records the offsets and commits. After the commit each sink brings its
in-memory read model up to date (``committed``); after a rollback it reloads it from the tables
(``rolled_back``).

Every record is decoded behind ``somnus.schemas.codec``'s bounds here; one that cannot be decoded is
a dead letter (``DeadLetters.quarantine``), the one place the projector writes a dead letter.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import duckdb
import msgspec
import pyarrow as pa

from somnus.processors.sessions.session_retention import is_future, micros, record_cap
from somnus.projections.causal import add_temporal_bins
from somnus.projections.forget import Purged
from somnus.projections.frames import registered
from somnus.projections.knowledge import KnowledgeProjection
from somnus.projections.read_models import DeadLetterKey, ReadModels
from somnus.schemas.briefing import KIND_PROMOTION, KIND_SERVED, BriefingServed, FactPromoted
from somnus.schemas.codec import (
    MAX_DEPTH,
    Rejection,
    check_json,
    dead_letter_original,
    decode_bounded,
    decode_record,
    encode,
    poison_reason,
    truncated_note,
    uuid_texts,
)
from somnus.schemas.episodes import EpisodeDistilled
from somnus.schemas.events import type_name
from somnus.schemas.facts import FactsExtracted
from somnus.schemas.forget import KIND_FORGET, ForgetRequested
from somnus.schemas.working_memory import WorkingMemoryState

# (no header: a FactsExtracted)

_promotion_decoder = msgspec.json.Decoder(FactPromoted)
_served_decoder = msgspec.json.Decoder(BriefingServed)
_episode_decoder = msgspec.json.Decoder(EpisodeDistilled)
_facts_decoder = msgspec.json.Decoder(FactsExtracted)
_wm_decoder = msgspec.json.Decoder(WorkingMemoryState)
_forget_decoder = msgspec.json.Decoder(ForgetRequested)
_FACT_DECODERS: dict[bytes | None, tuple[str, msgspec.json.Decoder]] = {
    KIND_PROMOTION: ("promotion", _promotion_decoder),
    KIND_SERVED: ("served", _served_decoder),
}


class Record(Protocol):
    """A consumed record, as the sinks read it (read-only: a frozen dataclass or aiokafka's record)."""

    @property
    def topic(self) -> str: ...
    @property
    def partition(self) -> int: ...
    @property
    def offset(self) -> int: ...
    @property
    def key(self) -> bytes | None: ...
    @property
    def value(self) -> bytes | None: ...
    @property
    def headers(self) -> Any: ...


@dataclass
class BatchResult:
    events: int = 0
    duplicate_events: int = 0  # trace events whose event_id their session had already projected
    quarantined: int = 0  # records that could not be decoded or folded: dead letters written here (not duplicates)
    episodes: int = 0
    lessons: int = 0
    dead_letters: int = 0
    facts: int = 0
    link_updates: int = 0
    memory_events: int = 0
    semantic_events: int = 0
    skipped_invalid: int = 0  # invalid traces: the worker dead-letters them
    shredded: int = 0  # sealed records whose data key a forget deleted: skipped (somnus.schemas.sealed)
    scheduled_sleeps: list[tuple[str, Any]] = field(default_factory=list)  # (run_id, at) committed in the batch
    timings: dict[str, float] = field(default_factory=dict)  # seconds per stage (decode, memory, knowledge...)
    offsets: dict[tuple[str, int], int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._clock = time.perf_counter()

    def lap(self, stage: str) -> None:
        """Add the time since the last lap to ``stage`` (where the batch's time goes, logged when slow)."""
        t = time.perf_counter()
        self.timings[stage] = self.timings.get(stage, 0.0) + t - self._clock
        self._clock = t


class Sink:
    """What a topic's sink does in a batch; each step is a no-op unless the sink says otherwise."""

    def __init__(self, models: ReadModels, res: BatchResult, dead: DeadLetters) -> None:
        self.models, self.res, self.dead = models, res, dead

    def add(self, rec: Record, named: bool) -> None:
        """Decode ``rec`` (``named``: it may carry a forgotten subject's data) into the batch's rows."""

    def prepare(self, con: duckdb.DuckDBPyConnection) -> None:
        """What must be read from the tables once every record is decoded, before the transaction."""

    def write(self, con: duckdb.DuckDBPyConnection) -> None:
        """Write the batch's rows (inside the batch's transaction)."""

    def rolled_back(self, con: duckdb.DuckDBPyConnection) -> None:
        """The transaction was rolled back: reload what ran ahead of the tables."""

    def committed(self, con: duckdb.DuckDBPyConnection) -> None:
        """The transaction committed: bring the in-memory read model up to date."""


class DeadLetters(Sink):
    """The batch's dead letters: those decided here (``quarantine``) and those of the dead-letter topic
    (the worker's, read back with their source coordinates), each written once by source and kind."""

    def __init__(self, models: ReadModels, res: BatchResult) -> None:
        super().__init__(models, res, self)
        self.new: set[DeadLetterKey] = set()
        self.rows: list[dict[str, Any]] = []

    def _row(
        self, key: DeadLetterKey, reason: str, msg_key: bytes | None, original: bytes | None, dlq: Record | None = None
    ) -> bool:
        if key in self.models.dead_letters or key in self.new:
            return False
        self.new.add(key)
        self.rows.append(
            {
                "src_topic": key[0],
                "src_partition": key[1],
                "src_offset": key[2],
                "src_index": key[3],
                "kind": key[4],
                "reason": reason,
                "msg_key": msg_key,
                "original": original,
                "dlq_partition": dlq.partition if dlq else None,
                "dlq_offset": dlq.offset if dlq else None,
            }
        )
        return True

    def quarantine(self, rec: Record, index: int, reason: str, original: bytes | None = None) -> None:
        """A dead letter decided here (no dead-letter topic record: ``dlq_*`` are NULL)."""
        key = (rec.topic, rec.partition, rec.offset, index, reason.split(":", 1)[0])
        if original is None:
            original = dead_letter_original(rec.value)
        if self._row(key, reason, rec.key, original) and key[4] != "duplicate":
            self.res.quarantined += 1

    def rejected(self, rec: Record, got: Any, what: str) -> bool:
        """Quarantine ``rec`` when ``got`` is a Rejection (``decode_bounded``) or a bad prescan reason."""
        if got is None or not isinstance(got, (Rejection, str)):
            return False
        reason = got.reason if isinstance(got, Rejection) else got
        kind, _, rest = reason.partition(": ")
        self.quarantine(rec, 0, f"{kind}: invalid {what}: {rest}{truncated_note(rec.value)}")
        return True

    def add(self, rec: Record, named: bool) -> None:
        """A record of the dead-letter topic: its source coordinates and reason, from its headers."""
        try:
            h = {k: v for k, v in (rec.headers or [])}
            reason = h.get("somnus-reason", b"unknown: no reason header").decode(errors="replace")
            source = (
                h.get("somnus-source-topic", b"").decode(errors="replace"),
                int(h.get("somnus-source-partition", b"-1")),
                int(h.get("somnus-source-offset", b"-1")),
                int(h.get("somnus-source-index", b"0")),
                reason.split(":", 1)[0],
            )
        except Exception as exc:  # noqa: BLE001 - headers not ours: a dead letter of a dead letter
            self.quarantine(rec, 0, poison_reason(exc, "reading the dead letter's headers"))
            return
        self._row(source, reason, rec.key, rec.value, dlq=rec)

    def write(self, con: duckdb.DuckDBPyConnection) -> None:
        if self.rows:
            with registered(con, dead_frame=pa.Table.from_pylist(self.rows, schema=_DL_SCHEMA)):
                self.res.dead_letters = _inserted(con, "INSERT INTO dead_letters SELECT * FROM dead_frame")

    def committed(self, con: duckdb.DuckDBPyConnection) -> None:
        self.models.dead_letters |= self.new


class TracesSink(Sink):
    """Trace events: one row each, once per ``event_id`` (``_once_per_event_id``); not those stamped
    later than their record's broker time plus the allowed skew (the worker dead-letters them)."""

    COLUMNS = (
        "event_id",
        "schema_version",
        "ts",
        "agent",
        "session_id",
        "seq",
        "type",
        "payload",
        "src_partition",
        "src_offset",
        "src_index",
    )

    def __init__(
        self,
        models: ReadModels,
        res: BatchResult,
        dead: DeadLetters,
        max_event_bytes: int,
        max_depth: int,
        skew_us: int,
    ) -> None:
        super().__init__(models, res, dead)
        self.max_event_bytes, self.max_depth, self.skew_us = max_event_bytes, max_depth, skew_us
        self.cols: dict[str, list[Any]] = {c: [] for c in self.COLUMNS}
        # (record, index in it) of each row of cols; not the decoded event: a batch's events held
        # decoded took 2 KB each, 375 MB of the projector's peak at 20,000 records (issue #30)
        self.objs: list[tuple[Record, int]] = []
        self.dup_rows: list[dict[str, Any]] = []

    def add(self, rec: Record, named: bool) -> None:
        self.res.skipped_invalid += _add_events(
            self.cols, rec, self.max_event_bytes, self.max_depth, self.skew_us, self.objs
        )

    def prepare(self, con: duckdb.DuckDBPyConnection) -> None:
        if self.objs:
            _once_per_event_id(con, self.cols, self.objs, self.dup_rows, self.dead.quarantine, self._event)

    def _event(self, rec: Record, index: int) -> Any:
        """The event at ``index`` of ``rec``, decoded again (for a dead letter: rare)."""
        return decode_record(rec.value, self.max_event_bytes, self.max_depth)[index]

    def write(self, con: duckdb.DuckDBPyConnection) -> None:
        cols = self.cols
        if cols["event_id"]:
            cols["event_id"] = uuid_texts(cols["event_id"])
            with registered(con, events_frame=pa.table(cols)):
                con.execute(
                    "INSERT INTO events SELECT event_id::UUID, schema_version, ts, agent, session_id, seq, "
                    "type, payload::JSON, src_partition, src_offset, src_index FROM events_frame"
                )
            self.res.events = len(cols["event_id"])
        if self.dup_rows:
            with registered(con, dup_frame=pa.Table.from_pylist(self.dup_rows)):
                self.res.duplicate_events = _inserted(
                    con,
                    "INSERT INTO duplicate_events SELECT event_id::UUID, agent, session_id, seq, src_partition, "
                    "src_offset, src_index FROM dup_frame",
                )


class EpisodesSink(Sink):
    """Episodes and their lessons, once per ``episode_id`` (re-emitted after a worker restart: same id,
    same content); their temporal bins (SCN)."""

    def __init__(self, models: ReadModels, res: BatchResult, dead: DeadLetters, max_depth: int) -> None:
        super().__init__(models, res, dead)
        self.max_depth = max_depth
        self.episodes: list[Any] = []
        self.new: set[str] = set()
        self.rows: list[dict[str, Any]] = []
        self.lesson_rows: list[dict[str, Any]] = []

    @property
    def agents(self) -> set[str]:
        return {r["agent"] for r in self.rows}

    def add(self, rec: Record, named: bool) -> None:
        ep = decode_bounded(_episode_decoder, rec.value, self.max_depth)
        if self.dead.rejected(rec, ep, "episode"):
            return
        eid = str(ep.episode_id)
        if eid in self.models.episodes or eid in self.new:
            return
        self.new.add(eid)
        self.episodes.append(ep)
        self.rows.append(_episode_row(ep, eid, rec))
        for i, lesson in enumerate(ep.lessons):
            self.lesson_rows.append(
                {
                    "episode_id": eid,
                    "agent": ep.agent,
                    "session_id": ep.session_id,
                    "idx": i,
                    "kind": lesson.kind.value,
                    "text": lesson.text,
                    "tool": lesson.tool,
                    "error": lesson.error,
                    "learned_at": ep.ended_at,
                }
            )

    def write(self, con: duckdb.DuckDBPyConnection) -> None:
        if not self.rows:
            return
        with registered(con, episodes_frame=pa.Table.from_pylist(self.rows)):
            self.res.episodes = _inserted(
                con,
                "INSERT INTO episodes SELECT episode_id::UUID, agent, session_id, task, goal, "
                "user_id, summary, outcome, started_at, ended_at, duration_s, event_count, tool_calls, tools, "
                "errors::JSON, delegations::JSON, first_event_id::UUID, last_event_id::UUID, src_partition, "
                "src_offset, calls::JSON, calls_dropped, metadata::JSON FROM episodes_frame",
            )
        if self.lesson_rows:
            with registered(con, lessons_frame=pa.Table.from_pylist(self.lesson_rows)):
                self.res.lessons = _inserted(
                    con,
                    "INSERT INTO lessons SELECT episode_id::UUID, agent, session_id, idx, kind, text, tool, error, "
                    "learned_at FROM lessons_frame",
                )
        self.res.lap("rows")
        add_temporal_bins(con, self.episodes)
        self.res.lap("scn")

    def committed(self, con: duckdb.DuckDBPyConnection) -> None:
        self.models.episodes |= self.new
        if self.rows:
            self.models.briefings.recent.add(self.rows, self.lesson_rows)


class LinkUpdatesSink(Sink):
    """Causal-link updates (NAc), bundles of the worker's learning."""

    def __init__(self, models: ReadModels, res: BatchResult, dead: DeadLetters, max_depth: int) -> None:
        super().__init__(models, res, dead)
        self.max_depth = max_depth
        self.bundles: list[bytes] = []

    def add(self, rec: Record, named: bool) -> None:
        if not self.dead.rejected(rec, _prescan(rec, self.max_depth), "link updates"):
            self.bundles.append(rec.value or b"[]")

    def write(self, con: duckdb.DuckDBPyConnection) -> None:
        if self.bundles:
            self.res.link_updates = self.models.causal.write(con, self.bundles)
            self.res.lap("causal")

    def rolled_back(self, con: duckdb.DuckDBPyConnection) -> None:
        self.models.causal.rolled_back()

    def committed(self, con: duckdb.DuckDBPyConnection) -> None:
        self.models.causal.committed()


class MemorySink(Sink):
    """Episodic memory: units, accesses and sleep requests, folded in the topic's order; a forgotten
    subject's units never reach the fold."""

    def __init__(self, models: ReadModels, res: BatchResult, dead: DeadLetters, max_depth: int) -> None:
        super().__init__(models, res, dead)
        self.max_depth = max_depth
        self.records: list[tuple[bytes | None, Any]] = []
        self.retired_scopes: set[str] = set()  # scopes whose idle facts sleep retired in this batch

    def add(self, rec: Record, named: bool) -> None:
        if self.dead.rejected(rec, _prescan(rec, self.max_depth), "memory record"):
            return
        kind = _header(rec, "somnus-kind")
        self.records.append((kind, self.models.forget.kept_units(rec, kind) if named else rec))

    def write(self, con: duckdb.DuckDBPyConnection) -> None:
        if self.records:
            self.res.memory_events = self.models.memory.write(con, self.records)
            self.res.lap("memory")
            sleep = self.models.memory.sleep
            if sleep is not None and sleep.retired_scopes:
                # Sleep retired idle facts (in this transaction): the knowledge fold reads them back
                # before this batch's facts are folded, as it would after a restart.
                self.retired_scopes = set(sleep.retired_scopes)
                self.models.knowledge = KnowledgeProjection(con)

    def rolled_back(self, con: duckdb.DuckDBPyConnection) -> None:
        if self.records:  # the capture fold ran ahead of the tables: replay what committed
            self.models.memory.reload(con)
        if self.retired_scopes:
            self.models.knowledge = KnowledgeProjection(con)

    def committed(self, con: duckdb.DuckDBPyConnection) -> None:
        if self.records and self.models.memory.sleep is not None:
            self.res.scheduled_sleeps = self.models.memory.sleep.take_scheduled()


class WorkingMemorySink(Sink):
    """The worker's working-memory table changelog: the latest state of each session (a tombstone
    deletes it)."""

    def __init__(self, models: ReadModels, res: BatchResult, dead: DeadLetters, max_depth: int) -> None:
        super().__init__(models, res, dead)
        self.max_depth = max_depth
        self.states: dict[bytes, tuple[bytes | None, Any]] = {}

    def add(self, rec: Record, named: bool) -> None:
        if rec.key is None:
            return
        state = None if rec.value is None else decode_bounded(_wm_decoder, rec.value, self.max_depth)
        if not self.dead.rejected(rec, state, "working memory"):
            self.states[rec.key] = (rec.value, state)  # the latest state of each session wins

    def write(self, con: duckdb.DuckDBPyConnection) -> None:
        if self.states:
            _write_working_memory(con, self.states)
            self.res.lap("working_memory")


class SemanticSink(Sink):
    """Semantic memory: knowledge ingested and promotion requests; the briefings of the scopes that
    learn something are invalidated."""

    def __init__(self, models: ReadModels, res: BatchResult, dead: DeadLetters, max_depth: int) -> None:
        super().__init__(models, res, dead)
        self.max_depth = max_depth
        self.records: list[tuple[bytes | None, Any]] = []

    def add(self, rec: Record, named: bool) -> None:
        if not self.dead.rejected(rec, _prescan(rec, self.max_depth), "semantic record"):
            self.records.append((_header(rec, "somnus-kind"), rec))

    def write(self, con: duckdb.DuckDBPyConnection) -> None:
        if self.records:
            self.res.semantic_events, owners = self.models.semantic.write(con, self.records, self.models.keys.keys)
            self.models.briefings.invalidate(con, (), owners)  # new knowledge for these scopes' readers
            self.res.lap("semantic")

    def rolled_back(self, con: duckdb.DuckDBPyConnection) -> None:
        if self.records:
            self.models.semantic.reload(con)


class FactsSink(Sink):
    """The facts topic, in order: facts extracted, briefings served and promotions (utilisation and
    promotion first, then the knowledge fold); its forget requests go to ``ForgetStep``."""

    def __init__(
        self,
        models: ReadModels,
        res: BatchResult,
        dead: DeadLetters,
        max_depth: int,
        forget: ForgetStep,
        memory: MemorySink,
    ) -> None:
        super().__init__(models, res, dead)
        self.max_depth, self.forget, self.memory = max_depth, forget, memory
        self.items: list[tuple[str, int, Any]] = []
        self.facts: list[tuple[int, Any]] = []
        self.scopes: set[str] = set()

    def add(self, rec: Record, named: bool) -> None:
        kind = _header(rec, "somnus-kind")
        if kind == KIND_FORGET:  # a forget request (projections/forget.py)
            req = decode_bounded(_forget_decoder, rec.value, self.max_depth)
            if not self.dead.rejected(rec, req, "forget request"):
                self.forget.requests.append((rec.offset, req))
            return
        what, decoder = _FACT_DECODERS.get(kind, ("facts", _facts_decoder))
        item = decode_bounded(decoder, rec.value, self.max_depth)
        if not self.dead.rejected(rec, item, f"{what} record"):
            self.items.append((what, rec.offset, item))

    def write(self, con: duckdb.DuckDBPyConnection) -> None:
        if self.items:  # utilisation and promotion, in the topic's order, ahead of the knowledge fold
            self.facts = self.models.utilisation.fold(con, self.models.agents, self.items)
        self.scopes = set(self.memory.retired_scopes)  # their briefings and top facts change too
        if self.facts:
            self.res.facts, fact_scopes = self.models.knowledge.write(con, self.facts)
            self.scopes |= fact_scopes
            self.res.lap("knowledge")

    def rolled_back(self, con: duckdb.DuckDBPyConnection) -> None:
        if self.items:
            self.models.utilisation.reload(con)
        if self.facts or self.memory.retired_scopes:  # the fold ran ahead of the tables: reload what committed
            self.models.knowledge = KnowledgeProjection(con)

    def committed(self, con: duckdb.DuckDBPyConnection) -> None:
        if self.scopes:
            self.models.top_facts.refresh(con, sorted(self.scopes))
            self.res.lap("facts_top")


class ForgetStep(Sink):
    """Forgotten subjects (``projections/forget.py``): a batch with a forget request, or a record that may
    name a forgotten subject, is purged before its commit; the purged folds are reloaded after it."""

    def __init__(self, models: ReadModels, res: BatchResult, dead: DeadLetters) -> None:
        super().__init__(models, res, dead)
        self.requests: list[tuple[int, Any]] = []
        self.forgotten = False
        self.purged: Purged | None = None

    def mentions(self, rec: Record) -> bool:
        named = self.models.forget.mentions(rec)
        self.forgotten = self.forgotten or named
        return named

    def write(self, con: duckdb.DuckDBPyConnection) -> None:
        if self.requests or self.forgotten:
            self.purged = self.models.forget.purge(con, self.requests)
            self.res.lap("forget")

    def rolled_back(self, con: duckdb.DuckDBPyConnection) -> None:
        if self.requests or self.forgotten:
            self.models.forget.rolled_back(con)

    def committed(self, con: duckdb.DuckDBPyConnection) -> None:
        if self.purged is not None or self.models.forget.pending:  # no deleted byte left in the file
            self.models.forget.after_commit(con, self.models, self.purged or Purged())
            self.res.lap("forget_scrub")


def _episode_row(ep: Any, eid: str, rec: Record) -> dict[str, Any]:
    return {
        "episode_id": eid,
        "agent": ep.agent,
        "session_id": ep.session_id,
        "task": ep.task,
        "goal": ep.goal,
        "user_id": ep.user_id,
        "summary": ep.summary,
        "outcome": ep.outcome.value,
        "started_at": ep.started_at,
        "ended_at": ep.ended_at,
        "duration_s": ep.duration_s,
        "event_count": ep.event_count,
        "tool_calls": ep.tool_calls,
        "tools": ep.tools,
        "errors": encode(ep.errors).decode(),
        "delegations": encode(ep.delegations).decode(),
        "first_event_id": str(ep.first_event_id),
        "last_event_id": str(ep.last_event_id),
        "src_partition": rec.partition,
        "src_offset": rec.offset,
        "calls": encode(ep.calls).decode(),
        "calls_dropped": ep.calls_dropped,
        "metadata": encode(ep.metadata).decode(),
    }


def _inserted(con: duckdb.DuckDBPyConnection, sql: str) -> int:
    """The number of rows an INSERT wrote: DuckDB answers an INSERT with one row, its count."""
    row = con.execute(sql).fetchone()
    assert row is not None, sql
    return int(row[0])


def _header(rec: Record, name: str) -> bytes | None:
    for k, v in rec.headers or ():
        if k == name:
            return v
    return None


def _prescan(rec: Record, max_depth: int) -> str | None:
    """Why a record of one of our topics folded elsewhere must not reach its decoder (depth, UTF-8)."""
    return (
        "undecodable: empty message (no value)" if rec.value is None else check_json(rec.value, None, max_depth, None)
    )


def _write_working_memory(con: duckdb.DuckDBPyConnection, states: dict[bytes, tuple[bytes | None, Any]]) -> None:
    """The current working memory of each session in ``states`` (key -> its changelog bytes and their
    decoded state; a read model: replaced, not appended)."""
    rows = []
    for key, (raw, st) in states.items():
        if raw is None:
            continue
        rows.append(
            {
                "session_key": key.decode(errors="replace"),
                "agent": st.agent,
                "session_id": st.session_id,
                "user_id": st.user_id,
                "closed": st.closed,
                "last_seq": st.last_seq,
                "tokens": st.tokens,
                "state": raw.decode(),
            }
        )
    with registered(con, gone=pa.table({"session_key": [k.decode(errors="replace") for k in states]})):
        con.execute("DELETE FROM working_memory WHERE session_key IN (SELECT session_key FROM gone)")
    if rows:
        with registered(con, frame=pa.Table.from_pylist(rows)):
            con.execute(
                "INSERT INTO working_memory SELECT session_key, agent, session_id, user_id, closed, last_seq, "
                "tokens, state::JSON FROM frame"
            )


def _add_events(
    cols: dict[str, list[Any]],
    rec: Record,
    max_event_bytes: int,
    max_depth: int = MAX_DEPTH,
    skew_us: int = 0,
    objs: list[tuple[Record, int]] | None = None,
) -> int:
    """Append the valid events of one traces record to the column lists (not those stamped later than
    the record's broker time plus ``skew_us``: the worker dead-letters them, kind ``future``); returns
    how many were invalid."""
    invalid = 0
    ts_ms = getattr(rec, "timestamp", None)
    cap = record_cap(ts_ms / 1000, skew_us) if skew_us > 0 and ts_ms is not None else None
    for index, ev in enumerate(decode_record(rec.value, max_event_bytes, max_depth)):
        if isinstance(ev, Rejection):
            invalid += 1
            continue
        if cap is not None and is_future(micros(ev.ts), cap):
            continue
        cols["event_id"].append(ev.event_id)  # UUIDs: named all at once (uuid_texts) before the insert
        cols["schema_version"].append(ev.schema_version)
        cols["ts"].append(ev.ts)
        cols["agent"].append(ev.agent)
        cols["session_id"].append(ev.session_id)
        cols["seq"].append(ev.seq)
        cols["type"].append(type_name(ev))
        cols["payload"].append(encode(ev.payload).decode())
        cols["src_partition"].append(rec.partition)
        cols["src_offset"].append(rec.offset)
        cols["src_index"].append(index)
        if objs is not None:
            objs.append((rec, index))
    return invalid


def _once_per_event_id(
    con: duckdb.DuckDBPyConnection,
    cols: dict[str, list[Any]],
    objs: list[tuple[Record, int]],
    dup_rows: list[dict[str, Any]],
    dead: Any,
    event: Callable[[Record, int], Any],
) -> None:
    """Keep in ``cols`` the events whose ``event_id`` is new (the first copy in the batch). A copy of an
    id its own session holds is a row of ``dup_rows`` (counted, not projected again); an id another
    session holds is a dead letter (kind ``duplicate``). Which of two sessions on different partitions
    keeps a reused id follows the order the projector reads them in."""
    ids = uuid_texts(cols["event_id"])
    with registered(con, batch_ids=pa.table({"event_id": ids})):
        owner: dict[str, tuple[str, str]] = {
            str(eid): (agent, sid)
            for eid, agent, sid in con.execute(
                "SELECT event_id, agent, session_id FROM events WHERE event_id IN "
                "(SELECT event_id::UUID FROM batch_ids)"
            ).fetchall()
        }
    keep: list[int] = []
    agents, sessions = cols["agent"], cols["session_id"]
    for i, (eid, (rec, index)) in enumerate(zip(ids, objs)):
        mine = (agents[i], sessions[i])
        held = owner.get(eid)
        if held is None:
            owner[eid] = mine
            keep.append(i)
        elif held == mine:
            dup_rows.append(
                {
                    "event_id": eid,
                    "agent": agents[i],
                    "session_id": sessions[i],
                    "seq": cols["seq"][i],
                    "src_partition": rec.partition,
                    "src_offset": rec.offset,
                    "src_index": index,
                }
            )
        else:
            dead(
                rec,
                index,
                f"duplicate: event_id {eid} already belongs to session {held[1]!r} of agent "
                f"{held[0]!r}; this {cols['type'][i]} event of session {sessions[i]!r} of agent "
                f"{agents[i]!r} reuses it",
                encode(event(rec, index)),
            )
    if len(keep) < len(ids):
        for name, col in cols.items():
            cols[name] = [col[i] for i in keep]


_DL_SCHEMA = pa.schema(
    [
        ("src_topic", pa.string()),
        ("src_partition", pa.int32()),
        ("src_offset", pa.int64()),
        ("src_index", pa.int32()),
        ("kind", pa.string()),
        ("reason", pa.string()),
        ("msg_key", pa.binary()),
        ("original", pa.binary()),
        ("dlq_partition", pa.int32()),
        ("dlq_offset", pa.int64()),
    ]
)
