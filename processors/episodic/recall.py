"""Recall: the associative graph's arithmetic, spreading activation, hybrid retrieval, the relevance
gate, the token budget and ``build_episodic_context``. Pure: no I/O, no clock (``now`` is an argument).

**Edges.** When capture stores a memory it recalls the most similar existing ones (at most
``ASSOCIATION_LIMIT`` = 5, situation similarity >= ``ASSOCIATION_THRESHOLD`` = 0.5) and links
them both ways with ``weight = 0.60 shared + 0.25 goal + 0.15 temporal``: the Jaccard of their
objects and people, the word Jaccard of their goals, and ``exp(-hours apart / 24)``.

**Spreading activation.** From seed memories, breadth first: a neighbour receives
``activation x 0.5 x edge weight`` per hop, at most 3 hops, and nothing below ``MIN_ACTIVATION``
(0.05) spreads. A node keeps the strongest activation that reached it. The query-conditioned
variant also multiplies by the neighbour's similarity to the query, so the walk follows branches
the query cares about. Aggregated scoring re-ranks a candidate by ``0.6 x its score + 0.4 x the
mean score of its neighbours``.

>>> graph = {0: {1: 0.81}, 1: {0: 0.81, 2: 0.75}, 2: {1: 0.75}}
>>> {k: round(v, 2) for k, v in sorted(spread_activation(graph, {0: 1.0}).items())}
{0: 1.0, 1: 0.41, 2: 0.15}

**Recall** (``recall``) fuses, by weighted reciprocal rank fusion (``RRF_K`` = 10):

- *lexical*: BM25 over the fingerprint index's unigrams (k1 0.9, b 0.4), its statistics taken over
  the reader's corpus (its scopes), made context-aware in ways that need no model: the BM25 of
  the memory read together with its run neighbours (the turn before and after) is added with
  weight ``WINDOW_WEIGHT`` 0.5, and a memory gets ``CONTEXT_WEIGHT`` 0.5 of its neighbours' own
  BM25 (an answer is often in the turn next to the words of the question); a memory in a run that
  matches the query as a whole (BM25 over runs) is multiplied by up to ``1 + RUN_WEIGHT``; a
  memory of a person the query names (speaker, user, delegate) by ``1 + PERSON_BOOST`` (and the
  name leaves the lexical query: it says whose memory, not what); a memory from a date the query
  names by up to ``1 + TIME_BOOST``;
- *fingerprint*: Jaccard of the query's and the memory's uni/bi/trigram fingerprints;
- *lsh*: the MinHash estimate of the situation similarity (LSH candidates and lexical ones);
- *graph*: spreading activation from the best lexical candidates over the associative graph;
- *importance*: ``0.3 recency + 0.3 ln(access count + 1) + 0.4 explicit importance``;
- *embedding* (optional): cosine similarity of sentence vectors (``processors/episodic/embedding.py``).

Each hit carries every signal's score and rank (its explanation). Reads never change state:
``recall`` returns ``MemoryAccessed`` events, and the fold of the log counts them.

BM25 is implemented here over the same inverted index that holds the fingerprints (DuckDB's fts
extension cannot be installed offline, and a second index in a library such as ``bm25s`` or
``rank_bm25`` would duplicate the postings and could not grow one memory at a time).
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime

import numpy as np

from somnus.processors.briefing.injection import one_line
from somnus.processors.episodic.index import (
    SCOPE_BUCKETS,
    MemoryIndex,
    fingerprint,
    ngram_fingerprints,
    posting_keys,
    tokenize,
)
from somnus.schemas.memory import MEMORY_SCHEMA_VERSION, MemoryAccessed, MemoryUnit
from somnus.schemas.agents import scope_chain

# ---- the associative graph ----------------------------------------------------------------------

EDGE_SHARED = 0.60  # shared objects and people
EDGE_GOAL = 0.25  # goal overlap (word Jaccard)
EDGE_TEMPORAL = 0.15  # temporal proximity
TEMPORAL_TAU_HOURS = 24.0  # proximity = exp(-hours apart / 24): 0.37 a day apart, ~0 a week apart
ASSOCIATION_LIMIT = 5
ASSOCIATION_THRESHOLD = 0.5

ACTIVATION_DECAY = 0.5
MAX_HOPS = 3
MIN_ACTIVATION = 0.05
AGGREGATE_SELF = 0.6
AGGREGATE_NEIGHBOURS = 0.4


def jaccard(a: set[str], b: set[str]) -> float:
    """|a & b| / |a | b|; 0 when both are empty (nothing shared is no evidence of a link)."""
    union = a | b
    return len(a & b) / len(union) if union else 0.0


def temporal_proximity(a: datetime, b: datetime) -> float:
    """``exp(-hours apart / 24)``.

    >>> round(temporal_proximity(datetime(2024, 1, 1), datetime(2024, 1, 2)), 4)
    0.3679
    """
    return math.exp(-abs((a - b).total_seconds()) / 3600.0 / TEMPORAL_TAU_HOURS)


@dataclass(frozen=True)
class EdgeWeight:
    weight: float
    shared: float
    goal: float
    temporal: float


@functools.lru_cache(maxsize=1 << 14)
def _goal_words(goal: str) -> frozenset[str]:
    """A goal's words (memoised: capture weighs up to five edges per memory, and goals repeat)."""
    return frozenset(tokenize(goal))


@functools.lru_cache(maxsize=1 << 14)
def _things(names: tuple[str, ...]) -> frozenset[str]:
    """A memory's objects and people, lower case (memoised, as goals)."""
    return frozenset(x.lower() for x in names)


