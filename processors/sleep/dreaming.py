"""Dreaming: what a sleep run does besides forgetting. Pure numpy/polars over columns.

**Phase A** (during the hippocampus phase) routes each new observation, in event-time order, to
its nearest memory of the same agent (cosine of L2-normalised vectors; prediction error
``PE = 1 - max similarity``):

- the merge threshold adapts to the local density of the matched memory (mean similarity to its
  ``DENSITY_K`` nearest other memories, in [0, 1]): ``threshold = MERGE_PE * (0.5 + density)``, so
  dense regions (specialised content) cluster more eagerly (up to 0.225) and sparse ones hold
  back (down to 0.075);
- ``PE <= threshold``: clustered into that memory, unless schema congruence fails: a match with
  fewer than ``MIN_SCHEMA_EDGES`` (2) edges and a borderline similarity (PE within
  ``BORDERLINE_MARGIN`` (0.05) of the threshold) is **held** as episodic;
- otherwise it is **created**: a memory of its own, ``linked`` to its nearest one when
  ``PE <= SURPRISE_PE`` (0.5), a ``surprise`` above.
  A created observation joins the pool, so a later observation can cluster into it.
- every memory that received evidence is **refined** (its evidence, in order, and mean PE).

**Phase B** (during the consolidation phase):

- *connect*: recently active memories of one agent with similarity >= ``CONNECT_THRESHOLD`` (0.5)
  and no edge yet are linked, strongest pairs first, at most ``CONNECT_LIMIT`` (5) new edges each;
- *score*: FSRS-6 reviews of the **due** memories only (``elapsed >= 0.8 x stability``; never
  reviewed = due), rated from what happened since the last review (``composite_rating``);
- *abstract*: an index key seen in >= ``ABSTRACT_MIN_SUPPORT`` (3) memories across >=
  ``ABSTRACT_MIN_DOMAINS`` (2) domains of one agent becomes a pattern with provenance edges;
- *report*: ``pe_saturation`` (mean capture PE over ``SATURATION_WINDOW_DAYS`` (14) below
  ``SATURATION_THRESHOLD`` (0.15) with >= 5 samples: the schema stopped being surprised) and the
  Fiedler value (``processors/episodic/graph_metrics.py``).

FSRS-6 is implemented here vectorised (the ``fsrs`` package works card by card); the formulas and
default weights are those of py-fsrs 6.x, which ``tests/processors/sleep/test_dreaming.py`` checks
against when it is installed.

>>> import numpy as np
>>> round(float(adaptive_threshold(np.array([0.0, 0.5, 1.0]))[2]), 3)
0.225
>>> composite_rating(np.array([0, 1, 3, 5]), np.array([False, False, False, True])).tolist()
[2, 3, 4, 1]
>>> round(float(retrievability(np.array([10.0]), np.array([10.0]))[0]), 6)   # at t = S, R = 0.9
0.9
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import NamedTuple

import numpy as np
import polars as pl

from somnus.processors.working.session_buffer import content_words

US_PER_DAY = 86_400_000_000

# --- phase A -------------------------------------------------------------------------------------
MERGE_PE = 0.15  # PE below: same thing (cortex "merge")
SURPRISE_PE = 0.5  # PE above: surprise; between: related (linked)
DENSITY_K = 5  # neighbours that define a memory's local density
NEAREST_QUANTILE = 0.1  # of the matched memories' nearest-neighbour PEs: the agent's own "same thing"
NEAREST_MIN_SAMPLES = 2 * DENSITY_K  # fewer matched memories show no geometry: the design's constant
BORDERLINE_MARGIN = 0.05  # PE this close under the threshold is borderline
MIN_SCHEMA_EDGES = 2  # a match with fewer edges is a sparse schema

SIGNATURE_VALUES = 16  # one-hot width of a signature value (``signature_vectors``)

# --- phase B -------------------------------------------------------------------------------------
CONNECT_THRESHOLD = 0.5
CONNECT_LIMIT = 5  # edges among the recently active memories, existing ones included
DUE_FACTOR = 0.8  # review when elapsed >= 0.8 x stability
ABSTRACT_MIN_SUPPORT = 3
ABSTRACT_MIN_DOMAINS = 2
ABSTRACT_MAX_SOURCES = 20
SATURATION_WINDOW_DAYS = 14
SATURATION_THRESHOLD = 0.15
SATURATION_MIN_SAMPLES = 5

# --- FSRS-6 (py-fsrs 6.x DEFAULT_PARAMETERS) ----------------------------------------------------
FSRS6_PARAMETERS: tuple[float, ...] = (
    0.212,
    1.2931,
    2.3065,
    8.2956,
    6.4133,
    0.8334,
    3.0194,
    0.001,
    1.8722,
    0.1666,
    0.796,
    1.4835,
    0.0614,
    0.2629,
    1.6483,
    0.6014,
    1.8729,
    0.5425,
    0.0912,
    0.0658,
    0.1542,
)
DESIRED_RETENTION = 0.9
MAX_INTERVAL_DAYS = 36_500
STABILITY_MIN = 0.001
# Consolidation-aware decay: a memory relearning after an "again" counts a review as long-term
# after half a day; one in review after a full day (below that the short-term formula applies).
RELEARNING_MIN_DAYS = 0.5
REVIEW_MIN_DAYS = 1.0
AGAIN, HARD, GOOD, EASY = 1, 2, 3, 4


def signature_vectors(
    signatures: np.ndarray, values: int = SIGNATURE_VALUES, dtype: type[np.floating] = np.float32
) -> np.ndarray:
    """L2-normalised vectors of MinHash signatures (one row of ``k`` hash values each): one-hot of each
    value modulo ``values``, block by block, so the cosine of two rows is the share of blocks that agree,
    an estimate of the Jaccard similarity of their feature sets (plus ``(1 - J) / values`` of
    collisions). What dreaming compares when the fold has no sentence embeddings.

    ``dtype=np.float64`` gives the float32 rows' values, widened (what ``dream_phase_a`` and
    ``connect_recent`` compute with, so they need no copy of their own).

    >>> s = np.array([[1, 2, 3, 4], [1, 2, 3, 5], [9, 10, 11, 12]], dtype=np.uint32)
    >>> v = signature_vectors(s)
    >>> (v @ v.T).round(2).tolist()
    [[1.0, 0.75, 0.0], [0.75, 1.0, 0.0], [0.0, 0.0, 1.0]]
    """
    sig = np.asarray(signatures)
    n, k = sig.shape
    out = np.zeros((n, k * values), dtype=dtype)
    cols = np.arange(k) * values + (sig.astype(np.int64) % values)
    # The float32 value whatever ``dtype``: a float64 row is exactly a float32 row widened.
    out[np.repeat(np.arange(n), k), cols.ravel()] = np.float32(1.0 / np.sqrt(k)) if k else 0.0
    return out


def adaptive_threshold(density: np.ndarray, merge_pe: float = MERGE_PE) -> np.ndarray:
    """The PE under which an observation clusters, from the matched memory's density in [0, 1]."""
    return merge_pe * (0.5 + np.clip(density, 0.0, 1.0))


