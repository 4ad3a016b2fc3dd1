"""somnus.processors.prediction.patterns (Angular Gyrus): trends, correlations and phase locking over call outcomes,
their thresholds, their SQL, and the events that record them."""

from __future__ import annotations

import doctest
import math
import uuid
from datetime import datetime, timedelta, timezone

import duckdb
import msgspec
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats as sps

from somnus.processors.prediction import patterns as ag
from somnus.processors.prediction.patterns import (
    COMPUTED_FROM_MAX,
    Statistician,
    call_outcomes,
    cosinor,
    f2_survival,
    pattern_events,
)
from somnus.processors.semantic.layers import MemoryLayers
from somnus.schemas.codec import encode
from somnus.schemas.episodes import CallSeen, EpisodeDistilled
from somnus.schemas.events import Outcome
from somnus.schemas.semantic import (
    CallOutcome,
    CrossEdgeType,
    CrossLayerEdgeFormed,
    Layer,
    MathCategory,
    PatternConfirmed,
    decode_semantic,
    encode_semantic,
)

T0 = datetime(2024, 5, 1, tzinfo=timezone.utc)
OWNER = "agent:robot"


def test_thresholds_are_pinned():
    assert ag.FDR_Q == 0.001
    assert (ag.TREND_MIN_DAYS, ag.TREND_MIN_CALLS_PER_DAY, ag.TREND_MIN_R2, ag.TREND_MIN_ABS_SLOPE) == (5, 3, 0.5, 0.01)
    assert (ag.CORR_MIN_DAYS, ag.CORR_MIN_AGENT_DAYS, ag.CORR_MIN_JOINT_EPISODES, ag.CORR_MIN_ABS_R) == (7, 3, 3, 0.7)
    assert (ag.PHASE_MIN_EPISODES, ag.PHASE_MIN_DAYS, ag.PHASE_MIN_HOURS, ag.PHASE_MIN_AMPLITUDE) == (20, 3, 6, 0.1)
    assert COMPUTED_FROM_MAX == 64


def rows_by_day(
    tool: str, rates: list[float], per_day: int = 10, hour: float = 12.0, agent: str = "robot"
) -> list[CallOutcome]:
    """``per_day`` calls a day at ``hour``; the first round(rate * per_day) of them succeed."""
    out = []
    for d, rate in enumerate(rates):
        k = round(rate * per_day)
        for i in range(per_day):
            out.append(
                CallOutcome(
                    tool,
                    ok=i < k,
                    at=T0 + timedelta(days=d, hours=hour, seconds=i),
                    episode_id=f"{tool}-d{d}-{i // 2}",
                    agent=agent,
                )
            )
    return out


def joint_days(
    rates: dict[str, list[float]], episodes: list[int] | int = 5, agent: str = "robot", calls: int = 2
) -> list[CallOutcome]:
    """Tools used together: each day's episodes call every tool ``calls`` times; day d's rate of a tool
    is the share of its calls that succeed (the first ones)."""
    days = len(next(iter(rates.values())))
    per_day = [episodes] * days if isinstance(episodes, int) else episodes
    out = []
    for tool, rs in rates.items():
        for d, (rate, n_ep) in enumerate(zip(rs, per_day)):
            n = n_ep * calls
            k = round(rate * n)
            for i in range(n):
                out.append(
                    CallOutcome(
                        tool,
                        ok=i < k,
                        at=T0 + timedelta(days=d, hours=12, seconds=i),
                        episode_id=f"{agent}-d{d}-e{i % n_ep}",
                        agent=agent,
                    )
                )
    return out


# ---- input ------------------------------------------------------------------------------------


def _episode(i: int, calls: list[CallSeen]) -> EpisodeDistilled:
    return EpisodeDistilled(
        episode_id=uuid.UUID(int=i),
        schema_version=1,
        agent="robot",
        session_id=f"s{i}",
        task="t",
        goal=None,
        user_id=None,
        summary="",
        outcome=Outcome.SUCCESS,
        started_at=T0,
        ended_at=T0 + timedelta(hours=i),
        duration_s=1.0,
        event_count=1,
        tool_calls=len(calls),
        tools=sorted({c.tool for c in calls}),
        errors=[],
        lessons=[],
        delegations=[],
        first_event_id=uuid.UUID(int=1),
        last_event_id=uuid.UUID(int=2),
        calls=calls,
    )


