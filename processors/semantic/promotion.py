"""Promotion: recurring patterns become concepts, with cross-layer traceability. Pure: no I/O, no clock.

Sources (``PromotionSource``) offer candidates; the IPS gate turns away noise; the promoter
deduplicates against the ATL, creates or reinforces the concept, forms its relationships and the
cross-layer edges that say where it came from; then it links every confirmed pattern to the concepts
it is about. Everything it decides is an event (``schemas/semantic.py``), applied to the memory as it
goes, so a replay of the log rebuilds the same memory and a second run on the same input adds nothing.

**The IPS randomness gate** (``ips_gate``):

- statistician candidates pass at confidence >= ``STAT_MIN_CONFIDENCE`` (0.4): their pattern was
  already tested;
- a NAc candidate that carries its counts (``metadata``: ``observation_count`` of its outcome out of
  ``event_observations``, and ``base_rate``, the share of that valence among all calls) passes when
  the counts alone show it is no coincidence: a one-sided exact binomial test that the outcome
  follows this event more often than calls in general, at ``GATE_TEST_ALPHA``. (The issue asks for
  a timing test only; but a tool that fails at a steady rate fails at *random times*, so the timing
  test alone turns away exactly the steady unreliability worth knowing. The counts test keeps the
  gate's purpose, no promotion of chance, for what timing cannot judge.)
- other candidates (NAc causal links) are judged on the timing of their observations, one time per
  episode (retries within a session are not independent observations). Fewer than
  ``GATE_MIN_OBSERVATIONS`` (8) pass: too few to judge. Otherwise the candidate passes only if its
  timing shows structure in at least one of two tests, each at ``GATE_TEST_ALPHA`` = 0.025
  (Bonferroni: 0.05 for the pair):

  1. *dispersion of inter-arrival times*: the coefficient of variation (std/mean, ddof 0) of the
     gaps between consecutive observations. Under "no temporal structure" (a Poisson process: given
     the first and last time, the others uniform in between) CV is near 1; regular recurrences give
     CV << 1, bursts CV >> 1. Two-sided p from the exact null distribution of the CV for that
     number of gaps, simulated once per gap count with a fixed seed (``NULL_REPLICATES`` draws of
     ``numpy.random.RandomState``, whose stream numpy keeps stable); beyond ``NULL_MAX_GAPS`` gaps the
     asymptotic ``z = (CV - 1)·√m`` (the small-sample null is far from it: at 7 gaps the mean CV is
     about 0.83). With ``activity_times`` (every instant the agent was active, e.g. its episodes'
     ends), the times become their mid-ranks among the activity (time rescaling) and the null is "a
     uniformly random subset of the activity", simulated exactly (``_null_cv_subset``): an agent that
     works office hours, or sessions that arrive like clockwork, do not make a pattern look
     structured. The worker should pass it;
  2. *Rayleigh test on the circadian phase* (hour of day as an angle): mean resultant length R̄,
     Z = n·R̄², p by Zar's approximation. With ``activity_times``, the candidate's mean phase vector
     is compared to the activity's (``T = n·dᵀΣ⁻¹d`` with a finite-population correction, p =
     exp(-T/2): Rayleigh's test against the agent's own rhythm instead of a uniform clock). Only run
     when the observations span at least ``PHASE_MIN_SPAN_DAYS`` (3) days: within a day or two the
     hour of day is the same thing as the time, and any subset of a night's work is "phase-locked".

**Concepts from candidates** (``concept_spec``): a NAc link of a tool with negative valence becomes
``<tool>_unreliable`` (IS_A ``unreliable_tool``), positive ``<tool>_reliable`` (IS_A ``reliable_tool``),
with DERIVED_FROM (concept -> episode) and INSTANCE_OF (episode -> concept) edges to its source
episodes; provenance EPISODIC_CONSOLIDATION, one reinforcement per new episode. An abstracted
topic becomes the concept ``<key>`` (category ``topic``) with the same edges to its memories, but one
reinforcement per session it came back in (``session:<id>`` evidence), so a topic of two sessions
can decay from the ATL. A statistician
trend becomes ``<tool>_success_declining`` / ``_rising``, a phase lock ``<tool>_success_circadian``
(PHASE_LOCKED_TO ``circadian_rhythm``), a correlation ``<a>_correlates_with_<b>``; provenance
AGENT_INFERENCE with a STATISTICALLY_CONFIRMS edge from the pattern. A concept fed by both kinds of
source becomes HYBRID. Deduplication is by name (``ConceptLayer.find``: the same name key, or one
edit apart), not by ``recall_similar``: token-similar definitions ("book_reservation fails",
"update_reservation fails") are different knowledge.

**Linking patterns** (``link_patterns``): every confirmed pattern about a tool points at the other
concepts about that tool: a trend QUANTIFIES them, a phase lock TEMPORALLY_CORRELATES with them (and
they become PHASE_LOCKED_TO ``circadian_rhythm``, metadata phase_hour and coupling), a correlation
INFORMS them and their concepts become CORRELATES_WITH each other; concepts of two trends in the same
direction TRENDS_WITH each other.

**Cross-layer spreading activation** (``cross_layer_activation``): from seed records in any layer,
through each layer's associative graph and the cross-layer edges (read both ways), activation x
0.5 x edge weight per hop, best path, at most 3 hops, grouped by layer.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from typing import Any, Protocol, runtime_checkable

import msgspec
import numpy as np

from somnus.processors.semantic.layers import (
    ACTIVATION_DECAY,
    ACTIVATION_MAX_DEPTH,
    ACTIVATION_THRESHOLD,
    AngularGyrusLayer,
    MemoryLayers,
    Node,
    spread,
)
from somnus.processors.semantic.co_occurrence import CO_OCCURRENCE_DOMAIN
from somnus.processors.semantic.concepts import SOURCE_AGENTS, find_or_create, form_relationship
from somnus.schemas.semantic import (
    CandidateRejected,
    ConceptPromoted,
    CrossEdgeType,
    CrossLayerEdgeFormed,
    Layer,
    MathCategory,
    MathRecord,
    Provenance,
    SemanticEvent,
)
from scipy.stats import binomtest

MIN_CONFIDENCE = 0.6
MIN_OBSERVATIONS = 3
GATE_MIN_OBSERVATIONS = 8
GATE_ALPHA = 0.05
GATE_TEST_ALPHA = GATE_ALPHA / 2  # two tests, Bonferroni
STAT_MIN_CONFIDENCE = 0.4
NULL_REPLICATES = 4000
NULL_SEED = 20240515
NULL_MAX_GAPS = 1000
PHASE_MIN_SPAN_DAYS = 3.0
STRUCTURAL_EDGE_WEIGHT = 1.0  # DERIVED_FROM, INSTANCE_OF (COMPUTED_FROM: somnus.processors.prediction.patterns)
DAY_S = 86400.0

NAC = "nac"
STATISTICIAN = "statistician"
ABSTRACTION = "abstraction"


# ---- candidates and sources -------------------------------------------------------------------


class PromotionCandidate(msgspec.Struct, frozen=True, kw_only=True):
    """A pattern a source thinks deserves to be a concept.

    ``origin`` names the source ("nac", "statistician", ...); ``observation_times`` are when the
    pattern was observed, one per independent observation (per episode), what the IPS gate judges;
    empty for statistical patterns."""

    pattern_name: str  # "book_reservation → error:payment ...", "stat:tool:navigate:success"
    category: str  # "causal_pattern", "operational_pattern", ...
    confidence: float
    source_memory_ids: list[str]  # the episodes that contributed
    metadata: dict[str, Any] = {}
    origin: str = NAC
    observation_times: list[datetime] = []


@runtime_checkable
class PromotionSource(Protocol):
    def get_promotion_candidates(
        self, min_confidence: float = MIN_CONFIDENCE, min_observations: int = MIN_OBSERVATIONS
    ) -> list[PromotionCandidate]: ...


@runtime_checkable
class CausalLinkLike(Protocol):
    """The least a NAc causal link must offer to be promoted (processors/prediction/causal_links.py's links, adapted).

    nac.py's ``CausalLinkState`` keeps only the first and last time of a link: its observation
    times and episodes are the ``CausalLinkUpdated`` rows of that link with ``target == 1.0``.
    Read-only (properties), so a frozen struct such as ``CausalLinkView`` offers it too."""

    @property
    def event_signature(self) -> str: ...  # the call's or the tool's signature (somnus.schemas.causal)
    @property
    def tool(self) -> str | None: ...
    @property
    def outcome(self) -> str: ...  # "ok", "http:429", "error:<class>"
    @property
    def valence(self) -> str: ...  # "positive" | "neutral" | "negative" (a str Enum is fine)
    @property
    def strength(self) -> float: ...  # Rescorla-Wagner V
    @property
    def confidence(self) -> float: ...
    @property
    def observation_count(self) -> int: ...
    @property
    def observation_times(self) -> Sequence[datetime]: ...  # one per observation ...
    @property
    def source_episode_ids(self) -> Sequence[str]: ...  # ... and, when of the same length, its episode


def episode_times(times: Sequence[datetime], episode_ids: Sequence[str]) -> list[datetime]:
    """One time per episode (its first observation), when ``times`` and ``episode_ids`` are parallel;
    else the times as given. Retries within one episode are one event for the randomness gate: three
    failed attempts a second apart are not a "burst" of independent observations.

    >>> from datetime import datetime, timezone
    >>> t = [datetime(2024, 5, 1, 9, 0, s, tzinfo=timezone.utc) for s in (0, 1, 2)]
    >>> [x.second for x in episode_times(t, ["e1", "e1", "e2"])]
    [0, 2]
    """
    if len(times) != len(episode_ids):
        return sorted(times)
    first: dict[str, datetime] = {}
    for t, e in zip(times, episode_ids):
        if e not in first or t < first[e]:
            first[e] = t
    return sorted(first.values())


class NacPromotionSource:
    """Causal links as candidates: those with confidence >= ``min_confidence`` and at least
    ``min_observations`` observations, named ``"<tool> → <outcome>"`` (``"<event_signature> →
    <outcome>"`` without a tool), ordered by name then signature. The gate sees one time per episode
    (``episode_times``)."""

    def __init__(self, links: Iterable[CausalLinkLike]) -> None:
        self._links = list(links)

    def get_promotion_candidates(
        self, min_confidence: float = MIN_CONFIDENCE, min_observations: int = MIN_OBSERVATIONS
    ) -> list[PromotionCandidate]:
        out = []
        for link in self._links:
            if link.confidence < min_confidence or link.observation_count < min_observations:
                continue
            outcome, valence = _text(link.outcome), _text(link.valence)
            out.append(
                PromotionCandidate(
                    pattern_name=f"{link.tool or link.event_signature} → {outcome}",
                    category="causal_pattern",
                    confidence=float(link.confidence),
                    source_memory_ids=list(dict.fromkeys(link.source_episode_ids)),
                    metadata={
                        "event_signature": link.event_signature,
                        "tool": link.tool,
                        "outcome": outcome,
                        "valence": valence,
                        "strength": float(link.strength),
                        "observation_count": int(link.observation_count),
                        **(
                            {"event_observations": int(n_event), "base_rate": float(base)}
                            if (n_event := getattr(link, "event_observations", None)) is not None
                            and (base := getattr(link, "base_rate", None)) is not None
                            else {}
                        ),
                        **(
                            {"source_agents": sorted(set(agents))}
                            if (agents := getattr(link, "source_agents", None))
                            else {}
                        ),
                    },
                    origin=NAC,
                    observation_times=episode_times(link.observation_times, link.source_episode_ids),
                )
            )
        return sorted(out, key=lambda c: (c.pattern_name, c.metadata["event_signature"]))


def _text(value: Any) -> str:
    """An enum's value, or the text itself (``str()`` of a str Enum is "Valence.NEGATIVE" in 3.11)."""
    return str(getattr(value, "value", value))


class StatisticianPromotionSource:
    """Confirmed Angular Gyrus patterns as candidates (no episode ids: the record is the evidence)."""

    def __init__(self, ag: AngularGyrusLayer) -> None:
        self._ag = ag

    def get_promotion_candidates(
        self, min_confidence: float = MIN_CONFIDENCE, min_observations: int = MIN_OBSERVATIONS
    ) -> list[PromotionCandidate]:
        out = []
        for rec in self._ag:
            if rec.domain == CO_OCCURRENCE_DOMAIN:
                continue  # an association of two topics is knowledge about concepts already there
            if rec.confidence < min_confidence or rec.n_observations < min_observations:
                continue
            entry = self._ag.entry(rec.math_id)
            assert entry is not None
            out.append(
                PromotionCandidate(
                    pattern_name=rec.name,
                    category="operational_pattern",
                    confidence=rec.confidence,
                    source_memory_ids=[],
                    origin=STATISTICIAN,
                    metadata={
                        "math_id": rec.math_id,
                        "math_category": rec.category.value,
                        "subjects": list(rec.subjects),
                        "revision": entry.revision,
                        **({"source_agents": sorted(set(rec.source_agents))} if rec.source_agents else {}),
                    },
                )
            )
        return sorted(out, key=lambda c: c.pattern_name)


class AbstractionPromotionSource:
    """Dream phase B's abstracted patterns as candidates (``TopicView``): a key that came back in
    several domains (a conversation's sessions, a fleet's domains) becomes a concept about it, with
    DERIVED_FROM edges to the memories it was seen in. Confidence ``1 - 0.5 ** domains``: each
    further domain halves the doubt (2 domains: 0.75). Ordered by key, then agent.

    >>> from somnus.schemas.semantic import TopicView
    >>> t = TopicView(pattern_id="p1", agent="a", key="pottery", domains=["s1", "s2"], support=3,
    ...               source_ids=["m1", "m2", "m3"])
    >>> [(c.pattern_name, c.confidence) for c in AbstractionPromotionSource([t]).get_promotion_candidates()]
    [('topic:pottery', 0.75)]
    """

    def __init__(self, topics: Iterable[Any]) -> None:
        self._topics = list(topics)

    def get_promotion_candidates(
        self, min_confidence: float = MIN_CONFIDENCE, min_observations: int = MIN_OBSERVATIONS
    ) -> list[PromotionCandidate]:
        out = []
        for t in self._topics:
            confidence = 1.0 - 0.5 ** len(t.domains)
            if confidence < min_confidence or t.support < min_observations:
                continue
            out.append(
                PromotionCandidate(
                    pattern_name=f"topic:{t.key}",
                    category="topic",
                    confidence=confidence,
                    source_memory_ids=list(dict.fromkeys(t.source_ids)),
                    origin=ABSTRACTION,
                    metadata={
                        "key": t.key,
                        "support": int(t.support),
                        "domains": sorted(t.domains),
                        "source_agents": [t.agent],
                        "pattern_id": t.pattern_id,
                    },
                )
            )
        return sorted(out, key=lambda c: (c.pattern_name, c.metadata["source_agents"]))


# ---- the IPS gate -----------------------------------------------------------------------------


class GateVerdict(msgspec.Struct, frozen=True):
    passed: bool
    test: str  # "confidence" | "counts" | "small_sample" | "dispersion" | "rayleigh" | "none"
    reason: str
    p_value: float | None = None
    n: int = 0


@lru_cache(maxsize=256)
def _null_cv(gaps: int) -> np.ndarray:
    """Sorted CVs of ``gaps`` spacings of a Poisson process given its first and last event."""
    rng = np.random.RandomState(NULL_SEED + gaps)
    inner = np.sort(rng.random_sample((NULL_REPLICATES, gaps - 1)), axis=1)
    edges = np.hstack([np.zeros((NULL_REPLICATES, 1)), inner, np.ones((NULL_REPLICATES, 1))])
    d = np.diff(edges, axis=1)
    cv = np.sort(d.std(axis=1) / d.mean(axis=1))
    cv.setflags(write=False)
    return cv


def _random_subsets(rng: np.random.RandomState, total: int, n: int, reps: int) -> np.ndarray:
    """``reps`` uniformly random ``n``-subsets of ``range(total)``, one sorted row each (int32).

    Draw ``n`` positions with replacement, then redraw every repeat until a row holds ``n`` distinct
    positions. Exact: the rule is the same for every relabelling of the positions, so every subset is
    equally likely. When ``n`` is more than half of ``total`` the complement is drawn instead (repeats
    would be common)."""
    if 2 * n > total:
        keep = np.ones((reps, total), dtype=bool)
        if total > n:
            rows = np.repeat(np.arange(reps), total - n)
            keep[rows, _random_subsets(rng, total, total - n, reps).ravel()] = False
        return np.nonzero(keep)[1].astype(np.int32).reshape(reps, n)
    x = rng.randint(0, total, size=(reps, n), dtype=np.int32)
    todo = np.arange(reps)
    while len(todo):
        rows = np.sort(x[todo], axis=1)
        repeat = np.zeros(rows.shape, dtype=bool)
        repeat[:, 1:] = rows[:, 1:] == rows[:, :-1]
        k = int(repeat.sum())
        if k:
            rows[repeat] = rng.randint(0, total, size=k, dtype=np.int32)
        x[todo] = rows
        todo = todo[repeat.any(axis=1)]
    return x


@lru_cache(maxsize=256)
def _null_cv_subset(total: int, n: int) -> np.ndarray:
    """Sorted CVs of the rank gaps of a uniformly random ``n``-subset of ``total`` activity instants
    (``NULL_REPLICATES`` subsets drawn by ``_random_subsets``)."""
    rng = np.random.RandomState(NULL_SEED + 7919 * n + total)
    gaps = np.diff(_random_subsets(rng, total, n, NULL_REPLICATES), axis=1).astype(np.float64)
    cv = np.sort(gaps.std(axis=1) / gaps.mean(axis=1))
    cv.setflags(write=False)
    return cv


def dispersion_test(
    times: Sequence[float],
    activity: Sequence[float] | Activity | None = None,
) -> tuple[float, float, int]:
    """(CV of the inter-arrival gaps, two-sided p under no temporal structure, number of gaps).

    ``times`` are seconds (distinct, any order). Without ``activity`` the null is a Poisson process
    (given the first and last time, the others uniform in between). With ``activity`` (seconds of
    every instant the agent was active, e.g. its episodes' ends) the times are replaced by their
    mid-rank among the activity instants and the null is "a random subset of the activity": an
    agent that works office hours, or sessions that arrive like clockwork, do not make a pattern
    look structured.

    >>> cv, p, m = dispersion_test([3600.0 * i for i in range(12)])  # every hour on the hour
    >>> (cv, p < 0.001, m)
    (0.0, True, 11)
    """
    t = np.sort(np.asarray(times, dtype=np.float64))
    subset_of: int | None = None
    if activity is not None and len(activity):
        a = np.sort(np.asarray(activity, dtype=np.float64))
        t = (np.searchsorted(a, t, side="left") + np.searchsorted(a, t, side="right") - 1) / 2.0
        subset_of = max(len(a), len(t))
    gaps = np.diff(t)
    m = len(gaps)
    if m < 2 or gaps.sum() <= 0.0:
        return 0.0, 1.0, m
    cv = float(gaps.std() / gaps.mean())
    if m > NULL_MAX_GAPS:
        # asymptotically normal around the null's CV: 1 for Poisson, sqrt(1 - n/N) for a random subset
        centre = 1.0 if subset_of is None else math.sqrt(max(0.0, 1.0 - len(t) / subset_of))
        z = (cv - centre) * math.sqrt(m)
        return cv, float(min(1.0, math.erfc(abs(z) / math.sqrt(2.0)))), m
    null = _null_cv(m) if subset_of is None else _null_cv_subset(subset_of, len(t))
    r = len(null)
    p_low = (1 + np.searchsorted(null, cv, side="right")) / (r + 1)
    p_high = (1 + r - np.searchsorted(null, cv, side="left")) / (r + 1)
    return cv, float(min(1.0, 2.0 * min(p_low, p_high))), m


def rayleigh_test(times: Sequence[float], activity: Sequence[float] | Activity | None = None) -> tuple[float, float]:
    """(statistic, p) for "the hour of day of these times is not uniform" (or, with ``activity``,
    "differs from the activity's"). Without activity: Z = n·R̄², p by Zar (1999, eq. 27.4).

    >>> z, p = rayleigh_test([86400.0 * d + 9 * 3600 for d in range(10)])  # 09:00 every day
    >>> (round(z, 6), p < 1e-4)
    (10.0, True)
    """
    th = 2.0 * np.pi * (np.asarray(times, dtype=np.float64) % DAY_S) / DAY_S
    n = len(th)
    if n == 0:
        return 0.0, 1.0
    v = np.column_stack([np.cos(th), np.sin(th)])
    if activity is None or not len(activity):
        rbar = float(np.hypot(*v.mean(axis=0)))
        z = n * rbar * rbar
        p = math.exp(-z) * (
            1 + (2 * z - z * z) / (4 * n) - (24 * z - 132 * z**2 + 76 * z**3 - 9 * z**4) / (288 * n * n)
        )
        return z, float(min(1.0, max(0.0, p)))
    big_n, centre, cov = activity.phase_moments if isinstance(activity, Activity) else _phase_moments(activity)
    if np.linalg.det(cov) < 1e-12:
        return 0.0, 1.0  # the activity has (almost) a single phase: nothing to compare against
    d = v.mean(axis=0) - centre
    fpc = (big_n - n) / (big_n - 1) if big_n > n else 1.0
    t_stat = float(n * d @ np.linalg.solve(cov, d) / max(fpc, 1e-12))
    return t_stat, float(math.exp(-t_stat / 2.0))


def _phase_moments(activity: Sequence[float] | np.ndarray) -> tuple[int, np.ndarray, np.ndarray]:
    """(count, mean phase vector, covariance) of the activity's hour-of-day phases."""
    ta = 2.0 * np.pi * (np.asarray(activity, dtype=np.float64) % DAY_S) / DAY_S
    va = np.column_stack([np.cos(ta), np.sin(ta)])
    return len(va), va.mean(axis=0), np.cov(va, rowvar=False, bias=True)


class Activity:
    """Activity instants as seconds (a copy), with their phase moments computed once: every candidate
    of a promotion is tested against the same activity (a window holds ~32k instants). Usable
    wherever the tests take a sequence of seconds."""

    __slots__ = ("seconds", "_moments")

    def __init__(self, seconds: Sequence[float]) -> None:
        self.seconds = np.array(seconds, dtype=np.float64)
        self._moments: tuple[int, np.ndarray, np.ndarray] | None = None

    def __len__(self) -> int:
        return len(self.seconds)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        return self.seconds if dtype is None else self.seconds.astype(dtype, copy=False)

    @property
    def phase_moments(self) -> tuple[int, np.ndarray, np.ndarray]:
        if self._moments is None:
            self._moments = _phase_moments(self.seconds)
        return self._moments


def activity_seconds(activity_times: Sequence[datetime] | Activity | None) -> Activity | None:
    """Activity instants as an ``Activity`` (one given is taken as it is); None when there are none."""
    if activity_times is None or not len(activity_times):
        return None
    if isinstance(activity_times, Activity):
        return activity_times
    return Activity([t.timestamp() for t in activity_times])


def ips_gate(
    candidate: PromotionCandidate, *, activity_times: Sequence[datetime] | Activity | None = None
) -> GateVerdict:
    """Should this candidate reach the promoter? See the module docstring for the tests and thresholds.
    ``activity_times`` may be given converted (``activity_seconds``), once for many candidates."""
    if candidate.origin == ABSTRACTION:  # abstraction already asked for support across domains
        md = candidate.metadata
        return GateVerdict(
            True,
            "support",
            f"abstracted: {md.get('support')} memories over {len(md.get('domains', []))} domains",
            n=int(md.get("support", 0)),
        )
    if candidate.origin == STATISTICIAN:
        ok = candidate.confidence >= STAT_MIN_CONFIDENCE
        return GateVerdict(
            ok,
            "confidence",
            f"statistical pattern, confidence {candidate.confidence:.2f} {'>=' if ok else '<'} {STAT_MIN_CONFIDENCE}",
        )
    counts = _count_evidence(candidate)
    if counts is not None and counts < GATE_TEST_ALPHA:
        meta = candidate.metadata
        return GateVerdict(
            True,
            "counts",
            f"{meta['observation_count']} of {meta['event_observations']} "
            f"observations vs base rate {meta['base_rate']:.3f}: binomial p={counts:.3g}",
            counts,
            int(meta["event_observations"]),
        )
    times = sorted({t.timestamp() for t in candidate.observation_times})
    n = len(times)
    if n < GATE_MIN_OBSERVATIONS:
        return GateVerdict(
            True,
            "small_sample",
            f"{n} distinct observation times < {GATE_MIN_OBSERVATIONS}: too few to judge, let through",
            n=n,
        )
    act = activity_seconds(activity_times)
    cv, p_disp, m = dispersion_test(times, act)
    kind = "regular" if cv < 1.0 else "bursty"
    parts = [f"dispersion p={p_disp:.3g} (cv={cv:.2f}, {m} gaps, {kind if p_disp < GATE_TEST_ALPHA else 'random'})"]
    if p_disp < GATE_TEST_ALPHA:
        return GateVerdict(True, "dispersion", "structured: " + parts[0], p_disp, n)
    span_days = (times[-1] - times[0]) / DAY_S
    if span_days >= PHASE_MIN_SPAN_DAYS:
        stat, p_phase = rayleigh_test(times, act)
        parts.append(f"rayleigh p={p_phase:.3g} (stat={stat:.2f})")
        if p_phase < GATE_TEST_ALPHA:
            return GateVerdict(True, "rayleigh", "structured: " + parts[-1], p_phase, n)
        p_best = min(p_disp, p_phase)
    else:
        parts.append(f"phase test skipped (span {span_days:.1f} d < {PHASE_MIN_SPAN_DAYS:g} d)")
        p_best = p_disp
    return GateVerdict(False, "none", "no temporal structure: " + "; ".join(parts), p_best, n)


def _count_evidence(candidate: PromotionCandidate) -> float | None:
    """One-sided binomial p that the outcome follows the event no more often than the base rate
    (None when the candidate does not carry its counts)."""
    meta = candidate.metadata
    try:
        k, n, rate = int(meta["observation_count"]), int(meta["event_observations"]), float(meta["base_rate"])
    except (KeyError, TypeError, ValueError):
        return None
    if n < 1 or not 0.0 < rate < 1.0 or not 0 <= k <= n:
        return None

    return float(binomtest(k, n, rate, alternative="greater").pvalue)


Gate = Callable[..., GateVerdict]


# ---- from candidate to concept ----------------------------------------------------------------


class ConceptSpec(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    category: str
    definition: str
    provenance: Provenance
    properties: dict[str, Any] = {}
    parent: tuple[str, str] | None = None  # (name, category) of the IS_A target
    phase_lock: dict[str, float] | None = None  # PHASE_LOCKED_TO circadian_rhythm metadata
    episodes: list[str] = []
    evidence: list[str] = []
    math_id: str | None = None
    # False: the episodes are edges, not evidence. A topic's evidence is its sessions: its memories
    # are one abstraction's support, and counting them put every topic at the protected count at once.
    counts_episodes: bool = True


def concept_spec(candidate: PromotionCandidate, ag: AngularGyrusLayer) -> ConceptSpec | None:
    """What concept a candidate becomes (see the module docstring). None: its record is gone."""
    md = candidate.metadata
    if candidate.origin == ABSTRACTION:
        key, domains = str(md["key"]), list(md.get("domains", []))
        return ConceptSpec(
            name=key,
            category="topic",
            definition=f"A topic that comes back: '{key}' in {md.get('support')} memories over "
            f"{len(domains)} sessions or domains.",
            provenance=Provenance.EPISODIC_CONSOLIDATION,
            properties={"key": key, "domains": domains, SOURCE_AGENTS: md.get("source_agents", [])},
            episodes=list(candidate.source_memory_ids),
            evidence=[f"session:{d}" for d in domains],
            counts_episodes=False,
        )
    if candidate.origin == STATISTICIAN:
        rec = ag.get(str(md.get("math_id", "")))
        if rec is None:
            return None
        return _stat_spec(rec, int(md.get("revision", 1)))
    tool, valence, outcome = md.get("tool"), md.get("valence"), str(md.get("outcome", ""))
    n, v = int(md.get("observation_count", len(candidate.source_memory_ids))), float(md.get("strength", 0.0))
    props: dict[str, Any] = {"outcome": outcome, "valence": str(valence), "strength": round(v, 4), "observations": n}
    if md.get("source_agents"):
        props[SOURCE_AGENTS] = sorted(set(md["source_agents"]))
    if tool and valence in ("negative", "positive"):
        neg = valence == "negative"
        props["tool"] = tool
        text = f"Calls to {tool} tend to end in {outcome}" if neg else f"Calls to {tool} tend to succeed ({outcome})"
        return ConceptSpec(
            name=f"{tool}_{'unreliable' if neg else 'reliable'}",
            category="causal_pattern",
            definition=f"{text}: seen {n} times (strength V={v:.2f}).",
            provenance=Provenance.EPISODIC_CONSOLIDATION,
            properties=props,
            parent=("unreliable_tool" if neg else "reliable_tool", "operational_pattern"),
            episodes=list(candidate.source_memory_ids),
        )
    if tool:
        props["tool"] = tool
    return ConceptSpec(
        name=candidate.pattern_name,
        category=candidate.category,
        definition=f"{candidate.pattern_name}: seen {n} times (strength V={v:.2f}).",
        provenance=Provenance.EPISODIC_CONSOLIDATION,
        properties=props,
        episodes=list(candidate.source_memory_ids),
    )


def _stat_spec(rec: MathRecord, revision: int) -> ConceptSpec:
    evidence = [f"math:{rec.math_id}@{revision}"]
    props: dict[str, Any] = {"math_category": rec.category.value}
    if rec.source_agents:  # the pattern's provenance, so a read can check it without the pattern
        props[SOURCE_AGENTS] = sorted(set(rec.source_agents))
    if len(rec.subjects) == 1:
        props["tool"] = rec.subjects[0]
    definition, inferred, math_id = rec.verbal, Provenance.AGENT_INFERENCE, rec.math_id  # common to every kind
    if rec.category is MathCategory.PATTERN:
        tool = rec.subjects[0]
        slope = rec.statistics.get("slope_per_day", 0.0)
        props["slope_per_day"] = slope
        return ConceptSpec(
            name=f"{tool}_success_{'declining' if slope < 0 else 'rising'}",
            category="operational_pattern",
            properties=props,
            parent=("tool_trend", "operational_pattern"),
            definition=definition,
            provenance=inferred,
            evidence=evidence,
            math_id=math_id,
        )
    if rec.category is MathCategory.PHASE_LOCK:
        tool = rec.subjects[0]
        lock = {"phase_hour": rec.statistics.get("phase_hour", 0.0), "coupling": rec.statistics.get("coupling", 0.0)}
        return ConceptSpec(
            name=f"{tool}_success_circadian",
            category="temporal_pattern",
            properties={**props, **lock},
            phase_lock=lock,
            definition=definition,
            provenance=inferred,
            evidence=evidence,
            math_id=math_id,
        )
    a, b = rec.name.removeprefix("stat:corr:").split("~", 1)
    props["r"] = rec.statistics.get("r", 0.0)
    return ConceptSpec(
        name=f"{a}_correlates_with_{b}",
        category="operational_pattern",
        properties=props,
        definition=definition,
        provenance=inferred,
        evidence=evidence,
        math_id=math_id,
    )


# ---- the promoter -----------------------------------------------------------------------------


class SemanticPromoter:
    """Runs the promotion pipeline for one memory. ``gate=None`` promotes without the IPS gate.

    >>> from datetime import datetime, timezone
    >>> from somnus.schemas.semantic import CausalLinkView
    >>> m = MemoryLayers("agent:robot")
    >>> link = CausalLinkView(event_signature="tool:grasp", tool="grasp", outcome="error", valence="negative",
    ...     strength=0.8, confidence=0.8, observation_count=5, source_episode_ids=["e1", "e2", "e3", "e4", "e5"])
    >>> evs = SemanticPromoter().promote(m, [NacPromotionSource([link])], datetime(2024, 5, 1, tzinfo=timezone.utc))
    >>> c = m.atl.get(m.atl.find("grasp_unreliable"))
    >>> c.reinforcement_count, round(c.confidence, 3), len(m.cross.edges((Layer.ATL, c.concept_id)))
    (5, 0.724, 10)
    """

    def __init__(
        self,
        *,
        gate: Gate | None = ips_gate,
        min_confidence: float = MIN_CONFIDENCE,
        min_observations: int = MIN_OBSERVATIONS,
        activity_times: Sequence[datetime] | None = None,
    ) -> None:
        self.gate = gate
        self.min_confidence = min_confidence
        self.min_observations = min_observations
        # Converted once: each candidate's gate reads all of them (a promotion's window holds ~32k).
        self.activity_times = activity_seconds(activity_times)

    def promote(self, memory: MemoryLayers, sources: Iterable[PromotionSource], now: datetime) -> list[SemanticEvent]:
        """Promote every candidate of every source (in source order, then candidate order), then link
        the confirmed patterns. Returns the events (already applied to ``memory``)."""
        out: list[SemanticEvent] = []
        for source in sources:
            for cand in source.get_promotion_candidates(self.min_confidence, self.min_observations):
                verdict = (
                    self.gate(cand, activity_times=self.activity_times)
                    if self.gate is not None
                    else GateVerdict(True, "none", "no gate")
                )
                if not verdict.passed:
                    ev = CandidateRejected(
                        owner=memory.owner,
                        pattern_name=cand.pattern_name,
                        origin=cand.origin,
                        candidate_confidence=_unit(cand.confidence),
                        reason=verdict.reason,
                        at=now,
                    )
                    memory.apply(ev)
                    out.append(ev)
                    continue
                out += self._promote_one(memory, cand, verdict, now)
        out += link_patterns(memory, now)
        return out

    def _promote_one(
        self, memory: MemoryLayers, cand: PromotionCandidate, verdict: GateVerdict, now: datetime
    ) -> list[SemanticEvent]:
        spec = concept_spec(cand, memory.ag)
        if spec is None:
            return []
        props = spec.properties
        if SOURCE_AGENTS in props:  # a concept reinforced from more agents' data names them all
            old = memory.atl.get(memory.atl.find(spec.name) or "")
            if old is not None and old.properties.get("tool") == props.get("tool"):
                agents = {*old.properties.get(SOURCE_AGENTS, ()), *props[SOURCE_AGENTS]}
                props = {**props, SOURCE_AGENTS: sorted(agents)}
        cid, created, out = find_or_create(
            memory,
            spec.name,
            now,
            definition=spec.definition,
            category=spec.category,
            provenance=spec.provenance,
            properties=props,
            source_episode_ids=spec.episodes if spec.counts_episodes else [],
            evidence=spec.evidence,
        )
        changed = bool(out)
        if spec.parent is not None:
            pid, _, evs = find_or_create(
                memory,
                spec.parent[0],
                now,
                category=spec.parent[1],
                provenance=spec.provenance,
                definition=_PARENT_DEFINITIONS.get(spec.parent[0], ""),
            )
            out += evs + form_relationship(memory, cid, "IS_A", pid, now)
        if spec.phase_lock is not None:
            out += _phase_lock(memory, cid, spec.phase_lock, _confidence_of(memory, spec.math_id), now)
        out += _structural_edges(memory, cid, spec.episodes, now)
        if spec.math_id is not None:
            out += _edge(
                memory,
                (Layer.ANGULAR_GYRUS, spec.math_id),
                CrossEdgeType.STATISTICALLY_CONFIRMS,
                (Layer.ATL, cid),
                _confidence_of(memory, spec.math_id),
                now,
            )
        if changed:
            ev = ConceptPromoted(
                owner=memory.owner,
                concept_id=cid,
                pattern_name=cand.pattern_name,
                origin=cand.origin,
                candidate_confidence=_unit(cand.confidence),
                created=created,
                gate=verdict.reason,
                at=now,
            )
            memory.apply(ev)
            out.append(ev)
        return out


_PARENT_DEFINITIONS = {
    "unreliable_tool": "A tool whose calls often end in an error.",
    "reliable_tool": "A tool whose calls usually succeed.",
    "tool_trend": "A tool whose success rate is changing over days.",
    "circadian_rhythm": "The 24-hour cycle of the time of day.",
}


def _unit(x: float) -> float:
    return min(1.0, max(0.0, float(x)))


_DERIVED_FROM, _INSTANCE_OF = CrossEdgeType.DERIVED_FROM, CrossEdgeType.INSTANCE_OF


def _structural_edges(memory: MemoryLayers, cid: str, episodes: Iterable[str], now: datetime) -> list[SemanticEvent]:
    """For each episode in order, ``_edge`` of concept -> episode (DERIVED_FROM) then episode -> concept
    (INSTANCE_OF), weight ``STRUCTURAL_EDGE_WEIGHT``: the events, applied. A request repeats most of
    them (a link's episodes over the window, each request), so an edge already there with that weight
    is passed over before ``_edge`` is called (it would find the same and return nothing)."""
    out: list[SemanticEvent] = []
    concept = (Layer.ATL, cid)
    existing = memory.cross.get
    weight = round(_unit(STRUCTURAL_EDGE_WEIGHT), 6)  # as ``_edge`` rounds it
    for e in episodes:
        episode = (Layer.HIPPOCAMPUS, e)
        cur = existing(concept, _DERIVED_FROM, episode)
        if cur is None or cur.weight != weight:
            out += _edge(memory, concept, _DERIVED_FROM, episode, STRUCTURAL_EDGE_WEIGHT, now)
        cur = existing(episode, _INSTANCE_OF, concept)
        if cur is None or cur.weight != weight:
            out += _edge(memory, episode, _INSTANCE_OF, concept, STRUCTURAL_EDGE_WEIGHT, now)
    return out


def _confidence_of(memory: MemoryLayers, math_id: str | None) -> float:
    rec = memory.ag.get(math_id) if math_id else None
    return round(rec.confidence, 6) if rec is not None else 0.0


def _edge(
    memory: MemoryLayers, src: Node, kind: CrossEdgeType, dst: Node, weight: float, now: datetime
) -> list[SemanticEvent]:
    """A cross-layer edge event, or nothing when the same edge with the same weight exists."""
    weight = round(_unit(weight), 6)
    cur = memory.cross.get(src, kind, dst)
    if kind is CrossEdgeType.TEMPORALLY_CORRELATES and cur is None:
        cur = memory.cross.get(dst, kind, src)  # symmetric: stored once
    if cur is not None and cur.weight == weight:
        return []
    ev = CrossLayerEdgeFormed(
        owner=memory.owner,
        source_layer=src[0],
        source_id=src[1],
        edge_type=kind,
        target_layer=dst[0],
        target_id=dst[1],
        weight=weight,
        at=now,
    )
    memory.apply(ev)
    return [ev]


def _phase_lock(
    memory: MemoryLayers, cid: str, lock: Mapping[str, float], weight: float, now: datetime
) -> list[SemanticEvent]:
    rid, _, out = find_or_create(
        memory,
        "circadian_rhythm",
        now,
        category="temporal_pattern",
        provenance=Provenance.AGENT_INFERENCE,
        definition=_PARENT_DEFINITIONS["circadian_rhythm"],
    )
    meta = {k: round(float(v), 6) for k, v in sorted(lock.items())}
    return out + form_relationship(memory, cid, "PHASE_LOCKED_TO", rid, now, weight=weight, metadata=meta)


def link_patterns(memory: MemoryLayers, now: datetime) -> list[SemanticEvent]:
    """Edges and relationships from every confirmed pattern to the concepts about its subjects
    (see the module docstring). Only what is missing or changed becomes an event."""
    out: list[SemanticEvent] = []
    atl, ag = memory.atl, memory.ag
    trend_concepts: list[tuple[str, float, float]] = []  # (concept id, slope sign, confidence)
    for rec in ag:
        node = (Layer.ANGULAR_GYRUS, rec.math_id)
        confirmed = {e.target[1] for e in memory.cross.edges(node, CrossEdgeType.STATISTICALLY_CONFIRMS)}
        if rec.category is MathCategory.PATTERN:
            trend_concepts += [
                (c, math.copysign(1.0, rec.statistics.get("slope_per_day", 0.0)), rec.confidence)
                for c in sorted(confirmed)
            ]
        about = {s: [c for c in atl.by_property("tool", s) if c not in confirmed] for s in rec.subjects}
        targets = sorted({c for cs in about.values() for c in cs})
        kind = {
            MathCategory.PATTERN: CrossEdgeType.QUANTIFIES,
            MathCategory.PHASE_LOCK: CrossEdgeType.TEMPORALLY_CORRELATES,
            MathCategory.CORRELATION: CrossEdgeType.INFORMS,
        }[rec.category]
        for c in targets:
            out += _edge(memory, node, kind, (Layer.ATL, c), rec.confidence, now)
        if rec.category is MathCategory.PHASE_LOCK:
            lock = {
                "phase_hour": rec.statistics.get("phase_hour", 0.0),
                "coupling": rec.statistics.get("coupling", 0.0),
            }
            for c in targets:
                out += _phase_lock(memory, c, lock, rec.confidence, now)
        if rec.category is MathCategory.CORRELATION and len(rec.subjects) == 2:
            a, b = rec.subjects
            for ca in about[a]:
                for cb in about[b]:
                    out += form_relationship(
                        memory,
                        ca,
                        "CORRELATES_WITH",
                        cb,
                        now,
                        weight=rec.confidence,
                        metadata={"r": rec.statistics.get("r", 0.0)},
                    )
    trend_concepts.sort()
    for i, (ca, sa, wa) in enumerate(trend_concepts):
        for cb, sb, wb in trend_concepts[i + 1 :]:
            if ca != cb and sa == sb:
                out += form_relationship(memory, ca, "TRENDS_WITH", cb, now, weight=min(wa, wb))
    return out


# ---- cross-layer spreading activation ---------------------------------------------------------


def cross_layer_activation(
    memory: MemoryLayers,
    seeds: Iterable[tuple[Layer | str, str]],
    *,
    decay: float = ACTIVATION_DECAY,
    max_depth: int = ACTIVATION_MAX_DEPTH,
    threshold: float = ACTIVATION_THRESHOLD,
) -> dict[str, list[tuple[str, float]]]:
    """Activation spreading from records in any layer, through intra-layer associations and
    cross-layer edges alike (the stronger when both join two records), grouped by layer:
    ``{"hippocampus": [(id, score)], "atl": [...], "angular_gyrus": [...]}``, best first."""

    def neighbours(node: Node) -> list[tuple[Node, float]]:
        best: dict[Node, float] = {}
        for nb, w in memory.layer(node[0]).graph.neighbours(node[1]):
            best[(node[0], nb)] = w
        for other, w in memory.cross.neighbours(node):
            best[other] = max(best.get(other, 0.0), w)
        return sorted(best.items(), key=lambda x: (x[0][0].value, x[0][1]))

    start = [(Layer(layer), rid) for layer, rid in seeds]
    hits = spread(
        neighbours, start, decay=decay, max_depth=max_depth, threshold=threshold, key=lambda n: (n[0].value, n[1])
    )
    out: dict[str, list[tuple[str, float]]] = {layer.value: [] for layer in Layer}
    for (layer, rid), score in hits:
        out[layer.value].append((rid, score))
    return out
