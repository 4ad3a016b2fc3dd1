"""somnus.processors.prediction.oscillators: Kuramoto dynamics against closed forms, Hebbian coupling, anomalies, recurrence."""

from __future__ import annotations

import doctest
import math
from datetime import datetime, timedelta, timezone

import msgspec
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from somnus.processors.prediction import oscillators
from somnus.processors.prediction.oscillators import (
    DEFAULT_COUPLING,
    DEFAULT_ENTRAINMENT,
    DEFAULT_HEBBIAN_CYCLES,
    DEFAULT_LOCK_THRESHOLD,
    DEFAULT_STEP_HOURS,
    NAMES,
    OMEGA,
    PERIODS_HOURS,
    OscillatorConfig,
    OscillatorState,
    anomaly_at,
    circular_distance,
    coherence,
    coupling_analysis,
    hebbian_rates,
    integrate,
    kuramoto_rhs,
    local_hours,
    locked_rhythms,
    next_recurrence,
    observe,
    phases_at,
    rk4_step,
    wrap,
)

UTC = timezone.utc
MONDAY_9 = datetime(2024, 1, 1, 9, tzinfo=UTC)
ON = OscillatorConfig(enabled=True)
PROPERTY = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def test_the_module_examples_run():
    assert doctest.testmod(oscillators).failed == 0


def test_pinned_constants():
    assert NAMES == ("circadian", "weekly", "monthly", "annual")
    assert PERIODS_HOURS == (24.0, 168.0, 720.0, 8760.0)
    assert np.allclose(
        OMEGA, [2 * math.pi / 24, 2 * math.pi / 168, 2 * math.pi / 720, 2 * math.pi / 8760], rtol=0, atol=1e-15
    )
    assert (
        DEFAULT_COUPLING,
        DEFAULT_STEP_HOURS,
        DEFAULT_HEBBIAN_CYCLES,
        DEFAULT_ENTRAINMENT,
        DEFAULT_LOCK_THRESHOLD,
    ) == (0.001, 3.0, 2.0, 0.3, 0.5)
    assert OscillatorConfig().enabled is False  # optional, off by default


# ---- the equation -----------------------------------------------------------------------------


def _direct_rhs(theta, omega, w, k):
    n = len(theta)
    return np.array(
        [omega[i] + k / n * sum(w[i][j] * math.sin(theta[j] - theta[i]) for j in range(n)) for i in range(n)]
    )


@PROPERTY
@given(
    st.lists(st.floats(-10, 10), min_size=4, max_size=4),
    st.lists(st.floats(0, 1), min_size=16, max_size=16),
    st.floats(0, 5),
)
def test_the_vector_form_is_the_kuramoto_sum(theta, flat, k):
    w = np.array(flat).reshape(4, 4)
    assert np.allclose(kuramoto_rhs(np.array(theta), OMEGA, w, k), _direct_rhs(theta, OMEGA, w, k), atol=1e-12)


@PROPERTY
@given(
    st.lists(st.floats(0, 2 * math.pi), min_size=4, max_size=4),
    st.lists(st.floats(0, 1), min_size=6, max_size=6),
    st.floats(0, 2),
    st.floats(0, 200),
)
def test_with_symmetric_coupling_the_phase_sum_moves_at_the_summed_frequency(theta, upper, k, hours):
    # Σ_i dθ_i/dt = Σ ω_i: the coupling terms cancel in pairs; RK4 keeps a linear invariant exactly
    w = np.zeros((4, 4))
    w[np.triu_indices(4, 1)] = upper
    w = w + w.T
    out = integrate(np.array(theta), hours, OMEGA, w, k, step=2.0)
    assert out.sum() == pytest.approx(sum(theta) + OMEGA.sum() * hours, abs=1e-9)


def test_uncoupled_phases_are_exact():
    theta = np.array([0.1, 0.2, 0.3, 0.4])
    assert np.array_equal(integrate(theta, 1000.5, OMEGA, np.ones((4, 4)), 0.0), theta + OMEGA * 1000.5)
    assert np.array_equal(integrate(theta, 10.0, OMEGA, np.zeros((4, 4)), 1.0), theta + OMEGA * 10.0)


def test_integration_is_reversible_and_uses_a_remainder_step():
    w = np.full((4, 4), 0.8) - 0.8 * np.eye(4)
    theta = np.array([0.0, 1.0, 2.0, 3.0])
    there = integrate(theta, 100.7, OMEGA, w, 0.5, step=0.25)
    # backwards in time (an event older than the state's): back to the start, up to RK4's error
    # (short, as locking attracts forward and repels backward, amplifying errors)
    short = integrate(theta, 10.3, OMEGA, w, 0.5, step=0.05)
    assert np.allclose(integrate(short, -10.3, OMEGA, w, 0.5, step=0.05), theta, atol=1e-9)
    manual = theta
    for _ in range(402):
        manual = rk4_step(manual, 0.25, OMEGA, w, 0.5)
    manual = rk4_step(manual, 0.2, OMEGA, w, 0.5)
    assert np.allclose(there, manual, atol=1e-12)
    with pytest.raises(ValueError):
        integrate(theta, 1.0, OMEGA, w, 0.5, step=0.0)


