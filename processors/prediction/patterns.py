"""The Angular Gyrus statistician: confirmed statistical patterns over tool-call outcomes.
Deterministic and pure: the input is a table of call outcomes, the output ``MathRecord``s.

Input: one ``CallOutcome`` per tool call with a result (``call_outcomes(episodes)``). A call's time is
``CallSeen.at``, or its episode's end for episodes from before calls had times; days and hours are UTC.

**When a pattern is confirmed.** Each analysis below is a family of tests. A pattern is confirmed
only when (1) its data meet the analysis' *minimum support* (below it nothing is tested), (2) its
effect reaches the analysis' *floor* (a pattern too small to act on is not knowledge), and (3) its
Benjamini-Hochberg q-value, over **every test of the run** (``analyse``: all trends, correlations
and phase tests together), is below ``FDR_Q``. On data with no relation at all, BH at level q
confirms anything in a run with probability at most q; with many days the floors make it far
rarer (tests/processors/prediction/test_patterns.py measures the rate on random independent activity).

Each record names its provenance, ``source_agents``: the agents whose calls it was computed from.

- **Trend** (``PATTERN``), per tool: the daily success rate (days with >= ``TREND_MIN_CALLS_PER_DAY``
  calls) regressed on the day by least squares weighted by the day's calls (a rate's variance is
  about p(1-p)/calls: a quiet weekend day with 3 calls must not weigh as much as a working day with
  30), slope tested with Student's t on days - 2 degrees of freedom (``weighted_line``). Support:
  >= ``TREND_MIN_DAYS`` such days. Floor: R² >= ``TREND_MIN_R2`` and |slope| >=
  ``TREND_MIN_ABS_SLOPE`` per day. Confidence = R².
- **Correlation** (``CORRELATION``), only between two tools *used together*: both called in the
  same episode at least ``CORR_MIN_JOINT_EPISODES`` times. The data are the calls of the agents that
  used the two together (the provenance), per agent and day: the two tools' call counts, and their
  success rates (days with >= ``TREND_MIN_CALLS_PER_DAY`` calls), on the days the agent made any
  call. Counts are compared with counts and rates with rates; a count against a rate is not tested:
  it mostly restates how agents behave (a failed call is retried, so its tool's calls rise as its
  rate falls; a failed step ends the task, so the next tool's calls fall), which the episodes say
  better. The statistic is a **partial correlation given the
  day's activity, within each agent**: per agent, both series are regressed on [1, the agent's
  episodes that day] (on [1] when those are constant); each residual is scaled by its expected
  spread (a count's by 1/√episodes, a rate's by √calls); the residuals of all agents are pooled and
  their Pearson r is tested with Student's t on (days - fitted parameters - 1) degrees of freedom.
  Why: a tool's daily calls are about activity x its share of the work, so any two tools of a busy
  agent "move together" with r near 1 and it means nothing (one import of unrelated datasets made
  126 such concepts). Regressing on the activity removes that common factor and keeps what the two
  share beyond it; doing it per agent keeps one agent's busy days or higher success rate from
  passing for a relation in a team's or the fleet's data; the scaling, because a busy day makes both
  count residuals large whatever their signs (a quiet day both rate residuals), and r of such noise
  is "significant" far more often than its t test says. Correlating shares instead is
  compositional (two tools that make up an agent's calls have shares at r = -1 by construction); a
  permutation null preserving the daily totals tests the same thing by simulation, at more cost and
  with no SQL to reproduce it. Support:
  >= ``CORR_MIN_DAYS`` (agent, day) points where both series are defined, an agent contributing
  from ``CORR_MIN_AGENT_DAYS``. Floor: |r| >= ``CORR_MIN_ABS_R``. Confidence = r².
- **Phase locking** (``PHASE_LOCK``), per tool: does the success rate follow the circadian phase?
  One observation per episode (the share of the tool's calls in it that succeeded, at the hour of
  its first one): retries within an episode are not independent observations; with several agents,
  each agent's mean is removed first (one agent working other hours with another success rate is no
  rhythm of the tool). Cosinor regression
  ``ok ~ b0 + b1 cos θ + b2 sin θ`` (θ = 2π·hour/24) with the exact F(2, n-3) test ``p = (1 +
  2F/(n-3))^(-(n-3)/2)``. Support: >= ``PHASE_MIN_EPISODES`` episodes on >= ``PHASE_MIN_DAYS`` days in
  >= ``PHASE_MIN_HOURS`` distinct hours of the day, not all with the same rate. Floor: amplitude >=
  ``PHASE_MIN_AMPLITUDE``. A regression rather than a Rayleigh test of the failures' phases, because
  that test is confounded by *when* calls happen (an agent busy at 9 am fails most at 9 am); the
  regression is conditional on the phases observed. Phase = the hour of peak success; coupling = the
  amplitude (success-rate units). Confidence = the cosinor R².

>>> from datetime import datetime, timedelta, timezone
>>> t0 = datetime(2024, 5, 1, 12, tzinfo=timezone.utc)
>>> rows = [CallOutcome("nav", ok=(i % 10) >= d, at=t0 + timedelta(days=d), episode_id=f"e{d}-{i}", agent="robot")
...         for d in range(6) for i in range(10)]
>>> [(r.name, r.statistics["slope_per_day"], r.source_agents) for r in Statistician("agent:robot").trends(rows)]
[('stat:tool:nav:success', -0.1, ['robot'])]
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import msgspec
import numpy as np
from scipy import stats as sps

from somnus.processors.semantic.layers import MemoryLayers
from somnus.schemas.episodes import EpisodeDistilled
from somnus.schemas.semantic import (
    CrossEdgeType,
    CrossLayerEdgeFormed,
    Layer,
    MathCategory,
    MathRecord,
    PatternConfirmed,
    SemanticEvent,
)
from somnus.schemas.semantic import CallOutcome

FDR_Q = 0.001  # Benjamini-Hochberg level over all tests of one run
TREND_MIN_DAYS = 5
TREND_MIN_CALLS_PER_DAY = 3
TREND_MIN_R2 = 0.5
TREND_MIN_ABS_SLOPE = 0.01  # success rate per day
CORR_MIN_DAYS = 7
CORR_MIN_JOINT_EPISODES = 3  # episodes calling both tools: "used together"
CORR_MIN_ABS_R = 0.7
CORR_MIN_AGENT_DAYS = 3  # days an agent needs to add to a correlation (its fit takes two)
PHASE_MIN_EPISODES = 20
PHASE_MIN_DAYS = 3
PHASE_MIN_HOURS = 6  # distinct hours of the day: fewer cannot tell a rhythm from a constant
PHASE_MIN_AMPLITUDE = 0.1
COMPUTED_FROM_MAX = 64  # COMPUTED_FROM edges per record: the latest episodes, not all of them
DAY_S = 86400.0

MATH_NAMESPACE = uuid.UUID("5a1e9c3b-2d7f-4e8a-b6c1-0f9d8e7a6b5c")


def call_outcomes(episodes: Iterable[EpisodeDistilled]) -> list[CallOutcome]:
    """Every call with a result, in episode order then call order (a call with no result is skipped).
    Its time is the call's own (``CallSeen.at``), else the episode's end."""
    return [
        CallOutcome(c.tool, bool(c.ok), c.at or ep.ended_at, str(ep.episode_id), ep.agent)
        for ep in episodes
        for c in ep.calls
        if c.ok is not None
    ]


def math_id_for(owner: str, category: MathCategory, metric: str) -> str:
    return str(uuid.uuid5(MATH_NAMESPACE, f"{owner}\x1f{category.value}\x1f{metric}"))


def f2_survival(f: float, d2: int) -> float:
    """P(F > f) for F(2, d2), exactly: ``(1 + 2f/d2)^(-d2/2)``.

    >>> round(f2_survival(0.0, 10), 6), round(f2_survival(4.1028, 10), 3)
    (1.0, 0.05)
    """
    return float((1.0 + 2.0 * max(f, 0.0) / d2) ** (-d2 / 2.0))


def factorize(values: Sequence[Any]) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(values, return_inverse=True)`` for hashable values (the distinct ones sorted, as an
    object array, and each value's code), with a dict: numpy sorts an object array by comparing Python
    objects, which took most of the statistician's time on a promotion window's 32k calls.

    >>> names, codes = factorize(["b", "a", "b"])
    >>> names.tolist(), codes.tolist()
    (['a', 'b'], [1, 0, 1])
    """
    distinct = sorted(set(values))
    code = {v: i for i, v in enumerate(distinct)}
    names = np.empty(len(distinct), dtype=object)
    names[:] = distinct
    return names, np.fromiter(map(code.__getitem__, values), dtype=np.int64, count=len(values))