def agent_merge_pe(
    nearest_pe: np.ndarray,
    merge_pe: float = MERGE_PE,
    quantile: float = NEAREST_QUANTILE,
    min_samples: int = NEAREST_MIN_SAMPLES,
    cap: float = SURPRISE_PE,
) -> float:
    """The merge PE of one agent's run: ``merge_pe``, or the ``quantile`` of the PEs between the
    matched memories and their nearest other memory when that is larger (with at least
    ``min_samples`` of them; never above ``cap``: the same thing is never a surprise).

    A fixed merge PE assumes one scale of similarity for every kind of memory. MinHash signatures of
    tool traces repeat almost whole (near neighbours at PE < 0.1), those of chat messages share a
    few words at best (near neighbours at PE 0.3 to 0.6), so with 0.15 a conversation never
    clusters. The closest tenth of the agent's own neighbour pairs is what "the same thing" means in
    its geometry (cortex-engine: thresholds follow the manifold's local density, not a constant).

    >>> agent_merge_pe(np.array([0.02, 0.05, 0.1, 0.3]))   # tool traces: the design's 0.15
    0.15
    >>> agent_merge_pe(np.linspace(0.4, 0.8, 11))   # chat: its own closest tenth
    0.44
    >>> agent_merge_pe(np.array([0.9, 1.0]))   # two memories far apart: no geometry to adapt to
    0.15
    """
    pe = np.asarray(nearest_pe, dtype=np.float64)
    if pe.size < max(min_samples, 1):
        return merge_pe
    return round(min(max(merge_pe, float(np.quantile(pe, quantile))), max(cap, merge_pe)), 6)


