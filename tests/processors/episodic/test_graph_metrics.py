"""somnus.processors.episodic.graph_metrics: Laplacian, Fiedler value (dense and Lanczos) against closed forms, components, trend."""

from __future__ import annotations

import doctest
import math

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from somnus.processors.episodic import graph_metrics
from somnus.processors.episodic.graph_metrics import (
    DENSE_LIMIT,
    LANCZOS_RTOL,
    TREND_TOLERANCE,
    TREND_WINDOW,
    connected_components,
    fiedler_dense,
    fiedler_lanczos,
    fiedler_trend,
    fiedler_value,
    integration,
    laplacian,
    simple_graph,
)


def path(n: int) -> tuple[np.ndarray, np.ndarray]:
    return np.arange(n - 1), np.arange(1, n)


def cycle(n: int) -> tuple[np.ndarray, np.ndarray]:
    return np.arange(n), (np.arange(n) + 1) % n


def complete(n: int) -> tuple[np.ndarray, np.ndarray]:
    i, j = np.triu_indices(n, 1)
    return i, j


def two_cliques_bridge(m: int) -> tuple[np.ndarray, np.ndarray]:
    """Two K_m on 0..m-1 and m..2m-1, joined by the edge (0, m)."""
    i, j = np.triu_indices(m, 1)
    return np.r_[i, i + m, 0], np.r_[j, j + m, m]


def bridge_closed_form(m: int) -> float:
    # The Fiedler vector is antisymmetric: a on the bridge ends, b on the others of each clique.
    # Non-bridge vertex: b - a = lam b; bridge vertex: (m + 1) a - (m - 1) b = lam a.
    # So lam^2 - (m + 2) lam + 2 = 0, and lambda_2 is the smaller root.
    return ((m + 2) - math.sqrt((m + 2) ** 2 - 8)) / 2


def test_doctests() -> None:
    assert doctest.testmod(graph_metrics).failed == 0


def test_constants_are_pinned() -> None:
    assert DENSE_LIMIT == 1500
    assert LANCZOS_RTOL == 1e-6
    assert TREND_WINDOW == 5
    assert TREND_TOLERANCE == 0.02


@pytest.mark.parametrize("n", [2, 3, 5, 10, 37, 100])
def test_path_closed_form_dense(n: int) -> None:
    assert fiedler_value(n, *path(n)) == pytest.approx(2 * (1 - math.cos(math.pi / n)), rel=1e-9)


@pytest.mark.parametrize("n", [200, 2000])
def test_path_closed_form_lanczos(n: int) -> None:
    got = fiedler_lanczos(simple_graph(n, *path(n)), rtol=1e-10)
    assert got == pytest.approx(2 * (1 - math.cos(math.pi / n)), rel=1e-6)


@pytest.mark.parametrize("n", [2, 3, 8, 50])
def test_complete_graph_is_n(n: int) -> None:
    assert fiedler_value(n, *complete(n)) == pytest.approx(n, rel=1e-9)
    assert fiedler_lanczos(simple_graph(n, *complete(n))) == pytest.approx(n, rel=1e-6)


@pytest.mark.parametrize("n", [3, 10, 64, 3001])
def test_cycle_closed_form(n: int) -> None:
    assert fiedler_value(n, *cycle(n)) == pytest.approx(2 * (1 - math.cos(2 * math.pi / n)), rel=1e-6)


@pytest.mark.parametrize("m", [2, 3, 5, 10, 40])
def test_two_cliques_with_a_bridge(m: int) -> None:
    i, j = two_cliques_bridge(m)
    g = simple_graph(2 * m, i, j)
    assert fiedler_dense(g) == pytest.approx(bridge_closed_form(m), rel=1e-9)
    assert fiedler_lanczos(g, rtol=1e-10) == pytest.approx(bridge_closed_form(m), rel=1e-7)
    # the bridge makes it far less connected than either clique alone
    assert fiedler_dense(g) < 2.0 / m + 1e-9


