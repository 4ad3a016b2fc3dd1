"""`somnus bench context`: latency of the working-memory context over a synthetic memory index."""

from __future__ import annotations

import time
from typing import Any

from somnus.bench.synthetic import _queries, _synthetic_index


def run_context(
    units: int = 100_000, queries: int = 200, messages: int = 5000, agents: int = 50, seed: int = 7
) -> dict[str, Any]:
    """Working-memory buffer add latency (``messages`` adds to one session, default settings: overflow
    summaries and rotation included), and ``get_context`` latency with ``units`` memory units behind the
    recall tier, a full buffer (50 messages, 500 summaries), a synopsis and a knowledge tier of 20 facts."""
    import statistics
    from datetime import datetime, timedelta, timezone

    from somnus.processors.briefing.context import Tier, get_context
    from somnus.processors.episodic.recall import recall
    from somnus.processors.working.session_buffer import DEFAULT_SETTINGS, add, message
    from somnus.processors.working.synopsis import SynopsisCache
    from somnus.schemas.working_memory import ContextCandidate, MemoryKind, Role, UserMemory, WorkingMemoryState

    index, rng, vocab, people, build_s, _ = _synthetic_index(units, agents, seed)
    t0 = datetime(2024, 1, 1, tzinfo=timezone.utc)
    texts = _queries(rng, vocab, people, max(queries, 50))
    state = WorkingMemoryState(agent="agent0", session_id="s0")
    add_lat = []
    for i in range(messages):
        msg = message(
            i,
            t0 + timedelta(seconds=i),
            Role.USER if i % 2 == 0 else Role.AGENT,
            " ".join(texts[(i * 13) % len(texts)].split() * 3),
        )
        t = time.perf_counter()
        state, _ = add(state, msg, DEFAULT_SETTINGS)
        add_lat.append((time.perf_counter() - t) * 1000)
    now = t0 + timedelta(days=400)
    synopsis = SynopsisCache().get(
        "u1",
        now,
        lambda u: [
            UserMemory(
                user_id=u,
                kind=MemoryKind.USER_MESSAGE,
                text=texts[j],
                observed_at=t0 + timedelta(hours=j),
                source_id=f"x{j}",
            )
            for j in range(50)
        ],
    )
    facts = [
        ContextCandidate(text=f"tool_{j} failed_with error_{j}", score=1 - j / 40, source_id=f"t{j}") for j in range(20)
    ]

    def episodic(q: str, a: str, u: Any, k: int) -> list[ContextCandidate]:
        got = recall(index, q, a, k=k, now=now)
        return [ContextCandidate(text=h.unit.perception, score=h.score, source_id=h.memory_id) for h in got.hits]

    tiers = [Tier("episodic", episodic), Tier("knowledge", lambda q, a, u, k: facts[:k], weight=0.5)]
    ctx_lat = []
    for q in range(queries + 10):
        t = time.perf_counter()
        get_context(texts[q % len(texts)], "agent0", "u1", 4000, tiers=tiers, buffer=state, synopsis=synopsis)
        if q >= 10:
            ctx_lat.append((time.perf_counter() - t) * 1000)
    aq, cq = statistics.quantiles(add_lat, n=100), statistics.quantiles(ctx_lat, n=100)
    return {
        "units": units,
        "build_s": round(build_s, 1),
        "buffer_adds": messages,
        "buffer_summaries": len(state.summaries),
        "add_p50_ms": round(aq[49], 4),
        "add_p99_ms": round(aq[98], 3),
        "context_queries": queries,
        "context_p50_ms": round(cq[49], 2),
        "context_p95_ms": round(cq[94], 2),
    }
