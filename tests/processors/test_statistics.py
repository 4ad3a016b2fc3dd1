"""processors.statistics (Angular Gyrus): trends, correlations and phase locking over call outcomes,
their thresholds, their SQL, and the events that record them."""

from __future__ import annotations

import doctest
import math
import uuid
from datetime import datetime, timedelta, timezone

import duckdb
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats as sps

from processors import statistics as ag
from processors.layers import MemoryLayers
from processors.statistics import (
    COMPUTED_FROM_MAX,
    CallOutcome,
    Statistician,
    call_outcomes,
    cosinor,
    f2_survival,
    pattern_events,
)
from schemas.codec import encode
from schemas.episodes import CallSeen, EpisodeDistilled
from schemas.events import Outcome
from schemas.semantic import CrossEdgeType, CrossLayerEdgeFormed, Layer, MathCategory, PatternConfirmed

T0 = datetime(2024, 5, 1, tzinfo=timezone.utc)
OWNER = "agent:robot"


def test_thresholds_are_pinned():
    assert (ag.TREND_MIN_DAYS, ag.TREND_MIN_CALLS_PER_DAY, ag.TREND_MIN_R2, ag.TREND_MAX_P, ag.TREND_MIN_ABS_SLOPE) == (
        4, 3, 0.5, 0.05, 0.01)
    assert (ag.CORR_MIN_DAYS, ag.CORR_MIN_ABS_R, ag.CORR_MAX_Q) == (5, 0.7, 0.05)
    assert (ag.PHASE_MIN_CALLS, ag.PHASE_MIN_DAYS, ag.PHASE_MIN_HOURS, ag.PHASE_MAX_P, ag.PHASE_MIN_AMPLITUDE) == (
        20, 3, 6, 0.01, 0.1)
    assert COMPUTED_FROM_MAX == 64


def rows_by_day(tool: str, rates: list[float], per_day: int = 10, hour: float = 12.0) -> list[CallOutcome]:
    """``per_day`` calls a day at ``hour``; the first round(rate * per_day) of them succeed."""
    out = []
    for d, rate in enumerate(rates):
        k = round(rate * per_day)
        for i in range(per_day):
            out.append(CallOutcome(tool, ok=i < k, at=T0 + timedelta(days=d, hours=hour, seconds=i),
                                   episode_id=f"{tool}-d{d}-{i // 2}"))
    return out


# ---- input ------------------------------------------------------------------------------------

def _episode(i: int, calls: list[CallSeen]) -> EpisodeDistilled:
    return EpisodeDistilled(
        episode_id=uuid.UUID(int=i), schema_version=1, agent="robot", session_id=f"s{i}", task="t", goal=None,
        user_id=None, summary="", outcome=Outcome.SUCCESS, started_at=T0, ended_at=T0 + timedelta(hours=i),
        duration_s=1.0, event_count=1, tool_calls=len(calls), tools=sorted({c.tool for c in calls}), errors=[],
        lessons=[], delegations=[], first_event_id=uuid.UUID(int=1), last_event_id=uuid.UUID(int=2), calls=calls)


def test_call_outcomes_use_call_times_else_the_episode_end_and_skip_calls_without_result():
    at = T0 + timedelta(minutes=3)
    ep = _episode(2, [CallSeen(tool="a", ok=True, at=at), CallSeen(tool="b", ok=False), CallSeen(tool="c")])
    assert call_outcomes([ep]) == [CallOutcome("a", True, at, str(uuid.UUID(int=2)), "robot"),
                                   CallOutcome("b", False, ep.ended_at, str(uuid.UUID(int=2)), "robot")]


# ---- trends ------------------------------------------------------------------------------------

def test_a_declining_success_rate_is_a_confirmed_trend():
    rows = rows_by_day("nav", [1.0, 0.9, 0.8, 0.7, 0.6, 0.5])
    (rec,) = Statistician(OWNER).trends(rows)
    assert rec.category is MathCategory.PATTERN and rec.subjects == ["nav"] and rec.domain == "tool_reliability"
    assert rec.statistics["slope_per_day"] == pytest.approx(-0.1)
    assert rec.statistics["r2"] == pytest.approx(1.0) and rec.confidence == pytest.approx(1.0)
    assert rec.n_observations == 60 and rec.statistics["days"] == 6
    assert rec.verbal.startswith("nav showing declining success rate (R²=1.00, slope=-0.100/day")
    assert rec.name == "stat:tool:nav:success"
    assert rec.math_id == ag.math_id_for(OWNER, MathCategory.PATTERN, "nav.success_rate")


