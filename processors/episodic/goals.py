"""Goals, forward prediction error and ``wander``: the cortex-engine ``goal_set`` and ``wander``
tools, without a model. Pure: no I/O, no clock (``now`` is an argument), no hidden randomness (the
walk's serendipity comes from a ``random.Random(seed)``).

**Belief score.** How well one memory already says what a goal asks: the cosine of their token sets
(``recall.task_similarity``, Ochiai) over the memory's ``unit_text``, tokenised as the index does.
The candidates are the goal text's best recall hits (``recall.recall``, ``NEAREST_CANDIDATES``), so
no memory outside the agent's scope chain, or of another user, ever counts.

**Forward PE** of a goal = ``1 - nearest belief score``: 1.0 while nothing the agent remembers
resembles it, falling as memories that match it arrive. High forward PE means "this goal is far
from achieved"; it sets how hard the goal pulls recall (``goal_bias``).

**Goal adjacency** of a memory = its best belief score over the agent's open goals; a memory at or
above ``GOAL_ADJACENT`` (0.25) is goal-adjacent.

**Wander** walks the associative graph by information gain (the seed's table), one step per hop:

=================================================  ======
signal                                             weight
=================================================  ======
under-explored (access count < 3)                  +0.3
low confidence (< 0.5)                             +0.2
goal-adjacent (adjacency >= 0.25)                  +0.4
stale (> 14 days since last access, or capture)    +0.2
random (``rng.random()`` x)                        +0.3
=================================================  ======

From the start (given, else the best memory overall) it moves to the unvisited neighbour of the
highest gain; with none left it jumps to the best unvisited memory. Candidates are drawn in
memory-id order, so the same inputs and seed give the same walk.

>>> from datetime import datetime, timezone
>>> now = datetime(2024, 6, 1, tzinfo=timezone.utc)
>>> nodes = {m: WanderNode(m, access_count=5, confidence=1.0, last_seen=now) for m in "abc"}
>>> graph = {"a": {"b": 0.9, "c": 0.2}, "b": {"a": 0.9}, "c": {"a": 0.2}}
>>> [s.memory_id for s in wander(graph, nodes, {"c": 0.8}, now, seed=1, start="a")]
['a', 'c', 'b']
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from somnus.processors.episodic.index import MemoryIndex, unit_text
from somnus.processors.episodic.recall import Hit, Recall, RecallConfig, allowed_scopes, recall, task_similarity
from somnus.schemas.memory import MEMORY_SCHEMA_VERSION, MemoryAccessed, MemoryUnit

NEAREST_CANDIDATES = 50  # recall hits of a goal's text compared with it
GOAL_ADJACENT = 0.25  # belief score from which a memory is goal-adjacent

UNDER_EXPLORED = 0.3
UNDER_EXPLORED_BELOW = 3  # accesses
LOW_CONFIDENCE = 0.2
LOW_CONFIDENCE_BELOW = 0.5
GOAL_ADJACENT_GAIN = 0.4
STALE = 0.2
STALE_AFTER = timedelta(days=14)
RANDOM = 0.3
WANDER_STEPS = 10

GOAL_BIAS = 0.5  # recall: a hit's score x (1 + GOAL_BIAS x forward PE x adjacency)


@dataclass(frozen=True)
class Goal:
    goal_id: str
    agent: str
    text: str
    user_id: str | None = None


@dataclass(frozen=True)
class ForwardPE:
    goal_id: str
    forward_pe: float  # 1 - nearest belief score
    nearest_id: str | None  # the memory closest to the goal (None: none resembles it)
    nearest_score: float


def measured(goal_id: str, nearest_id: str | None, score: float) -> ForwardPE:
    """A goal's forward PE from its nearest belief score, rounded once (to 6 places): the score is
    ``1 - forward PE`` exactly, so a fold restarted from the stored forward PE compares the same.

    >>> measured("g", "m", 0.3333333333)
    ForwardPE(goal_id='g', forward_pe=0.666667, nearest_id='m', nearest_score=0.333333)
    """
    pe = round(1.0 - score, 6)
    return ForwardPE(goal_id, pe, nearest_id if score > 0 else None, round(1.0 - pe, 6))


def belief_score(goal_tokens: set[str], memory_tokens: set[str]) -> float:
    """How well a memory's words cover a goal's (``task_similarity``).

    >>> belief_score({"refund", "order"}, {"refund", "order"}), belief_score({"refund"}, {"pizza"})
    (1.0, 0.0)
    """
    return task_similarity(goal_tokens, memory_tokens)


def _beliefs(
    index: MemoryIndex, goal: Goal, now: datetime, agents: Mapping[str, object] | None, candidates: int
) -> list[tuple[str, float]]:
    """(memory id, belief score) of the goal text's recall hits, best recall first."""
    hits = recall(index, goal.text, goal.agent, k=candidates, now=now, agents=agents, user_id=goal.user_id).hits
    goal_tokens = set(index.tokenize(goal.text))
    return [(h.memory_id, belief_score(goal_tokens, set(index.tokenize(unit_text(h.unit))))) for h in hits]


