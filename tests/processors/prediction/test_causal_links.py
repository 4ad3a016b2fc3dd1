"""somnus.processors.prediction.causal_links: Rescorla-Wagner causal links from episodes, redelivery-proof, and predictions."""

from __future__ import annotations

import doctest
import uuid
from collections import Counter
from collections.abc import Sequence
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import msgspec
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from somnus.importers import openai_chat
from somnus.processors.prediction import causal_links as nac
from somnus.processors.prediction.causal_links import (
    ALPHA_BY_LEARNING_RATE,
    CONFIDENCE_PRIOR,
    DEFAULT_ALPHA,
    MAX_CONTEXT_VALUES,
    TOOL_FALLBACK_CONFIDENCE,
    CausalLinkState,
    alphas_for,
    confidence_of,
    decode_link_state,
    encode_link_state,
    learn,
    observations_from_episode,
    outcome_of,
    predict,
    snapshots,
    tool_counts,
    tool_counts_from_states,
    valence_of,
)
from somnus.processors.sessions.distiller import distill
from somnus.schemas.agents import AgentSpec, LearningRate
from somnus.schemas.causal import (
    LinkLevel,
    OutcomeObserved,
    Valence,
    event_signature,
    outcome_signature,
    tool_signature,
)
from somnus.schemas.codec import Rejection, decode_trace
from somnus.schemas.episodes import CallSeen, EpisodeDistilled
from tests.factories import distilled_episode
from tests.tau_bench import raw_tau_counts

TAU_BENCH = Path(__file__).resolve().parents[4] / "shared" / "datasets" / "tau-bench-airline" / "gpt-4o-airline.json"
T0 = datetime(2024, 5, 13, 9, 0, tzinfo=timezone.utc)  # a Monday
PROPERTY = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def obs(
    outcome: str = "ok",
    *,
    sig: str = "e1",
    offset: int = 0,
    index: int = 0,
    partition: int = 0,
    agent: str = "support",
    at: datetime = T0,
    context: dict[str, str] | None = None,
    level: LinkLevel = LinkLevel.CALL,
    tool: str = "t",
) -> OutcomeObserved:
    valence = Valence.POSITIVE if outcome == "ok" else Valence.NEGATIVE
    return OutcomeObserved(
        event_signature=sig,
        level=level,
        tool=tool,
        outcome_signature=outcome_signature(outcome),
        outcome=outcome,
        valence=valence,
        agent=agent,
        observed_at=at,
        context=context if context is not None else {"agent": agent},
        episode_id=uuid.UUID(int=offset + 1),
        src_partition=partition,
        src_offset=offset,
        index=index,
    )


def seq(outcomes: Sequence[str], **kw: Any) -> list[OutcomeObserved]:
    return [obs(o, offset=i, **kw) for i, o in enumerate(outcomes)]


def strengths(states: dict[str, CausalLinkState], sig: str = "e1") -> dict[str, float]:
    return {link.outcome: link.strength for link in states[sig].links.values()}


def episode(calls: list[CallSeen], *, agent: str = "airline", ended: datetime = T0) -> EpisodeDistilled:
    return distilled_episode(calls, agent=agent, ended=ended)


def test_the_module_examples_run():
    assert doctest.testmod(nac).failed == 0


# ---- pinned numbers ---------------------------------------------------------------------------


def test_pinned_numbers():
    assert ALPHA_BY_LEARNING_RATE == {
        LearningRate.CONSERVATIVE: 0.05,
        LearningRate.MODERATE: 0.1,
        LearningRate.AGGRESSIVE: 0.25,
    }
    assert DEFAULT_ALPHA == 0.1
    assert (CONFIDENCE_PRIOR, TOOL_FALLBACK_CONFIDENCE, MAX_CONTEXT_VALUES) == (2.0, 0.5, 24)


@pytest.mark.parametrize(("n", "confidence"), [(0, 0.0), (1, 1 / 3), (2, 0.5), (3, 0.6), (8, 0.8), (98, 0.98)])
def test_confidence_is_n_over_n_plus_2(n, confidence):
    assert confidence_of(n) == pytest.approx(confidence, abs=1e-12)


