"""Apply a batch of Kafka records to the projections: rows and source offsets in one transaction.

A batch whose records are at or past the stored offsets is applied once; records before the stored
offset of their partition (a redelivery) are skipped, so applying the same batch twice changes
nothing. Episodes re-emitted by the worker after a crash have the same ``episode_id`` and are
skipped (first one wins); dead letters are unique by their source coordinates and kind. The keys
already projected are held in memory (``Seen``), loaded once from the tables.

No record stops the projector (``apply_guarded``). Every record is decoded behind
``somnus.schemas.codec``'s bounds; one that cannot be decoded is *quarantined*: a dead letter of kind
``poison`` (or the decoder's kind) with its own coordinates and bytes, written by the projector in
the batch's transaction, its offset passed. A batch whose folds still raise is rolled back and applied
again with every record fully decoded first, then in halves down to the one record that raises on its
own, which is quarantined. The same records quarantine the same way in a replay.

The projector sees every trace event, so it decides what only it can: an ``event_id`` is projected
once (a copy in the same session is counted in ``duplicate_events``; one that another session
already holds is a dead letter of kind ``duplicate``), and an event later than its record's broker
time plus ``SOMNUS_MAX_CLOCK_SKEW_S`` is not projected (the worker dead-letters it, kind ``future``).
"""

from __future__ import annotations

import dataclasses
import logging
import time

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import duckdb
import msgspec
import pyarrow as pa

from somnus.processors.sleep.job import SleepConfig
from somnus.projections.causal import add_temporal_bins
from somnus.schemas.briefing import BriefingServed, FactPromoted
from somnus.processors.sessions.session_retention import is_future, micros, record_cap
from somnus.schemas.codec import (MAX_DEPTH, Rejection, check_json, dead_letter_original, decode_bounded, decode_record,
                          encode, poison_reason, truncated_note, uuid_texts)
from somnus.schemas.episodes import EpisodeDistilled
from somnus.schemas.events import type_name
from somnus.schemas.facts import FactsExtracted
from somnus.projections.forget import Purged
from somnus.schemas.forget import KIND_FORGET, ForgetRequested
from somnus.schemas.sealed import FORGOTTEN, open_record
from somnus.schemas.working_memory import WorkingMemoryState


log = logging.getLogger("somnus.projector")
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


def load_offsets(con: duckdb.DuckDBPyConnection) -> dict[tuple[str, int], int]:
    rows = con.execute("SELECT topic, kafka_partition, next_offset FROM projection_offsets").fetchall()
    return {(t, p): o for t, p, o in rows}


class Seen:
    """Keys already projected where the same content may arrive twice (loaded once, kept in step),
    and the read models kept in memory beside their tables (knowledge fold, briefing cache)."""

    def __init__(self, con: duckdb.DuckDBPyConnection, agents: Mapping[str, Any] | None = None,
                 sleep_config: Any = None, oscillators: Any = None) -> None:
        from somnus.projections.briefings import BriefingCache
        from somnus.projections.causal import CausalProjection
        from somnus.projections.knowledge import KnowledgeProjection
        from somnus.projections.knowledge_store import TopFacts
        from somnus.projections.memory import MemoryProjection
        from somnus.projections.semantic import SemanticProjection
        from somnus.projections.sleep import SleepJob

        self.agents = dict(agents or {})
        self.episodes: set[str] = {str(r[0]) for r in con.execute("SELECT episode_id FROM episodes").fetchall()}
        self.dead_letters: set[tuple[str, int, int, int, str]] = set(con.execute(
            "SELECT src_topic, src_partition, src_offset, src_index, kind FROM dead_letters").fetchall())
        self.knowledge = KnowledgeProjection(con)
        self.causal = CausalProjection(con)
        self.memory = MemoryProjection(con, SleepJob(con, {a: s.max_episodes for a, s in self.agents.items()},
                                                     sleep_config or SleepConfig()), oscillators)
        self.semantic = SemanticProjection(con)
        self.top_facts = TopFacts()
        self.top_facts.refresh(con)
        self.briefings = BriefingCache(con, self.agents, self.top_facts, self.semantic)
        from somnus.projections.utilisation import UtilisationFold

        self.utilisation = UtilisationFold(con)
        from somnus.projections.forget import Forgetting

        self.forget = Forgetting(con)  # forgotten subjects: purged, and kept out (projections/forget.py)
        from somnus.streams.keys import KeyRing

        self.keys = KeyRing()  # the data keys that open sealed records (the projector follows the key topic)


