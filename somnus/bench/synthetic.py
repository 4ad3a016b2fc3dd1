"""Synthetic inputs shared by the in-process benchmarks: triples as the projector stores them, and a
memory index of Zipf-distributed words."""

from __future__ import annotations

import os
import time
import uuid
from typing import Any


def synthetic_triples(n: int, agents: int, teams: int, seed: int = 11) -> Any:
    """``n`` triples spread over ``agents`` agents in ``teams`` teams, as the projector stores them.

    Scopes: 70% an agent's own, 20% a team's, 10% global; a third are closed (superseded)."""
    import numpy as np
    import pyarrow as pa

    rng = np.random.default_rng(seed)
    kind = rng.random(n)
    owner = rng.integers(0, agents, n)
    scope = np.where(
        kind < 0.7,
        np.char.add("agent:a", owner.astype(str)),
        np.where(kind < 0.9, np.char.add("team:t", (owner % teams).astype(str)), "global"),
    )
    t0 = np.datetime64("2024-01-01T00:00:00", "us")
    valid_from = t0 + rng.integers(0, 365 * 86400, n).astype("timedelta64[s]")
    closed = rng.random(n) < 1 / 3
    valid_to = np.where(
        closed, valid_from + rng.integers(1, 86400 * 30, n).astype("timedelta64[s]"), np.datetime64("NaT")
    )
    ids = [uuid.UUID(int=i + 1) for i in range(n)]
    return pa.table(
        {
            "triple_id": pa.array([str(u) for u in ids]),
            "source": np.char.add("tool:t", rng.integers(0, 5000, n).astype(str)),
            "predicate": rng.choice(["uses", "failed_with", "depends_on", "rate_limit"], n),
            "target": np.char.add("error:e", rng.integers(0, 20000, n).astype(str)),
            "scope": scope,
            "confidence": rng.uniform(0.6, 1.0, n).round(4),
            "count": rng.integers(1, 50, n),
            "evidence": pa.array([str(u) for u in ids]),
            "valid_from": pa.array(valid_from, pa.timestamp("us", tz="UTC")),
            "valid_to": pa.array(valid_to, pa.timestamp("us", tz="UTC"), mask=~closed),
            "created_by": np.char.add("a", owner.astype(str)),
        }
    )


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / (1 << 20)


def _synthetic_index(units: int, agents: int, seed: int) -> tuple[Any, Any, list[str], list[str], float, float]:
    """``units`` synthetic memory units: 10-25 words from a Zipf vocabulary of 30,000, one person and one
    tool each, runs of 20, spread over ``agents`` agents. Returns (index, rng, vocab, people, build s, MiB)."""
    from datetime import datetime, timedelta, timezone

    import numpy as np

    from somnus.processors.episodic.index import IndexConfig, MemoryIndex
    from somnus.projections.memory import stemmer
    from somnus.schemas.memory import MemoryKind, MemoryUnit

    rng = np.random.default_rng(seed)
    vocab = [f"word{i}" for i in range(30_000)]
    people = [f"person{i}" for i in range(300)]
    t0 = datetime(2024, 1, 1, tzinfo=timezone.utc)
    words = rng.choice(len(vocab), size=(units, 24), p=_zipf(len(vocab)))
    lens = rng.integers(10, 25, units)
    rss0 = _rss_mib()
    index = MemoryIndex(IndexConfig(stem=stemmer()))
    start = time.perf_counter()
    for i in range(units):
        agent = f"agent{i % agents}"
        index.add(
            MemoryUnit(
                memory_id=f"m{i}",
                kind=MemoryKind.MESSAGE,
                agent=agent,
                scope=f"agent:{agent}",
                run_id=f"r{i // 20}",
                position=i % 20,
                occurred_at=t0 + timedelta(minutes=i),
                perception=" ".join(vocab[w] for w in words[i, : lens[i]]),
                people=[people[i % 300]],
                tools=[f"tool_{i % 60}"],
            )
        )
    return index, rng, vocab, people, time.perf_counter() - start, _rss_mib() - rss0


def _zipf(n: int) -> Any:
    import numpy as np

    p = 1.0 / np.arange(1, n + 1) ** 1.05
    return p / p.sum()


def _queries(rng: Any, vocab: list[str], people: list[str], n: int) -> list[str]:
    qw = rng.choice(len(vocab), size=(n, 6), p=_zipf(len(vocab)))
    return [
        " ".join(vocab[w] for w in qw[q, : 3 + q % 4]) + (f" {people[q % 300]}" if q % 3 == 0 else "") for q in range(n)
    ]