def test_alpha_follows_each_agents_learning_rate():
    agents = {
        "a": AgentSpec(name="a", learning_rate=LearningRate.CONSERVATIVE),
        "b": AgentSpec(name="b"),
        "c": AgentSpec(name="c", learning_rate=LearningRate.AGGRESSIVE),
    }
    assert alphas_for(agents) == {"a": 0.05, "b": 0.1, "c": 0.25}


# ---- Rescorla-Wagner, to 1e-9 -----------------------------------------------------------------


def test_plain_rescorla_wagner_values():
    # ΔV = α(λ − V), α = 0.1, V from 0: ok, ok, ok, then an error (a new outcome starts at V = 0)
    states, rows = learn({}, seq(["ok", "ok", "ok", "error:x"]), 0.1, running_mean_start=False)
    v = strengths(states)
    assert v["ok"] == pytest.approx(0.271 * 0.9, abs=1e-9)  # 0.1, 0.19, 0.271, then λ = 0: 0.2439
    assert v["error:x"] == pytest.approx(0.1, abs=1e-9)
    assert [round(r.strength, 12) for r in rows[:3]] == [0.1, 0.19, 0.271]
    last = {r.outcome: (r.target, r.strength_before, round(r.strength, 12)) for r in rows[3:]}  # one row per link
    assert last == {"ok": (0.0, pytest.approx(0.271, abs=1e-12), 0.2439), "error:x": (1.0, 0.0, 0.1)}
    assert [r.outcome_signature for r in rows[3:]] == sorted(r.outcome_signature for r in rows[3:])
    assert all(r.alpha == 0.1 for r in rows)


def test_the_running_mean_start_then_constant_alpha():
    # α_n = max(α, 1/n): with α = 0.25, n = 1..4 use 1, 1/2, 1/3, 1/4, then 0.25
    outcomes = ["ok", "error:x", "ok", "ok", "error:x", "ok"]
    states, rows = learn({}, seq(outcomes), 0.25)
    alphas = [r.alpha for r in rows if r.outcome == "ok"]
    assert alphas == pytest.approx([1.0, 1 / 2, 1 / 3, 1 / 4, 0.25, 0.25], abs=1e-12)
    ok = 3 / 4  # the exact running mean after 4
    ok = ok + 0.25 * (0 - ok)
    ok = ok + 0.25 * (1 - ok)
    assert strengths(states)["ok"] == pytest.approx(ok, abs=1e-9)
    assert strengths(states)["error:x"] == pytest.approx(1 - ok, abs=1e-9)


def test_a_new_outcome_starts_at_zero_before_its_update():
    states, rows = learn({}, seq(["ok", "ok", "http:429"]), 0.1)
    first = [r for r in rows if r.outcome == "http:429"]
    assert len(first) == 1 and first[0].strength_before == 0.0
    assert first[0].strength == pytest.approx(1 / 3, abs=1e-12)  # α_3 = 1/3, λ = 1


@PROPERTY
@given(st.lists(st.sampled_from(["ok", "error:a", "http:500"]), min_size=1, max_size=60), st.floats(0.0, 1.0))
def test_plain_rw_is_the_closed_form_weighted_sum(outcomes, alpha):
    # V_n(k) = Σ_i α (1 − α)^(n − i) [o_i == k]
    states, _ = learn({}, seq(outcomes), alpha, running_mean_start=False)
    n = len(outcomes)
    for k, v in strengths(states).items():
        expected = sum(alpha * (1 - alpha) ** (n - i) * (o == k) for i, o in enumerate(outcomes, 1))
        assert v == pytest.approx(expected, abs=1e-9)


@PROPERTY
@given(
    st.lists(st.sampled_from(["ok", "error:a", "http:500", "error:b"]), min_size=1, max_size=80), st.floats(0.0, 1.0)
)
def test_strengths_are_probabilities(outcomes, alpha):
    states, rows = learn({}, seq(outcomes), alpha)
    v = strengths(states)
    assert all(0.0 <= x <= 1.0 for x in v.values())
    assert sum(v.values()) == pytest.approx(1.0, abs=1e-9)  # the running-mean start makes them sum to 1
    assert all(0.0 <= r.strength <= 1.0 and 0.0 <= r.strength_before <= 1.0 for r in rows)


