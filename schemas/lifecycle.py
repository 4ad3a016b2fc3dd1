"""The memory lifecycle log: what a sleep run decided, one event per decision (topic ``lifecycle``).

A sleep run (``processors/sleep/plan.py``) is a deterministic sequence of decisions. Every event of a
run names the run (``run_id``), its place in it (``seq``: 0, 1, 2 ... with no gaps) and ``at``,
the run's event time (the cron fire time or the requested time, never the wall clock of the
machine that emits it). The sequence always has this shape::

    SleepStarted(seq=0)
      decisions of phase "hippocampus"   then SleepPhaseCompleted(phase="hippocampus")
      decisions of phase "promotion"     then SleepPhaseCompleted(phase="promotion")
      decisions of phase "consolidation" then SleepPhaseCompleted(phase="consolidation")
      decisions of phase "refresh"       then SleepPhaseCompleted(phase="refresh")
    SleepCompleted(seq=last, report)

``(run_id, seq)`` is the idempotence key: a consumer ignores a pair it has seen, and a run whose
``SleepCompleted`` it has not seen yet is not applied at all (a crashed run resumes and completes
the same sequence; see ``somnus.processors.sleep.plan.RunAssembler``). ``SleepCompleted.watermark`` is the
event time up to which sleep has run: a run at or before it is never planned again.

The compact form of a compressed memory (``CompactMemory``) uses one-letter keys on the wire so it
stays within ``COMPACT_MAX_BYTES`` (200) whatever the memory held.

>>> from datetime import datetime, timezone
>>> t = datetime(2024, 5, 15, 3, tzinfo=timezone.utc)
>>> ev = MemoryPruned(run_id="r1", seq=3, at=t, memory_id="m1", agent="support", layer="hippocampus",
...                   reason=PruneReason.STALE, retention=0.12, idle_days=9.5)
>>> decode_lifecycle(encode_lifecycle(ev)) == ev
True
>>> encode_lifecycle(ev)[:23]
b'{"kind":"memory_pruned"'
"""

from __future__ import annotations

from datetime import datetime
from enum import Enum
from typing import Annotated, Union

import msgspec
from msgspec import Meta

LIFECYCLE_SCHEMA_VERSION = 1
COMPACT_MAX_BYTES = 200  # a compressed memory's compact form, JSON-encoded, never exceeds this

NonEmpty = Annotated[str, Meta(min_length=1)]
Unit = Annotated[float, Meta(ge=0.0, le=1.0)]
Seq = Annotated[int, Meta(ge=0)]
Count = Annotated[int, Meta(ge=0)]


class SleepTrigger(str, Enum):
    SCHEDULE = "schedule"  # a cron fire time passed in stream time
    ON_DEMAND = "on_demand"  # a SleepRequested event


class SleepPhase(str, Enum):
    """The phases of a run, in their fixed order (``PHASE_ORDER``)."""

    HIPPOCAMPUS = "hippocampus"  # dream phase A, protect, compress, prune episodes
    PROMOTION = "promotion"  # episodes -> concepts (before consolidation: sources still exist)
    CONSOLIDATION = "consolidation"  # ATL + Angular Gyrus, triple retention, dream phase B
    REFRESH = "refresh"  # briefings, then the report


PHASE_ORDER: tuple[SleepPhase, ...] = (
    SleepPhase.HIPPOCAMPUS,
    SleepPhase.PROMOTION,
    SleepPhase.CONSOLIDATION,
    SleepPhase.REFRESH,
)


class PruneReason(str, Enum):
    STALE = "stale"  # not accessed for the layer's max age and a retention below the keep threshold
    OVER_CAPACITY = "over_capacity"  # the agent holds more than maxEpisodes episodes


class RetireReason(str, Enum):
    CLOSED = "closed"  # closed (valid_to) more than the triple retention window ago
    IDLE = "idle"  # live, but neither reinforced nor retrieved for the fact retirement window (Maximus)


class ProtectReason(str, Enum):
    USER_INTERACTION = "user_interaction"
    SUCCESS = "success"


class ObservationFate(str, Enum):
    """What dream phase A made of one new observation."""

    CLUSTERED = "clustered"  # folded into its nearest memory (low prediction error)
    HELD = "held"  # borderline match to a sparsely linked memory: stays episodic for now
    CREATED = "created"  # nothing close enough: a memory of its own


