"""Deep sleep: what one run decides, as a deterministic, resumable sequence of events.

**What.** A run is a deterministic sequence of decision events (``schemas/lifecycle.py``), planned
from the state as it was before the run, in a fixed order of phases:

1. ``hippocampus``: dream phase A (``processors/sleep/dreaming.py``) then, for episodes: protection,
   retention, compression, pruning (stale, temporal coverage, ``maxEpisodes``);
2. ``promotion`` (a callable of the shell, e.g. issue 7's promoter): before consolidation, so the
   source episodes still exist when cross-layer edges form;
3. ``consolidation``: the same rules for the ATL and Angular Gyrus layers (slower: 30-day max age),
   triple retention (closed more than 90 days ago: out of the live projection), dream phase B
   (connect, FSRS review, abstract);
4. ``refresh``: briefings (a callable of the shell), then the report (counts, Fiedler value and its
   trend, prediction-error saturation) in ``SleepCompleted``.

Each phase sees the effects of the earlier ones (applied to a working copy of the columns).

**Crash and resume.** ``SleepPlan.events(start)`` yields the decisions from ``seq = start``; the
same pre-run state gives the same plan, so a resumed run emits exactly the remaining events. The
consumer applies a run only once its ``SleepCompleted`` is seen (``RunAssembler``), so the state a
resumed run plans from is still the pre-run state. ``apply_run`` is the reference fold.
``SleepPlan.encoded(start)`` is ``events(start)`` already encoded, as columns (type name, memory
id, JSON body): what a shell that stores millions of decisions reads, with no object per event.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import msgspec
import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from somnus.processors.sleep import dreaming
from somnus.processors.sleep.config import HIPPOCAMPUS, US_PER_DAY, SleepConfig
from somnus.processors.sleep.encoding import (
    ENCODE_CHUNK,
    Compacts,
    EncodedEvents,
    FrameRows,
    RowTexts,
    Segment,
    compact_texts,
    json_ints,
    json_numbers,
    json_text,
)
from somnus.processors.sleep.report import build_report
from somnus.processors.sleep.schedule import from_us, require_aware, run_id_for, to_us
from somnus.processors.sleep.scoring import (
    DATETIME_US,
    Columns,
    Consolidated,
    compact_memory,
    consolidate,
    idle_triples,
    memory_frame,
    retire_triples,
)
from somnus.schemas.lifecycle import (
    BriefingRefreshed,
    CompactMemory,
    DecisionCarried,
    MemoriesConnected,
    MemoryCompressed,
    MemoryPromoted,
    MemoryProtected,
    MemoryPruned,
    MemoryRefined,
    MemoryRescored,
    ObservationClustered,
    ObservationCreated,
    ObservationHeld,
    PatternAbstracted,
    PatternSource,
    ProtectReason,
    PruneReason,
    RetireReason,
    ReviewScheduled,
    RunEvent,
    SleepCompleted,
    SleepPhase,
    SleepPhaseCompleted,
    SleepReport,
    SleepStarted,
    SleepTrigger,
    TripleRetired,
    compact_size,
    encode_lifecycle,
)


@dataclass(frozen=True)
class SleepInputs:
    """Everything a run reads, as of the run's event time (the pre-run state)."""

    memories: pl.DataFrame
    edges: pl.DataFrame | None = None  # src, dst[, weight]: the associative graph(s)
    # triple_id, valid_to[, scope, last_touched]: the triples (with scope and last_touched, the live ones
    # idle for ``SleepConfig.fact_retire_days`` of their scope's stream time retire: ``idle_triples``)
    triples: pl.DataFrame | None = None
    scope_times: Mapping[str, datetime] | None = None  # scope -> its stream time (the shell's, per scope)
    vectors: np.ndarray | None = None  # L2-normalised, one row per memory in the order of ``memories``
    observations: pl.DataFrame | None = None  # observation_id, agent, observed_at: new since the last run
    observation_vectors: np.ndarray | None = None  # one row per observation, in its order
    capture_errors: pl.DataFrame | None = None  # observed_at, prediction_error (capture decisions)
    # Instead of ``vectors``/``observation_vectors``: L2-normalised vectors of memories or observations
    # by id, asked for one agent at a time (the fold's signatures, ``projections/sleep.py``).
    embed: Callable[[Sequence[str]], np.ndarray] | None = None
    patterns: frozenset[str] = frozenset()  # ids of patterns already abstracted
    fiedler_history: tuple[float, ...] = ()  # earlier runs' largest-component Fiedler values, oldest first
    max_episodes: Mapping[str, int] = field(default_factory=dict)  # per agent (AgentSpec.max_episodes)


@dataclass(frozen=True)
class SleepView:
    """What the shell's phases (promotion, briefings) see: the state after phase 1."""

    run_id: str
    at: datetime
    memories: pl.DataFrame  # survivors, with ``compressed`` updated
    pruned: tuple[str, ...]  # ids pruned in phase 1

    def promoted(self, memory_id: str, agent: str, concept_id: str) -> MemoryPromoted:
        return MemoryPromoted(
            run_id=self.run_id, seq=0, at=self.at, memory_id=memory_id, agent=agent, concept_id=concept_id
        )

    def briefing(self, agent: str) -> BriefingRefreshed:
        return BriefingRefreshed(run_id=self.run_id, seq=0, at=self.at, agent=agent)

    def carried(self, kind: str, payload: bytes) -> DecisionCarried:
        return DecisionCarried(run_id=self.run_id, seq=0, at=self.at, carried_kind=kind, payload=msgspec.Raw(payload))


