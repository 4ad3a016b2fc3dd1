"""somnus.processors.semantic.promotion: sources, the IPS randomness gate, the promoter and its cross-layer edges,
pattern linking, cross-layer spreading activation, replay; and tau-bench end to end."""

from __future__ import annotations

import doctest
import json
import math
from collections import defaultdict
from datetime import datetime, timedelta, timezone
from functools import lru_cache
from pathlib import Path

import msgspec
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from somnus.importers import DEFAULT_START, openai_chat
from somnus.processors.prediction.patterns import Statistician, call_outcomes, pattern_events
from somnus.processors.semantic import promotion as pr
from somnus.processors.semantic.concepts import concept_confidence, find_or_create, knowledge_context
from somnus.processors.semantic.layers import MemoryLayers, fold_events, snapshot
from somnus.processors.semantic.promotion import (
    NacPromotionSource,
    PromotionCandidate,
    PromotionSource,
    SemanticPromoter,
    StatisticianPromotionSource,
    cross_layer_activation,
    dispersion_test,
    episode_times,
    ips_gate,
    rayleigh_test,
)
from somnus.processors.sessions.distiller import distill
from somnus.schemas.episodes import EpisodeDistilled
from somnus.schemas.events import TraceEvent
from somnus.schemas.semantic import (
    CallOutcome,
    CandidateRejected,
    CausalLinkView,
    ConceptPromoted,
    CrossEdgeType,
    Layer,
    MathCategory,
    MathRecord,
    PatternConfirmed,
    Provenance,
    decode_semantic,
    encode_semantic,
)

T0 = datetime(2024, 5, 1, tzinfo=timezone.utc)
OWNER = "agent:robot"
DAY = 86400.0


def test_numbers_are_pinned():
    assert (pr.MIN_CONFIDENCE, pr.MIN_OBSERVATIONS) == (0.6, 3)
    assert (pr.GATE_MIN_OBSERVATIONS, pr.GATE_ALPHA, pr.GATE_TEST_ALPHA, pr.STAT_MIN_CONFIDENCE) == (
        8,
        0.05,
        0.025,
        0.4,
    )
    assert (pr.PHASE_MIN_SPAN_DAYS, pr.NULL_REPLICATES, pr.NULL_MAX_GAPS, pr.STRUCTURAL_EDGE_WEIGHT) == (
        3.0,
        4000,
        1000,
        1.0,
    )


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=float(seconds))


def nac(
    times: list[float],
    tool: str = "grasp",
    conf: float = 0.8,
    episodes: list[str] | None = None,
    valence: str = "negative",
    outcome: str = "error",
) -> PromotionCandidate:
    eps = episodes if episodes is not None else [f"e{i}" for i in range(len(times))]
    link = CausalLinkView(
        event_signature=f"sig-{tool}",
        tool=tool,
        outcome=outcome,
        valence=valence,
        strength=0.7,
        confidence=conf,
        observation_count=len(times),
        observation_times=[at(t) for t in times],
        source_episode_ids=eps,
    )
    (c,) = NacPromotionSource([link]).get_promotion_candidates()
    return c


# ---- sources ----------------------------------------------------------------------------------


def test_sources_follow_the_protocol_and_filter_by_confidence_and_observations():
    links = [
        CausalLinkView(
            event_signature=f"s{i}",
            tool="t",
            outcome=f"o{i}",
            valence="negative",
            strength=0.5,
            confidence=c,
            observation_count=n,
        )
        for i, (c, n) in enumerate([(0.6, 3), (0.59, 9), (0.9, 2)])
    ]
    src = NacPromotionSource(links)
    assert isinstance(src, PromotionSource) and isinstance(
        StatisticianPromotionSource(MemoryLayers(OWNER).ag), PromotionSource
    )
    assert [c.pattern_name for c in src.get_promotion_candidates()] == ["t → o0"]
    assert [c.pattern_name for c in src.get_promotion_candidates(0.5, 2)] == ["t → o0", "t → o1", "t → o2"]
    no_tool = CausalLinkView(
        event_signature="grasp+coffee_mug",
        tool=None,
        outcome="success",
        valence="positive",
        strength=0.8,
        confidence=0.8,
        observation_count=5,
    )
    assert NacPromotionSource([no_tool]).get_promotion_candidates()[0].pattern_name == "grasp+coffee_mug → success"


def test_enum_valences_and_outcomes_are_read_by_value():
    from enum import Enum

    class Valence(str, Enum):
        NEGATIVE = "negative"

    link = CausalLinkView(
        event_signature="sig",
        tool="t",
        outcome="error:x",
        valence=Valence.NEGATIVE,
        strength=0.5,
        confidence=0.9,
        observation_count=3,
    )
    (c,) = NacPromotionSource([link]).get_promotion_candidates()
    assert c.metadata["valence"] == "negative" and type(c.metadata["valence"]) is str
    m = MemoryLayers(OWNER)
    SemanticPromoter().promote(m, [_Fixed([c])], T0)
    assert m.atl.get(m.atl.find("t_unreliable")).properties["valence"] == "negative"


def test_the_gate_sees_one_time_per_episode():
    t = [at(0), at(1), at(2), at(DAY)]
    assert episode_times(t, ["a", "a", "a", "b"]) == [at(0), at(DAY)]
    assert episode_times(t, ["a", "b"]) == t  # not parallel: the times as given


# ---- the IPS gate -------------------------------------------------------------------------------


