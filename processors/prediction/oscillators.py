"""Coupled oscillators of the SCN (optional, off by default): when does a pattern recur, and is this
event on time?

Four phase oscillators, one per rhythm, with natural frequencies ω_i = 2π / T_i (radians per hour):

==============  ==========
oscillator      period T_i
==============  ==========
``circadian``   24 h
``weekly``      168 h (7 d)
``monthly``     720 h (30 d)
``annual``      8760 h (365 d)
==============  ==========

evolving by the Kuramoto equation with a learned coupling matrix W (symmetric, zero diagonal, in [0, 1])::

    dθ_i/dt = ω_i + (K/N) Σ_j W_ij sin(θ_j − θ_i)

integrated with classical RK4 at a fixed step (``step_hours``; the last step is the remainder), from
event times only: no clock, and the same events in the same order give bit-identical states.

One ``OscillatorState`` follows one pattern (e.g. an agent's ``tool_call:deploy``), on the local wall
clock of ``somnus.processors.prediction.rhythms`` (the event's own offset, or an IANA zone). Phase 0 of every oscillator
means "the pattern fires". On each observed event (``observe``):

1. the phases are advanced to the event's time: the *predicted* phases;
2. **anomaly** = the circular distance of each predicted phase from 0, divided by π (0: right on
   time, 1: half a period off), averaged over the circadian oscillator (weight 1) and every slower
   rhythm the pattern is locked to (weight W_0j, when W_0j >= ``lock_threshold``);
3. **Hebbian learning**: co-active oscillators (similar phases) strengthen their link,
   W_ij <- W_ij + η_ij (max(0, cos(θ_i − θ_j)) − W_ij), with a rate per unit of time,
   η_ij = 1 − exp(−Δt / (τ·max(T_i, T_j))) (Δt since the pattern's previous event, τ =
   ``hebbian_cycles``), for the pairs whose longer period the pattern's history already spans (a
   month-old pattern cannot tell anything about the year). A weekly pattern
   (every Monday at 9) finds the circadian and weekly phases both at 0 on every event, so
   W_circadian,weekly -> 1: "Monday mornings" emerge; a daily pattern meets the weekly oscillator at
   every phase, and its link stays near the mean of max(0, cos) over the week, about 0.32;
4. **entrainment**: phases are pulled toward 0, θ_i <- θ_i − ε_i sin θ_i, with ε_0 = ε for the
   circadian one always, and ε_j = ε·T_0/T_j for a slower one once the pattern is locked to it
   (W_0j >= ``lock_threshold``). Scaled so, a daily pattern's kick (ε_j) is always far smaller than
   the slow phase's advance between its events (2π·T_0/T_j), so entrainment can never hold a slow
   rhythm still and fake a lock; unscaled (or unlocked) entrainment feeds back into W.

The first event of a pattern sets every phase to 0 (it defines the pattern's time). Queries:
``next_recurrence`` (forward simulation until the circadian phase fires with every locked rhythm
within half a day of firing), ``coherence`` (Kuramoto order parameter r = |mean e^{iθ}| in [0, 1]),
``coupling_analysis`` (eigenvalues of W; the dominant eigenvector names the rhythms that go together).

With periods in ratios 1 : 7 : 30 : 365 the coupling cannot phase-lock the oscillators for any
small K; its fast terms mostly average out, so K adds a small jitter (amplitude about K·W/(4ω_0))
and a slow drift between events, which entrainment corrects at each event: with
``DEFAULT_COUPLING`` = 0.001 rad/h a weekly pattern's daily phase drifts by about 25 s a week
(4 minutes at 0.01). The learned W carries the structure; K = 0 is exact and free.

>>> from datetime import datetime, timedelta, timezone
>>> cfg = OscillatorConfig(enabled=True)
>>> state, t0 = None, datetime(2024, 1, 1, 9, tzinfo=timezone.utc)  # a Monday, 9 AM
>>> for week in range(20):
...     state, reading = observe(state, t0 + timedelta(weeks=week), cfg)
>>> round(state.weights[0][1], 2), round(reading.anomaly, 3), locked_rhythms(state, cfg)
(1.0, 0.001, ['weekly'])
>>> next_recurrence(state, datetime(2024, 5, 21, 12, tzinfo=timezone.utc), cfg).strftime("%a %Y-%m-%d %H:%M")
'Mon 2024-05-27 09:00'
>>> round(anomaly_at(state, datetime(2024, 5, 28, 21, tzinfo=timezone.utc), cfg), 2)  # a Tuesday, 9 PM
0.71
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone, tzinfo

import msgspec
import numpy as np

from somnus.processors.prediction.rhythms import local_time, zone

NAMES = ("circadian", "weekly", "monthly", "annual")
PERIODS_HOURS = (24.0, 168.0, 720.0, 8760.0)
OMEGA = np.array([2 * math.pi / p for p in PERIODS_HOURS])  # rad / hour
TWO_PI = 2 * math.pi
_EPOCH = datetime(1970, 1, 1)

DEFAULT_COUPLING = 0.001  # K, rad/hour: a weekly-locked daily phase drifts ~25 s a week (4 min at 0.01)
# RK4 step. Only the small coupling term is approximated (uncoupled motion is exact): over 400 days
# of daily events at K = 0.01, phases at 3 h steps differ from 15 min steps by 2e-5 rad (6 h: 3e-4).
DEFAULT_STEP_HOURS = 3.0
DEFAULT_HEBBIAN_CYCLES = 2.0  # τ: a link's memory, in cycles of the slower of its two rhythms
DEFAULT_ENTRAINMENT = 0.3  # ε
DEFAULT_LOCK_THRESHOLD = 0.5


@dataclass(frozen=True)
class OscillatorConfig:
    enabled: bool = False  # the oscillators are optional: the bins work without them
    coupling: float = DEFAULT_COUPLING
    step_hours: float = DEFAULT_STEP_HOURS
    hebbian_cycles: float = DEFAULT_HEBBIAN_CYCLES
    entrainment: float = DEFAULT_ENTRAINMENT
    lock_threshold: float = DEFAULT_LOCK_THRESHOLD
    tz: str | None = None  # the wall clock: None = each event's own offset, else an IANA zone


class OscillatorState(msgspec.Struct, kw_only=True):
    """One pattern's oscillators (a Faust table value; encode with msgspec)."""

    at_hours: float  # local wall-clock hours since 1970-01-01 of the last observed event
    first_hours: float  # ... of the pattern's first event: how long a history the pattern has
    theta: list[float]  # phases in [0, 2π), order of NAMES
    weights: list[list[float]]  # W, symmetric, zero diagonal
    events: int = 0
    hwm: dict[int, tuple[int, int]] = {}  # source partition -> (offset, index) last observed


