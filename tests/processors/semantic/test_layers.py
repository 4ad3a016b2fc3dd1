"""somnus.processors.semantic.layers: the MemoryLayer protocol, the three layers, the cross-layer graph, spreading
activation, consolidation, and the fold (a replay of the semantic log rebuilds the same memory).
Also the round trip of every semantic event type (schemas/semantic.py)."""

from __future__ import annotations

import doctest
import uuid
from datetime import datetime, timedelta, timezone

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import somnus.schemas.semantic
from somnus.processors.semantic import layers
from somnus.processors.semantic.layers import (
    ACTIVATION_DECAY,
    ACTIVATION_MAX_DEPTH,
    ACTIVATION_THRESHOLD,
    AG_MAX_AGE_DAYS,
    ATL_MAX_AGE_DAYS,
    ATL_PROTECTED_COUNT,
    AngularGyrusLayer,
    AssociativeGraph,
    ConceptLayer,
    EpisodicLayer,
    MemoryLayer,
    MemoryLayers,
    fold_events,
    snapshot,
    spread,
)
from somnus.schemas.episodes import CallSeen, EpisodeDistilled, ErrorSeen
from somnus.schemas.events import Outcome
from somnus.schemas.semantic import (
    CandidateRejected,
    ConceptCreated,
    ConceptPromoted,
    ConceptReinforced,
    CrossEdgeType,
    CrossLayerEdgeFormed,
    Layer,
    MathCategory,
    MathRecord,
    PatternConfirmed,
    Provenance,
    RecordRemoved,
    RelationOrigin,
    RelationshipFormed,
    RelationshipTypeRegistered,
    decode_semantic,
    encode_semantic,
)

T0 = datetime(2024, 5, 1, tzinfo=timezone.utc)
OWNER = "agent:robot"


def created(
    cid: str,
    name: str,
    at: datetime = T0,
    category: str = "object",
    count: int = 1,
    provenance: Provenance = Provenance.EPISODIC_CONSOLIDATION,
    **props: object,
) -> ConceptCreated:
    return ConceptCreated(
        owner=OWNER,
        concept_id=cid,
        name=name,
        definition=f"about {name}",
        category=category,
        provenance=provenance,
        at=at,
        properties=dict(props),
        reinforcement_count=count,
    )


def related(s: str, rel: str, t: str, w: float = 1.0) -> RelationshipFormed:
    return RelationshipFormed(owner=OWNER, source_id=s, relation=rel, target_id=t, at=T0, weight=w)


def record(
    mid: str, subjects: list[str], conf: float = 0.8, category: MathCategory = MathCategory.PATTERN
) -> MathRecord:
    return MathRecord(
        math_id=mid,
        name=f"stat:{mid}",
        category=category,
        domain="tool_reliability",
        subjects=subjects,
        verbal=f"pattern {mid}",
        query="SELECT 1",
        confidence=conf,
        n_observations=10,
    )


def edge(src: tuple[Layer, str], kind: CrossEdgeType, dst: tuple[Layer, str], w: float = 1.0) -> CrossLayerEdgeFormed:
    return CrossLayerEdgeFormed(
        owner=OWNER,
        source_layer=src[0],
        source_id=src[1],
        edge_type=kind,
        target_layer=dst[0],
        target_id=dst[1],
        weight=w,
        at=T0,
    )


def episode(i: int, tools: list[str], failed: list[str], hours: float = 0.0) -> EpisodeDistilled:
    calls = [CallSeen(tool=t, ok=t not in failed, error="Error: boom" if t in failed else None) for t in tools]
    return EpisodeDistilled(
        episode_id=uuid.UUID(int=i),
        schema_version=1,
        agent="robot",
        session_id=f"s{i}",
        task="t",
        goal=None,
        user_id=None,
        summary="",
        outcome=Outcome.FAILURE if failed else Outcome.SUCCESS,
        started_at=T0 + timedelta(hours=hours),
        ended_at=T0 + timedelta(hours=hours, minutes=5),
        duration_s=300.0,
        event_count=3,
        tool_calls=len(tools),
        tools=tools,
        errors=[ErrorSeen(tool=t, error="Error: boom") for t in failed],
        lessons=[],
        delegations=[],
        first_event_id=uuid.UUID(int=1000 + i),
        last_event_id=uuid.UUID(int=2000 + i),
        calls=calls,
    )


