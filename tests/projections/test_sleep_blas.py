"""A sleep run's matrix products on one BLAS thread (``projections.sleep._blas_single_threaded``):
the thread count comes back after a run, and dreaming decides the same on one thread as on the
default ones, on generated MinHash signatures of the size the fold has (64 values)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from somnus.processors.sleep.dreaming import connect_recent, dream_phase_a, signature_vectors
from somnus.projections.sleep import _blas_single_threaded, _openblas_threads


def _signatures(seed: int, n: int, templates: int, noise: float) -> np.ndarray:
    """``n`` signatures of 64 values, each a copy of one of ``templates`` with a share ``noise`` redrawn:
    neighbours at every distance, so clustering, holding and creating all happen."""
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 2**32, size=(templates, 64), dtype=np.uint64)
    sig = base[rng.integers(0, templates, n)]
    redrawn = rng.random((n, 64)) < noise
    sig[redrawn] = rng.integers(0, 2**32, size=int(redrawn.sum()), dtype=np.uint64)
    return sig.astype(np.uint32)


def _dream(seed: int, memories: int, observations: int, noise: float) -> tuple[list[list[tuple]], list[tuple]]:
    mem = signature_vectors(_signatures(seed, memories, 12, noise))
    obs = signature_vectors(_signatures(seed + 1, observations, 12, noise))
    ids = [f"m{i:04d}" for i in range(memories)]
    edges = np.random.default_rng(seed).integers(0, 4, memories)
    a = dream_phase_a(
        ids,
        ["a"] * memories,
        mem,
        edges,
        [f"o{i:03d}" for i in range(observations)],
        ["a"] * observations,
        np.arange(observations) // 3,
        obs,
    )
    c = connect_recent(ids[:120], ["a"] * 120, mem[:120])
    return [frame.rows() for frame in a], c.rows()


def _threads() -> int:
    setter = _openblas_threads()
    now = setter(1)
    setter(now)
    return int(now)


@pytest.mark.skipif(_openblas_threads() is None, reason="numpy's BLAS is not the OpenBLAS of its wheel")
def test_the_thread_count_comes_back_after_a_run_even_a_failed_one():
    before = _threads()
    with _blas_single_threaded():
        assert _threads() == 1
    assert _threads() == before
    with pytest.raises(RuntimeError), _blas_single_threaded():
        raise RuntimeError("a run that fails")
    assert _threads() == before


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**16),
    memories=st.integers(200, 700),
    observations=st.integers(8, 40),
    noise=st.sampled_from([0.0, 0.03, 0.06, 0.3]),
)
def test_dreaming_decides_the_same_on_one_blas_thread(seed, memories, observations, noise):
    default = _dream(seed, memories, observations, noise)
    with _blas_single_threaded():
        single = _dream(seed, memories, observations, noise)
    assert single == default
    phase_a, _ = default
    assert sum(map(len, phase_a[:3])) == observations  # every observation clustered, held or created


def test_the_generated_memories_make_every_decision():
    """The inputs above are not all "created": clustering, holding and refining happen too."""
    phase_a, connected = _dream(5, 400, 30, 0.03)
    assert all(phase_a) and connected
