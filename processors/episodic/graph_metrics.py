"""How integrated the memory graph is: the Laplacian, its Fiedler value, components, and the trend.

The Fiedler value (algebraic connectivity) is the second-smallest eigenvalue lambda_2 of the
graph Laplacian ``L = D - W``. High: memories inform each other; low: isolated clusters; zero:
the graph is disconnected. A memory graph of a fleet is almost always disconnected (each agent's
memories form their own islands, and fresh memories have no edge yet), so the report carries both
lambda_2 of the whole graph (0 then) and lambda_2 of its **largest connected component**, which is
the value whose trend over sleep runs says whether dreams integrate or fragment.

Graphs are edge lists over node indices ``0..n-1`` (``i``, ``j``, optional ``w``), undirected:
each pair counts once whatever its direction or repetitions (the largest weight wins), and
self-loops are ignored. Everything is numpy; no scipy:

- up to ``DENSE_LIMIT`` nodes, ``numpy.linalg.eigvalsh`` of the dense Laplacian (exact);
- above, a Lanczos iteration on the sparse operator (``x -> D x - W x`` with ``np.bincount``),
  restricted to the complement of the constant vector (re-projected every step, so the zero
  eigenvalue never reappears), with a fixed start vector (seeded), stopped when the residual bound
  of the smallest Ritz pair is below ``rtol * lambda``. Memory is O(n): no reorthogonalisation
  (its lost orthogonality only duplicates converged Ritz values, never below lambda_2).

Closed forms the tests pin: path P_n: ``2 (1 - cos(pi / n))``; complete K_n: ``n``;
cycle C_n: ``2 (1 - cos(2 pi / n))``; star: 1.

>>> import math
>>> import numpy as np
>>> i, j = np.arange(4), np.arange(1, 5)          # the path 0-1-2-3-4
>>> round(fiedler_value(5, i, j), 6), round(2 * (1 - math.cos(math.pi / 5)), 6)
(0.381966, 0.381966)
>>> fiedler_value(4, np.array([0, 2]), np.array([1, 3]))  # two separate edges: disconnected
0.0
>>> fiedler_trend([0.2, 0.18, 0.15, 0.11]).status
'fragmenting'
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

DENSE_LIMIT = 1500  # nodes; above this the sparse Lanczos path runs
LANCZOS_RTOL = 1e-6  # stop when the residual bound is this small relative to lambda_2
LANCZOS_SEED = 20240515  # the start vector's seed: the same graph gives the same iterations
TREND_WINDOW = 5  # runs the trend's least-squares slope looks at
TREND_TOLERANCE = 0.02  # |slope| under this fraction of the mean value per run is "stable"


class Graph(NamedTuple):
    """An undirected simple graph: ``i < j`` for every edge, each pair once."""

    n: int
    i: np.ndarray  # int64
    j: np.ndarray  # int64
    w: np.ndarray  # float64, > 0


def simple_graph(n: int, i: np.ndarray, j: np.ndarray, w: np.ndarray | None = None) -> Graph:
    """Normalise an edge list: drop self-loops and out-of-range ends, one edge per pair (max weight).

    >>> g = simple_graph(3, np.array([1, 0, 0, 2]), np.array([0, 1, 0, 1]), np.array([0.5, 0.9, 1.0, 0.2]))
    >>> g.i.tolist(), g.j.tolist(), g.w.tolist()
    ([0, 1], [1, 2], [0.9, 0.2])
    """
    i = np.asarray(i, dtype=np.int64)
    j = np.asarray(j, dtype=np.int64)
    w = np.ones(len(i), dtype=np.float64) if w is None else np.asarray(w, dtype=np.float64)
    keep = (i != j) & (i >= 0) & (j >= 0) & (i < n) & (j < n) & (w > 0)
    lo = np.minimum(i[keep], j[keep])
    hi = np.maximum(i[keep], j[keep])
    w = w[keep]
    if len(lo) == 0:
        empty = np.zeros(0, dtype=np.int64)
        return Graph(n, empty, empty.copy(), np.zeros(0))
    key = lo * np.int64(n) + hi
    order = np.argsort(key)  # ties (one pair repeated) are merged below: their order does not matter
    key, w = key[order], w[order]
    first = np.ones(len(key), dtype=bool)
    first[1:] = key[1:] != key[:-1]
    starts = np.flatnonzero(first)
    return Graph(n, key[starts] // n, key[starts] % n, np.maximum.reduceat(w, starts))


def weighted_degrees(g: Graph) -> np.ndarray:
    return np.bincount(g.i, weights=g.w, minlength=g.n) + np.bincount(g.j, weights=g.w, minlength=g.n)


def laplacian(g: Graph) -> np.ndarray:
    """The dense Laplacian ``D - W`` (for small graphs and tests)."""
    lap = np.zeros((g.n, g.n))
    lap[g.i, g.j] = -g.w
    lap[g.j, g.i] = -g.w
    lap[np.arange(g.n), np.arange(g.n)] = weighted_degrees(g)
    return lap


def laplacian_matvec(g: Graph, degrees: np.ndarray, x: np.ndarray) -> np.ndarray:
    """``L x`` without forming L: O(n + edges)."""
    wx = np.bincount(g.i, weights=g.w * x[g.j], minlength=g.n) + np.bincount(g.j, weights=g.w * x[g.i], minlength=g.n)
    return degrees * x - wx


def connected_components(g: Graph) -> np.ndarray:
    """A component label per node: the smallest node index of its component.

    Hook-and-compress: every round hooks the larger root of each edge under the smaller one and
    then jumps pointers until every node points at its root; O(log n) rounds in practice.

    >>> connected_components(simple_graph(5, np.array([0, 3]), np.array([1, 4]))).tolist()
    [0, 0, 2, 3, 3]
    """
    parent = np.arange(g.n, dtype=np.int64)
    if len(g.i) == 0:
        return parent
    while True:
        pi, pj = parent[g.i], parent[g.j]
        differ = pi != pj
        if not differ.any():
            return parent
        lo = np.minimum(pi[differ], pj[differ])
        hi = np.maximum(pi[differ], pj[differ])
        np.minimum.at(parent, hi, lo)
        while True:
            jumped = parent[parent]
            if np.array_equal(jumped, parent):
                break
            parent = jumped


def induced(g: Graph, nodes: np.ndarray) -> Graph:
    """The subgraph on ``nodes`` (sorted indices), renumbered 0..len(nodes)-1."""
    index = np.full(g.n, -1, dtype=np.int64)
    index[nodes] = np.arange(len(nodes))
    a, b = index[g.i], index[g.j]
    keep = (a >= 0) & (b >= 0)
    return Graph(len(nodes), a[keep], b[keep], g.w[keep])


def _smallest_tridiagonal(alpha: list[float], beta: list[float]) -> tuple[float, float]:
    """Smallest eigenvalue of the symmetric tridiagonal (alpha, beta[:-1]) and its eigenvector's last
    component (for the Lanczos residual bound beta_k |y_k|), by Sturm bisection + inverse iteration."""
    k = len(alpha)
    off = beta[: k - 1]
    radius = [abs(off[r - 1]) if r > 0 else 0.0 for r in range(k)]
    for r in range(k - 1):
        radius[r] += abs(off[r])
    lo = min(a - rad for a, rad in zip(alpha, radius, strict=True))
    hi = max(a + rad for a, rad in zip(alpha, radius, strict=True))

    def below(x: float) -> int:  # eigenvalues < x (negative pivots of the LDL^T of T - x I)
        count, d = 0, 1.0
        for r in range(k):
            d = alpha[r] - x - (off[r - 1] ** 2 / d if r > 0 else 0.0)
            if d == 0.0:
                d = -1e-300
            if d < 0:
                count += 1
        return count

    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if mid <= lo or mid >= hi or hi - lo <= 1e-13 * max(abs(hi), abs(lo), 1e-300):
            break
        if below(mid) >= 1:
            hi = mid
        else:
            lo = mid
    theta = hi
    # Inverse iteration (two sweeps of the Thomas algorithm) for the eigenvector.
    shift = theta - max(1e-14, 1e-12 * abs(theta))
    y = [1.0] * k
    for _ in range(2):
        c = [0.0] * k
        z = [0.0] * k
        denom = alpha[0] - shift
        denom = denom if denom != 0 else 1e-300
        c[0] = (off[0] / denom) if k > 1 else 0.0
        z[0] = y[0] / denom
        for r in range(1, k):
            denom = alpha[r] - shift - off[r - 1] * c[r - 1]
            denom = denom if denom != 0 else 1e-300
            c[r] = (off[r] / denom) if r < k - 1 else 0.0
            z[r] = (y[r] - off[r - 1] * z[r - 1]) / denom
        for r in range(k - 2, -1, -1):
            z[r] -= c[r] * z[r + 1]
        norm = math.sqrt(sum(v * v for v in z)) or 1.0
        y = [v / norm for v in z]
    return theta, y[-1]


def fiedler_lanczos(
    g: Graph, *, rtol: float = LANCZOS_RTOL, max_iter: int | None = None, check_every: int = 10
) -> float:
    """lambda_2 of a **connected** graph by Lanczos on the complement of the constant vector."""
    n = g.n
    if n < 2:
        return 0.0
    degrees = weighted_degrees(g)
    scale = float(2.0 * degrees.max()) or 1.0  # >= lambda_max: the spectrum lies in [0, scale]
    # Without reorthogonalisation more than n steps still refine (lost orthogonality is re-spent).
    max_iter = max_iter if max_iter is not None else min(3 * n + 20, 20_000)
    rng = np.random.default_rng(LANCZOS_SEED)
    q = rng.standard_normal(n)
    q -= q.mean()
    q /= np.linalg.norm(q)
    q_prev = np.zeros(n)
    alpha: list[float] = []
    beta: list[float] = []
    b_prev = 0.0
    theta = scale
    next_check = check_every
    iterations = 0
    for k in range(1, max_iter + 1):
        iterations = k
        v = laplacian_matvec(g, degrees, q) - b_prev * q_prev
        a = float(q @ v)
        v -= a * q
        v -= v.mean()  # keep the constant vector (eigenvalue 0) out of the Krylov space
        b = float(np.linalg.norm(v))
        alpha.append(a)
        beta.append(b)
        exhausted = b <= 1e-12 * scale
        if exhausted or k >= next_check or k == max_iter:
            # Checks get sparser as k grows (every 10% more steps): their O(k) cost stays amortised.
            next_check = k + max(check_every, k // 10)
            theta, last = _smallest_tridiagonal(alpha, beta)
            if exhausted or b * abs(last) <= rtol * max(theta, 1e-300) or b * abs(last) <= 1e-15 * scale:
                break
        q_prev, q = q, v / b
        b_prev = b
    fiedler_lanczos.iterations = iterations  # type: ignore[attr-defined]  # for benchmarks
    return max(theta, 0.0)


def fiedler_dense(g: Graph) -> float:
    if g.n < 2:
        return 0.0
    return float(max(np.linalg.eigvalsh(laplacian(g))[1], 0.0))


def fiedler_value(
    n: int, i: np.ndarray, j: np.ndarray, w: np.ndarray | None = None, *, dense_limit: int = DENSE_LIMIT
) -> float:
    """lambda_2 of the graph's Laplacian: 0.0 when it is disconnected (or has fewer than 2 nodes)."""
    g = simple_graph(n, i, j, w)
    if n < 2:
        return 0.0
    labels = connected_components(g)
    if labels.max() != 0:  # more than one component (labels are the components' smallest nodes)
        return 0.0
    return fiedler_dense(g) if n <= dense_limit else fiedler_lanczos(g)


