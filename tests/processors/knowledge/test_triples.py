"""somnus.processors.knowledge.triples: entity resolution, supersession, reinforcement, as-of, replay and rebuild."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from somnus.processors.knowledge.triples import (
    MERGE_JACCARD,
    MIN_TRUSTED_CHARS,
    KnowledgeFold,
    KnowledgeState,
    as_of,
    entity_id,
    merge_attributes,
    noisy_or,
    normalise_name,
)
from somnus.schemas.facts import EntityMention, FactAsserted, FactsExtracted

T0 = datetime(2024, 5, 1, tzinfo=timezone.utc)


def fx(
    i: int, hours: float, facts: list[FactAsserted], agent: str = "scraper", entities: list[EntityMention] | None = None
) -> FactsExtracted:
    return FactsExtracted(
        schema_version=1,
        episode_id=uuid.UUID(int=i),
        agent=agent,
        observed_at=T0 + timedelta(hours=hours),
        extractor="trace/1",
        entities=entities or [],
        facts=facts,
    )


def fact(
    source: str,
    predicate: str,
    target: str,
    conf: float = 1.0,
    count: int = 1,
    scope: str | None = None,
    functional: bool | None = None,
    stype: str = "api",
    ttype: str = "rate",
) -> FactAsserted:
    return FactAsserted(
        source=source,
        source_type=stype,
        predicate=predicate,
        target=target,
        target_type=ttype,
        confidence=conf,
        count=count,
        scope=scope,
        functional=functional,
    )


@pytest.mark.parametrize(
    "raw,norm",
    [
        ("Book_Reservation", "book_reservation"),
        ("  api.Instantly.AI  ", "api.instantly.ai"),
        ("“quoted”.", "quoted"),
        ("flight <id> not available", "flight <id> not available"),
        ("many   inner\tspaces", "many inner spaces"),
        ("ＦＵＬＬＷＩＤＴＨ", "fullwidth"),
    ],
)
def test_names_are_normalised(raw, norm):
    assert normalise_name(raw) == norm


def test_entity_ids_are_type_and_normalised_name():
    assert entity_id("Tool", " Book_Reservation ") == "tool:book_reservation"


def test_confidence_numbers_are_pinned():
    assert MERGE_JACCARD == 0.9 and MIN_TRUSTED_CHARS == 10
    assert noisy_or(0.9, 0.9) == pytest.approx(0.99)
    assert noisy_or(0.65, 0.65) == pytest.approx(0.8775)
    assert noisy_or(1.0, 0.6) == 1.0


def test_attributes_merge_by_union_and_first_scalar_wins():
    assert merge_attributes({"tags": ["a"], "status": 429}, {"tags": ["b", "a"], "status": 500, "x": 1}) == {
        "tags": ["a", "b"],
        "status": 429,
        "x": 1,
    }


def _resolve(names: list[tuple[str, str]]) -> KnowledgeFold:
    fold = KnowledgeFold()
    fold.apply([fx(i, i, [], entities=[EntityMention(name=n, type=t)]) for i, (t, n) in enumerate(names)])
    return fold


def test_near_duplicate_long_names_merge_into_the_first_seen():
    fold = _resolve(
        [
            ("tool", "update_reservation_flights"),
            ("tool", "update_reservation_flight"),
            ("api", "api.instantly.ai/v1/leads"),
            ("api", "api.instantly.ai/v1/lead"),
        ]
    )
    assert sorted(fold.state.entities) == ["api:api.instantly.ai/v1/leads", "tool:update_reservation_flights"]
    assert (
        fold.state.agent_aliases[("scraper", "tool", "update_reservation_flight")] == "tool:update_reservation_flights"
    )


def test_a_near_duplicate_name_of_another_agent_is_never_merged():
    """Aliasing stays inside an agent: b's name is not merged into a's near-duplicate private name
    (b would then read a's name in its own facts), nor does a's alias serve b."""
    fold = KnowledgeFold()
    fold.apply([fx(1, 1, [], agent="a", entities=[EntityMention(name="inventory_lookup_service_a", type="tool")])])
    fold.apply([fx(2, 2, [], agent="b", entities=[EntityMention(name="inventory_lookup_service_b", type="tool")])])
    assert sorted(fold.state.entities) == ["tool:inventory_lookup_service_a", "tool:inventory_lookup_service_b"]
    fold.apply([fx(3, 3, [], agent="a", entities=[EntityMention(name="inventory_lookup_service_c", type="tool")])])
    ch = fold.apply([fx(4, 4, [fact("inventory_lookup_service_c", "rate_limit", "10/s", stype="tool")], agent="b")])
    assert fold.state.agent_aliases[("a", "tool", "inventory_lookup_service_c")] == "tool:inventory_lookup_service_a"
    assert fold.state.agent_aliases[("b", "tool", "inventory_lookup_service_c")] == "tool:inventory_lookup_service_b"
    assert [t.source for t in ch.triples_inserted] == ["tool:inventory_lookup_service_b"]


@pytest.mark.parametrize(
    "names",
    [
        [("tool", "search_v1"), ("tool", "search_v2")],  # short: never trusted
        [("tool", "update_reservation_flights"), ("api", "update_reservation_flights")],  # different types
        [("tool", "update_reservation_flights"), ("tool", "update_reservation_baggages")],  # similar, not the same
        [("error", "not enough seats on flight <id>"), ("error", "not enough balance in payment method <id>")],
    ],
)
def test_names_that_must_not_merge(names):
    fold = _resolve(names)
    assert len(fold.state.entities) == 2


def test_a_merged_alias_resolves_facts_to_the_canonical_entity():
    fold = KnowledgeFold()
    ch = fold.apply(
        [
            fx(
                1,
                0,
                [
                    fact(
                        "update_reservation_flights",
                        "failed_with",
                        "payment method not found",
                        stype="tool",
                        ttype="error",
                    )
                ],
            ),
            fx(
                2,
                1,
                [
                    fact(
                        "update_reservation_flight",
                        "failed_with",
                        "payment method not found",
                        stype="tool",
                        ttype="error",
                    )
                ],
            ),
        ]
    )
    assert len(ch.triples_inserted) == 1 and len(ch.triples_reinforced) == 1
    assert ch.triples_inserted[0].source == "tool:update_reservation_flights"
    assert [a.alias for a in ch.aliases] == ["update_reservation_flight"]


def test_a_functional_change_closes_the_old_fact_at_the_new_facts_event_time():
    fold = KnowledgeFold()
    first = fold.apply([fx(1, 0, [fact("api.x.io", "rate_limit", "10/s")])]).triples_inserted[0]
    ch = fold.apply([fx(2, 5, [fact("api.x.io", "rate_limit", "5/s")])])
    new = ch.triples_inserted[0]
    assert [(c.triple_id, c.valid_to, c.superseded_by) for c in ch.triples_closed] == [
        (first.triple_id, T0 + timedelta(hours=5), new.triple_id)
    ]
    assert new.valid_from == T0 + timedelta(hours=5) and new.valid_to is None
    assert [h.change for h in ch.history] == ["superseded", "asserted"]
    assert {h.episode_id for h in ch.history} == {str(uuid.UUID(int=2))}  # the episode that caused it


def test_multi_valued_predicates_never_close_each_other():
    fold = KnowledgeFold()
    ch = fold.apply(
        [
            fx(
                i,
                i,
                [
                    fact("scraper", "uses", f"tool{i}", stype="agent", ttype="tool"),
                    fact("tool0", "failed_with", f"error {i}", stype="tool", ttype="error"),
                ],
            )
            for i in range(5)
        ]
    )
    assert ch.triples_closed == [] and len(ch.triples_inserted) == 10
    assert all(t.valid_to is None for t in fold.state.triples.values())


def test_the_same_fact_again_reinforces_it():
    fold = KnowledgeFold()
    fold.apply([fx(1, 0, [fact("t", "failed_with", "e", conf=0.9, count=2, stype="tool", ttype="error")])])
    ch = fold.apply([fx(2, 1, [fact("t", "failed_with", "e", conf=0.9, count=3, stype="tool", ttype="error")])])
    (r,) = ch.triples_reinforced
    assert (r.count, round(r.confidence, 6), r.last_evidence) == (5, 0.99, str(uuid.UUID(int=2)))
    assert ch.triples_inserted == [] and ch.history[0].change == "reinforced"


def test_a_late_fact_enters_the_log_already_closed():
    fold = KnowledgeFold()
    fold.apply([fx(1, 10, [fact("api.x.io", "rate_limit", "10/s")])])
    ch = fold.apply([fx(2, 3, [fact("api.x.io", "rate_limit", "5/s")])])  # observed earlier, arrives later
    (late,) = ch.triples_inserted
    assert (
        ch.triples_closed == []
        and late.superseded_by == fold.state.slots[("api:api.x.io", "rate_limit", "agent:scraper")][1]
    )
    assert (late.valid_from, late.valid_to) == (T0 + timedelta(hours=3), T0 + timedelta(hours=10))
    assert [t.target for t in as_of(fold.state.all_triples(), T0 + timedelta(hours=4))] == ["rate:5/s"]
    assert [t.target for t in as_of(fold.state.all_triples(), T0 + timedelta(hours=11))] == ["rate:10/s"]


def test_scopes_do_not_supersede_each_other():
    fold = KnowledgeFold()
    ch = fold.apply(
        [
            fx(1, 0, [fact("api.x.io", "rate_limit", "10/s")], agent="a"),
            fx(2, 1, [fact("api.x.io", "rate_limit", "5/s")], agent="b"),
            fx(3, 2, [fact("api.x.io", "rate_limit", "7/s", scope="global")], agent="b"),
        ]
    )
    assert ch.triples_closed == []
    assert sorted(t.scope for t in ch.triples_inserted) == ["agent:a", "agent:b", "global"]


def test_as_of_queries():
    fold = KnowledgeFold()
    for i, rate in enumerate(["10/s", "5/s", "10/s", "20/s"]):
        fold.apply([fx(i + 1, 24 * i, [fact("api.x.io", "rate_limit", rate)])])
    at = lambda h: [t.target for t in as_of(fold.state.all_triples(), T0 + timedelta(hours=h))]  # noqa: E731
    assert at(-1) == [] and at(0) == ["rate:10/s"] and at(23) == ["rate:10/s"]
    assert at(24) == ["rate:5/s"] and at(48) == ["rate:10/s"] and at(1000) == ["rate:20/s"]
    # A belief that comes back (10/s again) is a new triple: the log keeps both stretches.
    assert len([t for t in fold.state.all_triples() if t.target == "rate:10/s"]) == 2


def test_a_new_predicate_joins_the_registry_with_its_kind():
    fold = KnowledgeFold()
    ch = fold.apply(
        [
            fx(1, 0, [fact("svc", "hosted_on", "aws", functional=True)]),
            fx(2, 1, [fact("svc", "hosted_on", "gcp")]),
            fx(3, 2, [fact("svc", "mentions", "x"), fact("svc", "mentions", "y")]),
        ]
    )
    assert [(p.predicate, p.functional) for p in ch.predicates] == [("hosted_on", True), ("mentions", False)]
    assert len(ch.triples_closed) == 1


def _batches(n: int, seed: int) -> list[FactsExtracted]:
    import random

    rnd = random.Random(seed)
    out = []
    for i in range(n):
        facts = [
            fact(f"api{rnd.randrange(3)}.example.com", "rate_limit", f"{rnd.randrange(4)}/s"),
            fact(
                f"tool_{rnd.randrange(4)}",
                "failed_with",
                f"error {rnd.randrange(5)}",
                conf=0.95,
                stype="tool",
                ttype="error",
            ),
        ]
        out.append(
            fx(
                i + 1,
                rnd.uniform(0, 100),
                facts,
                agent=f"agent{rnd.randrange(2)}",
                entities=[EntityMention(name=f"tool_{rnd.randrange(4)}", type="tool", attributes={"seen": [i % 3]})],
            )
        )
    return out


def _encode_all(fold: KnowledgeFold, batches: list[list[FactsExtracted]]) -> bytes:
    return b"".join(fold.apply(b).encode() for b in batches)


def test_replaying_the_same_input_gives_byte_identical_changes():
    log = _batches(60, seed=4)
    assert _encode_all(KnowledgeFold(), [log[:20], log[20:]]) == _encode_all(KnowledgeFold(), [log[:20], log[20:]])


def test_a_fold_rebuilt_from_its_rows_continues_identically():
    log = _batches(80, seed=5)
    whole = KnowledgeFold()
    first = whole.apply(log[:40])
    rest = whole.apply(log[40:]).encode()
    # rebuild from what a projector would have stored after the first half
    entities: dict[str, object] = {}
    for e in first.entities:
        entities[e.entity_id] = e
    active = {t.triple_id: t for t in first.triples_inserted}
    for r in first.triples_reinforced:
        active[r.triple_id] = msgspec.structs.replace(
            active[r.triple_id], count=r.count, confidence=r.confidence, last_evidence=r.last_evidence
        )
    for c in first.triples_closed:
        active[c.triple_id] = msgspec.structs.replace(
            active[c.triple_id], valid_to=c.valid_to, superseded_by=c.superseded_by
        )
    state = KnowledgeState.from_rows(
        entities.values(),
        first.aliases,
        first.predicates,  # type: ignore[arg-type]
        list(active.values()),
        next_ordinal=len(first.history),
    )
    assert KnowledgeFold(state).apply(log[40:]).encode() == rest


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 50), st.sampled_from(["1/s", "2/s", "3/s"]), st.sampled_from(["agent:a", "global"])),
        min_size=1,
        max_size=25,
    )
)
def test_at_most_one_functional_fact_is_active_at_any_time(steps):
    fold = KnowledgeFold()
    for i, (hour, rate, scope) in enumerate(steps):
        ch = fold.apply([fx(i + 1, hour, [fact("api.x.io", "rate_limit", rate, scope=scope)])])
        assert {h.episode_id for h in ch.history} <= {
            str(uuid.UUID(int=i + 1)),
            *(t.evidence for t in fold.state.all_triples()),
        }
    triples = fold.state.all_triples()
    for hour in range(-1, 52):
        active = as_of(triples, T0 + timedelta(hours=hour, minutes=30))
        scopes = [t.scope for t in active]
        assert len(scopes) == len(set(scopes))
        # in event-time order, it is the belief of the latest sighting at or before that time (out of
        # order, a late contradiction is not split by later reinforcements: see the module docstring)
        if [h for h, _, _ in steps] != sorted(h for h, _, _ in steps):
            continue
        for t in active:
            seen = [(h, i) for i, (h, _, s) in enumerate(steps) if s == t.scope and h <= hour]
            latest_hour = max(h for h, _ in seen)
            assert t.target.split(":", 1)[1] in {r for h, r, s in steps if s == t.scope and h == latest_hour}