def apply_batch(con: duckdb.DuckDBPyConnection, topics: Topics, records: Iterable[Record],
                stored: Mapping[tuple[str, int], int], max_event_bytes: int, seen: Seen,
                quarantine: Mapping[tuple[str, int, int], str] | None = None, max_depth: int = MAX_DEPTH,
                max_clock_skew_s: float = 0.0) -> BatchResult:
    """Write one batch and its offsets atomically. ``stored`` is the offsets table as last loaded;
    ``seen`` is updated once the transaction has committed. A record that cannot be decoded, or whose
    coordinates ``quarantine`` names (with the reason), is a dead letter (see the module's text)."""
    res = BatchResult()
    skew_us = int(max_clock_skew_s * 1_000_000)
    quarantine = quarantine or {}
    clock = [time.perf_counter()]

    def lap(stage: str) -> None:  # where the batch's time goes (logged by the projector when slow)
        t = time.perf_counter()
        res.timings[stage] = res.timings.get(stage, 0.0) + t - clock[0]
        clock[0] = t

    ev_cols: dict[str, list[Any]] = {c: [] for c in (
        "event_id", "schema_version", "ts", "agent", "session_id", "seq", "type", "payload",
        "src_partition", "src_offset", "src_index")}
    ev_objs: list[tuple[Record, int, Any]] = []  # (record, index, event) of each row of ev_cols
    ep_rows: list[dict[str, Any]] = []
    lesson_rows: list[dict[str, Any]] = []
    dl_rows: list[dict[str, Any]] = []
    dup_rows: list[dict[str, Any]] = []
    new_episodes: set[str] = set()
    new_dead: set[tuple[str, int, int, int, str]] = set()

    def dead(rec: Record, index: int, reason: str, original: bytes | None = None) -> None:
        """A dead letter decided here (no dead-letter topic record: ``dlq_*`` are NULL)."""
        key = (rec.topic, rec.partition, rec.offset, index, reason.split(":", 1)[0])
        if key in seen.dead_letters or key in new_dead:
            return
        new_dead.add(key)
        dl_rows.append({"src_topic": rec.topic, "src_partition": rec.partition, "src_offset": rec.offset,
                        "src_index": index, "kind": key[4], "reason": reason, "msg_key": rec.key,
                        "original": original if original is not None else dead_letter_original(rec.value),
                        "dlq_partition": None, "dlq_offset": None})
        if key[4] != "duplicate":
            res.quarantined += 1

    def bad(rec: Record, got: Any, what: str) -> bool:
        """Quarantine ``rec`` when ``got`` is a Rejection (``decode_bounded``) or a bad prescan reason."""
        if got is None or not isinstance(got, (Rejection, str)):
            return False
        reason = got.reason if isinstance(got, Rejection) else got
        kind, _, rest = reason.partition(": ")
        dead(rec, 0, f"{kind}: invalid {what}: {rest}{truncated_note(rec.value)}")
        return True

    facts: list[tuple[int, Any]] = []
    fact_items: list[tuple[str, int, Any]] = []  # the facts topic, in order: facts, served briefings, promotions
    link_bundles: list[bytes] = []
    memory_records: list[tuple[bytes | None, Any]] = []
    working: dict[bytes, bytes | None] = {}
    semantic_records: list[tuple[bytes | None, Any]] = []
    new_eps: list[Any] = []
    forget_requests: list[tuple[int, Any]] = []
    forgotten = False
    purged = None
    for rec in records:
        tp = (rec.topic, rec.partition)
        if rec.offset < stored.get(tp, 0) or rec.offset < res.offsets.get(tp, 0):
            continue  # already projected
        res.offsets[tp] = rec.offset + 1
        opened = open_record(rec, seen.keys.keys)  # a sealed record: its plaintext (somnus.schemas.sealed)
        if opened is FORGOTTEN:  # its data key was deleted by a forget: skipped, counted
            res.shredded += 1
            continue
        if isinstance(opened, Rejection):
            dead(rec, 0, opened.reason)
            continue
        rec = opened
        named = seen.forget.mentions(rec)  # a forgotten subject's record: purge before commit
        forgotten = forgotten or named
        why = quarantine.get((rec.topic, rec.partition, rec.offset))
        if why is not None:
            dead(rec, 0, why + truncated_note(rec.value))
            continue
        if rec.topic == topics.traces:
            res.skipped_invalid += _add_events(ev_cols, rec, max_event_bytes, max_depth, skew_us, ev_objs)
        elif rec.topic == topics.episodes:
            ep = decode_bounded(_episode_decoder, rec.value, max_depth)
            if bad(rec, ep, "episode"):
                continue
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
            if kind == KIND_FORGET:  # a forget request (projections/forget.py)
                req = decode_bounded(_forget_decoder, rec.value, max_depth)
                if not bad(rec, req, "forget request"):
                    forget_requests.append((rec.offset, req))
                continue
            what, decoder = _FACT_DECODERS.get(kind, ("facts", _facts_decoder))  # type: ignore[arg-type]
            item = decode_bounded(decoder, rec.value, max_depth)
            if bad(rec, item, f"{what} record"):
                continue
            fact_items.append((what, rec.offset, item))
        elif rec.topic == topics.semantic:
            if bad(rec, _prescan(rec, max_depth), "semantic record"):
                continue
            semantic_records.append((_header(rec, "somnus-kind"), rec))
        elif rec.topic == topics.working_memory:
            if rec.key is not None:
                state = None if rec.value is None else decode_bounded(_wm_decoder, rec.value, max_depth)
                if bad(rec, state, "working memory"):
                    continue
                working[rec.key] = (rec.value, state)  # the latest state of each session wins
        elif rec.topic == topics.memory:
            if bad(rec, _prescan(rec, max_depth), "memory record"):
                continue
            kind = _header(rec, "somnus-kind")  # a forgotten subject's memory units never reach the fold
            memory_records.append((kind, seen.forget.kept_units(rec, kind) if named else rec))
        elif rec.topic == topics.link_updates:
            if bad(rec, _prescan(rec, max_depth), "link updates"):
                continue
            link_bundles.append(rec.value or b"[]")
        elif rec.topic == topics.dead_letters:
            try:
                h = {k: v for k, v in (rec.headers or [])}
                reason = h.get("somnus-reason", b"unknown: no reason header").decode(errors="replace")
                source = (h.get("somnus-source-topic", b"").decode(errors="replace"),
                          int(h.get("somnus-source-partition", b"-1")), int(h.get("somnus-source-offset", b"-1")),
                          int(h.get("somnus-source-index", b"0")), reason.split(":", 1)[0])
            except Exception as exc:  # noqa: BLE001 - headers not ours: a dead letter of a dead letter
                dead(rec, 0, poison_reason(exc, "reading the dead letter's headers"))
                continue
            if source in seen.dead_letters or source in new_dead:
                continue
            new_dead.add(source)
            dl_rows.append({
                "src_topic": source[0], "src_partition": source[1], "src_offset": source[2], "src_index": source[3],
                "kind": source[4], "reason": reason, "msg_key": rec.key, "original": rec.value,
                "dlq_partition": rec.partition, "dlq_offset": rec.offset})
    if not res.offsets:
        return res
    if ev_objs:
        _once_per_event_id(con, topics, ev_cols, ev_objs, dup_rows, dead)
    lap("decode")
    con.begin()
    try:
        if ev_cols["event_id"]:
            ev_cols["event_id"] = uuid_texts(ev_cols["event_id"])
            events_frame = pa.table(ev_cols)  # noqa: F841 (read by DuckDB by name)
            con.execute("INSERT INTO events SELECT event_id::UUID, schema_version, ts, agent, session_id, seq, type, "
                        "payload::JSON, src_partition, src_offset, src_index FROM events_frame")
            res.events = len(ev_cols["event_id"])
        if dup_rows:
            dup_frame = pa.Table.from_pylist(dup_rows)  # noqa: F841
            res.duplicate_events = con.execute(
                "INSERT INTO duplicate_events SELECT event_id::UUID, agent, session_id, seq, src_partition, src_offset, "
                "src_index FROM dup_frame").fetchone()[0]
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
        if forget_requests or forgotten:
            purged = seen.forget.purge(con, forget_requests)
            lap("forget")
        offsets_frame = pa.table({  # noqa: F841
            "topic": [t for t, _ in res.offsets], "kafka_partition": [p for _, p in res.offsets],
            "next_offset": list(res.offsets.values())})
        con.execute("INSERT OR REPLACE INTO projection_offsets SELECT * FROM offsets_frame")
        con.commit()
        lap("commit")
    except BaseException:
        con.rollback()
        seen.causal.rolled_back()
        if forget_requests or forgotten:
            seen.forget.rolled_back(con)
        if fact_items:
            seen.utilisation.reload(con)
        if memory_records:  # the capture fold ran ahead of the tables: replay what committed
            seen.memory.reload(con)
        if semantic_records:
            seen.semantic.reload(con)
        if facts:  # the fold's state ran ahead of the tables: reload it from what committed
            from somnus.projections.knowledge import KnowledgeProjection

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
    if purged is not None or seen.forget.pending:  # reload the purged folds; no deleted byte left in the file
        seen.forget.after_commit(con, seen, purged or Purged())
        lap("forget_scrub")
    return res


