"""Semantic memory events: what the ATL (concepts), the Angular Gyrus (statistical patterns) and the
cross-layer graph become. Every state change is one of these, so a fold over them in log order
(``somnus.processors.semantic.layers.MemoryLayers.apply``) rebuilds the same layers: the log is the source of truth,
there are no save/load files.

Every event names its ``owner``, the memory it belongs to (``"agent:<name>"``, ``"team:<lead>"`` or
``"global"``: the knowledge scopes of ``schemas/facts.py``), and ``at``, the event time of the
decision (the ``now`` the sleep cycle ran with, never the wall clock of a replay).

>>> from datetime import datetime, timezone
>>> ev = ConceptCreated(owner="agent:airline", concept_id="c1", name="coffee_mug", definition="a mug",
...     category="object", provenance=Provenance.DIRECT_INGESTION, at=datetime(2024, 5, 1, tzinfo=timezone.utc))
>>> decode_semantic(encode_semantic(ev)) == ev
True
>>> encode_semantic(ev)[:24]
b'{"kind":"concept_created'
"""

from __future__ import annotations

from datetime import datetime
from enum import Enum
from typing import Annotated, Any, Union

import msgspec
from msgspec import Meta

NonEmpty = Annotated[str, Meta(min_length=1)]
Unit = Annotated[float, Meta(ge=0.0, le=1.0)]
Count = Annotated[int, Meta(ge=1)]


class Layer(str, Enum):
    """The three memory layers."""

    HIPPOCAMPUS = "hippocampus"  # episodes (EpisodeDistilled), id = str(episode_id)
    ATL = "atl"  # concepts
    ANGULAR_GYRUS = "angular_gyrus"  # statistical patterns (MathRecord)


class Provenance(str, Enum):
    """How a concept was formed."""

    EPISODIC_CONSOLIDATION = "episodic_consolidation"  # promoted from episodes via NAc causal links
    AGENT_INFERENCE = "agent_inference"  # promoted from a confirmed statistical pattern
    DIRECT_INGESTION = "direct_ingestion"  # ingested from a document (ingest-knowledge)
    HYBRID = "hybrid"  # more than one of the above


class RelationOrigin(str, Enum):
    BUILTIN = "builtin"
    AGENT_PROPOSED = "agent_proposed"


class CrossEdgeType(str, Enum):
    """Typed edges between records of different layers (direction as stored: source -> target)."""

    DERIVED_FROM = "DERIVED_FROM"  # ATL concept -> hippocampus episode it was derived from
    INSTANCE_OF = "INSTANCE_OF"  # hippocampus episode -> ATL concept it is an instance of
    STATISTICALLY_CONFIRMS = "STATISTICALLY_CONFIRMS"  # AG pattern -> ATL concept it confirmed
    QUANTIFIES = "QUANTIFIES"  # AG record -> ATL concept it puts a number on
    TEMPORALLY_CORRELATES = "TEMPORALLY_CORRELATES"  # any <-> any (stored once, read both ways)
    COMPUTED_FROM = "COMPUTED_FROM"  # AG record -> hippocampus episode whose data it used
    INFORMS = "INFORMS"  # any -> any


class MathCategory(str, Enum):
    PATTERN = "PATTERN"  # a trend: least-squares slope of a daily rate
    CORRELATION = "CORRELATION"  # two daily metrics move together
    PHASE_LOCK = "PHASE_LOCK"  # a rate follows the circadian phase


