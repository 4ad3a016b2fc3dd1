"""The three memory layers behind one protocol, and the cross-layer graph: in-memory folds of the
semantic event log. Pure: no I/O, no clock.

- ``EpisodicLayer`` (hippocampus): finished episodes (``EpisodeDistilled``), indexed by tool,
  failed tool and outcome; its associative edges come from whoever forms them (``associate``).
- ``ConceptLayer`` (ATL): concepts and their typed relationships, indexed by name key, category and
  property key/value; fuzzy name lookup and "do I already know this?" similarity.
- ``AngularGyrusLayer``: confirmed statistical patterns (``MathRecord``); records about a common
  subject (a tool) are associated.
- ``CrossLayerGraph``: typed edges between records of different layers.

``MemoryLayers`` holds all four for one owner and applies events in log order (``apply``): that fold
is the persistence (no save/load: the topics are the source of truth, the projector writes what the
fold sees). Layer-level ``store``/``remove`` are what the fold calls; everything else writes events.

Spreading activation (inside a layer here, across layers in ``somnus.processors.semantic.promotion``) multiplies a
node's activation by ``ACTIVATION_DECAY`` (0.5) and the edge weight per hop, keeps the best path to
each node, stops below ``ACTIVATION_THRESHOLD`` or after ``ACTIVATION_MAX_DEPTH`` (3) hops, and
treats edges as undirected (association runs both ways, whatever a relation's direction means).

>>> g = AssociativeGraph()
>>> g.link("made_coffee", "found_cup", 0.81); g.link("found_cup", "cleaned_table", 0.75)
>>> [(n, round(a, 2)) for n, a in spread(g.neighbours, ["made_coffee"])]
[('found_cup', 0.41), ('cleaned_table', 0.15)]
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Protocol, TypeVar, runtime_checkable

from somnus.processors.semantic.concepts import (
    Concept,
    RelationshipRegistry,
    name_key,
    names_match,
    tokens,
)
from somnus.schemas.episodes import EpisodeDistilled
from somnus.schemas.semantic import (
    CandidateRejected,
    ConceptCreated,
    ConceptPromoted,
    ConceptReinforced,
    CrossEdgeType,
    CrossLayerEdgeFormed,
    Layer,
    MathRecord,
    PatternConfirmed,
    Provenance,
    RecordRemoved,
    RelationshipFormed,
    RelationshipTypeRegistered,
    SemanticEvent,
)

ACTIVATION_DECAY = 0.5
ACTIVATION_MAX_DEPTH = 3
ACTIVATION_THRESHOLD = 0.01
ATL_MAX_AGE_DAYS = 30  # a concept not reinforced for this long ...
ATL_PROTECTED_COUNT = 3  # ... and reinforced fewer times than this is pruned (unless ingested)
AG_MAX_AGE_DAYS = 30  # a pattern not re-confirmed for this long is pruned
SIMILAR_MIN = 0.3  # recall_similar: least token-set Jaccard worth returning

N = TypeVar("N", bound=Hashable)


# ---- the protocol -----------------------------------------------------------------------------


@runtime_checkable
class MemoryLayer(Protocol):
    """What every layer offers (the design's ``MemoryLayer``, minus save/load: the log persists)."""

    @property
    def layer_name(self) -> str: ...

    def store(self, record: Any) -> str: ...

    def get(self, record_id: str) -> Any | None: ...

    def remove(self, record_id: str) -> bool: ...

    def recall(self, limit: int = 10, **filters: Any) -> list[Any]: ...

    def recall_associated(
        self,
        seed_ids: Sequence[str],
        *,
        decay: float = ACTIVATION_DECAY,
        max_depth: int = ACTIVATION_MAX_DEPTH,
        threshold: float = ACTIVATION_THRESHOLD,
    ) -> list[tuple[str, float]]: ...

    @property
    def graph(self) -> AssociativeGraph: ...

    def consolidate(self, now: datetime, **kw: Any) -> list[SemanticEvent]: ...

    def register_capture_callback(self, cb: Callable[[str, Any], None]) -> None: ...

    def register_deletion_callback(self, cb: Callable[[str], None]) -> None: ...

    def stats(self) -> dict[str, Any]: ...

    def __len__(self) -> int: ...

    def __iter__(self) -> Iterator[Any]: ...


# ---- graph and spreading activation ------------------------------------------------------------


class AssociativeGraph:
    """An undirected weighted graph (a layer's internal associations); the weight of a pair is the
    strongest link formed between them."""

    def __init__(self) -> None:
        self._adj: dict[str, dict[str, float]] = {}

    def link(self, a: str, b: str, weight: float) -> None:
        if a == b:
            return
        for x, y in ((a, b), (b, a)):
            row = self._adj.setdefault(x, {})
            row[y] = max(weight, row.get(y, 0.0))

    def set_weight(self, a: str, b: str, weight: float) -> None:
        if a != b:
            self._adj.setdefault(a, {})[b] = weight
            self._adj.setdefault(b, {})[a] = weight

    def unlink(self, a: str, b: str) -> None:
        self._adj.get(a, {}).pop(b, None)
        self._adj.get(b, {}).pop(a, None)

    def remove_node(self, node: str) -> None:
        for other in self._adj.pop(node, {}):
            self._adj.get(other, {}).pop(node, None)

    def neighbours(self, node: str) -> list[tuple[str, float]]:
        return sorted(self._adj.get(node, {}).items())

    def weight(self, a: str, b: str) -> float | None:
        return self._adj.get(a, {}).get(b)

    def edge_count(self) -> int:
        return sum(len(r) for r in self._adj.values()) // 2


def spread(
    neighbours: Callable[[N], Iterable[tuple[N, float]]],
    seeds: Iterable[N],
    *,
    decay: float = ACTIVATION_DECAY,
    max_depth: int = ACTIVATION_MAX_DEPTH,
    threshold: float = ACTIVATION_THRESHOLD,
    key: Callable[[N], Any] = lambda n: n,
) -> list[tuple[N, float]]:
    """Spreading activation from ``seeds`` (activation 1.0 each): a neighbour gets
    ``activation * decay * weight``; each node keeps its best value over paths of at most
    ``max_depth`` hops; values below ``threshold`` do not spread. Seeds are not returned.

    Level by level (Bellman-Ford with a hop limit), every improvement spreads again, so the result
    is the exact best path product within the hop limit, in an order fixed by ``key``. Returned
    best first, ties by ``key``.
    """
    seed_set = list(dict.fromkeys(seeds))
    best: dict[N, float] = {s: 1.0 for s in seed_set}
    frontier: dict[N, float] = dict(best)
    for _ in range(max_depth):
        nxt: dict[N, float] = {}
        for node in sorted(frontier, key=key):
            a = frontier[node]
            for nb, w in neighbours(node):
                value = a * decay * w
                if value >= threshold and value > best.get(nb, 0.0):
                    best[nb] = value
                    nxt[nb] = value
        if not nxt:
            break
        frontier = nxt
    seeds_ = set(seed_set)
    return sorted(((n, v) for n, v in best.items() if n not in seeds_), key=lambda x: (-x[1], key(x[0])))


class _Callbacks:
    def __init__(self) -> None:
        self._capture: list[Callable[[str, Any], None]] = []
        self._deletion: list[Callable[[str], None]] = []

    def register_capture_callback(self, cb: Callable[[str, Any], None]) -> None:
        self._capture.append(cb)

    def register_deletion_callback(self, cb: Callable[[str], None]) -> None:
        self._deletion.append(cb)

    def _captured(self, record_id: str, record: Any) -> None:
        for cb in self._capture:
            cb(record_id, record)

    def _deleted(self, record_id: str) -> None:
        for cb in self._deletion:
            cb(record_id)


def _page(items: Iterable[Any], limit: int) -> list[Any]:
    return list(items)[: max(0, limit)]


# ---- hippocampus ------------------------------------------------------------------------------


@dataclass(slots=True, frozen=True)
class EpisodeRecord:
    """What the semantic layers need of an episode: who, when, how it ended, which tools failed."""

    episode_id: str
    agent: str
    outcome: str
    ended_at: datetime
    tools: tuple[str, ...]
    failed_tools: tuple[str, ...]

    @classmethod
    def from_episode(cls, ep: EpisodeDistilled) -> EpisodeRecord:
        failed = sorted({c.tool for c in ep.calls if c.ok is False} | {e.tool for e in ep.errors})
        return cls(
            episode_id=str(ep.episode_id),
            agent=ep.agent,
            outcome=ep.outcome.value,
            ended_at=ep.ended_at,
            tools=tuple(ep.tools),
            failed_tools=tuple(failed),
        )


class EpisodicLayer(_Callbacks):
    """Episodes of one owner. Consolidation of episodes belongs to the hippocampus sleep cycle
    (another processor), so ``consolidate`` here proposes nothing."""

    layer_name = Layer.HIPPOCAMPUS.value

    def __init__(self) -> None:
        super().__init__()
        self._records: dict[str, EpisodeRecord] = {}
        self._by_tool: dict[str, set[str]] = {}
        self._by_failed_tool: dict[str, set[str]] = {}
        self._by_outcome: dict[str, set[str]] = {}
        self._graph = AssociativeGraph()

    def store(self, record: EpisodeDistilled | EpisodeRecord) -> str:
        rec = record if isinstance(record, EpisodeRecord) else EpisodeRecord.from_episode(record)
        if rec.episode_id in self._records:
            self._unindex(self._records[rec.episode_id])
        self._records[rec.episode_id] = rec
        for t in rec.tools:
            self._by_tool.setdefault(t, set()).add(rec.episode_id)
        for t in rec.failed_tools:
            self._by_failed_tool.setdefault(t, set()).add(rec.episode_id)
        self._by_outcome.setdefault(rec.outcome, set()).add(rec.episode_id)
        self._captured(rec.episode_id, rec)
        return rec.episode_id

    def _unindex(self, rec: EpisodeRecord) -> None:
        for t in rec.tools:
            self._by_tool.get(t, set()).discard(rec.episode_id)
        for t in rec.failed_tools:
            self._by_failed_tool.get(t, set()).discard(rec.episode_id)
        self._by_outcome.get(rec.outcome, set()).discard(rec.episode_id)

    def associate(self, a: str, b: str, weight: float) -> None:
        """An associative edge formed by the hippocampus (e.g. on capture)."""
        self._graph.link(a, b, weight)

    def get(self, record_id: str) -> EpisodeRecord | None:
        return self._records.get(record_id)

    def remove(self, record_id: str) -> bool:
        rec = self._records.pop(record_id, None)
        if rec is None:
            return False
        self._unindex(rec)
        self._graph.remove_node(record_id)
        self._deleted(record_id)
        return True

    def recall(
        self,
        limit: int = 10,
        *,
        tool: str | None = None,
        failed_tool: str | None = None,
        outcome: str | None = None,
        agent: str | None = None,
    ) -> list[EpisodeRecord]:
        """Episodes matching every given filter, newest first."""
        ids: set[str] | None = None
        for index, value in ((self._by_tool, tool), (self._by_failed_tool, failed_tool), (self._by_outcome, outcome)):
            if value is not None:
                hit = index.get(value, set())
                ids = set(hit) if ids is None else ids & hit
        pool = (self._records[i] for i in (ids if ids is not None else self._records))
        recs = [r for r in pool if agent is None or r.agent == agent]
        recs.sort(key=lambda r: (-r.ended_at.timestamp(), r.episode_id))
        return _page(recs, limit)

    def recall_associated(
        self,
        seed_ids: Sequence[str],
        *,
        decay: float = ACTIVATION_DECAY,
        max_depth: int = ACTIVATION_MAX_DEPTH,
        threshold: float = ACTIVATION_THRESHOLD,
    ) -> list[tuple[str, float]]:
        return spread(self._graph.neighbours, seed_ids, decay=decay, max_depth=max_depth, threshold=threshold)

    @property
    def graph(self) -> AssociativeGraph:
        return self._graph

    def consolidate(self, now: datetime, **kw: Any) -> list[SemanticEvent]:
        return []

    def stats(self) -> dict[str, Any]:
        return {
            "layer": self.layer_name,
            "records": len(self._records),
            "edges": self._graph.edge_count(),
            "tools": len(self._by_tool),
        }

    def __len__(self) -> int:
        return len(self._records)

    def __iter__(self) -> Iterator[EpisodeRecord]:
        return (self._records[k] for k in sorted(self._records))

    def __contains__(self, record_id: object) -> bool:
        return record_id in self._records


# ---- ATL --------------------------------------------------------------------------------------


@dataclass(slots=True, frozen=True)
class Relationship:
    source_id: str
    relation: str
    target_id: str
    weight: float
    metadata: Mapping[str, Any] = field(default_factory=dict)


class ConceptLayer(_Callbacks):
    """Concepts and their typed relationships (the ATL).

    Context indexes (O(1)): name key -> id, category -> ids, property key -> ids, property
    (key, value) -> ids; a token index serves ``recall_similar``; name keys are also indexed by
    length for the one-edit fuzzy match, so ``find`` compares against names of +-1 length only.
    """

    layer_name = Layer.ATL.value

    def __init__(self, registry: RelationshipRegistry | None = None) -> None:
        super().__init__()
        self.registry = registry or RelationshipRegistry()
        self._concepts: dict[str, Concept] = {}
        self._by_key: dict[str, str] = {}
        self._keys_by_len: dict[int, set[str]] = {}
        self._by_category: dict[str, set[str]] = {}
        self._by_prop_key: dict[str, set[str]] = {}
        self._by_prop: dict[tuple[str, str], set[str]] = {}
        self._by_token: dict[str, set[str]] = {}
        self._tokens: dict[str, frozenset[str]] = {}
        self._out: dict[str, dict[tuple[str, str], Relationship]] = {}  # source -> (relation, target) -> rel
        self._in: dict[str, set[tuple[str, str]]] = {}  # target -> {(source, relation)}
        self._graph = AssociativeGraph()

    # -- writes (called by the fold) --
    def store(self, record: Concept) -> str:
        old = self._concepts.get(record.concept_id)
        if old is not None:
            self._unindex(old)
        self._concepts[record.concept_id] = record
        self._index(record)
        self._captured(record.concept_id, record)
        return record.concept_id

    def reinforce(self, ev: ConceptReinforced) -> bool:
        c = self._concepts.get(ev.concept_id)
        if c is None:
            return False
        self._unindex(c)
        changed = c.reinforce(ev)
        self._index(c)
        return changed

    def relate(self, ev: RelationshipFormed) -> bool:
        if ev.source_id not in self._concepts or ev.target_id not in self._concepts:
            return False
        pairs = [(ev.source_id, ev.target_id)]
        if self.registry.is_symmetric(ev.relation):
            pairs.append((ev.target_id, ev.source_id))
        for s, t in pairs:
            self._out.setdefault(s, {})[(ev.relation, t)] = Relationship(
                s, ev.relation, t, ev.weight, dict(ev.metadata)
            )
            self._in.setdefault(t, set()).add((s, ev.relation))
        self._reweigh(ev.source_id, ev.target_id)
        return True

    def _reweigh(self, a: str, b: str) -> None:
        ws = [r.weight for (rel, t), r in self._out.get(a, {}).items() if t == b]
        ws += [r.weight for (rel, t), r in self._out.get(b, {}).items() if t == a]
        if ws:
            self._graph.set_weight(a, b, max(ws))
        else:
            self._graph.unlink(a, b)

    def remove(self, record_id: str) -> bool:
        c = self._concepts.pop(record_id, None)
        if c is None:
            return False
        self._unindex(c)
        for rel, t in list(self._out.pop(record_id, {})):
            self._in.get(t, set()).discard((record_id, rel))
        for s, rel in list(self._in.pop(record_id, set())):
            self._out.get(s, {}).pop((rel, record_id), None)
        self._graph.remove_node(record_id)
        self._deleted(record_id)
        return True

    def _index(self, c: Concept) -> None:
        key = name_key(c.name)
        self._by_key[key] = c.concept_id
        self._keys_by_len.setdefault(len(key), set()).add(key)
        self._by_category.setdefault(c.category, set()).add(c.concept_id)
        for k, v in c.properties.items():
            self._by_prop_key.setdefault(k, set()).add(c.concept_id)
            self._by_prop.setdefault((k, _prop_value(v)), set()).add(c.concept_id)
        toks = frozenset(tokens(c.embedding_text))
        self._tokens[c.concept_id] = toks
        for t in toks:
            self._by_token.setdefault(t, set()).add(c.concept_id)

    def _unindex(self, c: Concept) -> None:
        key = name_key(c.name)
        if self._by_key.get(key) == c.concept_id:
            del self._by_key[key]
            self._keys_by_len.get(len(key), set()).discard(key)
        self._by_category.get(c.category, set()).discard(c.concept_id)
        for k, v in c.properties.items():
            self._by_prop_key.get(k, set()).discard(c.concept_id)
            self._by_prop.get((k, _prop_value(v)), set()).discard(c.concept_id)
        for t in self._tokens.pop(c.concept_id, frozenset()):
            self._by_token.get(t, set()).discard(c.concept_id)

    # -- reads --
    def get(self, record_id: str) -> Concept | None:
        return self._concepts.get(record_id)

    def find(self, name: str) -> str | None:
        """The concept this name denotes: the same name key, else one of >= 10 characters one edit
        away (the lexicographically first such key, for a stable answer)."""
        key = name_key(name)
        hit = self._by_key.get(key)
        if hit is not None:
            return hit
        near = sorted(
            k
            for n in (len(key) - 1, len(key), len(key) + 1)
            for k in self._keys_by_len.get(n, ())
            if names_match(k, key)
        )
        return self._by_key[near[0]] if near else None

    def by_category(self, category: str) -> list[str]:
        return sorted(self._by_category.get(category, ()))

    def by_property(self, key: str, value: Any = None) -> list[str]:
        if value is None:
            return sorted(self._by_prop_key.get(key, ()))
        return sorted(self._by_prop.get((key, _prop_value(value)), ()))

    def name_of(self, concept_id: str) -> str:
        c = self._concepts.get(concept_id)
        return c.name if c is not None else concept_id

    def relationship(self, source_id: str, relation: str, target_id: str) -> Relationship | None:
        return self._out.get(source_id, {}).get((relation, target_id))

    def relationships(self, concept_id: str, relation: str | None = None) -> list[Relationship]:
        """Outgoing relationships (both directions of a symmetric one are stored), by relation then
        target name."""
        rels = [r for (rel, _), r in self._out.get(concept_id, {}).items() if relation is None or rel == relation]
        return sorted(rels, key=lambda r: (r.relation, self.name_of(r.target_id), r.target_id))

    def recall(
        self,
        limit: int = 10,
        *,
        category: str | None = None,
        properties: Mapping[str, Any] | None = None,
        min_confidence: float = 0.0,
        provenance: Provenance | None = None,
    ) -> list[Concept]:
        """Concepts matching every filter, most confident first (then by name)."""
        ids: set[str] | None = None
        if category is not None:
            ids = set(self._by_category.get(category, ()))
        for k, v in (properties or {}).items():
            hit = self._by_prop.get((k, _prop_value(v)), set())
            ids = set(hit) if ids is None else ids & hit
        pool = [self._concepts[i] for i in (ids if ids is not None else self._concepts)]
        out = [c for c in pool if c.confidence >= min_confidence and (provenance is None or c.provenance is provenance)]
        out.sort(key=lambda c: (-c.confidence, name_key(c.name), c.concept_id))
        return _page(out, limit)

    def recall_similar(self, text: str, limit: int = 5, min_similarity: float = SIMILAR_MIN) -> list[tuple[str, float]]:
        """ "Do I already know this?": concepts whose embedding text shares words with ``text``,
        by token-set Jaccard (>= ``min_similarity``), best first. Only concepts sharing a token are
        scored (inverted index)."""
        q = tokens(text)
        if not q:
            return []
        shared: Counter[str] = Counter()
        for t in q:
            shared.update(self._by_token.get(t, ()))
        scored = []
        for cid, n in shared.items():
            sim = n / len(q | self._tokens[cid])
            if sim >= min_similarity:
                scored.append((cid, round(sim, 6)))
        scored.sort(key=lambda x: (-x[1], x[0]))
        return scored[:limit]

    def recall_associated(
        self,
        seed_ids: Sequence[str],
        *,
        decay: float = ACTIVATION_DECAY,
        max_depth: int = ACTIVATION_MAX_DEPTH,
        threshold: float = ACTIVATION_THRESHOLD,
    ) -> list[tuple[str, float]]:
        return spread(self._graph.neighbours, seed_ids, decay=decay, max_depth=max_depth, threshold=threshold)

    @property
    def graph(self) -> AssociativeGraph:
        return self._graph

    def consolidate(
        self,
        now: datetime,
        *,
        owner: str = "",
        max_age_days: float = ATL_MAX_AGE_DAYS,
        protected_count: int = ATL_PROTECTED_COUNT,
    ) -> list[SemanticEvent]:
        """Removal events for concepts that never became knowledge: not reinforced for
        ``max_age_days`` and reinforced fewer than ``protected_count`` times. Ingested concepts and
        concepts with relationships are kept (someone stated them, or other knowledge hangs on them)."""
        cutoff = now - timedelta(days=max_age_days)
        out: list[SemanticEvent] = []
        for cid in sorted(self._concepts):
            c = self._concepts[cid]
            if (
                c.updated_at < cutoff
                and c.reinforcement_count < protected_count
                and c.provenance is not Provenance.DIRECT_INGESTION
                and not self._out.get(cid)
                and not self._in.get(cid)
            ):
                out.append(
                    RecordRemoved(
                        owner=owner,
                        layer=Layer.ATL,
                        record_id=cid,
                        at=now,
                        reason=f"not reinforced since {c.updated_at.isoformat()}",
                    )
                )
        return out

    def stats(self) -> dict[str, Any]:
        return {
            "layer": self.layer_name,
            "records": len(self._concepts),
            "relationships": sum(len(v) for v in self._out.values()),
            "categories": {k: len(v) for k, v in sorted(self._by_category.items()) if v},
        }

    def __len__(self) -> int:
        return len(self._concepts)

    def __iter__(self) -> Iterator[Concept]:
        return (self._concepts[k] for k in sorted(self._concepts))

    def __contains__(self, record_id: object) -> bool:
        return record_id in self._concepts


def _prop_value(v: Any) -> str:
    """Property values are indexed by a canonical text form (3, "3" and 3.0 differ: 'i:3', 's:3', 'f:3.0')."""
    return f"{type(v).__name__[:1]}:{v}"


# ---- Angular Gyrus ----------------------------------------------------------------------------


@dataclass(slots=True)
class MathEntry:
    record: MathRecord
    revision: int  # how many times it was confirmed
    first_at: datetime
    last_at: datetime


class AngularGyrusLayer(_Callbacks):
    """Confirmed statistical patterns. Records about a common subject (a tool) are associated with
    the weaker record's confidence as weight; a re-confirmation replaces the record and bumps its
    revision."""

    layer_name = Layer.ANGULAR_GYRUS.value

    def __init__(self) -> None:
        super().__init__()
        self._entries: dict[str, MathEntry] = {}
        self._by_subject: dict[str, set[str]] = {}
        self._by_category: dict[str, set[str]] = {}
        self._graph = AssociativeGraph()

    def store(self, record: MathRecord, at: datetime | None = None) -> str:
        old = self._entries.get(record.math_id)
        if old is not None:
            self._unindex(old.record)
            entry = MathEntry(record, old.revision + 1, old.first_at, at or old.last_at)
        else:
            assert at is not None, "a new record needs its confirmation time"
            entry = MathEntry(record, 1, at, at)
        self._entries[record.math_id] = entry
        for s in record.subjects:
            self._by_subject.setdefault(s, set()).add(record.math_id)
        self._by_category.setdefault(record.category.value, set()).add(record.math_id)
        self._relink(record)
        self._captured(record.math_id, record)
        return record.math_id

    def _relink(self, record: MathRecord) -> None:
        peers = sorted({p for s in record.subjects for p in self._by_subject.get(s, ())} - {record.math_id})
        for p in peers:
            self._graph.set_weight(record.math_id, p, min(record.confidence, self._entries[p].record.confidence))

    def _unindex(self, record: MathRecord) -> None:
        for s in record.subjects:
            self._by_subject.get(s, set()).discard(record.math_id)
        self._by_category.get(record.category.value, set()).discard(record.math_id)
        self._graph.remove_node(record.math_id)

    def get(self, record_id: str) -> MathRecord | None:
        e = self._entries.get(record_id)
        return e.record if e is not None else None

    def entry(self, record_id: str) -> MathEntry | None:
        return self._entries.get(record_id)

    def remove(self, record_id: str) -> bool:
        e = self._entries.pop(record_id, None)
        if e is None:
            return False
        self._unindex(e.record)
        self._deleted(record_id)
        return True

    def by_subject(self, subject: str) -> list[str]:
        return sorted(self._by_subject.get(subject, ()))

    def recall(
        self, limit: int = 10, *, category: str | None = None, subject: str | None = None, min_confidence: float = 0.0
    ) -> list[MathRecord]:
        ids: set[str] | None = None
        if category is not None:
            ids = set(self._by_category.get(category, ()))
        if subject is not None:
            hit = self._by_subject.get(subject, set())
            ids = set(hit) if ids is None else ids & hit
        recs = [self._entries[i].record for i in (ids if ids is not None else self._entries)]
        recs = [r for r in recs if r.confidence >= min_confidence]
        recs.sort(key=lambda r: (-r.confidence, r.name, r.math_id))
        return _page(recs, limit)

    def recall_associated(
        self,
        seed_ids: Sequence[str],
        *,
        decay: float = ACTIVATION_DECAY,
        max_depth: int = ACTIVATION_MAX_DEPTH,
        threshold: float = ACTIVATION_THRESHOLD,
    ) -> list[tuple[str, float]]:
        return spread(self._graph.neighbours, seed_ids, decay=decay, max_depth=max_depth, threshold=threshold)

    @property
    def graph(self) -> AssociativeGraph:
        return self._graph

    def consolidate(
        self, now: datetime, *, owner: str = "", max_age_days: float = AG_MAX_AGE_DAYS
    ) -> list[SemanticEvent]:
        """Removal events for patterns not re-confirmed within ``max_age_days``: the data moved on."""
        cutoff = now - timedelta(days=max_age_days)
        return [
            RecordRemoved(
                owner=owner,
                layer=Layer.ANGULAR_GYRUS,
                record_id=k,
                at=now,
                reason=f"not re-confirmed since {e.last_at.isoformat()}",
            )
            for k, e in sorted(self._entries.items())
            if e.last_at < cutoff
        ]

    def stats(self) -> dict[str, Any]:
        return {
            "layer": self.layer_name,
            "records": len(self._entries),
            "edges": self._graph.edge_count(),
            "categories": {k: len(v) for k, v in sorted(self._by_category.items()) if v},
        }

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[MathRecord]:
        return (self._entries[k].record for k in sorted(self._entries))

    def __contains__(self, record_id: object) -> bool:
        return record_id in self._entries


# ---- cross-layer graph ------------------------------------------------------------------------

Node = tuple[Layer, str]


@dataclass(slots=True, frozen=True)
class CrossEdge:
    source: Node
    edge_type: CrossEdgeType
    target: Node
    weight: float


class CrossLayerGraph:
    """Typed edges between records of different layers. Stored as formed (source -> target);
    read both ways for activation."""

    def __init__(self) -> None:
        self._edges: dict[tuple[Node, CrossEdgeType, Node], CrossEdge] = {}
        self._touching: dict[Node, set[tuple[Node, CrossEdgeType, Node]]] = {}

    def add(self, edge: CrossEdge) -> None:
        k = (edge.source, edge.edge_type, edge.target)
        self._edges[k] = edge
        self._touching.setdefault(edge.source, set()).add(k)
        self._touching.setdefault(edge.target, set()).add(k)

    def get(self, source: Node, edge_type: CrossEdgeType, target: Node) -> CrossEdge | None:
        return self._edges.get((source, edge_type, target))

    def remove_node(self, node: Node) -> int:
        keys = self._touching.pop(node, set())
        for k in keys:
            self._edges.pop(k, None)
            other = k[2] if k[0] == node else k[0]
            self._touching.get(other, set()).discard(k)
        return len(keys)

    def edges(self, node: Node | None = None, edge_type: CrossEdgeType | None = None) -> list[CrossEdge]:
        keys = self._touching.get(node, set()) if node is not None else self._edges.keys()
        out = [self._edges[k] for k in keys if edge_type is None or k[1] is edge_type]
        return sorted(
            out, key=lambda e: (e.source[0].value, e.source[1], e.edge_type.value, e.target[0].value, e.target[1])
        )

    def neighbours(self, node: Node) -> list[tuple[Node, float]]:
        best: dict[Node, float] = {}
        for k in self._touching.get(node, ()):
            e = self._edges[k]
            other = e.target if e.source == node else e.source
            best[other] = max(best.get(other, 0.0), e.weight)
        return sorted(best.items(), key=lambda x: (x[0][0].value, x[0][1]))

    def __len__(self) -> int:
        return len(self._edges)


# ---- the fold ---------------------------------------------------------------------------------


class MemoryLayers:
    """All layers of one owner's memory, rebuilt by applying events in log order.

    Removing a record from any layer removes its cross-layer edges (a deletion callback), so the
    graph never points at records that are gone.

    >>> from datetime import datetime, timezone
    >>> from somnus.schemas.semantic import ConceptCreated, Provenance
    >>> m = MemoryLayers("agent:a")
    >>> m.apply(ConceptCreated(owner="agent:a", concept_id="c1", name="coffee_mug", definition="",
    ...     category="object", provenance=Provenance.DIRECT_INGESTION, at=datetime(2024, 5, 1, tzinfo=timezone.utc)))
    True
    >>> m.atl.find("Coffee Mug"), len(m.atl)
    ('c1', 1)
    """

    def __init__(self, owner: str) -> None:
        self.owner = owner
        self.registry = RelationshipRegistry()
        self.hippocampus = EpisodicLayer()
        self.atl = ConceptLayer(self.registry)
        self.ag = AngularGyrusLayer()
        self.cross = CrossLayerGraph()
        self.applied = 0
        self.ignored = 0  # events that referred to records no longer (or not yet) here
        self.promotions = 0
        self.rejections = 0
        for layer in (self.hippocampus, self.atl, self.ag):
            layer.register_deletion_callback(self._on_deleted(Layer(layer.layer_name)))

    def _on_deleted(self, layer: Layer) -> Callable[[str], None]:
        def drop_edges(record_id: str) -> None:
            self.cross.remove_node((layer, record_id))

        return drop_edges

    def layer(self, layer: Layer | str) -> EpisodicLayer | ConceptLayer | AngularGyrusLayer:
        layers: dict[Layer, EpisodicLayer | ConceptLayer | AngularGyrusLayer] = {
            Layer.HIPPOCAMPUS: self.hippocampus,
            Layer.ATL: self.atl,
            Layer.ANGULAR_GYRUS: self.ag,
        }
        return layers[Layer(layer)]

    def has(self, node: Node) -> bool:
        return node[1] in self.layer(node[0])

    def apply(self, event: SemanticEvent | EpisodeDistilled) -> bool:
        """Apply one event; False when it had no effect (it referred to a missing record, or it was a
        duplicate: applying any event twice leaves the memory as applying it once, so an
        at-least-once delivery of the semantic log cannot double-count evidence)."""
        ok = self._apply(event)
        self.applied += 1
        self.ignored += not ok
        return ok

    def apply_all(self, events: Iterable[SemanticEvent | EpisodeDistilled]) -> None:
        for ev in events:
            self.apply(ev)

    def _apply(self, ev: SemanticEvent | EpisodeDistilled) -> bool:
        if isinstance(ev, EpisodeDistilled):
            self.hippocampus.store(ev)
            return True
        if isinstance(ev, ConceptCreated):
            if ev.concept_id in self.atl:
                return False  # a duplicate delivery: the concept (and what reinforced it since) stays
            self.atl.store(Concept.from_event(ev))
            return True
        if isinstance(ev, ConceptReinforced):
            return self.atl.reinforce(ev)
        if isinstance(ev, RelationshipTypeRegistered):
            self.registry.apply(ev)
            return True
        if isinstance(ev, RelationshipFormed):
            return self.atl.relate(ev)
        if isinstance(ev, PatternConfirmed):
            if self.ag.get(ev.record.math_id) == ev.record:
                return False  # the same record again (a duplicate): no new revision
            self.ag.store(ev.record, ev.at)
            return True
        if isinstance(ev, CrossLayerEdgeFormed):
            self.cross.add(
                CrossEdge((ev.source_layer, ev.source_id), ev.edge_type, (ev.target_layer, ev.target_id), ev.weight)
            )
            return True
        if isinstance(ev, ConceptPromoted):
            self.promotions += 1
            return True
        if isinstance(ev, CandidateRejected):
            self.rejections += 1
            return True
        if isinstance(ev, RecordRemoved):
            return self.layer(ev.layer).remove(ev.record_id)
        raise TypeError(f"not a semantic event: {type(ev).__name__}")

    def consolidate(self, now: datetime) -> list[SemanticEvent]:
        """Removal events proposed by ATL and Angular Gyrus consolidation (not applied)."""
        return self.atl.consolidate(now, owner=self.owner) + self.ag.consolidate(now, owner=self.owner)

    def stats(self) -> dict[str, Any]:
        return {
            "owner": self.owner,
            "hippocampus": self.hippocampus.stats(),
            "atl": self.atl.stats(),
            "angular_gyrus": self.ag.stats(),
            "cross_layer_edges": len(self.cross),
            "applied": self.applied,
            "ignored": self.ignored,
            "promotions": self.promotions,
            "rejections": self.rejections,
            "relationship_types": len(self.registry.types()),
        }


def fold_events(events: Iterable[SemanticEvent]) -> dict[str, MemoryLayers]:
    """Rebuild every owner's memory from a semantic log (the replay path)."""
    out: dict[str, MemoryLayers] = {}
    for ev in events:
        m = out.get(ev.owner)
        if m is None:
            m = out[ev.owner] = MemoryLayers(ev.owner)
        m.apply(ev)
    return out


def snapshot(memory: MemoryLayers) -> dict[str, Any]:
    """A canonical, comparable picture of a memory (tests and checksums): records, relationships
    and cross-layer edges in a fixed order."""
    return {
        "concepts": [
            (
                c.concept_id,
                c.name,
                c.definition,
                c.category,
                sorted(c.properties.items()),
                c.provenance.value,
                list(c.source_episode_ids),
                list(c.evidence),
                c.reinforcement_count,
            )
            for c in memory.atl
        ],
        "relationships": [
            (r.source_id, r.relation, r.target_id, r.weight, sorted(r.metadata.items()))
            for c in memory.atl
            for r in memory.atl.relationships(c.concept_id)
        ],
        "patterns": [
            (r.math_id, r.name, r.confidence, memory.ag.entry(r.math_id).revision)  # type: ignore[union-attr]
            for r in memory.ag
        ],
        "cross": [
            (e.source[0].value, e.source[1], e.edge_type.value, e.target[0].value, e.target[1], e.weight)
            for e in memory.cross.edges()
        ],
        "relationship_types": [(t.name, t.symmetric, t.origin.value) for t in memory.registry.types()],
        "episodes": [r.episode_id for r in memory.hippocampus],
    }
