"""somnus.processors.semantic.concepts: the confidence formula, name dedup, find_or_create, relationships and their
registry, knowledge ingestion, and the merged knowledge context."""

from __future__ import annotations

import doctest
import math
from datetime import datetime, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from somnus.processors.semantic import concepts as semantic
from somnus.processors.semantic.concepts import (
    BUILTIN_RELATIONS,
    CONFIDENCE_BASE,
    CONFIDENCE_CAP,
    CONFIDENCE_STEP,
    KNOWLEDGE_LIMIT,
    KNOWLEDGE_RELATIONSHIPS,
    NAME_MAX_EDITS,
    NAME_MIN_FUZZY_CHARS,
    QUERY_BOOST,
    KnowledgeFileError,
    concept_confidence,
    concept_id_for,
    find_or_create,
    form_relationship,
    ingest_knowledge,
    knowledge_context,
    names_match,
    parse_knowledge,
    relation_name,
    render_knowledge_context,
    within_edits,
)
from somnus.processors.semantic.layers import MemoryLayers, fold_events, snapshot
from somnus.schemas.semantic import (
    ConceptCreated,
    ConceptReinforced,
    Layer,
    MathCategory,
    MathRecord,
    PatternConfirmed,
    Provenance,
    RelationOrigin,
    RelationshipFormed,
    RelationshipTypeRegistered,
)

T0 = datetime(2024, 5, 1, tzinfo=timezone.utc)
OWNER = "agent:robot"


# ---- confidence -------------------------------------------------------------------------------


def test_confidence_numbers_are_pinned():
    assert (CONFIDENCE_BASE, CONFIDENCE_STEP, CONFIDENCE_CAP) == (0.5, 0.1, 0.99)


@pytest.mark.parametrize(
    "n,want",
    [
        (0, 0.5),
        (1, 0.6),
        (4, 0.7),
        (9, 0.8),
        (16, 0.9),
        (23, 0.5 + 0.1 * math.sqrt(23)),
        (24, 0.5 + 0.1 * math.sqrt(24)),
        (25, 0.99),
        (10_000, 0.99),
    ],
)
def test_confidence_is_half_plus_a_tenth_of_the_root_capped(n, want):
    assert concept_confidence(n) == pytest.approx(want)


@given(st.integers(0, 10_000), st.integers(0, 10_000))
def test_confidence_grows_with_evidence_and_stays_below_the_cap(a, b):
    lo, hi = sorted((a, b))
    assert CONFIDENCE_BASE <= concept_confidence(lo) <= concept_confidence(hi) <= CONFIDENCE_CAP


# ---- names --------------------------------------------------------------------------------------


def test_name_dedup_numbers_are_pinned():
    assert (NAME_MAX_EDITS, NAME_MIN_FUZZY_CHARS) == (1, 10)


@pytest.mark.parametrize(
    "a,b,same",
    [
        ("coffee_mug", "coffee mug", True),
        ("Coffee-Mug", "coffee_mug", True),
        ("ＣＯＦＦＥＥ ＭＵＧ", "coffee mug", True),
        ("book_reservation_unreliable", "book_reservations_unreliable", True),  # one edit, long name
        ("book_reservation_unreliable", "book_reservatoin_unreliable", False),  # transposition = 2 edits
        ("mug", "mugs", False),  # short names match exactly or not at all
        ("concept_00", "concept_01", False),  # a digit is never a typo
        ("python_3_11_runtime", "python_3_12_runtime", False),
        ("book_reservation_reliable", "book_reservation_unreliable", False),  # antonyms are not typos
        ("a_very_long_tool_name_for_payments_reliable", "a_very_long_tool_name_for_payments_unreliable", False),
    ],
)
def test_names_match(a, b, same):
    assert names_match(a, b) is same


@settings(max_examples=300, deadline=None)
@given(st.text("abcde_", max_size=14), st.text("abcde_", max_size=14))
def test_banded_edit_distance_agrees_with_the_full_one(a, b):
    def full(x: str, y: str) -> int:
        prev = list(range(len(y) + 1))
        for i in range(1, len(x) + 1):
            cur = [i] + [0] * len(y)
            for j in range(1, len(y) + 1):
                cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (x[i - 1] != y[j - 1]))
            prev = cur
        return prev[-1]

    for k in (0, 1, 2):
        assert within_edits(a, b, k) is (full(a, b) <= k)


def test_concept_ids_come_from_owner_and_name_key():
    assert concept_id_for(OWNER, "coffee_mug") == concept_id_for(OWNER, "Coffee Mug")
    assert concept_id_for(OWNER, "coffee_mug") != concept_id_for("agent:other", "coffee_mug")


