"""somnus.processors.knowledge.swarm_metrics: mentions, facts used, utilisation, delegation success and scope promotion."""

from __future__ import annotations

import doctest
import uuid
from datetime import datetime, timedelta, timezone
from itertools import count
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import somnus.processors.knowledge.swarm_metrics
from somnus.processors.knowledge.swarm_metrics import (
    FAILING_MAX_SUCCESS_RATE,
    FAILING_MIN_RESULTS,
    MIN_MENTION_CHARS,
    PROMOTION_THRESHOLDS,
    DelegationTally,
    PromotionError,
    PromotionFold,
    StatementState,
    Threshold,
    apply_promotion,
    count_use,
    delegation_results,
    event_from_row,
    facts_used,
    failing_pairs,
    learning_rate_of,
    manual_promotions,
    mentions,
    promoted_facts,
    promotion_target,
    statement_key,
    tally_delegations,
    team_of,
    utilisation,
)
from somnus.processors.knowledge.triples import KnowledgeFold
from somnus.schemas.agents import AgentSpec, LearningRate
from somnus.schemas.briefing import BriefingServed, FactPromoted, FactUsed, PromotionReason, ServedFact
from somnus.schemas.events import TraceEvent
from somnus.schemas.facts import FactAsserted, FactsExtracted
from tests.factories import decoded_event

T0 = datetime(2024, 5, 1, tzinfo=timezone.utc)
_ids = count(1)


def ev(type_: str, payload: dict[str, Any], seq: int, agent: str = "researcher", session: str = "s1") -> TraceEvent:
    return decoded_event(session, seq, type_, T0 + timedelta(seconds=seq), payload, agent=agent, tag=str(next(_ids)))


def sf(
    tid: str, source: str, predicate: str, target: str, scope: str = "agent:researcher", conf: float = 0.9
) -> ServedFact:
    return ServedFact(
        triple_id=tid,
        source=source,
        predicate=predicate,
        target=target,
        scope=scope,
        confidence=conf,
        source_name=source.split(":", 1)[1],
        target_name=target.split(":", 1)[1],
    )


def served(facts: list[ServedFact], agent: str = "researcher", session: str = "s1") -> BriefingServed:
    return BriefingServed(
        schema_version=1, briefing_id="b1", agent=agent, session_id=session, served_at=T0, facts=facts
    )


# ---- mentions ------------------------------------------------------------------------------


def test_numbers_are_pinned():
    assert MIN_MENTION_CHARS == 3
    assert (FAILING_MIN_RESULTS, FAILING_MAX_SUCCESS_RATE) == (5, 0.5)
    assert PROMOTION_THRESHOLDS == {
        LearningRate.CONSERVATIVE: Threshold(members=3, teams=3),
        LearningRate.MODERATE: Threshold(members=2, teams=2),
        LearningRate.AGGRESSIVE: Threshold(members=1, teams=2),
    }
    assert set(PROMOTION_THRESHOLDS) == set(LearningRate)


@pytest.mark.parametrize(
    ("fragments", "name", "hit"),
    [
        (["book_reservation"], "book_reservation", True),
        (["BOOK_RESERVATION"], "book_reservation", True),  # case-insensitive
        (["Book_Reservation"], "book_reservation", True),
        (["book a reservation"], "book_reservation", False),  # a token is a whole word
        (["rebook_reservation"], "book_reservation", False),
        (["https://API.instantly.ai/v1/leads?page=2"], "api.instantly.ai", True),
        (["api instantly ai"], "api.instantly.ai", True),  # the same tokens, contiguous
        (["api.instantly.com and ai"], "api.instantly.ai", False),
        (["instantly api ai"], "api.instantly.ai", False),  # order matters
        (["api.instantly", "ai"], "api.instantly.ai", False),  # never across two fragments
        (["the limit is 10/s"], "10/s", True),  # "10 s": 3 word characters, enough
        (["the limit is 5/s"], "5/s", False),  # "5 s": under MIN_MENTION_CHARS word characters
        (["the limit is 100/min"], "100/min", True),
        (["ＦＵＬＬＷＩＤＴＨ tool"], "fullwidth", True),  # NFKC
        (["we hit HTTP 429: Too Many Requests"], "HTTP 429: Too Many Requests", True),
        (["flight HAT030 not available"], "flight <id> not available", False),  # placeholders do not match ids
        ([], "anything", False),
        (["ai"], "ai", False),
        (["abc"], "abc", True),
    ],
)
def test_mentions(fragments, name, hit):
    assert mentions(fragments, name) is hit


