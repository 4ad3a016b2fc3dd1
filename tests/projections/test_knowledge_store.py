"""KnowledgeStore: every read path returns only facts in the reader's scope chain; as-of reads."""

from __future__ import annotations

import json
import uuid
from datetime import datetime, timedelta, timezone

import duckdb
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from somnus.projections import schema
from somnus.projections.frames import registered
from somnus.projections.knowledge_store import DuckDBBackend, KnowledgeStore
from somnus.schemas.agents import AgentSpec, scope_chain

T0 = datetime(2024, 5, 1, tzinfo=timezone.utc)


def _store(triples: list[dict], agents: dict[str, AgentSpec]) -> KnowledgeStore:
    con = duckdb.connect()
    schema.init(con)
    if triples:
        with registered(con, frame=pa.Table.from_pylist(triples)):
            con.execute(
                "INSERT INTO triples SELECT triple_id::UUID, source, predicate, target, scope, confidence, "
                "count, evidence::UUID, last_evidence::UUID, valid_from, valid_to, superseded_by::UUID, "
                "created_by, extractor FROM frame"
            )
        ents = {t["source"] for t in triples} | {t["target"] for t in triples}
        for e in sorted(ents):
            con.execute(
                "INSERT INTO entity_versions VALUES (?, 1, ?, ?, '{}', ?, ?, NULL)",
                [e, e.split(":", 1)[1], e.split(":", 1)[0], T0, T0],
            )
        schema.refresh_facts_top(con)
        for t in triples:
            con.execute(
                "INSERT INTO triple_history VALUES ((SELECT count(*) FROM triple_history), ?, 'asserted', ?, ?, 1, ?)",
                [t["triple_id"], t["evidence"], t["valid_from"], t["confidence"]],
            )
    return KnowledgeStore(DuckDBBackend(con), agents)


def _triple(
    i: int,
    source: str,
    target: str,
    scope: str,
    valid_from: datetime,
    valid_to: datetime | None = None,
    predicate: str = "uses",
    confidence: float = 0.9,
) -> dict:
    return {
        "triple_id": str(uuid.UUID(int=i + 1)),
        "source": source,
        "predicate": predicate,
        "target": target,
        "scope": scope,
        "confidence": confidence,
        "count": 1,
        "evidence": str(uuid.UUID(int=10_000 + i)),
        "last_evidence": None,
        "valid_from": valid_from,
        "valid_to": valid_to,
        "superseded_by": None,
        "created_by": scope.split(":")[-1],
        "extractor": "test",
    }


names = st.sampled_from(["a", "b", "c", "d", "e", "f"])


@st.composite
def fleets(draw):
    """Random agents with random reportsTo / knowledgeScopes, and random facts in random scopes."""
    agent_names = draw(st.lists(names, min_size=1, max_size=6, unique=True))
    agents = {}
    for n in agent_names:
        boss = draw(st.one_of(st.none(), st.sampled_from(agent_names)))
        extra = draw(st.lists(st.sampled_from(agent_names + ["other"]), max_size=2, unique=True))
        agents[n] = AgentSpec(name=n, reports_to=boss if boss != n else None, knowledge_scopes=extra)
    scopes = (
        ["global"] + [f"agent:{n}" for n in agent_names + ["stranger"]] + [f"team:{n}" for n in agent_names + ["other"]]
    )
    triples = []
    for i in range(draw(st.integers(0, 25))):
        start = T0 + timedelta(hours=draw(st.integers(0, 48)))
        end = draw(st.one_of(st.none(), st.integers(1, 48).map(lambda h, s=start: s + timedelta(hours=h))))
        triples.append(
            _triple(
                i,
                f"tool:t{draw(st.integers(0, 4))}",
                f"error:e{draw(st.integers(0, 4))}",
                draw(st.sampled_from(scopes)),
                start,
                end,
                confidence=draw(st.floats(0.5, 1.0)),
            )
        )
    reader = draw(st.sampled_from(agent_names + ["stranger"]))
    return agents, triples, reader