def edge_parts(a: MemoryUnit, b: MemoryUnit) -> tuple[float, float, float, float]:
    """(weight, shared, goal, temporal) of ``edge_weight``, as a tuple (capture weighs every edge)."""
    x, y = _things((*a.objects, *a.people)), _things((*b.objects, *b.people))
    union = x | y
    shared = len(x & y) / len(union) if union else 0.0  # jaccard, inline
    goal = 0.0
    if a.goal and b.goal:
        x, y = _goal_words(a.goal), _goal_words(b.goal)
        union = x | y
        goal = len(x & y) / len(union) if union else 0.0
    temporal = math.exp(-abs((a.occurred_at - b.occurred_at).total_seconds()) / 3600.0 / TEMPORAL_TAU_HOURS)
    return EDGE_SHARED * shared + EDGE_GOAL * goal + EDGE_TEMPORAL * temporal, shared, goal, temporal


def edge_weight(a: MemoryUnit, b: MemoryUnit) -> EdgeWeight:
    """``0.60 shared + 0.25 goal + 0.15 temporal`` between two memories (``jaccard`` of objects and
    people, ``jaccard`` of goal words, ``temporal_proximity``)."""
    weight, shared, goal, temporal = edge_parts(a, b)
    return EdgeWeight(weight=weight, shared=shared, goal=goal, temporal=temporal)


def spread_activation(
    graph: Mapping[int, Mapping[int, float]],
    seeds: Mapping[int, float],
    *,
    decay: float = ACTIVATION_DECAY,
    max_hops: int = MAX_HOPS,
    threshold: float = MIN_ACTIVATION,
    query_similarity: Callable[[int], float] | None = None,
) -> dict[int, float]:
    """Breadth-first spreading activation: ``activation x decay x edge weight`` (x the neighbour's
    similarity to the query, when given) per hop, up to ``max_hops``; activations below
    ``threshold`` do not spread. Returns every reached node (seeds included) with its strongest
    activation.
    """
    act = {int(k): float(v) for k, v in seeds.items()}
    frontier = sorted(act)
    for _ in range(max_hops):
        reached: dict[int, float] = {}
        for node in frontier:
            a = act[node]
            for nbr, w in sorted(graph.get(node, {}).items()):
                x = a * decay * w
                if query_similarity is not None:
                    x *= max(0.0, query_similarity(nbr))
                if x < threshold or x <= act.get(nbr, 0.0) or x <= reached.get(nbr, 0.0):
                    continue
                reached[nbr] = x
        if not reached:
            break
        act.update(reached)
        frontier = sorted(reached)
    return act


def aggregate_scores(scores: Mapping[int, float], graph: Mapping[int, Mapping[int, float]]) -> dict[int, float]:
    """``0.6 x own score + 0.4 x mean score of the neighbours`` (a neighbour outside ``scores`` counts 0);
    a memory without neighbours keeps its score.

    >>> aggregate_scores({0: 1.0, 1: 0.5}, {0: {1: 0.9, 2: 0.3}})
    {0: 0.7, 1: 0.5}
    """
    out: dict[int, float] = {}
    for node, s in scores.items():
        nbrs = graph.get(node)
        if nbrs:
            mean = sum(scores.get(n, 0.0) for n in sorted(nbrs)) / len(nbrs)
            out[node] = AGGREGATE_SELF * s + AGGREGATE_NEIGHBOURS * mean
        else:
            out[node] = s
    return out


# ---- importance ---------------------------------------------------------------------------------

IMPORTANCE_RECENCY = 0.3
IMPORTANCE_ACCESS = 0.3
IMPORTANCE_EXPLICIT = 0.4
RECENCY_TAU_DAYS = 7.0  # recency = exp(-days since last access (or capture) / 7)


def importance_score(
    recency: np.ndarray | float, access_count: np.ndarray | float, explicit: np.ndarray | float
) -> np.ndarray | float:
    """``0.3 recency + 0.3 ln(access + 1) + 0.4 explicit``.

    >>> round(float(importance_score(1.0, 0, 0.5)), 4), round(float(importance_score(0.5, 3, 1.0)), 4)
    (0.5, 0.9659)
    """
    return (
        IMPORTANCE_RECENCY * recency
        + IMPORTANCE_ACCESS * np.log(np.asarray(access_count) + 1.0)
        + IMPORTANCE_EXPLICIT * explicit
    )


# ---- dates named in a query ------------------------------------------------------------------

_MONTHS = {
    m: i + 1
    for i, m in enumerate(
        "january february march april may june july august september october november december".split()
    )
}
_MONTHS.update({m[:3]: i for m, i in list(_MONTHS.items())})
_MONTHS["sept"] = 9
_M = r"(january|february|march|april|may|june|july|august|september|october|november|december|jan|feb|mar|apr|jun|jul|aug|sept|sep|oct|nov|dec)\.?"
_DAY_MONTH_YEAR = re.compile(r"\b(\d{1,2})(?:st|nd|rd|th)?\s+(?:of\s+)?" + _M + r",?\s+(\d{4})\b")
_MONTH_DAY_YEAR = re.compile(r"\b" + _M + r"\s+(\d{1,2})(?:st|nd|rd|th)?,?\s*(\d{4})\b")
_ISO_DATE = re.compile(r"\b(\d{4})-(\d{2})-(\d{2})\b")
_MONTH_YEAR = re.compile(r"\b" + _M + r",?\s+(\d{4})\b")
_YEAR = re.compile(r"\b(19\d\d|20\d\d)\b")


@dataclass(frozen=True)
class TimeHint:
    """A date the query names: a day, a month or a year."""

    precision: str  # day | month | year
    year: int
    month: int = 0
    day: int = 0