@PROPERTY
@given(st.lists(st.sampled_from(["ok", "error:a", "http:500"]), min_size=1, max_size=80))
def test_alpha_zero_with_the_running_start_is_the_exact_frequency(outcomes):
    states, _ = learn({}, seq(outcomes), 0.0)
    counts = Counter(outcomes)
    assert strengths(states) == pytest.approx({k: c / len(outcomes) for k, c in counts.items()}, abs=1e-9)
    assert {link.outcome: link.observations for link in states["e1"].links.values()} == counts
    assert states["e1"].observations == len(outcomes)


def test_each_agent_learns_at_its_own_rate():
    mixed = [
        obs("ok", offset=0, agent="calm"),
        obs("ok", offset=1, agent="calm"),
        obs("ok", offset=2, agent="calm"),
        obs("error:x", offset=3, agent="hasty"),
    ]
    _, rows = learn({}, mixed, 0.1, alpha_by_agent={"hasty": 0.5, "calm": 0.05}, running_mean_start=False)
    assert [r.alpha for r in rows] == [0.05, 0.05, 0.05, 0.5, 0.5]


def test_learning_rates_out_of_range_are_refused():
    with pytest.raises(ValueError):
        learn({}, [], 1.5)
    with pytest.raises(ValueError):
        learn({}, [], 0.1, alpha_by_agent={"a": -0.1})


# ---- exactly once -----------------------------------------------------------------------------


def test_the_same_batch_twice_changes_nothing():
    batch = seq(["ok", "error:x", "ok"])
    states, rows = learn({}, batch)
    assert learn(states, batch) == ({}, [])
    assert learn(states, batch[1:2]) == ({}, [])  # any redelivered part too


def test_a_redelivery_within_the_batch_is_skipped():
    batch = seq(["ok", "error:x"])
    assert learn({}, batch + batch) == learn({}, batch)


def test_high_water_marks_are_per_source_partition():
    p0 = [obs("ok", offset=10, partition=0)]
    p1 = [obs("error:x", offset=3, partition=1)]  # a lower offset, another partition: not a redelivery
    states, _ = learn({}, p0)
    states2, rows = learn(states, p1)
    assert states2["e1"].observations == 2 and len(rows) == 2
    assert states2["e1"].hwm == {0: (10, 0), 1: (3, 0)}


def test_calls_of_one_episode_are_told_apart_by_their_index():
    same_episode = [obs("ok", offset=5, index=0), obs("ok", offset=5, index=1), obs("ok", offset=5, index=1)]
    states, _ = learn({}, same_episode)
    assert states["e1"].observations == 2


@PROPERTY
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["e1", "e2", "e3"]), st.sampled_from(["ok", "error:a", "http:429"]), st.integers(0, 2)
        ),
        min_size=1,
        max_size=40,
    ),
    st.lists(st.integers(0, 40), max_size=4),
    st.integers(0, 40),
    st.integers(0, 40),
)
def test_any_split_and_any_redelivery_give_the_same_states_and_rows(items, cuts, a, b):
    # offsets increase per partition in delivery order, as on a Kafka partition
    batch = [obs(o, sig=s, partition=p, offset=i) for i, (s, o, p) in enumerate(items)]
    clean_states, clean_rows = learn({}, batch)
    stop, resume = min(max(a, b), len(batch)), min(a, b, len(batch))
    delivered = batch[:stop] + batch[resume:]  # a consumer restarted from an earlier offset
    bounds = sorted({c % (len(delivered) + 1) for c in cuts} | {0, len(delivered)})
    states: dict[str, CausalLinkState] = {}
    rows = []
    for lo, hi in zip(bounds, bounds[1:]):
        new, got = learn(states, delivered[lo:hi])
        states = {**states, **new}
        rows += got
    assert {k: encode_link_state(v) for k, v in states.items()} == {
        k: encode_link_state(v) for k, v in clean_states.items()
    }
    assert rows == clean_rows


def test_prior_states_are_not_mutated():
    states, _ = learn({}, seq(["ok", "error:x"]))
    before = {k: encode_link_state(v) for k, v in states.items()}
    learn(states, [obs("ok", offset=99)])
    assert {k: encode_link_state(v) for k, v in states.items()} == before


def test_state_round_trips_through_its_table_encoding():
    states, _ = learn({}, seq(["ok", "error:x", "ok"], context={"agent": "a", "hour": "09"}))
    raw = encode_link_state(states["e1"])
    assert decode_link_state(raw) == states["e1"] and encode_link_state(decode_link_state(raw)) == raw


