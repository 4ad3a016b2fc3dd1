"""`somnus bench facts-query`: latency of the scope-chain fact query over synthetic triples."""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from somnus.bench.synthetic import synthetic_triples


def run_fact_query(
    triples: int = 1_000_000, agents: int = 200, teams: int = 20, queries: int = 1000, limit: int = 50, seed: int = 11
) -> dict[str, Any]:
    """p50/p95/p99 latency of the scope-chain fact query (KnowledgeStore.facts) over ``triples`` rows, as
    the projector serves it (the in-memory ``facts_top``), next to the same query in SQL over
    ``facts_top`` and over every triple (same answers, checked)."""
    import statistics

    import duckdb

    from somnus.projections import schema
    from somnus.projections.knowledge_store import DuckDBBackend, KnowledgeStore, TopFacts
    from somnus.schemas.agents import AgentSpec

    work = Path(tempfile.mkdtemp(prefix="somnus-bench-facts-"))
    try:
        con = duckdb.connect(str(work / "facts.duckdb"))
        schema.init(con)
        frame = synthetic_triples(triples, agents, teams, seed)  # noqa: F841
        t0 = time.perf_counter()
        con.execute(
            "INSERT INTO triples SELECT triple_id::UUID, source, predicate, target, scope, confidence, count, "
            "evidence::UUID, NULL, valid_from, valid_to, NULL, created_by, 'bench' FROM frame"
        )
        schema.refresh_facts_top(con)  # what the projector keeps up to date batch by batch
        load_s = time.perf_counter() - t0
        specs = {f"a{i}": AgentSpec(name=f"a{i}", reports_to=f"t{i % teams}") for i in range(agents)}
        import random

        top = TopFacts()
        top.refresh(con)  # what the projector holds in memory and serves the plain query from

        def measure(use_top: bool, cached: bool) -> tuple[list[float], list[list[str]]]:
            store = KnowledgeStore(DuckDBBackend(con), specs, use_top=use_top, top=top if cached else None)
            rnd = random.Random(seed)
            store.facts("a0", limit=limit)  # warm up
            lat, answers = [], []
            for _ in range(queries):
                agent = f"a{rnd.randrange(agents)}"
                t = time.perf_counter()
                got = store.facts(agent, limit=limit)
                lat.append((time.perf_counter() - t) * 1000)
                answers.append([f.triple_id for f in got])
            return sorted(lat), answers

        lat, answers = measure(True, cached=True)
        sql, sql_answers = measure(True, cached=False)  # the same query as SQL over facts_top
        scan, scan_answers = measure(False, cached=False)  # ... and over every triple
        assert answers == sql_answers == scan_answers and all(len(a) == limit for a in answers)
        q, qq, qs = (statistics.quantiles(x, n=100) for x in (lat, sql, scan))
        con.close()
        return {
            "triples": triples,
            "agents": agents,
            "teams": teams,
            "queries": queries,
            "limit": limit,
            "load_s": round(load_s, 3),
            "p50_ms": round(q[49], 3),
            "p95_ms": round(q[94], 3),
            "p99_ms": round(q[98], 3),
            "max_ms": round(lat[-1], 3),
            "sql_p50_ms": round(qq[49], 3),
            "sql_p95_ms": round(qq[94], 3),
            "scan_p95_ms": round(qs[94], 3),
            "scan_over_top_p95": round(qs[94] / qq[94], 2),
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)