def _daily_series(calls: np.ndarray, succ: np.ndarray, active: np.ndarray, t: int, metric: str) -> np.ndarray:
    """One agent's daily series of tool ``t``: its calls on active days, or its success rate on days
    with enough calls (NaN elsewhere)."""
    if metric == "calls":
        return np.where(active, calls[t], np.nan)
    return np.where(calls[t] >= TREND_MIN_CALLS_PER_DAY, succ[t] / np.maximum(calls[t], 1), np.nan)


def _stratified_partial_r(
    parts: Sequence[tuple[tuple[np.ndarray, np.ndarray, np.ndarray], int, str, int, str]],
) -> tuple[float, int, int] | None:
    """The partial correlation of two daily metrics given each agent's daily episodes, within agents:
    per agent (its calls, successes and episodes per day; tool and metric of x; of y), both series
    are regressed on [1, episodes] over the agent's days where both are defined (on [1] when its
    episodes are constant), and the residuals of all agents are correlated. Returns (r, days,
    degrees of freedom = days - fitted parameters - 1), or None below the minimum support or when a
    series has nothing left once the activity is removed."""
    rx: list[np.ndarray] = []
    ry: list[np.ndarray] = []
    params = 0
    for (calls, succ, episodes), ti, ma, tj, mb in parts:
        active = episodes > 0
        x, y = _daily_series(calls, succ, active, ti, ma), _daily_series(calls, succ, active, tj, mb)
        days = ~np.isnan(x) & ~np.isnan(y)
        if int(days.sum()) < CORR_MIN_AGENT_DAYS:
            continue
        z = episodes[days]
        design = np.column_stack([np.ones(len(z)), z]) if np.ptp(z) > 0 else np.ones((len(z), 1))
        for v, t, metric, acc in ((x[days], ti, ma, rx), (y[days], tj, mb, ry)):
            coef, *_ = np.linalg.lstsq(design, v, rcond=None)
            # scaled by the residual's expected spread: a count's grows with the day's activity, a
            # rate's shrinks with the calls behind it (else busy or quiet days dominate r)
            scale = np.sqrt(z) if metric == "calls" else 1.0 / np.sqrt(calls[t][days])
            acc.append((v - design @ coef) / scale)
        params += design.shape[1]
    if not rx:
        return None
    ex, ey = np.concatenate(rx), np.concatenate(ry)
    n = len(ex)
    df = n - params - 1
    vx, vy = float(ex @ ex), float(ey @ ey)
    if n < CORR_MIN_DAYS or df < 1 or vx <= 1e-12 or vy <= 1e-12:
        return None
    return float(np.clip(np.corrcoef(ex, ey)[0, 1], -1.0, 1.0)), n, df