# Failures of the machine, not of a record: the batch is not retried record by record, the projector
# stops (and its supervisor starts it again) as before.
ENVIRONMENT_ERRORS: tuple[type[BaseException], ...] = (
    OSError, MemoryError, duckdb.IOException, duckdb.OutOfMemoryException, duckdb.FatalException,
    duckdb.InternalException)


def apply_guarded(con: duckdb.DuckDBPyConnection, topics: Topics, records: Iterable[Record],
                  stored: Mapping[tuple[str, int], int], max_event_bytes: int, seen: Seen,
                  max_depth: int = MAX_DEPTH, max_clock_skew_s: float = 0.0) -> BatchResult:
    """``apply_batch``, and no record stops it: should the batch raise (a record its decoding did not
    catch, a fold that fails on it), it is rolled back and applied again with every record fully decoded
    first (those that fail are quarantined), then in halves down to the one record that raises on its
    own, which is quarantined (kind ``poison``, the exception). ``ENVIRONMENT_ERRORS`` are raised, and
    so is a failure after the batch committed (nothing to apply again)."""
    records = list(records)
    quarantine: dict[tuple[str, int, int], str] = {}
    progress = dict(stored)  # offsets committed so far, by this call's parts too

    def attempt(part: list[Record]) -> BatchResult:
        try:
            res = apply_batch(con, topics, part, progress, max_event_bytes, seen, quarantine, max_depth,
                              max_clock_skew_s)
        except ENVIRONMENT_ERRORS:
            raise
        except Exception as exc:  # noqa: BLE001 - the poison boundary
            committed = load_offsets(con)
            if any(committed.get((r.topic, r.partition), 0) > progress.get((r.topic, r.partition), 0) for r in part):
                raise  # it failed after its commit: applying it again would apply it twice
            raise _Failed() from exc
        progress.update(res.offsets)
        return res

    try:
        return attempt(records)
    except _Failed as failed:
        log.error("a batch of %d records failed (%r): applying it again without the records that fail",
                  len(records), failed.__cause__)
    for rec in records:
        opened = open_record(rec, seen.keys.keys)  # as apply_batch reads it (skipped or a dead letter there)
        skipped = opened is FORGOTTEN or isinstance(opened, Rejection)
        reason = None if skipped else _undecodable(topics, opened, max_depth)
        if reason is not None:
            quarantine[(rec.topic, rec.partition, rec.offset)] = reason
    return _halves(records, attempt, quarantine)