# ---- the protocol and the numbers ---------------------------------------------------------------


def test_activation_numbers_are_pinned():
    assert (ACTIVATION_DECAY, ACTIVATION_MAX_DEPTH, ACTIVATION_THRESHOLD) == (0.5, 3, 0.01)
    assert (ATL_MAX_AGE_DAYS, ATL_PROTECTED_COUNT, AG_MAX_AGE_DAYS) == (30, 3, 30)


@pytest.mark.parametrize("layer", [EpisodicLayer(), ConceptLayer(), AngularGyrusLayer()])
def test_every_layer_implements_the_protocol(layer):
    assert isinstance(layer, MemoryLayer)
    assert layer.layer_name in {x.value for x in Layer}
    assert len(layer) == 0 and list(layer) == [] and layer.stats()["records"] == 0


def test_layer_names_are_the_designs():
    m = MemoryLayers(OWNER)
    assert [m.layer(x).layer_name for x in Layer] == ["hippocampus", "atl", "angular_gyrus"]


# ---- spreading activation -----------------------------------------------------------------------


def test_spread_reproduces_the_designs_example():
    g = AssociativeGraph()
    g.link("made_coffee", "found_cup", 0.81)
    g.link("found_cup", "cleaned_table", 0.75)
    got = dict(spread(g.neighbours, ["made_coffee"]))
    assert got["found_cup"] == pytest.approx(1.0 * 0.5 * 0.81)
    assert got["cleaned_table"] == pytest.approx(1.0 * 0.5 * 0.81 * 0.5 * 0.75)
    assert "made_coffee" not in got  # seeds are not returned


def test_spread_stops_at_max_depth_and_threshold():
    g = AssociativeGraph()
    for a, b in zip("abcde", "bcdef"):
        g.link(a, b, 1.0)
    got = dict(spread(g.neighbours, ["a"]))
    assert set(got) == {"b", "c", "d"}  # 3 hops
    assert got["d"] == pytest.approx(0.125)
    assert set(dict(spread(g.neighbours, ["a"], threshold=0.2))) == {"b", "c"}  # 0.125 < 0.2


def _brute_force(
    edges: dict[tuple[int, int], float], seed: int, depth: int, decay: float, threshold: float
) -> dict[int, float]:
    """Best path product over every simple-or-not walk of <= depth hops whose every prefix stays >= threshold."""
    adj: dict[int, list[tuple[int, float]]] = {}
    for (a, b), w in edges.items():
        adj.setdefault(a, []).append((b, w))
        adj.setdefault(b, []).append((a, w))
    best: dict[int, float] = {}
    frontier = [(seed, 1.0)]
    for _ in range(depth):
        nxt = []
        for node, act in frontier:
            for nb, w in adj.get(node, []):
                v = act * decay * w
                if v >= threshold:
                    nxt.append((nb, v))
                    if nb != seed:
                        best[nb] = max(best.get(nb, 0.0), v)
        frontier = nxt
    return best


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(
        st.tuples(st.integers(0, 6), st.integers(0, 6)).filter(lambda p: p[0] < p[1]), st.floats(0.05, 1.0), max_size=14
    )
)
def test_spread_is_the_exact_best_path_within_the_hop_limit(edges):
    g = AssociativeGraph()
    for (a, b), w in edges.items():
        g.link(str(a), str(b), w)
    got = {int(k): v for k, v in spread(g.neighbours, ["0"])}
    want = _brute_force(edges, 0, ACTIVATION_MAX_DEPTH, ACTIVATION_DECAY, ACTIVATION_THRESHOLD)
    assert got.keys() == want.keys()
    for k in want:
        assert got[k] == pytest.approx(want[k])


# ---- hippocampus --------------------------------------------------------------------------------


def test_episodic_layer_indexes_tools_failures_and_outcomes():
    m = MemoryLayers(OWNER)
    m.apply_all([episode(1, ["a", "b"], ["b"], 0), episode(2, ["a"], [], 1), episode(3, ["b"], ["b"], 2)])
    h = m.hippocampus
    assert [r.episode_id for r in h.recall(tool="a")] == [str(uuid.UUID(int=2)), str(uuid.UUID(int=1))]  # newest first
    assert [r.episode_id for r in h.recall(failed_tool="b")] == [str(uuid.UUID(int=3)), str(uuid.UUID(int=1))]
    assert [r.episode_id for r in h.recall(tool="a", outcome="success")] == [str(uuid.UUID(int=2))]
    assert len(h.recall(limit=1)) == 1
    assert h.consolidate(T0) == []  # episodic sleep belongs to the hippocampus processor


