"""The semantic fold in the projector (real DuckDB file; records built here, no broker)."""

from __future__ import annotations

import json
import math
import uuid
from datetime import datetime, timedelta, timezone

import duckdb
import msgspec

from somnus.processors.prediction.causal_links import learn
from somnus.projections import queries, schema
from somnus.projections.causal import CausalProjection
from somnus.projections.semantic import SemanticProjection, promotion_inputs
from somnus.projections.writer import ReadModels, Topics, apply_batch, load_offsets
from somnus.schemas.causal import LinkLevel, OutcomeObserved, Valence, outcome_signature, tool_signature
from somnus.schemas.codec import encode
from somnus.schemas.semantic import KIND_PROMOTE, CallOutcome, CausalLinkView, PromotionRequested
from tests.factories import Rec

TOPICS = Topics("traces", "episodes", "dead-letters", "facts", "link-updates", "memory", "working-memory", "semantic")
T0 = datetime(2024, 5, 1, tzinfo=timezone.utc)
SEMANTIC_TABLES = ("semantic_log", "semantic_requests", "concepts", "promotion_audit", "cross_layer_edges")


def _request(request_id: str | None) -> PromotionRequested:
    """A tool that failed 12 times in 20 calls, against a fleet base rate of 10% failures."""
    calls = [CallOutcome("pay", i % 5 >= 3 or i < 4, T0 + timedelta(hours=7 * i), f"e{i}", "a") for i in range(20)]
    failed = [c for c in calls if not c.ok]
    link = CausalLinkView(
        event_signature="sig-pay",
        tool="pay",
        outcome="error",
        valence="negative",
        strength=0.6,
        confidence=0.9,
        observation_count=len(failed),
        observation_times=[c.at for c in failed],
        source_episode_ids=[c.episode_id for c in failed],
        event_observations=len(calls),
        base_rate=0.1,
    )
    return PromotionRequested(
        owner="global", at=T0 + timedelta(days=7), links=[link], calls=calls, request_id=request_id
    )


def _rec(offset: int, req: PromotionRequested) -> Rec:
    return Rec("semantic", 0, offset, encode(req), key=b"global", headers=[("somnus-kind", KIND_PROMOTE)])


def test_a_request_with_an_id_runs_once_however_often_it_is_published(tmp_path, monkeypatch):
    ran: list[str | None] = []
    real = SemanticProjection.promote

    def counted(self: SemanticProjection, req: PromotionRequested) -> list:
        ran.append(req.request_id)
        return real(self, req)

    monkeypatch.setattr(SemanticProjection, "promote", counted)
    con = duckdb.connect(str(tmp_path / "s.duckdb"))
    schema.init(con)
    seen = ReadModels(con)
    first = apply_batch(con, TOPICS, [_rec(0, _request("sleep:r1"))], load_offsets(con), 1 << 20, seen)
    assert first.semantic_events > 0
    assert con.execute("SELECT request_id, src_offset FROM semantic_requests").fetchall() == [("sleep:r1", 0)]
    before = queries.table_checksums(con)
    again = apply_batch(con, TOPICS, [_rec(1, _request("sleep:r1"))], load_offsets(con), 1 << 20, seen)
    assert again.semantic_events == 0
    # ... also after a restart (the ids are reloaded from the table)
    again = apply_batch(con, TOPICS, [_rec(2, _request("sleep:r1"))], load_offsets(con), 1 << 20, ReadModels(con))
    assert again.semantic_events == 0
    after = queries.table_checksums(con)
    for table in SEMANTIC_TABLES:
        assert after[table] == before[table], table
    # the copies were skipped, not run again (promotion of the same candidates is idempotent anyway);
    # a request without an id (somnus consolidate) and another id do run
    apply_batch(
        con,
        TOPICS,
        [_rec(3, _request(None)), _rec(4, _request("sleep:r2"))],
        load_offsets(con),
        1 << 20,
        ReadModels(con),
    )
    assert ran == ["sleep:r1", None, "sleep:r2"]
    assert con.execute("SELECT count(*) FROM semantic_requests").fetchone()[0] == 2