def forward_pe(
    index: MemoryIndex,
    goal: Goal,
    *,
    now: datetime,
    agents: Mapping[str, object] | None = None,
    candidates: int = NEAREST_CANDIDATES,
) -> ForwardPE:
    """``1 - nearest belief score`` of ``goal`` over the memories its agent (and user) may read."""
    best_id, best = None, 0.0
    for memory_id, score in _beliefs(index, goal, now, agents, candidates):
        if score > best:
            best_id, best = memory_id, score
    return measured(goal.goal_id, best_id, best)


def closer(
    index: MemoryIndex,
    goal: Goal,
    current: ForwardPE,
    stored: Sequence[MemoryUnit],
    agents: Mapping[str, object] | None = None,
) -> ForwardPE:
    """``current`` after new memories were stored: the best of them the goal's agent (and user) may read
    becomes the nearest belief if it scores higher. Exact and cheap (no recall), so the fold can run
    it for every open goal after every record; the nearest memory is only ever replaced by a closer one.

    >>> from datetime import datetime, timezone
    >>> from somnus.schemas.memory import MemoryKind
    >>> u = MemoryUnit(memory_id="m", kind=MemoryKind.EPISODE, agent="a", scope="agent:a", run_id="r",
    ...                occurred_at=datetime(2024, 5, 1, tzinfo=timezone.utc), perception="refund the order")
    >>> closer(MemoryIndex(), Goal("g", "a", "refund order"), ForwardPE("g", 1.0, None, 0.0), [u]).nearest_id
    'm'
    """
    scopes = set(allowed_scopes(goal.agent, agents))
    goal_tokens = set(index.tokenize(goal.text))
    best = current
    for u in stored:
        if u.scope in scopes and u.user_id in (None, goal.user_id):
            got = measured(goal.goal_id, u.memory_id, belief_score(goal_tokens, set(index.tokenize(unit_text(u)))))
            if got.nearest_score > best.nearest_score:
                best = got
    return best


def goal_adjacency(
    index: MemoryIndex,
    goals: Sequence[Goal],
    *,
    now: datetime,
    agents: Mapping[str, object] | None = None,
    candidates: int = NEAREST_CANDIDATES,
) -> dict[str, float]:
    """Memory id -> its best belief score over ``goals`` (memories no goal recalls are absent: 0)."""
    out: dict[str, float] = {}
    for goal in goals:
        for memory_id, score in _beliefs(index, goal, now, agents, candidates):
            if score > out.get(memory_id, 0.0):
                out[memory_id] = round(score, 6)
    return out


def goal_bias(hits: Sequence[Hit], adjacency: Mapping[str, float], pull: float, weight: float = GOAL_BIAS) -> list[Hit]:
    """Recall's hits re-ranked towards goal-adjacent memories: each score x ``1 + weight x pull x
    adjacency`` (``pull``: the open goals' highest forward PE), ranks renumbered; ties keep recall's
    order. A separate step after ``recall``: with no open goal (``pull`` 0) nothing moves.

    >>> goal_bias([], {}, 1.0)
    []
    """
    if pull <= 0 or not adjacency:
        return list(hits)
    scored = [(h.score * (1.0 + weight * pull * adjacency.get(h.memory_id, 0.0)), n, h) for n, h in enumerate(hits)]
    scored.sort(key=lambda x: (-x[0], x[1]))
    return [dataclasses.replace(h, rank=r, score=s) for r, (s, _, h) in enumerate(scored, 1)]