def test_the_trend_is_ordinary_least_squares_on_daily_rates():
    rates = [0.9, 0.7, 0.8, 0.5, 0.6, 0.3, 0.4]
    (rec,) = Statistician(OWNER).trends(rows_by_day("nav", rates))
    fit = sps.linregress(np.arange(7.0), rates)
    assert rec.statistics["slope_per_day"] == pytest.approx(fit.slope, abs=1e-6)
    assert rec.confidence == pytest.approx(fit.rvalue ** 2, abs=1e-6)


@pytest.mark.parametrize("rates,why", [
    ([1.0, 0.8, 0.6], "3 days < 4"),
    ([0.9, 0.9, 0.9, 0.9, 0.9], "flat"),
    ([0.9, 0.5, 0.9, 0.5, 0.9, 0.5, 0.8], "R² < 0.5"),
    ([0.995, 0.99, 0.985, 0.98, 0.975, 0.97], "slope 0.005/day < 0.01"),
])
def test_no_trend_below_the_thresholds(rates, why):
    assert Statistician(OWNER).trends(rows_by_day("nav", rates, per_day=200)) == [], why


def test_days_with_fewer_than_3_calls_do_not_count():
    rows = rows_by_day("nav", [1.0, 0.9, 0.8, 0.7]) + [r for r in rows_by_day("nav", [0.0] * 6, per_day=2)
                                                       if r.at >= T0 + timedelta(days=4)]
    (rec,) = Statistician(OWNER).trends(rows)
    assert rec.statistics["days"] == 4 and rec.statistics["slope_per_day"] == pytest.approx(-0.1)


def test_computed_from_episodes_are_the_latest_64():
    rows = rows_by_day("nav", [1.0, 0.9, 0.8, 0.7, 0.6, 0.5], per_day=40)  # 20 episodes a day
    (rec,) = Statistician(OWNER).trends(rows)
    assert len(rec.source_episode_ids) == COMPUTED_FROM_MAX
    assert {e.split("-")[1] for e in rec.source_episode_ids} == {"d5", "d4", "d3", "d2"}  # 20 + 20 + 20 + 4
    assert rec.source_episode_ids == sorted(rec.source_episode_ids)


def test_results_do_not_depend_on_input_order():
    rows = rows_by_day("nav", [1.0, 0.9, 0.8, 0.7, 0.6, 0.5]) + rows_by_day("arm", [0.5, 0.6, 0.7, 0.8, 0.9, 1.0])
    s = Statistician(OWNER)
    assert s.analyse(rows) == s.analyse(rows[::-1]) and len(s.analyse(rows)) >= 2


# ---- correlations ------------------------------------------------------------------------------

def test_two_success_rates_moving_together_correlate():
    a = [0.9, 0.5, 0.8, 0.4, 0.9, 0.3, 0.7, 0.5]
    b = [0.8, 0.4, 0.8, 0.3, 0.9, 0.2, 0.6, 0.4]
    recs = Statistician(OWNER).correlations(rows_by_day("nav", a) + rows_by_day("arm", b))
    rec = next(r for r in recs if r.name == "stat:corr:arm.success_rate~nav.success_rate")
    assert rec.statistics["r"] == pytest.approx(np.corrcoef(a, b)[0, 1], abs=1e-6)
    assert rec.confidence == pytest.approx(rec.statistics["r"] ** 2, abs=1e-6)
    assert rec.subjects == ["arm", "nav"] and rec.statistics["days"] == 8
    assert "move together" in rec.verbal
    # call counts are constant (10 a day): no correlation can involve them
    assert all(".calls" not in r.name for r in recs)


def test_correlation_needs_five_days():
    a, b = [0.9, 0.5, 0.8, 0.4], [0.8, 0.4, 0.8, 0.3]
    assert Statistician(OWNER).correlations(rows_by_day("nav", a) + rows_by_day("arm", b)) == []