@settings(max_examples=60, deadline=None)
@given(fleets())
def test_no_read_path_returns_a_fact_outside_the_readers_scope_chain(fleet):
    agents, triples, reader = fleet
    store = _store(triples, agents)
    chain = set(scope_chain(agents, reader))
    by_id = {t["triple_id"]: t for t in triples}
    allowed_ids = {t["triple_id"] for t in triples if t["scope"] in chain}
    allowed_entities = {t[k] for t in triples if t["scope"] in chain for k in ("source", "target")}

    for fact in store.facts(reader, limit=1000):
        assert fact.scope in chain
    assert {f.triple_id for f in store.facts(reader, limit=1000)} == {
        i for i in allowed_ids if by_id[i]["valid_to"] is None
    }
    # the best-facts read (served from facts_top) equals the best of the chain computed here
    active = sorted(
        (t for t in triples if t["scope"] in chain and t["valid_to"] is None),
        key=lambda t: (-t["confidence"], -t["count"], t["triple_id"]),
    )
    assert [f.triple_id for f in store.facts(reader, limit=3)] == [t["triple_id"] for t in active[:3]]
    for hours in (0, 12, 30, 96):
        for fact in store.as_of(reader, T0 + timedelta(hours=hours), limit=1000):
            assert fact.scope in chain
    assert {f.triple_id for f in store.triples(reader)} == allowed_ids
    assert {e.entity_id for e in store.entities(reader, limit=1000)} == allowed_entities
    for entity in {t["source"] for t in triples} | {t["target"] for t in triples}:
        for change in store.history(reader, entity):
            assert change.scope in chain and change.triple_id in allowed_ids


def test_scope_chain_follows_reports_to_and_knowledge_scopes():
    agents = {
        "lead": AgentSpec(name="lead"),
        "a": AgentSpec(name="a", reports_to="lead"),
        "b": AgentSpec(name="b", reports_to="lead", knowledge_scopes=["team:ops", "ops", "data"]),
    }
    assert scope_chain(agents, "a") == ["agent:a", "team:lead", "global"]
    assert scope_chain(agents, "b") == ["agent:b", "team:lead", "team:ops", "team:data", "global"]
    # An agent without reportsTo has no team: only its own scope and global.
    assert scope_chain(agents, "lead") == ["agent:lead", "global"]


def test_a_teammate_sees_team_facts_but_not_another_agents_private_ones():
    agents = {
        "lead": AgentSpec(name="lead"),
        "a": AgentSpec(name="a", reports_to="lead"),
        "b": AgentSpec(name="b", reports_to="lead"),
    }
    store = _store(
        [
            _triple(0, "tool:x", "error:y", "agent:a", T0),
            _triple(1, "tool:x", "error:z", "team:lead", T0),
            _triple(2, "api:h", "concept:10/s", "global", T0, predicate="rate_limit"),
        ],
        agents,
    )
    assert sorted(f.target for f in store.facts("b")) == ["concept:10/s", "error:z"]
    assert sorted(f.target for f in store.facts("a")) == ["concept:10/s", "error:y", "error:z"]


def test_as_of_returns_the_facts_active_at_that_time():
    agents = {"a": AgentSpec(name="a")}
    t1, t2 = T0 + timedelta(days=1), T0 + timedelta(days=2)
    store = _store(
        [
            _triple(0, "api:h", "concept:10/s", "agent:a", T0, t1, predicate="rate_limit"),
            _triple(1, "api:h", "concept:5/s", "agent:a", t1, t2, predicate="rate_limit"),
            _triple(2, "api:h", "concept:20/s", "agent:a", t2, None, predicate="rate_limit"),
        ],
        agents,
    )
    at = lambda t: [f.target for f in store.as_of("a", t, predicate="rate_limit")]  # noqa: E731
    assert at(T0 - timedelta(seconds=1)) == []
    assert at(T0) == ["concept:10/s"]
    assert at(t1 - timedelta(microseconds=1)) == ["concept:10/s"]
    assert at(t1) == ["concept:5/s"]  # valid_to is exclusive, valid_from inclusive
    assert at(t2 + timedelta(days=300)) == ["concept:20/s"]
    assert [f.target for f in store.facts("a")] == ["concept:20/s"]


def test_facts_are_sorted_by_confidence_and_limited():
    agents = {"a": AgentSpec(name="a")}
    store = _store(
        [_triple(i, f"tool:t{i}", "error:e", "agent:a", T0, confidence=c) for i, c in enumerate([0.6, 0.95, 0.8, 1.0])],
        agents,
    )
    assert [f.confidence for f in store.facts("a")] == [1.0, 0.95, 0.8, 0.6]
    assert [f.confidence for f in store.facts("a", limit=2, min_confidence=0.7)] == [1.0, 0.95]


def test_raw_sql_is_read_only():
    store = _store([], {})
    assert store.sql("SELECT 1 AS one") == [{"one": 1}]
    from somnus.projections.queries import NotReadOnly

    with pytest.raises(NotReadOnly):
        store.sql("DELETE FROM triples")
    assert json.dumps(store.sql("SELECT count(*) AS n FROM triples")) == '[{"n": 0}]'


