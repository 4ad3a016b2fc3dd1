"""somnus.projections.advice and the advise route on real data: tau-bench airline and the sample fleet,
projected by the projector's apply_batch into a real DuckDB file (no broker)."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from somnus.bench.advise import distilled, project, sample_episodes
from somnus.importers import import_run, openai_chat
from somnus.processors.prediction.advise import advise
from somnus.projections import api
from somnus.projections.advice import advice_inputs

TAU_BENCH = Path(__file__).resolve().parents[3] / "shared" / "datasets" / "tau-bench-airline" / "gpt-4o-airline.json"
FAILING = {"update_reservation_flights": (42, 104), "book_reservation": (30, 53)}


@pytest.fixture(scope="module")
def tau_con(tmp_path_factory):
    if not TAU_BENCH.exists():
        pytest.skip(f"dataset missing: {TAU_BENCH}")
    con = duckdb.connect(str(tmp_path_factory.mktemp("advise") / "tau.duckdb"))
    project(con, distilled(list(openai_chat(TAU_BENCH, agent="airline", run=import_run()))))
    yield con
    con.close()


@pytest.mark.parametrize(
    "task, tool",
    [
        ("I want to change the flights on my reservation to a later date", "update_reservation_flights"),
        ("Hi, I'd like to book a one-way flight from New York to Seattle", "book_reservation"),
    ],
)
def test_tau_bench_the_unreliable_tool_is_a_risk_with_its_observed_error_rate(tau_con, task, tool):
    got = advise("airline", task, advice_inputs(tau_con, "airline"))
    risks = {r.tool: r for r in got.risks}
    assert tool in risks, [r.tool for r in got.risks]
    r = risks[tool]
    errors, calls = FAILING[tool]
    assert (r.errors, r.calls) == (errors, calls)  # exact counts behind the links
    assert r.strength == pytest.approx(errors / calls, abs=0.05)  # the NAc's V: a moving average near the rate
    assert r.error_classes and all(o.startswith("error:") for o, _ in r.error_classes)
    assert r.failed_in > 0 and r.episode_ids  # provenance: related episodes where it failed
    assert got.planning and all(s.successes > 0 and s.episode_ids for s in got.planning)


def test_tau_bench_both_unreliable_tools_for_a_task_that_needs_both(tau_con):
    got = advise(
        "airline", "book a new flight and change the flights of my other reservation", advice_inputs(tau_con, "airline")
    )
    assert set(FAILING) <= {r.tool for r in got.risks}
    assert all(r.tool in FAILING or r.strength < 0.1 for r in got.risks)  # reliable tools are no risk
    # salience from the extracted facts: entities of related successes, never the asking agent itself
    assert got.salience and "agent:airline" not in {s.entity for s in got.salience}
    assert all(s.lift > 0 and s.episode_ids for s in got.salience)


def test_tau_bench_provenance_names_projected_episodes_and_memories(tau_con):
    got = advise("airline", "cancel my reservation", advice_inputs(tau_con, "airline"))
    ids = {i for s in got.planning for i in s.episode_ids} | set(got.escalation.episode_ids)
    assert ids
    known = {str(r[0]) for r in tau_con.execute("SELECT episode_id FROM episodes").fetchall()}
    assert ids <= known


def test_the_route_answers_like_the_function_and_rejects_a_missing_task(tau_con):
    service = api.ReadService(tau_con, {})
    route = next(r for r in api.all_routes() if r.handler == "advise")
    assert route.path == "/agents/{agent}/advise"
    task = "change my flight"
    got = api.call(service, route, "airline", {"task": task})
    assert got["risks"][0]["tool"] == advise("airline", task, advice_inputs(tau_con, "airline")).risks[0].tool
    with pytest.raises(api.BadRequest, match="task"):
        api.call(service, route, "airline", {})
    with pytest.raises(api.BadRequest, match="unknown parameter"):
        api.call(service, route, "airline", {"task": task, "bogus": 1})
    # another agent's episodes are not read: a stranger has no related past
    assert api.call(service, route, "stranger", {"task": task})["related"] == 0


def test_sample_fleet_gives_strategies_and_risks(tmp_path):
    eps = sample_episodes(200, seed=7)
    con = duckdb.connect(str(tmp_path / "fleet.duckdb"))
    project(con, eps)
    agents = sorted({e.agent for e in eps})
    answered = [
        advise(a, t, advice_inputs(con, a))
        for a in agents
        for t in sorted({e.task for e in eps if e.agent == a and e.task})[:2]
    ]
    con.close()
    assert any(a.planning for a in answered) and any(a.risks for a in answered)
    for a in answered:
        for r in a.risks:
            assert 0.1 <= r.strength <= 1.0 and r.calls >= r.errors


def test_sample_fleet_risks_are_the_nac_strengths_and_exact_counts(tmp_path):
    from somnus.processors.prediction.causal_links import learn, observations_from_episode, tool_counts
    from somnus.schemas.causal import tool_signature

    eps = sample_episodes(150, seed=11)
    con = duckdb.connect(str(tmp_path / "fleet.duckdb"))
    project(con, eps)
    observed = [o for off, ep in enumerate(eps) for o in observations_from_episode(ep, 0, off)]
    states, _ = learn({}, observed)  # learned here, independently of the projected rows
    counts = tool_counts(observed)
    checked = 0
    for agent in sorted({e.agent for e in eps}):
        inputs = advice_inputs(con, agent)
        for task in sorted({e.task for e in eps if e.agent == agent and e.task})[:3]:
            for r in advise(agent, task, inputs).risks:
                state = states[tool_signature(r.tool)]
                want = sum(link.strength for link in state.links.values() if link.valence.value == "negative")
                assert r.strength == pytest.approx(want, abs=1e-9)
                assert (r.calls, r.errors) == (counts[r.tool].calls, counts[r.tool].errors)
                checked += 1
    con.close()
    assert checked > 0


def test_the_cache_keeps_inputs_until_the_store_version_moves(tmp_path):
    from somnus.projections.advice import AdviceCache

    eps = sample_episodes(40, seed=5)
    con = duckdb.connect(str(tmp_path / "c.duckdb"))
    project(con, eps)
    agent = eps[0].agent
    cache = AdviceCache()
    first = cache.inputs_for(con, agent, version=1)
    assert cache.inputs_for(con, agent, version=1) is first
    assert cache.inputs_for(con, agent, version=2) is not first
    # without a version from the caller, the projected offsets are read: a new batch's offset empties it
    read = cache.inputs_for(con, agent)
    assert cache.inputs_for(con, agent) is read
    con.execute("UPDATE projection_offsets SET next_offset = next_offset + 1 WHERE topic = 'episodes'")
    assert cache.inputs_for(con, agent) is not read
    con.close()