class Reading(msgspec.Struct, frozen=True):
    """What one observed event looked like to the oscillators (before they learned from it)."""

    anomaly: float | None  # None for a pattern's first event (nothing to compare with)
    distances: list[float]  # per oscillator, |wrap(θ_i)| / π in [0, 1]
    coherence: float  # r of the predicted phases


class CouplingAnalysis(msgspec.Struct, frozen=True):
    eigenvalues: list[float]  # of W, largest first
    dominant: dict[str, float]  # loadings of the largest eigenvalue's eigenvector (largest loading positive)
    strongest: tuple[str, str, float]  # the strongest link


# ---- the dynamics -----------------------------------------------------------------------------


def kuramoto_rhs(theta: np.ndarray, omega: np.ndarray, weights: np.ndarray, k: float) -> np.ndarray:
    """dθ_i/dt = ω_i + (K/N) Σ_j W_ij sin(θ_j − θ_i).

    Computed as ω + (K/N)(cos θ ⊙ W sin θ − sin θ ⊙ W cos θ) (sin(a − b) expanded): two
    matrix-vector products instead of an N×N table of sines."""
    s, c = np.sin(theta), np.cos(theta)
    return omega + (k / theta.shape[0]) * (c * (weights @ s) - s * (weights @ c))


def rk4_step(theta: np.ndarray, h: float, omega: np.ndarray, weights: np.ndarray, k: float) -> np.ndarray:
    k1 = kuramoto_rhs(theta, omega, weights, k)
    k2 = kuramoto_rhs(theta + 0.5 * h * k1, omega, weights, k)
    k3 = kuramoto_rhs(theta + 0.5 * h * k2, omega, weights, k)
    k4 = kuramoto_rhs(theta + h * k3, omega, weights, k)
    return theta + (h / 6.0) * (k1 + 2.0 * k2 + 2.0 * k3 + k4)