class PhaseA(NamedTuple):
    clustered: pl.DataFrame  # observation_id, memory_id, agent, prediction_error, threshold
    held: pl.DataFrame  # observation_id, nearest_id, agent, prediction_error, nearest_edges
    created: pl.DataFrame  # observation_id, agent, prediction_error, nearest_id, surprise, linked
    refined: pl.DataFrame  # memory_id, agent, evidence (list), mean_prediction_error


def _topk_mean(sims: np.ndarray, k: int) -> np.ndarray:
    """Mean of the k largest values of each row (fewer when a row is shorter; 0 when empty)."""
    if sims.shape[1] == 0:
        return np.zeros(sims.shape[0])
    k = min(k, sims.shape[1])
    part = np.partition(sims, sims.shape[1] - k, axis=1)[:, -k:]
    return part.mean(axis=1)


def _best(sims: np.ndarray, ids_rank: np.ndarray) -> np.ndarray:
    """Column of each row's maximum; ties go to the smallest id (rank) so the choice is stable."""
    top = sims.max(axis=1, keepdims=True)
    masked = np.where(sims >= top, ids_rank[None, :], np.iinfo(np.int64).max)
    return np.argmin(masked, axis=1)


def dream_phase_a(
    memory_ids: Sequence[str],
    memory_agents: Sequence[str],
    memory_vectors: np.ndarray,
    memory_edges: np.ndarray,
    observation_ids: Sequence[str],
    observation_agents: Sequence[str],
    observation_times: np.ndarray,
    observation_vectors: np.ndarray,
    *,
    merge_pe: float = MERGE_PE,
    surprise_pe: float = SURPRISE_PE,
    density_k: int = DENSITY_K,
    margin: float = BORDERLINE_MARGIN,
    min_edges: int = MIN_SCHEMA_EDGES,
    chunk: int = 4096,
) -> PhaseA:
    """Cluster, hold or create each observation (see the module doc). Vectors are L2-normalised rows.

    Cost per agent: O(K x M x d) for K observations against M memories (one matrix product in
    chunks of ``chunk`` memories) plus O(K^2) among the observations themselves.
    """
    mem_ids = np.asarray(memory_ids, dtype=object)
    mem_agents = np.asarray(memory_agents, dtype=object)
    obs_ids = np.asarray(observation_ids, dtype=object)
    obs_agents = np.asarray(observation_agents, dtype=object)
    obs_times = np.asarray(observation_times, dtype=np.int64)
    mem_vec = np.asarray(memory_vectors, dtype=np.float64)
    obs_vec = np.asarray(observation_vectors, dtype=np.float64)
    mem_edges = np.asarray(memory_edges, dtype=np.int64)
    clustered: list[tuple[str, str, str, float, float]] = []
    held: list[tuple[str, str, str, float, int]] = []
    created: list[tuple[str, str, float, str | None, bool, bool]] = []
    evidence: dict[str, list[tuple[str, float]]] = {}
    evidence_agent: dict[str, str] = {}
    for agent in sorted(set(obs_agents.tolist())):
        o_rows = np.flatnonzero(obs_agents == agent)
        # Event-time order, ties by id: the order a replay sees them.
        o_rows = o_rows[np.lexsort((obs_ids[o_rows].astype(str), obs_times[o_rows]))]
        m_rows = np.flatnonzero(mem_agents == agent)
        m_rank = np.argsort(np.argsort(mem_ids[m_rows].astype(str), kind="stable"), kind="stable")
        ov = obs_vec[o_rows]
        k = len(o_rows)
        best_sim = np.full(k, -np.inf)
        best_col = np.full(k, -1, dtype=np.int64)
        if len(m_rows):
            # One agent's memories only (``plan._dream_phase_a`` calls per agent): no copy of them all.
            mv = mem_vec if len(m_rows) == len(mem_vec) else mem_vec[m_rows]
            for start in range(0, len(m_rows), chunk):
                sims = ov @ mv[start : start + chunk].T
                col = _best(sims, m_rank[start : start + chunk])
                val = sims[np.arange(k), col]
                col = col + start
                # Strictly better, or equal with a smaller id: the same winner whatever the chunking.
                better = (val > best_sim) | (
                    (val == best_sim) & (best_col >= 0) & (m_rank[col] < m_rank[np.maximum(best_col, 0)])
                )
                best_sim = np.where(better, val, best_sim)
                best_col = np.where(better, col, best_col)
            # Local density, only for the memories some observation matched: O(matched x M).
            matched = np.unique(best_col[best_col >= 0])
            mem_density = np.zeros(len(m_rows))
            nearest_pe = np.zeros(0)
            k_eff = min(density_k, len(m_rows) - 1)
            for start in range(0, len(matched) if k_eff > 0 else 0, chunk):
                part = matched[start : start + chunk]
                sims = mv[part] @ mv.T
                sims[np.arange(len(part)), part] = -np.inf  # not itself
                mem_density[part] = np.clip(_topk_mean(sims, k_eff), 0.0, 1.0)
                nearest_pe = np.concatenate([nearest_pe, np.clip(1.0 - sims.max(axis=1), 0.0, 1.0)])
        else:
            mem_density = np.zeros(0)
            nearest_pe = np.zeros(0)
        agent_merge = agent_merge_pe(nearest_pe, merge_pe)
        agent_margin = margin * agent_merge / merge_pe  # borderline: the same share of the threshold
        obs_sims = ov @ ov.T
        # Memories created from earlier observations of this run: (row in ov, density, edges so far).
        pool: list[int] = []
        pool_density: dict[int, float] = {}
        pool_edges: dict[int, int] = {}
        for r in range(k):
            sim, target_obs = best_sim[r], -1
            for p in pool:
                s = obs_sims[r, p]
                if s > sim:  # pool entries come later than memories: strictly better only
                    sim, target_obs = s, p
            oid = str(obs_ids[o_rows[r]])
            if not np.isfinite(sim):  # nothing to compare with: the first memory of this agent
                created.append((oid, agent, 1.0, None, True, False))
                pool.append(r)
                pool_density[r] = 0.0
                pool_edges[r] = 0
                continue
            pe = float(np.clip(1.0 - sim, 0.0, 1.0))
            if target_obs >= 0:
                tid = str(obs_ids[o_rows[target_obs]])
                dens, edges = pool_density[target_obs], pool_edges[target_obs]
            else:
                best = int(best_col[r])
                tid = str(mem_ids[m_rows[best]])
                dens, edges = float(mem_density[best]), int(mem_edges[m_rows[best]])
            threshold = float(adaptive_threshold(np.array([dens]), agent_merge)[0])
            if pe <= threshold:
                if edges < min_edges and pe > threshold - agent_margin:
                    held.append((oid, tid, agent, round(pe, 6), edges))
                else:
                    clustered.append((oid, tid, agent, round(pe, 6), round(threshold, 6)))
                    evidence.setdefault(tid, []).append((oid, pe))
                    evidence_agent[tid] = agent
                continue
            linked = pe <= surprise_pe
            created.append((oid, agent, round(pe, 6), tid, pe > surprise_pe, linked))
            pool.append(r)
            # ``mv`` is this agent's memories (``mem_vec[m_rows]``, copied once, not per observation).
            row = np.concatenate([ov[r] @ mv.T if len(m_rows) else np.zeros(0), obs_sims[r, pool[:-1]]])
            pool_density[r] = float(np.clip(_topk_mean(row[None, :], density_k)[0], 0.0, 1.0)) if len(row) else 0.0
            pool_edges[r] = 1 if linked else 0
            if linked and target_obs >= 0:
                pool_edges[target_obs] += 1
    refined = [
        (mid, evidence_agent[mid], [o for o, _ in ev], round(float(np.mean([p for _, p in ev])), 6))
        for mid, ev in sorted(evidence.items())
    ]
    return PhaseA(
        clustered=pl.DataFrame(
            clustered,
            schema={
                "observation_id": pl.String,
                "memory_id": pl.String,
                "agent": pl.String,
                "prediction_error": pl.Float64,
                "threshold": pl.Float64,
            },
            orient="row",
        ),
        held=pl.DataFrame(
            held,
            schema={
                "observation_id": pl.String,
                "nearest_id": pl.String,
                "agent": pl.String,
                "prediction_error": pl.Float64,
                "nearest_edges": pl.Int64,
            },
            orient="row",
        ),
        created=pl.DataFrame(
            created,
            schema={
                "observation_id": pl.String,
                "agent": pl.String,
                "prediction_error": pl.Float64,
                "nearest_id": pl.String,
                "surprise": pl.Boolean,
                "linked": pl.Boolean,
            },
            orient="row",
        ),
        refined=pl.DataFrame(
            refined,
            schema={
                "memory_id": pl.String,
                "agent": pl.String,
                "evidence": pl.List(pl.String),
                "mean_prediction_error": pl.Float64,
            },
            orient="row",
        ),
    )