Phase = Callable[[SleepView], Sequence[RunEvent]]


class SleepPlan:
    """The decisions of one run, in order; events are built lazily from columns."""

    def __init__(
        self,
        run_id: str,
        at: datetime,
        segments: list[Segment],
        report: Callable[[], SleepReport],
        counts: dict[str, int],
    ) -> None:
        self.run_id = run_id
        self.at = at
        self.segments = segments
        self._report = report
        self.counts = counts

    @property
    def report(self) -> SleepReport:
        """The run's report (built once, on first use: it needs the compact sizes, which emitting
        the events computes anyway)."""
        return self._report()

    def __len__(self) -> int:
        return sum(len(s) for s in self.segments)

    def events(self, start: int = 0) -> Iterator[RunEvent]:
        """The events with ``seq >= start``: a resumed run passes the next seq it has not emitted."""
        seq = 0
        for segment in self.segments:
            size = len(segment)
            if seq + size <= start:
                seq += size
                continue
            first = max(start - seq, 0)
            rows = segment.rows[first:] if first else segment.rows
            for offset, row in enumerate(rows, first):
                yield segment.build(row, seq + offset)
            seq += size

    def encoded(self, start: int = 0) -> EncodedEvents:
        """``events(start)`` as columns, encoded a chunk of rows at a time where a segment can (the
        bulk kinds: no event object per row), event by event elsewhere."""
        kinds: list[pa.Array] = []
        memory_ids: list[pa.Array] = []
        bodies: list[pa.Array] = []
        seq = 0
        for segment in self.segments:
            size = len(segment)
            first = max(start - seq, 0)
            if segment.encode is not None:
                for lo in range(first, size, ENCODE_CHUNK):
                    hi = min(lo + ENCODE_CHUNK, size)
                    cls, ids, body = segment.encode(lo, hi, seq + lo)
                    kinds.append(pa.repeat(pa.scalar(cls.__name__, pa.string()), hi - lo))
                    memory_ids.append(ids.cast(pa.string()))
                    bodies.append(body.cast(pa.string()))
            elif first < size:
                rows = segment.rows[first:] if first else segment.rows
                events = [segment.build(row, seq + offset) for offset, row in enumerate(rows, first)]
                kinds.append(pa.array([type(ev).__name__ for ev in events], pa.string()))
                memory_ids.append(pa.array([getattr(ev, "memory_id", None) for ev in events], pa.string()))
                bodies.append(pa.array([encode_lifecycle(ev) for ev in events], pa.binary()).cast(pa.string()))
            seq += size
        total = len(self)
        empty = pa.array([], pa.string())
        return EncodedEvents(
            pa.array(np.arange(min(start, total), total, dtype=np.int64)),
            pa.concat_arrays(kinds) if kinds else empty,
            pa.concat_arrays(memory_ids) if memory_ids else empty,
            pa.chunked_array(bodies, pa.string()),
        )


def _rows(frame: pl.DataFrame) -> list[tuple[Any, ...]]:
    return frame.rows()