def test_statistical_candidates_pass_at_confidence_0_4():
    def stat(conf: float) -> PromotionCandidate:
        return PromotionCandidate(
            pattern_name="stat:x",
            category="operational_pattern",
            confidence=conf,
            source_memory_ids=[],
            origin=pr.STATISTICIAN,
        )

    assert ips_gate(stat(0.4)).passed and not ips_gate(stat(0.3999)).passed


def test_fewer_than_8_observations_pass_unjudged():
    v = ips_gate(nac([0, 1, 2, 3, 4, 5, 6]))  # 7 at one-second intervals: "regular", but too few
    assert v.passed and v.test == "small_sample" and v.n == 7
    v = ips_gate(nac([0, 1, 2, 3, 4, 5, 6, 7]))
    assert v.passed and v.test == "dispersion" and "regular" in v.reason


def test_regular_timings_pass_and_random_timings_are_rejected():
    rng = np.random.RandomState(11)
    regular = [6 * 3600 * i + rng.uniform(-300, 300) for i in range(10)]  # every 6 h, +-5 min, 2.25 days
    v = ips_gate(nac(regular))
    assert v.passed and v.test == "dispersion" and v.p_value < 0.025 and "regular" in v.reason
    poisson = np.cumsum(rng.exponential(6 * 3600, 10))
    v = ips_gate(nac(list(poisson)))
    assert not v.passed and "no temporal structure" in v.reason and "phase test skipped" in v.reason


def test_bursts_pass():
    bursts = [d * DAY + k * 60 for d in (0, 1, 2) for k in range(4)]  # three bursts of four
    v = ips_gate(nac(bursts))
    assert v.passed and v.test == "dispersion" and "bursty" in v.reason


def test_a_daily_habit_at_random_days_is_caught_by_the_rayleigh_test():
    rng = np.random.RandomState(1)
    days = np.sort(rng.choice(60, 20, replace=False))
    t = list(days * DAY + 9 * 3600 + rng.uniform(-1200, 1200, 20))
    assert dispersion_test(t)[1] >= 0.025  # the gaps alone look random
    v = ips_gate(nac(t))
    assert v.passed and v.test == "rayleigh" and v.p_value < 1e-6


def test_the_phase_test_needs_three_days():
    rng = np.random.RandomState(5)
    short = list(np.sort(rng.uniform(0, 2.5 * DAY, 12)))
    assert dispersion_test(short)[1] >= 0.025
    v = ips_gate(nac(short))
    assert not v.passed and "phase test skipped (span" in v.reason and "rayleigh" not in v.reason
    longer = [t * 1.5 for t in short]  # the same pattern stretched past 3 days
    assert (longer[-1] - longer[0]) / DAY >= 3.0
    v = ips_gate(nac(longer))
    assert "rayleigh p=" in v.reason and "skipped" not in v.reason


@pytest.mark.parametrize("span_days", [2.0, 20.0])
def test_false_passes_on_poisson_timings_stay_near_alpha(span_days):
    rng = np.random.RandomState(int(span_days))
    passed = 0
    trials = 400
    for _ in range(trials):
        n = int(rng.randint(8, 40))
        t = list(np.sort(rng.uniform(0, span_days * DAY, n)))
        passed += ips_gate(nac(t)).passed
    # 2.5 % for the dispersion test, plus 2.5 % for the Rayleigh test when it runs
    assert passed / trials <= (0.045 if span_days < 3 else 0.075)


def test_the_cv_null_is_calibrated_where_the_asymptotic_one_is_not():
    rng = np.random.RandomState(3)
    ps = [dispersion_test(list(rng.uniform(0, 1, 8)))[1] for _ in range(1000)]
    assert 0.015 <= np.mean(np.array(ps) < 0.05) <= 0.08  # two-sided 5 %
    assert np.isclose(np.median(pr._null_cv(7)), 0.82, atol=0.03)  # far from 1 at 7 gaps


def test_activity_rescaling_keeps_office_hours_from_looking_bursty():
    rng = np.random.RandomState(2)
    # an agent busy 09-17 on weekdays for four weeks, sessions at random times within those hours
    activity = np.sort(np.concatenate([d * DAY + rng.uniform(9 * 3600, 17 * 3600, 15) for d in range(28) if d % 7 < 5]))
    sample = list(np.sort(rng.choice(activity, 30, replace=False)))
    assert ips_gate(nac(sample)).passed  # judged on a uniform clock: nights and weekends look like bursts
    v = ips_gate(nac(sample), activity_times=[at(t) for t in activity])
    assert not v.passed, v.reason  # judged against the agent's own activity: a random subset


def test_the_subset_null_is_calibrated_even_for_dense_subsets():
    rng = np.random.RandomState(4)
    lattice = np.arange(200) * 600.0  # sessions every 10 minutes, like the tau-bench import
    for frac in (0.1, 0.8):
        passed = 0
        for _ in range(200):
            sample = np.sort(rng.choice(lattice, int(200 * frac), replace=False))
            passed += dispersion_test(sample, lattice)[1] < pr.GATE_TEST_ALPHA
        assert passed / 200 <= 0.06
    # without the activity, a dense subset of a lattice looks regular (the artefact the rescaling removes)
    dense = np.sort(rng.choice(lattice, 160, replace=False))
    assert dispersion_test(dense)[1] < 0.025 and dispersion_test(dense, lattice)[1] > 0.025