def test_facts_used_counts_the_first_acting_mention_once():
    facts = [
        sf("t1", "api:api.instantly.ai", "rate_limit", "rate:10/s"),
        sf("t2", "tool:http_get", "calls", "api:r.jina.ai"),
        sf("t3", "tool:summarize", "failed_with", "error:timeout"),
        sf("t4", "agent:researcher", "works_on", "project:atlas"),
    ]
    events = [
        ev("session_start", {"task": "use api.instantly.ai and summarize"}, 0),  # not an act
        ev("user_message", {"text": "please call r.jina.ai, summarize, and mind the timeout"}, 1),  # the user's words
        ev(
            "tool_call",
            {
                "tool": "web_search",
                "call_id": "c1",
                "args": {"q": "Instantly API pagination", "url": "https://api.instantly.ai/v1"},
            },
            2,
        ),
        ev("tool_result", {"call_id": "c1", "ok": False, "error": "summarize timeout"}, 3),  # not an act
        ev("agent_message", {"text": "I will fetch through r.jina.ai"}, 4),
        ev("tool_call", {"tool": "http_get", "call_id": "c2", "args": {"url": "https://r.jina.ai/x"}}, 5),
        ev("agent_message", {"text": "done for researcher on atlas"}, 6),
        ev("tool_call", {"tool": "http_get", "call_id": "c3", "args": {}}, 2, session="other"),
    ]
    got = facts_used(served(facts), list(reversed(events)))
    assert [(u.triple_id, u.seq, u.entity) for u in got] == [
        ("t1", 2, "api.instantly.ai"),
        ("t2", 4, "r.jina.ai"),
        ("t4", 6, "atlas"),
    ]
    u = got[0]
    assert (u.agent, u.session_id, u.briefing_id, u.scope, u.confidence, u.used_at) == (
        "researcher",
        "s1",
        "b1",
        "agent:researcher",
        0.9,
        T0 + timedelta(seconds=2),
    )


def test_the_agents_own_name_is_not_a_mention():
    got = facts_used(
        served([sf("t", "agent:researcher", "works_on", "project:ab")]),
        [ev("agent_message", {"text": "researcher here"}, 1)],
    )
    assert got == []


def test_a_delegation_is_an_act():
    got = facts_used(
        served([sf("t", "agent:scraper", "failed_with", "error:x")]),
        [ev("delegation", {"to_agent": "scraper", "task": "fetch"}, 1)],
    )
    assert [u.entity for u in got] == ["scraper"]


def test_a_redelivered_event_counts_once_and_other_agents_are_ignored():
    e = ev("agent_message", {"text": "r.jina.ai"}, 1)
    other = ev("agent_message", {"text": "r.jina.ai"}, 0, agent="scraper")
    got = facts_used(served([sf("t", "tool:http_get", "calls", "api:r.jina.ai")]), [other, e, e])
    assert [(u.seq, u.agent) for u in got] == [(1, "researcher")]


def test_events_from_rows_of_the_events_table():
    row = {
        "event_id": uuid.UUID(int=5),
        "schema_version": 1,
        "ts": T0,
        "agent": "researcher",
        "session_id": "s1",
        "seq": 3,
        "type": "tool_call",
        "payload": '{"tool": "http_get", "call_id": "c", "args": {"u": "r.jina.ai"}}',
        "src_partition": 0,
        "src_offset": 9,
        "src_index": 0,
    }
    e = event_from_row(row)
    assert facts_used(served([sf("t", "tool:x", "calls", "api:r.jina.ai")]), [e])[0].seq == 3


@settings(max_examples=50, deadline=None)
@given(st.permutations(list(range(8))))
def test_facts_used_does_not_depend_on_event_order(order):
    facts = [sf(f"t{i}", f"tool:tool{i}", "calls", f"api:host{i}.io") for i in range(4)]
    events = [ev("agent_message", {"text": f"tool{i % 4} host{(i * 3) % 4}.io"}, i) for i in range(8)]
    assert facts_used(served(facts), [events[i] for i in order]) == facts_used(served(facts), events)