def connect_recent(
    ids: Sequence[str],
    agents: Sequence[str],
    vectors: np.ndarray,
    existing: set[tuple[str, str]] | None = None,
    *,
    threshold: float = CONNECT_THRESHOLD,
    limit: int = CONNECT_LIMIT,
) -> pl.DataFrame:
    """New edges among recently active memories: a, b (a < b), agent, weight (= similarity).

    Strongest pairs first (ties by ids); a pair is skipped once either end has ``limit`` edges
    among these memories, the ``existing`` ones included (so connecting again finds nothing new).

    >>> v = np.array([[1.0, 0.0], [0.8, 0.6], [0.0, 1.0]])
    >>> connect_recent(["x", "y", "z"], ["a"] * 3, v).rows()
    [('x', 'y', 'a', 0.8), ('y', 'z', 'a', 0.6)]
    """
    existing = existing or set()
    ids_arr = np.asarray(ids, dtype=object)
    agents_arr = np.asarray(agents, dtype=object)
    vec = np.asarray(vectors, dtype=np.float64)
    out: list[tuple[str, str, str, float]] = []
    for agent in sorted(set(agents_arr.tolist())):
        rows = np.flatnonzero(agents_arr == agent)
        rows = rows[np.argsort(ids_arr[rows].astype(str), kind="stable")]
        if len(rows) < 2:
            continue
        v = vec[rows]
        sims = v @ v.T
        a, b = np.triu_indices(len(rows), 1)
        s = sims[a, b]
        keep = s >= threshold
        a, b, s = a[keep], b[keep], s[keep]
        order = np.lexsort((b, a, -s))
        row_ids = [str(x) for x in ids_arr[rows].tolist()]
        position = {m: k for k, m in enumerate(row_ids)}
        count = [0] * len(rows)  # a Python list: read and bumped once per candidate pair
        for u, w in existing:
            if u in position and w in position:
                count[position[u]] += 1
                count[position[w]] += 1
        for x, y, sim in zip(a[order].tolist(), b[order].tolist(), s[order].tolist(), strict=True):
            ia, ib = row_ids[x], row_ids[y]
            if (ia, ib) in existing or count[x] >= limit or count[y] >= limit:
                continue
            count[x] += 1
            count[y] += 1
            out.append((ia, ib, agent, round(min(sim, 1.0), 6)))
    return pl.DataFrame(
        out, schema={"a": pl.String, "b": pl.String, "agent": pl.String, "weight": pl.Float64}, orient="row"
    )