def test_same_inputs_give_byte_identical_outputs():
    batch = [obs(o, sig=s, offset=i) for i, (s, o) in enumerate([("e1", "ok"), ("e2", "http:429"), ("e1", "error:z")])]
    a, b = learn({}, batch), learn({}, batch)
    assert msgspec.json.encode(a[1]) == msgspec.json.encode(b[1])
    assert [encode_link_state(v) for v in a[0].values()] == [encode_link_state(v) for v in b[0].values()]
    assert list(a[0]) == sorted(a[0])


def test_a_link_remembers_when_and_in_what_context_it_was_seen():
    batch = [
        obs("ok", offset=0, at=T0 + timedelta(hours=2), context={"agent": "a", "hour": "11"}),
        obs("ok", offset=1, at=T0, context={"agent": "b", "hour": "09"}),
    ]
    link = next(iter(learn({}, batch)[0]["e1"].links.values()))
    assert (link.first_at, link.last_at) == (T0, T0 + timedelta(hours=2))
    assert link.context == {"agent": ["a", "b"], "hour": ["09", "11"]}


def test_context_values_are_capped_and_the_key_marked_full():
    batch = [obs("ok", offset=i, context={"agent": f"a{i:02d}"}) for i in range(MAX_CONTEXT_VALUES + 3)]
    states, _ = learn({}, batch)
    link = next(iter(states["e1"].links.values()))
    assert len(link.context["agent"]) == MAX_CONTEXT_VALUES and link.context_full == ["agent"]
    p = predict(states, "t", None, {"agent": "zz"})
    assert p.outcomes == []  # no tool-level state: nothing known


# ---- observations from episodes ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("call", "outcome", "valence"),
    [
        (CallSeen(tool="t", ok=True), "ok", Valence.POSITIVE),
        (CallSeen(tool="t", ok=True, http_status=200), "ok", Valence.POSITIVE),
        (
            CallSeen(tool="t", ok=False, error="HTTP 429: Too Many Requests", http_status=429),
            "http:429",
            Valence.NEUTRAL,
        ),
        (CallSeen(tool="t", ok=False, error="HTTP 500: boom", http_status=500), "http:500", Valence.NEGATIVE),
        (CallSeen(tool="t", ok=False, error="HTTP/1.1 503 Service Unavailable"), "http:503", Valence.NEGATIVE),
        (
            CallSeen(tool="t", ok=False, error="rate limit exceeded, retry in 2s"),
            "error:rate limit exceeded, retry in <id>",
            Valence.NEUTRAL,
        ),
        (
            CallSeen(tool="t", ok=False, error="Error: payment method credit_card_123 not found"),
            "error:payment method <id> not found",
            Valence.NEGATIVE,
        ),
        (CallSeen(tool="t", ok=False), "error:error (no message)", Valence.NEGATIVE),
    ],
)
def test_outcomes_are_readable_result_types(call, outcome, valence):
    assert (outcome_of(call), valence_of(call)) == (outcome, valence)


def test_an_episode_gives_two_observations_per_call_with_a_result():
    at = T0 + timedelta(minutes=3)
    sig = event_signature("book", {"cabin": "economy"})
    ep = episode(
        [
            CallSeen(tool="book", ok=False, error="Error: no seats", at=at, signature=sig),
            CallSeen(tool="notify"),  # no result: teaches nothing
            CallSeen(tool="book", ok=True, signature=sig),  # no time: the episode's end
            CallSeen(tool="lookup", ok=True, at=at),
        ]
    )  # no signature: tool level only
    got = observations_from_episode(ep, src_partition=2, src_offset=41)
    assert [(o.level, o.tool, o.index, o.outcome) for o in got] == [
        (LinkLevel.CALL, "book", 0, "error:no seats"),
        (LinkLevel.TOOL, "book", 0, "error:no seats"),
        (LinkLevel.CALL, "book", 2, "ok"),
        (LinkLevel.TOOL, "book", 2, "ok"),
        (LinkLevel.TOOL, "lookup", 3, "ok"),
    ]
    assert [o.event_signature for o in got] == [
        sig,
        tool_signature("book"),
        sig,
        tool_signature("book"),
        tool_signature("lookup"),
    ]
    assert [o.observed_at for o in got] == [at, at, T0, T0, at]
    assert {(o.src_partition, o.src_offset, o.episode_id, o.agent) for o in got} == {
        (2, 41, uuid.UUID(int=7), "airline")
    }
    assert got[0].context == {"agent": "airline", "hour": "09", "weekday": "mon"}
    assert got[0].outcome_signature == outcome_signature("error:no seats")