class _Failed(Exception):
    """A part of a batch raised (its ``__cause__``) and was rolled back."""


def _halves(records: list[Record], attempt: Any, quarantine: dict[tuple[str, int, int], str]) -> BatchResult:
    try:
        return attempt(records)
    except _Failed as failed:
        if len(records) == 1:
            rec, exc = records[0], failed.__cause__
            log.error("record %s/%d@%d is quarantined: %r", rec.topic, rec.partition, rec.offset, exc)
            quarantine[(rec.topic, rec.partition, rec.offset)] = poison_reason(exc or failed, f"while folding {rec.topic}")
            return attempt(records)
    mid = len(records) // 2
    return _merged(_halves(records[:mid], attempt, quarantine), _halves(records[mid:], attempt, quarantine))


def _merged(a: BatchResult, b: BatchResult) -> BatchResult:
    out = BatchResult()
    for f in dataclasses.fields(BatchResult):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, int):
            setattr(out, f.name, x + y)
        elif isinstance(x, list):
            setattr(out, f.name, x + y)
        elif f.name == "offsets":
            out.offsets = {**x, **{k: max(v, x.get(k, 0)) for k, v in y.items()}}
        else:
            out.timings = {k: x.get(k, 0.0) + y.get(k, 0.0) for k in {*x, *y}}
    return out