def goal_recall(
    index: MemoryIndex,
    query: str,
    agent: str,
    k: int,
    goals: Sequence[Goal],
    pull: float,
    *,
    now: datetime,
    agents: Mapping[str, object] | None = None,
    filters: Mapping[str, object] | None = None,
    user_id: str | None = None,
    config: RecallConfig | None = None,
) -> Recall:
    """``recall``, then ``goal_bias`` towards ``goals`` (the agent's open goals, ``pull`` their highest
    forward PE). Recall is asked for twice ``k`` so a goal-adjacent memory just below the top ``k`` can
    rise into it; the accesses are those of the hits returned. No goal, or no pull: ``recall`` itself."""
    if not goals or pull <= 0:
        return recall(index, query, agent, k, filters, now=now, agents=agents, user_id=user_id, config=config)
    got = recall(index, query, agent, min(2 * k, 1000), filters, now=now, agents=agents, user_id=user_id, config=config)
    adjacency = goal_adjacency(index, goals, now=now, agents=agents)
    hits = goal_bias(got.hits, adjacency, pull)[:k]
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
    return dataclasses.replace(got, hits=hits, accessed=accessed)


# ---- wander ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class WanderNode:
    memory_id: str
    access_count: int
    confidence: float  # how confirmed the memory is (the projection: merged / (merged + 1))
    last_seen: datetime  # last access, else capture time


@dataclass(frozen=True)
class WanderStep:
    memory_id: str
    hop: str  # "start", "edge" (along an association) or "jump" (no unvisited neighbour left)
    via: str | None  # the memory it came from
    gain: float  # information gain, the random part included
    reasons: tuple[str, ...]  # the signals that fired: under_explored, low_confidence, goal_adjacent, stale
    serendipity: float  # the random part of the gain


def information_gain(node: WanderNode, adjacency: float, now: datetime) -> tuple[float, tuple[str, ...]]:
    """The deterministic part of a memory's gain, and the signals that fired.

    >>> from datetime import datetime, timezone
    >>> t = datetime(2024, 6, 1, tzinfo=timezone.utc)
    >>> information_gain(WanderNode("m", 0, 0.0, datetime(2024, 1, 1, tzinfo=timezone.utc)), 0.9, t)
    (1.1, ('under_explored', 'low_confidence', 'goal_adjacent', 'stale'))
    """
    fired: list[tuple[str, float]] = []
    if node.access_count < UNDER_EXPLORED_BELOW:
        fired.append(("under_explored", UNDER_EXPLORED))
    if node.confidence < LOW_CONFIDENCE_BELOW:
        fired.append(("low_confidence", LOW_CONFIDENCE))
    if adjacency >= GOAL_ADJACENT:
        fired.append(("goal_adjacent", GOAL_ADJACENT_GAIN))
    if now - node.last_seen > STALE_AFTER:
        fired.append(("stale", STALE))
    return round(sum(w for _, w in fired), 6), tuple(n for n, _ in fired)


def _best(
    candidates: Sequence[str],
    memories: Mapping[str, WanderNode],
    adjacency: Mapping[str, float],
    now: datetime,
    rng: random.Random,
) -> tuple[str, float, tuple[str, ...], float] | None:
    best: tuple[str, float, tuple[str, ...], float] | None = None
    for m in sorted(candidates):
        base, reasons = information_gain(memories[m], adjacency.get(m, 0.0), now)
        luck = round(RANDOM * rng.random(), 6)
        if best is None or base + luck > best[1]:
            best = (m, round(base + luck, 6), reasons, luck)
    return best


def wander(
    graph: Mapping[str, Mapping[str, float]],
    memories: Mapping[str, WanderNode],
    adjacency: Mapping[str, float],
    now: datetime,
    seed: int,
    *,
    steps: int = WANDER_STEPS,
    start: str | None = None,
) -> list[WanderStep]:
    """A walk of at most ``steps`` memories over ``graph`` (memory id -> neighbour -> weight), choosing
    each next memory by information gain (the module's table); only memories of ``memories`` are
    visited (the reader's). ``adjacency``: memory id -> goal adjacency (``goal_adjacency``)."""
    rng = random.Random(seed)
    visited: set[str] = set()
    out: list[WanderStep] = []
    current: str | None = None
    while len(out) < steps:
        if current is None and start is not None and start in memories:
            base, reasons = information_gain(memories[start], adjacency.get(start, 0.0), now)
            pick, hop = (start, base, reasons, 0.0), "start"
        else:
            near = [m for m in graph.get(current, {}) if m in memories and m not in visited] if current else []
            hop = "edge" if near else ("jump" if current is not None else "start")
            found = _best(near or [m for m in memories if m not in visited], memories, adjacency, now, rng)
            if found is None:
                break
            pick = found
        memory_id, gain, reasons, luck = pick
        out.append(WanderStep(memory_id, hop, current if hop == "edge" else None, gain, reasons, luck))
        visited.add(memory_id)
        current = memory_id
    return out
