"""The knowledge fold: entity resolution and the temporal triple log. Pure: no I/O, no clock.

Input: ``FactsExtracted`` in ``facts``-topic order. Output per batch: ``KnowledgeChanges``, the
rows the projector writes (``projections/knowledge.py``). Every time here is event time (the
episode's ``observed_at``), so replaying the topic yields the same log.

Entities: names are normalised (NFKC, case-folded, whitespace collapsed, surrounding punctuation
stripped); the id is ``type:name``. A new name of at least ``MIN_TRUSTED_CHARS`` characters that
is a near-duplicate of a known name of the same type (MinHash LSH over character 3-grams,
confirmed by the exact Jaccard >= ``MERGE_JACCARD``) becomes an alias of the known entity; the
first name seen is canonical. Aliasing never crosses agents: a name merges only into an entity the
same agent has named itself, and the alias is that agent's (``KnowledgeState.agent_aliases``); so
an agent's facts only ever carry names its own traces gave (or the very same name another agent's
gave), never another agent's near-duplicate private name. Attributes merge by union: lists are unioned, maps merged
recursively, and a key already set keeps its first value (so a fact log of 10,000 sightings of one
error does not write 10,000 versions because its example text varies).

Triples: the same (source, predicate, target, scope) while active is *reinforced* (count adds up,
confidence combines by noisy-OR ``1 - (1 - old) * (1 - new)``). For a *functional* predicate a
different target for the same (source, predicate, scope) *supersedes* the belief that held at the
new fact's event time: its ``valid_to`` becomes that time and ``superseded_by`` the new triple,
which holds until the old one would have ended (open for the current belief). So a late,
out-of-order fact lands inside the timeline where its event time says, and at any time at most
one belief per slot is active. A fact agreeing with the belief that held at its time reinforces
it. (A reinforcement does not record a new stretch, so a late contradiction that lands before a
later re-confirmation takes over until the next change of belief: exact for facts in event-time
order, an approximation out of order.) Multi-valued predicates never supersede. Nothing is deleted; every change is a ``history``
row naming the episode that caused it.

>>> import uuid
>>> from datetime import datetime, timezone
>>> from somnus.schemas.facts import FactAsserted, FactsExtracted
>>> def fx(i, day, rate):
...     return FactsExtracted(schema_version=1, episode_id=uuid.UUID(int=i), agent="scraper",
...         observed_at=datetime(2024, 5, day, tzinfo=timezone.utc), extractor="trace/1",
...         facts=[FactAsserted(source="api.instantly.ai", source_type="api", predicate="rate_limit",
...                             target=rate, target_type="rate", confidence=1.0)])
>>> fold = KnowledgeFold()
>>> _ = fold.apply([fx(1, 1, "10/s")])
>>> ch = fold.apply([fx(2, 3, "5/s")])
>>> [(c.valid_to.day, c.superseded_by == ch.triples_inserted[0].triple_id) for c in ch.triples_closed]
[(3, True)]
>>> [t.target for t in as_of(fold.state.all_triples(), datetime(2024, 5, 2, tzinfo=timezone.utc))]
['rate:10/s']
"""

from __future__ import annotations

import re
import unicodedata
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import lru_cache
from typing import Any

import msgspec
from datasketch import MinHash, MinHashLSH

from somnus.schemas.facts import FactsExtracted, agent_scope

MERGE_JACCARD = 0.9  # exact 3-gram Jaccard needed to merge two names
LSH_THRESHOLD = 0.8  # LSH candidate threshold (below MERGE_JACCARD so candidates are not missed)
MIN_TRUSTED_CHARS = 10  # shorter names are never merged: too little text to trust a match
NUM_PERM = 128
MINHASH_SEED = 1

FUNCTIONAL = frozenset(
    {
        "rate_limit",
        "status",
        "version",
        "located_in",
        "owned_by",
        "assigned_to",
        "has_owner",
        "current_value",
        "endpoint",
    }
)
MULTI_VALUED = frozenset(
    {
        "uses",
        "depends_on",
        "failed_with",
        "calls",
        "delegates_to",
        "works_on",
        "serves",
        "learned_about",
        "works_with",
        "bypasses",
    }
)

TRIPLE_NAMESPACE = uuid.UUID("7d1c9a3e-52b4-4f7e-8f0a-3b6c2d9e1f45")