def _undecodable(topics: Topics, rec: Record, max_depth: int) -> str | None:
    """Why a record folded outside ``apply_batch``'s decoding cannot be decoded with its fold's type
    (memory, semantic, link updates), or None."""
    from somnus.projections.causal import UpdateRow
    from somnus.projections.semantic import KIND_INGEST, KIND_PROMOTE, KnowledgeIngested, PromotionRequested
    from somnus.projections.sleep import KIND_SLEEP
    from somnus.schemas.lifecycle import SleepRequested
    from somnus.schemas.memory import KIND_ACCESS, MemoryAccessed, MemoryUnit

    kind = _header(rec, "somnus-kind")
    if rec.topic == topics.memory:
        what, t = {KIND_ACCESS: ("memory accesses", list[MemoryAccessed]), KIND_SLEEP: ("sleep request", SleepRequested)
                   }.get(kind, ("memory units", list[MemoryUnit]))  # type: ignore[arg-type]
    elif rec.topic == topics.semantic:
        if kind not in (KIND_INGEST, KIND_PROMOTE):
            return None
        what, t = ("knowledge", KnowledgeIngested) if kind == KIND_INGEST else ("promotion request", PromotionRequested)
    elif rec.topic == topics.link_updates:
        what, t = "link updates", list[UpdateRow]
    else:
        return None
    got = decode_bounded(msgspec.json.Decoder(t), rec.value, max_depth)
    if not isinstance(got, Rejection):
        return None
    k, _, rest = got.reason.partition(": ")
    return f"{k}: invalid {what}: {rest}"


KIND_PROMOTION = b"promotion"  # header somnus-kind on the facts topic: a FactPromoted
KIND_SERVED = b"briefing-served"  # a BriefingServed
# (no header: a FactsExtracted)


def _header(rec: Record, name: str) -> bytes | None:
    for k, v in rec.headers or ():
        if k == name:
            return v
    return None


