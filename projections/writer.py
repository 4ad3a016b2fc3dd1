"""Apply a batch of Kafka records to the projections: rows and source offsets in one transaction.

A batch whose records are at or past the stored offsets is applied once; records before the stored
offset of their partition (a redelivery) are skipped, so applying the same batch twice changes
nothing. Episodes re-emitted by the worker after a crash have the same ``episode_id`` and are
skipped (first one wins); dead letters are unique by their source coordinates. The keys already
projected are held in memory (``Seen``), loaded once from the tables.
"""

from __future__ import annotations

import time

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import duckdb
import msgspec
import pyarrow as pa

from processors.sleep import SleepConfig
from projections.causal import add_temporal_bins
from projections.knowledge import decode_facts
from schemas.briefing import BriefingServed, FactPromoted
from schemas.codec import Rejection, decode_episode, decode_record, encode, uuid_texts
from schemas.events import type_name


_promotion_decoder = msgspec.json.Decoder(FactPromoted)
_served_decoder = msgspec.json.Decoder(BriefingServed)


def decode_promotion(raw: bytes) -> FactPromoted:
    return _promotion_decoder.decode(raw)


def decode_served(raw: bytes) -> BriefingServed:
    return _served_decoder.decode(raw)


class Record(Protocol):
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: Any


@dataclass(frozen=True)
class Topics:
    traces: str
    episodes: str
    dead_letters: str
    facts: str = ""  # one partition; folded into the knowledge graph (projections/knowledge.py)
    link_updates: str = ""  # NAc updates (projections/causal.py)
    memory: str = ""  # one partition; folded into episodic memory (projections/memory.py)
    working_memory: str = ""  # the worker's working-memory table changelog (key = session)
    semantic: str = ""  # one partition; folded into semantic memory (projections/semantic.py)


@dataclass
class BatchResult:
    events: int = 0
    episodes: int = 0
    lessons: int = 0
    dead_letters: int = 0
    facts: int = 0
    link_updates: int = 0
    memory_events: int = 0
    semantic_events: int = 0
    skipped_invalid: int = 0  # invalid traces: the worker dead-letters them
    scheduled_sleeps: list[tuple[str, Any]] = field(default_factory=list)  # (run_id, at) committed in the batch
    timings: dict[str, float] = field(default_factory=dict)  # seconds per stage (decode, memory, knowledge...)
    offsets: dict[tuple[str, int], int] = field(default_factory=dict)


def load_offsets(con: duckdb.DuckDBPyConnection) -> dict[tuple[str, int], int]:
    rows = con.execute("SELECT topic, kafka_partition, next_offset FROM projection_offsets").fetchall()
    return {(t, p): o for t, p, o in rows}


class Seen:
    """Keys already projected where the same content may arrive twice (loaded once, kept in step),
    and the read models kept in memory beside their tables (knowledge fold, briefing cache)."""

    def __init__(self, con: duckdb.DuckDBPyConnection, agents: Mapping[str, Any] | None = None,
                 sleep_config: Any = None, oscillators: Any = None) -> None:
        from projections.briefings import BriefingCache
        from projections.causal import CausalProjection
        from projections.knowledge import KnowledgeProjection
        from projections.knowledge_store import TopFacts
        from projections.memory import MemoryProjection
        from projections.semantic import SemanticProjection
        from projections.sleep import SleepJob

        self.agents = dict(agents or {})
        self.episodes: set[str] = {str(r[0]) for r in con.execute("SELECT episode_id FROM episodes").fetchall()}
        self.dead_letters: set[tuple[str, int, int, int]] = set(con.execute(
            "SELECT src_topic, src_partition, src_offset, src_index FROM dead_letters").fetchall())
        self.knowledge = KnowledgeProjection(con)
        self.causal = CausalProjection(con)
        self.memory = MemoryProjection(con, SleepJob(con, {a: s.max_episodes for a, s in self.agents.items()},
                                                     sleep_config or SleepConfig()), oscillators)
        self.semantic = SemanticProjection(con)
        self.top_facts = TopFacts()
        self.top_facts.refresh(con)
        self.briefings = BriefingCache(con, self.agents, self.top_facts, self.semantic)
        from projections.utilisation import UtilisationFold

        self.utilisation = UtilisationFold(con)