def test_call_outcomes_use_call_times_else_the_episode_end_and_skip_calls_without_result():
    at = T0 + timedelta(minutes=3)
    ep = _episode(2, [CallSeen(tool="a", ok=True, at=at), CallSeen(tool="b", ok=False), CallSeen(tool="c")])
    assert call_outcomes([ep]) == [
        CallOutcome("a", True, at, str(uuid.UUID(int=2)), "robot"),
        CallOutcome("b", False, ep.ended_at, str(uuid.UUID(int=2)), "robot"),
    ]


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
    assert rec.source_agents == ["robot"] and 0 < rec.statistics["q_value"] < ag.FDR_Q


def test_the_trend_is_least_squares_on_daily_rates_weighted_by_calls():
    rates = [0.9, 0.7, 0.8, 0.5, 0.6, 0.3, 0.4, 0.2, 0.3, 0.1]
    (rec,) = Statistician(OWNER).trends(rows_by_day("nav", rates))
    fit = sps.linregress(np.arange(10.0), rates)
    assert rec.statistics["slope_per_day"] == pytest.approx(fit.slope, abs=1e-6)
    assert rec.confidence == pytest.approx(fit.rvalue**2, abs=1e-6)  # equal calls a day: plain OLS
    assert rec.statistics["p_value"] == pytest.approx(fit.pvalue, rel=1e-6)
    # a quiet day (3 calls) that breaks the line weighs a tenth of a busy one (30 calls)
    quiet = [r for r in rows_by_day("nav", [1.0] * 11, per_day=3) if r.at >= T0 + timedelta(days=10)]
    busy = rows_by_day("nav", rates, per_day=30)
    (rec,) = Statistician(OWNER).trends(busy + quiet)
    w = [30] * 10 + [3]
    x, y = np.arange(11.0), np.array(rates + [1.0])
    mx, my = np.average(x, weights=w), np.average(y, weights=w)
    slope = np.sum(w * (x - mx) * (y - my)) / np.sum(w * (x - mx) ** 2)
    assert rec.statistics["slope_per_day"] == pytest.approx(slope, abs=1e-6)
    assert slope < sps.linregress(x, y).slope < 0  # unweighted, the quiet day would flatten the line


@pytest.mark.parametrize(
    "rates,why",
    [
        ([1.0, 0.9, 0.8, 0.7], "4 days < 5"),
        ([0.9, 0.9, 0.9, 0.9, 0.9], "flat"),
        ([0.9, 0.5, 0.9, 0.5, 0.9, 0.5, 0.8], "R² < 0.5"),
        ([0.995, 0.99, 0.985, 0.98, 0.975, 0.97], "slope 0.005/day < 0.01"),
    ],
)
def test_no_trend_below_the_thresholds(rates, why):
    assert Statistician(OWNER).trends(rows_by_day("nav", rates, per_day=200)) == [], why


def test_days_with_fewer_than_3_calls_do_not_count():
    rows = rows_by_day("nav", [1.0, 0.9, 0.8, 0.7, 0.6]) + [
        r for r in rows_by_day("nav", [0.0] * 7, per_day=2) if r.at >= T0 + timedelta(days=5)
    ]
    (rec,) = Statistician(OWNER).trends(rows)
    assert rec.statistics["days"] == 5 and rec.statistics["slope_per_day"] == pytest.approx(-0.1)


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

A = [0.9, 0.5, 0.8, 0.4, 0.9, 0.3, 0.7, 0.5]
B = [0.8, 0.4, 0.8, 0.3, 0.9, 0.2, 0.6, 0.4]


def test_two_success_rates_moving_together_correlate():
    recs = Statistician(OWNER).correlations(joint_days({"nav": A, "arm": B}))
    (rec,) = recs  # call counts are constant (10 a day): no correlation can involve them
    assert rec.name == "stat:corr:arm.success_rate~nav.success_rate"
    assert rec.statistics["r"] == pytest.approx(np.corrcoef(A, B)[0, 1], abs=1e-6)  # 10 calls a day: r of the rates
    assert rec.confidence == pytest.approx(rec.statistics["r"] ** 2, abs=1e-6)
    assert rec.subjects == ["arm", "nav"] and rec.statistics["days"] == 8 and rec.source_agents == ["robot"]
    assert "move together beyond the day's activity" in rec.verbal


def test_correlation_needs_seven_days():
    assert Statistician(OWNER).correlations(joint_days({"nav": A[:6], "arm": B[:6]})) == []