def time_hints(text: str) -> list[TimeHint]:
    """Dates named in ``text``, most precise form found first.

    >>> time_hints("What did Nate make on 9 November, 2022?")
    [TimeHint(precision='day', year=2022, month=11, day=9)]
    >>> time_hints("in December 2023"), time_hints("in 2024")
    ([TimeHint(precision='month', year=2023, month=12, day=0)], [TimeHint(precision='year', year=2024, month=0, day=0)])
    """
    low = text.lower()
    out: list[TimeHint] = []
    for m in _DAY_MONTH_YEAR.finditer(low):
        out.append(TimeHint("day", int(m[3]), _MONTHS[m[2]], int(m[1])))
    for m in _MONTH_DAY_YEAR.finditer(low):
        out.append(TimeHint("day", int(m[3]), _MONTHS[m[1]], int(m[2])))
    for m in _ISO_DATE.finditer(low):
        out.append(TimeHint("day", int(m[1]), int(m[2]), int(m[3])))
    out = [h for h in out if 1 <= h.month <= 12 and 1 <= h.day <= 31]
    if not out:
        out = [TimeHint("month", int(m[2]), _MONTHS[m[1]]) for m in _MONTH_YEAR.finditer(low)]
    if not out:
        out = [TimeHint("year", int(m[1])) for m in _YEAR.finditer(low)]
    return out


TIME_MATCH = {"day": 1.0, "month": 0.5, "year": 0.2}  # a memory from the named day / month / year


def time_match(hints: Sequence[TimeHint], when: np.ndarray | datetime) -> np.ndarray | float:
    """How well event times fit the dates a query names: 1 within a day of a named day, 0.5 in a named
    month, 0.2 in a named year, else 0 (the best over all hints). ``when``: a datetime, or an array of
    seconds since the epoch (UTC).

    >>> from datetime import timezone
    >>> hints = time_hints("on 9 November, 2022")
    >>> [time_match(hints, datetime(2022, 11, d, tzinfo=timezone.utc)) for d in (10, 20)]
    [1.0, 0.5]
    """
    scalar = isinstance(when, datetime)
    ts = np.atleast_1d(np.asarray(when.timestamp() if isinstance(when, datetime) else when, dtype=np.float64))
    sec = ts.astype("int64").astype("datetime64[s]")
    days = sec.astype("datetime64[D]")
    months = sec.astype("datetime64[M]")
    years = sec.astype("datetime64[Y]")
    best = np.zeros(len(ts))
    for h in hints:
        year = np.datetime64(f"{h.year:04d}", "Y")
        in_year = years == year
        if h.precision == "year":
            best = np.maximum(best, np.where(in_year, TIME_MATCH["year"], 0.0))
            continue
        in_month = months == np.datetime64(f"{h.year:04d}-{h.month:02d}", "M")
        level = np.where(in_month, TIME_MATCH["month"], np.where(in_year, TIME_MATCH["year"], 0.0))
        if h.precision == "day":
            try:
                named = np.datetime64(date(h.year, h.month, h.day).isoformat(), "D")
            except ValueError:
                continue
            near = np.abs((days - named).astype(np.int64)) <= 1
            level = np.where(near, TIME_MATCH["day"], level)
        best = np.maximum(best, level)
    return float(best[0]) if scalar else best


# ---- recall ------------------------------------------------------------------------------------

BM25_K1 = 0.9
BM25_B = 0.4
CONTEXT_WEIGHT = 0.5  # share of a run neighbour's BM25 a memory receives
WINDOW_WEIGHT = 0.5  # weight of the BM25 of the memory read together with its run neighbours
RUN_WEIGHT = 1.0  # lexical x (1 + RUN_WEIGHT x the run's BM25 / the best run's)
PERSON_BOOST = 1.0  # lexical x 2 for memories of a person the query names
TIME_BOOST = 1.0  # lexical x (1 + TIME_BOOST x time_match)
RRF_K = 10  # lexical leads: a small k keeps its top ranks apart (k = 60 cost 0.06 recall@1 on LoCoMo)
GRAPH_SEEDS = 10  # the best lexical candidates seed spreading activation
EMBEDDING_CANDIDATES = 200  # nearest vectors that join the candidates
FUSION_DEPTH = 1000  # each signal's best memories that take part in the fusion

SIGNALS = ("lexical", "fingerprint", "lsh", "graph", "importance", "embedding")


@dataclass(frozen=True)
class RecallConfig:
    """The global knobs of recall; every default is pinned by a test."""

    k1: float = BM25_K1
    b: float = BM25_B
    context_weight: float = CONTEXT_WEIGHT
    window_weight: float = WINDOW_WEIGHT
    run_weight: float = RUN_WEIGHT
    person_boost: float = PERSON_BOOST
    time_boost: float = TIME_BOOST
    rrf_k: int = RRF_K
    weights: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_WEIGHTS))
    graph_seeds: int = GRAPH_SEEDS
    query_conditioned: bool = False  # graph walk x neighbour's similarity to the query
    aggregate: bool = False  # final re-rank: 0.6 x self + 0.4 x mean of neighbours
    embedding_candidates: int = EMBEDDING_CANDIDATES


# RRF weights per signal, tuned globally on LoCoMo (see the report of issue 5): lexical leads; the
# other signals only break its ties there (at higher weights they cost recall); the embedding adds
# what words cannot see (synonyms) at 0.2.
DEFAULT_WEIGHTS: dict[str, float] = {
    "lexical": 1.0,
    "fingerprint": 0.02,
    "lsh": 0.02,
    "graph": 0.05,
    "importance": 0.02,
    "embedding": 0.2,
}