# ---- two oscillators against closed forms ------------------------------------------------------
# φ = θ2 − θ1 obeys dφ/dt = Δω − a sin φ with a = 2(K/N)W (the Adler equation). With u = tan(φ/2):
#   locked (|Δω| < a), b = sqrt(a² − Δω²): (u − u+)/(u − u−) = C e^{bt}, u± = (a ± b)/Δω, φ -> 2 atan(u−)
#   unlocked (|Δω| > a), b = sqrt(Δω² − a²): u = a/Δω + (b/Δω) tan(bt/2 + c); φ slips 2π every 2π/b


def _pair(d_omega: float, k: float, w: float) -> tuple[np.ndarray, np.ndarray]:
    return np.array([0.3, 0.3 + d_omega]), np.array([[0.0, w], [w, 0.0]])


def test_two_locked_oscillators_follow_the_closed_form_and_settle_at_arcsin():
    d_omega, k, w, n = 0.5, 2.0, 1.0, 2
    a = 2 * k / n * w
    b = math.sqrt(a * a - d_omega * d_omega)
    omega, weights = _pair(d_omega, k, w)
    phi0 = 0.1
    u0, up, um = math.tan(phi0 / 2), (a + b) / d_omega, (a - b) / d_omega
    c = (u0 - up) / (u0 - um)
    theta = np.array([1.0, 1.0 + phi0])
    for t in (0.5, 1.0, 2.5, 5.0, 12.0):
        got = integrate(theta, t, omega, weights, k, step=0.005)
        e = c * math.exp(b * t)
        u = (up - e * um) / (1 - e)
        assert got[1] - got[0] == pytest.approx(2 * math.atan(u), abs=1e-9), t
        # the mean phase moves at the mean frequency: the coupling is antisymmetric
        assert got.sum() == pytest.approx(theta.sum() + omega.sum() * t, abs=1e-9)
    settled = integrate(theta, 60.0, omega, weights, k, step=0.01)
    assert settled[1] - settled[0] == pytest.approx(math.asin(d_omega * n / (2 * k * w)), abs=1e-9)


@pytest.mark.parametrize(("d_omega", "k", "w"), [(1.0, 0.6, 1.0), (0.3, 0.5, 0.4), (2.0, 1.0, 1.0)])
def test_two_unlocked_oscillators_slip_a_full_turn_every_2pi_over_b(d_omega, k, w):
    a = 2 * k / 2 * w
    assert abs(d_omega) > a
    b = math.sqrt(d_omega**2 - a**2)
    omega, weights = _pair(d_omega, k, w)
    theta = np.array([0.0, 0.4])
    period = 2 * math.pi / b
    after = integrate(theta, period, omega, weights, k, step=period / 4000)
    assert after[1] - after[0] == pytest.approx(0.4 + 2 * math.pi, abs=1e-9)
    # and in between, the closed form u(t) = a/Δω + (b/Δω) tan(bt/2 + c)
    c = math.atan((math.tan(0.2) - a / d_omega) * d_omega / b)
    t = period / 5
    mid = integrate(theta, t, omega, weights, k, step=period / 4000)
    u = a / d_omega + b / d_omega * math.tan(b * t / 2 + c)
    assert math.tan((mid[1] - mid[0]) / 2) == pytest.approx(u, rel=1e-8)


# ---- measures ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("angle", "wrapped"),
    [
        (0.0, 0.0),
        (math.pi, math.pi),
        (-math.pi, math.pi),
        (3 * math.pi / 2, -math.pi / 2),
        (2 * math.pi, 0.0),
        (-7 * math.pi / 4, math.pi / 4),
    ],
)
def test_wrap_into_minus_pi_pi(angle, wrapped):
    assert float(wrap(angle)) == pytest.approx(wrapped, abs=1e-12)


def test_circular_distance():
    assert float(circular_distance(0.1, 2 * math.pi - 0.1)) == pytest.approx(0.2, abs=1e-12)
    assert float(circular_distance(0.0, math.pi)) == pytest.approx(math.pi, abs=1e-12)
    assert np.allclose(circular_distance(np.array([1.0, 4.0]), 0.0), [1.0, 2 * math.pi - 4.0], atol=1e-12)