# --- FSRS-6, vectorised ---------------------------------------------------------------------------
_W = FSRS6_PARAMETERS
DECAY = -_W[20]
FACTOR = 0.9 ** (1.0 / DECAY) - 1.0


def retrievability(elapsed_days: np.ndarray, stability: np.ndarray) -> np.ndarray:
    """``R(t, S) = (1 + FACTOR t / S) ^ DECAY``: 0.9 at t = S by construction of FACTOR."""
    return (1.0 + FACTOR * np.maximum(elapsed_days, 0.0) / stability) ** DECAY


def next_interval(stability: np.ndarray, desired_retention: float = DESIRED_RETENTION) -> np.ndarray:
    """Whole days until R falls to the desired retention (>= 1, <= 36500), as py-fsrs rounds it."""
    days = stability / FACTOR * (desired_retention ** (1.0 / DECAY) - 1.0)
    return np.clip(np.round(days), 1, MAX_INTERVAL_DAYS).astype(np.int64)


def initial_stability(rating: np.ndarray) -> np.ndarray:
    return np.maximum(np.asarray(_W[:4])[rating - 1], STABILITY_MIN)


def _initial_difficulty_raw(rating: np.ndarray | int) -> np.ndarray:
    return _W[4] - np.exp(_W[5] * (np.asarray(rating) - 1)) + 1.0