@pytest.mark.parametrize("total,n", [(6, 2), (6, 3), (6, 5), (7, 7), (9, 1)])
def test_random_subsets_are_distinct_sorted_and_every_subset_equally_likely(total, n):
    # Chi-square over all C(total, n) subsets: the repeat-redrawing sampler (n <= total / 2) and
    # the complement it takes for dense subsets must both be uniform, not just plausible-looking.
    from itertools import combinations

    from scipy.stats import chisquare

    reps = 30_000
    rows = pr._random_subsets(np.random.RandomState(total * 100 + n), total, n, reps)
    assert rows.shape == (reps, n) and rows.dtype == np.int32
    assert (np.diff(rows, axis=1) > 0).all() and rows.min() >= 0 and rows.max() < total
    every = {c: 0 for c in combinations(range(total), n)}
    for r in map(tuple, rows.tolist()):
        every[r] += 1
    if len(every) > 1:
        assert chisquare(list(every.values())).pvalue > 1e-4


def test_the_subset_null_matches_one_drawn_by_shuffling():
    # The reference: the first n of a random permutation of every activity instant (slow, obviously
    # exact). Same distribution of CVs, sparse and dense subsets alike (two-sample KS, fixed seeds).
    from scipy.stats import ks_2samp

    rng = np.random.RandomState(5)
    for total, n in ((400, 20), (400, 150), (300, 260)):
        keys = rng.random_sample((pr.NULL_REPLICATES, total))
        pos = np.sort(np.argpartition(keys, n - 1, axis=1)[:, :n], axis=1).astype(np.float64)
        gaps = np.diff(pos, axis=1)
        reference = gaps.std(axis=1) / gaps.mean(axis=1)
        assert ks_2samp(pr._null_cv_subset(total, n), reference).pvalue > 1e-3


def test_the_gate_gives_the_same_verdict_for_activity_as_instants_or_as_seconds():
    # The promoter converts its activity once (a window holds ~32k instants) and hands every
    # candidate's gate the seconds; that must not change any verdict.
    rng = np.random.RandomState(9)
    activity = [at(float(x)) for x in np.sort(rng.uniform(0, 30 * DAY, 400))]
    for times in (
        [i * 3600.0 for i in range(12)],
        list(np.sort(rng.uniform(0, 30 * DAY, 40))),
        [d * DAY + 9 * 3600.0 for d in range(25)],
    ):
        cand = nac(times)
        assert ips_gate(cand, activity_times=activity) == ips_gate(cand, activity_times=pr.activity_seconds(activity))
    assert pr.activity_seconds([]) is None and pr.activity_seconds(None) is None


def test_the_phase_moments_reused_across_candidates_follow_the_activity():
    # An Activity computes its phase moments once; rayleigh_test gives what it gives for plain seconds.
    rng = np.random.RandomState(12)
    one = np.sort(rng.uniform(0, 20 * DAY, 300))
    two = np.sort(rng.uniform(0, 20 * DAY, 300)) + 5 * 3600.0
    times = [d * DAY + 10 * 3600.0 for d in range(15)]
    fresh = {}
    for name, act in (("one", one), ("two", two)):
        fresh[name] = rayleigh_test(times, act)
    assert fresh["one"] != fresh["two"]
    shared = pr.Activity(one)  # its moments computed by the first call, reused by the second
    for name, act in (("one", shared), ("one", shared), ("two", pr.Activity(two)), ("one", list(one))):
        assert rayleigh_test(times, act) == fresh[name]
    one[:] = two  # the same array object, changed in place
    assert rayleigh_test(times, one) == fresh["two"]


def test_rayleigh_against_the_activity_rhythm():
    rng = np.random.RandomState(6)
    activity = np.concatenate([d * DAY + rng.uniform(9 * 3600, 17 * 3600, 20) for d in range(20)])
    same = rng.choice(activity, 30, replace=False)
    assert rayleigh_test(same)[1] < 1e-6  # against a uniform clock: "phase-locked"
    assert rayleigh_test(same, activity)[1] > 0.05  # against the agent's own hours: not at all
    mornings = activity[(activity % DAY) < 10 * 3600][:30]
    assert rayleigh_test(mornings, activity)[1] < 1e-3


def test_retries_within_an_episode_are_not_a_burst():
    rng = np.random.RandomState(8)
    starts = np.cumsum(rng.exponential(3 * 3600, 12))
    times = [s + k for s in starts for k in range(3)]  # each episode: three failed attempts a second apart
    eps = [f"e{i}" for i in range(12) for _ in range(3)]
    assert not ips_gate(nac(times, episodes=eps)).passed
    assert ips_gate(nac(times, episodes=sorted(set(eps)))).passed  # unpaired: 36 times, bursty


# ---- promotion: concepts and cross-layer edges ---------------------------------------------------


def edges(m: MemoryLayers, kind: CrossEdgeType) -> set[tuple[str, str, str, str, float]]:
    return {
        (e.source[0].value, e.source[1], e.target[0].value, e.target[1], e.weight)
        for e in m.cross.edges(edge_type=kind)
    }