@dataclass(frozen=True)
class Hit:
    memory_id: str
    rank: int
    score: float  # the fused score
    signals: dict[str, float]  # each signal's raw score for this memory (0 when it did not rank it)
    ranks: dict[str, int]  # each signal's rank of this memory (absent when it did not rank it)
    refs: list[str]
    unit: MemoryUnit


@dataclass(frozen=True)
class Recall:
    hits: list[Hit]
    accessed: list[MemoryAccessed]  # publish these: the log, not the read, counts an access
    people: list[str] = field(default_factory=list)  # people the query named
    time_hints: list[TimeHint] = field(default_factory=list)


def allowed_scopes(agent: str, agents: Mapping[str, object] | None = None) -> list[str]:
    """The scopes ``agent`` reads (``somnus.schemas.agents.scope_chain``)."""
    return scope_chain(dict(agents or {}), agent)  # type: ignore[arg-type]


def named_people(index: MemoryIndex, tokens: Sequence[str], reader: str | None = None) -> list[str]:
    """Known people (normalised names) whose every word is in the query's tokens; never the reader
    itself (an agent's own messages carry its name as their speaker, so "support" is a person of the
    support agent's memories, and its "support group" is not about itself)."""
    present = set(tokens)
    own = reader.lower() if reader else None
    out: set[str] = set()
    for tok in present:
        for name in index.people.get(tok, ()):
            if name != own and all(w in present for w in name.split()):
                out.add(name)
    return sorted(out)


def without_people(query: str, people: Sequence[str]) -> str:
    """``query`` without the words of the people it names (and their possessive ``'s``): what a
    model of meaning embeds. As the lexical signal drops the names, so must the embedding: a question
    "When did Caroline ..." otherwise lands nearest the other speaker's turns that greet Caroline
    (e5 on LoCoMo conv-26: the evidence at rank 112 behind 111 such turns).

    >>> without_people("When did Caroline's mom visit Caroline?", ["caroline"])
    'When did mom visit ?'
    """
    words = {w for p in people for w in p.split()}
    if not words:
        return query
    pattern = re.compile(r"\b(?:" + "|".join(re.escape(w) for w in sorted(words)) + r")(?:'s)?\b", re.IGNORECASE)
    return " ".join(pattern.sub("", query).split())