def initial_difficulty(rating: np.ndarray) -> np.ndarray:
    return np.clip(_initial_difficulty_raw(rating), 1.0, 10.0)


def next_difficulty(difficulty: np.ndarray, rating: np.ndarray) -> np.ndarray:
    delta = -_W[6] * (rating - 3)
    damped = difficulty + (10.0 - difficulty) * delta / 9.0
    return np.clip(_W[7] * _initial_difficulty_raw(EASY) + (1.0 - _W[7]) * damped, 1.0, 10.0)


def next_recall_stability(
    difficulty: np.ndarray, stability: np.ndarray, r: np.ndarray, rating: np.ndarray
) -> np.ndarray:
    hard = np.where(rating == HARD, _W[15], 1.0)
    easy = np.where(rating == EASY, _W[16], 1.0)
    return stability * (
        1.0
        + np.exp(_W[8]) * (11.0 - difficulty) * stability ** -_W[9] * (np.exp((1.0 - r) * _W[10]) - 1.0) * hard * easy
    )


def next_forget_stability(difficulty: np.ndarray, stability: np.ndarray, r: np.ndarray) -> np.ndarray:
    long_term = _W[11] * difficulty ** -_W[12] * ((stability + 1.0) ** _W[13] - 1.0) * np.exp((1.0 - r) * _W[14])
    return np.minimum(long_term, stability / np.exp(_W[17] * _W[18]))


def short_term_stability(stability: np.ndarray, rating: np.ndarray) -> np.ndarray:
    increase = np.exp(_W[17] * (rating - 3 + _W[18])) * stability ** -_W[19]
    increase = np.where(rating >= HARD, np.maximum(increase, 1.0), increase)
    return np.maximum(stability * increase, STABILITY_MIN)


def composite_rating(new_accesses: np.ndarray, contradicted: np.ndarray) -> np.ndarray:
    """The review's rating from what happened since the last review: contradicted -> again (1);
    not recalled -> hard (2); recalled once or twice -> good (3); three times or more -> easy (4)."""
    rating = np.where(new_accesses >= 3, EASY, np.where(new_accesses >= 1, GOOD, HARD))
    return np.where(contradicted, AGAIN, rating).astype(np.int64)


def due(stability: np.ndarray, elapsed_days: np.ndarray, factor: float = DUE_FACTOR) -> np.ndarray:
    """Never reviewed (NaN stability), or elapsed >= factor x stability."""
    return np.isnan(stability) | (elapsed_days >= factor * np.nan_to_num(stability, nan=0.0))


class Reviews(NamedTuple):
    rows: np.ndarray  # which of the inputs were due and reviewed
    rating: np.ndarray
    elapsed_days: np.ndarray
    retrievability: np.ndarray  # before the review (1.0 for a first review)
    stability: np.ndarray
    difficulty: np.ndarray
    interval_days: np.ndarray