# ---- find_or_create -----------------------------------------------------------------------------


def test_find_or_create_dedups_by_name_and_reinforces_per_new_evidence():
    m = MemoryLayers(OWNER)
    cid, created, evs = find_or_create(
        m,
        "coffee_mug",
        T0,
        definition="A mug.",
        category="object",
        provenance=Provenance.EPISODIC_CONSOLIDATION,
        source_episode_ids=["e1", "e2"],
    )
    assert created and [type(e) for e in evs] == [ConceptCreated]
    assert m.atl.get(cid).reinforcement_count == 2  # one per episode
    again, created2, evs2 = find_or_create(
        m, "coffee mug", T0, provenance=Provenance.EPISODIC_CONSOLIDATION, source_episode_ids=["e2", "e3", "e3"]
    )
    assert (again, created2) == (cid, False)
    assert [type(e) for e in evs2] == [ConceptReinforced] and evs2[0].by == 1 and evs2[0].source_episode_ids == ["e3"]
    assert m.atl.get(cid).reinforcement_count == 3
    assert m.atl.get(cid).confidence == pytest.approx(0.5 + 0.1 * math.sqrt(3))
    # the same evidence again: nothing at all
    assert find_or_create(m, "Coffee-Mug", T0, source_episode_ids=["e1", "e3"]) == (cid, False, [])
    assert len(m.atl) == 1


def test_a_second_kind_of_source_makes_a_concept_hybrid():
    m = MemoryLayers(OWNER)
    cid, _, _ = find_or_create(
        m, "nav_unreliable", T0, provenance=Provenance.EPISODIC_CONSOLIDATION, source_episode_ids=["e1"]
    )
    _, _, evs = find_or_create(m, "nav_unreliable", T0, provenance=Provenance.AGENT_INFERENCE, evidence=["math:m1@1"])
    assert evs[0].provenance is Provenance.HYBRID and m.atl.get(cid).provenance is Provenance.HYBRID


def test_reinforcement_updates_properties_and_definition():
    m = MemoryLayers(OWNER)
    cid, _, _ = find_or_create(
        m, "nav_unreliable", T0, definition="old", properties={"a": 1, "b": 2}, source_episode_ids=["e1"]
    )
    _, _, evs = find_or_create(
        m, "nav_unreliable", T0, definition="new", properties={"a": 1, "b": 3}, source_episode_ids=["e2"]
    )
    assert evs[0].properties == {"b": 3} and evs[0].definition == "new"  # only what changed travels
    c = m.atl.get(cid)
    assert c.properties == {"a": 1, "b": 3} and c.definition == "new"
    assert m.atl.by_property("b", 3) == [cid] and m.atl.by_property("b", 2) == []


@settings(max_examples=50, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["coffee_mug", "Coffee Mug", "tea_cup", "kitchen"]),
            st.lists(st.sampled_from(["e1", "e2", "e3", "e4"]), max_size=3),
        ),
        max_size=12,
    )
)
def test_replaying_find_or_create_events_rebuilds_the_same_atl(calls):
    m = MemoryLayers(OWNER)
    log = []
    born_bare: set[str] = set()  # created without evidence: the creation itself counts once
    for name, eps in calls:
        cid, created, evs = find_or_create(
            m, name, T0, provenance=Provenance.EPISODIC_CONSOLIDATION, source_episode_ids=eps
        )
        if created and not eps:
            born_bare.add(cid)
        log += evs
    rebuilt = fold_events(log).get(OWNER, MemoryLayers(OWNER))
    assert snapshot(rebuilt) == snapshot(m)
    for c in m.atl:  # one count per distinct episode
        assert c.reinforcement_count == len(c.source_episode_ids) + (c.concept_id in born_bare)


# ---- relationships --------------------------------------------------------------------------------


def test_builtin_relationship_types_and_their_symmetry_are_pinned():
    assert {k: v.symmetric for k, v in BUILTIN_RELATIONS.items()} == {
        "IS_A": False,
        "HAS_PART": False,
        "CAUSES": False,
        "TRENDS_WITH": True,
        "CORRELATES_WITH": True,
        "PHASE_LOCKED_TO": False,
        "PREDICTS": False,
    }
    assert all(v.origin is RelationOrigin.BUILTIN for v in BUILTIN_RELATIONS.values())
    assert relation_name("property of") == "PROPERTY_OF" == relation_name("Property-Of")