def plan_sleep(
    inputs: SleepInputs,
    *,
    now: datetime,
    trigger: SleepTrigger = SleepTrigger.SCHEDULE,
    watermark: datetime | None = None,
    config: SleepConfig = SleepConfig(),
    promotion: Phase | None = None,
    refresh: Phase | None = None,
    input_offset: int | None = None,
) -> SleepPlan | None:
    """Plan the run at ``now`` (event time). None when ``now <= watermark``: that run is done."""
    require_aware(now, "now")
    now = now.astimezone(timezone.utc)
    if watermark is not None and now <= watermark:
        return None
    run_id = run_id_for(now)
    now_us = to_us(now)
    c = Columns(inputs.memories, inputs.edges, now_us, config)
    n = c.n
    ids = c.ids.to_list()
    agents_of = c.frame["agent"].to_list()
    layer_of = c.layer.tolist()
    segments: list[Segment] = []
    counts: dict[str, int] = {}
    texts = RowTexts(c, run_id, now)

    def add(
        kind: str,
        rows: Sequence[Any],
        build: Callable[[Any, int], RunEvent],
        encode: Callable[[int, int, int], tuple[type, pa.Array, pa.Array]] | None = None,
    ) -> None:
        counts[kind] = counts.get(kind, 0) + len(rows)
        if len(rows):
            segments.append(Segment(rows, build, encode))

    add(
        "started",
        [None],
        lambda _r, seq: SleepStarted(
            run_id=run_id,
            seq=seq,
            at=now,
            trigger=trigger,
            schedule=config.schedule,
            previous=watermark,
            input_offset=input_offset,
            config=config.digest(),
        ),
    )
    phase_sizes: list[int] = []

    def close_phase(phase: SleepPhase) -> None:
        decided = sum(len(s) for s in segments) - 1 - sum(phase_sizes) - len(phase_sizes)
        phase_sizes.append(decided)
        add(
            "phase_completed",
            [decided],
            lambda d, seq: SleepPhaseCompleted(run_id=run_id, seq=seq, at=now, phase=phase, decisions=d),
        )

    # ---- phase 1: hippocampus ----------------------------------------------------------------
    refreshed = np.zeros(n, dtype=bool)
    extra = np.zeros(n)
    vectors = _Vectors(c, inputs, ids)
    observed = np.zeros(n, dtype=bool)  # memories of the fold that phase A routes: recent for connect
    if inputs.observations is not None and inputs.observations.height and vectors.for_observations:
        obs = inputs.observations
        observed = c.ids.is_in(obs["observation_id"].cast(pl.String).to_list()).to_numpy()
        obs_time = obs["observed_at"]
        if isinstance(obs.schema["observed_at"], pl.Datetime) and obs.schema["observed_at"].time_zone is None:
            obs_time = obs_time.dt.replace_time_zone("UTC")
        obs_us = obs_time.dt.epoch("us").to_numpy().astype(np.int64)
        phase_a = _dream_phase_a(c, inputs.observations, obs_us, vectors, ids)
        obs_time_of = dict(zip(obs["observation_id"].cast(pl.String).to_list(), obs_us.tolist(), strict=True))
        add(
            "clustered",
            _rows(phase_a.clustered),
            lambda r, seq: ObservationClustered(
                run_id=run_id,
                seq=seq,
                at=now,
                observation_id=r[0],
                memory_id=r[1],
                agent=r[2],
                prediction_error=r[3],
                threshold=r[4],
            ),
        )
        add(
            "held",
            _rows(phase_a.held),
            lambda r, seq: ObservationHeld(
                run_id=run_id,
                seq=seq,
                at=now,
                observation_id=r[0],
                nearest_id=r[1],
                agent=r[2],
                prediction_error=r[3],
                nearest_edges=r[4],
            ),
        )
        add(
            "created",
            _rows(phase_a.created),
            lambda r, seq: ObservationCreated(
                run_id=run_id,
                seq=seq,
                at=now,
                observation_id=r[0],
                agent=r[1],
                observed_at=from_us(obs_time_of[r[0]]),
                prediction_error=r[2],
                nearest_id=r[3],
                surprise=r[4],
                linked=r[5],
            ),
        )
        add(
            "refined",
            _rows(phase_a.refined),
            lambda r, seq: MemoryRefined(
                run_id=run_id,
                seq=seq,
                at=now,
                memory_id=r[0],
                agent=r[1],
                evidence=list(r[2]),
                mean_prediction_error=r[3],
            ),
        )
        if phase_a.refined.height:
            row_of = {mid: i for i, mid in enumerate(ids)}
            for mid, ev in zip(
                phase_a.refined["memory_id"].to_list(), phase_a.refined["evidence"].to_list(), strict=True
            ):
                # A memory created from an earlier observation of this run has no row yet.
                if mid in row_of:
                    refreshed[row_of[mid]] = True
                    extra[row_of[mid]] += len(ev)
    # Dream phase B's new edges are decided now (emitted in phase 3) so that every retention of this
    # run already counts them: a re-plan on the applied state then finds nothing to change. Only
    # memories that stay uncompressed this run qualify (idle < compress-after), so nothing decided
    # below can invalidate them.
    connected = _connect(c, vectors, refreshed, watermark, now_us, ids, observed)
    if connected.height:
        row_of = {mid: i for i, mid in enumerate(ids)}
        c.add_edges(
            np.array([row_of[x] for x in connected["a"].to_list()], dtype=np.int64),
            np.array([row_of[x] for x in connected["b"].to_list()], dtype=np.int64),
            connected["weight"].to_numpy(),
        )
    caps = np.array(
        [inputs.max_episodes.get(a, config.max_episodes if config.max_episodes is not None else -1) for a in c.agents],
        dtype=np.int64,
    )
    caps = np.where(caps < 0, -1, caps)
    hip = consolidate(c, c.is_hip, config, refreshed=refreshed, extra_accesses=extra, caps=caps)
    pruned = hip.pruned.copy()
    compressed_now = hip.compress.copy()
    compacts = [_decision_segments(add, c, hip, run_id, now, ids, agents_of, layer_of, refreshed, texts)]
    close_phase(SleepPhase.HIPPOCAMPUS)

    # ---- phase 2: promotion -------------------------------------------------------------------
    promoted = _external(
        add,
        promotion,
        lambda: _view(c, run_id, now, pruned, c.compressed | compressed_now, ids),
        run_id,
        now,
        "promoted",
    )
    close_phase(SleepPhase.PROMOTION)

    # ---- phase 3: consolidation of ATL + Angular Gyrus, triples, dream phase B ----------------
    semantic_rows = ~c.is_hip
    sem = consolidate(c, semantic_rows, config, pruned_before=pruned, compressed_before=c.compressed | compressed_now)
    compacts.append(_decision_segments(add, c, sem, run_id, now, ids, agents_of, layer_of, None, texts))
    pruned |= sem.pruned
    compressed_now |= sem.compress
    retired = (
        retire_triples(inputs.triples, now, config.triple_retention_days)
        if inputs.triples is not None
        else pl.DataFrame(schema={"triple_id": pl.String, "valid_to": DATETIME_US})
    )
    add(
        "triples_retired",
        retired.rows(),
        lambda r, seq: TripleRetired(run_id=run_id, seq=seq, at=now, triple_id=r[0], valid_to=r[1]),
    )
    idle = (
        idle_triples(inputs.triples, now, config.fact_retire_days, inputs.scope_times)
        if inputs.triples is not None and {"scope", "last_touched"} <= set(inputs.triples.columns)
        else pl.DataFrame(schema={"triple_id": pl.String, "last_touched": DATETIME_US})
    )
    add(
        "triples_retired",
        idle.rows(),
        lambda r, seq: TripleRetired(
            run_id=run_id, seq=seq, at=now, triple_id=r[0], valid_to=now, reason=RetireReason.IDLE, last_touched=r[1]
        ),
    )
    survivors = ~pruned
    compressed_after = c.compressed | compressed_now
    add(
        "connected",
        connected.rows(),
        lambda r, seq: MemoriesConnected(run_id=run_id, seq=seq, at=now, a=r[0], b=r[1], agent=r[2], weight=r[3]),
    )
    reviews, reviewed_rows = _reviews(c, survivors, now_us, extra)
    add(
        "reviewed",
        FrameRows(reviews),
        lambda r, seq: ReviewScheduled(
            run_id=run_id,
            seq=seq,
            at=now,
            memory_id=r[0],
            agent=r[1],
            rating=r[2],
            elapsed_days=r[3],
            retrievability=r[4],
            stability=r[5],
            difficulty=r[6],
            interval_days=r[7],
            due_at=from_us(now_us + r[7] * US_PER_DAY),
            reviewed_access_count=r[8],
        ),
        texts.columnar(
            ReviewScheduled, reviewed_rows, lambda rows, lo, hi: _review_fields(reviews.slice(lo, hi - lo), now_us)
        ),
    )
    patterns = _abstract(c, inputs, survivors)
    add(
        "abstracted",
        patterns.rows(),
        lambda r, seq: PatternAbstracted(
            run_id=run_id,
            seq=seq,
            at=now,
            pattern_id=r[0],
            agent=r[1],
            key=r[2],
            domains=list(r[3]),
            support=r[4],
            sources=[PatternSource(m, d) for m, d in zip(r[5], r[6], strict=True)],
        ),
    )
    close_phase(SleepPhase.CONSOLIDATION)

    # ---- phase 4: refresh (briefings) and the report -----------------------------------------
    _external(add, refresh, lambda: _view(c, run_id, now, pruned, compressed_after, ids), run_id, now, "briefings")
    close_phase(SleepPhase.REFRESH)
    built: list[SleepReport] = []

    def report() -> SleepReport:
        if not built:
            compact_bytes = sum(compact.total() for compact in compacts)
            built.append(
                build_report(
                    c,
                    inputs.fiedler_history,
                    inputs.capture_errors,
                    now_us,
                    pruned,
                    compressed_now,
                    compact_bytes,
                    counts,
                    promoted,
                )
            )
        return built[0]

    total = sum(len(s) for s in segments) + 1
    add(
        "completed",
        [None],
        lambda _r, seq: SleepCompleted(run_id=run_id, seq=seq, at=now, watermark=now, decisions=total, report=report()),
    )
    return SleepPlan(run_id, now, segments, report, counts)