def test_a_causal_link_becomes_a_concept_with_derived_from_and_instance_of_edges():
    m = MemoryLayers(OWNER)
    cand = nac([0, 1, 2, 3, 4], episodes=["e1", "e2", "e2", "e3", "e4"])
    evs = SemanticPromoter().promote(m, [_Fixed([cand])], T0)
    cid = m.atl.find("grasp_unreliable")
    c = m.atl.get(cid)
    assert c.category == "causal_pattern" and c.provenance is Provenance.EPISODIC_CONSOLIDATION
    assert c.reinforcement_count == 4 and c.confidence == pytest.approx(concept_confidence(4))
    assert c.properties == {
        "outcome": "error",
        "valence": "negative",
        "strength": 0.7,
        "observations": 5,
        "tool": "grasp",
    }
    assert edges(m, CrossEdgeType.DERIVED_FROM) == {
        ("atl", cid, "hippocampus", e, 1.0) for e in ("e1", "e2", "e3", "e4")
    }
    assert edges(m, CrossEdgeType.INSTANCE_OF) == {
        ("hippocampus", e, "atl", cid, 1.0) for e in ("e1", "e2", "e3", "e4")
    }
    parent = m.atl.find("unreliable_tool")
    assert [(r.relation, r.target_id) for r in m.atl.relationships(cid)] == [("IS_A", parent)]
    promoted = [e for e in evs if isinstance(e, ConceptPromoted)]
    assert (
        len(promoted) == 1 and promoted[0].created and promoted[0].gate.startswith("4 distinct observation times")
    )  # one per episode
    # the same candidate again: nothing new; new episodes: reinforced by exactly the new ones
    assert SemanticPromoter().promote(m, [_Fixed([cand])], T0) == []
    more = nac([0, 1, 2, 3, 4, 5], episodes=["e1", "e2", "e3", "e4", "e5", "e6"])
    evs = SemanticPromoter().promote(m, [_Fixed([more])], T0)
    assert m.atl.get(cid).reinforcement_count == 6
    assert sum(e.edge_type is CrossEdgeType.DERIVED_FROM for e in evs if hasattr(e, "edge_type")) == 2


def test_positive_and_negative_links_of_one_tool_stay_apart():
    m = MemoryLayers(OWNER)
    bad = nac([0, 1, 2], episodes=["e1", "e2", "e3"])
    good = nac([5, 6, 7], episodes=["e4", "e5", "e6"], valence="positive", outcome="ok")
    SemanticPromoter().promote(m, [_Fixed([bad, good])], T0)
    assert sorted(c.name for c in m.atl) == ["grasp_reliable", "grasp_unreliable", "reliable_tool", "unreliable_tool"]
    derived = {e[3] for e in edges(m, CrossEdgeType.DERIVED_FROM) if e[1] == m.atl.find("grasp_unreliable")}
    assert derived == {"e1", "e2", "e3"}


def test_a_rejected_candidate_leaves_only_its_audit_record():
    m = MemoryLayers(OWNER)
    rng = np.random.RandomState(9)
    evs = SemanticPromoter().promote(m, [_Fixed([nac(list(np.cumsum(rng.exponential(3600, 12))))])], T0)
    assert [type(e) for e in evs] == [CandidateRejected] and len(m.atl) == 0 and len(m.cross) == 0
    assert "no temporal structure" in evs[0].reason
    # without the gate it is promoted
    assert (
        len(SemanticPromoter(gate=None).promote(m, [_Fixed([nac(list(np.cumsum(rng.exponential(3600, 12))))])], T0)) > 1
    )


def test_ingested_then_observed_is_hybrid():
    m = MemoryLayers(OWNER)
    find_or_create(m, "grasp_unreliable", T0, provenance=Provenance.DIRECT_INGESTION, evidence=["doc:manual"])
    SemanticPromoter().promote(m, [_Fixed([nac([0, 1, 2])])], T0)
    assert m.atl.get(m.atl.find("grasp_unreliable")).provenance is Provenance.HYBRID


class _Fixed:
    def __init__(self, cands: list[PromotionCandidate]) -> None:
        self.cands = cands

    def get_promotion_candidates(
        self, min_confidence: float = 0.6, min_observations: int = 3
    ) -> list[PromotionCandidate]:
        return [c for c in self.cands if c.confidence >= min_confidence]


def _record(mid: str, category: MathCategory, subjects: list[str], conf: float, **stats: float) -> PatternConfirmed:
    names = {
        MathCategory.PATTERN: f"stat:tool:{subjects[0]}:success",
        MathCategory.PHASE_LOCK: f"stat:phase:{subjects[0]}:success",
        MathCategory.CORRELATION: f"stat:corr:{subjects[0]}.success_rate~{subjects[-1]}.success_rate",
    }
    return PatternConfirmed(
        owner=OWNER,
        at=T0,
        record=MathRecord(
            math_id=mid,
            name=names[category],
            category=category,
            domain="tool_reliability",
            subjects=subjects,
            verbal=f"{category.value} of {subjects}",
            query="SELECT 1",
            confidence=conf,
            n_observations=50,
            statistics=dict(stats),
            source_episode_ids=["e9"],
        ),
    )


