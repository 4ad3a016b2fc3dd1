"""Semantic memory (the ATL): concepts, typed relationships, find-or-create, ingestion, and the
merged "what do I know?" knowledge context. Pure: no I/O, no clock.

A concept is distilled knowledge ("book_reservation_unreliable", "coffee_mug") with a definition, a
category, properties, a provenance and the evidence that formed it. Its confidence grows with the
evidence: ``min(0.99, 0.5 + 0.1 * sqrt(reinforcement_count))``. Concept state lives in
``somnus.processors.semantic.layers.ConceptLayer``, a fold of the events in ``schemas/semantic.py``; the commands here
(``find_or_create``, ``form_relationship``, ``ingest_knowledge``) read that state and return the
events to apply, so the log alone rebuilds the memory.

Names are deduplicated: ``name_key`` folds case, width and separators, so "coffee_mug", "Coffee Mug"
and "coffee-mug" are one concept; names of at least ``NAME_MIN_FUZZY_CHARS`` characters that differ
by one edit (a typo, a plural: "book_reservations_unreliable") are one concept too. Not a 3-gram
Jaccard: at 0.9 it merges "<long tool name>_reliable" into "<long tool name>_unreliable".

>>> round(concept_confidence(4), 2), concept_confidence(10_000)
(0.7, 0.99)
>>> name_key("Coffee_Mug"), name_key("coffee mug"), name_key(" coffee-mug. ")
('coffee mug', 'coffee mug', 'coffee mug')
"""

from __future__ import annotations

import math
import re
import unicodedata
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

import msgspec
import orjson
import yaml

from somnus.schemas.semantic import (
    ConceptCreated,
    ConceptReinforced,
    Layer,
    Provenance,
    RelationOrigin,
    RelationshipFormed,
    RelationshipTypeRegistered,
    SemanticEvent,
)
from somnus.schemas.semantic import IngestedConcept, IngestedRelationship

if TYPE_CHECKING:  # the layers import this module; these names are only for annotations
    from somnus.processors.semantic.layers import MemoryLayers

CONFIDENCE_BASE = 0.5
CONFIDENCE_STEP = 0.1
CONFIDENCE_CAP = 0.99
NAME_MAX_EDITS = 1  # edit distance between two name keys that still makes them one concept
NAME_MIN_FUZZY_CHARS = 10  # shorter names must match exactly: too little text to trust a fuzzy match
SIMILAR_MIN = 0.3  # recall_similar: least token-set Jaccard worth returning
KNOWLEDGE_LIMIT = 8  # entries in the knowledge context
KNOWLEDGE_RELATIONSHIPS = 5  # relationships shown per concept
QUERY_BOOST = 1.0  # relevance = confidence * (1 + QUERY_BOOST * query-term overlap)

CONCEPT_NAMESPACE = uuid.UUID("3f6b2c1d-8e4a-4b7f-9c2d-1a5e6f7b8c9d")

# Concept categories named by the design; any other non-empty string is allowed.
CATEGORIES = ("object", "person", "action", "causal_pattern", "operational_pattern", "temporal_pattern")


def concept_confidence(reinforcement_count: int) -> float:
    """``min(0.99, 0.5 + 0.1 * sqrt(n))``: one observation is a guess, a hundred are knowledge.

    >>> [round(concept_confidence(n), 3) for n in (1, 9, 24, 25)]
    [0.6, 0.8, 0.99, 0.99]
    """
    return min(CONFIDENCE_CAP, CONFIDENCE_BASE + CONFIDENCE_STEP * math.sqrt(max(0, reinforcement_count)))


_SEP = re.compile(r"[\s_\-/]+")
_EDGE = "\"'`.,;:!?()[]{} \u201c\u201d\u2018\u2019"
_TOKEN = re.compile(r"[a-z0-9]+")
_DIGITS = re.compile(r"\d+")


def name_key(name: str) -> str:
    """The form concept names are compared in: NFKC, case-folded, ``_``/``-``/``/``/spaces as one space."""
    text = unicodedata.normalize("NFKC", name).casefold()
    return _SEP.sub(" ", text).strip(_EDGE) or name.strip()