def _decision_segments(
    add: Callable[..., None],
    c: Columns,
    d: Consolidated,
    run_id: str,
    now: datetime,
    ids: list[str],
    agents_of: list[str],
    layer_of: list[str],
    refreshed: np.ndarray | None,
    texts: RowTexts,
) -> Compacts:
    """Protected, compressed, pruned, rescored: each kind ordered by (agent, memory_id)."""

    def ordered(mask: np.ndarray) -> np.ndarray:
        rows = np.flatnonzero(mask)
        return rows[np.lexsort((rows, c.agent_code[rows]))]

    def protect_reasons(r: int) -> list[ProtectReason]:
        reasons = []
        if c.user[r]:
            reasons.append(ProtectReason.USER_INTERACTION)
        if c.success[r]:
            reasons.append(ProtectReason.SUCCESS)
        return reasons

    # The reasons' texts by (user interaction, success): [], [user], [success], [user, success].
    reason_texts = pa.array(
        [
            json_text([r for r, on in ((ProtectReason.USER_INTERACTION, u), (ProtectReason.SUCCESS, s)) if on])
            for s in (False, True)
            for u in (False, True)
        ],
        pa.string(),
    )
    protected = ordered(d.protect)
    add(
        "protected",
        protected.tolist(),
        lambda r, seq: MemoryProtected(
            run_id=run_id,
            seq=seq,
            at=now,
            memory_id=ids[r],
            agent=agents_of[r],
            layer=layer_of[r],
            reasons=protect_reasons(r),
        ),
        texts.columnar(
            MemoryProtected,
            protected,
            lambda rows, lo, hi: {
                "reasons": reason_texts.take(pa.array(c.user[rows].astype(np.int64) + 2 * c.success[rows]))
            },
        ),
    )
    access_us = c.access_us if refreshed is None else np.where(refreshed, c.now_us, c.access_us)
    compressed = ordered(d.compress)
    compressed_rows = compressed.tolist()
    keys: dict[int, list[str] | None] = {}

    def compact_of(r: int) -> CompactMemory:
        if not keys:  # the index keys of every compressed row, on first use
            keys.update(zip(compressed_rows, c.frame["index_keys"].gather(compressed_rows).to_list(), strict=True))
        return compact_memory(
            ids[r],
            int(c.created_us[r]),
            int(access_us[r]),
            str(c.outcome[r]),
            int(c.access_count[r]),
            int(d.snapshot[r]),
            keys[r] or [],
        )

    compacts = Compacts(
        compressed_rows,
        compact_of,
        lambda: compact_texts(c, compressed, access_us, d.snapshot, texts.id_texts, compact_of),
    )

    def compressed_event(r: int, seq: int) -> MemoryCompressed:
        compact = compacts.get(r)
        return MemoryCompressed(
            run_id=run_id,
            seq=seq,
            at=now,
            memory_id=ids[r],
            agent=agents_of[r],
            layer=layer_of[r],
            compact=compact,
            bytes_before=int(c.size_bytes[r]),
            bytes_after=compact_size(compact),
            retention=float(d.retention[r]),
        )

    def compressed_fields(rows: np.ndarray, lo: int, hi: int) -> dict[str, Any]:
        compact = compacts.texts()[lo:hi]
        return {
            "compact": compact,
            "bytes_before": json_ints(c.size_bytes[rows]),
            "bytes_after": json_ints(pc.binary_length(compact).to_numpy()),
            "retention": json_numbers(d.retention[rows].tolist()),
        }

    add(
        "compressed", compressed_rows, compressed_event, texts.columnar(MemoryCompressed, compressed, compressed_fields)
    )
    prune_reasons = pa.array([json_text(PruneReason.STALE), json_text(PruneReason.OVER_CAPACITY)], pa.string())
    pruned = ordered(d.pruned)
    add(
        "pruned",
        pruned.tolist(),
        lambda r, seq: MemoryPruned(
            run_id=run_id,
            seq=seq,
            at=now,
            memory_id=ids[r],
            agent=agents_of[r],
            layer=layer_of[r],
            reason=PruneReason.STALE if d.reason[r] == 1 else PruneReason.OVER_CAPACITY,
            retention=float(d.prune_retention[r]),
            idle_days=round(float(c.idle_days[r]), 6),
        ),
        texts.columnar(
            MemoryPruned,
            pruned,
            lambda rows, lo, hi: {
                "reason": prune_reasons.take(pa.array((d.reason[rows] != 1).astype(np.int64))),
                "retention": json_numbers(d.prune_retention[rows].tolist()),
                "idle_days": json_numbers([round(x, 6) for x in c.idle_days[rows].tolist()]),
            },
        ),
    )
    rescored = ordered(d.rescore)
    add(
        "rescored",
        rescored.tolist(),
        lambda r, seq: MemoryRescored(
            run_id=run_id,
            seq=seq,
            at=now,
            memory_id=ids[r],
            agent=agents_of[r],
            layer=layer_of[r],
            retention=float(d.retention[r]),
            previous=None if np.isnan(c.stored[r]) else float(c.stored[r]),
        ),
        texts.columnar(
            MemoryRescored,
            rescored,
            lambda rows, lo, hi: {
                "retention": json_numbers(d.retention[rows].tolist()),
                "previous": json_numbers([None if x != x else x for x in c.stored[rows].tolist()]),
            },
        ),
    )
    return compacts