def test_statistical_patterns_confirm_quantify_correlate_and_phase_lock():
    m = MemoryLayers(OWNER)
    SemanticPromoter().promote(
        m, [_Fixed([nac([0, 1, 2], tool="grasp"), nac([0, 1, 2], tool="nav", episodes=["n1", "n2", "n3"])])], T0
    )
    m.apply_all(
        [
            _record("trend-grasp", MathCategory.PATTERN, ["grasp"], 0.73, slope_per_day=-0.02),
            _record("trend-nav", MathCategory.PATTERN, ["nav"], 0.65, slope_per_day=-0.05),
            _record("phase-grasp", MathCategory.PHASE_LOCK, ["grasp"], 0.2, phase_hour=19.2, coupling=0.3),
            _record("corr", MathCategory.CORRELATION, ["grasp", "nav"], 0.81, r=0.9),
        ]
    )
    SemanticPromoter().promote(m, [StatisticianPromotionSource(m.ag)], T0)
    atl = m.atl
    g_bad, n_bad = atl.find("grasp_unreliable"), atl.find("nav_unreliable")
    g_trend, n_trend = atl.find("grasp_success_declining"), atl.find("nav_success_declining")
    assert (
        atl.get(g_trend).provenance is Provenance.AGENT_INFERENCE
        and atl.get(g_trend).definition == "PATTERN of ['grasp']"
    )
    assert atl.find("grasp_success_circadian") is None  # confidence 0.2 < 0.6: not a concept, but linked below
    corr_concept = atl.find("grasp.success_rate_correlates_with_nav.success_rate")
    assert corr_concept is not None
    assert edges(m, CrossEdgeType.STATISTICALLY_CONFIRMS) == {
        ("angular_gyrus", "trend-grasp", "atl", g_trend, 0.73),
        ("angular_gyrus", "trend-nav", "atl", n_trend, 0.65),
        ("angular_gyrus", "corr", "atl", corr_concept, 0.81),
    }
    assert edges(m, CrossEdgeType.QUANTIFIES) == {
        ("angular_gyrus", "trend-grasp", "atl", g_bad, 0.73),
        ("angular_gyrus", "trend-nav", "atl", n_bad, 0.65),
    }
    assert edges(m, CrossEdgeType.TEMPORALLY_CORRELATES) == {
        ("angular_gyrus", "phase-grasp", "atl", c, 0.2) for c in (g_bad, g_trend)
    }
    assert {e[3] for e in edges(m, CrossEdgeType.INFORMS)} == {g_bad, g_trend, n_bad, n_trend}
    lock = atl.relationship(g_bad, "PHASE_LOCKED_TO", atl.find("circadian_rhythm"))
    assert lock is not None and dict(lock.metadata) == {"coupling": 0.3, "phase_hour": 19.2} and lock.weight == 0.2
    assert atl.relationship(n_bad, "CORRELATES_WITH", g_bad) is not None  # symmetric
    assert atl.relationship(g_trend, "TRENDS_WITH", n_trend).weight == 0.65
    assert atl.relationship(n_trend, "TRENDS_WITH", g_trend) is not None
    # everything is in the log: a second run adds nothing, a replay rebuilds the same memory
    assert SemanticPromoter().promote(m, [StatisticianPromotionSource(m.ag)], T0) == []


# ---- cross-layer activation ---------------------------------------------------------------------


def test_cross_layer_activation_values_and_grouping():
    m = MemoryLayers(OWNER)
    SemanticPromoter().promote(m, [_Fixed([nac([0, 1, 2], episodes=["e1", "e2", "e3"])])], T0)
    m.apply_all(
        [
            _record("trend", MathCategory.PATTERN, ["grasp"], 0.8, slope_per_day=-0.1),
            _record("phase", MathCategory.PHASE_LOCK, ["grasp"], 0.4, phase_hour=3.0, coupling=0.2),
        ]
    )
    pattern_events(m, [], T0)
    SemanticPromoter().promote(m, [], T0)  # link only: trend QUANTIFIES, phase TEMPORALLY_CORRELATES the concept
    m.hippocampus.associate("e1", "e7", 0.6)  # an associative edge inside the hippocampus
    act = cross_layer_activation(m, [(Layer.HIPPOCAMPUS, "e1")])
    assert list(act) == ["hippocampus", "atl", "angular_gyrus"]
    c, parent, circ = m.atl.find("grasp_unreliable"), m.atl.find("unreliable_tool"), m.atl.find("circadian_rhythm")
    atl = dict(act["atl"])
    assert atl[c] == pytest.approx(0.5)  # e1 -INSTANCE_OF(1.0)-> concept: 1 * 0.5 * 1.0
    assert atl[parent] == pytest.approx(0.25)  # -IS_A(1.0)->
    assert atl[circ] == pytest.approx(0.5 * 0.5 * 0.4)  # -PHASE_LOCKED_TO(0.4)->
    hippo = dict(act["hippocampus"])
    assert hippo == {"e7": pytest.approx(0.3), "e2": pytest.approx(0.25), "e3": pytest.approx(0.25)}
    ag_ = dict(act["angular_gyrus"])
    # concept -QUANTIFIES(0.8)- trend: 0.5 * 0.5 * 0.8; the phase record is reached directly from the
    # concept (0.5 * 0.5 * 0.4 = 0.1) and through the trend (0.2 * 0.5 * min(0.8, 0.4) = 0.04): best path
    assert ag_ == {"trend": pytest.approx(0.2), "phase": pytest.approx(0.1)}
    assert act["hippocampus"][0] == ("e7", pytest.approx(0.3))  # best first
    shallow = cross_layer_activation(m, [(Layer.HIPPOCAMPUS, "e1")], max_depth=1)
    assert shallow["angular_gyrus"] == [] and dict(shallow["atl"]) == {c: pytest.approx(0.5)}


# ---- replay ---------------------------------------------------------------------------------------