def tokens(text: str) -> set[str]:
    """Word tokens for similarity: 'book_reservation fails' -> {'book', 'reservation', 'fails'}."""
    return set(_TOKEN.findall(unicodedata.normalize("NFKC", text).casefold()))


def concept_id_for(owner: str, name: str) -> str:
    """A concept's id: derived from its owner and name key, so a replay re-creates the same id."""
    return str(uuid.uuid5(CONCEPT_NAMESPACE, f"{owner}\x1f{name_key(name)}"))


def names_match(a: str, b: str) -> bool:
    """Same concept? Equal name keys, or keys of >= 10 characters at most one edit apart with the
    same digits (a digit is never a typo: "python 3.11" is not "python 3.12").

    >>> names_match("coffee_mug", "Coffee Mug"), names_match("book_reservation_unreliable", "book_reservations_unreliable")
    (True, True)
    >>> names_match("mug", "mugs"), names_match("book_reservation_reliable", "book_reservation_unreliable")
    (False, False)
    """
    ka, kb = name_key(a), name_key(b)
    if ka == kb:
        return True
    return (
        min(len(ka), len(kb)) >= NAME_MIN_FUZZY_CHARS
        and _DIGITS.findall(ka) == _DIGITS.findall(kb)
        and within_edits(ka, kb, NAME_MAX_EDITS)
    )


def within_edits(a: str, b: str, k: int) -> bool:
    """Levenshtein distance of ``a`` and ``b`` <= ``k`` (banded: O(len * k)).

    >>> within_edits("reservation", "reservations", 1), within_edits("reliable", "unreliable", 1)
    (True, False)
    """
    if abs(len(a) - len(b)) > k:
        return False
    prev = list(range(len(b) + 1))
    for i in range(1, len(a) + 1):
        cur = [i] + [k + 1] * len(b)
        for j in range(max(1, i - k), min(len(b), i + k) + 1):
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1]))
        if min(cur) > k:
            return False
        prev = cur
    return prev[len(b)] <= k


def combine_provenance(old: Provenance, new: Provenance) -> Provenance:
    """Evidence from a second kind of source makes a concept HYBRID.

    >>> combine_provenance(Provenance.EPISODIC_CONSOLIDATION, Provenance.AGENT_INFERENCE).value
    'hybrid'
    """
    return old if old is new else Provenance.HYBRID


# ---- the concept record ----------------------------------------------------------------------


@dataclass(slots=True)
class Concept:
    """A semantic memory (the design's ``SemanticMemory``), as the fold holds it."""

    concept_id: str
    name: str
    definition: str
    category: str
    properties: dict[str, Any]
    provenance: Provenance
    source_episode_ids: list[str]  # in the order they were learned
    evidence: list[str]
    reinforcement_count: int
    embedding_text: str
    created_at: datetime
    updated_at: datetime
    _episodes: set[str] = field(default_factory=set, repr=False)
    _evidence: set[str] = field(default_factory=set, repr=False)

    @property
    def confidence(self) -> float:
        return concept_confidence(self.reinforcement_count)

    def knows_episode(self, episode_id: str) -> bool:
        return episode_id in self._episodes

    def knows_evidence(self, key: str) -> bool:
        return key in self._evidence

    @classmethod
    def from_event(cls, ev: ConceptCreated) -> Concept:
        eps = list(dict.fromkeys(ev.source_episode_ids))
        evidence = list(dict.fromkeys(ev.evidence))
        return cls(
            concept_id=ev.concept_id,
            name=ev.name,
            definition=ev.definition,
            category=ev.category,
            properties=dict(ev.properties),
            provenance=ev.provenance,
            source_episode_ids=eps,
            evidence=evidence,
            reinforcement_count=ev.reinforcement_count,
            embedding_text=ev.embedding_text or embedding_text(ev.name, ev.definition, ev.properties),
            created_at=ev.at,
            updated_at=ev.at,
            _episodes=set(eps),
            _evidence=set(evidence),
        )

    def reinforce(self, ev: ConceptReinforced) -> bool:
        """Apply more evidence; False when the event brought none the concept did not have.

        An event that names its evidence counts only what is new, so a duplicate delivery of the
        same event changes nothing (``by`` counts only for an event that names no evidence)."""
        new_eps = [e for e in dict.fromkeys(ev.source_episode_ids) if e not in self._episodes]
        new_keys = [k for k in dict.fromkeys(ev.evidence) if k not in self._evidence]
        named = bool(ev.source_episode_ids or ev.evidence)
        if named and not new_eps and not new_keys:
            return False
        self.reinforcement_count += len(new_eps) + len(new_keys) if named else ev.by
        self.provenance = ev.provenance
        self._episodes.update(new_eps)
        self.source_episode_ids.extend(new_eps)
        self._evidence.update(new_keys)
        self.evidence.extend(new_keys)
        if ev.properties:
            self.properties = {**self.properties, **ev.properties}
        if ev.definition:
            self.definition = ev.definition
        self.embedding_text = embedding_text(self.name, self.definition, self.properties)
        self.updated_at = max(self.updated_at, ev.at)
        return True