def apply_batch(con: duckdb.DuckDBPyConnection, topics: Topics, records: Iterable[Record],
                stored: Mapping[tuple[str, int], int], max_event_bytes: int, seen: Seen) -> BatchResult:
    """Write one batch and its offsets atomically. ``stored`` is the offsets table as last loaded;
    ``seen`` is updated once the transaction has committed."""
    res = BatchResult()
    clock = [time.perf_counter()]

    def lap(stage: str) -> None:  # where the batch's time goes (logged by the projector when slow)
        t = time.perf_counter()
        res.timings[stage] = res.timings.get(stage, 0.0) + t - clock[0]
        clock[0] = t

    ev_cols: dict[str, list[Any]] = {c: [] for c in (
        "event_id", "schema_version", "ts", "agent", "session_id", "seq", "type", "payload",
        "src_partition", "src_offset", "src_index")}
    ep_rows: list[dict[str, Any]] = []
    lesson_rows: list[dict[str, Any]] = []
    dl_rows: list[dict[str, Any]] = []
    new_episodes: set[str] = set()
    new_dead: set[tuple[str, int, int, int]] = set()
    facts: list[tuple[int, Any]] = []
    fact_items: list[tuple[str, int, Any]] = []  # the facts topic, in order: facts, served briefings, promotions
    link_bundles: list[bytes] = []
    memory_records: list[tuple[bytes | None, Any]] = []
    working: dict[bytes, bytes | None] = {}
    semantic_records: list[tuple[bytes | None, Any]] = []
    new_eps: list[Any] = []
    for rec in records:
        tp = (rec.topic, rec.partition)
        if rec.offset < stored.get(tp, 0) or rec.offset < res.offsets.get(tp, 0):
            continue  # already projected
        res.offsets[tp] = rec.offset + 1
        if rec.topic == topics.traces:
            res.skipped_invalid += _add_events(ev_cols, rec, max_event_bytes)
        elif rec.topic == topics.episodes:
            ep = decode_episode(rec.value or b"")
            eid = str(ep.episode_id)
            if eid in seen.episodes or eid in new_episodes:
                continue  # re-emitted by the worker after a restart: same id, same content
            new_episodes.add(eid)
            new_eps.append(ep)
            ep_rows.append({
                "episode_id": eid, "agent": ep.agent, "session_id": ep.session_id, "task": ep.task,
                "goal": ep.goal, "user_id": ep.user_id, "summary": ep.summary, "outcome": ep.outcome.value,
                "started_at": ep.started_at, "ended_at": ep.ended_at, "duration_s": ep.duration_s,
                "event_count": ep.event_count, "tool_calls": ep.tool_calls, "tools": ep.tools,
                "errors": encode(ep.errors).decode(), "delegations": encode(ep.delegations).decode(),
                "first_event_id": str(ep.first_event_id), "last_event_id": str(ep.last_event_id),
                "src_partition": rec.partition, "src_offset": rec.offset,
                "calls": encode(ep.calls).decode(), "calls_dropped": ep.calls_dropped,
                "metadata": encode(ep.metadata).decode()})
            for i, lesson in enumerate(ep.lessons):
                lesson_rows.append({"episode_id": eid, "agent": ep.agent, "session_id": ep.session_id, "idx": i,
                                    "kind": lesson.kind.value, "text": lesson.text, "tool": lesson.tool,
                                    "error": lesson.error, "learned_at": ep.ended_at})
        elif rec.topic == topics.facts:
            kind = _header(rec, "somnus-kind")
            if kind == KIND_PROMOTION:
                fact_items.append(("promotion", rec.offset, decode_promotion(rec.value or b"")))
            elif kind == KIND_SERVED:
                fact_items.append(("served", rec.offset, decode_served(rec.value or b"")))
            else:
                fact_items.append(("facts", rec.offset, decode_facts(rec.value or b"")))
        elif rec.topic == topics.semantic:
            semantic_records.append((_header(rec, "somnus-kind"), rec))
        elif rec.topic == topics.working_memory:
            if rec.key is not None:
                working[rec.key] = rec.value  # the latest state of each session wins
        elif rec.topic == topics.memory:
            memory_records.append((_header(rec, "somnus-kind"), rec))
        elif rec.topic == topics.link_updates:
            link_bundles.append(rec.value or b"[]")
        elif rec.topic == topics.dead_letters:
            h = {k: v for k, v in (rec.headers or [])}
            reason = h.get("somnus-reason", b"unknown: no reason header").decode(errors="replace")
            source = (h.get("somnus-source-topic", b"").decode(errors="replace"),
                      int(h.get("somnus-source-partition", b"-1")), int(h.get("somnus-source-offset", b"-1")),
                      int(h.get("somnus-source-index", b"0")))
            if source in seen.dead_letters or source in new_dead:
                continue
            new_dead.add(source)
            dl_rows.append({
                "src_topic": source[0], "src_partition": source[1], "src_offset": source[2], "src_index": source[3],
                "kind": reason.split(":", 1)[0], "reason": reason, "msg_key": rec.key, "original": rec.value,
                "dlq_partition": rec.partition, "dlq_offset": rec.offset})
    if not res.offsets:
        return res
    lap("decode")
    con.begin()
    try:
        if ev_cols["event_id"]:
            ev_cols["event_id"] = uuid_texts(ev_cols["event_id"])
            events_frame = pa.table(ev_cols)  # noqa: F841 (read by DuckDB by name)
            con.execute("INSERT INTO events SELECT event_id::UUID, schema_version, ts, agent, session_id, seq, type, "
                        "payload::JSON, src_partition, src_offset, src_index FROM events_frame")
            res.events = len(ev_cols["event_id"])
        if ep_rows:
            episodes_frame = pa.Table.from_pylist(ep_rows)  # noqa: F841
            res.episodes = con.execute(
                "INSERT INTO episodes SELECT episode_id::UUID, agent, session_id, task, goal, "
                "user_id, summary, outcome, started_at, ended_at, duration_s, event_count, tool_calls, tools, "
                "errors::JSON, delegations::JSON, first_event_id::UUID, last_event_id::UUID, src_partition, src_offset, "
                "calls::JSON, calls_dropped, metadata::JSON "
                "FROM episodes_frame").fetchone()[0]
            if lesson_rows:
                lessons_frame = pa.Table.from_pylist(lesson_rows)  # noqa: F841
                res.lessons = con.execute(
                    "INSERT INTO lessons SELECT episode_id::UUID, agent, session_id, idx, kind, text, tool, error, "
                    "learned_at FROM lessons_frame").fetchone()[0]
        if dl_rows:
            dead_frame = pa.Table.from_pylist(dl_rows, schema=_DL_SCHEMA)  # noqa: F841
            res.dead_letters = con.execute(
                "INSERT INTO dead_letters SELECT * FROM dead_frame").fetchone()[0]
        lap("rows")
        if new_eps:
            add_temporal_bins(con, new_eps)
            lap("scn")
        if link_bundles:
            res.link_updates = seen.causal.write(con, link_bundles)
            lap("causal")
        if memory_records:
            res.memory_events = seen.memory.write(con, memory_records)
            lap("memory")
        if working:
            _write_working_memory(con, working)
            lap("working_memory")
        if semantic_records:
            res.semantic_events, owners = seen.semantic.write(con, semantic_records)
            seen.briefings.invalidate(con, (), owners)  # new knowledge for these scopes' readers
            lap("semantic")
        if fact_items:  # utilisation and promotion, in the topic's order, ahead of the knowledge fold
            facts = seen.utilisation.fold(con, seen.agents, fact_items)
        scopes: set[str] = set()
        if facts:
            res.facts, scopes = seen.knowledge.write(con, facts)
            lap("knowledge")
        seen.briefings.invalidate(con, {r["agent"] for r in ep_rows}, scopes)
        lap("invalidate")
        offsets_frame = pa.table({  # noqa: F841
            "topic": [t for t, _ in res.offsets], "kafka_partition": [p for _, p in res.offsets],
            "next_offset": list(res.offsets.values())})
        con.execute("INSERT OR REPLACE INTO projection_offsets SELECT * FROM offsets_frame")
        con.commit()
        lap("commit")
    except BaseException:
        con.rollback()
        seen.causal.rolled_back()
        if fact_items:
            seen.utilisation.reload(con)
        if memory_records:  # the capture fold ran ahead of the tables: replay what committed
            seen.memory.reload(con)
        if semantic_records:
            seen.semantic.reload(con)
        if facts:  # the fold's state ran ahead of the tables: reload it from what committed
            from projections.knowledge import KnowledgeProjection

            seen.knowledge = KnowledgeProjection(con)
        raise
    seen.episodes |= new_episodes
    seen.dead_letters |= new_dead
    if ep_rows:
        seen.briefings.recent.add(ep_rows, lesson_rows)
    if memory_records and seen.memory.sleep is not None:
        res.scheduled_sleeps = seen.memory.sleep.take_scheduled()
    if scopes:
        seen.top_facts.refresh(con, sorted(scopes))
        lap("facts_top")
    seen.causal.committed()
    return res