def review(
    stability: np.ndarray,
    difficulty: np.ndarray,
    last_review_us: np.ndarray,
    last_rating: np.ndarray,
    new_accesses: np.ndarray,
    contradicted: np.ndarray,
    now_us: int,
    *,
    factor: float = DUE_FACTOR,
) -> Reviews:
    """FSRS-6 review of the due memories. ``stability``/``difficulty`` NaN and ``last_review_us``
    of a never-reviewed memory are ignored (it gets its first review: initial S and D)."""
    stability = np.asarray(stability, dtype=np.float64)
    elapsed = (now_us - np.asarray(last_review_us, dtype=np.int64)) / US_PER_DAY
    elapsed = np.where(np.isnan(stability), 0.0, np.maximum(elapsed, 0.0))
    rows = np.flatnonzero(due(stability, elapsed, factor))
    s = stability[rows]
    d = np.asarray(difficulty, dtype=np.float64)[rows]
    e = elapsed[rows]
    g = composite_rating(np.asarray(new_accesses)[rows], np.asarray(contradicted, dtype=bool)[rows])
    first = np.isnan(s)
    s_safe = np.where(first, 1.0, s)
    d_safe = np.where(first, 5.0, d)
    r = np.where(first, 1.0, retrievability(e, s_safe))
    min_days = np.where(np.asarray(last_rating)[rows] == AGAIN, RELEARNING_MIN_DAYS, REVIEW_MIN_DAYS)
    long_term = np.where(
        g == AGAIN, next_forget_stability(d_safe, s_safe, r), next_recall_stability(d_safe, s_safe, r, g)
    )
    new_s = np.where(
        first,
        initial_stability(g),
        np.where(e < min_days, short_term_stability(s_safe, g), np.maximum(long_term, STABILITY_MIN)),
    )
    new_d = np.where(first, initial_difficulty(g), next_difficulty(d_safe, g))
    return Reviews(rows, g, e, np.clip(r, 0.0, 1.0), new_s, new_d, next_interval(new_s))


def pattern_id_for(agent: str, key: str) -> str:
    """A stable id of an abstracted pattern (the same agent and key give the same id)."""
    return "pattern-" + hashlib.blake2b(f"{agent}\x1f{key}".encode(), digest_size=8).hexdigest()


def abstract_patterns(
    memories: pl.DataFrame,
    existing: set[str] | None = None,
    *,
    min_support: int = ABSTRACT_MIN_SUPPORT,
    min_domains: int = ABSTRACT_MIN_DOMAINS,
    max_sources: int = ABSTRACT_MAX_SOURCES,
) -> pl.DataFrame:
    """Cross-domain patterns from columns memory_id, agent, domain, index_keys: pattern_id, agent,
    key, domains, support, source_ids, source_domains (the provenance edges, at most ``max_sources``,
    smallest ids first).

    >>> m = pl.DataFrame({"memory_id": ["m1", "m2", "m3"], "agent": ["a"] * 3, "domain": ["web", "db", "web"],
    ...                   "index_keys": [["timeout"], ["timeout"], ["timeout", "x"]]})
    >>> abstract_patterns(m).select("key", "domains", "support").rows()
    [('timeout', ['db', 'web'], 3)]
    """
    existing = existing or set()
    frame = memories.select(
        pl.col("memory_id").cast(pl.String),
        pl.col("agent").cast(pl.String),
        pl.col("domain").cast(pl.String),
        pl.col("index_keys").alias("key"),
    )
    long = (
        frame.filter(pl.col("domain") != "")
        .explode("key")
        .drop_nulls("key")
        .unique(["agent", "key", "memory_id"])
        .sort(["agent", "key", "memory_id"])
    )
    grouped = (
        long.group_by(["agent", "key"], maintain_order=True)
        .agg(
            pl.col("domain").unique().sort().alias("domains"),
            pl.len().alias("support"),
            pl.col("memory_id").head(max_sources).alias("source_ids"),
            pl.col("domain").head(max_sources).alias("source_domains"),
        )
        .filter((pl.col("support") >= min_support) & (pl.col("domains").list.len() >= min_domains))
    )
    ids = [pattern_id_for(a, k) for a, k in zip(grouped["agent"].to_list(), grouped["key"].to_list(), strict=True)]
    out = grouped.with_columns(pl.Series("pattern_id", ids, dtype=pl.String)).filter(
        ~pl.col("pattern_id").is_in(sorted(existing))
    )
    return out.select(
        "pattern_id", "agent", "key", "domains", pl.col("support").cast(pl.Int64), "source_ids", "source_domains"
    )