SOURCE_AGENTS = "source_agents"  # a concept property: the agents whose data it was derived from, sorted


def embedding_text(name: str, definition: str, properties: Mapping[str, Any]) -> str:
    """The text similarity matching reads: name, definition and the property pairs, in key order
    (but ``source_agents``: provenance, not content)."""
    props = " ".join(f"{k} {v}" for k, v in sorted(properties.items()) if k != SOURCE_AGENTS)
    return " ".join(x for x in (name_key(name), definition, props) if x)


# ---- relationship types -----------------------------------------------------------------------


class RelationshipType(msgspec.Struct, frozen=True):
    name: str
    symmetric: bool
    origin: RelationOrigin
    description: str = ""


BUILTIN_RELATIONS: dict[str, RelationshipType] = {
    r.name: r
    for r in (
        RelationshipType("IS_A", False, RelationOrigin.BUILTIN, "a kind of: coffee_mug IS_A container"),
        RelationshipType("HAS_PART", False, RelationOrigin.BUILTIN, "robot_arm HAS_PART gripper"),
        RelationshipType("CAUSES", False, RelationOrigin.BUILTIN, "grasp_action CAUSES object_held"),
        RelationshipType("TRENDS_WITH", True, RelationOrigin.BUILTIN, "two trends move the same way"),
        RelationshipType("CORRELATES_WITH", True, RelationOrigin.BUILTIN, "confirmed by an AG correlation"),
        RelationshipType(
            "PHASE_LOCKED_TO", False, RelationOrigin.BUILTIN, "a rate follows a rhythm (metadata: phase_hour, coupling)"
        ),
        RelationshipType("PREDICTS", False, RelationOrigin.BUILTIN, "morning_activity PREDICTS high_success"),
    )
}


def relation_name(name: str) -> str:
    """Relationship type names are upper snake case: 'property of' -> 'PROPERTY_OF'."""
    return "_".join(_TOKEN.findall(unicodedata.normalize("NFKC", name).casefold())).upper()


class RelationshipRegistry:
    """The relationship types one memory knows: the built-ins plus those proposed at run time
    (registered by ``RelationshipTypeRegistered`` events, so they persist in the log)."""

    def __init__(self) -> None:
        self._types: dict[str, RelationshipType] = dict(BUILTIN_RELATIONS)

    def get(self, name: str) -> RelationshipType | None:
        return self._types.get(relation_name(name))

    def is_symmetric(self, name: str) -> bool:
        t = self.get(name)
        return t.symmetric if t is not None else False

    def apply(self, ev: RelationshipTypeRegistered) -> None:
        name = relation_name(ev.name)
        if name not in self._types:  # a built-in or a first registration is never redefined
            self._types[name] = RelationshipType(name, ev.symmetric, ev.origin, ev.description)

    def propose(
        self, owner: str, name: str, now: datetime, *, symmetric: bool = False, description: str = ""
    ) -> list[SemanticEvent]:
        """The event registering ``name`` as agent-proposed, or nothing when it is already known."""
        if self.get(name) is not None or not relation_name(name):
            return []
        return [
            RelationshipTypeRegistered(
                owner=owner,
                name=relation_name(name),
                symmetric=symmetric,
                origin=RelationOrigin.AGENT_PROPOSED,
                at=now,
                description=description,
            )
        ]

    def types(self) -> list[RelationshipType]:
        return [self._types[k] for k in sorted(self._types)]


