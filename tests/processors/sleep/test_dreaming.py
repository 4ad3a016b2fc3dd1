"""somnus.processors.sleep.dreaming: phase A (cluster / hold / create, adaptive thresholds, schema congruence),
phase B (connect, FSRS-6 review of due memories, abstraction) and prediction-error saturation."""

from __future__ import annotations

import doctest
import math
from datetime import datetime, timedelta, timezone

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from somnus.processors.sleep import dreaming
from somnus.processors.sleep.dreaming import (
    ABSTRACT_MAX_SOURCES,
    ABSTRACT_MIN_DOMAINS,
    ABSTRACT_MIN_SUPPORT,
    BORDERLINE_MARGIN,
    CONNECT_LIMIT,
    CONNECT_THRESHOLD,
    DENSITY_K,
    DUE_FACTOR,
    FSRS6_PARAMETERS,
    MERGE_PE,
    MIN_SCHEMA_EDGES,
    RELEARNING_MIN_DAYS,
    REVIEW_MIN_DAYS,
    SATURATION_MIN_SAMPLES,
    SATURATION_THRESHOLD,
    SATURATION_WINDOW_DAYS,
    SURPRISE_PE,
    US_PER_DAY,
    abstract_patterns,
    adaptive_threshold,
    composite_rating,
    connect_recent,
    dream_phase_a,
    due,
    initial_difficulty,
    initial_stability,
    next_interval,
    pattern_id_for,
    pe_saturation,
    retrievability,
    review,
)

DAY = US_PER_DAY


def unit(angle_deg: float) -> np.ndarray:
    a = math.radians(angle_deg)
    return np.array([math.cos(a), math.sin(a), 0.0])


def at_pe(pe: float) -> np.ndarray:
    """A unit vector whose similarity to (1, 0, 0) is 1 - pe."""
    return unit(math.degrees(math.acos(1.0 - pe)))


def phase_a(
    mem: list[tuple[str, str, np.ndarray, int]], obs: list[tuple[str, str, int, np.ndarray]], **kw: object
) -> dreaming.PhaseA:
    return dream_phase_a(
        [m[0] for m in mem],
        [m[1] for m in mem],
        np.array([m[2] for m in mem]).reshape(len(mem), 3),
        np.array([m[3] for m in mem]),
        [o[0] for o in obs],
        [o[1] for o in obs],
        np.array([o[2] for o in obs]),
        np.array([o[3] for o in obs]).reshape(len(obs), 3),
        **kw,
    )  # type: ignore[arg-type]


def test_doctests() -> None:
    assert doctest.testmod(dreaming).failed == 0


def test_constants_are_pinned() -> None:
    assert (MERGE_PE, SURPRISE_PE, DENSITY_K, BORDERLINE_MARGIN, MIN_SCHEMA_EDGES) == (0.15, 0.5, 5, 0.05, 2)
    assert (CONNECT_THRESHOLD, CONNECT_LIMIT, DUE_FACTOR) == (0.5, 5, 0.8)
    assert (ABSTRACT_MIN_SUPPORT, ABSTRACT_MIN_DOMAINS, ABSTRACT_MAX_SOURCES) == (3, 2, 20)
    assert (SATURATION_WINDOW_DAYS, SATURATION_THRESHOLD, SATURATION_MIN_SAMPLES) == (14, 0.15, 5)
    assert (RELEARNING_MIN_DAYS, REVIEW_MIN_DAYS) == (0.5, 1.0)
    assert FSRS6_PARAMETERS[20] == 0.1542 and len(FSRS6_PARAMETERS) == 21


def test_adaptive_threshold_spans_sparse_to_dense() -> None:
    got = adaptive_threshold(np.array([-1.0, 0.0, 0.5, 1.0, 2.0]))
    assert got.tolist() == pytest.approx([0.075, 0.075, 0.15, 0.225, 0.225])


# --- phase A ---------------------------------------------------------------------------------------

E1 = np.array([1.0, 0.0, 0.0])
FAR = np.array([0.0, 0.0, 1.0])