def _view(
    c: Columns, run_id: str, now: datetime, pruned: np.ndarray, compressed: np.ndarray, ids: list[str]
) -> SleepView:
    frame = c.frame.with_columns(pl.Series("compressed", compressed)).filter(pl.Series(~pruned))
    return SleepView(run_id, now, frame, tuple(ids[r] for r in np.flatnonzero(pruned)))


def _external(
    add: Callable[..., None], phase: Phase | None, view: Callable[[], SleepView], run_id: str, now: datetime, kind: str
) -> int:
    if phase is None:
        add(kind, [], lambda r, seq: r)
        return 0
    produced = list(phase(view()))
    for ev in produced:
        if getattr(ev, "run_id", None) != run_id:
            raise ValueError(f"a {kind} phase returned an event of another run: {ev!r}")
    add(kind, produced, lambda ev, seq: msgspec.structs.replace(ev, seq=seq, at=now))
    return sum(1 for ev in produced if isinstance(ev, MemoryPromoted))


def fold_observations(
    memories: pl.DataFrame, since: datetime | None, per_agent: int, captured: Sequence[str] = ()
) -> pl.DataFrame:
    """What dream phase A routes when the observations are the fold's own memories: the hippocampus
    memories created after ``since`` (the last run; None: all), or ``captured`` since it whatever
    their event time, uncompressed, at most the newest ``per_agent`` of each agent. Columns
    observation_id, agent, observed_at, by agent then time then id.

    >>> from datetime import datetime, timezone
    >>> t = lambda h: datetime(2024, 5, 1, h, tzinfo=timezone.utc)
    >>> m = pl.DataFrame({"memory_id": ["m1", "m2", "m3", "m4"], "agent": ["a", "a", "a", "b"],
    ...                   "layer": ["hippocampus"] * 4, "created_at": [t(1), t(5), t(6), t(7)],
    ...                   "compressed": [False] * 4})
    >>> fold_observations(m, t(2), 1)["observation_id"].to_list()
    ['m3', 'm4']
    """
    empty = pl.DataFrame(schema={"observation_id": pl.String, "agent": pl.String, "observed_at": DATETIME_US})
    if memories.height == 0 or per_agent <= 0:
        return empty
    created = pl.col("created_at").dt.convert_time_zone("UTC").dt.cast_time_unit("us")
    new = memories.filter((pl.col("layer") == HIPPOCAMPUS) & ~pl.col("compressed").fill_null(False))
    if since is not None:
        new = new.filter(
            (created > since.astimezone(timezone.utc)) | pl.col("memory_id").cast(pl.String).is_in(list(captured))
        )
    return (
        new.select(
            pl.col("memory_id").cast(pl.String).alias("observation_id"),
            pl.col("agent").cast(pl.String),
            created.alias("observed_at"),
        )
        .sort(["agent", "observed_at", "observation_id"], descending=[False, True, True])
        .group_by("agent", maintain_order=True)
        .head(per_agent)
        .sort(["agent", "observed_at", "observation_id"])
    )