def test_utilisation_per_agent():
    s1 = served([sf("a", "tool:xxx", "calls", "api:yyy"), sf("b", "tool:xxx", "calls", "api:zzz")], session="s1")
    s2 = served([sf("a", "tool:xxx", "calls", "api:yyy")], session="s2")
    s3 = served([sf("c", "tool:qqq", "calls", "api:rrr")], agent="scraper", session="s3")
    used = facts_used(s1, [ev("agent_message", {"text": "the yyy api"}, 1)])
    got = utilisation([s1, s2, s3, s1], used + used)
    assert got["researcher"].sessions == 2 and got["researcher"].facts_served == 3
    assert got["researcher"].facts_used == 1 and got["researcher"].rate == pytest.approx(1 / 3)
    assert (got["scraper"].facts_used, got["scraper"].rate) == (0, 0.0)


# ---- delegation success --------------------------------------------------------------------


def test_delegation_success_rate_per_pair():
    events = [
        ev("delegation_result", {"to_agent": "deployer", "outcome": o}, i, agent="ops-lead")
        for i, o in enumerate(["success", "failure", "partial", "success"])
    ]
    events += [
        ev("delegation_result", {"to_agent": "support", "outcome": "failure"}, 9, agent="ops-lead"),
        ev("delegation", {"to_agent": "support", "task": "x"}, 10, agent="ops-lead"),
    ]
    results = delegation_results(events)
    assert results[0] == ("ops-lead", "deployer", "success") and len(results) == 5
    t = tally_delegations({}, results)
    d = t[("ops-lead", "deployer")]
    assert (d.successes, d.partials, d.failures, d.results) == (2, 1, 1, 4)
    assert d.success_rate == 0.5  # a partial is not a success
    assert t[("ops-lead", "support")].success_rate == 0.0
    # Folding in two batches is the same as in one; the prior is not changed.
    first = tally_delegations({}, results[:2])
    snapshot = dict(first)
    assert tally_delegations(first, results[2:]) == t and first == snapshot


@pytest.mark.parametrize(
    ("s", "f", "failing"),
    [
        (0, 4, False),  # 4 results: too few to call
        (0, 5, True),
        (2, 3, True),  # 0.4
        (2, 2, False),  # 0.5 is not below 0.5 (and 4 results)
        (3, 3, False),  # 0.5
        (3, 4, True),  # 0.43
    ],
)
def test_failing_pairs(s, f, failing):
    assert DelegationTally("a", "b", successes=s, failures=f).failing is failing


def test_failing_pairs_worst_first():
    tallies = {
        ("a", "b"): DelegationTally("a", "b", 2, 0, 3),
        ("a", "c"): DelegationTally("a", "c", 0, 0, 6),
        ("a", "d"): DelegationTally("a", "d", 9, 0, 1),
        ("b", "c"): DelegationTally("b", "c", 0, 1, 9),
    }
    assert [(t.delegator, t.delegatee) for t in failing_pairs(tallies)] == [("b", "c"), ("a", "c"), ("a", "b")]


def test_an_empty_tally_has_rate_zero():
    assert DelegationTally("a", "b").success_rate == 0.0


# ---- scope promotion -----------------------------------------------------------------------


def fleet(member_rate: str = "moderate", lead_rate: str = "moderate") -> dict[str, AgentSpec]:
    specs = [
        AgentSpec(name="lead", learning_rate=LearningRate(lead_rate)),
        AgentSpec(name="lead2", learning_rate=LearningRate(lead_rate)),
        AgentSpec(name="lead3"),
        AgentSpec(name="solo", learning_rate=LearningRate.AGGRESSIVE),
    ]
    specs += [AgentSpec(name=f"m{i}", reports_to="lead", learning_rate=LearningRate(member_rate)) for i in range(4)]
    specs += [AgentSpec(name=f"n{i}", reports_to="lead2") for i in range(2)]
    specs += [AgentSpec(name="o0", reports_to="lead3")]
    specs += [AgentSpec(name="x", reports_to="lead2", knowledge_scopes=["lead"])]
    return {s.name: s for s in specs}