class CompactMemory(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """What a compressed memory keeps: id, times, outcome, key index fields, the edge snapshot."""

    memory_id: str = msgspec.field(name="id")
    created_at: datetime = msgspec.field(name="c")  # event time, whole seconds
    last_access: datetime = msgspec.field(name="a")
    outcome: str = msgspec.field(default="", name="o")
    access_count: Count = msgspec.field(default=0, name="n")
    edge_count: Count = msgspec.field(default=0, name="e")  # live edges when compressed: retention reads it later
    keys: list[str] = msgspec.field(default_factory=list, name="k")  # index keys, as many as fit


class PatternSource(msgspec.Struct, frozen=True):
    """A provenance edge of an abstracted pattern: pattern DERIVED_FROM this memory."""

    memory_id: str
    domain: str


class FiedlerSummary(msgspec.Struct, frozen=True, kw_only=True):
    value: float  # lambda_2 of the whole memory graph's Laplacian: 0 when it is disconnected
    largest_component: float  # lambda_2 of its largest connected component (the trend follows this)
    components: Count
    largest_size: Count
    nodes: Count
    edges: Count
    slope: float | None = None  # least-squares slope per run over the recent runs
    trend: str = "unknown"  # integrating | stable | fragmenting | unknown


class SaturationSummary(msgspec.Struct, frozen=True, kw_only=True):
    mean_pe: float | None  # mean prediction error of the window; None without samples
    previous_mean_pe: float | None
    samples: Count
    saturated: bool  # mean PE under the threshold with enough samples: the schema stopped being surprised
    status: str  # saturated | healthy | insufficient


class SleepReport(msgspec.Struct, frozen=True, kw_only=True):
    memories_before: Count
    memories_after: Count
    kept: Count  # memories left untouched (neither compressed nor pruned)
    compressed: Count
    pruned: Count
    protected: Count
    promoted: Count
    rescored: Count
    reviewed: Count
    triples_retired: Count
    clustered: Count
    held: Count
    created: Count
    connected: Count
    abstracted: Count
    bytes_before: Count
    bytes_after: Count
    per_layer: dict[str, dict[str, int]]  # layer -> {"before", "after", "compressed", "pruned"}
    fiedler: FiedlerSummary
    saturation: SaturationSummary
    narrative: str


class _Decision(msgspec.Struct, frozen=True, kw_only=True, tag_field="kind"):
    run_id: NonEmpty
    seq: Seq
    at: datetime


class SleepRequested(msgspec.Struct, frozen=True, kw_only=True, tag="sleep_requested", tag_field="kind"):
    """An on-demand run (``somnus sleep``): ``at`` is the event time it runs with."""

    at: datetime
    requested_by: str = ""


class SleepStarted(_Decision, frozen=True, kw_only=True, tag="sleep_started"):
    trigger: SleepTrigger
    schedule: str  # the cron expression in force
    previous: datetime | None  # the watermark this run starts from (the last completed run), None at first
    input_offset: int | None = None  # the memory-log offset the run was planned before (set by the shell)
    config: str  # digest of the policy the run used (a replay with another policy is visible)


class SleepPhaseCompleted(_Decision, frozen=True, kw_only=True, tag="sleep_phase_completed"):
    phase: SleepPhase
    decisions: Count  # decisions of this phase (this event excluded)


class SleepCompleted(_Decision, frozen=True, kw_only=True, tag="sleep_completed"):
    watermark: datetime  # = at: runs at or before it are done
    decisions: Count  # events of the run, this one included (= seq + 1)
    report: SleepReport


class MemoryProtected(_Decision, frozen=True, kw_only=True, tag="memory_protected"):
    """A memory becomes long-term: it is never pruned from now on (the flag is sticky)."""

    memory_id: NonEmpty
    agent: str
    layer: str
    reasons: list[ProtectReason]


class MemoryRescored(_Decision, frozen=True, kw_only=True, tag="memory_rescored"):
    memory_id: NonEmpty
    agent: str
    layer: str
    retention: Unit
    previous: float | None


class MemoryCompressed(_Decision, frozen=True, kw_only=True, tag="memory_compressed"):
    """The memory shrinks to ``compact``; its edges are removed (their count is in the snapshot)."""

    memory_id: NonEmpty
    agent: str
    layer: str
    compact: CompactMemory
    bytes_before: Count
    bytes_after: Count
    retention: Unit


class MemoryPruned(_Decision, frozen=True, kw_only=True, tag="memory_pruned"):
    """The memory leaves the live projection with its edges (the memory log keeps its history)."""

    memory_id: NonEmpty
    agent: str
    layer: str
    reason: PruneReason
    retention: Unit
    idle_days: float


class TripleRetired(_Decision, frozen=True, kw_only=True, tag="triple_retired"):
    """A triple leaves the live projection: closed longer ago than the retention window (``closed``:
    ``valid_to`` is when it closed), or live and idle (``idle``: ``valid_to`` is the run's time, when it
    is retired; ``last_touched`` its last reinforcement or retrieval). Never deleted."""

    triple_id: NonEmpty
    valid_to: datetime
    reason: RetireReason = RetireReason.CLOSED
    last_touched: datetime | None = None


class MemoryPromoted(_Decision, frozen=True, kw_only=True, tag="memory_promoted"):
    """A memory contributed to a concept (the promotion phase; the concept events ride along)."""

    memory_id: NonEmpty
    agent: str
    concept_id: NonEmpty


class BriefingRefreshed(_Decision, frozen=True, kw_only=True, tag="briefing_refreshed"):
    agent: NonEmpty


class DecisionCarried(_Decision, frozen=True, kw_only=True, tag="decision_carried"):
    """Another layer's event decided during the run (e.g. a concept event), carried verbatim so a
    resumed run re-emits it at the same seq; the projector decodes ``payload`` by ``carried_kind``."""

    carried_kind: NonEmpty
    payload: msgspec.Raw


class ObservationClustered(_Decision, frozen=True, kw_only=True, tag="observation_clustered"):
    observation_id: NonEmpty
    memory_id: NonEmpty  # the memory it joined
    agent: str
    prediction_error: Unit
    threshold: Unit  # the adaptive threshold it was under


class ObservationHeld(_Decision, frozen=True, kw_only=True, tag="observation_held"):
    observation_id: NonEmpty
    nearest_id: NonEmpty
    agent: str
    prediction_error: Unit
    nearest_edges: Count


class ObservationCreated(_Decision, frozen=True, kw_only=True, tag="observation_created"):
    """An unclustered observation becomes a memory; ``linked`` when it is related (PE <= 0.5)."""

    observation_id: NonEmpty
    agent: str
    observed_at: datetime
    prediction_error: Unit
    nearest_id: str | None
    surprise: bool
    linked: bool


class MemoryRefined(_Decision, frozen=True, kw_only=True, tag="memory_refined"):
    memory_id: NonEmpty
    agent: str
    evidence: list[str]  # the observations clustered into it, in event-time order
    mean_prediction_error: Unit


class MemoriesConnected(_Decision, frozen=True, kw_only=True, tag="memories_connected"):
    a: NonEmpty  # a < b
    b: NonEmpty
    agent: str
    weight: Unit


class ReviewScheduled(_Decision, frozen=True, kw_only=True, tag="review_scheduled"):
    """An FSRS review of a due memory: its new stability/difficulty and when it is due again."""

    memory_id: NonEmpty
    agent: str
    rating: Annotated[int, Meta(ge=1, le=4)]  # 1 again, 2 hard, 3 good, 4 easy
    elapsed_days: float
    retrievability: Unit
    stability: Annotated[float, Meta(gt=0.0)]
    difficulty: Annotated[float, Meta(ge=1.0, le=10.0)]
    interval_days: Annotated[int, Meta(ge=1)]
    due_at: datetime
    reviewed_access_count: Count


class PatternAbstracted(_Decision, frozen=True, kw_only=True, tag="pattern_abstracted"):
    """A pattern seen across domains, with provenance edges to the memories it came from."""

    pattern_id: NonEmpty
    agent: str
    key: NonEmpty
    domains: list[str]
    support: Count
    sources: list[PatternSource]


LifecycleEvent = Union[
    SleepRequested,
    SleepStarted,
    SleepPhaseCompleted,
    SleepCompleted,
    MemoryProtected,
    MemoryRescored,
    MemoryCompressed,
    MemoryPruned,
    TripleRetired,
    MemoryPromoted,
    BriefingRefreshed,
    DecisionCarried,
    ObservationClustered,
    ObservationHeld,
    ObservationCreated,
    MemoryRefined,
    MemoriesConnected,
    ReviewScheduled,
    PatternAbstracted,
]

RunEvent = Union[
    SleepStarted,
    SleepPhaseCompleted,
    SleepCompleted,
    MemoryProtected,
    MemoryRescored,
    MemoryCompressed,
    MemoryPruned,
    TripleRetired,
    MemoryPromoted,
    BriefingRefreshed,
    DecisionCarried,
    ObservationClustered,
    ObservationHeld,
    ObservationCreated,
    MemoryRefined,
    MemoriesConnected,
    ReviewScheduled,
    PatternAbstracted,
]
"""The events that belong to a run (all but ``SleepRequested``)."""

_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(LifecycleEvent)


def encode_lifecycle(event: LifecycleEvent) -> bytes:
    """Canonical JSON bytes of one lifecycle event (``kind`` first, then fields in declared order)."""
    return _encoder.encode(event)


def decode_lifecycle(raw: bytes) -> LifecycleEvent:
    return _decoder.decode(raw)


def compact_size(compact: CompactMemory) -> int:
    """Bytes of the compact form on the wire (what ``COMPACT_MAX_BYTES`` bounds)."""
    return len(_encoder.encode(compact))


KIND_SLEEP = b"sleep"  # header somnus-kind on the memory topic: a SleepRequested