def _connect(
    c: Columns,
    vectors: _Vectors,
    refreshed: np.ndarray,
    watermark: datetime | None,
    now_us: int,
    ids: list[str],
    observed: np.ndarray | None = None,
) -> pl.DataFrame:
    """Dream phase B's connect step over the recently active memories (accessed or created since the
    watermark, else in the last day of their scope's stream time; routed or refreshed by phase A)
    that stay uncompressed this run."""
    empty = pl.DataFrame(schema={"a": pl.String, "b": pl.String, "agent": pl.String, "weight": pl.Float64})
    if not vectors.for_memories or c.n == 0:
        return empty
    # Without a previous run, "recent" is the last day of each memory's own stream time (``at_us``):
    # another scope's newer events never make a scope's memories less recent.
    since = to_us(watermark) if watermark is not None else c.at_us - US_PER_DAY
    idle = np.where(refreshed, 0.0, c.idle_days)
    eligible = ~c.compressed & (idle < c.compress_after)
    # An observation is recent (it just arrived) but not refreshed: one idle enough to be compressed
    # this run stays out.
    seen = refreshed if observed is None else refreshed | observed
    recent = np.flatnonzero(eligible & (seen | (c.access_us > since) | (c.created_us > since)))
    if len(recent) < 2:
        return empty
    in_recent = np.zeros(c.n, dtype=bool)
    in_recent[recent] = True
    both = in_recent[c.gi] & in_recent[c.gj]
    existing = {(ids[a], ids[b]) for a, b in zip(c.gi[both].tolist(), c.gj[both].tolist(), strict=True)}
    agents = c.frame["agent"].to_numpy()
    parts = []
    # Each layer has its own associative graph; an agent's memories connect among themselves only,
    # so each (layer, agent) is one call (``connect_recent`` does agents in sorted order: the same rows).
    for code, _ in enumerate(c.layer_names):
        in_layer = recent[c.layer_code[recent] == code]
        if len(in_layer) < 2:
            continue
        for rows in _by_agent(c, in_layer):
            if len(rows) > 1:
                parts.append(
                    dreaming.connect_recent([ids[r] for r in rows], agents[rows], vectors.memories(rows), existing)
                )
    return pl.concat(parts) if parts else empty


def _by_agent(c: Columns, rows: np.ndarray) -> list[np.ndarray]:
    """``rows`` split by agent, agents in sorted order (``c.agent_code`` is the rank of the agent)."""
    order = rows[np.argsort(c.agent_code[rows], kind="stable")]
    code = c.agent_code[order]
    cuts = np.flatnonzero(code[1:] != code[:-1]) + 1
    return np.split(order, cuts) if len(order) else []


class _Vectors:
    """Memory and observation vectors, by run row: ``SleepInputs.vectors`` / ``observation_vectors``
    (dense, whole), else ``SleepInputs.embed`` by id, made per agent on demand (a fold of a million
    memories never holds them all at once)."""

    def __init__(self, c: Columns, inputs: SleepInputs, ids: list[str]) -> None:
        self.inputs = inputs
        self.c = c
        self.ids = ids
        self._dense: np.ndarray | None = None
        self.for_memories = inputs.vectors is not None or inputs.embed is not None
        self.for_observations = (inputs.vectors is not None and inputs.observation_vectors is not None) or (
            inputs.vectors is None and inputs.embed is not None
        )

    def memories(self, rows: np.ndarray) -> np.ndarray:
        if self.inputs.vectors is None:
            assert self.inputs.embed is not None
            return _checked(self.inputs.embed([self.ids[r] for r in rows]), len(rows), "memories")
        if self._dense is None:
            self._dense = np.asarray(self.inputs.vectors)[self.c.input_order]
        return self._dense[rows]

    def observations(self, rows: np.ndarray, observation_ids: Sequence[str]) -> np.ndarray:
        if self.inputs.vectors is None:
            assert self.inputs.embed is not None
            return _checked(self.inputs.embed([observation_ids[r] for r in rows]), len(rows), "observations")
        return np.asarray(self.inputs.observation_vectors)[rows]