def test_coherence_is_the_kuramoto_order_parameter():
    assert coherence([1.2, 1.2, 1.2, 1.2]) == pytest.approx(1.0, abs=1e-12)
    assert coherence([0, math.pi / 2, math.pi, 3 * math.pi / 2]) == pytest.approx(0.0, abs=1e-12)
    for delta in (0.0, 0.7, 2.0, math.pi):
        assert coherence([0.3, 0.3 + delta]) == pytest.approx(abs(math.cos(delta / 2)), abs=1e-12)


@PROPERTY
@given(st.lists(st.floats(-100, 100), min_size=1, max_size=8))
def test_coherence_is_within_0_and_1(theta):
    assert 0.0 <= coherence(theta) <= 1.0 + 1e-12


def test_coupling_analysis_eigenvalues():
    w = np.zeros((4, 4))
    w[0, 1] = w[1, 0] = 0.8  # only circadian-weekly: eigenvalues ±0.8, 0, 0
    got = coupling_analysis(w)
    assert got.eigenvalues == pytest.approx([0.8, 0.0, 0.0, -0.8], abs=1e-12)
    assert got.dominant == pytest.approx(
        {"circadian": 1 / math.sqrt(2), "weekly": 1 / math.sqrt(2), "monthly": 0.0, "annual": 0.0}, abs=1e-12
    )
    assert got.strongest == ("circadian", "weekly", 0.8)
    full = np.full((4, 4), 0.5) - 0.5 * np.eye(4)  # all-to-all c: eigenvalues 3c, −c, −c, −c
    assert coupling_analysis(full).eigenvalues == pytest.approx([1.5, -0.5, -0.5, -0.5], abs=1e-12)
    assert coupling_analysis([[0.0, 0.3], [0.3, 0.0]]).strongest == ("0", "1", 0.3)


def test_hebbian_rates_are_per_unit_of_time():
    eta = hebbian_rates(24.0, 2.0)
    assert eta[0, 1] == pytest.approx(1 - math.exp(-24 / (2 * 168)), abs=1e-12)
    assert eta[1, 2] == pytest.approx(1 - math.exp(-24 / (2 * 720)), abs=1e-12)
    assert eta[0, 3] == eta[3, 0] == pytest.approx(1 - math.exp(-24 / (2 * 8760)), abs=1e-12)
    assert np.all(hebbian_rates(0.0) == 0.0)  # a burst counts once


# ---- patterns ---------------------------------------------------------------------------------


def _run(times, config=ON):
    state, readings = None, []
    for t in times:
        state, reading = observe(state, t, config)
        readings.append(reading)
    return state, readings


def test_the_first_event_defines_the_pattern():
    state, reading = observe(None, MONDAY_9, ON)
    assert state.theta == [0.0] * 4 and state.weights == [[0.0] * 4] * 4 and state.events == 1
    assert reading.anomaly is None and state.first_hours == state.at_hours == local_hours(MONDAY_9)


def test_a_weekly_pattern_couples_the_daily_and_weekly_rhythms_and_a_daily_one_does_not():
    weekly, _ = _run([MONDAY_9 + timedelta(weeks=k) for k in range(20)])
    daily, _ = _run([MONDAY_9 + timedelta(days=k) for k in range(140)])
    assert weekly.weights[0][1] > 0.95 and locked_rhythms(weekly, ON) == ["weekly"]
    assert daily.weights[0][1] < 0.45 and locked_rhythms(daily, ON) == []
    assert coupling_analysis(weekly.weights).strongest[:2] == ("circadian", "weekly")
    assert weekly.weights[0][3] == 0.0  # 20 weeks cannot judge the year


def test_a_pair_is_judged_only_once_the_history_spans_its_longer_period():
    state, _ = _run([MONDAY_9 + timedelta(days=k) for k in range(29)])
    w = np.array(state.weights)
    assert w[0, 1] > 0 and w[0, 2] == w[1, 2] == w[0, 3] == 0.0
    state, _ = _run([MONDAY_9 + timedelta(days=k) for k in range(31)])
    assert state.weights[0][2] > 0 and state.weights[0][3] == 0.0


def test_anomaly_is_the_circular_distance_from_the_rhythm():
    cfg = OscillatorConfig(enabled=True, coupling=0.0)
    state, readings = _run([MONDAY_9 + timedelta(days=k) for k in range(14)], cfg)
    assert all(r.anomaly == pytest.approx(0.0, abs=1e-12) for r in readings[1:])
    assert locked_rhythms(state, cfg) == []
    for shift in (1, 3, 6, 12, 18, 23):  # only the daily rhythm counts: anomaly = shift / 12 (on a circle)
        at = MONDAY_9 + timedelta(days=14, hours=shift)
        assert anomaly_at(state, at, cfg) == pytest.approx(min(shift, 24 - shift) / 12, abs=1e-9), shift
    weekly, _ = _run([MONDAY_9 + timedelta(weeks=k) for k in range(20)], cfg)
    # locked to the week: a Tuesday at 9 is on time by the clock but a day off the week
    tuesday = MONDAY_9 + timedelta(weeks=20, days=1)
    w01 = weekly.weights[0][1]
    assert anomaly_at(weekly, tuesday, cfg) == pytest.approx(w01 * (2 / 7) / (1 + w01), abs=1e-9)
    reading = observe(weekly, tuesday, cfg)[1]
    assert reading.distances[:2] == pytest.approx([0.0, 2 / 7], abs=1e-9)