MESSAGE_KEYS = 3  # a message's index keys: its most specific recurring words (a tool trace's: tools, objects)


def message_keys(
    texts: Sequence[str],
    first: int = MESSAGE_KEYS,
    min_count: int = ABSTRACT_MIN_SUPPORT,
    shared: Mapping[str, int] | None = None,
    agents: int = 1,
) -> list[list[str]]:
    """What each of one agent's chat messages is about, as abstraction keys: of its distinct content
    words that at least ``min_count`` of the messages use (a word used fewer times can never be a
    pattern), the ``first`` most specific (ties in text order).

    Most specific means used by the fewest of the ``agents`` conversations (``shared``: word -> how
    many use it), then by the fewest of these messages. A word that every one of three or more
    conversations uses is no topic of any of them ("nice", "wow", "appreciate"), so it is dropped. A
    message names no tool or object, so without these it offers abstraction nothing; with them and
    its session as its domain, a topic that comes back in another session becomes a pattern.

    >>> message_keys(["fun pottery class", "the pottery glaze was fun", "fun pottery kiln",
    ...               "fun hike", "a fun hike", "fun hike", "the kiln"])
    [['pottery', 'fun'], ['pottery', 'fun'], ['pottery', 'fun'], ['hike', 'fun'], ['hike', 'fun'], ['hike', 'fun'], []]
    >>> message_keys(["fun pottery", "fun pottery", "fun pottery"], shared={"fun": 3, "pottery": 1}, agents=3)
    [['pottery'], ['pottery'], ['pottery']]
    """
    shared = shared or {}
    words = [list(dict.fromkeys(content_words(t))) for t in texts]
    count: dict[str, int] = {}
    for ws in words:
        for w in ws:
            count[w] = count.get(w, 0) + 1
    everywhere = agents >= 3
    out = []
    for ws in words:
        kept = [w for w in ws if count[w] >= min_count and not (everywhere and shared.get(w, 0) >= agents)]
        out.append(sorted(kept, key=lambda w: (shared.get(w, 1), count[w]))[:first])  # stable: text order
    return out


class Saturation(NamedTuple):
    mean_pe: float | None
    previous_mean_pe: float | None
    samples: int
    saturated: bool
    status: str  # saturated | healthy | insufficient


def pe_saturation(
    times_us: np.ndarray,
    prediction_errors: np.ndarray,
    now_us: int,
    *,
    window_days: float = SATURATION_WINDOW_DAYS,
    threshold: float = SATURATION_THRESHOLD,
    min_samples: int = SATURATION_MIN_SAMPLES,
) -> Saturation:
    """Mean PE of the observations in ``(now - window, now]`` (and of the window before, for the
    trend); saturated when the mean is under ``threshold`` with at least ``min_samples``.

    >>> day = US_PER_DAY
    >>> pe_saturation(np.array([1, 2, 3, 4, 5]) * day, np.full(5, 0.05), 10 * day).status
    'saturated'
    """
    t = np.asarray(times_us, dtype=np.int64)
    pe = np.asarray(prediction_errors, dtype=np.float64)
    width = int(window_days * US_PER_DAY)
    current = (t > now_us - width) & (t <= now_us)
    before = (t > now_us - 2 * width) & (t <= now_us - width)
    n = int(current.sum())
    mean = round(float(pe[current].mean()), 6) if n else None
    prev = round(float(pe[before].mean()), 6) if before.any() else None
    if n < min_samples or mean is None:
        return Saturation(mean, prev, n, False, "insufficient")
    saturated = mean < threshold
    return Saturation(mean, prev, n, saturated, "saturated" if saturated else "healthy")