@lru_cache(maxsize=1)
def _scenario_log() -> tuple[list, MemoryLayers]:
    m = MemoryLayers(OWNER)
    log = SemanticPromoter().promote(
        m, [_Fixed([nac([0, 1, 2, 3], tool="grasp"), nac([0, 1, 2], tool="nav", episodes=["n1", "n2", "n3"])])], T0
    )
    recs = [
        _record("trend-grasp", MathCategory.PATTERN, ["grasp"], 0.73, slope_per_day=-0.02),
        _record("trend-nav", MathCategory.PATTERN, ["nav"], 0.65, slope_per_day=-0.05),
        _record("phase-grasp", MathCategory.PHASE_LOCK, ["grasp"], 0.2, phase_hour=19.2, coupling=0.3),
        _record("corr", MathCategory.CORRELATION, ["grasp", "nav"], 0.81, r=0.9),
    ]
    log += pattern_events(m, [r.record for r in recs], T0)
    log += SemanticPromoter().promote(m, [StatisticianPromotionSource(m.ag)], T0)
    log += SemanticPromoter().promote(m, [_Fixed([nac([0, 1, 2, 3, 4, 5], tool="grasp")])], T0 + timedelta(days=1))
    return log, m


@settings(max_examples=50, deadline=None)
@given(st.data())
def test_duplicate_deliveries_change_nothing(data):
    log, m = _scenario_log()  # m is only read here
    delivered = []
    for i, ev in enumerate(log):
        delivered.append(ev)
        delivered += [log[j] for j in data.draw(st.lists(st.integers(max(0, i - 5), i), max_size=2))]
    state = snapshot(fold_events(delivered)[OWNER])
    assert state == snapshot(m)


def test_a_replay_of_the_log_rebuilds_the_promoted_memory():
    m = MemoryLayers(OWNER)
    log = []
    log += SemanticPromoter().promote(m, [_Fixed([nac([0, 1, 2, 3])])], T0)
    log += pattern_events(m, [_record("trend", MathCategory.PATTERN, ["grasp"], 0.8, slope_per_day=-0.1).record], T0)
    log += SemanticPromoter().promote(m, [StatisticianPromotionSource(m.ag)], T0)
    assert snapshot(fold_events(log)[OWNER]) == snapshot(m)


# ---- tau-bench, end to end --------------------------------------------------------------------------

AGENT = "airline"
UNRELIABLE = ("book_reservation", "update_reservation_flights")


def _tau_episodes(path: Path) -> list[EpisodeDistilled]:
    events = [msgspec.convert(e, TraceEvent) for e in openai_chat(path, agent=AGENT)]
    return distill({}, events).episodes


def _raw_failed_sessions(path: Path) -> dict[str, set[str]]:
    """tool -> session ids with a failed call of it, read from the raw file (not the importer)."""
    out: dict[str, set[str]] = defaultdict(set)
    for traj in json.loads(path.read_bytes()):
        names = {}
        for msg in traj["traj"]:
            for tc in msg.get("tool_calls") or []:
                names[tc["id"]] = tc["function"]["name"]
            if msg["role"] == "tool" and (msg.get("content") or "").startswith("Error"):
                out[msg.get("name") or names[msg["tool_call_id"]]].add(
                    f"{path.stem}-task{traj['task_id']}-trial{traj['trial']}"
                )
    return out


def _error_links(rows: list[CallOutcome], alpha: float = 0.1) -> list[CausalLinkView]:
    """A stand-in for processors/prediction/causal_links.py: per tool, the link tool -> error learned by Rescorla-Wagner
    (V += α(λ - V), λ = 1 for an error) over its calls in order; confidence n / (n + 2) of the
    tool's calls; observations: the failed calls (time, episode), as parallel lists."""
    by_tool: dict[str, list[CallOutcome]] = defaultdict(list)
    for r in rows:
        by_tool[r.tool].append(r)
    links = []
    for tool in sorted(by_tool):
        v = 0.0
        times, eps = [], []
        for r in by_tool[tool]:
            v += alpha * ((0.0 if r.ok else 1.0) - v)
            if not r.ok:
                times.append(r.at)
                eps.append(r.episode_id)
        if times:
            n = len(by_tool[tool])
            links.append(
                CausalLinkView(
                    event_signature=f"sig-{tool}",
                    tool=tool,
                    outcome="error",
                    valence="negative",
                    strength=v,
                    confidence=n / (n + 2),
                    observation_count=len(times),
                    observation_times=times,
                    source_episode_ids=eps,
                )
            )
    return links


def _tau_run(path: Path, gate: object) -> tuple[list[bytes], MemoryLayers, list[EpisodeDistilled]]:
    episodes = _tau_episodes(path)
    rows = call_outcomes(episodes)
    m = MemoryLayers(f"agent:{AGENT}")
    m.apply_all(episodes)
    now = max(e.ended_at for e in episodes)
    log = pattern_events(m, Statistician(m.owner).analyse(rows), now)
    promoter = (
        SemanticPromoter(gate=gate, activity_times=[e.ended_at for e in episodes])
        if gate
        else SemanticPromoter(gate=None)
    )
    log += promoter.promote(m, [NacPromotionSource(_error_links(rows)), StatisticianPromotionSource(m.ag)], now)
    return [encode_semantic(e) for e in log], m, episodes