def test_context_hours_are_the_events_own_clock():
    at = datetime(2024, 5, 13, 23, 30, tzinfo=timezone(timedelta(hours=-7)))
    (ob,) = observations_from_episode(episode([CallSeen(tool="x", ok=True, at=at)]), 0, 0)
    assert ob.context == {"agent": "airline", "hour": "23", "weekday": "mon"}


# ---- predictions ------------------------------------------------------------------------------


def _states_for(calls: list[tuple[str, dict[str, Any], str]]) -> dict[str, CausalLinkState]:
    seen = []
    for i, (tool, params, outcome) in enumerate(calls):
        ok = outcome == "ok"
        seen.append(
            CallSeen(
                tool=tool,
                ok=ok,
                error=None if ok else outcome,
                at=T0 + timedelta(hours=i % 3),
                signature=event_signature(tool, params),
            )
        )
    states, _ = learn({}, observations_from_episode(episode(seen), 0, 0))
    return states


def test_a_seen_call_is_predicted_from_its_own_link():
    states = _states_for(
        [("book", {"cabin": "economy", "user_id": f"u{i}"}, "ok" if i % 4 else "Error: full") for i in range(8)]
        + [("book", {"cabin": "business"}, "ok")]
    )
    p = predict(states, "book", {"cabin": "economy", "user_id": "someone_else_42"})
    assert (p.known, p.basis, p.observations) == (True, "call", 8)
    assert [(o.outcome, o.valence, o.observations) for o in p.outcomes] == [
        ("ok", Valence.POSITIVE, 6),
        ("error:full", Valence.NEGATIVE, 2),
    ]
    assert [o.strength for o in p.outcomes] == pytest.approx([0.75, 0.25], abs=1e-9)
    assert all(o.confidence == pytest.approx(8 / 10, abs=1e-12) for o in p.outcomes)
    assert p.params == {"cabin": "economy", "user_id": "<id>"}
    assert p.outcomes_json()[0] == {
        "outcome": "ok",
        "valence": "positive",
        "strength": p.outcomes[0].strength,
        "confidence": p.outcomes[0].confidence,
        "observations": 6,
    }


def test_a_never_seen_call_of_a_known_tool_is_a_flagged_hint():
    states = _states_for(
        [
            ("book", {"cabin": "economy"}, "ok"),
            ("book", {"cabin": "economy"}, "Error: x"),
            ("book", {"cabin": "business"}, "ok"),
        ]
    )
    p = predict(states, "book", {"cabin": "first", "pets": True})
    assert (p.known, p.basis, p.observations) == (False, "tool", 3)
    assert p.event_signature == event_signature("book", {"cabin": "first", "pets": True})
    assert [o.outcome for o in p.outcomes] == ["ok", "error:x"]
    assert all(
        o.confidence == pytest.approx(confidence_of(3) * TOOL_FALLBACK_CONFIDENCE, abs=1e-12) for o in p.outcomes
    )
    whole = predict(states, "book", None)  # asking about the tool itself: known
    assert (whole.known, whole.basis) == (True, "tool")
    assert whole.outcomes[0].confidence == pytest.approx(confidence_of(3), abs=1e-12)


def test_a_never_seen_tool_says_so_and_guesses_nothing():
    states = _states_for([("book", {}, "ok")])
    for params in ({"x": 1}, None):
        p = predict(states, "refund_everything", params)
        assert (p.known, p.basis, p.observations, p.outcomes) == (False, "none", 0, [])
        assert p.outcomes_json() == [] and p.to_json()["known"] is False
    assert predict({}, "book", {"cabin": "economy"}).basis == "none"


def test_context_marks_outcomes_seen_in_it():
    states = _states_for([("book", {}, "ok"), ("book", {}, "Error: x"), ("book", {}, "ok")])  # hours 09, 10, 11
    by = {o.outcome: o.in_context for o in predict(states, "book", {}, {"hour": "10"}).outcomes}
    assert by == {"ok": False, "error:x": True}
    by = {o.outcome: o.in_context for o in predict(states, "book", {}, {"agent": "airline", "moon": "full"}).outcomes}
    assert by == {"ok": None, "error:x": None}  # a key never recorded: unknown
    assert all(o.in_context is None for o in predict(states, "book", {}).outcomes)