def _observed(i: int, tool: str, outcome: str) -> OutcomeObserved:
    return OutcomeObserved(
        event_signature=tool_signature(tool),
        level=LinkLevel.TOOL,
        tool=tool,
        outcome_signature=outcome_signature(outcome),
        outcome=outcome,
        valence=Valence.POSITIVE if outcome == "ok" else Valence.NEGATIVE,
        agent="a",
        observed_at=T0 + timedelta(minutes=37 * i),
        context={},
        episode_id=uuid.UUID(int=i + 1),
        src_partition=0,
        src_offset=i,
        index=0,
    )


def test_promotion_reads_the_newest_calls_and_the_links_observations_in_their_span(tmp_path):
    # A request used to carry every tool call of history and every observation of each candidate
    # link: it grew with the stream until the producer refused it. Now: the newest `window_calls`
    # calls, and each link's observations since the oldest of them; the links' totals stay totals.
    con = duckdb.connect(str(tmp_path / "p.duckdb"))
    schema.init(con)
    observed = [_observed(i, "pay" if i % 3 else "book", "ok" if i % 4 else "http:429") for i in range(120)]
    _, updates = learn({}, observed, per_link_rows=False)
    CausalProjection(con).write(con, [msgspec.json.encode(updates)])

    everything = promotion_inputs(con, window_calls=None)
    assert [c.at for c in everything.calls] == [o.observed_at for o in observed]  # all of them, oldest first
    window = promotion_inputs(con, window_calls=50)
    assert window.calls == everything.calls[-50:]
    since = window.calls[0].at
    assert [link.event_signature for link in window.links] == [link.event_signature for link in everything.links]
    for full, cut in zip(everything.links, window.links):
        assert cut.observation_times == [t for t in full.observation_times if t >= since]
        assert cut.source_episode_ids == [
            e for t, e in zip(full.observation_times, full.source_episode_ids) if t >= since
        ]
        assert (cut.observation_count, cut.strength, cut.base_rate) == (
            full.observation_count,
            full.strength,
            full.base_rate,
        )
    assert sum(len(link.observation_times) for link in window.links) == 50  # each call is one tool-level observation
    assert len(msgspec.json.encode(window)) < len(msgspec.json.encode(everything)) / 2


def _fleet_observed(i: int, agent: str, tool: str, outcome: str) -> OutcomeObserved:
    return msgspec.structs.replace(_observed(i, tool, outcome), agent=agent)


def test_promotion_for_an_agent_or_a_team_reads_only_that_scopes_data(tmp_path):
    """An agent's memory learns from its own calls, a team's from its members'; the global owner's
    reads all, and every link names the agents it was observed for."""
    from somnus.processors.prediction.causal_links import DEFAULT_ALPHA
    from somnus.schemas.agents import AgentSpec

    con = duckdb.connect(str(tmp_path / "p.duckdb"))
    schema.init(con)
    # a and b share `pay` (a: mostly ok, b: mostly declined); only b calls `ship`
    observed = []
    for i in range(90):
        agent = "a" if i % 2 else "b"
        tool = "ship" if agent == "b" and i % 3 == 0 else "pay"
        fails = (i % 5 == 0) if agent == "a" else (i % 5 != 0)
        observed.append(_fleet_observed(i, agent, tool, "error:declined" if fails else "ok"))
    _, updates = learn({}, observed, per_link_rows=False)
    CausalProjection(con).write(con, [msgspec.json.encode(updates)])
    fleet = {"lead": AgentSpec(name="lead"), "a": AgentSpec(name="a", reports_to="lead"), "b": AgentSpec(name="b")}

    mine = promotion_inputs(con, "agent:a", min_observations=1, min_confidence=0.0, window_calls=None)
    assert {c.agent for c in mine.calls} == {"a"} and {c.tool for c in mine.calls} == {"pay"}
    assert mine.links and {link.tool for link in mine.links} == {"pay"}
    assert all(link.source_agents == ["a"] for link in mine.links)
    # the scope's links are the NAc's own over a's observations alone
    states, _ = learn({}, [o for o in observed if o.agent == "a"], DEFAULT_ALPHA, per_link_rows=False)
    (state,) = states.values()
    for link in mine.links:
        want = next(v for v in state.links.values() if v.outcome == link.outcome)
        assert math.isclose(link.strength, want.strength, abs_tol=1e-12)
        assert link.observation_count == want.observations and link.event_observations == state.observations
    assert promotion_inputs(con, "team:lead", agents=fleet, window_calls=None).calls == mine.calls  # a is the team
    assert promotion_inputs(con, "team:lead", window_calls=None).calls == []  # no registry: no known member

    everyone = promotion_inputs(con, "global", min_observations=1, min_confidence=0.0, window_calls=None)
    assert {c.agent for c in everyone.calls} == {"a", "b"}
    assert {link.tool: link.source_agents for link in everyone.links} == {"pay": ["a", "b"], "ship": ["b"]}