def test_tools_never_used_together_are_never_correlated():
    # the same rates, but nav and arm never in one episode: nothing to join them
    rows = rows_by_day("nav", A) + rows_by_day("arm", B)
    assert Statistician(OWNER).correlations(rows) == []
    # two agents on the same calendar (both busy on the same days), each with its own tool
    volume = [2, 9, 3, 12, 1, 8, 2, 11, 3, 10]
    rows = joint_days({"nav": [0.8] * 10}, volume, agent="a1") + joint_days({"arm": [0.8] * 10}, volume, agent="a2")
    assert Statistician("global").analyse(rows) == []


def test_call_counts_that_only_follow_activity_are_no_pattern():
    """Two tools called in every episode: their daily counts are r = +1.00 in plain Pearson (the 126
    concepts of issue 26), and nothing once the day's activity is accounted for."""
    rng = np.random.RandomState(5)
    volume = [int(v) for v in rng.randint(1, 30, 14)]
    rows = joint_days({"nav": [0.5] * 14, "arm": [0.5] * 14}, volume)
    calls = [sum(r.tool == "nav" and r.at.day == T0.day + d for r in rows) for d in range(14)]
    assert np.corrcoef(calls, volume)[0, 1] == pytest.approx(1.0)
    assert Statistician(OWNER).analyse(rows) == []


def test_a_relation_beyond_activity_is_found_with_the_co_using_agents_as_provenance():
    # the scraper's two tools fail together on outage days; a researcher calls one of them too
    rng = np.random.RandomState(3)
    outage = rng.random_sample(12) < 0.4
    volume = [int(v) for v in rng.randint(3, 12, 12)]
    bad = [0.2 if o else 0.9 for o in outage]
    rows = joint_days({"http_get": bad, "parse_html": [r + 0.05 for r in bad]}, volume, agent="scraper")
    rows += joint_days({"http_get": [0.9] * 12, "summarize": [0.95] * 12}, volume, agent="researcher")
    recs = Statistician("global").analyse(rows)
    corr = {r.name: r for r in recs if r.category is MathCategory.CORRELATION}
    rec = corr["stat:corr:http_get.success_rate~parse_html.success_rate"]
    assert rec.statistics["r"] > 0.9 and rec.source_agents == ["scraper"]
    assert all(r.subjects in (["http_get", "parse_html"], ["http_get"], ["parse_html"]) for r in recs)
    assert all(set(r.subjects) != {"http_get", "summarize"} for r in recs)


def _activity(draw_seed: int, days: int, agents: int, tools: int, plant: bool = False) -> list[CallOutcome]:
    """Random independent activity: agents with random tools (some shared), sessions a day varying
    widely (weekends quiet, busy and idle days), each tool called in a session with its own
    probability, each call ok with its own probability, at working hours. With ``plant``: agent 0's
    tools t0 and t1 (used together in every session) fail together on random outage days, and t2's
    success declines over the days (from 0.95 to 0.15), at about 20 sessions a working day."""
    rng = np.random.RandomState(draw_seed)
    pool = [f"t{i}" for i in range(tools)]
    out: list[CallOutcome] = []
    outage = rng.random_sample(days) < 0.3
    for a in range(agents):
        names = list(rng.choice(pool, size=int(rng.randint(1, tools + 1)), replace=False))
        if plant:  # the planted tools are agent 0's alone; the others use the rest
            names = ["t0", "t1", "t2"] if a == 0 else [t for t in names if t not in ("t0", "t1", "t2")] or ["t3"]
        use = {t: (1.0 if plant and a == 0 else rng.uniform(0.2, 1.0)) for t in names}
        p_ok = {t: rng.uniform(0.3, 1.0) for t in names}
        base = 20.0 if plant and a == 0 else rng.uniform(2, 15)
        for d in range(days):
            for s_ in range(rng.poisson(base * rng.lognormal(0, 0.8) * (0.15 if d % 7 >= 5 else 1.0))):
                at = T0 + timedelta(days=d, hours=float(np.clip(rng.normal(13, 3), 0, 23.9)))
                for t in names:
                    if rng.random_sample() >= use[t]:
                        continue
                    p = p_ok[t]
                    if plant and a == 0 and t in ("t0", "t1"):
                        p = 0.25 if outage[d] else 0.95
                    if plant and a == 0 and t == "t2":
                        p = 0.95 - 0.8 * d / days
                    for k in range(1 + rng.poisson(0.5)):
                        out.append(
                            CallOutcome(
                                t,
                                bool(rng.random_sample() < p),
                                at + timedelta(seconds=20 * k),
                                f"a{a}-d{d}-s{s_}",
                                f"agent{a}",
                            )
                        )
    return out


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.integers(0, 2**31 - 1), st.integers(3, 40), st.integers(1, 3), st.integers(1, 7))
def test_random_independent_activity_produces_no_pattern(seed, days, agents, tools):
    """No relation, no pattern. BH at ``FDR_Q`` bounds the chance that a run on such data confirms
    anything at ``FDR_Q`` (the calibration test below measures it), so the examples are fixed
    (``derandomize``): a run of this test is reproducible rather than failing at that rate."""
    assert Statistician("global").analyse(_activity(seed, days, agents, tools)) == []