# ---- exact counts -----------------------------------------------------------------------------


def test_exact_tool_counts_from_observations_and_from_states_agree():
    ep = episode(
        [
            CallSeen(tool="a", ok=True, signature="s1"),
            CallSeen(tool="a", ok=False, error="x", signature="s2"),
            CallSeen(tool="b", ok=False, error="HTTP 429", http_status=429),
            CallSeen(tool="c"),
        ]
    )
    observed = observations_from_episode(ep, 0, 0)
    counts = tool_counts(observed)
    assert {t: (c.calls, c.errors) for t, c in counts.items()} == {"a": (2, 1), "b": (1, 1)}
    states, _ = learn({}, observed)
    assert tool_counts_from_states(states) == counts
    states2, _ = learn(states, observed)  # redelivered: the states and so the counts stay
    assert tool_counts_from_states({**states, **states2}) == counts


# ---- real data: tau-bench ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def tau() -> tuple[list[EpisodeDistilled], list[OutcomeObserved]]:
    if not TAU_BENCH.exists():
        pytest.skip(f"dataset missing: {TAU_BENCH}")
    decoded = [decode_trace(orjson.dumps(e), max_bytes=1 << 20) for e in openai_chat(TAU_BENCH, agent="airline")]
    assert not any(isinstance(d, Rejection) for d in decoded)
    episodes = distill({}, decoded).episodes  # type: ignore[arg-type]
    observed = [o for offset, ep in enumerate(episodes) for o in observations_from_episode(ep, 0, offset)]
    return episodes, observed


FAILING = {
    "update_reservation_flights": (42, 104),
    "book_reservation": (30, 53),
    "update_reservation_baggages": (1, 14),
}


def test_tau_bench_per_tool_error_counts_are_exact(tau):
    episodes, observed = tau
    raw_errors, raw_calls, _ = raw_tau_counts(TAU_BENCH)  # counted from the raw file, not through the importer
    errors_by_tool: Counter[str] = Counter()
    for (tool, _group), n in raw_errors.items():
        errors_by_tool[tool] += n
    counts = tool_counts(observed)
    assert {t: c.calls for t, c in counts.items()} == raw_calls  # every call of the file has a result
    assert {t: c.errors for t, c in counts.items() if c.errors} == errors_by_tool
    assert {t: (c.errors, c.calls) for t, c in counts.items() if c.errors} == FAILING
    assert all(c.errors == 0 for t, c in counts.items() if t not in FAILING) and len(counts) == 14
    states, _ = learn({}, observed)
    assert tool_counts_from_states(states) == counts


def test_tau_bench_strengths_converge_to_the_observed_failure_rates(tau):
    _, observed = tau
    exact, _ = learn({}, observed, alpha=0.0)  # the running mean alone: the frequency itself
    moving, _ = learn({}, observed)  # the default α = 0.1
    for tool, (errors, calls) in FAILING.items():
        key = tool_signature(tool)
        for states in (exact, moving):
            assert states[key].observations == calls
        failure = lambda states: sum(l.strength for l in states[key].links.values() if l.outcome != "ok")  # noqa: E731
        assert failure(exact) == pytest.approx(errors / calls, abs=1e-9)
        # a moving average over the last ~10-20 calls: near the rate, never a confident "always works"
        assert failure(moving) == pytest.approx(errors / calls, abs=0.05), tool
        ok = predict(moving, tool, None).outcomes
        assert any(o.outcome == "ok" for o in ok) and sum(o.strength for o in ok) == pytest.approx(1.0, abs=1e-9)
    # and per kind of call: every well-observed signature of the failing tools sits near its own rate
    for state in moving.values():
        if state.level is LinkLevel.CALL and state.tool in FAILING and state.observations >= 20:
            ok = sum(l.observations for l in state.links.values() if l.outcome == "ok")
            rate = 1 - ok / state.observations
            assert sum(l.strength for l in state.links.values() if l.outcome != "ok") == pytest.approx(rate, abs=0.1)