KIND_PROMOTION = b"promotion"  # header somnus-kind on the facts topic: a FactPromoted
KIND_SERVED = b"briefing-served"  # a BriefingServed
# (no header: a FactsExtracted)


def _header(rec: Record, name: str) -> bytes | None:
    for k, v in rec.headers or ():
        if k == name:
            return v
    return None


def _write_working_memory(con: duckdb.DuckDBPyConnection, states: Mapping[bytes, bytes | None]) -> None:
    """The current working memory of each session in ``states`` (a read model: replaced, not appended)."""
    from processors.working_memory import decode_state

    rows = []
    for key, raw in states.items():
        if raw is None:
            continue
        st = decode_state(raw)
        rows.append({"session_key": key.decode(), "agent": st.agent, "session_id": st.session_id,
                     "user_id": st.user_id, "closed": st.closed, "last_seq": st.last_seq, "tokens": st.tokens,
                     "state": raw.decode()})
    gone = pa.table({"session_key": [k.decode() for k in states]})  # noqa: F841
    con.execute("DELETE FROM working_memory WHERE session_key IN (SELECT session_key FROM gone)")
    if rows:
        frame = pa.Table.from_pylist(rows)  # noqa: F841
        con.execute("INSERT INTO working_memory SELECT session_key, agent, session_id, user_id, closed, last_seq, "
                    "tokens, state::JSON FROM frame")


def _add_events(cols: dict[str, list[Any]], rec: Record, max_event_bytes: int) -> int:
    """Append the valid events of one traces record to the column lists; returns how many were invalid."""
    invalid = 0
    for index, ev in enumerate(decode_record(rec.value, max_event_bytes)):
        if isinstance(ev, Rejection):
            invalid += 1
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
    return invalid


_DL_SCHEMA = pa.schema([
    ("src_topic", pa.string()), ("src_partition", pa.int32()), ("src_offset", pa.int64()), ("src_index", pa.int32()),
    ("kind", pa.string()), ("reason", pa.string()), ("msg_key", pa.binary()), ("original", pa.binary()),
    ("dlq_partition", pa.int32()), ("dlq_offset", pa.int64())])