def test_form_relationship_registers_a_new_type_once_and_is_idempotent():
    m = MemoryLayers(OWNER)
    a, _, _ = find_or_create(m, "coffee_mug", T0)
    b, _, _ = find_or_create(m, "kitchen_area", T0)
    evs = form_relationship(m, a, "property of", b, T0, description="where it is")
    assert [type(e) for e in evs] == [RelationshipTypeRegistered, RelationshipFormed]
    assert evs[0].name == "PROPERTY_OF" and evs[0].origin is RelationOrigin.AGENT_PROPOSED
    assert form_relationship(m, a, "PROPERTY_OF", b, T0) == []
    assert [type(e) for e in form_relationship(m, a, "PROPERTY_OF", b, T0, weight=0.5)] == [RelationshipFormed]
    assert m.atl.relationship(a, "PROPERTY_OF", b).weight == 0.5
    # proposed as symmetric: the fold holds both directions
    evs = form_relationship(m, a, "co_located_with", b, T0, symmetric_if_new=True)
    assert evs[0].symmetric and m.atl.relationship(b, "CO_LOCATED_WITH", a) is not None


def test_symmetric_relationships_formed_through_the_command():
    m = MemoryLayers(OWNER)
    a, _, _ = find_or_create(m, "navigate_failures", T0)
    b, _, _ = find_or_create(m, "goal_latency", T0)
    form_relationship(m, a, "TRENDS_WITH", b, T0)
    form_relationship(m, a, "IS_A", b, T0)
    assert m.atl.relationship(b, "TRENDS_WITH", a) is not None
    assert m.atl.relationship(b, "IS_A", a) is None


# ---- ingest-knowledge --------------------------------------------------------------------------------

MD = """# Kitchen things

## coffee_mug
category: object
A ceramic container typically found in kitchens.
- color: blue
- capacity_ml: 350
- dishwasher_safe: true
IS_A: container
PROPERTY_OF: kitchen_area

## container
definition: Something that holds things.
"""

JSON = """{"concepts": [
  {"name": "coffee_mug", "definition": "A ceramic container typically found in kitchens.", "category": "object",
   "properties": {"color": "blue", "capacity_ml": 350, "dishwasher_safe": true},
   "relationships": [{"type": "IS_A", "target": "container"}, {"type": "property of", "target": "kitchen_area"}]},
  {"name": "container", "definition": "Something that holds things."}
]}"""


def test_markdown_and_json_knowledge_parse_to_the_same_concepts():
    md = [c for c in parse_knowledge(MD, "markdown") if c.name != "Kitchen things"]
    js = parse_knowledge(JSON, "json")
    assert md == js
    mug = js[0]
    assert mug.properties == {"color": "blue", "capacity_ml": 350, "dishwasher_safe": True}
    assert [(r.relation, r.target) for r in mug.relationships] == [
        ("IS_A", "container"),
        ("PROPERTY_OF", "kitchen_area"),
    ]


@pytest.mark.parametrize(
    "text,fmt,where",
    [
        ("{", "json", "not JSON"),
        ('{"x": 1}', "json", "'concepts'"),
        ('[{"definition": "no name"}]', "json", "concept 0"),
        ('[{"name": "a", "relationships": [{"type": "IS_A"}]}]', "json", "relationship 0"),
        ("text before any heading\n## a", "markdown", "line 1"),
        ("## a", "yaml", "unknown knowledge format"),
    ],
)
def test_knowledge_file_errors_name_the_place(text, fmt, where):
    with pytest.raises(KnowledgeFileError, match=where):
        parse_knowledge(text, fmt)


def test_ingestion_creates_direct_concepts_and_relationships_once():
    m = MemoryLayers(OWNER)
    evs = ingest_knowledge(m, parse_knowledge(JSON, "json"), "kitchen.json", T0)
    mug = m.atl.get(m.atl.find("coffee mug"))
    assert mug.provenance is Provenance.DIRECT_INGESTION and mug.category == "object"
    assert [(r.relation, m.atl.name_of(r.target_id)) for r in m.atl.relationships(mug.concept_id)] == [
        ("IS_A", "container"),
        ("PROPERTY_OF", "kitchen_area"),
    ]
    assert m.registry.get("PROPERTY_OF").origin is RelationOrigin.AGENT_PROPOSED
    assert len(m.atl) == 3 and any(isinstance(e, RelationshipTypeRegistered) for e in evs)
    assert ingest_knowledge(m, parse_knowledge(JSON, "json"), "kitchen.json", T0) == []  # idempotent
    assert snapshot(fold_events(evs)[OWNER]) == snapshot(m)


# ---- knowledge context ----------------------------------------------------------------------------------


def test_knowledge_numbers_are_pinned():
    assert (KNOWLEDGE_LIMIT, KNOWLEDGE_RELATIONSHIPS, QUERY_BOOST) == (8, 5, 1.0)