# ---- commands: they read the fold and return events --------------------------------------------


def find_or_create(
    memory: MemoryLayers,
    name: str,
    now: datetime,
    *,
    definition: str = "",
    category: str = "object",
    provenance: Provenance = Provenance.DIRECT_INGESTION,
    properties: Mapping[str, Any] | None = None,
    source_episode_ids: Sequence[str] = (),
    evidence: Sequence[str] = (),
) -> tuple[str, bool, list[SemanticEvent]]:
    """(concept id, was_created, events). An existing concept with a matching name (``names_match``)
    is reinforced by the evidence it did not have yet (one count per new episode or evidence key);
    with no new evidence nothing happens, so running a promotion twice changes nothing.

    The events are applied to ``memory`` before returning, so the next command sees them.

    >>> from datetime import datetime, timezone
    >>> from somnus.processors.semantic.layers import MemoryLayers
    >>> m, t = MemoryLayers("agent:a"), datetime(2024, 5, 1, tzinfo=timezone.utc)
    >>> cid, created, _ = find_or_create(m, "coffee_mug", t, evidence=["doc:kitchen.md"])
    >>> find_or_create(m, "Coffee Mug", t, evidence=["doc:kitchen.md"]) == (cid, False, [])
    True
    """
    atl = memory.atl
    props = dict(properties or {})
    existing = atl.find(name)
    if existing is not None and _other_tool(atl.get(existing), props.get("tool")):
        existing = None  # a one-edit name of another tool's concept ("..._a_unreliable", "..._b_unreliable")
    if existing is None:
        eps = list(dict.fromkeys(source_episode_ids))
        ev_keys = list(dict.fromkeys(evidence))
        created = ConceptCreated(
            owner=memory.owner,
            concept_id=concept_id_for(memory.owner, name),
            name=name,
            definition=definition,
            category=category,
            provenance=provenance,
            at=now,
            properties=props,
            source_episode_ids=eps,
            evidence=ev_keys,
            reinforcement_count=max(1, len(eps) + len(ev_keys)),
            embedding_text=embedding_text(name, definition, props),
        )
        memory.apply(created)
        return created.concept_id, True, [created]
    c = atl.get(existing)
    assert c is not None
    new_eps = [e for e in dict.fromkeys(source_episode_ids) if not c.knows_episode(e)]
    new_keys = [k for k in dict.fromkeys(evidence) if not c.knows_evidence(k)]
    if not new_eps and not new_keys:
        return existing, False, []
    changed = {k: v for k, v in props.items() if c.properties.get(k) != v}
    ev = ConceptReinforced(
        owner=memory.owner,
        concept_id=existing,
        by=len(new_eps) + len(new_keys),
        provenance=combine_provenance(c.provenance, provenance),
        at=now,
        source_episode_ids=new_eps,
        evidence=new_keys,
        properties=changed,
        definition=definition if definition and definition != c.definition else "",
    )
    memory.apply(ev)
    return existing, False, [ev]


def _other_tool(concept: Concept | None, tool: Any) -> bool:
    """Is ``concept`` about another tool than ``tool``? Then a name one edit away is not the same
    concept: merging would show one agent's tool name over another's evidence."""
    return concept is not None and tool is not None and concept.properties.get("tool") not in (None, tool)


def form_relationship(
    memory: MemoryLayers,
    source_id: str,
    relation: str,
    target_id: str,
    now: datetime,
    *,
    weight: float = 1.0,
    metadata: Mapping[str, Any] | None = None,
    symmetric_if_new: bool = False,
    description: str = "",
) -> list[SemanticEvent]:
    """Events forming ``source --relation--> target``. An unknown relation type is registered as
    agent-proposed first. Forming an identical relationship again returns no events.

    The events are applied to ``memory`` before returning."""
    out = memory.registry.propose(memory.owner, relation, now, symmetric=symmetric_if_new, description=description)
    for ev in out:
        memory.apply(ev)
    rel = relation_name(relation)
    meta = dict(metadata or {})
    weight = round(float(weight), 6)
    current = memory.atl.relationship(source_id, rel, target_id)
    if current is not None and current.weight == weight and current.metadata == meta:
        return out
    ev = RelationshipFormed(
        owner=memory.owner, source_id=source_id, relation=rel, target_id=target_id, at=now, weight=weight, metadata=meta
    )
    memory.apply(ev)
    return out + [ev]