def test_two_cliques_of_two_is_the_path_of_four() -> None:
    assert bridge_closed_form(2) == pytest.approx(2 * (1 - math.cos(math.pi / 4)))


def test_star_and_complete_bipartite() -> None:
    star = (np.zeros(9, dtype=np.int64), np.arange(1, 10))
    assert fiedler_value(10, *star) == pytest.approx(1.0)
    a, b = 3, 5
    i, j = np.meshgrid(np.arange(a), np.arange(a, a + b))
    assert fiedler_value(a + b, i.ravel(), j.ravel()) == pytest.approx(min(a, b))


def test_disconnected_is_zero_and_tiny_graphs() -> None:
    assert fiedler_value(4, np.array([0, 2]), np.array([1, 3])) == 0.0
    assert fiedler_value(3, np.array([0]), np.array([1])) == 0.0  # an isolated node
    assert fiedler_value(1, np.zeros(0, np.int64), np.zeros(0, np.int64)) == 0.0
    assert fiedler_value(0, np.zeros(0, np.int64), np.zeros(0, np.int64)) == 0.0


def test_weights_scale_the_value() -> None:
    i, j = two_cliques_bridge(4)
    w = np.full(len(i), 1.0)
    assert fiedler_value(8, i, j, 3 * w) == pytest.approx(3 * fiedler_value(8, i, j, w))


def test_simple_graph_merges_duplicates_keeping_the_largest_weight() -> None:
    g = simple_graph(
        4, np.array([0, 1, 0, 2, 3, 9]), np.array([1, 0, 0, 3, 2, 1]), np.array([0.2, 0.7, 1.0, 0.5, 0.1, 1.0])
    )
    assert g.i.tolist() == [0, 2]
    assert g.j.tolist() == [1, 3]
    assert g.w.tolist() == [0.7, 0.5]  # self-loop (0, 0) and out-of-range (9) dropped


def test_laplacian_rows_sum_to_zero_and_match_degrees() -> None:
    g = simple_graph(5, *path(5), np.array([1.0, 2.0, 3.0, 4.0]))
    lap = laplacian(g)
    assert np.allclose(lap.sum(axis=1), 0.0)
    assert np.diag(lap).tolist() == [1.0, 3.0, 5.0, 7.0, 4.0]


def test_components_are_labelled_by_their_smallest_node() -> None:
    g = simple_graph(7, np.array([5, 3, 1]), np.array([6, 1, 0]))
    assert connected_components(g).tolist() == [0, 0, 2, 0, 4, 5, 5]


def test_integration_reports_the_largest_component() -> None:
    # a path of 4 (nodes 0..3), an edge (4, 5), an isolated node 6
    i = np.array([0, 1, 2, 4])
    j = np.array([1, 2, 3, 5])
    r = integration(7, i, j)
    assert r.value == 0.0
    assert r.largest_component == pytest.approx(2 * (1 - math.cos(math.pi / 4)))
    assert (r.components, r.largest_size, r.nodes, r.edges) == (3, 4, 7, 4)


def test_integration_uses_the_sparse_path_above_the_dense_limit() -> None:
    n = 2500
    r = integration(n, *cycle(n), dense_limit=100)
    assert r.value == pytest.approx(2 * (1 - math.cos(2 * math.pi / n)), rel=1e-5)


@st.composite
def connected_graphs(draw: st.DrawFn) -> tuple[int, np.ndarray, np.ndarray, np.ndarray]:
    n = draw(st.integers(3, 40))
    parents = [draw(st.integers(0, k - 1)) for k in range(1, n)]  # a random spanning tree
    extra = draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=3 * n))
    i = np.array([*range(1, n), *(a for a, _ in extra)], dtype=np.int64)
    j = np.array([*parents, *(b for _, b in extra)], dtype=np.int64)
    w = np.array(draw(st.lists(st.floats(0.1, 5.0), min_size=len(i), max_size=len(i))))
    return n, i, j, w