def _math(mid: str, name: str, conf: float, verbal: str, subjects: list[str]) -> PatternConfirmed:
    return PatternConfirmed(
        owner=OWNER,
        at=T0,
        record=MathRecord(
            math_id=mid,
            name=name,
            category=MathCategory.PATTERN,
            domain="tool_reliability",
            subjects=subjects,
            verbal=verbal,
            query="SELECT 1",
            confidence=conf,
            n_observations=40,
        ),
    )


def test_knowledge_context_merges_concepts_and_patterns_in_the_designs_format():
    m = MemoryLayers(OWNER)
    ingest_knowledge(m, parse_knowledge(JSON, "json"), "kitchen.json", T0)
    mug = m.atl.find("coffee_mug")
    # 13 more pieces of evidence: confidence 0.5 + 0.1 * sqrt(14) = 0.874
    find_or_create(m, "coffee_mug", T0, evidence=[f"doc:more#{i}" for i in range(13)])
    m.apply(
        _math(
            "m1",
            "stat:tool:navigate:success",
            0.73,
            "Navigate tool showing declining success rate (R²=0.73, slope=-0.02/day).",
            ["navigate"],
        )
    )
    entries = knowledge_context(m)
    texts = [e.text for e in entries]
    assert texts[0] == (
        '"coffee_mug" (object, confidence=0.87): A ceramic container typically found in kitchens. '
        "Relationships: IS_A container, PROPERTY_OF kitchen_area"
    )
    assert (
        '"stat:tool:navigate:success" (math:PATTERN, confidence=0.73): Navigate tool showing declining success '
        "rate (R²=0.73, slope=-0.02/day)."
    ) in texts
    assert [e.layer for e in entries][:2] == [Layer.ATL, Layer.ANGULAR_GYRUS]  # 0.87, then 0.73 > 0.6
    assert entries[0].record_id == mug
    assert render_knowledge_context(entries).splitlines()[0] == "- " + texts[0]


def test_knowledge_context_is_capped_at_8_and_ranked_by_confidence_then_evidence_then_name():
    m = MemoryLayers(OWNER)
    for i in range(12):
        find_or_create(m, f"concept_{i:02d}", T0, evidence=[f"k{j}" for j in range(i % 4 + 1)])
    entries = knowledge_context(m)
    assert len(entries) == KNOWLEDGE_LIMIT
    keys = [(-e.confidence, e.name) for e in entries]
    assert keys == sorted(keys)
    assert entries[0].name == "concept_03" and entries[0].confidence == pytest.approx(0.7)


def test_a_query_boosts_relevant_knowledge():
    m = MemoryLayers(OWNER)
    find_or_create(m, "book_reservation_unreliable", T0, definition="payments fail", evidence=["a"])
    find_or_create(m, "coffee_mug", T0, definition="a mug", evidence=["a", "b", "c", "d"])
    assert knowledge_context(m)[0].name == "coffee_mug"
    ranked = knowledge_context(m, query="book a reservation")
    assert ranked[0].name == "book_reservation_unreliable"
    # 0.6 * (1 + 1.0 * 2/3): "book" and "reservation" of {"book", "a", "reservation"}
    assert ranked[0].score == pytest.approx(0.6 * (1 + 2 / 3), abs=1e-6)


def test_docstring_examples_run():
    assert doctest.testmod(semantic).failed == 0


def test_record_agents_prefers_recorded_provenance_over_the_tools_callers():
    from somnus.processors.semantic.concepts import find_or_create, record_agents
    from somnus.schemas.semantic import Layer, MathCategory, MathRecord, PatternConfirmed

    t = datetime(2024, 5, 1, tzinfo=timezone.utc)
    m = MemoryLayers("global")
    callers = {"pay": ["a", "b", "c"]}
    m.apply(
        PatternConfirmed(
            owner="global",
            at=t,
            record=MathRecord(
                math_id="m1",
                name="stat:tool:pay:success",
                category=MathCategory.PATTERN,
                domain="tool_reliability",
                subjects=["pay"],
                verbal="v",
                query="SELECT 1",
                confidence=0.9,
                n_observations=9,
                source_agents=["b"],
            ),
        )
    )
    assert record_agents(m, Layer.ANGULAR_GYRUS, "m1", callers) == {"b"}
    recorded, _, _ = find_or_create(
        m, "pay_success_declining", t, properties={"tool": "pay", "source_agents": ["b"]}, evidence=["math:m1@1"]
    )
    assert record_agents(m, Layer.ATL, recorded, callers) == {"b"}
    unrecorded, _, _ = find_or_create(m, "pay_unreliable", t, properties={"tool": "pay"}, source_episode_ids=["e1"])
    assert record_agents(m, Layer.ATL, unrecorded, callers) == {"a", "b", "c"}  # then every caller counts