class Integration(NamedTuple):
    value: float  # lambda_2 of the whole graph
    largest_component: float  # lambda_2 of the largest component
    components: int
    largest_size: int
    nodes: int
    edges: int


def integration(
    n: int,
    i: np.ndarray,
    j: np.ndarray,
    w: np.ndarray | None = None,
    *,
    dense_limit: int = DENSE_LIMIT,
    max_iter: int | None = None,
) -> Integration:
    """The Fiedler values of the graph and of its largest component, with component counts.

    ``max_iter`` bounds the Lanczos steps on a large component (the value is then an upper bound
    of lambda_2 if it has not converged: Ritz values approach it from above).

    Ties between equally large components go to the one holding the smallest node index.

    >>> r = integration(6, np.array([0, 1, 3]), np.array([1, 2, 4]))   # path of 3, edge, isolated
    >>> (r.value, round(r.largest_component, 6), r.components, r.largest_size)
    (0.0, 1.0, 3, 3)
    """
    g = simple_graph(n, i, j, w)
    if n == 0:
        return Integration(0.0, 0.0, 0, 0, 0, 0)
    labels = connected_components(g)
    sizes = np.bincount(labels, minlength=n)
    components = int((sizes > 0).sum())
    biggest = int(np.argmax(sizes))  # the first maximum: the smallest label among the largest
    nodes = np.flatnonzero(labels == biggest)
    sub = induced(g, nodes)
    lam = (
        0.0
        if len(nodes) < 2
        else (fiedler_dense(sub) if len(nodes) <= dense_limit else fiedler_lanczos(sub, max_iter=max_iter))
    )
    whole = lam if components == 1 else 0.0
    return Integration(whole, lam, components, len(nodes), n, len(g.i))


class Trend(NamedTuple):
    slope: float | None  # per run, least squares over the last ``window`` values
    status: str  # integrating | stable | fragmenting | unknown


def fiedler_trend(values: Sequence[float], *, window: int = TREND_WINDOW, tolerance: float = TREND_TOLERANCE) -> Trend:
    """Whether the Fiedler value rises (integrating), falls (fragmenting) or holds over recent runs.

    Needs 3 values; ``|slope| <= tolerance * mean`` is stable.

    >>> fiedler_trend([0.1, 0.1, 0.1]).status, fiedler_trend([0.1, 0.2]).status
    ('stable', 'unknown')
    >>> fiedler_trend([0.1, 0.2, 0.3]).slope
    0.1
    """
    recent = np.asarray(list(values)[-window:], dtype=np.float64)
    if len(recent) < 3:
        return Trend(None, "unknown")
    x = np.arange(len(recent), dtype=np.float64)
    x -= x.mean()
    slope = float((x * (recent - recent.mean())).sum() / (x * x).sum())
    slope = round(slope, 12)
    band = tolerance * abs(float(recent.mean()))
    if slope > band:
        return Trend(slope, "integrating")
    if slope < -band:
        return Trend(slope, "fragmenting")
    return Trend(slope, "stable")