def use(
    agent: str,
    scope: str | None = None,
    minute: int = 0,
    stmt: tuple[str, str, str] = ("api:api.x.io", "rate_limit", "rate:10/s"),
    conf: float = 0.9,
) -> FactUsed:
    s, p, t = stmt
    return FactUsed(
        schema_version=1,
        agent=agent,
        session_id=f"{agent}-{minute}",
        briefing_id="b",
        triple_id="t",
        source=s,
        predicate=p,
        target=t,
        scope=scope or f"agent:{agent}",
        confidence=conf,
        entity="api.x.io",
        seq=1,
        used_at=T0 + timedelta(minutes=minute),
    )


@pytest.mark.parametrize("rate", ["conservative", "moderate", "aggressive"])
def test_agent_to_team_at_the_members_threshold_of_the_learning_rate(rate):
    agents = fleet(member_rate=rate)
    need = PROMOTION_THRESHOLDS[LearningRate(rate)].members
    fold = PromotionFold()
    out: list[FactPromoted] = []
    for i in range(need):
        assert out == [], f"promoted after {i} members"
        out = fold.apply(agents, [use(f"m{i}", minute=i), use(f"m{i}", minute=i + 10)])  # repeats do not count
    assert len(out) == 1
    p = out[0]
    assert (p.from_scope, p.to_scope, p.reason, p.learning_rate, p.threshold) == (
        "agent:m0",
        "team:lead",
        PromotionReason.UTILISATION,
        rate,
        need,
    )
    assert p.users == [f"m{i}" for i in range(need)] and p.teams == ["team:lead"]
    assert p.promoted_at == T0 + timedelta(minutes=need - 1)


@pytest.mark.parametrize("rate", ["conservative", "moderate", "aggressive"])
def test_team_to_global_at_the_teams_threshold_of_the_leads_learning_rate(rate):
    agents = fleet(lead_rate=rate)
    need = PROMOTION_THRESHOLDS[LearningRate(rate)].teams
    users = ["m0", "m1", "x", "solo"]  # teams: lead, lead, lead2 (via knowledgeScopes), solo (a team of one)
    fold = PromotionFold()
    out = []
    distinct = set()
    for i, u in enumerate(users):
        out = fold.apply(agents, [use(u, scope="team:lead", minute=i)])
        distinct.add(team_of(agents, u))
        if out:
            break
    assert len(distinct) == need and len(out) == 1
    assert (out[0].from_scope, out[0].to_scope, out[0].learning_rate) == ("team:lead", "global", rate)


def test_each_copy_obeys_its_owners_learning_rate():
    agents = fleet(member_rate="conservative")
    agents["m1"] = AgentSpec(name="m1", reports_to="lead", learning_rate=LearningRate.AGGRESSIVE)
    fold = PromotionFold()
    assert fold.apply(agents, [use("m0")]) == []  # conservative m0 needs 3 members
    out = fold.apply(agents, [use("m1", minute=1)])  # aggressive m1's copy needs 1: it moves
    assert [(p.from_scope, p.learning_rate, p.threshold) for p in out] == [("agent:m1", "aggressive", 1)]


def test_counters_restart_after_a_promotion_and_narrower_copies_stop_counting():
    agents = fleet()
    fold = PromotionFold()
    fold.apply(agents, [use("m0"), use("m1")])
    key = statement_key("api:api.x.io", "rate_limit", "rate:10/s")
    assert fold.states[key].tallies == {} and fold.states[key].promoted == ["team:lead"]
    assert fold.apply(agents, [use("m2"), use("m3")]) == []  # already in team:lead
    assert fold.states[key].tallies == {}
    # Uses of the team copy now count toward global.
    out = fold.apply(agents, [use("m0", scope="team:lead", minute=5), use("x", scope="team:lead", minute=6)])
    assert [(p.to_scope, p.teams) for p in out] == [("global", ["team:lead", "team:lead2"])]
    assert fold.apply(agents, [use("n0", scope="team:lead2")]) == []  # already global