def integrate(
    theta: np.ndarray, hours: float, omega: np.ndarray, weights: np.ndarray, k: float, step: float = DEFAULT_STEP_HOURS
) -> np.ndarray:
    """Phases after ``hours`` (negative: backwards), in whole steps then one remainder step.

    Phases are not wrapped, so a crossing of 2π stays visible. Cost: |hours| / step RK4 steps of
    about 40 µs, so a pattern costs about 0.1 s per year of event time, however many events it has
    (plus one remainder step per event)."""
    if step <= 0:
        raise ValueError(f"step must be positive, got {step}")
    sign = 1.0 if hours >= 0 else -1.0
    whole = int(abs(hours) // step)
    rest = abs(hours) - whole * step
    th = np.asarray(theta, dtype=float)
    if k == 0.0 or not np.any(weights):
        return th + omega * hours  # uncoupled: the exact solution, no steps needed
    for _ in range(whole):
        th = rk4_step(th, sign * step, omega, weights, k)
    if rest > 1e-12:
        th = rk4_step(th, sign * rest, omega, weights, k)
    return th


def wrap(theta: np.ndarray | float) -> np.ndarray:
    """Angles into (−π, π]."""
    w = np.mod(np.asarray(theta, dtype=float) + math.pi, TWO_PI) - math.pi
    return np.where(w == -math.pi, math.pi, w)


def circular_distance(a: np.ndarray | float, b: np.ndarray | float) -> np.ndarray:
    """|a − b| on the circle, in [0, π]."""
    return np.abs(wrap(np.asarray(a, dtype=float) - np.asarray(b, dtype=float)))


def coherence(theta: np.ndarray | list[float]) -> float:
    """The Kuramoto order parameter r = |(1/N) Σ e^{iθ_j}| in [0, 1]: 1 when all phases agree."""
    th = np.asarray(theta, dtype=float)
    return float(np.hypot(np.cos(th).mean(), np.sin(th).mean()))


def coupling_analysis(weights: np.ndarray | list[list[float]]) -> CouplingAnalysis:
    """Eigen-structure of a symmetric W: which rhythms the pattern binds together."""
    w = np.asarray(weights, dtype=float)
    values, vectors = np.linalg.eigh((w + w.T) / 2)
    order = np.argsort(-values, kind="stable")
    values, vectors = values[order], vectors[:, order]
    lead = vectors[:, 0]
    lead = lead if lead[np.argmax(np.abs(lead))] >= 0 else -lead
    i, j = np.unravel_index(np.argmax(np.triu(w, 1)), w.shape)
    names = NAMES if w.shape[0] == len(NAMES) else tuple(str(n) for n in range(w.shape[0]))
    return CouplingAnalysis(
        eigenvalues=[float(v) for v in values],
        dominant={names[n]: float(lead[n]) for n in range(w.shape[0])},
        strongest=(names[int(i)], names[int(j)], float(w[i, j])),
    )


# ---- patterns ---------------------------------------------------------------------------------


def local_hours(ts: datetime, tz: str | tzinfo | None = None) -> float:
    """Wall-clock hours since 1970-01-01 of ``ts`` on the binning clock (see ``somnus.processors.prediction.rhythms``)."""
    naive = local_time(ts, tz).replace(tzinfo=None)
    return (naive - _EPOCH) / timedelta(hours=1)


def _anomaly(distances: np.ndarray, weights: np.ndarray, lock: float) -> float:
    w = np.where(weights[0] >= lock, weights[0], 0.0)
    w[0] = 1.0
    return float((w * distances).sum() / w.sum())


def observe(
    state: OscillatorState | None, ts: datetime, config: OscillatorConfig, source: tuple[int, int, int] | None = None
) -> tuple[OscillatorState, Reading | None]:
    """Learn from one event of a pattern: (new state, reading). ``state`` is not modified.

    ``source`` = (partition, offset, index) of the event's origin: at or below the state's mark for
    that partition it is a redelivery, and the state comes back unchanged with no reading."""
    t = local_hours(ts, config.tz)
    n = len(NAMES)
    if state is not None and source is not None:
        mark = state.hwm.get(source[0])
        if mark is not None and (source[1], source[2]) <= tuple(mark):
            return state, None
    hwm = dict(state.hwm) if state is not None else {}
    if source is not None:
        hwm[source[0]] = (source[1], source[2])
    if state is None:
        zero = [0.0] * n
        return (
            OscillatorState(
                at_hours=t, first_hours=t, theta=zero, weights=[[0.0] * n for _ in range(n)], events=1, hwm=hwm
            ),
            Reading(anomaly=None, distances=zero, coherence=1.0),
        )
    w = np.array(state.weights, dtype=float)
    predicted = integrate(np.array(state.theta), t - state.at_hours, OMEGA, w, config.coupling, config.step_hours)
    distances = circular_distance(predicted, 0.0) / math.pi
    reading = Reading(
        anomaly=_anomaly(distances, w, config.lock_threshold),
        distances=[float(d) for d in distances],
        coherence=coherence(predicted),
    )
    # Hebbian: similar phases strengthen a link, opposite ones let it fade; a pair is judged only
    # once the history spans the longer period (before, the slow phase has not moved: trivially similar)
    co = np.maximum(0.0, np.cos(predicted[None, :] - predicted[:, None]))
    eta = hebbian_rates(abs(t - state.at_hours), config.hebbian_cycles)
    w = np.where(_judged(t - state.first_hours), w + eta * (co - w), w)
    np.fill_diagonal(w, 0.0)
    w = np.clip((w + w.T) / 2, 0.0, 1.0)
    # entrainment: the daily rhythm always, a slower one once the pattern is locked to it
    eps = np.where(w[0] >= config.lock_threshold, config.entrainment * _PERIODS[0] / _PERIODS, 0.0)
    eps[0] = config.entrainment
    theta = np.mod(predicted - eps * np.sin(predicted), TWO_PI)
    return (
        OscillatorState(
            at_hours=t,
            first_hours=state.first_hours,
            theta=[float(x) for x in theta],
            weights=w.tolist(),
            events=state.events + 1,
            hwm=hwm,
        ),
        reading,
    )


_PERIODS = np.array(PERIODS_HOURS)
_PAIR_PERIOD = np.maximum(_PERIODS[:, None], _PERIODS[None, :])


def hebbian_rates(gap_hours: float, cycles: float = DEFAULT_HEBBIAN_CYCLES) -> np.ndarray:
    """η_ij = 1 − exp(−gap / (τ · max(T_i, T_j))): learning per unit of *time*, not per event.

    A daily pattern samples the monthly rhythm 30 times a cycle and a weekly one 4 times: a rate per
    event would give the first a memory of a few days of a month-long relation. Bursts (gap ≈ 0)
    count as one event."""
    return 1.0 - np.exp(-gap_hours / (cycles * _PAIR_PERIOD))


def _judged(span_hours: float) -> np.ndarray:
    """Pairs of rhythms a history of ``span_hours`` can judge: it covers the longer period of the two."""
    return span_hours >= _PAIR_PERIOD - 1e-9


def phases_at(state: OscillatorState, ts: datetime, config: OscillatorConfig) -> np.ndarray:
    """The pattern's phases at ``ts`` (forward or backward simulation), wrapped into (−π, π]."""
    th = integrate(
        np.array(state.theta),
        local_hours(ts, config.tz) - state.at_hours,
        OMEGA,
        np.array(state.weights),
        config.coupling,
        config.step_hours,
    )
    return wrap(th)


def anomaly_at(state: OscillatorState, ts: datetime, config: OscillatorConfig) -> float:
    """How far off its rhythm an event at ``ts`` would be (0 on time ... 1 half a period off)."""
    d = circular_distance(phases_at(state, ts, config), 0.0) / math.pi
    return _anomaly(d, np.array(state.weights), config.lock_threshold)


def locked_rhythms(state: OscillatorState, config: OscillatorConfig) -> list[str]:
    """The slower rhythms the pattern is locked to (W with the circadian oscillator >= the threshold)."""
    return [NAMES[j] for j in range(1, len(NAMES)) if state.weights[0][j] >= config.lock_threshold]


def next_recurrence(
    state: OscillatorState, after: datetime, config: OscillatorConfig, horizon_hours: float | None = None
) -> datetime | None:
    """When the pattern next fires after ``after``: the first time the circadian phase crosses 0
    with every locked rhythm within half a day of its own 0. Forward simulation at the fixed step,
    the crossing placed by linear interpolation within the step. None past the horizon (default:
    1.5 periods of the slowest locked rhythm, or of a day).

    The time is on the binning clock: in ``config.tz`` when set, else at ``after``'s offset."""
    locked = [j for j in range(1, len(NAMES)) if state.weights[0][j] >= config.lock_threshold]
    horizon = (
        horizon_hours
        if horizon_hours is not None
        else 1.5 * max([PERIODS_HOURS[0]] + [PERIODS_HOURS[j] for j in locked])
    )
    w = np.array(state.weights, dtype=float)
    t = local_hours(after, config.tz)
    th = integrate(np.array(state.theta), t - state.at_hours, OMEGA, w, config.coupling, config.step_hours)
    th = th - TWO_PI * math.floor(th[0] / TWO_PI)  # keep the circadian phase in [0, 2π)
    tolerance = [math.pi * PERIODS_HOURS[0] / PERIODS_HOURS[j] for j in range(len(NAMES))]
    h, end = config.step_hours, t + horizon
    while t < end:
        nxt = rk4_step(th, h, OMEGA, w, config.coupling)
        if math.floor(nxt[0] / TWO_PI) > math.floor(th[0] / TWO_PI):
            target = TWO_PI * math.floor(nxt[0] / TWO_PI)
            frac = (target - th[0]) / (nxt[0] - th[0])
            at = th + frac * (nxt - th)
            if all(abs(float(wrap(at[j]))) <= tolerance[j] for j in locked):
                return _from_local_hours(t + frac * h, after, config.tz)
        th, t = nxt, t + h
    return None


def _from_local_hours(hours: float, like: datetime, tz: str | tzinfo | None) -> datetime:
    naive = _EPOCH + timedelta(hours=round(hours * 3600) / 3600)  # whole seconds: no float noise
    if tz is not None:
        return naive.replace(tzinfo=zone(tz) if isinstance(tz, str) else tz)
    return naive.replace(tzinfo=like.tzinfo or timezone.utc)
