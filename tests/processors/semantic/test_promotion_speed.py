"""The promotion's fast paths give the events (and the memory) of the plain code they replace."""

from __future__ import annotations

from datetime import datetime, timezone

from hypothesis import given, settings
from hypothesis import strategies as st

from somnus.processors.semantic import promotion as pr
from somnus.processors.semantic.layers import MemoryLayers, snapshot
from somnus.schemas.semantic import CrossEdgeType, CrossLayerEdgeFormed, Layer, SemanticEvent

T = datetime(2024, 5, 1, tzinfo=timezone.utc)
DERIVED, INSTANCE = CrossEdgeType.DERIVED_FROM, CrossEdgeType.INSTANCE_OF


def _plain(memory: MemoryLayers, cid: str, episodes: list[str]) -> list[SemanticEvent]:
    """What ``_promote_one`` did before ``_structural_edges``: ``_edge`` twice per episode."""
    out: list[SemanticEvent] = []
    concept = (Layer.ATL, cid)
    for e in episodes:
        episode = (Layer.HIPPOCAMPUS, e)
        for src, kind, dst in ((concept, DERIVED, episode), (episode, INSTANCE, concept)):
            out += pr._edge(memory, src, kind, dst, pr.STRUCTURAL_EDGE_WEIGHT, T)
    return out


def _memory(existing: list[tuple[int, bool, float]]) -> MemoryLayers:
    """An owner's memory with some structural edges already there (episode, which way, weight)."""
    m = MemoryLayers("agent:a")
    for e, forward, weight in existing:
        a, b = (Layer.ATL, "c1"), (Layer.HIPPOCAMPUS, f"e{e}")
        src, kind, dst = (a, CrossEdgeType.DERIVED_FROM, b) if forward else (b, CrossEdgeType.INSTANCE_OF, a)
        m.apply(
            CrossLayerEdgeFormed(
                owner="agent:a",
                source_layer=src[0],
                source_id=src[1],
                edge_type=kind,
                target_layer=dst[0],
                target_id=dst[1],
                weight=weight,
                at=T,
            )
        )
    return m


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 12), st.booleans(), st.sampled_from([1.0, 0.5, 0.9999999, 0.0]))),
    st.lists(st.integers(0, 12), max_size=30),  # repeats: the second time the edges are there
)
def test_structural_edges_are_the_plain_edges(existing, episodes):
    names = [f"e{e}" for e in episodes]
    plain, fast = _memory(existing), _memory(existing)
    assert pr._structural_edges(fast, "c1", names, T) == _plain(plain, "c1", names)
    assert snapshot(fast) == snapshot(plain)
    # and again, every edge now there
    assert pr._structural_edges(fast, "c1", names, T) == _plain(plain, "c1", names) == []
