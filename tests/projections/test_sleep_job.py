"""somnus.projections.sleep: ``memory_columns`` and ``SleepJob.run`` (columns and batches) give what the per-memory,
per-event versions give: the same columns, lifecycle rows, forgotten events and index afterwards."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import duckdb
import numpy as np
import orjson
import polars as pl
import pyarrow as pa
import pytest

from somnus.processors.episodic.capture import MemoryState, apply, capture, episode_unit, forget
from somnus.processors.sessions.distiller import distill
from somnus.processors.sleep.config import SleepConfig
from somnus.processors.sleep.plan import plan_sleep
from somnus.projections import schema
from somnus.projections.memory import new_state
from somnus.projections.sleep import LOG_COLUMNS, SleepJob, dream_inputs, memory_columns
from somnus.sample import generate
from somnus.schemas.codec import decode_trace
from somnus.schemas.lifecycle import MemoryCompressed, MemoryPruned, SleepTrigger, encode_lifecycle
from somnus.schemas.memory import MEMORY_SCHEMA_VERSION, ForgetReason, MemoryAccessed


@pytest.fixture(scope="module")
def units():
    events = [decode_trace(orjson.dumps(e), 1 << 20) for e in generate(sessions=1500, seed=5)]
    return [episode_unit(ep) for ep in distill({}, events).episodes]


def folded(units: list[Any]) -> tuple[MemoryState, datetime]:
    state = new_state()
    for k in range(0, len(units), 200):
        capture(state, units[k : k + 200], units[min(k + 199, len(units) - 1)].occurred_at)
    at = max(u.occurred_at for u in units) + timedelta(days=5)
    ix = state.index
    for i in range(0, len(ix.ids), 7):  # some recalled lately
        apply(
            state,
            MemoryAccessed(
                schema_version=MEMORY_SCHEMA_VERSION,
                memory_id=ix.ids[i],
                agent="t",
                query="q",
                rank=1,
                score=1.0,
                accessed_at=at - timedelta(hours=i % 30),
            ),
        )
    return state, at


def reference_columns(state: MemoryState) -> tuple[pl.DataFrame, pl.DataFrame]:
    """memory_columns, memory by memory and edge by edge."""
    ix = state.index
    live = np.flatnonzero(ix.alive.data[: len(ix.ids)])
    units = [ix.units[i] for i in live]
    last = ix.last_access.data[live]
    frame = pl.from_arrow(
        pa.table(
            {
                "memory_id": pa.array([ix.ids[i] for i in live], pa.string()),
                "agent": pa.array([u.agent for u in units], pa.string()),
                "layer": pa.array(["hippocampus"] * len(live), pa.string()),
                "created_at": pa.array((ix.occurred.data[live] * 1e6).astype(np.int64), pa.timestamp("us", "UTC")),
                "last_access": pa.array((last * 1e6).astype(np.int64), pa.timestamp("us", "UTC"), mask=~(last > 0)),
                "access_count": pa.array(ix.access_count.data[live].astype(np.int64)),
                "importance": pa.array(ix.importance.data[live]),
                "outcome": pa.array([u.outcome for u in units], pa.string()),
                "is_user_interaction": pa.array([u.user_interaction for u in units], pa.bool_()),
                "edge_count": pa.array(np.array([len(ix.graph.get(int(i), {})) for i in live], dtype=np.int64)),
                "size_bytes": pa.array(
                    [len(u.perception) + len(u.summary) + len(u.action) + 200 for u in units], pa.int64()
                ),
                "long_term": pa.array(ix.long_term.data[live]),
                "compressed": pa.array(ix.compressed.data[live]),
                "index_keys": pa.array([[*u.tools[:3], *u.objects[:3]] for u in units], pa.list_(pa.string())),
                "domain": pa.array([(u.domains or [""])[0] for u in units], pa.string()),
            }
        )
    )
    src, dst, weight = [], [], []
    for a, nbrs in ix.graph.items():
        for b, w in nbrs.items():
            if a < b:
                src.append(ix.ids[a])
                dst.append(ix.ids[b])
                weight.append(float(w))
    edges = pl.from_arrow(
        pa.table(
            {
                "src": pa.array(src, pa.string()),
                "dst": pa.array(dst, pa.string()),
                "weight": pa.array(weight, pa.float64()),
            }
        )
    )
    return frame, edges


def snapshot(state: MemoryState) -> tuple[Any, ...]:
    ix = state.index
    n = len(ix.ids)
    return (
        tuple(col.data[:n].tobytes() for col in ix._rows),
        [(a, list(b.items())) for a, b in ix.graph.items()],
        [list(m) for m in ix.run_members],
        ix.live,
        ix.live_len,
        ix.run_live.data.tobytes(),
        ix.scope_live.data.tobytes(),
        ix.scope_runs.data.tobytes(),
        ix.run_len.data.tobytes(),
    )


def test_memory_columns_are_the_per_memory_columns(units):
    state, _ = folded(units)
    frame, edges = memory_columns(state)
    want_frame, want_edges = reference_columns(state)
    assert edges.height > 0 and frame.height > 0
    assert frame.equals(want_frame) and frame.schema == want_frame.schema
    assert edges.equals(want_edges)


def test_a_run_writes_and_forgets_what_the_event_by_event_run_does(tmp_path, units):
    state, at = folded(units)
    expected_state, _ = folded(units)
    con = duckdb.connect(str(tmp_path / "s.duckdb"))
    schema.init(con)
    job = SleepJob(con, {}, SleepConfig())
    forgotten = job.run(state, at, SleepTrigger.ON_DEMAND, offset=3)
    # The reference: plan the same inputs, then every event built, encoded and applied one by one.
    frame, edges = reference_columns(expected_state)
    # (dreaming fed from the fold's state, as the job does: issue 29)
    plan = plan_sleep(
        dream_inputs(expected_state, frame, edges, None, SleepConfig()),
        now=at,
        trigger=SleepTrigger.ON_DEMAND,
        config=SleepConfig(),
        input_offset=3,
    )
    rows, expected_forgotten = [], []
    for ev in plan.events():
        rows.append(
            (ev.run_id, ev.seq, type(ev).__name__, getattr(ev, "memory_id", None), ev.at, encode_lifecycle(ev).decode())
        )
        if isinstance(ev, (MemoryPruned, MemoryCompressed)):
            reason = ForgetReason.REMOVED if isinstance(ev, MemoryPruned) else ForgetReason.COMPRESSED
            for fe in forget(expected_state, ev.memory_id, reason, at):
                apply(expected_state, fe)
                expected_forgotten.append(fe)
    kinds = {r[2] for r in rows}
    assert {"MemoryCompressed", "MemoryPruned", "MemoryRescored"} <= kinds  # five idle days: the bulk kinds
    assert forgotten == expected_forgotten
    assert snapshot(state) == snapshot(expected_state)
    (table,) = job.pending_log
    assert table.column_names == list(LOG_COLUMNS)
    assert list(zip(*(table[c].to_pylist() for c in LOG_COLUMNS), strict=True)) == rows
    con.execute("BEGIN")
    job.write(con)
    con.execute("COMMIT")
    stored = con.execute(
        "SELECT run_id, seq, kind, memory_id, decided_at, body::VARCHAR FROM lifecycle_log ORDER BY seq"
    ).fetchall()
    assert stored == rows
    assert con.execute("SELECT count(*) FROM lifecycle_log WHERE NOT json_valid(body)").fetchone() == (0,)
    report = con.execute("SELECT memories_before, pruned, compressed FROM sleep_runs").fetchone()
    assert report == (plan.report.memories_before, plan.report.pruned, plan.report.compressed)
    assert job.state.watermark == at