def test_removing_an_episode_removes_its_cross_layer_edges():
    m = MemoryLayers(OWNER)
    e1 = str(uuid.UUID(int=1))
    m.apply_all(
        [
            episode(1, ["a"], ["a"]),
            created("c1", "a_unreliable"),
            edge((Layer.ATL, "c1"), CrossEdgeType.DERIVED_FROM, (Layer.HIPPOCAMPUS, e1)),
            edge((Layer.HIPPOCAMPUS, e1), CrossEdgeType.INSTANCE_OF, (Layer.ATL, "c1")),
        ]
    )
    assert len(m.cross) == 2
    assert m.apply(RecordRemoved(owner=OWNER, layer=Layer.HIPPOCAMPUS, record_id=e1, reason="pruned", at=T0))
    assert len(m.cross) == 0 and m.cross.edges((Layer.ATL, "c1")) == []


# ---- ATL ----------------------------------------------------------------------------------------


def test_concept_context_indexes():
    m = MemoryLayers(OWNER)
    m.apply_all(
        [
            created("c1", "coffee_mug", color="blue", size=3),
            created("c2", "tea_cup", color="white"),
            created("c3", "kitchen", category="place"),
        ]
    )
    atl = m.atl
    assert atl.by_category("object") == ["c1", "c2"]
    assert atl.by_property("color") == ["c1", "c2"]
    assert atl.by_property("color", "blue") == ["c1"]
    assert atl.by_property("size", 3) == ["c1"] and atl.by_property("size", "3") == []  # typed values
    assert [c.concept_id for c in atl.recall(category="object", properties={"color": "white"})] == ["c2"]
    assert atl.find("Coffee Mug") == "c1" and atl.find("coffee-mug") == "c1" and atl.find("mug") is None


def test_recall_orders_by_confidence_then_name():
    m = MemoryLayers(OWNER)
    m.apply_all(
        [created("c1", "b_thing", count=1), created("c2", "a_thing", count=1), created("c3", "z_thing", count=9)]
    )
    assert [c.name for c in m.atl.recall()] == ["z_thing", "a_thing", "b_thing"]
    assert [c.name for c in m.atl.recall(min_confidence=0.7)] == ["z_thing"]  # 0.5 + 0.1*3 = 0.8


def test_recall_similar_scores_by_token_jaccard():
    m = MemoryLayers(OWNER)
    m.apply(
        ConceptCreated(
            owner=OWNER,
            concept_id="c1",
            name="book_reservation_unreliable",
            definition="payment fails",
            category="causal_pattern",
            provenance=Provenance.EPISODIC_CONSOLIDATION,
            at=T0,
        )
    )
    hits = m.atl.recall_similar("book reservation payment")
    # tokens of the concept: book reservation unreliable payment fails (5); query: 3, all shared
    assert hits == [("c1", pytest.approx(3 / 5))]
    assert m.atl.recall_similar("weather forecast") == []


def test_symmetric_relations_hold_both_ways_and_others_one_way():
    m = MemoryLayers(OWNER)
    m.apply_all(
        [
            created("a", "navigate_failures"),
            created("b", "goal_latency"),
            created("c", "container"),
            related("a", "TRENDS_WITH", "b", 0.7),
            related("a", "IS_A", "c"),
            related("a", "CORRELATES_WITH", "c", 0.6),
        ]
    )
    atl = m.atl
    assert atl.relationship("b", "TRENDS_WITH", "a") is not None
    assert atl.relationship("c", "CORRELATES_WITH", "a") is not None
    assert atl.relationship("c", "IS_A", "a") is None
    assert [(r.relation, r.target_id) for r in atl.relationships("a")] == [
        ("CORRELATES_WITH", "c"),
        ("IS_A", "c"),
        ("TRENDS_WITH", "b"),
    ]
    assert atl.graph.weight("a", "c") == 1.0  # the strongest relation between two concepts
    assert atl.graph.weight("a", "b") == 0.7