# ---- ingest-knowledge: concepts straight from a document --------------------------------------


class KnowledgeFileError(ValueError):
    """The knowledge document is not of a shape ``parse_knowledge`` understands; names the place."""


_MD_HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$")
_MD_FIELD = re.compile(r"^(?:[-*]\s+)?([A-Za-z_][\w \-]*?)\s*:\s*(.+)$")


def parse_knowledge(text: str, fmt: str) -> list[IngestedConcept]:
    """Concepts from a JSON or Markdown knowledge document (``fmt``: "json" or "markdown").

    JSON: a list of concepts, or ``{"concepts": [...]}``; a concept is ``{"name", "definition",
    "category", "properties": {}, "relationships": [{"type": "IS_A", "target": "container"}]}``.

    Markdown: each heading names a concept; ``category: x`` sets the category, a line
    ``IS_A: container`` (an upper-case name of a relationship type, several targets comma-separated)
    adds relationships, any other ``- key: value`` line is a property; the remaining text is the
    definition.

    >>> md = "## coffee_mug\\ncategory: object\\nA ceramic container.\\n- color: blue\\nIS_A: container\\n"
    >>> c = parse_knowledge(md, "markdown")[0]
    >>> (c.name, c.category, c.definition, c.properties, [(r.relation, r.target) for r in c.relationships])
    ('coffee_mug', 'object', 'A ceramic container.', {'color': 'blue'}, [('IS_A', 'container')])
    """
    if fmt == "json":
        return _parse_json(text)
    if fmt in ("markdown", "md"):
        return _parse_markdown(text)
    raise KnowledgeFileError(f"unknown knowledge format {fmt!r} (expected json or markdown)")


def _parse_json(text: str) -> list[IngestedConcept]:
    try:
        data = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise KnowledgeFileError(f"not JSON: {exc}") from None
    items = data.get("concepts") if isinstance(data, dict) else data
    if not isinstance(items, list):
        raise KnowledgeFileError("expected a list of concepts or an object with a 'concepts' list")
    out = []
    for i, item in enumerate(items):
        if not isinstance(item, dict) or not isinstance(item.get("name"), str) or not item["name"].strip():
            raise KnowledgeFileError(f"concept {i}: needs a non-empty 'name'")
        rels = item.get("relationships") or []
        if not isinstance(rels, list):
            raise KnowledgeFileError(f"concept {i} ({item['name']}): 'relationships' must be a list")
        parsed_rels = []
        for j, r in enumerate(rels):
            if not isinstance(r, dict) or not r.get("target") or not (r.get("type") or r.get("relation")):
                raise KnowledgeFileError(f"concept {i} ({item['name']}): relationship {j} needs 'type' and 'target'")
            parsed_rels.append(
                IngestedRelationship(relation_name(str(r.get("type") or r.get("relation"))), str(r["target"]))
            )
        props = item.get("properties") or {}
        if not isinstance(props, dict):
            raise KnowledgeFileError(f"concept {i} ({item['name']}): 'properties' must be an object")
        out.append(
            IngestedConcept(
                name=item["name"].strip(),
                definition=str(item.get("definition") or "").strip(),
                category=str(item.get("category") or "object"),
                properties=props,
                relationships=parsed_rels,
            )
        )
    return out


def _parse_markdown(text: str) -> list[IngestedConcept]:
    out: list[IngestedConcept] = []
    current: dict[str, Any] | None = None

    def flush() -> None:
        if current is not None:
            out.append(
                IngestedConcept(
                    name=current["name"],
                    definition=" ".join(current["text"]).strip(),
                    category=current["category"],
                    properties=current["properties"],
                    relationships=current["rels"],
                )
            )

    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        heading = _MD_HEADING.match(line)
        if heading:
            flush()
            current = {"name": heading.group(1).strip(), "text": [], "category": "object", "properties": {}, "rels": []}
            continue
        if not line:
            continue
        if current is None:
            raise KnowledgeFileError(f"line {n}: text before the first heading (each concept starts with '## name')")
        m = _MD_FIELD.match(line)
        if m:
            key, value = m.group(1).strip(), m.group(2).strip()
            if key.lower() == "category":
                current["category"] = value
                continue
            if key.lower() == "definition":
                current["text"].append(value)
                continue
            if key.replace(" ", "_").isupper():
                current["rels"].extend(
                    IngestedRelationship(relation_name(key), t.strip()) for t in value.split(",") if t.strip()
                )
                continue
            if line.startswith(("-", "*")):
                current["properties"][key] = _scalar(value)
                continue
        current["text"].append(line.lstrip("-* ").strip())
    flush()
    return out