def test_a_manual_promotion_resets_the_counters():
    agents = fleet(member_rate="conservative")
    fold = PromotionFold()
    fold.apply(agents, [use("m0"), use("m1")])
    key = statement_key("api:api.x.io", "rate_limit", "rate:10/s")
    assert fold.states[key].tallies["team:lead"].users == ["m0", "m1"]
    [manual] = manual_promotions(
        agents,
        [
            {
                "source": "api:api.x.io",
                "predicate": "rate_limit",
                "target": "rate:10/s",
                "scope": "agent:m0",
                "confidence": 0.8,
                "valid_to": None,
            }
        ],
        "api.x.io",
        "rate_limit",
        "10/s",
        "team",
        T0,
    )
    assert fold.apply(agents, [manual]) == []
    assert fold.states[key] == StatementState(tallies={}, promoted=["team:lead"])
    assert fold.apply(agents, [use("m2")]) == []


def test_statements_are_counted_apart():
    agents = fleet()
    fold = PromotionFold()
    assert fold.apply(agents, [use("m0"), use("m1", stmt=("tool:a", "calls", "api:b"))]) == []


@pytest.mark.parametrize(
    ("scope", "target"),
    [
        ("agent:m0", "team:lead"),
        ("agent:solo", None),
        ("agent:ghost", None),
        ("team:lead", "global"),
        ("team:ghost", "global"),
        ("global", None),
    ],
)
def test_promotion_targets(scope, target):
    assert promotion_target(fleet(), scope) == target


def test_an_agent_without_a_team_keeps_its_facts_private():
    assert PromotionFold().apply(fleet(), [use("solo"), use("solo", minute=1)]) == []


def test_learning_rate_of_a_scope():
    agents = fleet(member_rate="aggressive", lead_rate="conservative")
    assert learning_rate_of(agents, "agent:m0") is LearningRate.AGGRESSIVE
    assert learning_rate_of(agents, "team:lead") is LearningRate.CONSERVATIVE
    assert learning_rate_of(agents, "team:ghost") is LearningRate.MODERATE


def test_count_use_does_not_change_its_input():
    agents = fleet(member_rate="conservative")
    st0, _ = count_use(None, use("m0"), agents)
    snap = msgspec.json.encode(st0)
    count_use(st0, use("m1"), agents)
    assert msgspec.json.encode(st0) == snap


uses = st.lists(
    st.builds(
        use,
        agent=st.sampled_from(["m0", "m1", "m2", "m3", "n0", "x", "solo", "o0"]),
        scope=st.sampled_from([None, "team:lead", "team:lead2", "global"]),
        minute=st.integers(0, 50),
        stmt=st.sampled_from([("api:a.io", "rate_limit", "rate:1/s"), ("tool:t", "calls", "api:b")]),
    ),
    max_size=40,
)


@settings(max_examples=100, deadline=None)
@given(uses, st.sampled_from(["conservative", "moderate", "aggressive"]), st.integers(0, 40))
def test_replay_and_batching_and_partitioning_give_the_same_promotions(log, rate, cut):
    agents = fleet(member_rate=rate, lead_rate=rate)
    whole = PromotionFold().apply(agents, log)
    fold = PromotionFold()
    assert fold.apply(agents, log[:cut]) + fold.apply(agents, log[cut:]) == whole
    # Partitioned by statement, each partition folded on its own: the same events per statement.
    by_key: dict[str, list[FactUsed]] = {}
    for u in log:
        by_key.setdefault(statement_key(u.source, u.predicate, u.target), []).append(u)
    parted = [p for part in by_key.values() for p in PromotionFold().apply(agents, part)]
    assert sorted(parted, key=lambda p: p.promotion_id) == sorted(whole, key=lambda p: p.promotion_id)
    # State survives a changelog round trip.
    restored = PromotionFold(
        {k: msgspec.json.decode(msgspec.json.encode(v), type=StatementState) for k, v in fold.states.items()}
    )
    assert restored.states == fold.states
    # At most one promotion per statement and target scope.
    keys = [(p.source, p.predicate, p.target, p.to_scope) for p in whole]
    assert len(keys) == len(set(keys))


def test_apply_promotion_marks_and_clears():
    st0 = StatementState()
    p = FactPromoted(
        schema_version=1,
        promotion_id=uuid.UUID(int=1),
        source="s",
        predicate="p",
        target="t",
        from_scope="team:lead",
        to_scope="global",
        reason=PromotionReason.MANUAL,
        promoted_at=T0,
        confidence=1.0,
    )
    assert apply_promotion(st0, p) == StatementState(promoted=["global"])
    assert apply_promotion(apply_promotion(st0, p), p) == StatementState(promoted=["global"])