def test_math_patterns_keep_a_patterns_source_agents_and_old_files_get_the_column(tmp_path):
    old = duckdb.connect(str(tmp_path / "old.duckdb"))
    old.execute(
        "CREATE TABLE math_patterns (owner VARCHAR NOT NULL, math_id VARCHAR NOT NULL, "
        "name VARCHAR NOT NULL, category VARCHAR NOT NULL, domain VARCHAR, summary VARCHAR, query VARCHAR, "
        "confidence DOUBLE NOT NULL, observations BIGINT, confirmed_at TIMESTAMPTZ NOT NULL)"
    )
    schema.init(old)  # a file made before the column
    assert [c[0] for c in old.execute("DESCRIBE math_patterns").fetchall()][-1] == "source_agents"
    sums = []
    for con in (old, duckdb.connect(str(tmp_path / "new.duckdb"))):
        schema.init(con)
        calls = [
            CallOutcome(
                "pay",
                ok=k < 10 - 2 * d,
                at=T0 + timedelta(days=d, hours=k),
                episode_id=f"e{d}-{k}",
                agent="b" if k % 2 else "a",
            )
            for d in range(6)
            for k in range(10)
        ]
        req = PromotionRequested(owner="global", at=T0 + timedelta(days=7), calls=calls)
        apply_batch(con, TOPICS, [_rec(0, req)], load_offsets(con), 1 << 20, ReadModels(con))
        rows = con.execute("SELECT name, source_agents FROM math_patterns").fetchall()
        assert ("stat:tool:pay:success", ["a", "b"]) in rows
        concept = con.execute("SELECT properties->'$.source_agents' FROM concepts WHERE name = 'pay_success_declining'")
        assert [json.loads(r) for (r,) in concept.fetchall()] == [["a", "b"]]
        sums.append(queries.table_checksums(con)["math_patterns"])
    assert sums[0] == sums[1]  # the same content, whichever way the file got the column