def _scalar(value: str) -> Any:
    """'3' -> 3, 'true' -> True, anything else stays text (YAML's scalar rules)."""
    try:
        parsed = yaml.safe_load(value)
    except yaml.YAMLError:
        return value
    return parsed if isinstance(parsed, (int, float, bool, str)) and parsed is not None else value


def ingest_knowledge(
    memory: MemoryLayers, concepts: Iterable[IngestedConcept], source: str, now: datetime
) -> list[SemanticEvent]:
    """Events adding ingested concepts (provenance DIRECT_INGESTION) and their relationships; a
    relationship target that is not a concept yet is created as a bare concept. The evidence key is
    ``doc:<source>#<name key>``, so ingesting the same document again changes nothing."""
    out: list[SemanticEvent] = []
    items = list(concepts)
    for c in items:
        _, _, evs = find_or_create(
            memory,
            c.name,
            now,
            definition=c.definition,
            category=c.category,
            provenance=Provenance.DIRECT_INGESTION,
            properties=c.properties,
            evidence=[f"doc:{source}#{name_key(c.name)}"],
        )
        out += evs
    for c in items:
        src = memory.atl.find(c.name)
        assert src is not None
        for r in c.relationships:
            tgt, _, evs = find_or_create(
                memory,
                r.target,
                now,
                category="object",
                provenance=Provenance.DIRECT_INGESTION,
                evidence=[f"doc:{source}#{name_key(r.target)}"],
            )
            out += evs
            out += form_relationship(memory, src, r.relation, tgt, now)
    return out


# ---- the knowledge context: what the model sees -------------------------------------------------


class KnowledgeEntry(msgspec.Struct, frozen=True):
    layer: Layer
    record_id: str
    name: str
    label: str  # the concept's category, or "math:<CATEGORY>"
    confidence: float
    score: float
    text: str  # the line the model reads


def knowledge_context(
    memory: MemoryLayers,
    *,
    query: str | None = None,
    limit: int = KNOWLEDGE_LIMIT,
    readable: Callable[[Layer, str], bool] | None = None,
) -> list[KnowledgeEntry]:
    """One ranked "what do I know?" list over ATL concepts (with their relationships) and AG patterns.

    Score = confidence x (1 + ``QUERY_BOOST`` x the share of the query's words found in the record's
    text); without a query, confidence alone. Ties: higher evidence count, then name. At most
    ``limit`` (8) entries.

    ``readable(layer, record_id)``: the records the reader may see (its provenance); the others are
    left out before ranking, and so is a relationship to one of them.
    """
    q = tokens(query) if query else set()
    scored: list[tuple[float, int, str, KnowledgeEntry]] = []
    atl = memory.atl
    for c in atl:
        if readable is not None and not readable(Layer.ATL, c.concept_id):
            continue
        rels = [r for r in atl.relationships(c.concept_id) if readable is None or readable(Layer.ATL, r.target_id)]
        rel_text = ", ".join(f"{r.relation} {atl.name_of(r.target_id)}" for r in rels[:KNOWLEDGE_RELATIONSHIPS])
        text = f'"{c.name}" ({c.category}, confidence={c.confidence:.2f}): {c.definition or "(no definition)"}'
        if rel_text:
            text += f" Relationships: {rel_text}"
        score = _score(c.confidence, q, f"{c.embedding_text} {rel_text}")
        scored.append(
            (
                score,
                c.reinforcement_count,
                c.name,
                KnowledgeEntry(
                    layer=Layer.ATL,
                    record_id=c.concept_id,
                    name=c.name,
                    label=c.category,
                    confidence=c.confidence,
                    score=score,
                    text=text,
                ),
            )
        )
    for r in memory.ag:
        if readable is not None and not readable(Layer.ANGULAR_GYRUS, r.math_id):
            continue
        label = f"math:{r.category.value}"
        text = f'"{r.name}" ({label}, confidence={r.confidence:.2f}): {r.verbal}'
        score = _score(r.confidence, q, f"{r.name} {r.verbal} {' '.join(r.subjects)}")
        scored.append(
            (
                score,
                r.n_observations,
                r.name,
                KnowledgeEntry(
                    layer=Layer.ANGULAR_GYRUS,
                    record_id=r.math_id,
                    name=r.name,
                    label=label,
                    confidence=r.confidence,
                    score=score,
                    text=text,
                ),
            )
        )
    scored.sort(key=lambda x: (-x[0], -x[1], x[2], x[3].record_id))
    return [x[3] for x in scored[:limit]]