# ---- manual promotion ----------------------------------------------------------------------


def row(
    scope: str,
    conf: float = 0.9,
    valid_to: datetime | None = None,
    source: str = "api:api.x.io",
    target: str = "rate:10/s",
) -> dict[str, Any]:
    return {
        "source": source,
        "predicate": "rate_limit",
        "target": target,
        "scope": scope,
        "confidence": conf,
        "valid_to": valid_to,
    }


def test_manual_promotion_to_team_moves_each_agent_copy_to_its_team():
    rows = [
        row("agent:m1", 0.7),
        row("agent:m0", 0.8),
        row("agent:n0", 0.6),
        row("agent:solo"),
        row("agent:m2", valid_to=T0),
    ]
    got = manual_promotions(fleet(), rows, "api:api.x.io", "rate_limit", "rate:10/s", "team", T0)
    assert [(p.from_scope, p.to_scope, p.confidence, p.reason) for p in got] == [
        ("agent:m0", "team:lead", 0.8, PromotionReason.MANUAL),
        ("agent:n0", "team:lead2", 0.6, PromotionReason.MANUAL),
    ]
    assert (
        got[0].promotion_id
        == manual_promotions(fleet(), rows, "api.x.io", "Rate Limit", "10/s", "team", T0)[0].promotion_id
    )


def test_manual_promotion_to_global_takes_the_widest_copy():
    got = manual_promotions(
        fleet(),
        [row("agent:m0"), row("team:lead2", 0.5), row("team:lead", 0.6)],
        "api.x.io",
        "rate_limit",
        "10/s",
        "global",
        T0,
    )
    assert [(p.from_scope, p.to_scope, p.confidence) for p in got] == [("team:lead", "global", 0.6)]
    got = manual_promotions(fleet(), [row("agent:solo")], "api.x.io", "rate_limit", "10/s", "global", T0)
    assert [(p.from_scope, p.to_scope) for p in got] == [("agent:solo", "global")]


@pytest.mark.parametrize(
    ("rows", "to", "match"),
    [
        ([], "team", "no active fact"),
        ([row("agent:m0", valid_to=T0)], "team", "no active fact"),
        ([row("agent:m0", target="rate:5/s")], "team", "no active fact"),
        ([row("global")], "global", "already global"),
        ([row("agent:m0"), row("team:lead")], "team", "already in its team"),
        ([row("agent:solo")], "team", "no agent-scoped copy"),
        ([row("agent:m0")], "everyone", "--to must be team or global"),
    ],
)
def test_manual_promotion_errors(rows, to, match):
    with pytest.raises(PromotionError, match=match):
        manual_promotions(fleet(), rows, "api.x.io", "rate_limit", "10/s", to, T0)


def test_a_promotion_becomes_a_fact_in_the_wider_scope_of_the_triple_log():
    fold = KnowledgeFold()
    first = fold.apply(
        [
            FactsExtracted(
                schema_version=1,
                episode_id=uuid.UUID(int=1),
                agent="m0",
                observed_at=T0,
                extractor="trace/1",
                facts=[
                    FactAsserted(
                        source="Book_Reservation",
                        source_type="tool",
                        predicate="failed_with",
                        target="HTTP 429: Too Many Requests",
                        target_type="error",
                        confidence=0.95,
                    )
                ],
            )
        ]
    )
    t = first.triples_inserted[0]
    [p] = manual_promotions(
        fleet(), [msgspec.structs.asdict(t)], t.source, t.predicate, t.target, "team", T0 + timedelta(days=1)
    )
    record = promoted_facts(p)
    assert record.episode_id == p.promotion_id and record.extractor == "promotion/1" and record.agent == "m0"
    ch = fold.apply([record])
    [new] = ch.triples_inserted
    assert (new.source, new.predicate, new.target, new.scope) == (t.source, t.predicate, t.target, "team:lead")
    assert new.confidence == 0.95 and new.valid_from == T0 + timedelta(days=1) and ch.entities == []


def test_the_docstring_examples_run():
    assert doctest.testmod(somnus.processors.knowledge.swarm_metrics).failed == 0