def test_false_patterns_are_as_rare_as_the_fdr_level_promises():
    runs, found = 300, 0
    rng = np.random.RandomState(2024)
    for i in range(runs):
        rows = _activity(i, int(rng.randint(3, 40)), int(rng.randint(1, 4)), int(rng.randint(2, 8)))
        found += bool(Statistician("global").analyse(rows))
    # measured: 0 of 600 such runs at FDR_Q = 0.001; 2% at 0.01; 5.5% at 0.01 with plain Pearson r of raw counts
    assert found <= 0.01 * runs


@settings(max_examples=25, deadline=None, derandomize=True)
@given(st.integers(0, 2**31 - 1), st.integers(21, 42), st.integers(1, 3))
def test_a_planted_relation_is_still_found(seed, days, agents):
    recs = Statistician("global").analyse(_activity(seed, days, agents, 7, plant=True))
    names = {r.name for r in recs}
    assert "stat:corr:t0.success_rate~t1.success_rate" in names
    assert "stat:tool:t2:success" in names
    t2 = next(r for r in recs if r.name == "stat:tool:t2:success")
    assert t2.statistics["slope_per_day"] < 0 and "agent0" in t2.source_agents


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000))
def test_the_correlation_is_pearson_of_the_scaled_residuals_given_activity(seed):
    rng = np.random.RandomState(seed)
    days = 12
    volume = [int(v) for v in rng.randint(1, 8, days)]
    rows = joint_days({t: list(rng.uniform(0, 1, days)) for t in ("a", "b")}, volume)
    tests = Statistician(OWNER)._correlation_tests(ag._Table(rows))
    tb = ag._Table(rows)
    calls, succ = tb.daily()
    z = tb.daily_episodes(np.ones(len(rows), dtype=bool))
    for t in tests:
        rec = t.record(0.0)
        a, b = rec.name.removeprefix("stat:corr:").split("~")

        def series(metric: str) -> np.ndarray:
            tool, kind = metric.split(".")
            i = list(tb.tools).index(tool)
            return calls[i] if kind == "calls" else np.where(calls[i] >= 3, succ[i] / np.maximum(calls[i], 1), np.nan)

        x, y = series(a), series(b)
        ok = ~np.isnan(x) & ~np.isnan(y)
        design = np.column_stack([np.ones(ok.sum()), z[ok]])
        scale = [
            np.sqrt(z[ok]) if m.endswith(".calls") else 1 / np.sqrt(calls[list(tb.tools).index(m.split(".")[0])][ok])
            for m in (a, b)
        ]
        res = [(v - design @ np.linalg.lstsq(design, v, rcond=None)[0]) / sc for v, sc in zip((x[ok], y[ok]), scale)]
        rho = sps.pearsonr(*res).statistic
        assert rec.statistics["r"] == pytest.approx(rho, abs=1e-6)
        df = int(ok.sum()) - 3
        want_p = 2 * sps.t.sf(abs(rho) * np.sqrt(df / (1 - rho**2)), df)
        assert rec.statistics["p_value"] == pytest.approx(want_p, rel=1e-4)


# ---- phase locking -------------------------------------------------------------------------------


def _hourly(tool: str, days: int, good: callable, seed: int = 0) -> list[CallOutcome]:
    rng = np.random.RandomState(seed)
    out = []
    for d in range(days):
        for h in range(24):
            for k in range(2):
                p = good(h)
                out.append(
                    CallOutcome(
                        tool,
                        ok=bool(rng.random_sample() < p),
                        at=T0 + timedelta(days=d, hours=h, minutes=20 * k),
                        episode_id=f"{tool}-{d}-{h}",
                    )
                )
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
        con.execute(
            "INSERT INTO episodes VALUES (?, 'robot', ?, ?)", [e, max(r.at for r in rs), encode(calls).decode()]
        )
    con.execute(
        "INSERT INTO episodes VALUES ('other', 'someone_else', ?, ?)",
        [T0, encode([CallSeen(tool="nav", ok=False, at=T0)]).decode()],
    )
    return con