def test_tau_bench_timings_are_synthetic_and_the_gate_finds_no_structure_in_them(tau_bench_path):
    episodes = _tau_episodes(tau_bench_path)
    # the importer stamps session i at 20:00 UTC + 10 minutes * i (file order: trial-major): 200 sessions, 33 hours
    starts = sorted(e.started_at for e in episodes)
    assert starts[0] == DEFAULT_START and all(b - a == timedelta(minutes=10) for a, b in zip(starts, starts[1:]))
    assert (starts[-1] - starts[0]) < timedelta(days=pr.PHASE_MIN_SPAN_DAYS)
    blob, m, _ = _tau_run(tau_bench_path, ips_gate)
    rejected = {e.pattern_name: e.reason for e in map(decode_semantic, blob) if isinstance(e, CandidateRejected)}
    for tool in UNRELIABLE:
        reason = rejected[f"{tool} → error"]
        assert reason.startswith("no temporal structure: dispersion") and "phase test skipped" in reason
        assert m.atl.find(f"{tool}_unreliable") is None


def test_tau_bench_unreliable_calls_are_promoted_with_derived_from_edges_to_exactly_the_failed_episodes(tau_bench_path):
    blob, m, episodes = _tau_run(tau_bench_path, None)  # no gate: the synthetic times say nothing (see above)
    by_session = {e.session_id: str(e.episode_id) for e in episodes}
    failed = _raw_failed_sessions(tau_bench_path)
    for tool in UNRELIABLE:
        cid = m.atl.find(f"{tool}_unreliable")
        want = {by_session[s] for s in failed[tool]}
        derived = {e.target[1] for e in m.cross.edges((Layer.ATL, cid), CrossEdgeType.DERIVED_FROM)}
        instance = {e.source[1] for e in m.cross.edges((Layer.ATL, cid), CrossEdgeType.INSTANCE_OF)}
        assert (
            derived == instance == want
            and len(want) == {"book_reservation": 15, "update_reservation_flights": 20}[tool]
        )
        c = m.atl.get(cid)
        assert c.reinforcement_count == len(want) and c.confidence == pytest.approx(0.5 + 0.1 * math.sqrt(len(want)))
        assert m.atl.relationships(cid)[0].relation == "IS_A"
        assert all(tool in m.hippocampus.get(e).failed_tools for e in want)
    # one failure of update_reservation_baggages: below the 3 observations a candidate needs
    assert m.atl.find("update_reservation_baggages_unreliable") is None
    assert len(failed["update_reservation_baggages"]) == 1
    # 33 hours of data: no statistical pattern is confirmed (a trend needs 4 days)
    assert len(m.ag) == 0
    ctx = knowledge_context(m, query="book reservation payment")
    assert ctx[0].name == "book_reservation_unreliable" and "Relationships: IS_A unreliable_tool" in ctx[0].text
    # replay: a second run from the same file gives the same bytes; the log rebuilds the same memory
    blob2, m2, _ = _tau_run(tau_bench_path, None)
    assert blob2 == blob
    rebuilt = fold_events([decode_semantic(b) for b in blob])[m.owner]
    rebuilt.apply_all(episodes)
    assert snapshot(rebuilt) == snapshot(m)


def test_docstring_examples_run():
    assert doctest.testmod(pr).failed == 0


def _counted(k: int, n: int, base: float, times: list) -> PromotionCandidate:
    return PromotionCandidate(
        pattern_name="t → error:x",
        category="causal_pattern",
        confidence=0.9,
        source_memory_ids=[],
        observation_times=times,
        metadata={"observation_count": k, "event_observations": n, "base_rate": base},
    )


def test_the_gate_lets_a_steady_but_significant_failure_rate_through_on_its_counts():
    from datetime import datetime, timedelta, timezone

    import numpy as np
    from scipy.stats import binomtest

    rng = np.random.default_rng(3)  # failure times uniformly random over a month: no timing structure
    t0 = datetime(2024, 5, 1, tzinfo=timezone.utc)
    times = sorted(t0 + timedelta(seconds=float(x)) for x in rng.uniform(0, 30 * 86400, 30))
    timing_only = ips_gate(
        _counted(30, 53, 0.063, times).__class__(
            pattern_name="t → error:x",
            category="causal_pattern",
            confidence=0.9,
            source_memory_ids=[],
            observation_times=times,
        )
    )
    assert not timing_only.passed  # what the timing test alone says of a steady rate
    got = ips_gate(_counted(30, 53, 0.063, times))  # tau-bench's book_reservation: 30 of 53, fleet rate 6.3%
    assert got.passed and got.test == "counts"
    assert got.p_value == pytest.approx(binomtest(30, 53, 0.063, alternative="greater").pvalue)
    # a rate no higher than the fleet's is no evidence: the timing test decides (and turns it away)
    assert not ips_gate(_counted(4, 60, 0.063, times)).passed


# ---- provenance: the agents a concept was derived from ------------------------------------------


def test_a_concept_promoted_from_a_pattern_carries_the_patterns_source_agents():
    m = MemoryLayers(OWNER)
    ev = _record("trend-grasp", MathCategory.PATTERN, ["grasp"], 0.73, slope_per_day=-0.02)
    m.apply(msgspec.structs.replace(ev, record=msgspec.structs.replace(ev.record, source_agents=["robot", "arm"])))
    SemanticPromoter(gate=None).promote(m, [StatisticianPromotionSource(m.ag)], T0)
    c = m.atl.get(m.atl.find("grasp_success_declining"))
    assert c.properties["source_agents"] == ["arm", "robot"]
    assert "robot" not in c.embedding_text  # provenance, not content: it does not match queries