def test_an_agent_proposed_relation_is_registered_by_its_event_and_survives_replay():
    evs = [
        created("a", "coffee_mug"),
        created("b", "kitchen_area"),
        RelationshipTypeRegistered(
            owner=OWNER, name="PROPERTY_OF", symmetric=False, origin=RelationOrigin.AGENT_PROPOSED, at=T0
        ),
        related("a", "PROPERTY_OF", "b"),
    ]
    m = fold_events(evs)[OWNER]
    t = m.registry.get("property of")
    assert t is not None and t.origin is RelationOrigin.AGENT_PROPOSED and not t.symmetric
    assert m.atl.relationship("a", "PROPERTY_OF", "b") is not None


def test_removing_a_concept_cleans_relationships_and_cross_edges():
    m = MemoryLayers(OWNER)
    m.apply_all(
        [
            created("a", "a_concept"),
            created("b", "b_concept"),
            related("a", "TRENDS_WITH", "b"),
            related("b", "IS_A", "a"),
            PatternConfirmed(owner=OWNER, record=record("m1", ["x"]), at=T0),
            edge((Layer.ANGULAR_GYRUS, "m1"), CrossEdgeType.QUANTIFIES, (Layer.ATL, "a"), 0.8),
            edge((Layer.ANGULAR_GYRUS, "m1"), CrossEdgeType.QUANTIFIES, (Layer.ATL, "b"), 0.8),
        ]
    )
    deleted: list[str] = []
    m.atl.register_deletion_callback(deleted.append)
    assert m.atl.remove("a") and not m.atl.remove("a")
    assert deleted == ["a"]
    assert m.atl.relationships("b") == [] and m.atl.graph.neighbours("b") == []
    assert [e.target[1] for e in m.cross.edges()] == ["b"]
    assert m.atl.find("a_concept") is None


def test_capture_callbacks_fire_on_store():
    m = MemoryLayers(OWNER)
    seen: list[str] = []
    m.atl.register_capture_callback(lambda rid, rec: seen.append(rid))
    m.ag.register_capture_callback(lambda rid, rec: seen.append(rid))
    m.apply_all([created("c1", "x_concept"), PatternConfirmed(owner=OWNER, record=record("m1", ["x"]), at=T0)])
    assert seen == ["c1", "m1"]


def test_reinforcement_counts_new_evidence_so_a_duplicate_changes_nothing():
    m = MemoryLayers(OWNER)
    m.apply(created("c1", "x_concept"))
    ev = ConceptReinforced(
        owner=OWNER, concept_id="c1", by=2, provenance=Provenance.HYBRID, at=T0, source_episode_ids=["e1", "e2"]
    )
    assert m.apply(ev) and m.atl.get("c1").reinforcement_count == 3
    assert not m.apply(ev) and m.atl.get("c1").reinforcement_count == 3
    partly = ConceptReinforced(
        owner=OWNER, concept_id="c1", by=2, provenance=Provenance.HYBRID, at=T0, source_episode_ids=["e2", "e3"]
    )
    assert m.apply(partly) and m.atl.get("c1").reinforcement_count == 4  # only e3 is new
    bare = ConceptReinforced(owner=OWNER, concept_id="c1", by=5, provenance=Provenance.HYBRID, at=T0)
    assert m.apply(bare) and m.atl.get("c1").reinforcement_count == 9  # no evidence named: ``by`` counts
    assert not m.apply(created("c1", "x_concept"))  # a duplicate creation does not reset the concept
    assert m.atl.get("c1").reinforcement_count == 9
    rec = PatternConfirmed(owner=OWNER, record=record("m1", ["x"]), at=T0)
    assert m.apply(rec) and not m.apply(rec) and m.ag.entry("m1").revision == 1


def test_reinforcement_of_a_missing_concept_is_ignored_not_fatal():
    m = MemoryLayers(OWNER)
    ok = m.apply(ConceptReinforced(owner=OWNER, concept_id="gone", by=1, provenance=Provenance.HYBRID, at=T0))
    assert not ok and m.ignored == 1