def test_a_sleeps_promotion_is_followed_by_atl_and_angular_gyrus_consolidation(tmp_path):
    # Issue 29 item 2: hippocampus (the memory fold's run), promotion, then ATL and Angular Gyrus
    # consolidation (30 days without reinforcement or re-confirmation), then refresh; the run's
    # report lists the semantic layers with what changed.
    from somnus.processors.semantic.layers import snapshot
    from somnus.schemas.semantic import ConceptCreated, Provenance

    con = duckdb.connect(str(tmp_path / "s.duckdb"))
    schema.init(con)
    calls = [
        CallOutcome(
            "pay",
            ok=k < 10 - 2 * d,
            at=T0 + timedelta(days=d, hours=k),
            episode_id=f"e{d}-{k}",
            agent="b" if k % 2 else "a",
        )
        for d in range(6)
        for k in range(10)
    ]
    promoted = PromotionRequested(
        owner="global",
        at=T0 + timedelta(days=7),
        calls=calls,  # concepts, patterns
        links=_request(None).links,
    )
    first = ReadModels(con)
    apply_batch(con, TOPICS, [_rec(0, promoted)], load_offsets(con), 1 << 20, first)
    # and a concept nothing hangs on (every promoted one has relationships, which keep it)
    lone = ConceptCreated(
        owner="global",
        concept_id="c-lone",
        name="lone",
        definition="",
        category="tool",
        provenance=Provenance.AGENT_INFERENCE,
        at=promoted.at,
    )
    first.semantic._owner("global").apply(lone)
    first.semantic._insert(con, [(lone, 0)])
    concepts = con.execute("SELECT count(*) FROM concepts").fetchone()[0]
    patterns = con.execute("SELECT count(*) FROM math_patterns").fetchone()[0]
    assert concepts and patterns
    for run, days in (("sleep-young", 10), ("sleep-old", 40)):
        con.execute(
            "INSERT INTO sleep_runs (run_id, run_at, trigger, report) VALUES (?, ?, 'schedule', ?::JSON)",
            [run, promoted.at + timedelta(days=days), '{"per_layer": {"hippocampus": {"before": 5}}}'],
        )
    seen = ReadModels(con)

    def sleep(offset: int, run: str, days: int) -> None:
        req = PromotionRequested(owner="global", at=promoted.at + timedelta(days=days), request_id=f"sleep:{run}")
        apply_batch(con, TOPICS, [_rec(offset, req)], load_offsets(con), 1 << 20, seen)

    def per_layer(run: str) -> dict:
        """The run's report, hippocampus from sleep_runs, the semantic layers from sleep_layer_reports."""
        out = json.loads(con.execute("SELECT report FROM sleep_runs WHERE run_id = ?", [run]).fetchone()[0])[
            "per_layer"
        ]
        for layer, before, after, removed, added, reinforced in con.execute(
            "SELECT layer, before, after, removed, added, reinforced FROM sleep_layer_reports WHERE run_id = ?", [run]
        ).fetchall():
            out[layer] = {"before": before, "after": after, "removed": removed}
            assert (added, reinforced) == (0, 0)  # these requests carry no inputs: nothing added or reinforced
        return out

    sleep(1, "sleep-young", 10)  # ten days on: nothing is old enough
    assert con.execute("SELECT count(*) FROM semantic_log WHERE kind = 'RecordRemoved'").fetchone()[0] == 0
    assert per_layer("sleep-young")["atl"] == {"after": concepts, "removed": 0, "before": concepts}
    sleep(2, "sleep-old", 40)  # forty days on: what promotion made and nothing reinforced since decays
    removed = dict(
        con.execute(
            "SELECT body->>'layer', count(*) FROM semantic_log WHERE kind = 'RecordRemoved' GROUP BY 1"
        ).fetchall()
    )
    assert removed.get("angular_gyrus", 0) == patterns
    layers = per_layer("sleep-old")
    assert layers["hippocampus"] == {"before": 5}  # the memory fold's part is kept
    assert layers["angular_gyrus"] == {"after": 0, "removed": patterns, "before": patterns}
    assert layers["atl"]["removed"] == removed.get("atl", 0) == 1  # the lone concept
    assert con.execute("SELECT count(*) FROM concepts WHERE concept_id = 'c-lone'").fetchone()[0] == 0
    assert layers["atl"]["after"] == con.execute("SELECT count(*) FROM concepts").fetchone()[0]
    assert con.execute("SELECT count(*) FROM math_patterns").fetchone()[0] == 0
    # replay: the layers rebuilt from the log are the live ones
    rebuilt = ReadModels(con).semantic.layers
    assert {o: snapshot(m) for o, m in rebuilt.items()} == {o: snapshot(m) for o, m in seen.semantic.layers.items()}


def test_a_sleeps_layer_report_does_not_depend_on_where_the_batch_is_cut(tmp_path):
    # A sleep's request followed by a promotion that adds concepts: one batch or two, the report counts
    # the layers as the sleep left them (it once counted them at the batch's end: replay != live).
    calls = [
        CallOutcome(
            "pay",
            ok=k < 10 - 2 * d,
            at=T0 + timedelta(days=d, hours=k),
            episode_id=f"e{d}-{k}",
            agent="b" if k % 2 else "a",
        )
        for d in range(6)
        for k in range(10)
    ]
    records = [
        _rec(0, PromotionRequested(owner="global", at=T0 + timedelta(days=7), request_id="sleep:run-1")),
        _rec(1, PromotionRequested(owner="global", at=T0 + timedelta(days=7), calls=calls, links=_request(None).links)),
    ]
    reports = []
    for cut in (2, 1):
        con = duckdb.connect(str(tmp_path / f"cut{cut}.duckdb"))
        schema.init(con)
        seen = ReadModels(con)
        for part in (records[:cut], records[cut:]):
            if part:
                apply_batch(con, TOPICS, part, load_offsets(con), 1 << 20, seen)
        assert con.execute("SELECT count(*) FROM concepts").fetchone()[0] > 0  # the promotion did add some
        reports.append(
            con.execute(
                "SELECT layer, before, added, reinforced, removed, after FROM sleep_layer_reports ORDER BY layer"
            ).fetchall()
        )
    assert reports[0] == reports[1] == [("angular_gyrus", 0, 0, 0, 0, 0), ("atl", 0, 0, 0, 0, 0)]


