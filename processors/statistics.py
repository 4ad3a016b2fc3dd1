"""The Angular Gyrus statistician: confirmed statistical patterns over tool-call outcomes.
Deterministic and pure: the input is a table of call outcomes, the output ``MathRecord``s.

Input: one ``CallOutcome`` per tool call with a result (``call_outcomes(episodes)``). A call's time is
``CallSeen.at``, or its episode's end for episodes from before calls had times; days and hours are UTC.

Three analyses, each with its test and thresholds (all pinned in tests/processors/test_statistics.py):

- **Trend** (``PATTERN``), per tool: the daily success rate (days with >= ``TREND_MIN_CALLS_PER_DAY``
  calls) regressed on the day by ordinary least squares (unweighted: each day one point). Confirmed
  with >= ``TREND_MIN_DAYS`` days, R² >= ``TREND_MIN_R2``, slope p < ``TREND_MAX_P`` and
  |slope| >= ``TREND_MIN_ABS_SLOPE`` per day. Confidence = R².
- **Correlation** (``CORRELATION``), over every pair of daily metrics (each tool's success rate and
  call count): Pearson r on the days both are defined (pairwise complete, computed for all pairs at
  once with matrix products). Confirmed with >= ``CORR_MIN_DAYS`` days, |r| >= ``CORR_MIN_ABS_R`` and a
  Benjamini-Hochberg q < ``CORR_MAX_Q`` over all pairs tested (many pairs, few days: without the
  correction most "correlations" would be noise). Confidence = r².
- **Phase locking** (``PHASE_LOCK``), per tool: does the success rate follow the circadian phase?
  Cosinor regression ``ok ~ b0 + b1 cos θ + b2 sin θ`` (θ = 2π·hour/24) with the exact F(2, n-3)
  test ``p = (1 + 2F/(n-3))^(-(n-3)/2)``. Confirmed with >= ``PHASE_MIN_CALLS`` calls on >=
  ``PHASE_MIN_DAYS`` days in >= ``PHASE_MIN_HOURS`` distinct hours of the day, p < ``PHASE_MAX_P`` and amplitude >= ``PHASE_MIN_AMPLITUDE``. A regression
  rather than a Rayleigh test of the failures' phases, because that test is confounded by *when*
  calls happen (an agent busy at 9 am fails most at 9 am); the regression is conditional on the
  phases observed. Phase = the hour of peak success; coupling = the amplitude (success-rate units).
  Confidence = the cosinor R².

>>> from datetime import datetime, timedelta, timezone
>>> t0 = datetime(2024, 5, 1, 12, tzinfo=timezone.utc)
>>> rows = [CallOutcome("nav", ok=(i % 10) >= d, at=t0 + timedelta(days=d), episode_id=f"e{d}-{i}")
...         for d in range(6) for i in range(10)]
>>> [(r.name, r.statistics["slope_per_day"]) for r in Statistician("agent:robot").trends(rows)]
[('stat:tool:nav:success', -0.1)]
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

import msgspec
import numpy as np
from scipy import stats as sps

from processors.layers import MemoryLayers
from schemas.episodes import EpisodeDistilled
from schemas.semantic import (
    CrossEdgeType,
    CrossLayerEdgeFormed,
    Layer,
    MathCategory,
    MathRecord,
    PatternConfirmed,
    SemanticEvent,
)

TREND_MIN_DAYS = 4
TREND_MIN_CALLS_PER_DAY = 3
TREND_MIN_R2 = 0.5
TREND_MAX_P = 0.05
TREND_MIN_ABS_SLOPE = 0.01  # success rate per day
CORR_MIN_DAYS = 5
CORR_MIN_ABS_R = 0.7
CORR_MAX_Q = 0.05
PHASE_MIN_CALLS = 20
PHASE_MIN_DAYS = 3
PHASE_MIN_HOURS = 6  # distinct hours of the day: fewer cannot tell a rhythm from a constant
PHASE_MAX_P = 0.01
PHASE_MIN_AMPLITUDE = 0.1
COMPUTED_FROM_MAX = 64  # COMPUTED_FROM edges per record: the latest episodes, not all of them
DAY_S = 86400.0

MATH_NAMESPACE = uuid.UUID("5a1e9c3b-2d7f-4e8a-b6c1-0f9d8e7a6b5c")


class CallOutcome(msgspec.Struct, frozen=True):
    """One tool call's outcome: the statistician's (and the NAc adapter's) input row."""

    tool: str
    ok: bool
    at: datetime  # event time (the episode's end)
    episode_id: str
    agent: str = ""


def call_outcomes(episodes: Iterable[EpisodeDistilled]) -> list[CallOutcome]:
    """Every call with a result, in episode order then call order (a call with no result is skipped).
    Its time is the call's own (``CallSeen.at``), else the episode's end."""
    return [CallOutcome(c.tool, bool(c.ok), c.at or ep.ended_at, str(ep.episode_id), ep.agent)
            for ep in episodes for c in ep.calls if c.ok is not None]


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


class _Table:
    """The outcomes as columns: tool codes (sorted names), ok, epoch seconds, day numbers, hours."""

    def __init__(self, rows: Sequence[CallOutcome]) -> None:
        self.rows = rows
        self.tools, self.tool = factorize([r.tool for r in rows])
        self.episodes, self.episode = factorize([r.episode_id for r in rows])
        self.ok = np.array([r.ok for r in rows], dtype=np.float64)
        self.t = np.array([r.at.timestamp() for r in rows], dtype=np.float64)
        self.day = np.floor(self.t / DAY_S).astype(np.int64)
        self.hour = (self.t - self.day * DAY_S) / 3600.0
        self.day0 = int(self.day.min()) if rows else 0
        self.n_days = int(self.day.max() - self.day0 + 1) if rows else 0

    def daily(self) -> tuple[np.ndarray, np.ndarray]:
        """(calls, successes) per (tool, day): arrays of shape (tools, days)."""
        shape = (len(self.tools), self.n_days)
        idx = self.tool * self.n_days + (self.day - self.day0)
        calls = np.bincount(idx, minlength=shape[0] * shape[1]).reshape(shape)
        succ = np.bincount(idx, weights=self.ok, minlength=shape[0] * shape[1]).reshape(shape)
        return calls.astype(np.float64), succ

    def latest_episodes(self, mask: np.ndarray, k: int = COMPUTED_FROM_MAX) -> list[str]:
        """The ``k`` latest distinct episodes among the masked rows (ties by id), sorted by id."""
        latest = np.full(len(self.episodes), -np.inf)
        np.maximum.at(latest, self.episode[mask], self.t[mask])
        seen = np.flatnonzero(latest > -np.inf)  # episode codes are in id order (np.unique sorts)
        chosen = seen[np.lexsort((seen, -latest[seen]))][:k]
        return [str(e) for e in self.episodes[np.sort(chosen)]]


def _q(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


class Statistician:
    """Confirms patterns for one owner. The records' SQL reads the episodes of ``agents`` (default:
    the agent of an ``"agent:<name>"`` owner; a team or global owner should name its agents, else
    the SQL reads every agent's episodes)."""

    def __init__(self, owner: str, agents: Sequence[str] | None = None) -> None:
        self.owner = owner
        if agents is None and owner.startswith("agent:"):
            agents = [owner.split(":", 1)[1]]
        names = sorted(set(agents or ()))
        where = f"WHERE e.agent IN ({', '.join(_q(a) for a in names)})" if names else ""
        self._calls_sql = ("WITH calls AS (SELECT e.episode_id, coalesce((c.value->>'at')::TIMESTAMPTZ, e.ended_at) AS call_at, "
                           "c.value->>'tool' AS tool, "
                           "(c.value->>'ok')::BOOLEAN AS ok FROM episodes e, json_each(e.calls) c "
                           f"{where}) ")

    def analyse(self, rows: Sequence[CallOutcome]) -> list[MathRecord]:
        """All confirmed patterns, ordered by (category, name)."""
        table = _Table(rows)
        out = self._trends(table) + self._correlations(table) + self._phase_locks(table)
        return sorted(out, key=lambda r: (r.category.value, r.name))

    def trends(self, rows: Sequence[CallOutcome]) -> list[MathRecord]:
        return self._trends(_Table(rows))

    def correlations(self, rows: Sequence[CallOutcome]) -> list[MathRecord]:
        return self._correlations(_Table(rows))

    def phase_locks(self, rows: Sequence[CallOutcome]) -> list[MathRecord]:
        return self._phase_locks(_Table(rows))

    # -- trend ------------------------------------------------------------------------------
    def _trends(self, tb: _Table) -> list[MathRecord]:
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
            fit = sps.linregress(days.astype(np.float64), rates)
            r2 = float(fit.rvalue) ** 2
            slope = float(fit.slope)
            if r2 < TREND_MIN_R2 or float(fit.pvalue) >= TREND_MAX_P or abs(slope) < TREND_MIN_ABS_SLOPE:
                continue
            mask = tb.tool == ti
            direction = "declining" if slope < 0 else "rising"
            out.append(MathRecord(
                math_id=math_id_for(self.owner, MathCategory.PATTERN, f"{tool}.success_rate"),
                name=f"stat:tool:{tool}:success", category=MathCategory.PATTERN, domain="tool_reliability",
                subjects=[str(tool)],
                verbal=(f"{tool} showing {direction} success rate (R²={r2:.2f}, slope={slope:+.3f}/day over "
                        f"{len(days)} days, now {rates[-1]:.0%})."),
                query=self._trend_sql(str(tool)), confidence=round(min(r2, 1.0), 6),
                n_observations=int(mask.sum()),
                statistics={"slope_per_day": round(slope, 6), "intercept_day0": round(float(
                    fit.intercept + fit.slope * tb.day0), 6), "r2": round(r2, 6), "p_value": _p(fit.pvalue),
                    "days": float(len(days)), "success_rate": round(float(tb.ok[mask].mean()), 6)},
                source_episode_ids=tb.latest_episodes(mask)))
        return out

    def _trend_sql(self, tool: str) -> str:
        return (self._calls_sql + ", daily AS (SELECT floor(epoch(call_at) / 86400) AS day, avg(ok::INT) AS rate "
                f"FROM calls WHERE tool = {_q(tool)} AND ok IS NOT NULL GROUP BY 1 "
                f"HAVING count(*) >= {TREND_MIN_CALLS_PER_DAY}) "
                "SELECT regr_slope(rate, day) AS slope_per_day, regr_r2(rate, day) AS r2, count(*) AS days FROM daily")

    # -- correlation ------------------------------------------------------------------------
    def _correlations(self, tb: _Table) -> list[MathRecord]:
        if not tb.rows:
            return []
        calls, succ = tb.daily()
        active = calls.sum(axis=0) > 0  # days the owner made any call: a tool's 0 calls there is a value
        names: list[tuple[str, str]] = []
        series: list[np.ndarray] = []
        for ti, tool in enumerate(tb.tools):
            rate = np.where(calls[ti] >= TREND_MIN_CALLS_PER_DAY, succ[ti] / np.maximum(calls[ti], 1), np.nan)
            count = np.where(active, calls[ti], np.nan)
            for metric, s in (("calls", count), ("success_rate", rate)):
                names.append((str(tool), metric))
                series.append(s)
        if len(series) < 2:
            return []
        x = np.vstack(series)
        w = (~np.isnan(x)).astype(np.float64)
        x0 = np.nan_to_num(x)
        n = w @ w.T
        sx = x0 @ w.T  # sx[i, j]: sum of series i over the days both i and j are defined
        sxx = (x0 * x0) @ w.T
        sxy = x0 @ x0.T
        with np.errstate(invalid="ignore", divide="ignore"):
            cov = n * sxy - sx * sx.T
            var = (n * sxx - sx * sx) * (n * sxx - sx * sx).T
            r = cov / np.sqrt(var)
        iu, ju = np.triu_indices(len(series), k=1)
        rr, nn = r[iu, ju], n[iu, ju]
        ok = np.isfinite(rr) & (nn >= CORR_MIN_DAYS)
        if not ok.any():
            return []
        iu, ju, rr, nn = iu[ok], ju[ok], np.clip(rr[ok], -1.0, 1.0), nn[ok]
        with np.errstate(divide="ignore"):
            tstat = np.abs(rr) * np.sqrt((nn - 2) / np.maximum(1e-300, 1.0 - rr * rr))
        p = 2.0 * sps.t.sf(tstat, nn - 2)
        q = sps.false_discovery_control(p, method="bh")
        out = []
        for k in np.flatnonzero((np.abs(rr) >= CORR_MIN_ABS_R) & (q < CORR_MAX_Q)):
            a, b = names[iu[k]], names[ju[k]]
            ma, mb = f"{a[0]}.{a[1]}", f"{b[0]}.{b[1]}"
            rk = float(rr[k])
            mask = (tb.tool == int(np.searchsorted(tb.tools, a[0]))) | (tb.tool == int(np.searchsorted(tb.tools, b[0])))
            out.append(MathRecord(
                math_id=math_id_for(self.owner, MathCategory.CORRELATION, f"{ma}~{mb}"),
                name=f"stat:corr:{ma}~{mb}", category=MathCategory.CORRELATION, domain="tool_reliability",
                subjects=sorted({a[0], b[0]}),
                verbal=(f"{ma} and {mb} move {'together' if rk > 0 else 'in opposite directions'} "
                        f"(r={rk:+.2f} over {int(nn[k])} days)."),
                query=self._corr_sql(a, b), confidence=round(rk * rk, 6), n_observations=int(mask.sum()),
                statistics={"r": round(rk, 6), "p_value": _p(p[k]), "q_value": _p(q[k]), "days": float(nn[k])},
                source_episode_ids=tb.latest_episodes(mask)))
        return out

    def _corr_sql(self, a: tuple[str, str], b: tuple[str, str]) -> str:
        def metric(tool: str, m: str) -> str:
            if m == "calls":
                return f"count(*) FILTER (WHERE tool = {_q(tool)})"
            return (f"CASE WHEN count(*) FILTER (WHERE tool = {_q(tool)}) >= {TREND_MIN_CALLS_PER_DAY} "
                    f"THEN avg(ok::INT) FILTER (WHERE tool = {_q(tool)}) END")
        return (self._calls_sql + ", m AS (SELECT floor(epoch(call_at) / 86400) AS day, "
                f"{metric(*a)} AS x, {metric(*b)} AS y FROM calls WHERE ok IS NOT NULL GROUP BY 1) "
                "SELECT corr(x, y) AS r, count(*) AS days FROM m WHERE x IS NOT NULL AND y IS NOT NULL")

    # -- phase locking ----------------------------------------------------------------------
    def _phase_locks(self, tb: _Table) -> list[MathRecord]:
        out = []
        for ti, tool in enumerate(tb.tools):
            mask = tb.tool == ti
            n = int(mask.sum())
            if (n < PHASE_MIN_CALLS or len(np.unique(tb.day[mask])) < PHASE_MIN_DAYS
                    or len(np.unique(np.floor(tb.hour[mask]))) < PHASE_MIN_HOURS):
                continue
            y = tb.ok[mask]
            if y.min() == y.max():
                continue  # always ok (or never): no rate to lock
            fit = cosinor(tb.hour[mask], y)
            if fit is None or fit["p_value"] >= PHASE_MAX_P or fit["amplitude"] < PHASE_MIN_AMPLITUDE:
                continue
            out.append(MathRecord(
                math_id=math_id_for(self.owner, MathCategory.PHASE_LOCK, f"{tool}.success_rate"),
                name=f"stat:phase:{tool}:success", category=MathCategory.PHASE_LOCK, domain="circadian",
                subjects=[str(tool)],
                verbal=(f"{tool} success follows the time of day: best around {fit['phase_hour']:04.1f}h UTC, "
                        f"swinging ±{fit['amplitude']:.0%} (p={fit['p_value']:.1g}, {n} calls)."),
                query=self._phase_sql(str(tool)), confidence=round(min(1.0, fit["r2"]), 6), n_observations=n,
                statistics={k: round(v, 6) if k != "p_value" else _p(v) for k, v in fit.items()},
                source_episode_ids=tb.latest_episodes(mask)))
        return out

    def _phase_sql(self, tool: str) -> str:
        return (self._calls_sql + "SELECT hour(call_at AT TIME ZONE 'UTC') AS hour, count(*) AS calls, "
                f"avg(ok::INT) AS success_rate FROM calls WHERE tool = {_q(tool)} AND ok IS NOT NULL "
                "GROUP BY 1 ORDER BY 1  -- the table the cosinor fit (ok ~ 1 + cos + sin of the hour) was made on")


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
    sse = float((resid ** 2).sum())
    r2 = 0.0 if sst == 0.0 else max(0.0, 1.0 - sse / sst)
    d2 = n - 3
    f = math.inf if r2 >= 1.0 else (r2 / 2.0) / ((1.0 - r2) / d2)
    p = 0.0 if math.isinf(f) else f2_survival(f, d2)
    amplitude = math.hypot(float(coef[1]), float(coef[2]))
    phase = (math.atan2(float(coef[2]), float(coef[1])) * 24.0 / (2.0 * math.pi)) % 24.0
    return {"mesor": float(coef[0]), "amplitude": amplitude, "phase_hour": phase, "coupling": amplitude,
            "r2": r2, "f": f if math.isfinite(f) else 1e300, "p_value": p, "n": float(n)}


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
                out.append(CrossLayerEdgeFormed(owner=memory.owner, source_layer=src[0], source_id=src[1],
                                                edge_type=CrossEdgeType.COMPUTED_FROM, target_layer=dst[0],
                                                target_id=dst[1], weight=1.0, at=now))
                memory.apply(out[-1])
    return out