def test_low_prediction_error_clusters_into_a_well_linked_memory() -> None:
    r = phase_a([("m1", "a", E1, 3)], [("o1", "a", 1, at_pe(0.01))])
    assert r.clustered.rows() == [("o1", "m1", "a", pytest.approx(0.01), 0.075)]  # one memory: density 0
    assert r.refined.rows() == [("m1", "a", ["o1"], pytest.approx(0.01))]
    assert r.created.height == 0 and r.held.height == 0


def test_borderline_match_to_a_sparse_schema_is_held() -> None:
    # one memory -> density 0 -> threshold 0.075; PE 0.05 is within 0.05 of it
    held = phase_a([("m1", "a", E1, 1)], [("o1", "a", 1, at_pe(0.05))])
    assert held.held.rows() == [("o1", "m1", "a", pytest.approx(0.05), 1)]
    assert held.clustered.height == 0 and held.created.height == 0
    # the same match to a memory with 2 edges clusters
    linked = phase_a([("m1", "a", E1, MIN_SCHEMA_EDGES)], [("o1", "a", 1, at_pe(0.05))])
    assert linked.clustered.height == 1
    # not borderline (PE 0.02 < 0.075 - 0.05): clusters even into a sparse schema
    clear = phase_a([("m1", "a", E1, 0)], [("o1", "a", 1, at_pe(0.02))])
    assert clear.clustered.height == 1


def test_dense_regions_cluster_more_eagerly_than_sparse_ones() -> None:
    # PE 0.12: above the sparse threshold (0.075) but under a dense one (up to 0.225)
    obs = [("o1", "a", 1, at_pe(0.12))]
    sparse = phase_a([("m1", "a", E1, 5), ("m2", "a", FAR, 5)], obs)
    assert sparse.clustered.height == 0 and sparse.created.height == 1
    neighbours = [(f"n{k}", "a", unit(-3 - k), 5) for k in range(6)]  # close to m1: density ~0.99
    dense = phase_a([("m1", "a", E1, 5), *neighbours], obs)
    assert dense.clustered["memory_id"].to_list() == ["m1"]
    assert dense.clustered["threshold"][0] > 0.2


def test_unclustered_observations_are_created_related_or_surprising() -> None:
    r = phase_a([("m1", "a", E1, 5)], [("o1", "a", 1, at_pe(0.3)), ("o2", "a", 2, np.array([-1.0, 0.0, 0.0]))])
    rows = {row[0]: row for row in r.created.rows()}
    assert rows["o1"][3:] == ("m1", False, True)  # related: linked to its nearest memory
    assert rows["o2"][2] == 1.0 and rows["o2"][4:] == (True, False)  # surprise: PE clipped to 1
    assert r.created["nearest_id"].to_list() == ["m1", "o1"]  # o2 is nearest to nothing closer than o1


def test_a_later_observation_clusters_into_one_created_earlier_in_the_run() -> None:
    v = unit(80)
    r = phase_a([("m1", "a", E1, 5)], [("o2", "a", 20, v), ("o1", "a", 10, v)])
    assert r.created["observation_id"].to_list() == ["o1"]  # time order: o1 first
    # o1's density: its similarity to its only neighbour, m1 (cos 80 deg)
    threshold = round(MERGE_PE * (0.5 + math.cos(math.radians(80))), 6)
    assert r.clustered.rows() == [("o2", "o1", "a", 0.0, threshold)]


def test_agents_never_share_memories() -> None:
    r = phase_a([("m1", "a", E1, 5)], [("o1", "b", 1, E1)])
    assert r.created.rows()[0][:4] == ("o1", "b", 1.0, None)