def _checked(vectors: np.ndarray, n: int, what: str) -> np.ndarray:
    out = np.asarray(vectors)
    if out.ndim != 2 or out.shape[0] != n:
        raise ValueError(f"embed returned {out.shape} for {n} {what}: one row per id needed")
    return out


def _dream_phase_a(
    c: Columns, observations: pl.DataFrame, obs_us: np.ndarray, vectors: _Vectors, ids: list[str]
) -> dreaming.PhaseA:
    """Dream phase A, one agent at a time (what ``dreaming.dream_phase_a`` does over all agents at
    once). An observation that is itself a memory of the fold (the shell feeds the memories captured
    since the last run) is not in the pool it is routed against: it is what is being routed."""
    obs_ids = observations["observation_id"].cast(pl.String).to_list()
    obs_agents = np.asarray(observations["agent"].cast(pl.String).to_list(), dtype=object)
    pool = c.is_hip & ~c.ids.is_in(obs_ids).to_numpy()
    pool_edges = c.degree(~c.compressed) if c.has_graph else c.edge_count
    pool_of = {c.agents[int(c.agent_code[rows[0]])]: rows for rows in _by_agent(c, np.flatnonzero(pool))}
    no_rows = np.zeros(0, np.int64)
    parts = []
    for agent in sorted(set(obs_agents.tolist())):
        o = np.flatnonzero(obs_agents == agent)
        p = pool_of.get(agent, no_rows)
        parts.append(
            dreaming.dream_phase_a(
                [ids[r] for r in p],
                [agent] * len(p),
                vectors.memories(p) if len(p) else np.zeros((0, 1)),
                pool_edges[p],
                [obs_ids[i] for i in o],
                [agent] * len(o),
                obs_us[o],
                vectors.observations(o, obs_ids),
            )
        )
    return dreaming.PhaseA(
        *(pl.concat([getattr(x, name) for x in parts]) for name in dreaming.PhaseA._fields)
    )._replace(refined=pl.concat([x.refined for x in parts]).sort("memory_id"))


def _reviews(c: Columns, survivors: np.ndarray, now_us: int, extra: np.ndarray) -> tuple[pl.DataFrame, np.ndarray]:
    """The reviews of the FSRS schedule (one row each, in event order), and the memory rows they are of."""
    f = c.frame
    stability = f["stability"].fill_null(np.nan).to_numpy().astype(np.float64)
    difficulty = f["difficulty"].fill_null(np.nan).to_numpy().astype(np.float64)
    last_review = f["last_review"].dt.epoch("us").fill_null(0).to_numpy().astype(np.int64)
    accesses = (c.access_count + extra).astype(np.int64)
    new_accesses = accesses - f["reviewed_access_count"].to_numpy().astype(np.int64)
    rows = np.flatnonzero(survivors)
    r = dreaming.review(
        stability[rows],
        difficulty[rows],
        last_review[rows],
        f["last_rating"].to_numpy()[rows],
        new_accesses[rows],
        f["contradicted"].to_numpy().astype(bool)[rows],
        now_us,
    )
    picked = rows[r.rows]
    order = np.lexsort((picked, c.agent_code[picked]))
    at = picked[order]
    return pl.DataFrame(
        {
            "memory_id": c.ids.gather(at),
            "agent": f["agent"].gather(at),
            "rating": r.rating[order],
            "elapsed_days": np.round(r.elapsed_days[order], 6),
            "retrievability": np.round(r.retrievability[order], 6),
            "stability": np.round(r.stability[order], 6),
            "difficulty": np.round(r.difficulty[order], 6),
            "interval_days": r.interval_days[order],
            "reviewed_access_count": accesses[at],
        }
    ), at


def _review_fields(reviews: pl.DataFrame, now_us: int) -> dict[str, Any]:
    """The texts of the ``ReviewScheduled`` fields a review row holds (``decision`` has the rest)."""
    fields: dict[str, Any] = {}
    for name in (
        "rating",
        "elapsed_days",
        "retrievability",
        "stability",
        "difficulty",
        "interval_days",
        "reviewed_access_count",
    ):
        column = reviews[name]
        fields[name] = (
            json_ints(column.to_numpy())
            if column.dtype.is_integer() and not column.null_count()
            else json_numbers(column.to_list())
        )
    intervals = reviews["interval_days"]
    distinct = intervals.unique().sort()  # a few: due dates made once each
    due = pa.array([json_text(from_us(now_us + days * US_PER_DAY)) for days in distinct.to_list()], pa.string())
    fields["due_at"] = due.take(pa.array(distinct.search_sorted(intervals).to_numpy()))
    return fields


def _abstract(c: Columns, inputs: SleepInputs, survivors: np.ndarray) -> pl.DataFrame:
    f = c.frame.filter(pl.Series(survivors)).filter((pl.col("domain") != "") & (pl.col("index_keys").list.len() > 0))
    return dreaming.abstract_patterns(f, set(inputs.patterns))