def test_a_conversations_abstracted_topics_reach_the_atl_once(tmp_path):
    # Issue 29: a conversation (no tool calls, so no NAc links or statistician patterns) fills its
    # ATL from the topics deep sleep abstracted; each is promoted by the next sleep request only.
    from somnus.projections.semantic import sleep_topics
    from somnus.schemas.lifecycle import PatternAbstracted, PatternSource, encode_lifecycle

    con = duckdb.connect(str(tmp_path / "t.duckdb"))
    schema.init(con)
    run_at = T0 + timedelta(days=3)
    ev = PatternAbstracted(
        run_id="sleep-1",
        seq=5,
        at=run_at,
        pattern_id="p-pottery",
        agent="conv-1",
        key="pottery",
        domains=["conv-1-s1", "conv-1-s2"],
        support=3,
        sources=[PatternSource(f"m{k}", f"conv-1-s{1 + k % 2}") for k in range(3)],
    )
    con.execute(
        "INSERT INTO lifecycle_log VALUES ('sleep-1', 5, 'PatternAbstracted', NULL, ?, ?)",
        [run_at, encode_lifecycle(ev).decode()],
    )
    [topic] = sleep_topics(con)
    assert (topic.key, topic.agent, topic.source_ids) == ("pottery", "conv-1", ["m0", "m1", "m2"])
    assert sleep_topics(con, frozenset({"other"})) == []  # another agent's scope
    con.execute(
        "INSERT INTO sleep_runs (run_id, run_at, trigger, report) VALUES ('sleep-1', ?, 'schedule', '{}')", [run_at]
    )
    req = msgspec.structs.replace(promotion_inputs(con), at=run_at, request_id="sleep:sleep-1")
    assert [t.key for t in req.topics] == ["pottery"]
    apply_batch(con, TOPICS, [_rec(0, req)], load_offsets(con), 1 << 20, ReadModels(con))
    assert con.execute("SELECT name, category FROM concepts").fetchall() == [("pottery", "topic")]
    # the run's report lists what it added (it once counted records and removals only)
    assert con.execute(
        "SELECT before, added, reinforced, removed, after FROM sleep_layer_reports "
        "WHERE run_id = 'sleep-1' AND layer = 'atl'"
    ).fetchone() == (0, 1, 0, 0, 1)
    assert con.execute("SELECT count(*) FROM cross_layer_edges").fetchone()[0] == 6
    assert promotion_inputs(con).topics == []  # promoted: the next request does not carry it again


def test_each_scheduled_run_knows_the_topics_it_abstracted(tmp_path):
    # Each run's request promotes its own topics, so each run's layer report shows what it added, and
    # when the request goes does not change what it carries.
    from somnus.projections.semantic import run_topics
    from somnus.schemas.lifecycle import PatternAbstracted, PatternSource, encode_lifecycle

    con = duckdb.connect(str(tmp_path / "t.duckdb"))
    schema.init(con)
    for run, key in (("run-1", "pottery"), ("run-2", "kiln"), ("run-3", "rain")):
        ev = PatternAbstracted(
            run_id=run,
            seq=1,
            at=T0,
            pattern_id=f"p-{key}",
            agent="c",
            key=key,
            domains=["s1", "s2"],
            support=3,
            sources=[PatternSource(f"m{k}", "s1") for k in range(3)],
        )
        con.execute(
            "INSERT INTO lifecycle_log VALUES (?, 1, 'PatternAbstracted', NULL, ?, ?)",
            [run, T0, encode_lifecycle(ev).decode()],
        )
    assert [t.pattern_id for t in run_topics(con, "run-1")] == ["p-pottery"]
    assert [t.pattern_id for t in run_topics(con, "run-2")] == ["p-kiln"]
    assert run_topics(con, "run-9") == []