@settings(max_examples=60, deadline=None)
@given(connected_graphs())
# a weighted star with repeated eigenvalues: needs more than n - 1 steps without reorthogonalisation
@example(
    (
        12,
        np.arange(1, 12),
        np.zeros(11, dtype=np.int64),
        np.array([1.0, 1.0, 2.0, 2.0, 3.0, 3.0, 4.0, 1.5, 1.5, 1.25, 2.5]),
    )
)
def test_lanczos_agrees_with_the_dense_eigenvalues(graph: tuple[int, np.ndarray, np.ndarray, np.ndarray]) -> None:
    n, i, j, w = graph
    g = simple_graph(n, i, j, w)
    expected = float(np.linalg.eigvalsh(laplacian(g))[1])
    assert fiedler_lanczos(g, rtol=1e-10) == pytest.approx(expected, rel=1e-6, abs=1e-9)


@settings(max_examples=30, deadline=None)
@given(connected_graphs(), st.randoms(use_true_random=False))
def test_the_value_does_not_depend_on_node_numbering(
    graph: tuple[int, np.ndarray, np.ndarray, np.ndarray], rnd: object
) -> None:
    n, i, j, w = graph
    perm = np.array(rnd.sample(range(n), n))  # type: ignore[attr-defined]
    assert fiedler_value(n, perm[i], perm[j], w) == pytest.approx(fiedler_value(n, i, j, w), rel=1e-9, abs=1e-12)


def test_lanczos_matches_scipy_on_a_random_sparse_graph() -> None:
    sparse = pytest.importorskip("scipy.sparse")
    linalg = pytest.importorskip("scipy.sparse.linalg")
    rng = np.random.default_rng(3)
    n = 3000
    i = np.r_[np.arange(1, n), rng.integers(0, n, 4 * n)]
    j = np.r_[rng.integers(0, np.arange(1, n)), rng.integers(0, n, 4 * n)]
    g = simple_graph(n, i, j)
    adj = sparse.coo_matrix((np.r_[g.w, g.w], (np.r_[g.i, g.j], np.r_[g.j, g.i])), shape=(n, n)).tocsr()
    lap = sparse.diags(np.asarray(adj.sum(axis=1)).ravel()) - adj
    vals = linalg.eigsh(lap, k=2, sigma=-1e-3, which="LM", v0=np.ones(n) / n, return_eigenvectors=False)
    assert fiedler_lanczos(g, rtol=1e-10) == pytest.approx(sorted(vals)[1], rel=1e-6)


def test_lanczos_is_deterministic() -> None:
    g = simple_graph(3000, *cycle(3000))
    assert fiedler_lanczos(g) == fiedler_lanczos(g)


@pytest.mark.parametrize(
    ("values", "status"),
    [
        ([0.1, 0.2, 0.3], "integrating"),
        ([0.3, 0.2, 0.1], "fragmenting"),
        ([0.2, 0.2, 0.2, 0.2], "stable"),
        ([0.2, 0.2], "unknown"),
        ([], "unknown"),
    ],
)
def test_trend_status(values: list[float], status: str) -> None:
    assert fiedler_trend(values).status == status


def test_trend_tolerance_and_window() -> None:
    # slope 0.0019 per run on a mean of 0.1: under 2% of the mean -> stable; 0.0021 -> integrating
    assert fiedler_trend([0.1 - 0.0019, 0.1, 0.1 + 0.0019]).status == "stable"
    assert fiedler_trend([0.1 - 0.0021, 0.1, 0.1 + 0.0021]).status == "integrating"
    # only the last 5 values count: an old collapse is forgotten
    assert fiedler_trend([5.0, 0.0, 0.1, 0.1, 0.1, 0.1, 0.1]).status == "stable"
    assert fiedler_trend([1.0, 2.0, 3.0, 4.0]).slope == pytest.approx(1.0)