def recall(
    index: MemoryIndex,
    query: str,
    agent: str,
    k: int = 10,
    filters: Mapping[str, object] | None = None,
    *,
    now: datetime,
    agents: Mapping[str, object] | None = None,
    config: RecallConfig | None = None,
    query_vector: np.ndarray | None = None,
    user_id: str | None = None,
) -> Recall:
    """The ``k`` memories of ``agent``'s scope chain that best answer ``query``, with explanations.

    ``user_id``: the user the reader acts for. Memories of another user are never read (nor counted
    in any statistic); a reader with no user reads only memories that belong to no user.

    ``filters``: multi-key constraints (e.g. ``{"tool": "book_reservation", "success": True}``).
    ``query_vector``: the query's embedding; computed with the index's ``embed`` when it has one (of
    the query without the people it names, ``without_people``).
    """
    cfg = config or RecallConfig()
    n = len(index.ids)
    scopes = allowed_scopes(agent, agents)
    scope_ok = np.zeros(max(len(index.scopes), 1), dtype=bool)
    for s in scopes:
        if s in index.scopes:
            scope_ok[index.scopes[s]] = True
    if n == 0 or not scope_ok.any():
        return Recall([], [])
    # One pass over the memories' columns (O(N), ~1 ms at 1M) beats gathering two columns per posting.
    corpus = (
        index.alive.data[:n] & scope_ok[index.scope_code.data[:n]] & index.user_mask(user_id)
    )  # what the reader may read
    key_mask = index.key_mask(dict(filters)) if filters else None
    visible = corpus & key_mask if key_mask is not None else corpus  # ... and what the filters let through

    def in_corpus(ix: np.ndarray) -> np.ndarray:
        return corpus[ix]

    def readable(ix: np.ndarray) -> np.ndarray:
        return visible[ix]

    tokens = index.tokenize(query)  # = tokenize(query, index.config.stem)
    # Only people of memories the reader may read: the list is returned, and a person known only in
    # another scope or to another user would tell the reader that person exists.
    # Names are matched unstemmed: the index keeps them as written, and a stemmer changes many of
    # them ("melanie" -> "melani"), which once hid most people from a stemming reader.
    people = [
        p
        for p in named_people(index, tokenize(query), agent)
        if corpus[np.asarray(index.keys.get(("person", p), ()), dtype=np.int64)].any()
    ]
    name_words = set(index.tokenize(" ".join(people)))  # as the lexical tokens spell them
    lexical_tokens = [t for t in tokens if t not in name_words] or tokens
    hints = time_hints(query)

    signals: dict[str, tuple[np.ndarray, np.ndarray]] = {}  # name -> (memory indices, scores), unsorted
    lex_ix, lex_score, fp_ix, fp_score = _lexical(
        index, lexical_tokens, tokens, in_corpus, readable, np.flatnonzero(scope_ok), cfg, people, hints
    )
    signals["lexical"] = (lex_ix, lex_score)
    signals["fingerprint"] = (fp_ix, fp_score)
    lex_top = _top(lex_ix, lex_score, FUSION_DEPTH)

    # Situation similarity: LSH candidates, and the estimate for the best lexical candidates.
    qsig = index.signature_of_tokens(tokens)  # = the query's signature_of_text
    lsh_hits, _ = index.similar_signature_arrays(qsig, scopes)
    cand = _union(lex_ix[lex_top], lsh_hits)
    if len(cand):
        cand = cand[readable(cand)]
        sims = (index.signatures.data[cand] == qsig).mean(axis=1)
        signals["lsh"] = (cand[sims > 0], sims[sims > 0])

    # Optional embedding: brute-force cosine over the readable memories.
    emb: dict[int, float] = {}
    if index.vectors is not None and (query_vector is not None or index.embed is not None):
        qv = query_vector if query_vector is not None else index.embed([without_people(query, people)])[0]  # type: ignore[misc]
        ok = np.flatnonzero(readable(np.arange(n)))
        if len(ok):
            sims = index.vectors.data[ok] @ np.asarray(qv, dtype=np.float32)
            top = min(cfg.embedding_candidates, len(ok))
            part = np.argpartition(-sims, top - 1)[:top]
            signals["embedding"] = (ok[part], sims[part].astype(np.float64))
            emb = dict(zip(ok[part].tolist(), sims[part].tolist()))

    # Graph: spread from the best lexical candidates (activation = score / best score).
    if len(lex_ix) and index.graph:
        best = lex_top[: cfg.graph_seeds]
        peak = float(lex_score[best[0]])
        seeds = {int(lex_ix[j]): float(lex_score[j]) / peak for j in best}
        sim_fn = None
        if cfg.query_conditioned:
            ref = emb or dict(zip(fp_ix.tolist(), fp_score.tolist()))
            top_ref = max(ref.values()) if ref else 0.0
            sim_fn = (lambda i: ref.get(i, 0.0) / top_ref) if top_ref > 0 else (lambda i: 0.0)  # noqa: E731
        act = spread_activation(index.graph, seeds, query_similarity=sim_fn)
        reached = np.array(sorted(i for i in act if i not in seeds), dtype=np.int64)
        if len(reached):
            reached = reached[readable(reached)]
        signals["graph"] = (reached, np.array([act[int(i)] for i in reached], dtype=np.float64))

    # Only each signal's best FUSION_DEPTH memories take part: one outside every such list could not
    # reach the top k (its fused score is below the lexical top's by construction of RRF).
    ranked: dict[str, tuple[np.ndarray, np.ndarray]] = {}  # name -> (indices best first, scores)
    for name, (ix_, sc_) in signals.items():
        order = _top(ix_, sc_, FUSION_DEPTH)
        ranked[name] = (ix_[order], sc_[order])
    pool = _union(*[r[0] for r in ranked.values()], np.empty(0, dtype=np.int64))
    if not len(pool):
        return Recall([], [], people, hints)
    last = np.maximum(index.last_access.data[pool], index.occurred.data[pool])
    recency = np.exp(-np.maximum(now.timestamp() - last, 0.0) / 86400.0 / RECENCY_TAU_DAYS)
    imp = np.asarray(importance_score(recency, index.access_count.data[pool], index.importance.data[pool]))
    order = _top(pool, imp, len(pool))
    ranked["importance"] = (pool[order], imp[order])

    fused = np.zeros(len(pool))
    for name, (ix_, _) in ranked.items():
        w = cfg.weights.get(name, 0.0)
        if w > 0:
            fused[np.searchsorted(pool, ix_)] += w / (cfg.rrf_k + np.arange(1, len(ix_) + 1))
    if cfg.aggregate:
        agg = aggregate_scores(dict(zip(pool.tolist(), fused.tolist())), index.graph)
        fused = np.array([agg[i] for i in pool.tolist()])
    best = _top(pool, fused, k)
    # Each hit's place in each signal's ranking (a ranking lists a memory once): one pass per signal.
    places: dict[str, dict[int, tuple[int, float]]] = {}
    for name in SIGNALS:
        ix_, sc_ = ranked.get(name, (np.empty(0, dtype=np.int64), np.empty(0)))
        at = np.isin(ix_, pool[best]).nonzero()[0]
        places[name] = {m: (p, s) for m, p, s in zip(ix_[at].tolist(), at.tolist(), sc_[at].tolist())}
    hits = []
    for r, j in enumerate(best.tolist(), 1):
        i = int(pool[j])
        sig: dict[str, float] = {}
        rk: dict[str, int] = {}
        for name in SIGNALS:
            place = places[name].get(i)
            sig[name] = float(place[1]) if place is not None else 0.0
            if place is not None:
                rk[name] = place[0] + 1
        hits.append(
            Hit(
                memory_id=index.ids[i],
                rank=r,
                score=float(fused[j]),
                signals=sig,
                ranks=rk,
                refs=list(index.refs[i]),
                unit=index.units[i],
            )
        )
    accessed = [
        MemoryAccessed(
            schema_version=MEMORY_SCHEMA_VERSION,
            memory_id=h.memory_id,
            agent=agent,
            query=query[:200],
            rank=h.rank,
            score=round(h.score, 9),
            accessed_at=now,
        )
        for h in hits
    ]
    return Recall(hits, accessed, people, hints)


def _union(*arrays: np.ndarray) -> np.ndarray:
    """``np.union1d`` of any number of arrays: sorted distinct values (a sort: numpy's ``unique`` hashes,
    several times slower on these sizes)."""
    x = np.concatenate(arrays)
    if len(x) > 1:
        x.sort()
        first = np.empty(len(x), dtype=bool)
        first[0] = True
        np.not_equal(x[1:], x[:-1], out=first[1:])
        x = x[first]
    return x