def test_tau_bench_the_same_call_with_other_ids_is_one_link(tau):
    _, observed = tau
    states, _ = learn({}, observed)
    lookups = [s for s in states.values() if s.tool == "get_reservation_details" and s.level is LinkLevel.CALL]
    assert len(lookups) == 1 and lookups[0].observations == 377  # 377 calls, each with another reservation id
    p = predict(states, "get_reservation_details", {"reservation_id": "NEVER1"})
    assert (p.known, [o.outcome for o in p.outcomes]) == (True, ["ok"])
    assert p.outcomes[0].strength == pytest.approx(1.0, abs=1e-12)


def test_tau_bench_a_never_seen_action_says_so(tau):
    _, observed = tau
    states, _ = learn({}, observed)
    p = predict(states, "book_reservation", {"user_id": "x_1", "cabin": "premium_plus", "pets": ["dog"]})
    assert (p.known, p.basis) == (False, "tool") and p.outcomes[0].confidence < 0.5
    q = predict(states, "upgrade_to_first_class", {"reservation_id": "ABC123"})
    assert (q.known, q.basis, q.outcomes) == (False, "none", [])


def test_tau_bench_learning_is_deterministic_and_rows_are_unique(tau):
    _, observed = tau
    (s1, r1), (s2, r2) = learn({}, observed), learn({}, observed)
    assert msgspec.json.encode(r1) == msgspec.json.encode(r2)
    assert [encode_link_state(v) for v in s1.values()] == [encode_link_state(v) for v in s2.values()]
    keys = [(r.event_signature, r.outcome_signature, r.src_partition, r.src_offset, r.index) for r in r1]
    assert len(keys) == len(set(keys))
    assert sum(1 for r in r1 if r.target == 1.0) == len(observed)  # one λ = 1 row per observation


# ---- the flat view ----------------------------------------------------------------------------


def test_snapshots_are_the_links_with_their_observations():
    batch = [
        obs("ok", offset=0, at=T0),
        obs("error:x", offset=1, at=T0 + timedelta(hours=1)),
        obs("ok", offset=2, at=T0 + timedelta(hours=2)),
    ]
    states, rows = learn({}, batch)
    snaps = snapshots(states, rows)
    assert [(s.outcome, s.observation_count, s.event_observations) for s in snaps] == [("ok", 2, 3), ("error:x", 1, 3)]
    ok = snaps[0]
    assert ok.observation_times == [T0, T0 + timedelta(hours=2)]
    assert ok.source_episode_ids == [str(uuid.UUID(int=1)), str(uuid.UUID(int=3))]
    assert (ok.valence, ok.confidence, ok.first_at, ok.last_at) == ("positive", 0.6, T0, T0 + timedelta(hours=2))
    assert ok.strength == pytest.approx(2 / 3, abs=1e-12) and ok.context_conditions == {"agent": ["support"]}
    assert snapshots(states)[0].observation_times == []


def test_snapshots_satisfy_the_promotion_sources_protocol():
    promotion = pytest.importorskip("somnus.processors.semantic.promotion")
    states, rows = learn({}, [obs("ok", offset=i) for i in range(4)])
    (snap,) = snapshots(states, rows)
    assert isinstance(snap, promotion.CausalLinkLike)
    (candidate,) = promotion.NacPromotionSource([snap]).get_promotion_candidates()
    assert candidate.pattern_name == "t → ok" and len(candidate.source_memory_ids) == 4


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.sampled_from(["ok", "error:x", "http:429", "error:y"]), min_size=1, max_size=40), st.floats(0.01, 0.9)
)
def test_compact_rows_carry_exactly_what_the_per_link_rows_say(outcomes, alpha):
    states, full = learn({}, seq(outcomes), alpha)
    states_c, compact = learn({}, seq(outcomes), alpha, per_link_rows=False)
    assert states_c == states and len(compact) == len(outcomes)
    by_obs: dict[tuple[int, int], dict[str, float]] = {}
    for r in full:
        by_obs.setdefault((r.src_offset, r.index), {})[r.outcome_signature] = r.strength
    for row in compact:
        assert row.strengths == by_obs[(row.src_offset, row.index)]
        (observed,) = [
            r
            for r in full
            if (r.src_offset, r.index, r.outcome_signature) == (row.src_offset, row.index, row.outcome_signature)
        ]
        assert observed.target == 1.0 and row == msgspec.structs.replace(observed, strengths=row.strengths)
