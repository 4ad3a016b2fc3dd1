"""somnus.processors.sleep.dreaming: the cheaper paths decide exactly what the earlier code did.

``signature_vectors(dtype=np.float64)`` is the float32 rows widened (what dreaming converted them
to), ``dream_phase_a`` over one agent's memories uses them uncopied, and ``connect_recent`` walks its
candidate pairs over Python lists; each is compared with the earlier code (kept here as the
reference) on generated MinHash signatures of the fold's size, with ties, existing edges and several
agents."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from somnus.processors.sleep.dreaming import (
    CONNECT_LIMIT,
    CONNECT_THRESHOLD,
    SIGNATURE_VALUES,
    connect_recent,
    dream_phase_a,
    signature_vectors,
)


def _signatures(seed: int, n: int, k: int = 64, templates: int = 6, noise: float = 0.3) -> np.ndarray:
    """``n`` signatures of ``k`` values, copies of a few templates with a share ``noise`` redrawn:
    near duplicates (ties, pairs over the connect threshold) and strangers."""
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 2**32, size=(templates, k), dtype=np.uint64)
    sig = base[rng.integers(0, templates, n)]
    redrawn = rng.random((n, k)) < noise
    sig[redrawn] = rng.integers(0, 2**32, size=int(redrawn.sum()), dtype=np.uint64)
    return sig.astype(np.uint32)


def _reference_signature_vectors(signatures: np.ndarray, values: int = SIGNATURE_VALUES) -> np.ndarray:
    sig = np.asarray(signatures)
    n, k = sig.shape
    out = np.zeros((n, k * values), dtype=np.float32)
    cols = np.arange(k) * values + (sig.astype(np.int64) % values)
    out[np.repeat(np.arange(n), k), cols.ravel()] = 1.0 / np.sqrt(k) if k else 0.0
    return out


def _reference_connect_recent(
    ids: list[str],
    agents: list[str],
    vectors: np.ndarray,
    existing: set[tuple[str, str]] | None = None,
    *,
    threshold: float = CONNECT_THRESHOLD,
    limit: int = CONNECT_LIMIT,
) -> pl.DataFrame:
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
        sims = vec[rows] @ vec[rows].T
        a, b = np.triu_indices(len(rows), 1)
        s = sims[a, b]
        keep = s >= threshold
        a, b, s = a[keep], b[keep], s[keep]
        order = np.lexsort((b, a, -s))
        position = {str(ids_arr[r]): k for k, r in enumerate(rows)}
        count = np.zeros(len(rows), dtype=np.int64)
        for u, v in existing:
            if u in position and v in position:
                count[position[u]] += 1
                count[position[v]] += 1
        for x, y, sim in zip(a[order], b[order], s[order], strict=True):
            ia, ib = str(ids_arr[rows[x]]), str(ids_arr[rows[y]])
            if (ia, ib) in existing or count[x] >= limit or count[y] >= limit:
                continue
            count[x] += 1
            count[y] += 1
            out.append((ia, ib, agent, round(float(min(sim, 1.0)), 6)))
    return pl.DataFrame(
        out, schema={"a": pl.String, "b": pl.String, "agent": pl.String, "weight": pl.Float64}, orient="row"
    )


@pytest.mark.parametrize("k", [64, 12, 3, 1])
def test_signature_vectors_float64_is_float32_widened(k: int) -> None:
    sig = _signatures(k, 50, k=k)
    old = _reference_signature_vectors(sig)
    assert np.array_equal(signature_vectors(sig), old) and signature_vectors(sig).dtype == np.float32
    wide = signature_vectors(sig, dtype=np.float64)
    assert wide.dtype == np.float64 and np.array_equal(wide, old.astype(np.float64))


@pytest.mark.parametrize("seed", range(6))
def test_connect_recent_as_before(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = 80
    vec = signature_vectors(_signatures(seed, n, noise=(0.1, 0.2, 0.3)[seed % 3]))
    ids = [f"m{i:03d}" for i in rng.permutation(n)]
    agents = rng.choice(["a", "b", "c"], n).tolist()
    pairs = rng.integers(0, n, size=(60, 2))
    existing = {(min(ids[i], ids[j]), max(ids[i], ids[j])) for i, j in pairs if i != j}
    connected = 0
    for ex in (None, existing):
        for limit in (1, CONNECT_LIMIT):
            want = _reference_connect_recent(ids, agents, vec, ex, limit=limit)
            connected += want.height
            for v in (vec, vec.astype(np.float64)):
                got = connect_recent(ids, agents, v, ex, limit=limit)
                assert got.equals(want) and got.schema == want.schema
    assert connected  # the inputs connect something


@pytest.mark.parametrize("seed", range(4))
def test_dream_phase_a_one_agent_uncopied_as_before(seed: int) -> None:
    """One agent's memories in float64 (the fold's call, no copy of them) decide what the float32
    ones did, and what the same memories among another agent's do."""
    rng = np.random.default_rng(seed)
    m, k = 150, 30
    mem = _signatures(seed, m)
    obs = _signatures(seed + 100, k)
    ids = [f"m{i:03d}" for i in rng.permutation(m)]
    edges = rng.integers(0, 4, m)
    obs_ids = [f"o{i:03d}" for i in range(k)]
    times = rng.integers(0, 5, k)

    def run(mem_vec: np.ndarray, mem_ids: list[str], mem_agents: list[str], mem_edges: np.ndarray) -> list:
        out = dream_phase_a(
            mem_ids,
            mem_agents,
            mem_vec,
            mem_edges,
            obs_ids,
            ["a"] * k,
            times,
            signature_vectors(obs, dtype=np.float64),
        )
        return [frame.rows() for frame in out]

    before = run(_reference_signature_vectors(mem), ids, ["a"] * m, edges)
    assert run(signature_vectors(mem, dtype=np.float64), ids, ["a"] * m, edges) == before
    other = _reference_signature_vectors(_signatures(seed + 7, 40))
    mixed = run(
        np.concatenate([_reference_signature_vectors(mem), other]),
        ids + [f"x{i:03d}" for i in range(40)],
        ["a"] * m + ["b"] * 40,
        np.concatenate([edges, np.zeros(40, np.int64)]),
    )
    assert mixed == before
    assert sum(len(rows) for rows in before[:3]) == k  # every observation routed