def _top(ix: np.ndarray, score: np.ndarray, m: int) -> np.ndarray:
    """Positions of the ``m`` best (highest score; ties: smaller memory index), best first."""
    if not len(ix) or m <= 0:
        return np.empty(0, dtype=np.int64)
    if len(ix) > m:
        # A partition on the score alone could split ties arbitrarily: keep every tie of the m-th.
        cut = np.partition(-score, m - 1)[m - 1]
        keep = np.flatnonzero(-score <= cut)
    else:
        keep = np.arange(len(ix))
    order = keep[np.lexsort((ix[keep], -score[keep]))]
    return order[:m]


def _lexical(
    index: MemoryIndex,
    lexical_tokens: Sequence[str],
    all_tokens: Sequence[str],
    in_corpus: Callable[[np.ndarray], np.ndarray],
    readable: Callable[[np.ndarray], np.ndarray],
    scope_codes: np.ndarray,
    cfg: RecallConfig,
    people: Sequence[str],
    hints: Sequence[TimeHint],
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(memories, lexical scores, memories, fingerprint Jaccards); vectorised over postings."""
    uni = np.array(sorted({fingerprint(t) for t in lexical_tokens}), dtype=np.uint64)
    q_uni, q_grams = ngram_fingerprints(list(all_tokens))
    q_all = np.array(sorted(set(q_uni) | set(q_grams)), dtype=np.uint64)
    none = (np.empty(0, dtype=np.int64), np.empty(0))
    if not len(q_all):
        return *none, *none

    # One gather for every query fingerprint under each of the reader's scopes, then restricted to
    # the reader's corpus (liveness, user, and scopes beyond the last bucket).
    buckets = np.unique(np.minimum(scope_codes, SCOPE_BUCKETS - 1))
    pos, ix, tf = index.postings.gather(posting_keys(q_all, buckets))
    pos = pos % len(q_all)
    keep = in_corpus(ix)
    pos, ix, tf = pos[keep], ix[keep], tf[keep]

    # Fingerprint Jaccard over uni/bi/trigrams: |Q & D| / (|Q| + |D| - |Q & D|).
    fp = none
    if len(ix):
        cand, inter = np.unique(ix[readable(ix)], return_counts=True)
        fp = (cand.astype(np.int64), inter / (len(q_all) + index.fp_count.data[cand] - inter))

    # BM25 over the lexical unigrams. The corpus is what the reader may read (its scopes, live
    # memories): N, average length and document frequencies come from there, and so do the runs'.
    if not len(uni) or not len(ix):
        return *none, *fp
    at = np.searchsorted(uni, q_all)
    uni_of = np.where((at < len(uni)) & (uni[np.minimum(at, len(uni) - 1)] == q_all), at, -1)
    pos = uni_of[pos]
    keep = pos >= 0
    pos, ix, tf = pos[keep], ix[keep], tf[keep]
    if not len(ix):
        return *none, *fp
    n_live = max(float(index.scope_live.data[scope_codes].sum()), 1.0)
    live_len = float(index.scope_len.data[scope_codes].sum())
    avgdl = max(live_len / n_live, 1e-9)
    df = np.bincount(pos, minlength=len(uni)).astype(np.float64)
    idf = np.log(1.0 + (n_live - df + 0.5) / (df + 0.5))
    dl = index.doc_len.data[ix].astype(np.float64)
    contrib = idf[pos] * tf * (cfg.k1 + 1.0) / (tf + cfg.k1 * (1.0 - cfg.b + cfg.b * dl / avgdl))

    # Run relevance: BM25 with each run as one document (from the same postings).
    runs = index.run_code.data[ix].astype(np.int64)
    n_runs = max(float(index.scope_runs.data[scope_codes].sum()), 1.0)
    pair = runs * len(uni) + pos
    upair, inv = np.unique(pair, return_inverse=True)
    run_tf = np.bincount(inv, weights=tf).astype(np.float64)
    pr_run, pr_pos = upair // len(uni), upair % len(uni)
    run_df = np.bincount(pr_pos, minlength=len(uni)).astype(np.float64)
    run_idf = np.log(1.0 + (n_runs - run_df + 0.5) / (run_df + 0.5))
    run_avg = max(live_len / n_runs, 1e-9)
    rl = index.run_len.data[pr_run]
    run_contrib = run_idf[pr_pos] * run_tf * (cfg.k1 + 1.0) / (run_tf + cfg.k1 * (1.0 - cfg.b + cfg.b * rl / run_avg))
    urun, rinv = np.unique(pr_run, return_inverse=True)
    run_score = np.bincount(rinv, weights=run_contrib)

    if cfg.window_weight:
        # The window: a memory read together with the memories before and after it in its run (one
        # document of three), scored by BM25 and added with ``window_weight``.
        w_ix, w_pos, w_tf = [ix], [pos], [tf]
        for nb in (index.next.data[ix], index.prev.data[ix]):  # a posting of i counts for i's neighbours
            nb = nb.astype(np.int64)
            m = nb >= 0
            m[m] = in_corpus(nb[m])
            w_ix.append(nb[m])
            w_pos.append(pos[m])
            w_tf.append(tf[m])
        wix, wpos, wtf = np.concatenate(w_ix), np.concatenate(w_pos), np.concatenate(w_tf)
        wkey, winv = np.unique(wix * len(uni) + wpos, return_inverse=True)
        wtf = np.bincount(winv, weights=wtf)
        wix, wpos = wkey // len(uni), wkey % len(uni)
        dlen = index.doc_len.data
        pv, nx = index.prev.data[wix].astype(np.int64), index.next.data[wix].astype(np.int64)
        wlen = dlen[wix] + np.where(pv >= 0, dlen[np.maximum(pv, 0)], 0) + np.where(nx >= 0, dlen[np.maximum(nx, 0)], 0)
        wavg = 3.0 * avgdl
        wcontrib = (
            cfg.window_weight * idf[wpos] * wtf * (cfg.k1 + 1.0) / (wtf + cfg.k1 * (1.0 - cfg.b + cfg.b * wlen / wavg))
        )
        ix = np.concatenate([ix, wix])
        pos = np.concatenate([pos, wpos])
        contrib = np.concatenate([contrib, wcontrib])

    keep = readable(ix)
    ix, pos, contrib = ix[keep], pos[keep], contrib[keep]
    if not len(ix):
        return *none, *fp
    order = np.argsort(pos, kind="stable")  # sum each memory's terms in query-term order: replay-exact
    cand, inv = np.unique(ix[order], return_inverse=True)
    bm25 = np.bincount(inv, weights=contrib[order])
    # Context: half of each run neighbour's BM25 flows to the memory beside it (readable ones only).
    prev = index.prev.data[cand].astype(np.int64)
    nxt = index.next.data[cand].astype(np.int64)
    extra = np.concatenate([prev[prev >= 0], nxt[nxt >= 0]])
    extra = extra[readable(extra)] if len(extra) else extra
    allc = _union(cand, extra)
    score = np.zeros(len(allc))
    score[np.searchsorted(allc, cand)] += bm25
    for nb in (prev, nxt):
        m = nb >= 0
        if m.any():
            tgt = nb[m]
            ok = np.isin(tgt, allc)
            np.add.at(score, np.searchsorted(allc, tgt[ok]), cfg.context_weight * bm25[m][ok])
    # Whole-run relevance, named people, named dates: multipliers.
    if len(urun) and cfg.run_weight:
        best = run_score.max()
        rs = np.zeros(len(allc))
        if best > 0:
            rcode = index.run_code.data[allc]
            at = np.searchsorted(urun, rcode)
            at_ok = (at < len(urun)) & (urun[np.minimum(at, len(urun) - 1)] == rcode)
            rs[at_ok] = run_score[at[at_ok]] / best
        score *= 1.0 + cfg.run_weight * rs
    if people and cfg.person_boost:
        pm = np.zeros(len(index.ids), dtype=bool)
        for p in people:
            hits = index.keys.get(("person", p))
            if hits:
                pm[np.asarray(hits, dtype=np.int64)] = True
        score *= 1.0 + cfg.person_boost * pm[allc]
    if hints and cfg.time_boost:
        score *= 1.0 + cfg.time_boost * np.asarray(time_match(hints, index.occurred.data[allc]))
    pos_ = score > 0
    return allc[pos_].astype(np.int64), score[pos_], *fp


# ---- the relevance gate, the token budget, the episodic context --------------------------------

RELEVANCE_WEIGHTS = {"text": 0.5, "tool": 0.2, "domain": 0.15, "entity": 0.15}
MIN_RELEVANCE = 0.05
CHARS_PER_TOKEN = 4  # the usual estimate for English text; no tokenizer needed


def estimate_tokens(text: str) -> int:
    """Tokens of ``text`` at ``CHARS_PER_TOKEN`` characters each, rounded up.

    >>> estimate_tokens(""), estimate_tokens("abcd"), estimate_tokens("abcde")
    (0, 1, 2)
    """
    return -(-len(text) // CHARS_PER_TOKEN)


@dataclass(frozen=True)
class Relevance:
    score: float
    fingerprint: float
    tool: float
    domain: float
    entity: float
    task: float = 0.0  # the query's similarity to the memory's task (``task_similarity``)


def task_similarity(query_tokens: set[str], task_tokens: set[str]) -> float:
    """How alike a query and a memory's task are: the cosine of their token sets (Ochiai),
    ``|Q & T| / sqrt(|Q| |T|)``. Unlike the fingerprint Jaccard over the whole memory (task, summary,
    lessons, tools: a short query against a long episode scores ~0.08 even when it *is* the task),
    it compares like with like, and a length difference lowers it only by its square root.

    >>> task_similarity({"refund", "order", "1042"}, {"refund", "order", "1042"})
    1.0
    >>> round(task_similarity({"book", "flight"}, {"book", "flight", "new", "york", "seattle", "may", "20", "economy"}), 3)
    0.5
    >>> task_similarity({"pizza"}, {"book", "flight"}), task_similarity(set(), {"x"})
    (0.0, 0.0)
    """
    if not query_tokens or not task_tokens:
        return 0.0
    return len(query_tokens & task_tokens) / math.sqrt(len(query_tokens) * len(task_tokens))


def relevance(
    unit: MemoryUnit,
    fingerprint_jaccard: float,
    query_tokens: set[str],
    domain_hint: str | None = None,
    task: float = 0.0,
) -> Relevance:
    """Gated fusion: ``0.5 text + 0.2 tool + 0.15 domain + 0.15 entity``. Text: the better of the
    fingerprint Jaccard and the task similarity ``task``; the others are exact matches: a tool,
    domain (the hint, else one the query names) or object/person of the memory in the query."""
    tool = 1.0 if any(t.lower() in query_tokens for t in unit.tools) else 0.0
    doms = {d.lower() for d in unit.domains}
    domain = (
        1.0
        if (
            (domain_hint and domain_hint.lower() in doms)
            or (not domain_hint and any(set(tokenize(d)) and set(tokenize(d)) <= query_tokens for d in doms))
        )
        else 0.0
    )
    entity = (
        1.0
        if any(set(tokenize(e)) and set(tokenize(e)) <= query_tokens for e in (*unit.objects, *unit.people))
        else 0.0
    )
    score = (
        RELEVANCE_WEIGHTS["text"] * max(fingerprint_jaccard, task)
        + RELEVANCE_WEIGHTS["tool"] * tool
        + RELEVANCE_WEIGHTS["domain"] * domain
        + RELEVANCE_WEIGHTS["entity"] * entity
    )
    return Relevance(score, fingerprint_jaccard, tool, domain, entity, task)


@dataclass(frozen=True)
class GatedHit:
    hit: Hit
    relevance: Relevance


def gate(
    hits: Sequence[Hit],
    query: str,
    *,
    min_relevance: float = MIN_RELEVANCE,
    success_only: bool = False,
    domain_hint: str | None = None,
    top_k: int = 5,
    words: Callable[[str], list[str]] = tokenize,
) -> list[GatedHit]:
    """Drop hits below ``min_relevance`` (and unsuccessful ones when ``success_only``), sort by
    relevance (ties: recall rank), keep ``top_k``. ``words``: how the task similarity tokenises the
    query and each memory's task (the index's ``tokenize``: stemmed as it stems)."""
    q = set(tokenize(query))
    q_words = set(words(query))
    out = []
    for h in hits:
        if success_only and h.unit.success is not True:
            continue
        task = task_similarity(q_words, set(words(h.unit.perception)))
        r = relevance(h.unit, h.signals.get("fingerprint", 0.0), q, domain_hint, task)
        if r.score >= min_relevance:
            out.append(GatedHit(h, r))
    out.sort(key=lambda g: (-g.relevance.score, g.hit.rank))
    return out[:top_k]


def result_text(outcome: str, summary: str, task: str) -> str:
    """An entry's result: the outcome, then what the summary adds. An episode's summary starts with
    its outcome and task (``"success: refund order 1042 | 3 tool calls ..."``, the distiller's), which
    the entry already shows: each is said once.

    >>> result_text("success", "success: refund order 1042 | 3 tool calls (2 tools)", "refund order 1042")
    'success: 3 tool calls (2 tools)'
    >>> result_text("failure", "gave up", "x"), result_text("", "", "x")
    ('failure: gave up', '')
    """
    rest = summary.strip()
    if outcome and rest.startswith(f"{outcome}:"):
        rest = rest[len(outcome) + 1 :].strip()
    head, sep, tail = rest.partition(" | ")
    if sep and task.strip().startswith(head.removesuffix("...").strip()):
        rest = tail.strip()
    return ": ".join(x for x in (outcome, rest) if x)


def render_entry(n: int, g: GatedHit) -> str:
    """One entry of the episodic context: every line starts with a label of ours, and every stored text
    in it is one neutralised line (``somnus.processors.briefing.injection.one_line``), so none can start a line."""
    u = g.hit.unit
    who = f"{one_line(u.speaker)}: " if u.speaker else ""
    lines = [f"[{n}] task: {who}{one_line(u.perception)} (relevance {g.relevance.score:.2f})"]
    result = result_text(one_line(u.outcome or ""), one_line(u.summary), one_line(u.perception))
    if result:
        lines.append(f"    result: {result}")
    if u.lessons:
        lines.append("    lessons: " + "; ".join(one_line(x) for x in u.lessons))
    if u.tools:
        lines.append("    tools: " + ", ".join(one_line(x) for x in u.tools))
    when = u.occurred_at.date().isoformat()
    lines.append(f"    when: {when}" + (f" ({', '.join(one_line(r) for r in g.hit.refs)})" if g.hit.refs else ""))
    return "\n".join(lines)


def within_budget(entries: Sequence[str], token_budget: int) -> list[str]:
    """Whole entries while they fit; if not even the first fits, the first cut to the budget."""
    out: list[str] = []
    used = 0
    for e in entries:
        cost = estimate_tokens(e) + (1 if out else 0)  # the newline between entries
        if used + cost > token_budget:
            break
        out.append(e)
        used += cost
    if not out and entries and token_budget > 0:
        out.append(entries[0][: token_budget * CHARS_PER_TOKEN])
    return out


@dataclass(frozen=True)
class EpisodicContext:
    text: str
    entries: list[GatedHit]
    accessed: list[MemoryAccessed]  # only the memories that made it into the text


def build_episodic_context(
    index: MemoryIndex,
    query: str,
    agent: str,
    *,
    now: datetime,
    top_k: int = 5,
    token_budget: int = 2000,
    min_relevance: float = MIN_RELEVANCE,
    success_only: bool = False,
    domain_hint: str | None = None,
    filters: Mapping[str, object] | None = None,
    agents: Mapping[str, object] | None = None,
    config: RecallConfig | None = None,
    user_id: str | None = None,
) -> EpisodicContext:
    """The token-budgeted text of relevant past work for a prompt: task, relevance, result, lessons, tools."""
    r = recall(
        index,
        query,
        agent,
        k=max(4 * top_k, 20),
        filters=filters,
        now=now,
        agents=agents,
        config=config,
        user_id=user_id,
    )
    gated = gate(
        r.hits,
        query,
        min_relevance=min_relevance,
        success_only=success_only,
        domain_hint=domain_hint,
        top_k=top_k,
        words=index.tokenize,
    )
    entries = within_budget([render_entry(n, g) for n, g in enumerate(gated, 1)], token_budget)
    kept = gated[: len(entries)]
    ids = {g.hit.memory_id for g in kept}
    accessed = [a for a in r.accessed if a.memory_id in ids]
    return EpisodicContext("\n".join(entries), kept, accessed)