def test_the_trend_and_correlation_queries_reproduce_the_records():
    a = [0.9, 0.5, 0.8, 0.4, 0.9, 0.3, 0.7, 0.5, 0.9, 0.4]
    b = [0.8, 0.4, 0.8, 0.3, 0.9, 0.2, 0.6, 0.4, 0.8, 0.5]
    volume = [5, 9, 3, 7, 6, 10, 4, 8, 5, 6]  # episodes a day: the activity the correlation is given
    rows = rows_by_day("nav", [1.0, 0.9, 0.85, 0.7, 0.6, 0.5, 0.45, 0.3]) + joint_days({"arm": a, "leg": b}, volume)
    con = _episodes_db(rows)
    recs = Statistician(OWNER).analyse(rows)
    trend = next(r for r in recs if r.name == "stat:tool:nav:success")
    slope, r2, days = con.execute(trend.query).fetchone()
    assert (slope, r2, days) == (
        pytest.approx(trend.statistics["slope_per_day"], abs=1e-6),
        pytest.approx(trend.statistics["r2"], abs=1e-6),
        8,
    )
    corr = next(r for r in recs if r.name == "stat:corr:arm.success_rate~leg.success_rate")
    r, n = con.execute(corr.query).fetchone()
    assert r == pytest.approx(corr.statistics["r"], abs=1e-6) and n == 10
    assert "e.agent IN ('robot')" in corr.query
    assert "e.agent IN ('a', 'b')" in Statistician("team:lead", agents=["b", "a"]).trends(rows)[0].query
    phase_sql = Statistician(OWNER)._phase_sql("nav")
    assert con.execute(phase_sql).fetchall() == [
        (12, 40, pytest.approx(np.mean([x.ok for x in rows if x.tool == "nav"])))
    ]


def test_a_record_without_provenance_still_decodes():
    """Records written before ``source_agents`` existed decode with an empty provenance."""
    rec = Statistician(OWNER).trends(rows_by_day("nav", [1.0, 0.9, 0.8, 0.7, 0.6, 0.5]))[0]
    ev = PatternConfirmed(owner=OWNER, record=msgspec.structs.replace(rec, source_agents=[]), at=T0)
    old = encode_semantic(ev)
    assert b"source_agents" not in old and decode_semantic(old).record.source_agents == []
    new = PatternConfirmed(owner=OWNER, record=rec, at=T0)
    assert decode_semantic(encode_semantic(new)) == new and rec.source_agents == ["robot"]


# ---- events ----------------------------------------------------------------------------------------


def test_pattern_events_confirm_once_and_link_computed_from_episodes():
    rows = rows_by_day("nav", [1.0, 0.9, 0.8, 0.7, 0.6, 0.5])
    recs = Statistician(OWNER).analyse(rows)
    m = MemoryLayers(OWNER)
    evs = pattern_events(m, recs, T0)
    (rec,) = recs  # one trend (all calls at noon: no phase lock; one tool: no correlation)
    assert [type(e) for e in evs] == [PatternConfirmed] + [CrossLayerEdgeFormed] * len(rec.source_episode_ids)
    assert {(e.edge_type, e.source_layer, e.target_layer, e.weight) for e in evs[1:]} == {
        (CrossEdgeType.COMPUTED_FROM, Layer.ANGULAR_GYRUS, Layer.HIPPOCAMPUS, 1.0)
    }
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


def test_on_the_sample_fleet_and_tau_bench_no_pattern_joins_tools_no_agent_uses_together(tau_bench_path):
    import orjson

    from somnus.importers import openai_chat
    from somnus.processors.sessions.distiller import distill
    from somnus.sample import generate
    from somnus.schemas.codec import decode_trace

    events = list(generate(sessions=2000, seed=42)) + list(openai_chat(tau_bench_path, agent="airline"))
    episodes = distill({}, [decode_trace(orjson.dumps(e), 1 << 20) for e in events]).episodes
    together: dict[frozenset[str], set[str]] = {}
    for ep in episodes:
        tools = sorted({c.tool for c in ep.calls})
        for i, a in enumerate(tools):
            for b in tools[i + 1 :]:
                together.setdefault(frozenset((a, b)), set()).add(ep.agent)
    recs = Statistician("global").analyse(call_outcomes(episodes))
    assert recs  # weeks of a fleet: something to confirm
    for rec in recs:
        assert rec.source_agents, rec.name
        if rec.category is MathCategory.CORRELATION:
            assert set(rec.source_agents) <= together[frozenset(rec.subjects)], rec.name
        assert "airline" not in rec.source_agents or set(rec.subjects) <= {
            c.tool for ep in episodes if ep.agent == "airline" for c in ep.calls
        }