def test_refreshing_only_the_touched_scopes_equals_a_full_refresh():
    agents = {"a": AgentSpec(name="a")}
    rows = [
        _triple(i, f"tool:t{i}", "error:e", f"agent:{'ab'[i % 2]}", T0, confidence=0.5 + i / 100) for i in range(30)
    ]
    store = _store(rows, agents)
    con = store.backend.con  # type: ignore[attr-defined]
    con.execute("UPDATE triples SET confidence = 0.99 WHERE triple_id = ?", [rows[2]["triple_id"]])
    con.execute("UPDATE triples SET valid_to = ? WHERE triple_id = ?", [T0, rows[28]["triple_id"]])
    schema.refresh_facts_top(con, ["agent:a"])
    partial = sorted(con.execute("SELECT * FROM facts_top").fetchall(), key=str)
    schema.refresh_facts_top(con)
    assert sorted(con.execute("SELECT * FROM facts_top").fetchall(), key=str) == partial
    assert store.facts("a", limit=1)[0].triple_id == rows[2]["triple_id"]


def test_a_readers_user_filter_comes_before_the_best_facts_cut():
    """The best FACTS_TOP_K facts of a scope may all be another user's: a reader acting for user u2
    still gets u2's facts (filtered before ranking), and none of u1's."""
    agents = {"a": AgentSpec(name="a")}
    n = schema.FACTS_TOP_K + 5
    rows = [_triple(i, f"tool:t{i}", "error:e", "agent:a", T0, confidence=0.99) for i in range(n)]
    rows.append(_triple(n, "tool:mine", "error:e", "agent:a", T0, confidence=0.5))
    store = _store(rows, agents)
    con = store.backend.con  # type: ignore[attr-defined]
    for t in rows:
        con.execute(
            "INSERT INTO episodes (episode_id, agent, session_id, outcome, user_id) VALUES (?, 'a', ?, 'success', ?)",
            [t["evidence"], t["triple_id"], "u2" if t["source"] == "tool:mine" else "u1"],
        )
    got = store.facts("a", limit=10, for_user=True, user_id="u2")
    assert [f.source for f in got] == ["tool:mine"]
    theirs = {f.source for f in store.facts("a", limit=10, for_user=True, user_id="u1")}
    assert len(theirs) == 10 and "tool:mine" not in theirs
    assert store.facts("a", limit=10, for_user=True, user_id=None) == []  # no user-less episode said any


def test_history_and_entities_for_a_user_show_only_what_its_episodes_did():
    """A statement both users' sessions gave: u2 reads it, but not the change u1's episode made, and
    not the entity attributes u1's episode set (they would show u1's text)."""
    agents = {"a": AgentSpec(name="a")}
    shared = _triple(0, "tool:search", "error:upstream", "agent:a", T0)
    only_u1 = _triple(1, "tool:private", "error:upstream", "agent:a", T0)
    store = _store([shared, only_u1], agents)
    con = store.backend.con  # type: ignore[attr-defined]
    u1, u2 = shared["evidence"], str(uuid.UUID(int=99))
    con.execute(
        "INSERT INTO triple_history VALUES (9, ?, 'reinforced', ?, ?, 2, 0.95)",
        [shared["triple_id"], u2, T0 + timedelta(hours=1)],
    )
    for ep, user in ((u1, "u1"), (u2, "u2"), (only_u1["evidence"], "u1")):
        con.execute(
            "INSERT INTO episodes (episode_id, agent, session_id, outcome, user_id) VALUES (?, 'a', ?, 'success', ?)",
            [ep, ep, user],
        )
        con.execute("INSERT INTO knowledge_inputs VALUES (?, 'test', 'a', ?, 1, 1, 0)", [ep, T0])
    con.execute(
        "INSERT INTO entity_versions VALUES ('error:upstream', 2, 'upstream', 'error', "
        '\'{"example": "503 from 10.0.1.77"}\', ?, ?, ?)',
        [T0, T0, u1],
    )

    def changes(**kw: object) -> list[str]:
        return [c.episode_id for c in store.history("a", "tool:search", **kw)]

    assert sorted(changes()) == sorted([u1, u2])  # an agent reader: every change
    assert changes(for_user=True, user_id="u2") == [u2]
    assert changes(for_user=True, user_id="u1") == [u1]
    assert store.history("a", "tool:private", for_user=True, user_id="u2") == []
    by_user = {
        u: {e.entity_id: e.attributes for e in store.entities("a", for_user=True, user_id=u)} for u in ("u1", "u2")
    }
    assert by_user["u1"]["error:upstream"] == {"example": "503 from 10.0.1.77"}
    assert by_user["u2"]["error:upstream"] == {} and "tool:private" not in by_user["u2"]
    assert {e.entity_id: e.attributes for e in store.entities("a")}["error:upstream"] != {}