def test_a_nac_concept_carries_its_links_agents_and_gains_those_of_a_later_reinforcement():
    def link(agents: list[str], episodes: list[str]) -> CausalLinkView:
        return CausalLinkView(
            event_signature="sig-pay",
            tool="pay",
            outcome="error:declined",
            valence="negative",
            strength=0.7,
            confidence=0.8,
            observation_count=len(episodes),
            observation_times=[at(3600 * i) for i in range(len(episodes))],
            source_episode_ids=episodes,
            source_agents=agents,
        )

    m = MemoryLayers("team:billing-lead")
    SemanticPromoter(gate=None).promote(m, [NacPromotionSource([link(["billing"], ["e1", "e2", "e3"])])], T0)
    cid = m.atl.find("pay_unreliable")
    assert m.atl.get(cid).properties["source_agents"] == ["billing"]
    SemanticPromoter(gate=None).promote(m, [NacPromotionSource([link(["billing2"], ["e4", "e5", "e6"])])], T0)
    assert m.atl.get(cid).properties["source_agents"] == ["billing", "billing2"]
    # a link without recorded agents (a request from before the field) adds no property
    old = MemoryLayers(OWNER)
    SemanticPromoter(gate=None).promote(old, [NacPromotionSource([link([], ["e1", "e2", "e3"])])], T0)
    assert "source_agents" not in old.atl.get(old.atl.find("pay_unreliable")).properties


def test_abstracted_topics_become_concepts_derived_from_their_memories_and_decay():
    # A conversation has no tool calls: its ATL is fed by dream phase B's abstracted topics.
    from somnus.processors.semantic.promotion import ABSTRACTION, AbstractionPromotionSource
    from somnus.schemas.semantic import ConceptPromoted, TopicView

    t0 = datetime(2024, 5, 1, tzinfo=timezone.utc)
    topics = [
        TopicView(
            pattern_id="p1",
            agent="conv-1",
            key="pottery",
            domains=["s1", "s2"],
            support=3,
            source_ids=["m1", "m2", "m3"],
        ),
        TopicView(pattern_id="p2", agent="conv-1", key="hike", domains=["s1"], support=4, source_ids=["m4"]),
    ]
    cands = AbstractionPromotionSource(topics).get_promotion_candidates()
    assert [(c.pattern_name, c.confidence, c.origin) for c in cands] == [("topic:pottery", 0.75, ABSTRACTION)]
    assert ips_gate(cands[0]).passed  # abstraction already asked for support across domains
    m = MemoryLayers("global")
    evs = SemanticPromoter().promote(m, [AbstractionPromotionSource(topics)], t0)
    assert [type(e) for e in evs if isinstance(e, ConceptPromoted)] == [ConceptPromoted]
    cid = m.atl.find("pottery")
    concept = m.atl.get(cid)
    assert concept.category == "topic" and concept.properties["source_agents"] == ["conv-1"]
    from somnus.schemas.semantic import Layer

    assert len(m.cross.edges((Layer.ATL, cid))) == 6  # DERIVED_FROM and INSTANCE_OF, 3 memories
    # one reinforcement per session, not per memory: 2, under the ATL's protected count of 3
    assert concept.reinforcement_count == 2 and concept.evidence == ["session:s1", "session:s2"]
    assert not m.consolidate(t0 + timedelta(days=30))  # not idle for more than 30 days yet


def test_a_topic_not_reinforced_for_more_than_the_decay_window_leaves_the_atl():
    # Event time only: the topic's promotion time and the consolidation's time are stream times.
    from somnus.processors.semantic.layers import ATL_MAX_AGE_DAYS, ATL_PROTECTED_COUNT
    from somnus.processors.semantic.promotion import AbstractionPromotionSource
    from somnus.schemas.semantic import RecordRemoved, TopicView

    assert (ATL_MAX_AGE_DAYS, ATL_PROTECTED_COUNT) == (30, 3)
    t0 = datetime(2024, 5, 1, tzinfo=timezone.utc)
    two = TopicView(
        pattern_id="p1",
        agent="c",
        key="pottery",
        domains=["s1", "s2"],
        support=5,
        source_ids=["m1", "m2", "m3", "m4", "m5"],
    )
    three = TopicView(
        pattern_id="p2", agent="c", key="kiln", domains=["s1", "s2", "s3"], support=3, source_ids=["m6", "m7", "m8"]
    )
    m = MemoryLayers("global")
    SemanticPromoter().promote(m, [AbstractionPromotionSource([two, three])], t0)
    pottery, kiln = m.atl.find("pottery"), m.atl.find("kiln")
    assert not m.consolidate(t0 + timedelta(days=30))
    gone = m.consolidate(t0 + timedelta(days=30, seconds=1))
    assert [(type(e), e.record_id) for e in gone] == [(RecordRemoved, pottery)]  # kiln: 3 sessions, protected
    m.apply_all(gone)
    assert m.atl.find("pottery") is None and m.atl.get(kiln) is not None
    # a later session's abstraction reinforces it, and the window starts again
    m2 = MemoryLayers("global")
    SemanticPromoter().promote(m2, [AbstractionPromotionSource([two])], t0)
    again = TopicView(
        pattern_id="p3", agent="d", key="pottery", domains=["s2", "s9"], support=3, source_ids=["m9", "m10", "m11"]
    )
    SemanticPromoter().promote(m2, [AbstractionPromotionSource([again])], t0 + timedelta(days=20))
    assert m2.atl.get(m2.atl.find("pottery")).reinforcement_count == 3  # s9 is new evidence
    assert not m2.consolidate(t0 + timedelta(days=45))