# --- consuming a run: resume and apply -----------------------------------------------------------


class RunAssembler:
    """Collects a run's events (duplicates ignored by seq) and releases the run once complete.

    A consumer (the projector) feeds every lifecycle event; ``feed`` returns the runs that became
    complete (all seqs 0..n-1 present, ``SleepCompleted`` last), in order. ``next_seq(run_id)`` is
    where a crashed producer resumes (``SleepPlan.events(start=next_seq)``).
    """

    def __init__(self) -> None:
        self._runs: dict[str, dict[int, RunEvent]] = {}
        self.completed: set[str] = set()

    def feed(self, events: Iterable[RunEvent]) -> list[list[RunEvent]]:
        done: list[list[RunEvent]] = []
        for ev in events:
            if ev.run_id in self.completed:
                continue
            run = self._runs.setdefault(ev.run_id, {})
            run.setdefault(ev.seq, ev)
            end = next((e for e in run.values() if isinstance(e, SleepCompleted)), None)
            if end is not None and len(run) == end.decisions:
                done.append([run[s] for s in range(end.decisions)])
                self.completed.add(ev.run_id)
                del self._runs[ev.run_id]
        return done

    def next_seq(self, run_id: str) -> int:
        """The first seq not yet seen without a gap before it (0 for an unknown run)."""
        if run_id in self.completed:
            return -1
        run = self._runs.get(run_id, {})
        seq = 0
        while seq in run:
            seq += 1
        return seq


def apply_run(
    memories: pl.DataFrame, edges: pl.DataFrame | None, events: Sequence[RunEvent]
) -> tuple[pl.DataFrame, pl.DataFrame | None]:
    """The reference fold of one complete run over memory columns and the edge list (what the
    projector does in SQL). Not the hot path: used by tests and small tools."""
    frame = memory_frame(memories)
    known = set(frame["memory_id"].to_list())  # an observation that is a memory already (the fold's) stays one
    updates: dict[str, dict[str, Any]] = {}
    removed: set[str] = set()
    unlinked: set[str] = set()
    new_rows: list[dict[str, Any]] = []
    new_edges: list[tuple[str, str, float]] = []
    for ev in events:
        if isinstance(ev, MemoryPruned):
            removed.add(ev.memory_id)
            unlinked.add(ev.memory_id)
        elif isinstance(ev, MemoryCompressed):
            updates.setdefault(ev.memory_id, {}).update(
                compressed=True,
                size_bytes=ev.bytes_after,
                edge_count=ev.compact.edge_count,
                retention=ev.retention,
                index_keys=list(ev.compact.keys),
            )
            unlinked.add(ev.memory_id)
        elif isinstance(ev, MemoryProtected):
            updates.setdefault(ev.memory_id, {})["long_term"] = True
        elif isinstance(ev, MemoryRescored):
            updates.setdefault(ev.memory_id, {})["retention"] = ev.retention
        elif isinstance(ev, MemoryRefined):
            u = updates.setdefault(ev.memory_id, {})
            u["last_access"] = ev.at
            u["__accesses"] = u.get("__accesses", 0) + len(ev.evidence)
        elif isinstance(ev, ReviewScheduled):
            updates.setdefault(ev.memory_id, {}).update(
                stability=ev.stability,
                difficulty=ev.difficulty,
                last_review=ev.at,
                last_rating=ev.rating,
                reviewed_access_count=ev.reviewed_access_count,
                contradicted=False,
            )
        elif isinstance(ev, MemoriesConnected):
            new_edges.append((ev.a, ev.b, ev.weight))
        elif isinstance(ev, ObservationCreated) and ev.observation_id not in known:
            new_rows.append(
                {
                    "memory_id": ev.observation_id,
                    "agent": ev.agent,
                    "layer": HIPPOCAMPUS,
                    "created_at": ev.observed_at,
                    "last_access": None,
                    "access_count": 0,
                    "importance": 0.5,
                    "outcome": "",
                    "is_user_interaction": False,
                    "edge_count": 0,
                    "size_bytes": 0,
                    "long_term": False,
                }
            )
    if updates:
        rows = frame.to_dicts()
        for row in rows:
            update = updates.get(row["memory_id"])
            if update:
                for k, v in update.items():
                    if k == "__accesses":
                        row["access_count"] += v
                    else:
                        row[k] = v
        frame = memory_frame(pl.DataFrame(rows, schema=frame.schema))
    frame = frame.filter(~pl.col("memory_id").is_in(sorted(removed)))
    if new_rows:
        frame = pl.concat([frame, memory_frame(pl.DataFrame(new_rows))], how="diagonal_relaxed")
        frame = memory_frame(frame)
    if edges is not None:
        weight = pl.col("weight").cast(pl.Float64) if "weight" in edges.columns else pl.lit(1.0).alias("weight")
        e = edges.select(pl.col("src").cast(pl.String), pl.col("dst").cast(pl.String), weight)
        gone = sorted(unlinked)
        e = e.filter(~pl.col("src").is_in(gone) & ~pl.col("dst").is_in(gone))
        if new_edges:
            e = pl.concat([e, pl.DataFrame(new_edges, schema=e.schema, orient="row")])
        edges = e
    return frame.sort("memory_id"), edges