def test_entrainment_pulls_the_phase_by_epsilon_sin():
    # the pattern moves from 9 to 10 AM; at each 10 AM event the circadian phase is δ_n past firing,
    # δ_0 = ω·1h, then δ_{n+1} = δ_n − ε sin δ_n (uncoupled, so the closed form is exact)
    cfg = OscillatorConfig(enabled=True, coupling=0.0)
    state, _ = _run([MONDAY_9 + timedelta(days=k) for k in range(3)], cfg)
    delta = OMEGA[0] * 1.0
    for k in range(3, 10):
        state, reading = observe(state, MONDAY_9 + timedelta(days=k, hours=1), cfg)
        assert reading.distances[0] == pytest.approx(delta / math.pi, abs=1e-12)
        delta = delta - DEFAULT_ENTRAINMENT * math.sin(delta)
    assert delta < 0.2 * OMEGA[0]  # the rhythm has moved to the new time


def test_next_recurrence_forward_simulates_to_the_next_firing():
    weekly, _ = _run([MONDAY_9 + timedelta(weeks=k) for k in range(20)])
    nxt = next_recurrence(weekly, MONDAY_9 + timedelta(weeks=19, days=2), ON)
    assert abs(nxt - (MONDAY_9 + timedelta(weeks=20))) < timedelta(minutes=1)
    exact = OscillatorConfig(enabled=True, coupling=0.0)
    daily, _ = _run([MONDAY_9 + timedelta(days=k) for k in range(10)], exact)
    assert next_recurrence(daily, MONDAY_9 + timedelta(days=9, hours=1), exact) == MONDAY_9 + timedelta(days=10)
    assert next_recurrence(daily, MONDAY_9 + timedelta(days=9, hours=1), exact, horizon_hours=12) is None


def test_the_wall_clock_across_dst():
    # a job at 9 AM Berlin time written in UTC: 08:00Z in winter, 07:00Z in summer (from March 31)
    days = [datetime(2024, 3, 18, 8, tzinfo=UTC) + timedelta(days=k) for k in range(13)]
    days += [datetime(2024, 3, 31, 7, tzinfo=UTC) + timedelta(days=k) for k in range(5)]
    berlin = OscillatorConfig(enabled=True, coupling=0.0, tz="Europe/Berlin")
    _, on_wall_clock = _run(days, berlin)
    _, on_utc = _run(days, OscillatorConfig(enabled=True, coupling=0.0))
    assert max(r.anomaly for r in on_wall_clock[1:]) == pytest.approx(0.0, abs=1e-12)
    assert on_utc[13].anomaly == pytest.approx(1 / 12, abs=1e-9)  # one hour early by UTC
    state, _ = _run(days, berlin)
    assert (
        next_recurrence(state, datetime(2024, 4, 4, 12, tzinfo=UTC), berlin).isoformat() == "2024-04-05T09:00:00+02:00"
    )


def test_observing_is_deterministic_and_does_not_touch_its_input():
    times = [MONDAY_9 + timedelta(hours=7 * k + (k % 3)) for k in range(60)]
    a, _ = _run(times)
    b, _ = _run(times)
    assert msgspec.json.encode(a) == msgspec.json.encode(b)
    before = msgspec.json.encode(a)
    observe(a, times[-1] + timedelta(days=1), ON)
    assert msgspec.json.encode(a) == before
    assert msgspec.json.decode(before, type=OscillatorState) == a


def test_a_redelivered_event_is_ignored():
    state, _ = observe(None, MONDAY_9, ON, source=(0, 5, 0))
    again, reading = observe(state, MONDAY_9 + timedelta(days=1), ON, source=(0, 5, 0))
    assert again is state and reading is None
    moved, reading = observe(state, MONDAY_9 + timedelta(days=1), ON, source=(1, 2, 0))  # another partition
    assert moved.events == 2 and moved.hwm == {0: (5, 0), 1: (2, 0)} and reading is not None


def test_phases_at_wraps_and_matches_integration():
    state, _ = _run([MONDAY_9 + timedelta(days=k) for k in range(5)])
    at = MONDAY_9 + timedelta(days=4, hours=6)
    assert phases_at(state, at, ON)[0] == pytest.approx(math.pi / 2, abs=1e-3)
    assert np.all(np.abs(phases_at(state, at, ON)) <= math.pi)