def record_agents(
    memory: MemoryLayers, layer: Layer, record_id: str, callers: Mapping[str, Iterable[str]]
) -> set[str] | None:
    """The agents whose data a concept or pattern was derived from (None: unknown).

    Recorded provenance is used where there is one: a pattern's ``source_agents``, a concept's
    ``source_agents`` property (``somnus.processors.semantic.promotion`` copies it from the NAc link's or the
    pattern's), and for a concept confirmed by a pattern (evidence ``math:<id>@<n>``) the pattern's
    too. Without it (records from before provenance was recorded), a record about a tool counts as
    derived from all of its ``callers`` (tool -> the agents that ever called it): promotion then read
    every agent's calls. A concept with neither a tool, a pattern nor recorded agents but with source
    episodes is of unknown provenance; one with nothing (ingested knowledge, a generic parent such as
    ``unreliable_tool``) was derived from no agent's data.

    >>> from datetime import datetime, timezone
    >>> from somnus.processors.semantic.layers import MemoryLayers
    >>> m = MemoryLayers("global")
    >>> cid, _, _ = find_or_create(m, "pay_unreliable", datetime(2024, 5, 1, tzinfo=timezone.utc),
    ...                            properties={"tool": "pay"}, source_episode_ids=["e1"])
    >>> sorted(record_agents(m, Layer.ATL, cid, {"pay": ["a", "b"]}))
    ['a', 'b']
    >>> cid, _, _ = find_or_create(m, "ship_unreliable", datetime(2024, 5, 1, tzinfo=timezone.utc),
    ...                            properties={"tool": "ship", "source_agents": ["a"]}, source_episode_ids=["e2"])
    >>> sorted(record_agents(m, Layer.ATL, cid, {"ship": ["a", "b"]}))
    ['a']
    """

    def pattern(rec: Any) -> set[str]:
        recorded = set(getattr(rec, "source_agents", ()))
        return recorded or {a for t in rec.subjects for a in callers.get(t, ())}

    if layer is Layer.ANGULAR_GYRUS:
        rec = memory.ag.get(record_id)
        return None if rec is None else pattern(rec)
    c = memory.atl.get(record_id)
    if c is None:
        return None
    agents: set[str] = set()
    tool = c.properties.get("tool")
    recorded = c.properties.get(SOURCE_AGENTS)
    if recorded:
        agents |= {str(a) for a in recorded}
    elif tool is not None:
        agents |= set(callers.get(str(tool), ()))
    maths = [k[len("math:") :].split("@", 1)[0] for k in c.evidence if k.startswith("math:")]
    for math_id in maths:
        rec = memory.ag.get(math_id)
        if rec is None:
            return None  # its pattern is gone: what it was computed from is not known any more
        agents |= pattern(rec)
    if tool is None and not maths and not recorded and c.source_episode_ids:
        return None
    return agents


def _score(confidence: float, query: set[str], text: str) -> float:
    if not query:
        return round(confidence, 6)
    overlap = len(query & tokens(text)) / len(query)
    return round(confidence * (1.0 + QUERY_BOOST * overlap), 6)


def render_knowledge_context(entries: Sequence[KnowledgeEntry]) -> str:
    """The briefing's Key Knowledge lines: one ``- `` line per entry, in rank order."""
    return "\n".join(f"- {e.text}" for e in entries)