def test_noise_does_not_correlate_after_the_fdr_correction():
    rng = np.random.RandomState(7)
    found = 0
    for trial in range(5):
        rows = []
        for t in range(10):
            rows += rows_by_day(f"t{t}", list(rng.uniform(0.3, 1.0, 8)), per_day=int(rng.randint(5, 15)))
        found += len(Statistician(OWNER).correlations(rows))
    assert found <= 1  # 190 pairs x 5 trials of pure noise


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000))
def test_pairwise_complete_correlations_match_scipy(seed):
    rng = np.random.RandomState(seed)
    rows = []
    for t in range(3):
        rates = list(rng.uniform(0, 1, 9))
        per_day = [int(x) for x in rng.choice([0, 2, 5, 9], size=9)]
        for d, (rate, n) in enumerate(zip(rates, per_day)):
            rows += [r for r in rows_by_day(f"t{t}", [0.0] * d + [rate], per_day=n) if r.at >= T0 + timedelta(days=d)]
    st_ = Statistician(OWNER)
    tb = ag._Table(rows)
    calls, succ = tb.daily()
    for rec in st_.correlations(rows):
        a, b = rec.name.removeprefix("stat:corr:").split("~")
        def series(metric: str) -> np.ndarray:
            tool, kind = metric.split(".")
            i = list(tb.tools).index(tool)
            if kind == "calls":
                return np.where(calls.sum(axis=0) > 0, calls[i], np.nan)
            return np.where(calls[i] >= 3, succ[i] / np.maximum(calls[i], 1), np.nan)
        x, y = series(a), series(b)
        ok = ~np.isnan(x) & ~np.isnan(y)
        assert rec.statistics["r"] == pytest.approx(sps.pearsonr(x[ok], y[ok]).statistic, abs=1e-6)
        assert rec.statistics["p_value"] == pytest.approx(sps.pearsonr(x[ok], y[ok]).pvalue, rel=1e-4)


# ---- phase locking -------------------------------------------------------------------------------

def _hourly(tool: str, days: int, good: callable, seed: int = 0) -> list[CallOutcome]:
    rng = np.random.RandomState(seed)
    out = []
    for d in range(days):
        for h in range(24):
            for k in range(2):
                p = good(h)
                out.append(CallOutcome(tool, ok=bool(rng.random_sample() < p),
                                       at=T0 + timedelta(days=d, hours=h, minutes=20 * k), episode_id=f"{tool}-{d}-{h}"))
    return out


def test_success_locked_to_the_afternoon_is_a_phase_lock():
    rows = _hourly("nav", 4, lambda h: 0.5 + 0.4 * math.cos(2 * math.pi * (h - 15) / 24))
    (rec,) = Statistician(OWNER).phase_locks(rows)
    assert rec.category is MathCategory.PHASE_LOCK and rec.domain == "circadian"
    assert abs(rec.statistics["phase_hour"] - 15) < 1.5
    assert rec.statistics["coupling"] == rec.statistics["amplitude"] >= 0.25
    assert rec.statistics["p_value"] < 0.01 and rec.n_observations == 4 * 48


def test_no_phase_lock_for_a_flat_rate_or_too_few_days():
    flat = _hourly("nav", 4, lambda h: 0.6, seed=3)
    assert Statistician(OWNER).phase_locks(flat) == []
    locked_two_days = _hourly("nav", 2, lambda h: 0.5 + 0.45 * math.cos(2 * math.pi * (h - 15) / 24))
    assert Statistician(OWNER).phase_locks(locked_two_days) == []
    # calls at five hours of the day only: no phase lock, however strong
    five_hours = [r for r in _hourly("nav", 6, lambda h: 0.9 if h < 3 else 0.1) if r.at.hour < 5]
    assert Statistician(OWNER).phase_locks(five_hours) == []


def test_f2_survival_is_the_exact_f_distribution():
    for f in (0.1, 1.0, 3.0, 7.5, 20.0):
        for d2 in (3, 10, 57, 400):
            assert f2_survival(f, d2) == pytest.approx(sps.f.sf(f, 2, d2), rel=1e-9)


def test_cosinor_recovers_a_known_rhythm():
    h = np.arange(0, 72, 0.5)
    y = 0.4 + 0.2 * np.cos(2 * np.pi * (h - 20) / 24)
    fit = cosinor(h, y)
    assert fit["mesor"] == pytest.approx(0.4) and fit["amplitude"] == pytest.approx(0.2)
    assert fit["phase_hour"] == pytest.approx(20.0) and fit["r2"] == pytest.approx(1.0)
    assert cosinor(np.full(10, 9.0), np.arange(10.0)) is None  # one phase only: no circle to fit


# ---- the SQL computes the same numbers -----------------------------------------------------------