class _Table:
    """The outcomes as columns: tool, episode and agent codes (sorted names), ok, epoch seconds, day
    numbers, hours."""

    def __init__(self, rows: Sequence[CallOutcome]) -> None:
        self.rows = rows
        self.tools, self.tool = factorize([r.tool for r in rows])
        self.episodes, self.episode = factorize([r.episode_id for r in rows])
        self.agents, self.agent = factorize([r.agent for r in rows])
        self.ok = np.array([r.ok for r in rows], dtype=np.float64)
        self.t = np.array([r.at.timestamp() for r in rows], dtype=np.float64)
        self.day = np.floor(self.t / DAY_S).astype(np.int64)
        self.hour = (self.t - self.day * DAY_S) / 3600.0
        self.day0 = int(self.day.min()) if rows else 0
        self.n_days = int(self.day.max() - self.day0 + 1) if rows else 0

    def daily(self, rows: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(calls, successes) per (tool, day) of the selected rows (all by default): (tools, days)."""
        sel = slice(None) if rows is None else rows
        shape = (len(self.tools), self.n_days)
        idx = self.tool[sel] * self.n_days + (self.day[sel] - self.day0)
        calls = np.bincount(idx, minlength=shape[0] * shape[1]).reshape(shape)
        succ = np.bincount(idx, weights=self.ok[sel], minlength=shape[0] * shape[1]).reshape(shape)
        return calls.astype(np.float64), succ

    def daily_episodes(self, rows: np.ndarray) -> np.ndarray:
        """Distinct episodes with a call on each day, among the selected rows: (days,)."""
        pairs = np.unique(self.episode[rows] * self.n_days + (self.day[rows] - self.day0))
        return np.bincount(pairs % self.n_days, minlength=self.n_days).astype(np.float64)

    def agents_of(self, mask: np.ndarray) -> list[str]:
        """The provenance of the masked rows: their agents' names, sorted (unnamed ones left out)."""
        return [str(a) for a in self.agents[np.unique(self.agent[mask])] if a]

    def latest_episodes(self, mask: np.ndarray, k: int = COMPUTED_FROM_MAX) -> list[str]:
        """The ``k`` latest distinct episodes among the masked rows (ties by id), sorted by id."""
        latest = np.full(len(self.episodes), -np.inf)
        np.maximum.at(latest, self.episode[mask], self.t[mask])
        seen = np.flatnonzero(latest > -np.inf)  # episode codes are in id order (np.unique sorts)
        chosen = seen[np.lexsort((seen, -latest[seen]))][:k]
        return [str(e) for e in self.episodes[np.sort(chosen)]]


class Line(msgspec.Struct, frozen=True):
    slope: float
    intercept: float
    r2: float
    p_value: float


def weighted_line(x: np.ndarray, y: np.ndarray, w: np.ndarray) -> Line:
    """Weighted least-squares line ``y ~ a + b x`` (weights ``w``), its weighted R² and the two-sided
    p-value of the slope (t on n - 2 degrees of freedom). With equal weights it is ``scipy.stats.linregress``.

    >>> f = weighted_line(np.arange(5.0), np.array([1.0, 0.9, 0.8, 0.7, 0.6]), np.ones(5))
    >>> round(f.slope, 6), round(f.r2, 6), f.p_value < 1e-6
    (-0.1, 1.0, True)
    """
    sw = float(w.sum())
    mx, my = float(w @ x) / sw, float(w @ y) / sw
    dx, dy = x - mx, y - my
    sxx, sxy, syy = float(w @ (dx * dx)), float(w @ (dx * dy)), float(w @ (dy * dy))
    slope = sxy / sxx
    r2 = 0.0 if syy == 0.0 else min(1.0, sxy * sxy / (sxx * syy))
    df = len(x) - 2
    if r2 >= 1.0:
        p = 0.0
    else:
        t = math.sqrt(r2 * df / (1.0 - r2))
        p = 2.0 * float(sps.t.sf(t, df))
    return Line(slope=slope, intercept=my - slope * mx, r2=r2, p_value=p)


@dataclass(frozen=True)
class _Test:
    """One test made: its p-value, whether its effect reaches the floor, and the record it confirms."""

    p: float
    large: bool
    record: Callable[[float], MathRecord]  # q-value -> the record


def confirmed(tests: Sequence[_Test], q_max: float = FDR_Q) -> list[MathRecord]:
    """The records of the tests whose Benjamini-Hochberg q-value (over all ``tests``) is below ``q_max``
    and whose effect reaches its floor."""
    if not tests:
        return []
    q = sps.false_discovery_control(np.array([t.p for t in tests], dtype=np.float64), method="bh")
    return [t.record(float(qk)) for t, qk in zip(tests, q) if t.large and qk < q_max]


def _q(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


def _calls_sql(agents: Sequence[str]) -> str:
    names = sorted(set(agents))
    where = f"WHERE e.agent IN ({', '.join(_q(a) for a in names)})" if names else ""
    return (
        "WITH calls AS (SELECT e.episode_id, coalesce((c.value->>'at')::TIMESTAMPTZ, e.ended_at) AS call_at, "
        "e.agent, c.value->>'tool' AS tool, "
        "(c.value->>'ok')::BOOLEAN AS ok FROM episodes e, json_each(e.calls) c "
        f"{where}) "
    )


class Statistician:
    """Confirms patterns for one owner. The records' SQL reads the episodes of ``agents`` (default:
    the agent of an ``"agent:<name>"`` owner; a team or global owner should name its agents, else
    the SQL reads every agent's episodes); a correlation's SQL reads its provenance's."""

    def __init__(self, owner: str, agents: Sequence[str] | None = None, q_max: float = FDR_Q) -> None:
        self.owner = owner
        self.q_max = q_max
        if agents is None and owner.startswith("agent:"):
            agents = [owner.split(":", 1)[1]]
        self._agents = sorted(set(agents or ()))
        self._calls_sql = _calls_sql(self._agents)

    def analyse(self, rows: Sequence[CallOutcome]) -> list[MathRecord]:
        """All confirmed patterns, ordered by (category, name): every test of the run in one BH family."""
        tb = _Table(rows)
        out = confirmed(self._trend_tests(tb) + self._correlation_tests(tb) + self._phase_tests(tb), self.q_max)
        return sorted(out, key=lambda r: (r.category.value, r.name))

    def trends(self, rows: Sequence[CallOutcome]) -> list[MathRecord]:
        return confirmed(self._trend_tests(_Table(rows)), self.q_max)

    def correlations(self, rows: Sequence[CallOutcome]) -> list[MathRecord]:
        return confirmed(self._correlation_tests(_Table(rows)), self.q_max)

    def phase_locks(self, rows: Sequence[CallOutcome]) -> list[MathRecord]:
        return confirmed(self._phase_tests(_Table(rows)), self.q_max)

    def tests_made(self, rows: Sequence[CallOutcome]) -> int:
        """How many tests a run on ``rows`` makes (the size of its BH family)."""
        tb = _Table(rows)
        return len(self._trend_tests(tb)) + len(self._correlation_tests(tb)) + len(self._phase_tests(tb))

    # -- trend ------------------------------------------------------------------------------
    def _trend_tests(self, tb: _Table) -> list[_Test]:
        if not tb.rows:
            return []
        calls, succ = tb.daily()
        out = []
        for ti, tool in enumerate(tb.tools):
            days = np.flatnonzero(calls[ti] >= TREND_MIN_CALLS_PER_DAY)
            if len(days) < TREND_MIN_DAYS:
                continue
            rates = succ[ti, days] / calls[ti, days]
            if np.ptp(rates) == 0.0:
                continue  # a flat line: no trend (and R² undefined)
            fit = weighted_line(days.astype(np.float64), rates, calls[ti, days])
            large = fit.r2 >= TREND_MIN_R2 and abs(fit.slope) >= TREND_MIN_ABS_SLOPE
            out.append(_Test(fit.p_value, large, self._trend_record(tb, ti, str(tool), days, rates, fit)))
        return out

    def _trend_record(
        self, tb: _Table, ti: int, tool: str, days: np.ndarray, rates: np.ndarray, fit: Line
    ) -> Callable[[float], MathRecord]:
        def record(q: float) -> MathRecord:
            r2, slope = fit.r2, fit.slope
            mask = tb.tool == ti
            direction = "declining" if slope < 0 else "rising"
            return MathRecord(
                math_id=math_id_for(self.owner, MathCategory.PATTERN, f"{tool}.success_rate"),
                name=f"stat:tool:{tool}:success",
                category=MathCategory.PATTERN,
                domain="tool_reliability",
                subjects=[tool],
                verbal=(
                    f"{tool} showing {direction} success rate (R²={r2:.2f}, slope={slope:+.3f}/day over "
                    f"{len(days)} days, now {rates[-1]:.0%})."
                ),
                query=self._trend_sql(tool),
                confidence=round(min(r2, 1.0), 6),
                n_observations=int(mask.sum()),
                statistics={
                    "slope_per_day": round(slope, 6),
                    "intercept_day0": round(float(fit.intercept + fit.slope * tb.day0), 6),
                    "r2": round(r2, 6),
                    "p_value": _p(fit.p_value),
                    "q_value": _p(q),
                    "days": float(len(days)),
                    "success_rate": round(float(tb.ok[mask].mean()), 6),
                },
                source_episode_ids=tb.latest_episodes(mask),
                source_agents=tb.agents_of(mask),
            )

        return record

    def _trend_sql(self, tool: str) -> str:
        return (
            self._calls_sql + ", daily AS (SELECT floor(epoch(call_at) / 86400) AS day, avg(ok::INT) AS rate, "
            f"count(*) AS w FROM calls WHERE tool = {_q(tool)} AND ok IS NOT NULL GROUP BY 1 "
            f"HAVING count(*) >= {TREND_MIN_CALLS_PER_DAY}), "
            "c AS (SELECT day - sum(w * day) OVER () / sum(w) OVER () AS x, "
            "rate - sum(w * rate) OVER () / sum(w) OVER () AS y, w FROM daily) "
            "SELECT sum(w * x * y) / sum(w * x * x) AS slope_per_day, "
            "sum(w * x * y) ^ 2 / (sum(w * x * x) * sum(w * y * y)) AS r2, count(*) AS days FROM c  "
            "-- least squares weighted by the day's calls"
        )

    # -- correlation ------------------------------------------------------------------------
    def _used_together(self, tb: _Table) -> dict[tuple[int, int], tuple[int, frozenset[int]]]:
        """Tool pairs (i < j) called in the same episode: (how many episodes, the agents' codes)."""
        tools_of: dict[int, set[int]] = {}
        agent_of: dict[int, int] = {}
        for e, t, a in zip(tb.episode.tolist(), tb.tool.tolist(), tb.agent.tolist()):
            tools_of.setdefault(e, set()).add(t)
            agent_of[e] = a
        pairs: dict[tuple[int, int], tuple[int, set[int]]] = {}
        for e, ts in tools_of.items():
            order = sorted(ts)
            for i, ti in enumerate(order):
                for tj in order[i + 1 :]:
                    n, agents = pairs.get((ti, tj), (0, set()))
                    agents.add(agent_of[e])
                    pairs[(ti, tj)] = (n + 1, agents)
        return {k: (n, frozenset(a)) for k, (n, a) in pairs.items() if n >= CORR_MIN_JOINT_EPISODES}

    def _correlation_tests(self, tb: _Table) -> list[_Test]:
        if not tb.rows:
            return []
        per_agent: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        out = []
        for (ti, tj), (_, agents) in sorted(self._used_together(tb).items()):
            for ac in agents:  # each co-using agent's calls: daily counts, successes, episodes
                if ac not in per_agent:
                    rows = tb.agent == ac
                    per_agent[ac] = (*tb.daily(rows), tb.daily_episodes(rows))
            for ma, mb in (("calls", "calls"), ("success_rate", "success_rate")):
                got = _stratified_partial_r([(per_agent[ac], ti, ma, tj, mb) for ac in sorted(agents)])
                if got is None:
                    continue
                r, n, df = got
                p = (
                    1.0
                    if abs(r) < 1e-15
                    else 2.0 * float(sps.t.sf(abs(r) * math.sqrt(df / max(1e-300, 1.0 - r * r)), df))
                )
                a, b = (str(tb.tools[ti]), ma), (str(tb.tools[tj]), mb)
                out.append(_Test(p, abs(r) >= CORR_MIN_ABS_R, self._corr_record(tb, a, b, r, p, n, agents)))
        return out

    def _corr_record(
        self, tb: _Table, a: tuple[str, str], b: tuple[str, str], r: float, p: float, n: int, agents: frozenset[int]
    ) -> Callable[[float], MathRecord]:
        def record(q: float) -> MathRecord:
            ma, mb = f"{a[0]}.{a[1]}", f"{b[0]}.{b[1]}"
            tools = np.isin(tb.tool, np.searchsorted(tb.tools, [a[0], b[0]]))
            mask = np.isin(tb.agent, np.array(sorted(agents))) & tools
            named = [str(x) for x in tb.agents[sorted(agents)] if x]
            return MathRecord(
                math_id=math_id_for(self.owner, MathCategory.CORRELATION, f"{ma}~{mb}"),
                name=f"stat:corr:{ma}~{mb}",
                category=MathCategory.CORRELATION,
                domain="tool_reliability",
                subjects=sorted({a[0], b[0]}),
                verbal=(
                    f"{ma} and {mb} move {'together' if r > 0 else 'in opposite directions'} beyond the "
                    f"day's activity (partial r={r:+.2f} over {n} days)."
                ),
                query=self._corr_sql(a, b, named),
                confidence=round(r * r, 6),
                n_observations=int(mask.sum()),
                statistics={"r": round(r, 6), "p_value": _p(p), "q_value": _p(q), "days": float(n)},
                source_episode_ids=tb.latest_episodes(mask),
                source_agents=named,
            )

        return record

    def _corr_sql(self, a: tuple[str, str], b: tuple[str, str], agents: Sequence[str]) -> str:
        def metric(tool: str, m: str) -> str:
            if m == "calls":
                return f"count(*) FILTER (WHERE tool = {_q(tool)})"
            return (
                f"CASE WHEN count(*) FILTER (WHERE tool = {_q(tool)}) >= {TREND_MIN_CALLS_PER_DAY} "
                f"THEN avg(ok::INT) FILTER (WHERE tool = {_q(tool)}) END"
            )

        def resid(v: str, m: str, n: str) -> str:  # v minus its least-squares fit on z within the agent, scaled
            fit = (
                f"CASE WHEN var_pop(z) OVER a > 0 THEN {v} - regr_intercept({v}, z) OVER a - regr_slope({v}, z) "
                f"OVER a * z ELSE {v} - avg({v}) OVER a END"
            )
            return f"({fit}) / sqrt(z)" if m == "calls" else f"({fit}) * sqrt({n})"

        calls = _calls_sql(agents) if agents else self._calls_sql
        return (
            calls + ", m AS (SELECT agent, floor(epoch(call_at) / 86400) AS day, "
            f"{metric(*a)} AS x, {metric(*b)} AS y, count(*) FILTER (WHERE tool = {_q(a[0])}) AS nx, "
            f"count(*) FILTER (WHERE tool = {_q(b[0])}) AS ny, count(DISTINCT episode_id) AS z FROM calls "
            "WHERE ok IS NOT NULL GROUP BY 1, 2), d AS (SELECT * FROM m WHERE x IS NOT NULL AND y IS NOT NULL), "
            f"w AS (SELECT count(*) OVER a AS n, {resid('x', a[1], 'nx')} AS rx, {resid('y', b[1], 'ny')} AS ry "
            "FROM d WINDOW a AS (PARTITION BY agent)) "
            f"SELECT corr(rx, ry) AS r, count(*) AS days FROM w WHERE n >= {CORR_MIN_AGENT_DAYS}  "
            "-- partial r given z (the day's episodes) within each agent, residuals scaled by their spread"
        )

    # -- phase locking ----------------------------------------------------------------------
    def _phase_tests(self, tb: _Table) -> list[_Test]:
        out = []
        for ti, tool in enumerate(tb.tools):
            mask = tb.tool == ti
            if int(mask.sum()) < PHASE_MIN_EPISODES:
                continue
            # one observation per episode: its share of ok calls, at the hour of its first call
            eps, inv = np.unique(tb.episode[mask], return_inverse=True)
            n = len(eps)
            if n < PHASE_MIN_EPISODES:
                continue
            y = np.bincount(inv, weights=tb.ok[mask], minlength=n) / np.bincount(inv, minlength=n)
            first = np.full(n, np.inf)
            np.minimum.at(first, inv, tb.t[mask])
            day = np.floor(first / DAY_S)
            hour = (first - day * DAY_S) / 3600.0
            if len(np.unique(day)) < PHASE_MIN_DAYS or len(np.unique(np.floor(hour))) < PHASE_MIN_HOURS:
                continue
            if y.min() == y.max():
                continue  # always ok (or never): no rate to lock
            ep_agent = np.zeros(n, dtype=np.int64)
            ep_agent[inv] = tb.agent[mask]
            if len(np.unique(ep_agent)) > 1:  # each agent's own level removed: agents that work at other
                # hours with other success rates are not a rhythm of the tool
                y = y - (np.bincount(ep_agent, weights=y) / np.maximum(np.bincount(ep_agent), 1))[ep_agent] + y.mean()
            fit = cosinor(hour, y)
            if fit is None:
                continue
            out.append(
                _Test(
                    fit["p_value"],
                    fit["amplitude"] >= PHASE_MIN_AMPLITUDE,
                    self._phase_record(tb, str(tool), mask, fit),
                )
            )
        return out

    def _phase_record(
        self, tb: _Table, tool: str, mask: np.ndarray, fit: dict[str, float]
    ) -> Callable[[float], MathRecord]:
        def record(q: float) -> MathRecord:
            n = int(fit["n"])
            stats = {k: round(v, 6) if k != "p_value" else _p(v) for k, v in fit.items()}
            return MathRecord(
                math_id=math_id_for(self.owner, MathCategory.PHASE_LOCK, f"{tool}.success_rate"),
                name=f"stat:phase:{tool}:success",
                category=MathCategory.PHASE_LOCK,
                domain="circadian",
                subjects=[tool],
                verbal=(
                    f"{tool} success follows the time of day: best around {fit['phase_hour']:04.1f}h UTC, "
                    f"swinging ±{fit['amplitude']:.0%} (p={fit['p_value']:.1g}, {n} episodes)."
                ),
                query=self._phase_sql(tool),
                confidence=round(min(1.0, fit["r2"]), 6),
                n_observations=int(mask.sum()),
                statistics={**stats, "q_value": _p(q)},
                source_episode_ids=tb.latest_episodes(mask),
                source_agents=tb.agents_of(mask),
            )

        return record

    def _phase_sql(self, tool: str) -> str:
        return (
            self._calls_sql + ", per_episode AS (SELECT episode_id, min(call_at) AS first_at, avg(ok::INT) AS ok "
            f"FROM calls WHERE tool = {_q(tool)} AND ok IS NOT NULL GROUP BY 1) "
            "SELECT hour(first_at AT TIME ZONE 'UTC') AS hour, count(*) AS episodes, avg(ok) AS success_rate "
            "FROM per_episode GROUP BY 1 ORDER BY 1  -- the cosinor fit (ok ~ 1 + cos + sin of the hour) "
            "was made on the episodes"
        )


def cosinor(hours: np.ndarray, y: np.ndarray) -> dict[str, float] | None:
    """Least-squares fit of ``y ~ b0 + b1 cos θ + b2 sin θ``, θ = 2π·hours/24, with its F test.

    Returns mesor, amplitude (√(b1²+b2²)), phase_hour (peak, 0-24), coupling (= amplitude),
    r2, f, p_value and n; None when the phases do not span a circle (rank < 3) or n < 4.

    >>> h = np.arange(48) / 2.0
    >>> fit = cosinor(h, 0.5 + 0.3 * np.cos(2 * np.pi * (h - 6) / 24))
    >>> round(fit["amplitude"], 3), round(fit["phase_hour"], 3), fit["p_value"] < 1e-9
    (0.3, 6.0, True)
    """
    n = len(y)
    if n < 4:
        return None
    theta = 2.0 * np.pi * np.asarray(hours, dtype=np.float64) / 24.0
    x = np.column_stack([np.ones(n), np.cos(theta), np.sin(theta)])
    coef, _, rank, _ = np.linalg.lstsq(x, y, rcond=None)
    if rank < 3:
        return None
    resid = y - x @ coef
    sst = float(((y - y.mean()) ** 2).sum())
    sse = float((resid**2).sum())
    r2 = 0.0 if sst == 0.0 else max(0.0, 1.0 - sse / sst)
    d2 = n - 3
    f = math.inf if r2 >= 1.0 else (r2 / 2.0) / ((1.0 - r2) / d2)
    p = 0.0 if math.isinf(f) else f2_survival(f, d2)
    amplitude = math.hypot(float(coef[1]), float(coef[2]))
    phase = (math.atan2(float(coef[2]), float(coef[1])) * 24.0 / (2.0 * math.pi)) % 24.0
    return {
        "mesor": float(coef[0]),
        "amplitude": amplitude,
        "phase_hour": phase,
        "coupling": amplitude,
        "r2": r2,
        "f": f if math.isfinite(f) else 1e300,
        "p_value": p,
        "n": float(n),
    }


def _p(p: float) -> float:
    """p-values keep 6 significant digits (tiny ones would otherwise round to 0)."""
    return float(f"{float(p):.6g}")


def pattern_events(memory: MemoryLayers, records: Iterable[MathRecord], now: datetime) -> list[SemanticEvent]:
    """Events recording confirmed patterns: ``PatternConfirmed`` for a new or changed record, and a
    ``COMPUTED_FROM`` edge (AG record -> episode, weight 1.0) for each of its source episodes not
    linked yet. An unchanged record yields nothing, so re-running the statistician on the same data
    changes nothing. Events are applied to ``memory`` as they are made."""
    out: list[SemanticEvent] = []
    for rec in sorted(records, key=lambda r: r.math_id):
        if memory.ag.get(rec.math_id) != rec:
            out.append(PatternConfirmed(owner=memory.owner, record=rec, at=now))
            memory.apply(out[-1])
        for e in rec.source_episode_ids:
            src, dst = (Layer.ANGULAR_GYRUS, rec.math_id), (Layer.HIPPOCAMPUS, e)
            if memory.cross.get(src, CrossEdgeType.COMPUTED_FROM, dst) is None:
                out.append(
                    CrossLayerEdgeFormed(
                        owner=memory.owner,
                        source_layer=src[0],
                        source_id=src[1],
                        edge_type=CrossEdgeType.COMPUTED_FROM,
                        target_layer=dst[0],
                        target_id=dst[1],
                        weight=1.0,
                        at=now,
                    )
                )
                memory.apply(out[-1])
    return out
