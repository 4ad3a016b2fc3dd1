"""Goals: forward PE, goal adjacency, the recall bias and ``wander`` (processors/episodic/goals.py)."""

from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from somnus.processors.episodic import goals as G
from somnus.processors.episodic.goals import (
    Goal,
    WanderNode,
    forward_pe,
    goal_adjacency,
    goal_bias,
    information_gain,
    wander,
)
from somnus.processors.episodic.index import IndexConfig, MemoryIndex
from somnus.processors.episodic.recall import recall
from somnus.schemas.memory import MemoryKind, MemoryUnit

T0 = datetime(2024, 5, 15, 9, 0, tzinfo=timezone.utc)
GOAL = Goal("g1", "a", "migrate the billing database to postgres")


def unit(mid: str, text: str, *, agent: str = "a", **kw: Any) -> MemoryUnit:
    kw.setdefault("scope", f"agent:{agent}")
    return MemoryUnit(
        memory_id=mid, kind=MemoryKind.EPISODE, agent=agent, run_id=mid, occurred_at=T0, perception=text, **kw
    )


def index_of(*units: MemoryUnit) -> MemoryIndex:
    ix = MemoryIndex(IndexConfig())
    for u in units:
        ix.add(u)
    return ix


UNRELATED = [
    unit("m1", "answer the refund ticket for order 1042"),
    unit("m2", "scrape the pricing table"),
    unit("m3", "summarise the weekly support report"),
]


def test_the_designs_weights_and_thresholds():
    assert (G.UNDER_EXPLORED, G.LOW_CONFIDENCE, G.GOAL_ADJACENT_GAIN, G.STALE, G.RANDOM) == (0.3, 0.2, 0.4, 0.2, 0.3)
    assert (G.UNDER_EXPLORED_BELOW, G.LOW_CONFIDENCE_BELOW, G.STALE_AFTER) == (3, 0.5, timedelta(days=14))
    assert (G.GOAL_ADJACENT, G.NEAREST_CANDIDATES, G.GOAL_BIAS, G.WANDER_STEPS) == (0.25, 50, 0.5, 10)


def test_forward_pe_is_one_with_nothing_like_the_goal_and_drops_when_a_matching_memory_arrives():
    ix = index_of(*UNRELATED)
    before = forward_pe(ix, GOAL, now=T0)
    assert before.forward_pe == 1.0 and before.nearest_id is None
    ix.add(unit("m4", "migrated the billing database to postgres without downtime"))
    after = forward_pe(ix, GOAL, now=T0)
    assert after.nearest_id == "m4"
    assert after.forward_pe < 0.5
    assert after.forward_pe == pytest.approx(1 - after.nearest_score, abs=1e-6)


def test_forward_pe_reads_only_the_goals_agent_and_user():
    other_agent = unit("x", "migrate the billing database to postgres", agent="b")
    other_user = unit("y", "migrate the billing database to postgres", user_id="u2")
    ix = index_of(*UNRELATED, other_agent, other_user)
    assert forward_pe(ix, GOAL, now=T0).forward_pe == 1.0
    assert forward_pe(ix, dataclasses.replace(GOAL, user_id="u2"), now=T0).nearest_id == "y"


def test_goal_adjacency_scores_the_goals_memories_and_leaves_others_out():
    ix = index_of(*UNRELATED, unit("m4", "billing database migration to postgres planned"))
    adj = goal_adjacency(ix, [GOAL], now=T0)
    assert adj["m4"] >= G.GOAL_ADJACENT
    assert all(adj.get(m, 0.0) < G.GOAL_ADJACENT for m in ("m1", "m2", "m3"))


def test_goal_bias_lifts_a_goal_adjacent_hit_and_does_nothing_without_pull():
    ix = index_of(unit("m1", "postgres connection pool settings"), unit("m2", "postgres billing database migration"))
    hits = recall(ix, "postgres", "a", now=T0).hits
    first = hits[0].memory_id
    other = hits[1].memory_id
    assert goal_bias(hits, {other: 1.0}, pull=0.0) == hits
    biased = goal_bias(hits, {other: 1.0}, pull=1.0)
    assert [h.memory_id for h in biased] == [other, first] and [h.rank for h in biased] == [1, 2]
    assert biased[0].score == pytest.approx(hits[1].score * 1.5)


def node(m: str, *, access: int = 5, confidence: float = 1.0, days: float = 0.0) -> WanderNode:
    return WanderNode(m, access_count=access, confidence=confidence, last_seen=T0 - timedelta(days=days))