def test_ties_go_to_the_smallest_id_whatever_the_chunking() -> None:
    mem = [("m3", "a", E1, 5), ("m1", "a", E1, 5), ("m2", "a", E1, 5)]
    obs = [("o1", "a", 1, E1)]
    assert phase_a(mem, obs).clustered["memory_id"].to_list() == ["m1"]
    assert phase_a(mem, obs, chunk=1).clustered["memory_id"].to_list() == ["m1"]


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 10_000), st.integers(1, 7))
def test_phase_a_is_independent_of_chunk_size_and_input_order(seed: int, chunk: int) -> None:
    rng = np.random.default_rng(seed)
    m, k = 12, 8
    mv = rng.standard_normal((m, 3))
    mv /= np.linalg.norm(mv, axis=1, keepdims=True)
    ov = mv[rng.integers(0, m, k)] + 0.05 * rng.standard_normal((k, 3))
    ov /= np.linalg.norm(ov, axis=1, keepdims=True)
    mem = [(f"m{i}", "ab"[i % 2], mv[i], int(rng.integers(0, 4))) for i in range(m)]
    obs = [(f"o{i}", "ab"[i % 2], int(rng.integers(0, 5)), ov[i]) for i in range(k)]
    base = phase_a(mem, obs)
    other = phase_a(mem[::-1], obs[::-1], chunk=chunk)
    for name in ("clustered", "held", "created", "refined"):
        assert getattr(base, name).sort(pl.all()).equals(getattr(other, name).sort(pl.all())), name
    fates = base.clustered.height + base.held.height + base.created.height
    assert fates == k  # every observation gets exactly one fate


# --- phase B: connect --------------------------------------------------------------------------------


def test_connect_threshold_limit_and_existing_edges() -> None:
    # similarity exactly 0.5 connects; 0.49 does not
    v = np.array([[1.0, 0.0], [0.5, math.sqrt(0.75)], [0.49, math.sqrt(1 - 0.49**2)]])
    got = connect_recent(["a", "b", "c"], ["x"] * 3, v)
    assert got.select("a", "b").rows() == [("b", "c"), ("a", "b")]
    assert connect_recent(["a", "b", "c"], ["x"] * 3, v, existing={("a", "b")}).select("a", "b").rows() == [("b", "c")]
    # 7 identical memories: 21 pairs, but each end takes at most 5 new edges
    same = np.tile([1.0, 0.0], (7, 1))
    edges = connect_recent([f"m{i}" for i in range(7)], ["x"] * 7, same)
    degree = pl.concat([edges["a"], edges["b"]]).value_counts()
    assert degree["count"].max() == CONNECT_LIMIT
    degree = edges
    # greedy in (weight desc, a, b) order: m0..m5 fill up among themselves, m6 gets none
    assert edges.height == 15 and "m6" not in degree["a"].to_list() + degree["b"].to_list()
    assert connect_recent(["a", "b"], ["x", "y"], np.array([[1.0, 0.0], [1.0, 0.0]])).height == 0  # other agent
    # existing edges among them count toward the limit: connecting again adds nothing
    again = connect_recent(
        [f"m{i}" for i in range(7)], ["x"] * 7, same, existing=set(edges.select("a", "b").iter_rows())
    )
    assert again.height == 0


# --- phase B: FSRS-6 ---------------------------------------------------------------------------------


def test_retrievability_and_intervals() -> None:
    s = np.array([0.5, 1.0, 10.0, 100.0])
    assert retrievability(s, s) == pytest.approx(np.full(4, 0.9))
    assert retrievability(np.zeros(4), s) == pytest.approx(np.ones(4))
    assert next_interval(np.array([0.2, 10.0, 10.6, 1e6])).tolist() == [1, 10, 11, 36500]


def test_initial_state_per_rating() -> None:
    g = np.array([1, 2, 3, 4])
    assert initial_stability(g).tolist() == list(FSRS6_PARAMETERS[:4])
    assert initial_difficulty(g) == pytest.approx(np.clip([6.4133 - math.exp(0.8334 * k) + 1 for k in range(4)], 1, 10))


def test_composite_rating() -> None:
    got = composite_rating(np.array([0, 1, 2, 3, 9, 0, 9]), np.array([False] * 5 + [True, True]))
    assert got.tolist() == [2, 3, 3, 4, 4, 1, 1]


