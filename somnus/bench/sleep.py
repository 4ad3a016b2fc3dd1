"""`somnus bench sleep`: the sleep job's cost over synthetic memory units."""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from somnus.bench.synthetic import _zipf


def _sleep_units(units: int, agents: int, seed: int) -> Iterator[Any]:
    """Synthetic episodes for the sleep bench: one a minute-ish over ``units`` minutes spread so the
    store spans weeks; 60% success, 30% failure, 10% partial; one in ten a user interaction; a task of
    6-14 Zipf words, two tools, one person, one object."""
    from datetime import datetime, timedelta, timezone

    import numpy as np

    from somnus.schemas.memory import MemoryKind, MemoryUnit

    rng = np.random.default_rng(seed)
    vocab = [f"word{i}" for i in range(30_000)]
    words = rng.choice(len(vocab), size=(units, 14), p=_zipf(len(vocab)))
    lens = rng.integers(6, 15, units)
    outcome = rng.choice(3, size=units, p=[0.6, 0.3, 0.1])
    user = rng.random(units) < 0.1
    span_min = max(1, 60 * 24 * 60 // max(units, 1))  # about 60 days in all
    t0 = datetime(2024, 1, 1, tzinfo=timezone.utc)
    for i in range(units):
        agent = f"agent{i % agents}"
        out = ("success", "failure", "partial")[outcome[i]]
        yield MemoryUnit(
            memory_id=f"e{i}",
            kind=MemoryKind.EPISODE,
            agent=agent,
            scope=f"agent:{agent}",
            run_id=f"r{i}",
            occurred_at=t0 + timedelta(minutes=i * span_min + int(rng.integers(0, max(span_min, 1)))),
            perception=" ".join(vocab[w] for w in words[i, : lens[i]]),
            outcome=out,
            success=out == "success",
            action=f"tool_{i % 60} -> tool_{(i * 7) % 60}",
            summary=f"{out} after {2 + i % 9} calls",
            tools=[f"tool_{i % 60}", f"tool_{(i * 7) % 60}"],
            people=[f"person{i % 300}"],
            objects=[f"host{i % 40}"],
            user_interaction=bool(user[i]),
            mode="tool_use",
        )


def run_sleep(
    units: int = 1_000_000, agents: int = 1000, seed: int = 7, batch: int = 2000, accessed: float = 0.05
) -> dict[str, Any]:
    """One deep sleep over ``units`` memory units, as the projector's memory fold runs it: the units are
    captured by the fold's own rules (``somnus.processors.episodic.capture.capture``: decisions, merges, association
    edges), ``accessed`` of them recalled in the last day, then ``SleepJob.run`` (plan: protection,
    retention, compression, pruning, maxEpisodes, coverage, dreaming, report; then the prunings and
    compressions applied to the index) and ``SleepJob.write`` (lifecycle_log and sleep_runs rows into
    a DuckDB file with the projection's schema, in one transaction). Default settings (maxEpisodes 50
    per agent, 7 days to prune, 3 to compress)."""
    from datetime import timedelta

    import duckdb
    import numpy as np

    from somnus.processors.episodic.capture import MemoryState, apply, capture
    from somnus.processors.episodic.index import IndexConfig
    from somnus.processors.sleep.config import SleepConfig
    from somnus.projections import schema
    from somnus.projections.memory import stemmer
    from somnus.projections.sleep import SleepJob
    from somnus.schemas.lifecycle import SleepTrigger
    from somnus.schemas.memory import MEMORY_SCHEMA_VERSION, MemoryAccessed

    state = MemoryState.empty(IndexConfig(stem=stemmer()))
    t = time.perf_counter()
    pending: list[Any] = []
    last = None
    for u in _sleep_units(units, agents, seed):
        pending.append(u)
        if len(pending) >= batch:
            capture(state, pending, pending[-1].occurred_at)
            last, pending = pending[-1].occurred_at, []
    if pending:
        capture(state, pending, pending[-1].occurred_at)
        last = pending[-1].occurred_at
    build_s = time.perf_counter() - t
    assert last is not None, "no units"
    at = last + timedelta(hours=1)
    rng = np.random.default_rng(seed + 1)
    ix = state.index
    for i in rng.choice(len(ix.ids), size=int(accessed * len(ix.ids)), replace=False):
        apply(
            state,
            MemoryAccessed(
                schema_version=MEMORY_SCHEMA_VERSION,
                memory_id=ix.ids[int(i)],
                agent="bench",
                query="bench",
                rank=1,
                score=1.0,
                accessed_at=at - timedelta(hours=int(i) % 24),
            ),
        )
    live_before = int(ix.alive.data[: len(ix.ids)].sum())
    edges_before = sum(len(v) for v in ix.graph.values()) // 2
    work = Path(tempfile.mkdtemp(prefix="somnus-sleep-bench-"))
    try:
        con = duckdb.connect(str(work / "sleep.duckdb"))
        schema.init(con)
        con.execute("CHECKPOINT")
        db_before = (work / "sleep.duckdb").stat().st_size
        job = SleepJob(con, {}, SleepConfig())
        t = time.perf_counter()
        forgotten = job.run(state, at, SleepTrigger.ON_DEMAND, offset=0)
        run_s = time.perf_counter() - t
        t = time.perf_counter()
        con.execute("BEGIN")
        job.write(con)
        con.execute("COMMIT")
        write_s = time.perf_counter() - t
        con.execute("CHECKPOINT")
        row = con.execute(
            "SELECT memories_before, memories_after, kept, compressed, pruned, protected, rescored, "
            "bytes_before, bytes_after FROM sleep_runs"
        ).fetchone()
        decided = con.execute("SELECT count(*) FROM lifecycle_log").fetchone()
        con.close()
        db_after = (work / "sleep.duckdb").stat().st_size
    finally:
        shutil.rmtree(work, ignore_errors=True)
    assert row is not None, "the sleep run wrote no report"
    assert decided is not None  # a count(*) has one row
    decisions = decided[0]
    keys = (
        "memories_before",
        "memories_after",
        "kept",
        "compressed",
        "pruned",
        "protected",
        "rescored",
        "bytes_before",
        "bytes_after",
    )
    report = dict(zip(keys, (int(v) for v in row)))
    return {
        "units": units,
        "agents": agents,
        "live_memories": live_before,
        "edges": edges_before,
        "build_s": round(build_s, 1),
        "sleep_s": round(run_s + write_s, 2),
        "plan_apply_s": round(run_s, 2),
        "write_s": round(write_s, 2),
        "forgotten_events": len(forgotten),
        "lifecycle_rows": decisions,
        **report,
        "store_bytes_ratio": round(report["bytes_after"] / max(report["bytes_before"], 1), 4),
        "lifecycle_db_bytes": db_after - db_before,
    }