_WS = re.compile(r"\s+")
_EDGE = "\"'`.,;:!? \t"  # brackets stay: "<id>" placeholders end in one


@lru_cache(maxsize=1 << 16)  # names repeat: every fact normalises its source, target and predicate
def normalise_name(name: str) -> str:
    """The form names are compared in.

    >>> normalise_name('  “Book_Reservation”. ')
    'book_reservation'
    """
    text = unicodedata.normalize("NFKC", name).casefold()
    text = _WS.sub(" ", text).strip(_EDGE + "\u201c\u201d\u2018\u2019")
    return text or name.strip()


def entity_id(type_: str, name: str) -> str:
    return f"{normalise_name(type_)}:{normalise_name(name)}"


def shingles(text: str, k: int = 3) -> set[str]:
    return {text[i : i + k] for i in range(max(1, len(text) - k + 1))}


def jaccard(a: set[str], b: set[str]) -> float:
    return len(a & b) / len(a | b) if a or b else 1.0


def merge_attributes(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """Union: lists unioned (order kept), maps merged recursively, a scalar keeps its first value.

    >>> merge_attributes({"a": [1], "m": {"x": 1}, "s": 1}, {"a": [2, 1], "m": {"y": 2}, "s": 2, "t": 3})
    {'a': [1, 2], 'm': {'x': 1, 'y': 2}, 's': 1, 't': 3}
    """
    out = dict(old)
    for k, v in new.items():
        cur = out.get(k)
        if isinstance(cur, list) and isinstance(v, list):
            out[k] = cur + [x for x in v if x not in cur]
        elif isinstance(cur, dict) and isinstance(v, dict):
            out[k] = merge_attributes(cur, v)
        elif k not in out:
            out[k] = v
    return out


def noisy_or(old: float, new: float) -> float:
    """Combined confidence of two independent assertions.

    >>> round(noisy_or(0.9, 0.9), 4), round(noisy_or(0.65, 0.0), 4)
    (0.99, 0.65)
    """
    return 1.0 - (1.0 - old) * (1.0 - new)


# ---- rows (what the projector writes) -------------------------------------------------------


class EntityVersion(msgspec.Struct, frozen=True):
    entity_id: str
    version: int
    name: str
    type: str
    attributes: dict[str, Any]
    first_seen: datetime
    updated_at: datetime
    episode_id: str | None


class EntityAlias(msgspec.Struct, frozen=True):
    alias: str  # a normalised name
    type: str
    entity_id: str
    jaccard: float
    first_seen: datetime
    episode_id: str | None
    agent: str | None = None  # whose alias it is: the agent of the episode (not a column: derived from it)


class PredicateAdded(msgspec.Struct, frozen=True):
    predicate: str
    functional: bool
    added_at: datetime | None
    episode_id: str | None


class Triple(msgspec.Struct, frozen=True):
    triple_id: str
    source: str
    predicate: str
    target: str
    scope: str
    confidence: float
    count: int
    evidence: str
    last_evidence: str | None
    valid_from: datetime
    valid_to: datetime | None
    superseded_by: str | None
    created_by: str
    extractor: str


class TripleClosed(msgspec.Struct, frozen=True):
    triple_id: str
    valid_to: datetime
    superseded_by: str


class TripleReinforced(msgspec.Struct, frozen=True):
    triple_id: str
    count: int
    confidence: float
    last_evidence: str


class HistoryRow(msgspec.Struct, frozen=True):
    ordinal: int
    triple_id: str
    change: str  # asserted | reinforced | superseded
    episode_id: str
    changed_at: datetime
    count: int
    confidence: float


@dataclass
class KnowledgeChanges:
    entities: list[EntityVersion] = field(default_factory=list)
    aliases: list[EntityAlias] = field(default_factory=list)
    predicates: list[PredicateAdded] = field(default_factory=list)
    triples_inserted: list[Triple] = field(default_factory=list)
    triples_closed: list[TripleClosed] = field(default_factory=list)
    triples_reinforced: list[TripleReinforced] = field(default_factory=list)
    history: list[HistoryRow] = field(default_factory=list)

    @property
    def scopes(self) -> set[str]:
        """Scopes whose active facts changed (for the projector's per-scope read model)."""
        return {t.scope for t in self.triples_inserted}

    def encode(self) -> bytes:
        return msgspec.json.encode(
            [
                self.entities,
                self.aliases,
                self.predicates,
                self.triples_inserted,
                self.triples_closed,
                self.triples_reinforced,
                self.history,
            ]
        )


# ---- state --------------------------------------------------------------------------------


class KnowledgeState:
    """Entities, aliases, LSH index, predicate registry and the triples the fold can still change:
    every active triple, and for functional predicates the whole timeline of each slot (a late fact
    may land inside a closed stretch)."""

    def __init__(self) -> None:
        self.entities: dict[str, EntityVersion] = {}
        self.aliases: dict[tuple[str, str], str] = {}  # (type, canonical name) -> entity id
        self.agent_aliases: dict[tuple[str, str, str], str] = {}  # (agent, type, near-duplicate name) -> id
        self.mentions: dict[str, set[str]] = {}  # agent -> entity ids it has named (aliasing stays inside)
        self.lsh: dict[str, MinHashLSH] = {}  # per entity type
        self.shingles: dict[str, set[str]] = {}  # entity id -> shingles of its canonical name
        self.predicates: dict[str, bool] = {p: True for p in FUNCTIONAL} | {p: False for p in MULTI_VALUED}
        self.triples: dict[str, Triple] = {}  # by id
        self.by_fact: dict[tuple[str, str, str, str], str] = {}  # multi-valued (s, p, o, scope) -> id
        self.slots: dict[tuple[str, str, str], list[str]] = {}  # functional (s, p, scope) -> ids by valid_from
        self.ordinal = 0

    @classmethod
    def from_rows(
        cls,
        entities: Iterable[EntityVersion],
        aliases: Iterable[EntityAlias],
        predicates: Iterable[PredicateAdded],
        triples: Iterable[Triple],
        next_ordinal: int,
    ) -> KnowledgeState:
        """Rebuild from the projected rows: latest entity versions, aliases, added predicates, and the
        triples the fold can change (active ones, and every triple of a functional predicate)."""
        st = cls()
        for e in sorted(entities, key=lambda e: (e.first_seen, e.entity_id)):
            st.entities[e.entity_id] = e
            st._index(e.entity_id, e.type, e.name)
        for a in aliases:
            if a.agent is None:  # the agent of its episode is unknown: the old, global alias
                st.aliases[(a.type, a.alias)] = a.entity_id
            else:
                st.agent_aliases[(a.agent, a.type, a.alias)] = a.entity_id
                st.mentions.setdefault(a.agent, set()).add(a.entity_id)
        for p in predicates:
            st.predicates[p.predicate] = p.functional
        for t in sorted(triples, key=lambda t: (t.valid_from, t.triple_id)):
            st.mentions.setdefault(t.created_by, set()).update((t.source, t.target))
            if t.valid_to is None or st.predicates.get(t.predicate, False):
                st._add(t)
        for ids in st.slots.values():
            ids.sort(key=lambda i: (st.triples[i].valid_from, st.triples[i].valid_to is None))
        st.ordinal = next_ordinal
        return st

    def _index(self, eid: str, type_: str, name: str) -> None:
        self.aliases[(type_, name)] = eid
        if len(name) >= MIN_TRUSTED_CHARS:
            sh = shingles(name)
            self.shingles[eid] = sh
            lsh = self.lsh.get(type_)
            if lsh is None:
                lsh = self.lsh[type_] = MinHashLSH(threshold=LSH_THRESHOLD, num_perm=NUM_PERM)
            lsh.insert(eid, _minhash(sh))

    def _add(self, t: Triple, position: int | None = None) -> None:
        self.triples[t.triple_id] = t
        if self.predicates.get(t.predicate, False):
            ids = self.slots.setdefault((t.source, t.predicate, t.scope), [])
            ids.insert(len(ids) if position is None else position, t.triple_id)
        else:
            self.by_fact[(t.source, t.predicate, t.target, t.scope)] = t.triple_id

    def all_triples(self) -> list[Triple]:
        """Every triple the state holds (for tests and ``as_of`` without a database)."""
        return list(self.triples.values())


_PERMUTATIONS: list[Any] = []  # datasketch draws them from the seed on every MinHash(): drawn once here


def _minhash(sh: set[str]) -> MinHash:
    if not _PERMUTATIONS:
        template = MinHash(num_perm=NUM_PERM, seed=MINHASH_SEED)
        _PERMUTATIONS.append((template.permutations, template.scheme))
    perms, scheme = _PERMUTATIONS[0]
    m = MinHash(num_perm=NUM_PERM, seed=MINHASH_SEED, permutations=perms, scheme=scheme)
    m.update_batch([s.encode() for s in sorted(sh)])
    return m


def triple_id_for(source: str, predicate: str, target: str, scope: str, valid_from: datetime) -> str:
    return str(uuid.uuid5(TRIPLE_NAMESPACE, "\x1f".join((source, predicate, target, scope, valid_from.isoformat()))))


# ---- the fold -----------------------------------------------------------------------------


class KnowledgeFold:
    def __init__(self, state: KnowledgeState | None = None) -> None:
        self.state = state or KnowledgeState()

    def apply(self, batch: Sequence[FactsExtracted]) -> KnowledgeChanges:
        ch = KnowledgeChanges()
        touched: list[EntityVersion] = []
        for fx in batch:
            ep = str(fx.episode_id)
            at = fx.observed_at
            for m in fx.entities:
                self._entity(m.name, m.type, m.attributes, at, ep, ch, touched, fx.agent)
            for f in fx.facts:
                src = self._entity(f.source, f.source_type, {}, at, ep, ch, touched, fx.agent)
                dst = self._entity(f.target, f.target_type, {}, at, ep, ch, touched, fx.agent)
                pred = normalise_name(f.predicate).replace(" ", "_")
                if pred not in self.state.predicates:
                    functional = bool(f.functional)
                    self.state.predicates[pred] = functional
                    ch.predicates.append(PredicateAdded(pred, functional, at, ep))
                scope = f.scope or agent_scope(fx.agent)
                self._fact(src, pred, dst, scope, f.confidence, f.count, at, ep, fx.agent, fx.extractor, ch)
        ch.entities.extend(touched)
        return ch

    def _entity(
        self,
        name: str,
        type_: str,
        attrs: dict[str, Any],
        at: datetime,
        ep: str,
        ch: KnowledgeChanges,
        touched: list[EntityVersion],
        agent: str,
    ) -> str:
        st = self.state
        t = normalise_name(type_)
        n = normalise_name(name)
        eid = st.aliases.get((t, n)) or st.agent_aliases.get((agent, t, n))
        if eid is None:
            eid = self._near_duplicate(t, n, agent)
            if eid is not None:
                sim = jaccard(shingles(n), st.shingles[eid])
                st.agent_aliases[(agent, t, n)] = eid
                ch.aliases.append(
                    EntityAlias(
                        alias=n, type=t, entity_id=eid, jaccard=round(sim, 6), first_seen=at, episode_id=ep, agent=agent
                    )
                )
        mine = st.mentions.setdefault(agent, set())
        if eid is None:
            eid = f"{t}:{n}"
            e = EntityVersion(
                entity_id=eid,
                version=1,
                name=n,
                type=t,
                attributes=merge_attributes({}, attrs),
                first_seen=at,
                updated_at=at,
                episode_id=ep,
            )
            st.entities[eid] = e
            st._index(eid, t, n)
            touched.append(e)
            mine.add(eid)
            return eid
        mine.add(eid)
        if attrs:
            cur = st.entities[eid]
            merged = merge_attributes(cur.attributes, attrs)
            if merged != cur.attributes:
                # One version row per change, so the rows do not depend on how batches were cut.
                e = msgspec.structs.replace(
                    cur, attributes=merged, updated_at=max(at, cur.updated_at), episode_id=ep, version=cur.version + 1
                )
                st.entities[eid] = e
                touched.append(e)
        return eid

    def _near_duplicate(self, type_: str, name: str, agent: str) -> str | None:
        """The known entity ``name`` is a near-duplicate of, among those ``agent`` has named itself."""
        st = self.state
        lsh = st.lsh.get(type_)
        mine = st.mentions.get(agent)
        if lsh is None or not mine or len(name) < MIN_TRUSTED_CHARS:
            return None
        sh = shingles(name)
        best: tuple[float, str] | None = None
        for cand in lsh.query(_minhash(sh)):
            if cand not in mine:
                continue  # another agent's entity: its name is not this agent's to see
            sim = jaccard(sh, st.shingles[cand])
            if sim >= MERGE_JACCARD and (best is None or (sim, _neg(cand)) > (best[0], _neg(best[1]))):
                best = (sim, cand)
        return best[1] if best else None

    def _fact(
        self,
        src: str,
        pred: str,
        dst: str,
        scope: str,
        conf: float,
        count: int,
        at: datetime,
        ep: str,
        agent: str,
        extractor: str,
        ch: KnowledgeChanges,
    ) -> None:
        st = self.state
        if not st.predicates.get(pred, False):
            same = st.by_fact.get((src, pred, dst, scope))
            if same is not None:
                self._reinforce(same, conf, count, at, ep, ch)
            else:
                self._insert(
                    Triple(
                        triple_id_for(src, pred, dst, scope, at),
                        src,
                        pred,
                        dst,
                        scope,
                        conf,
                        count,
                        ep,
                        None,
                        at,
                        None,
                        None,
                        agent,
                        extractor,
                    ),
                    ep,
                    ch,
                )
            return
        # Functional: find the stretch of the slot's timeline that covers `at`.
        ids = st.slots.get((src, pred, scope), [])
        pos = 0
        while pos < len(ids) and st.triples[ids[pos]].valid_from <= at:
            pos += 1
        cover = st.triples[ids[pos - 1]] if pos > 0 else None
        if cover is not None and (cover.valid_to is None or at < cover.valid_to) and cover.target == dst:
            self._reinforce(cover.triple_id, conf, count, at, ep, ch)  # the belief held then: it is confirmed
            return
        if cover is None and ids and st.triples[ids[0]].target == dst:
            self._reinforce(ids[0], conf, count, at, ep, ch)  # an earlier sighting of the first belief
            return
        tid = triple_id_for(src, pred, dst, scope, at)
        nxt = st.triples[ids[pos]] if pos < len(ids) else None
        if cover is not None and (cover.valid_to is None or at < cover.valid_to):
            # The new belief replaces the covering one from `at` on: the rest of its stretch is the new one's.
            end, after = cover.valid_to, cover.superseded_by
            self._close(cover, at, tid, ep, ch)
        else:  # before the first stretch (a late fact): it lasts until the first belief began
            end, after = (nxt.valid_from, nxt.triple_id) if nxt is not None else (None, None)
        self._insert(
            Triple(tid, src, pred, dst, scope, conf, count, ep, None, at, end, after, agent, extractor),
            ep,
            ch,
            position=pos,
        )

    def _insert(self, t: Triple, ep: str, ch: KnowledgeChanges, position: int | None = None) -> None:
        self.state._add(t, position)
        ch.triples_inserted.append(t)
        self._history(t.triple_id, "asserted", ep, t.valid_from, t.count, t.confidence, ch)

    def _close(self, t: Triple, at: datetime, by: str, ep: str, ch: KnowledgeChanges) -> None:
        self.state.triples[t.triple_id] = msgspec.structs.replace(t, valid_to=at, superseded_by=by)
        ch.triples_closed.append(TripleClosed(t.triple_id, at, by))
        self._history(t.triple_id, "superseded", ep, at, t.count, t.confidence, ch)

    def _reinforce(self, tid: str, conf: float, count: int, at: datetime, ep: str, ch: KnowledgeChanges) -> None:
        t = self.state.triples[tid]
        new = msgspec.structs.replace(
            t, count=t.count + count, confidence=noisy_or(t.confidence, conf), last_evidence=ep
        )
        self.state.triples[tid] = new
        ch.triples_reinforced.append(TripleReinforced(tid, new.count, new.confidence, ep))
        self._history(tid, "reinforced", ep, at, new.count, new.confidence, ch)

    def _history(
        self, tid: str, change: str, ep: str, at: datetime, count: int, conf: float, ch: KnowledgeChanges
    ) -> None:
        ch.history.append(HistoryRow(self.state.ordinal, tid, change, ep, at, count, conf))
        self.state.ordinal += 1


def _neg(s: str) -> tuple[int, ...]:
    """Sort key that prefers the smaller id on equal similarity."""
    return tuple(-ord(c) for c in s)


def as_of(triples: Iterable[Triple], when: datetime) -> list[Triple]:
    """The triples active at ``when``: valid_from <= when < valid_to (valid_to None = still active)."""
    return sorted(
        (t for t in triples if t.valid_from <= when and (t.valid_to is None or when < t.valid_to)),
        key=lambda t: (t.source, t.predicate, t.scope, t.target),
    )