def test_only_due_memories_are_reviewed() -> None:
    s = np.array([10.0, 10.0, np.nan])
    assert due(s, np.array([7.99, 8.0, 0.0])).tolist() == [False, True, True]
    now = 100 * DAY
    r = review(
        s,
        np.array([5.0, 5.0, np.nan]),
        np.array([now - int(7.9 * DAY), now - 8 * DAY, 0]),
        np.array([3, 3, 0]),
        np.array([1, 1, 0]),
        np.array([False, False, False]),
        now,
    )
    assert r.rows.tolist() == [1, 2]
    assert r.rating.tolist() == [3, 2]
    assert r.stability[1] == pytest.approx(FSRS6_PARAMETERS[1])  # first review, hard
    assert r.retrievability[1] == 1.0


def test_short_term_threshold_depends_on_relearning() -> None:
    now = 100 * DAY
    elapsed = now - int(0.7 * DAY)
    args = (np.array([0.5]), np.array([5.0]), np.array([elapsed]))
    relearning = review(*args, np.array([1]), np.array([1]), np.array([False]), now)
    reviewing = review(*args, np.array([3]), np.array([1]), np.array([False]), now)
    # 0.7 days: long-term formula after an "again" (>= 0.5), short-term otherwise (< 1.0)
    assert relearning.stability[0] != pytest.approx(reviewing.stability[0])
    assert reviewing.stability[0] == pytest.approx(dreaming.short_term_stability(np.array([0.5]), np.array([3]))[0])


@pytest.fixture(scope="module")
def py_fsrs():  # type: ignore[no-untyped-def]
    return pytest.importorskip("fsrs", reason="py-fsrs (PyPI `fsrs`) not installed: cross-check skipped")


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 4), st.integers(1, 60)), min_size=1, max_size=8))
def test_reviews_match_py_fsrs(py_fsrs, history: list[tuple[int, int]]) -> None:  # type: ignore[no-untyped-def]
    scheduler = py_fsrs.Scheduler(learning_steps=(), relearning_steps=(), enable_fuzzing=False)
    card = py_fsrs.Card()
    t = datetime(2024, 1, 1, tzinfo=timezone.utc)
    s, d, last, last_rating = np.array([np.nan]), np.array([np.nan]), np.array([0]), np.array([0])
    for rating, gap_days in history:
        t = t + timedelta(days=gap_days)
        card, _ = scheduler.review_card(card, py_fsrs.Rating(rating), review_datetime=t)
        now = int(t.timestamp() * 1e6)
        # force due (DUE_FACTOR 0): py-fsrs reviews whenever asked; the rating is the given one
        accesses = {1: 0, 2: 0, 3: 1, 4: 3}[rating]
        r = review(s, d, last, last_rating, np.array([accesses]), np.array([rating == 1]), now, factor=0.0)
        assert r.stability[0] == pytest.approx(card.stability, rel=1e-9)
        assert r.difficulty[0] == pytest.approx(card.difficulty, rel=1e-9)
        assert int(r.interval_days[0]) == (card.due - t).days
        s, d, last, last_rating = r.stability, r.difficulty, np.array([now]), np.array([rating])


# --- phase B: abstraction ----------------------------------------------------------------------------


def memories(rows: list[tuple[str, str, str, list[str]]]) -> pl.DataFrame:
    return pl.DataFrame(
        rows,
        schema={"memory_id": pl.String, "agent": pl.String, "domain": pl.String, "index_keys": pl.List(pl.String)},
        orient="row",
    )


def test_abstraction_needs_support_and_several_domains() -> None:
    m = memories(
        [
            ("m1", "a", "web", ["timeout", "retry"]),
            ("m2", "a", "db", ["timeout"]),
            ("m3", "a", "web", ["timeout", "retry"]),
            ("m4", "a", "web", ["retry"]),
            ("m5", "b", "db", ["timeout"]),
            ("m6", "a", "", ["timeout"]),
        ]
    )
    got = abstract_patterns(m)
    # retry: 3 memories but one domain; timeout of agent b: one memory; m6 has no domain
    assert got.select("agent", "key", "domains", "support", "source_ids", "source_domains").rows() == [
        ("a", "timeout", ["db", "web"], 3, ["m1", "m2", "m3"], ["web", "db", "web"])
    ]
    assert got["pattern_id"][0] == pattern_id_for("a", "timeout")
    assert abstract_patterns(m, {pattern_id_for("a", "timeout")}).height == 0  # already abstracted