def test_a_sleeps_layer_report_lists_what_it_added_reinforced_and_decayed(tmp_path):
    # Issue 29: per layer and per run, counted at the run's request. Two sleeps of a conversation: the
    # first adds topics and their co-occurrence (AG), the second, 31 days later, reinforces one topic by
    # a new session and decays the rest.
    from somnus.schemas.semantic import TopicView

    con = duckdb.connect(str(tmp_path / "t.duckdb"))
    schema.init(con)
    seen = ReadModels(con)

    def topic(key: str, sessions: list[str]) -> TopicView:
        return TopicView(
            pattern_id=f"p-{key}-{len(sessions)}",
            agent="c",
            key=key,
            domains=sessions,
            support=3,
            source_ids=[f"m-{key}-{s}" for s in sessions],
        )

    first = [
        topic("pottery", ["s1", "s4"]),
        topic("kiln", ["s1", "s4"]),
        topic("rain", [f"s{i}" for i in range(5, 25, 3)]),
    ]
    run1 = PromotionRequested(owner="global", at=T0, request_id="sleep:run-1", topics=first)
    run2 = PromotionRequested(
        owner="global", at=T0 + timedelta(days=31), request_id="sleep:run-2", topics=[topic("pottery", ["s1", "s30"])]
    )
    apply_batch(con, TOPICS, [_rec(0, run1), _rec(1, run2)], load_offsets(con), 1 << 20, seen)
    got = {
        (r, layer): counts
        for r, layer, *counts in con.execute(
            "SELECT run_id, layer, before, added, reinforced, removed, after FROM sleep_layer_reports"
        ).fetchall()
    }
    assert got[("run-1", "atl")] == [0, 3, 0, 0, 3]
    assert got[("run-1", "angular_gyrus")] == [0, 1, 0, 0, 1]  # kiln+pottery, 2 of 9 sessions shared
    # run 2: pottery gets session s30 (3 sessions: protected); kiln (2 sessions, idle 31 days) decays,
    # rain (7 sessions) stays; the association is not re-confirmed by a changed record and decays
    assert got[("run-2", "atl")] == [3, 0, 1, 1, 2]
    assert got[("run-2", "angular_gyrus")] == [1, 0, 0, 1, 0]
    # run 3, in a batch of its own: kiln comes back, and so does the association
    run3 = PromotionRequested(
        owner="global",
        at=T0 + timedelta(days=32),
        request_id="sleep:run-3",
        topics=[topic("kiln", ["s1", "s4", "s30"])],
    )
    apply_batch(con, TOPICS, [_rec(2, run3)], load_offsets(con), 1 << 20, seen)
    assert con.execute(
        "SELECT before, added, reinforced, removed, after FROM sleep_layer_reports WHERE run_id = "
        "'run-3' ORDER BY layer"
    ).fetchall() == [(0, 1, 0, 0, 1), (2, 1, 0, 0, 3)]


def test_a_record_removed_and_made_again_in_one_batch_stays_in_the_read_models(tmp_path):
    # Two sleeps 31 days apart in one batch: a topic decays at the second and comes back at the third.
    # The read models once deleted the removals after inserting the batch's rows, losing it.
    from somnus.schemas.semantic import TopicView

    def topic(key: str, sessions: list[str]) -> TopicView:
        return TopicView(
            pattern_id=f"p-{key}-{'-'.join(sessions)}",
            agent="c",
            key=key,
            domains=sessions,
            support=3,
            source_ids=[f"m-{key}-{s}" for s in sessions],
        )

    con = duckdb.connect(str(tmp_path / "t.duckdb"))
    schema.init(con)
    seen = ReadModels(con)
    rain = topic("rain", [f"s{i}" for i in range(5, 25, 3)])
    reqs = [
        PromotionRequested(owner="global", at=T0 + timedelta(days=d), request_id=f"sleep:run-{i}", topics=ts)
        for i, (d, ts) in enumerate(
            (
                (0, [topic("pottery", ["s1", "s4"]), topic("kiln", ["s1", "s4"]), rain]),
                (31, []),
                (32, [topic("kiln", ["s1", "s4", "s30"]), topic("pottery", ["s1", "s4", "s30"])]),
            )
        )
    ]
    apply_batch(con, TOPICS, [_rec(i, r) for i, r in enumerate(reqs)], load_offsets(con), 1 << 20, seen)
    m = seen.semantic.layers["global"]
    assert sorted(n for (n,) in con.execute("SELECT name FROM concepts").fetchall()) == ["kiln", "pottery", "rain"]
    assert sorted(c.name for c in m.atl) == ["kiln", "pottery", "rain"]
    assert (
        {i for (i,) in con.execute("SELECT DISTINCT math_id FROM math_patterns").fetchall()}
        == {r.math_id for r in m.ag}
        != set()
    )
    edges = con.execute("SELECT count(*) FROM cross_layer_edges").fetchone()[0]
    assert edges == len(m.cross)