def _write_working_memory(con: duckdb.DuckDBPyConnection, states: Mapping[bytes, tuple[bytes | None, Any]]) -> None:
    """The current working memory of each session in ``states`` (key -> its changelog bytes and their
    decoded state; a read model: replaced, not appended)."""
    rows = []
    for key, (raw, st) in states.items():
        if raw is None:
            continue
        rows.append({"session_key": key.decode(errors="replace"), "agent": st.agent, "session_id": st.session_id,
                     "user_id": st.user_id, "closed": st.closed, "last_seq": st.last_seq, "tokens": st.tokens,
                     "state": raw.decode()})
    gone = pa.table({"session_key": [k.decode(errors="replace") for k in states]})  # noqa: F841
    con.execute("DELETE FROM working_memory WHERE session_key IN (SELECT session_key FROM gone)")
    if rows:
        frame = pa.Table.from_pylist(rows)  # noqa: F841
        con.execute("INSERT INTO working_memory SELECT session_key, agent, session_id, user_id, closed, last_seq, "
                    "tokens, state::JSON FROM frame")


_episode_decoder = msgspec.json.Decoder(EpisodeDistilled)
_facts_decoder = msgspec.json.Decoder(FactsExtracted)
_wm_decoder = msgspec.json.Decoder(WorkingMemoryState)
_forget_decoder = msgspec.json.Decoder(ForgetRequested)
_FACT_DECODERS: dict[bytes | None, tuple[str, msgspec.json.Decoder]] = {
    KIND_PROMOTION: ("promotion", _promotion_decoder), KIND_SERVED: ("served", _served_decoder)}


def _prescan(rec: Record, max_depth: int) -> str | None:
    """Why a record of one of our topics folded elsewhere must not reach its decoder (depth, UTF-8)."""
    return "undecodable: empty message (no value)" if rec.value is None else check_json(rec.value, None, max_depth, None)


def _add_events(cols: dict[str, list[Any]], rec: Record, max_event_bytes: int, max_depth: int = MAX_DEPTH,
                skew_us: int = 0, objs: list[tuple[Record, int, Any]] | None = None) -> int:
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
            objs.append((rec, index, ev))
    return invalid


def _once_per_event_id(con: duckdb.DuckDBPyConnection, topics: Topics, cols: dict[str, list[Any]],
                       objs: list[tuple[Record, int, Any]], dup_rows: list[dict[str, Any]], dead: Any) -> None:
    """Keep in ``cols`` the events whose ``event_id`` is new (the first copy in the batch). A copy of an
    id its own session holds is a row of ``dup_rows`` (counted, not projected again); an id another
    session holds is a dead letter (kind ``duplicate``). Which of two sessions on different partitions
    keeps a reused id follows the order the projector reads them in."""
    ids = uuid_texts(cols["event_id"])
    batch_ids = pa.table({"event_id": ids})  # noqa: F841
    owner: dict[str, tuple[str, str]] = {
        str(eid): (agent, sid) for eid, agent, sid in con.execute(
            "SELECT event_id, agent, session_id FROM events WHERE event_id IN (SELECT event_id::UUID FROM batch_ids)"
        ).fetchall()}
    keep: list[int] = []
    for i, (eid, (rec, index, ev)) in enumerate(zip(ids, objs)):
        mine = (ev.agent, ev.session_id)
        held = owner.get(eid)
        if held is None:
            owner[eid] = mine
            keep.append(i)
        elif held == mine:
            dup_rows.append({"event_id": eid, "agent": ev.agent, "session_id": ev.session_id, "seq": ev.seq,
                             "src_partition": rec.partition, "src_offset": rec.offset, "src_index": index})
        else:
            dead(rec, index, f"duplicate: event_id {eid} already belongs to session {held[1]!r} of agent "
                             f"{held[0]!r}; this {type_name(ev)} event of session {ev.session_id!r} of agent "
                             f"{ev.agent!r} reuses it", encode(ev))
    if len(keep) < len(ids):
        for name, col in cols.items():
            cols[name] = [col[i] for i in keep]


_DL_SCHEMA = pa.schema([
    ("src_topic", pa.string()), ("src_partition", pa.int32()), ("src_offset", pa.int64()), ("src_index", pa.int32()),
    ("kind", pa.string()), ("reason", pa.string()), ("msg_key", pa.binary()), ("original", pa.binary()),
    ("dlq_partition", pa.int32()), ("dlq_offset", pa.int64())])