def test_abstraction_keeps_at_most_twenty_sources() -> None:
    m = memories([(f"m{i:02d}", "a", "web" if i % 2 else "db", ["k"]) for i in range(30)])
    got = abstract_patterns(m)
    assert got["support"][0] == 30
    assert got["source_ids"][0].to_list() == [f"m{i:02d}" for i in range(20)]


def test_pattern_ids_are_stable() -> None:
    assert (
        pattern_id_for("a", "timeout")
        == "pattern-" + __import__("hashlib").blake2b(b"a\x1ftimeout", digest_size=8).hexdigest()
    )


# --- prediction-error saturation ------------------------------------------------------------------


def test_saturation_window_threshold_and_samples() -> None:
    now = 100 * DAY
    times = np.array([now - 13 * DAY, now - 10 * DAY, now - 5 * DAY, now - 1 * DAY, now])
    low = pe_saturation(times, np.full(5, 0.1), now)
    assert (low.saturated, low.status, low.samples, low.mean_pe) == (True, "saturated", 5, 0.1)
    assert pe_saturation(times, np.full(5, 0.15), now).status == "healthy"  # not below 0.15
    assert pe_saturation(times[:4], np.full(4, 0.1), now).status == "insufficient"
    # an observation 14 days old is in the previous window, not this one
    old = pe_saturation(np.r_[times, now - 14 * DAY, now - 20 * DAY], np.r_[np.full(5, 0.1), 0.9, 0.7], now)
    assert old.samples == 5 and old.previous_mean_pe == pytest.approx(0.8)


def test_the_merge_pe_adapts_to_the_agents_own_nearest_neighbours() -> None:
    from somnus.processors.sleep.dreaming import NEAREST_MIN_SAMPLES, NEAREST_QUANTILE, agent_merge_pe

    assert (NEAREST_QUANTILE, NEAREST_MIN_SAMPLES) == (0.1, 10)
    close = np.full(20, 0.05)  # tool traces: near-duplicates everywhere -> the design's 0.15
    assert agent_merge_pe(close) == 0.15
    chat = np.linspace(0.3, 0.9, 61)  # chat: the closest tenth of its neighbour pairs, 0.36
    assert agent_merge_pe(chat) == pytest.approx(0.36)
    assert agent_merge_pe(chat[:9]) == 0.15  # too few matched memories to read a geometry from
    assert agent_merge_pe(np.full(20, 0.95)) == 0.5  # never above the surprise PE


def test_a_chat_like_agent_clusters_at_its_own_scale() -> None:
    # 12 memories whose nearest neighbours are all at PE 0.4 (messages sharing a few words), density
    # 0.6; each observation is at PE 0.3 of one of them: the agent's merge PE is 0.4, the threshold
    # 0.44, so all cluster (the fixed 0.15 gave 0.165: all created)
    d, n = 40, 12
    mem = np.zeros((n, d))
    mem[:, 0] = math.sqrt(0.6)
    mem[np.arange(n), 1 + np.arange(n)] = math.sqrt(0.4)
    obs = mem.copy()
    obs[np.arange(n), 20 + np.arange(n)] = math.sqrt(1 / 0.49 - 1)
    obs /= np.linalg.norm(obs, axis=1, keepdims=True)
    ids = [f"m{k:02d}" for k in range(n)]
    r = dream_phase_a(ids, ["a"] * n, mem, np.full(n, 5), [f"o{k:02d}" for k in range(n)], ["a"] * n, np.arange(n), obs)
    assert r.clustered["memory_id"].to_list() == ids and r.created.height == 0
    assert r.clustered["threshold"].to_list() == [pytest.approx(0.44)] * n