def test_the_links_as_of_a_sleep_are_the_same_however_far_the_updates_were_folded(tmp_path):
    """Cause 3 (docs/design/scale-out.md): a sleep's promotion snapshot read the causal links as far as
    the projector had folded them when it published the request. ``links_as_of`` reads them as the
    worker learned them up to the sleep's time: the same with the later updates folded or not, equal
    to the links of the observations up to then, and with no time limit to ``causal_links``."""
    import random
    import uuid as uuid_mod

    from somnus.processors.prediction.causal_links import learn, observations_from_episode
    from somnus.projections.causal import CausalProjection
    from somnus.projections.semantic import links_as_of
    from somnus.schemas.episodes import CallSeen
    from tests.factories import distilled_episode

    rng = random.Random(5)
    observed = []
    for i in range(120):  # episodes an hour apart, each a few calls of three tools
        at = T0 + timedelta(hours=i)
        calls = [
            CallSeen(tool=rng.choice(["search", "book", "pay"]), ok=rng.random() < 0.6, at=at + timedelta(minutes=k))
            for k in range(rng.randint(1, 3))
        ]
        ep = distilled_episode(
            calls,
            agent=rng.choice(["airline", "support"]),
            ended=at,
            episode_id=uuid_mod.UUID(int=i + 1),
            session_id=f"s{i}",
        )
        observed += observations_from_episode(ep, src_partition=i % 2, src_offset=i)
    alphas = {"airline": 0.1, "support": 0.3}  # the worker's per-agent learning rates, kept
    _, updates = learn({}, observed, alpha_by_agent=alphas, per_link_rows=False)
    cut = T0 + timedelta(hours=70, minutes=30)
    first = sum(1 for u in updates if u.observed_at <= cut)

    def db(name: str, parts: list[list[object]]) -> duckdb.DuckDBPyConnection:
        con = duckdb.connect(str(tmp_path / name))
        schema.init(con)
        proj = CausalProjection(con)
        for part in parts:
            proj.write(con, [msgspec.json.encode(part)])
        return con

    early, whole = db("early.duckdb", [updates[:first]]), db("whole.duckdb", [updates[:first], updates[first:]])
    assert links_as_of(early, cut) == links_as_of(whole, cut)  # the later updates folded or not
    _, upto = learn({}, [o for o in observed if o.observed_at <= cut], alpha_by_agent=alphas, per_link_rows=False)
    assert links_as_of(whole, cut) == links_as_of(db("upto.duckdb", [upto]), datetime(2100, 1, 1, tzinfo=timezone.utc))
    live = whole.execute(
        "SELECT event_signature, outcome_signature, tool, outcome, valence, strength, observations, "
        "event_observations, confidence FROM causal_links WHERE level = 'tool'"
    ).fetchall()
    never = links_as_of(whole, datetime(2100, 1, 1, tzinfo=timezone.utc))
    assert sorted(never) == sorted(live) and len(never) >= 6
    assert links_as_of(whole, cut) != never  # the cut is felt
    assert promotion_inputs(early, as_of=cut).links == promotion_inputs(whole, as_of=cut).links
    assert promotion_inputs(early, as_of=cut).calls == promotion_inputs(whole, as_of=cut).calls