def _episodes_db(rows: list[CallOutcome]) -> duckdb.DuckDBPyConnection:
    con = duckdb.connect()
    con.execute("CREATE TABLE episodes (episode_id VARCHAR, agent VARCHAR, ended_at TIMESTAMPTZ, calls JSON)")
    by_ep: dict[str, list[CallOutcome]] = {}
    for r in rows:
        by_ep.setdefault(r.episode_id, []).append(r)
    for e, rs in sorted(by_ep.items()):
        calls = [CallSeen(tool=r.tool, ok=r.ok, at=r.at) for r in rs]
        con.execute("INSERT INTO episodes VALUES (?, 'robot', ?, ?)", [e, max(r.at for r in rs), encode(calls).decode()])
    con.execute("INSERT INTO episodes VALUES ('other', 'someone_else', ?, ?)",
                [T0, encode([CallSeen(tool="nav", ok=False, at=T0)]).decode()])
    return con


def test_the_trend_and_correlation_queries_reproduce_the_records():
    a = [0.9, 0.5, 0.8, 0.4, 0.9, 0.3, 0.7, 0.5]
    b = [0.8, 0.4, 0.8, 0.3, 0.9, 0.2, 0.6, 0.4]
    rows = rows_by_day("nav", [1.0, 0.9, 0.85, 0.7, 0.6, 0.5, 0.45, 0.3]) + rows_by_day("arm", a) + rows_by_day("leg", b)
    con = _episodes_db(rows)
    recs = Statistician(OWNER).analyse(rows)
    trend = next(r for r in recs if r.name == "stat:tool:nav:success")
    slope, r2, days = con.execute(trend.query).fetchone()
    assert (slope, r2, days) == (pytest.approx(trend.statistics["slope_per_day"], abs=1e-6),
                                 pytest.approx(trend.statistics["r2"], abs=1e-6), 8)
    corr = next(r for r in recs if r.name == "stat:corr:arm.success_rate~leg.success_rate")
    r, n = con.execute(corr.query).fetchone()
    assert r == pytest.approx(corr.statistics["r"], abs=1e-6) and n == 8
    assert "e.agent IN ('a', 'b')" in Statistician("team:lead", agents=["b", "a"]).analyse(rows)[0].query
    phase_sql = Statistician(OWNER)._phase_sql("nav")
    assert con.execute(phase_sql).fetchall() == [(12, 80, pytest.approx(np.mean([x.ok for x in rows if x.tool == "nav"])))]


# ---- events ----------------------------------------------------------------------------------------

def test_pattern_events_confirm_once_and_link_computed_from_episodes():
    rows = rows_by_day("nav", [1.0, 0.9, 0.8, 0.7, 0.6, 0.5])
    recs = Statistician(OWNER).analyse(rows)
    m = MemoryLayers(OWNER)
    evs = pattern_events(m, recs, T0)
    (rec,) = recs  # one trend (all calls at noon: no phase lock; one tool: no correlation)
    assert [type(e) for e in evs] == [PatternConfirmed] + [CrossLayerEdgeFormed] * len(rec.source_episode_ids)
    assert {(e.edge_type, e.source_layer, e.target_layer, e.weight) for e in evs[1:]} == {
        (CrossEdgeType.COMPUTED_FROM, Layer.ANGULAR_GYRUS, Layer.HIPPOCAMPUS, 1.0)}
    assert sorted(e.target_id for e in evs[1:]) == rec.source_episode_ids
    assert pattern_events(m, recs, T0) == []  # unchanged: nothing
    rows2 = rows + rows_by_day("nav", [0.0] * 6 + [0.3])[-10:]
    evs2 = pattern_events(m, Statistician(OWNER).analyse(rows2), T0 + timedelta(days=7))
    assert isinstance(evs2[0], PatternConfirmed) and m.ag.entry(rec.math_id).revision == 2


def test_docstring_examples_run():
    assert doctest.testmod(ag).failed == 0


@given(st.lists(st.text(alphabet="ab-_é", max_size=4), max_size=60))
def test_factorize_is_numpys_unique_with_inverse(values):
    # The statistician's tool and episode codes: the same distinct names in the same order, the same codes.
    names, codes = ag.factorize(values)
    if values:
        want_names, want_codes = np.unique(np.array(values, dtype=object), return_inverse=True)
        assert names.tolist() == want_names.tolist() and codes.tolist() == want_codes.tolist()
    else:
        assert names.tolist() == [] and codes.tolist() == []
    assert names.dtype == object and codes.dtype == np.int64
