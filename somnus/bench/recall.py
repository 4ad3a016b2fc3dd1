"""`somnus bench recall`: recall latency and memory over a synthetic memory index."""

from __future__ import annotations

import time
from typing import Any

from somnus.bench.synthetic import _queries, _synthetic_index


def run_recall(units: int = 100_000, queries: int = 300, agents: int = 50, seed: int = 7) -> dict[str, Any]:
    """Recall latency and memory with ``units`` synthetic memory units in the index (``_synthetic_index``);
    queries: 3-6 words, a third naming a person; ``recall(k=10)`` as the projector serves it (stemmed
    BM25, LSH, graph, importance, fused), for a rotating agent."""
    import statistics
    from datetime import datetime, timedelta, timezone

    from somnus.processors.episodic.recall import recall

    index, rng, vocab, people, build_s, rss = _synthetic_index(units, agents, seed)
    texts = _queries(rng, vocab, people, queries)
    now = datetime(2024, 1, 1, tzinfo=timezone.utc) + timedelta(days=400)
    lat = []
    for q in range(queries + 20):
        t = time.perf_counter()
        recall(index, texts[q % queries], f"agent{(q * 7) % agents}", k=10, now=now)
        if q >= 20:  # after a warm-up
            lat.append((time.perf_counter() - t) * 1000)
    qs = statistics.quantiles(lat, n=100)
    return {
        "units": units,
        "agents": agents,
        "queries": queries,
        "build_s": round(build_s, 1),
        "build_us_per_unit": round(1e6 * build_s / units, 1),
        "p50_ms": round(qs[49], 2),
        "p95_ms": round(qs[94], 2),
        "p99_ms": round(qs[98], 2),
        "rss_mib": round(rss, 1),
        "mib_per_100k_units": round(rss * 100_000 / units, 1),
    }
