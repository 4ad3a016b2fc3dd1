"""`somnus bench capture`: memory capture's cost as the store grows."""

from __future__ import annotations

import time
from typing import Any


def run_capture(
    sessions: int = 40_000, batch: int = 200, chunks: int = 5, candidates: int | None = 256, seed: int = 3
) -> dict[str, Any]:
    """Memory capture's cost as the store grows: the episode units of ``sessions`` sample sessions
    (``somnus.sample``, distilled as the worker does), captured in batches of ``batch`` as the projector
    captures them, timed in ``chunks`` equal parts (µs per unit in each), with the capture search
    bounded to ``candidates`` LSH candidates (None: all of them, as before the bound). Also how many
    memories were stored, and a digest of their ids (equal digests: the same decisions)."""
    import hashlib
    from datetime import datetime, timezone

    from somnus.bench.advise import distilled
    from somnus.processors.episodic.capture import MemoryState, capture, episode_unit
    from somnus.processors.episodic.index import IndexConfig
    from somnus.projections.memory import stemmer
    from somnus.sample import generate

    units = [episode_unit(ep) for ep in distilled(generate(sessions=sessions, seed=seed))]
    now = datetime(2026, 3, 1, tzinfo=timezone.utc)
    state = MemoryState.empty(IndexConfig(stem=stemmer(), capture_candidates=candidates))
    size = -(-len(units) // chunks)
    per_chunk: list[float] = []
    for c in range(0, len(units), size):
        part = units[c : c + size]
        t = time.perf_counter()
        for k in range(0, len(part), batch):
            capture(state, part[k : k + batch], now)
        per_chunk.append(round(1e6 * (time.perf_counter() - t) / len(part), 1))
    ids = state.index.ids
    return {
        "sessions": sessions,
        "units": len(units),
        "candidates": candidates,
        "stored": len(ids),
        "us_per_unit_by_chunk": per_chunk,
        "growth": round(per_chunk[-1] / per_chunk[0], 2),
        "digest": hashlib.sha1("\n".join(ids).encode()).hexdigest()[:12],
    }