def test_atl_consolidation_prunes_only_stale_unconfirmed_unrelated_uningested_concepts():
    old, now = T0, T0 + timedelta(days=ATL_MAX_AGE_DAYS, seconds=1)
    m = MemoryLayers(OWNER)
    m.apply_all(
        [
            created("stale", "stale_guess", at=old),
            created("strong", "strong_fact", at=old, count=ATL_PROTECTED_COUNT),
            created("doc", "doc_fact", at=old, provenance=Provenance.DIRECT_INGESTION),
            created("fresh", "fresh_guess", at=now - timedelta(days=1)),
            created("p", "parent_guess", at=old),
            created("k", "kid_guess", at=old, count=5),
            related("k", "IS_A", "p"),
        ]
    )
    evs = m.consolidate(now)
    assert [(e.layer, e.record_id) for e in evs] == [(Layer.ATL, "stale")]
    assert m.consolidate(T0 + timedelta(days=ATL_MAX_AGE_DAYS)) == []  # exactly 30 days: kept
    m.apply_all(evs)
    assert "stale" not in m.atl and len(m.atl) == 5


def test_ag_records_link_by_subject_and_consolidate_after_30_days():
    m = MemoryLayers(OWNER)
    m.apply_all(
        [
            PatternConfirmed(owner=OWNER, record=record("m1", ["nav"], 0.9), at=T0),
            PatternConfirmed(owner=OWNER, record=record("m2", ["nav", "grasp"], 0.6, MathCategory.CORRELATION), at=T0),
            PatternConfirmed(owner=OWNER, record=record("m3", ["grasp"], 0.7), at=T0 + timedelta(days=20)),
        ]
    )
    assert m.ag.graph.weight("m1", "m2") == 0.6 and m.ag.graph.weight("m2", "m3") == 0.6
    assert m.ag.graph.weight("m1", "m3") is None
    assert [r.math_id for r in m.ag.recall(subject="nav")] == ["m1", "m2"]
    evs = m.consolidate(T0 + timedelta(days=AG_MAX_AGE_DAYS, seconds=1))
    assert [e.record_id for e in evs] == ["m1", "m2"]
    # a re-confirmation keeps the record and bumps its revision
    m.apply(PatternConfirmed(owner=OWNER, record=record("m1", ["nav"], 0.95), at=T0 + timedelta(days=29)))
    assert m.ag.entry("m1").revision == 2 and m.ag.get("m1").confidence == 0.95
    assert [e.record_id for e in m.consolidate(T0 + timedelta(days=AG_MAX_AGE_DAYS, seconds=1))] == ["m2"]


# ---- the fold: replay ---------------------------------------------------------------------------


def test_fold_events_rebuilds_the_same_memory_and_keeps_owners_apart():
    evs = [
        created("a", "a_concept"),
        created("b", "b_concept"),
        related("a", "IS_A", "b"),
        ConceptReinforced(
            owner=OWNER,
            concept_id="a",
            by=2,
            provenance=Provenance.HYBRID,
            at=T0,
            source_episode_ids=["e1", "e2"],
            properties={"k": 1},
        ),
        PatternConfirmed(owner=OWNER, record=record("m1", ["x"]), at=T0),
        edge((Layer.ANGULAR_GYRUS, "m1"), CrossEdgeType.STATISTICALLY_CONFIRMS, (Layer.ATL, "a"), 0.8),
        ConceptPromoted(
            owner=OWNER,
            concept_id="a",
            pattern_name="p",
            origin="nac",
            candidate_confidence=0.7,
            created=True,
            gate="ok",
            at=T0,
        ),
        CandidateRejected(
            owner=OWNER, pattern_name="q", origin="nac", candidate_confidence=0.7, reason="random", at=T0
        ),
        ConceptCreated(
            owner="agent:other",
            concept_id="z",
            name="z_concept",
            definition="",
            category="object",
            provenance=Provenance.DIRECT_INGESTION,
            at=T0,
        ),
    ]
    live = MemoryLayers(OWNER)
    for ev in evs[:-1]:
        live.apply(ev)
    rebuilt = fold_events([decode_semantic(encode_semantic(e)) for e in evs])
    assert sorted(rebuilt) == ["agent:other", OWNER]
    assert snapshot(rebuilt[OWNER]) == snapshot(live)
    assert live.atl.get("a").reinforcement_count == 3 and live.atl.get("a").provenance is Provenance.HYBRID
    assert live.stats()["promotions"] == 1 and live.stats()["rejections"] == 1


# ---- schema round trips -------------------------------------------------------------------------

