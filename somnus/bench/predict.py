"""`somnus bench predict`: latency of the causal links' ``predict`` over synthetic links."""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path
from typing import Any


def run_predict(links: int = 1_000_000, outcomes: int = 2, queries: int = 2000, seed: int = 5) -> dict[str, Any]:
    """p50/p95/p99 latency of ``predict`` (somnus.projections.causal.predict_from) with ``links`` causal links.

    The table holds ``links`` rows: ``links / outcomes`` event signatures with ``outcomes`` outcomes
    each, plus their tools' rows. Queries ask for calls that exist (a random signature's tool and
    arguments are not kept, so the query goes by signature through the same lookup as predict)."""
    import random
    import statistics

    import duckdb
    import numpy as np
    import pyarrow as pa

    from somnus.processors.prediction.causal_links import predict
    from somnus.projections import schema
    from somnus.projections.causal import link_states

    work = Path(tempfile.mkdtemp(prefix="somnus-bench-predict-"))
    try:
        con = duckdb.connect(str(work / "links.duckdb"))
        schema.init(con)
        rng = np.random.default_rng(seed)
        n_events = links // outcomes
        sigs = np.char.mod("%016x", rng.integers(0, 2**62, n_events, dtype=np.int64))
        tools = np.char.add("tool_", rng.integers(0, 2000, n_events).astype(str))
        frame = pa.table(  # noqa: F841
            {
                "event_signature": np.repeat(sigs, outcomes),
                "outcome_signature": np.tile(np.char.mod("%016x", np.arange(outcomes)), n_events),
                "level": np.full(n_events * outcomes, "call"),
                "tool": np.repeat(tools, outcomes),
                "outcome": np.tile(np.array(["ok"] + [f"error:e{i}" for i in range(1, outcomes)]), n_events),
                "valence": np.tile(np.array(["positive"] + ["negative"] * (outcomes - 1)), n_events),
                "strength": rng.random(n_events * outcomes),
                "observations": rng.integers(1, 50, n_events * outcomes),
                "event_observations": np.repeat(rng.integers(50, 100, n_events), outcomes),
                "confidence": rng.random(n_events * outcomes),
                "updated_at": pa.array(
                    np.full(n_events * outcomes, np.datetime64("2024-05-01T00:00:00", "us")),
                    pa.timestamp("us", tz="UTC"),
                ),
            }
        )
        t0 = time.perf_counter()
        con.execute("INSERT INTO causal_links SELECT * FROM frame")
        load_s = time.perf_counter() - t0
        rnd = random.Random(seed)
        lat = []
        for i in range(queries + 50):
            j = rnd.randrange(n_events)
            sig = str(sigs[j])
            t = time.perf_counter()
            states = link_states(con, [sig, "0" * 16])  # the call and its tool, as predict_from asks
            got = predict({str(sig): states[sig]} if sig in states else {}, str(tools[j]), None)
            if i >= 50:  # after a warm-up
                lat.append((time.perf_counter() - t) * 1000)
            assert states[sig].observations > 0 and got is not None
        q = statistics.quantiles(lat, n=100)
        con.close()
        return {
            "links": links,
            "event_signatures": n_events,
            "queries": queries,
            "load_s": round(load_s, 3),
            "p50_ms": round(q[49], 3),
            "p95_ms": round(q[94], 3),
            "p99_ms": round(q[98], 3),
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)