class MathRecord(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A confirmed statistical pattern (Angular Gyrus record).

    ``math_id`` is derived from (owner, category, metric), so a later re-confirmation of the same
    pattern replaces the record. ``query`` is DuckDB SQL over the ``episodes`` projection that
    computes the figures in ``statistics``; ``source_episode_ids`` are a bounded sample of the
    episodes the data came from (the COMPUTED_FROM edges). ``source_agents`` is its provenance: the
    agents whose calls it was computed from, sorted, so a read serves it only to readers whose scope
    chain covers them (empty: not recorded, a record from before the field)."""

    math_id: NonEmpty
    name: NonEmpty  # "stat:tool:book_reservation:success"
    category: MathCategory
    domain: NonEmpty  # "tool_reliability", "circadian", ...
    subjects: list[str]  # the tools (or other subjects) it is about, sorted
    verbal: str  # one sentence a model can read
    query: str
    confidence: Unit
    n_observations: Annotated[int, Meta(ge=0)]
    statistics: dict[str, float] = {}
    source_episode_ids: list[str] = []
    source_agents: list[str] = []


class ConceptCreated(
    msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, tag="concept_created", tag_field="kind"
):
    owner: NonEmpty
    concept_id: NonEmpty
    name: NonEmpty
    definition: str
    category: NonEmpty
    provenance: Provenance
    at: datetime
    properties: dict[str, Any] = {}
    source_episode_ids: list[str] = []
    evidence: list[str] = []  # non-episodic evidence keys: "math:<id>@<n>", "doc:<source>"
    reinforcement_count: Count = 1
    embedding_text: str = ""


class ConceptReinforced(
    msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, tag="concept_reinforced", tag_field="kind"
):
    """More evidence for a concept: ``by`` is added to its reinforcement count; ``properties`` are
    merged over the old ones (new values win); a non-empty ``definition`` replaces the old one."""

    owner: NonEmpty
    concept_id: NonEmpty
    by: Count
    provenance: Provenance  # the provenance after this evidence (HYBRID when sources differ)
    at: datetime
    source_episode_ids: list[str] = []  # only the new ones
    evidence: list[str] = []
    properties: dict[str, Any] = {}
    definition: str = ""


class RelationshipTypeRegistered(
    msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, tag="relationship_type_registered", tag_field="kind"
):
    """A relationship type proposed at run time (the built-in ones need no event)."""

    owner: NonEmpty
    name: NonEmpty  # upper snake case, e.g. "PROPERTY_OF"
    symmetric: bool
    origin: RelationOrigin
    at: datetime
    description: str = ""


class RelationshipFormed(
    msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, tag="relationship_formed", tag_field="kind"
):
    """``source --relation--> target`` between two concepts; forming it again updates weight and metadata.
    For a symmetric relation the fold also holds the reverse edge."""

    owner: NonEmpty
    source_id: NonEmpty
    relation: NonEmpty
    target_id: NonEmpty
    at: datetime
    weight: Unit = 1.0
    metadata: dict[str, Any] = {}  # PHASE_LOCKED_TO: {"phase_hour": .., "coupling": ..}


class PatternConfirmed(msgspec.Struct, frozen=True, kw_only=True, tag="pattern_confirmed", tag_field="kind"):
    owner: NonEmpty
    record: MathRecord
    at: datetime


class CrossLayerEdgeFormed(msgspec.Struct, frozen=True, kw_only=True, tag="cross_layer_edge_formed", tag_field="kind"):
    owner: NonEmpty
    source_layer: Layer
    source_id: NonEmpty
    edge_type: CrossEdgeType
    target_layer: Layer
    target_id: NonEmpty
    weight: Unit
    at: datetime


class ConceptPromoted(
    msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, tag="concept_promoted", tag_field="kind"
):
    """Audit of one promotion: which candidate became (or reinforced) which concept, and why it passed."""

    owner: NonEmpty
    concept_id: NonEmpty
    pattern_name: NonEmpty
    origin: NonEmpty  # "nac" | "statistician" | another source's name
    candidate_confidence: Unit
    created: bool
    gate: str  # the IPS verdict, e.g. "structured: dispersion p=0.0004 (cv=0.12, n=12)"
    at: datetime


class CandidateRejected(
    msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, tag="candidate_rejected", tag_field="kind"
):
    """Audit of a candidate the IPS gate turned away (no state change besides this record)."""

    owner: NonEmpty
    pattern_name: NonEmpty
    origin: NonEmpty
    candidate_confidence: Unit
    reason: str
    at: datetime


class RecordRemoved(
    msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, tag="record_removed", tag_field="kind"
):
    """A record left a layer (consolidation or an explicit removal); its edges go with it."""

    owner: NonEmpty
    layer: Layer
    record_id: NonEmpty
    reason: str
    at: datetime


SemanticEvent = Union[
    ConceptCreated,
    ConceptReinforced,
    RelationshipTypeRegistered,
    RelationshipFormed,
    PatternConfirmed,
    CrossLayerEdgeFormed,
    ConceptPromoted,
    CandidateRejected,
    RecordRemoved,
]

_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(SemanticEvent)


def encode_semantic(event: SemanticEvent) -> bytes:
    """Canonical JSON bytes of one semantic event (``kind`` first, then fields in declared order)."""
    return _encoder.encode(event)


def decode_semantic(raw: bytes) -> SemanticEvent:
    return _decoder.decode(raw)


# ---- the semantic topic's operator records (header ``somnus-kind``) --------------------------------
# The operator's commands published by ``somnus ingest`` / ``somnus consolidate`` and the projector
# (after a sleep run), read by the projector's semantic fold (``somnus.projections.semantic``).


class IngestedRelationship(msgspec.Struct, frozen=True):
    relation: str
    target: str


class IngestedConcept(msgspec.Struct, frozen=True, omit_defaults=True):
    name: str
    definition: str = ""
    category: str = "object"
    properties: dict[str, Any] = {}
    relationships: list[IngestedRelationship] = []


class CausalLinkView(msgspec.Struct, frozen=True, kw_only=True):
    """A plain ``CausalLinkLike`` (for adapters and tests)."""

    event_signature: str
    tool: str | None
    outcome: str
    valence: str
    strength: float
    confidence: float
    observation_count: int
    observation_times: list[datetime] = []
    source_episode_ids: list[str] = []
    event_observations: int | None = None  # observations of the event (all outcomes)
    base_rate: float | None = None  # share of this outcome's valence among all calls of the fleet
    source_agents: list[str] = []  # the agents it was observed for (empty: not recorded)


class TopicView(msgspec.Struct, frozen=True, kw_only=True):
    """A pattern dream phase B abstracted (``PatternAbstracted``): a key seen in ``support`` memories of
    ``agent`` across ``domains`` (for chat messages: sessions), with its source memories."""

    pattern_id: str
    agent: str
    key: str
    domains: list[str]
    support: int
    source_ids: list[str] = []


class CallOutcome(msgspec.Struct, frozen=True):
    """One tool call's outcome: the statistician's (and the NAc adapter's) input row."""

    tool: str
    ok: bool
    at: datetime  # event time (the episode's end)
    episode_id: str
    agent: str = ""


KIND_INGEST = b"knowledge-ingested"  # a KnowledgeIngested
KIND_PROMOTE = b"promotion-requested"  # a PromotionRequested
SLEEP_REQUEST_PREFIX = "sleep:"  # + run id: the promotion request of a sleep run (projector, somnus sleep)


class KnowledgeIngested(msgspec.Struct, frozen=True, kw_only=True):
    owner: str  # "global", "team:<lead>", "agent:<name>"
    source: str  # the document's name
    at: datetime
    concepts: list[IngestedConcept]


class _SealedTopicsOnly(msgspec.Struct):
    sealed_topics: list[bytes] = []


_sealed_topics_decoder = msgspec.json.Decoder(_SealedTopicsOnly)


def sealed_topics_of(value: bytes | None) -> list[bytes]:
    """The sealed topics of a promotion request's JSON (``[]`` for anything else). Never raises.

    >>> sealed_topics_of(b'{"owner": "global", "sealed_topics": ["AHNlYWxlZA=="]}')
    [b'\\x00sealed']
    >>> sealed_topics_of(b'[[['), sealed_topics_of(None)
    ([], [])
    """
    if not value or b"sealed_topics" not in value:
        return []
    try:
        return _sealed_topics_decoder.decode(value).sealed_topics
    except Exception:  # noqa: BLE001 - not a request of ours, or too deep: nothing sealed to name
        return []


class PromotionRequested(msgspec.Struct, frozen=True, kw_only=True):
    owner: str
    at: datetime  # event time the promotion runs at
    links: list[CausalLinkView] = []
    calls: list[CallOutcome] = []
    topics: list[TopicView] = []  # dream-abstracted patterns (``lifecycle_log``), oldest first
    # The same topics sealed (``somnus.schemas.sealed.seal_shared`` of a TopicView's JSON, under the data
    # keys of its source memories' sessions): a topic's key is a word of those sessions' text, so it
    # opens only while none of them is forgotten. The fold reads these after ``topics``.
    sealed_topics: list[bytes] = []
    # A request that may be published more than once (the projector's request after a scheduled
    # sleep run: ``sleep:<run_id>``) runs once; None: every copy runs (``somnus consolidate``).
    request_id: str | None = None