names = st.text(st.characters(min_codepoint=33, max_codepoint=0x2FF), min_size=1, max_size=12)
times = st.datetimes(min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1), timezones=st.just(timezone.utc))
units = st.floats(0.0, 1.0, allow_nan=False)
props = st.dictionaries(names, st.one_of(st.integers(-10, 10), names, st.booleans()), max_size=3)
math_records = st.builds(
    MathRecord,
    math_id=names,
    name=names,
    category=st.sampled_from(MathCategory),
    domain=names,
    subjects=st.lists(names, max_size=2),
    verbal=st.text(max_size=20),
    query=st.text(max_size=20),
    confidence=units,
    n_observations=st.integers(0, 100),
    statistics=st.dictionaries(names, st.floats(-5, 5, allow_nan=False), max_size=3),
    source_episode_ids=st.lists(names, max_size=3),
)
events = st.one_of(
    st.builds(
        ConceptCreated,
        owner=names,
        concept_id=names,
        name=names,
        definition=st.text(max_size=20),
        category=names,
        provenance=st.sampled_from(Provenance),
        at=times,
        properties=props,
        source_episode_ids=st.lists(names, max_size=3),
        evidence=st.lists(names, max_size=2),
        reinforcement_count=st.integers(1, 50),
        embedding_text=st.text(max_size=10),
    ),
    st.builds(
        ConceptReinforced,
        owner=names,
        concept_id=names,
        by=st.integers(1, 9),
        provenance=st.sampled_from(Provenance),
        at=times,
        source_episode_ids=st.lists(names, max_size=3),
        properties=props,
        definition=st.text(max_size=10),
    ),
    st.builds(
        RelationshipTypeRegistered,
        owner=names,
        name=names,
        symmetric=st.booleans(),
        origin=st.sampled_from(RelationOrigin),
        at=times,
    ),
    st.builds(
        RelationshipFormed,
        owner=names,
        source_id=names,
        relation=names,
        target_id=names,
        at=times,
        weight=units,
        metadata=st.dictionaries(names, st.floats(-1, 1, allow_nan=False), max_size=2),
    ),
    st.builds(PatternConfirmed, owner=names, record=math_records, at=times),
    st.builds(
        CrossLayerEdgeFormed,
        owner=names,
        source_layer=st.sampled_from(Layer),
        source_id=names,
        edge_type=st.sampled_from(CrossEdgeType),
        target_layer=st.sampled_from(Layer),
        target_id=names,
        weight=units,
        at=times,
    ),
    st.builds(
        ConceptPromoted,
        owner=names,
        concept_id=names,
        pattern_name=names,
        origin=names,
        candidate_confidence=units,
        created=st.booleans(),
        gate=st.text(max_size=10),
        at=times,
    ),
    st.builds(
        CandidateRejected,
        owner=names,
        pattern_name=names,
        origin=names,
        candidate_confidence=units,
        reason=st.text(max_size=10),
        at=times,
    ),
    st.builds(
        RecordRemoved, owner=names, layer=st.sampled_from(Layer), record_id=names, reason=st.text(max_size=10), at=times
    ),
)


@settings(max_examples=300, deadline=None)
@given(events)
def test_every_semantic_event_round_trips_byte_for_byte(ev):
    raw = encode_semantic(ev)
    back = decode_semantic(raw)
    assert back == ev and encode_semantic(back) == raw


def test_events_are_frozen_and_validated():
    ev = created("c1", "x_concept")
    with pytest.raises(AttributeError):
        ev.name = "y"  # type: ignore[misc]
    bad = encode_semantic(ev).replace(b'"reinforcement_count":1', b'"reinforcement_count":0')
    bad = bad if b"reinforcement_count" in bad else bad[:-1] + b',"reinforcement_count":0}'
    with pytest.raises(msgspec.ValidationError):
        decode_semantic(bad)
    with pytest.raises(msgspec.ValidationError):
        decode_semantic(
            b'{"kind":"relationship_formed","owner":"o","source_id":"a","relation":"IS_A",'
            b'"target_id":"b","at":"2024-05-01T00:00:00Z","weight":1.5}'
        )


def test_event_kinds_on_the_wire_are_pinned():
    kinds = [
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
    assert [k.__struct_config__.tag for k in kinds] == [
        "concept_created",
        "concept_reinforced",
        "relationship_type_registered",
        "relationship_formed",
        "pattern_confirmed",
        "cross_layer_edge_formed",
        "concept_promoted",
        "candidate_rejected",
        "record_removed",
    ]


def test_docstring_examples_run():
    assert doctest.testmod(layers).failed == 0
    assert doctest.testmod(somnus.schemas.semantic).failed == 0