@pytest.mark.parametrize(
    "kw, adjacency, gain, reasons",
    [
        ({}, 0.0, 0.0, ()),
        ({"access": 2}, 0.0, 0.3, ("under_explored",)),
        ({"access": 3}, 0.0, 0.0, ()),
        ({"confidence": 0.49}, 0.0, 0.2, ("low_confidence",)),
        ({"confidence": 0.5}, 0.0, 0.0, ()),
        ({}, 0.25, 0.4, ("goal_adjacent",)),
        ({}, 0.24, 0.0, ()),
        ({"days": 14.01}, 0.0, 0.2, ("stale",)),
        ({"days": 14}, 0.0, 0.0, ()),
    ],
)
def test_information_gain_signals(kw, adjacency, gain, reasons):
    assert information_gain(node("m", **kw), adjacency, T0) == (gain, reasons)


def chain(n: int) -> dict[str, dict[str, float]]:
    """A hub h joined to n branches b0..b{n-1}, each branch a path of three memories."""
    graph: dict[str, dict[str, float]] = {"h": {}}
    for i in range(n):
        path = ["h", f"b{i}.0", f"b{i}.1", f"b{i}.2"]
        for x, y in zip(path, path[1:]):
            graph.setdefault(x, {})[y] = 0.5
            graph.setdefault(y, {})[x] = 0.5
    return graph


def test_wander_reaches_a_planted_goal_adjacent_memory_whatever_the_seed():
    graph = chain(6)
    memories = {m: node(m) for m in graph}
    for seed in range(20):
        walk = wander(graph, memories, {"b4.2": 0.9, "b4.1": 0.3, "b4.0": 0.3}, T0, seed, steps=4, start="h")
        assert [s.memory_id for s in walk] == ["h", "b4.0", "b4.1", "b4.2"], seed
        assert walk[-1].reasons == ("goal_adjacent",) and walk[-1].hop == "edge" and walk[-1].via == "b4.1"


def test_a_random_walk_would_not_find_it():
    """Without the goal the same walks spread over the branches: the goal signal does the finding."""
    graph = chain(6)
    memories = {m: node(m) for m in graph}
    reached = sum(
        any(s.memory_id == "b4.2" for s in wander(graph, memories, {}, T0, seed, steps=4, start="h"))
        for seed in range(20)
    )
    assert reached < 10


def test_wander_is_reproducible_by_seed_and_varies_across_seeds():
    graph = chain(6)
    memories = {m: node(m) for m in graph}
    walks = [tuple(s.memory_id for s in wander(graph, memories, {}, T0, seed, start="h")) for seed in range(8)]
    assert walks == [tuple(s.memory_id for s in wander(graph, memories, {}, T0, seed, start="h")) for seed in range(8)]
    assert len(set(walks)) > 1


def test_wander_prefers_under_explored_and_stale_memories_and_jumps_when_stuck():
    graph = {"a": {"b": 1.0, "c": 1.0}, "b": {"a": 1.0}, "c": {"a": 1.0}}
    memories = {"a": node("a"), "b": node("b"), "c": node("c", access=0, days=30), "d": node("d", confidence=0.1)}
    walk = wander(graph, memories, {}, T0, seed=3, start="a")
    assert [(s.memory_id, s.hop) for s in walk][:2] == [("a", "start"), ("c", "edge")]
    assert walk[1].reasons == ("under_explored", "stale")
    assert walk[2].hop == "jump" and walk[2].memory_id == "d" and walk[2].via is None  # c's only neighbour is seen
    assert {s.memory_id for s in walk} == {"a", "b", "c", "d"} and len(walk) == 4  # each once, then it stops


def test_wander_visits_only_the_readers_memories_and_starts_at_the_best_one():
    graph = {"a": {"secret": 1.0}, "secret": {"a": 1.0}}
    memories = {"a": node("a"), "z": node("z", access=0)}
    walk = wander(graph, memories, {}, T0, seed=0)
    assert walk[0].memory_id == "z" and walk[0].hop == "start"
    assert "secret" not in {s.memory_id for s in walk}
    assert all(0.0 <= s.serendipity <= G.RANDOM for s in walk)


def test_closer_takes_only_a_closer_readable_memory_and_agrees_with_a_full_measure():
    from somnus.processors.episodic.goals import ForwardPE, closer

    ix = index_of(*UNRELATED)
    start = forward_pe(ix, GOAL, now=T0)
    match = unit("m4", "migrated the billing database to postgres")
    others = [
        unit("x", "migrate the billing database to postgres", agent="b"),
        unit("y", "migrate the billing database to postgres", user_id="u2"),
    ]
    assert closer(ix, GOAL, start, others) == start  # another agent's, another user's: never nearer
    for u in (match, *others):
        ix.add(u)
    got = closer(ix, GOAL, start, [match, *others])
    assert got == forward_pe(ix, GOAL, now=T0) and got.nearest_id == "m4"
    weaker = unit("m5", "billing notes")
    assert closer(ix, GOAL, got, [weaker]) == got  # only ever replaced by a closer one
    assert closer(ix, GOAL, ForwardPE("g1", 1.0, None, 0.0), [weaker]).nearest_id == "m5"
