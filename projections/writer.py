"""Apply a batch of Kafka records to the projections: rows and source offsets in one transaction.

A batch whose records are at or past the stored offsets is applied once; records before the stored
offset of their partition (a redelivery) are skipped, so applying the same batch twice changes
nothing. Episodes re-emitted by the worker after a crash have the same ``episode_id`` and are
skipped (first one wins); dead letters are unique by their source coordinates and kind. The keys
already projected are held in memory (``ReadModels``), loaded once from the tables. Each projected
topic has its sink (``projections/sinks.py``): ``apply_batch`` hands it its records, then begins the
transaction, has each sink write, records the offsets and commits.

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
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import duckdb
import msgspec
import pyarrow as pa

from somnus.projections.frames import registered
from somnus.projections.read_models import ReadModels
from somnus.projections.sinks import (
    KIND_PROMOTION,
    KIND_SERVED,
    BatchResult,
    DeadLetters,
    EpisodesSink,
    FactsSink,
    ForgetStep,
    LinkUpdatesSink,
    MemorySink,
    Record,
    SemanticSink,
    Sink,
    TracesSink,
    WorkingMemorySink,
    _header,
    _promotion_decoder,
    _served_decoder,
)
from somnus.schemas.briefing import BriefingServed, FactPromoted
from somnus.projections.causal import UpdateRow
from somnus.schemas.codec import MAX_DEPTH, Rejection, decode_bounded, poison_reason, truncated_note
from somnus.schemas.goals import KIND_GOAL_CLOSED, KIND_GOAL_SET, GoalClosed, GoalSet
from somnus.schemas.lifecycle import KIND_SLEEP, SleepRequested
from somnus.schemas.memory import KIND_ACCESS, MemoryAccessed, MemoryUnit
from somnus.schemas.sealed import FORGOTTEN, open_record
from somnus.schemas.semantic import KIND_INGEST, KIND_PROMOTE, KnowledgeIngested, PromotionRequested

__all__ = [
    "KIND_PROMOTION",
    "KIND_SERVED",
    "BatchResult",
    "ReadModels",
    "Record",
    "Topics",
    "apply_batch",
    "apply_guarded",
    "decode_promotion",
    "decode_served",
    "load_offsets",
]

log = logging.getLogger("somnus.projector")


def decode_promotion(raw: bytes) -> FactPromoted:
    return _promotion_decoder.decode(raw)


def decode_served(raw: bytes) -> BriefingServed:
    return _served_decoder.decode(raw)


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


def load_offsets(con: duckdb.DuckDBPyConnection) -> dict[tuple[str, int], int]:
    rows = con.execute("SELECT topic, kafka_partition, next_offset FROM projection_offsets").fetchall()
    return {(t, p): o for t, p, o in rows}


@dataclass
class BatchSinks:
    """A batch's sinks, one per projected topic, in the order they write (dead letters before the
    folds, the forget purge last: it deletes what the others wrote of a forgotten subject)."""

    models: ReadModels
    by_topic: dict[str, Sink]
    dead: DeadLetters
    episodes: EpisodesSink
    facts: FactsSink
    forget: ForgetStep
    order: list[Sink]

    @classmethod
    def make(
        cls, topics: Topics, models: ReadModels, res: BatchResult, max_event_bytes: int, max_depth: int, skew_us: int
    ) -> BatchSinks:
        dead = DeadLetters(models, res)
        forget = ForgetStep(models, res, dead)
        traces = TracesSink(models, res, dead, max_event_bytes, max_depth, skew_us)
        episodes = EpisodesSink(models, res, dead, max_depth)
        links = LinkUpdatesSink(models, res, dead, max_depth)
        memory = MemorySink(models, res, dead, max_depth)
        working = WorkingMemorySink(models, res, dead, max_depth)
        semantic = SemanticSink(models, res, dead, max_depth)
        facts = FactsSink(models, res, dead, max_depth, forget, memory)
        by_topic: dict[str, Sink] = {
            topics.traces: traces,
            topics.episodes: episodes,
            topics.facts: facts,
            topics.semantic: semantic,
            topics.working_memory: working,
            topics.memory: memory,
            topics.link_updates: links,
            topics.dead_letters: dead,
        }
        by_topic.pop("", None)  # a topic this projector does not read
        return cls(
            models,
            by_topic,
            dead,
            episodes,
            facts,
            forget,
            [traces, episodes, dead, links, memory, working, semantic, facts, forget],
        )


def apply_batch(
    con: duckdb.DuckDBPyConnection,
    topics: Topics,
    records: Iterable[Record],
    stored: Mapping[tuple[str, int], int],
    max_event_bytes: int,
    models: ReadModels,
    quarantine: Mapping[tuple[str, int, int], str] | None = None,
    max_depth: int = MAX_DEPTH,
    max_clock_skew_s: float = 0.0,
) -> BatchResult:
    """Write one batch and its offsets atomically. ``stored`` is the offsets table as last loaded;
    ``models`` are updated once the transaction has committed. A record that cannot be decoded, or whose
    coordinates ``quarantine`` names (with the reason), is a dead letter (see the module's text)."""
    res = BatchResult()
    sinks = BatchSinks.make(topics, models, res, max_event_bytes, max_depth, int(max_clock_skew_s * 1_000_000))
    _take(records, stored, quarantine or {}, sinks, res)
    if not res.offsets:
        return res
    for sink in sinks.order:
        sink.prepare(con)
    res.lap("decode")
    con.begin()
    try:
        _write(con, sinks, res)
        con.commit()
        res.lap("commit")
    except BaseException:
        con.rollback()
        for sink in sinks.order:
            sink.rolled_back(con)
        raise
    for sink in sinks.order:
        sink.committed(con)
    return res


def _take(
    records: Iterable[Record],
    stored: Mapping[tuple[str, int], int],
    quarantine: Mapping[tuple[str, int, int], str],
    sinks: BatchSinks,
    res: BatchResult,
) -> None:
    """Hand each record past its partition's stored offset to its topic's sink (or to the dead letters)."""
    for rec in records:
        tp = (rec.topic, rec.partition)
        if rec.offset < stored.get(tp, 0) or rec.offset < res.offsets.get(tp, 0):
            continue  # already projected
        res.offsets[tp] = rec.offset + 1
        opened = open_record(rec, sinks.models.keys.keys)  # a sealed record: its plaintext (somnus.schemas.sealed)
        if opened is FORGOTTEN:  # its data key was deleted by a forget: skipped, counted
            res.shredded += 1
            continue
        if isinstance(opened, Rejection):
            sinks.dead.quarantine(rec, 0, opened.reason)
            continue
        rec = opened  # type: ignore[assignment]
        named = sinks.forget.mentions(rec)  # a forgotten subject's record: purged before commit
        why = quarantine.get((rec.topic, rec.partition, rec.offset))
        if why is not None:
            sinks.dead.quarantine(rec, 0, why + truncated_note(rec.value))
            continue
        sink = sinks.by_topic.get(rec.topic)
        if sink is not None:
            sink.add(rec, named)


def _write(con: duckdb.DuckDBPyConnection, sinks: BatchSinks, res: BatchResult) -> None:
    """Every sink's rows, the briefings they make stale, and the offsets (in the caller's transaction)."""
    for sink in sinks.order:
        if sink is sinks.forget:  # after every fold, before the purge: what is new for each agent
            sinks.models.briefings.invalidate(con, sinks.episodes.agents, sinks.facts.scopes)
            res.lap("invalidate")
        sink.write(con)
    offsets = pa.table(
        {
            "topic": [t for t, _ in res.offsets],
            "kafka_partition": [p for _, p in res.offsets],
            "next_offset": list(res.offsets.values()),
        }
    )
    with registered(con, offsets_frame=offsets):
        con.execute("INSERT OR REPLACE INTO projection_offsets SELECT * FROM offsets_frame")


# Failures of the machine, not of a record: the batch is not retried record by record, the projector
# stops (and its supervisor starts it again) as before.
ENVIRONMENT_ERRORS: tuple[type[BaseException], ...] = (
    OSError,
    MemoryError,
    duckdb.IOException,
    duckdb.OutOfMemoryException,
    duckdb.FatalException,
    duckdb.InternalException,
)


def apply_guarded(
    con: duckdb.DuckDBPyConnection,
    topics: Topics,
    records: Iterable[Record],
    stored: Mapping[tuple[str, int], int],
    max_event_bytes: int,
    models: ReadModels,
    max_depth: int = MAX_DEPTH,
    max_clock_skew_s: float = 0.0,
) -> BatchResult:
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
            res = apply_batch(
                con, topics, part, progress, max_event_bytes, models, quarantine, max_depth, max_clock_skew_s
            )
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
        log.error(
            "a batch of %d records failed (%r): applying it again without the records that fail",
            len(records),
            failed.__cause__,
        )
    for rec in records:
        opened = open_record(rec, models.keys.keys)  # as apply_batch reads it (skipped or a dead letter there)
        skipped = opened is FORGOTTEN or isinstance(opened, Rejection)
        reason = None if skipped else _undecodable(topics, opened, max_depth)  # type: ignore[arg-type]
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
            quarantine[(rec.topic, rec.partition, rec.offset)] = poison_reason(
                exc or failed, f"while folding {rec.topic}"
            )
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
    kind = _header(rec, "somnus-kind")
    if rec.topic == topics.memory:
        what, t = {
            KIND_ACCESS: ("memory accesses", list[MemoryAccessed]),
            KIND_SLEEP: ("sleep request", SleepRequested),
            KIND_GOAL_SET: ("goal", GoalSet),
            KIND_GOAL_CLOSED: ("goal closed", GoalClosed),
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
