"""Deep sleep inside the memory fold: scheduled on stream time, or on demand, replayable.

The memory topic has one partition, so the episodic memory the fold holds before any record is the
same live and in a replay. Before it applies a units record, the fold advances the sleep clock to
the record's event time (``processors.sleep.advance``; cron ``SOMNUS_SLEEP_SCHEDULE``, default
``0 3 * * *``): every fire time passed runs a sleep at that time, over the state before the record.
A ``SleepRequested`` record (``somnus sleep``) runs one at its ``at``. The watermark (the last run's
time) makes a run at or before it a no-op, so running twice changes nothing.

A run's decisions (``processors.sleep.plan_sleep``: protect, compress, prune, re-score, dream…) are
written to ``lifecycle_log`` and its report to ``sleep_runs`` in the transaction of the batch that
triggered it (a crash means the batch, run included, is redone identically); compressions and
prunings are applied to the memory index as ``MemoryForgotten`` events, appended to ``memory_log``
so the index rebuilt at start has them too. Promotion (phase 2) is ``somnus consolidate``'s
request on the semantic topic: ``somnus sleep`` publishes both.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

import duckdb
import msgspec
import numpy as np
import polars as pl
import pyarrow as pa

from processors.memory import apply, forget
from processors.sleep import SleepClock, SleepConfig, SleepInputs, advance, plan_sleep
from schemas.lifecycle import (
    MemoryCompressed, MemoryPruned, SleepCompleted, SleepTrigger, encode_lifecycle)
from schemas.memory import ForgetReason

log = logging.getLogger("somnus.projector")

KIND_SLEEP = b"sleep"  # header somnus-kind on the memory topic: a SleepRequested


class SleepState(msgspec.Struct):
    clock: SleepClock = SleepClock()
    watermark: datetime | None = None
    fiedler_history: list[float] = []


def load_state(con: duckdb.DuckDBPyConnection) -> SleepState:
    row = con.execute("SELECT state FROM sleep_state WHERE id = 1").fetchone()
    return msgspec.json.decode(row[0], type=SleepState) if row else SleepState()


def memory_columns(state: Any) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The live memories of the fold as sleep's columns, and the associative graph as an edge list."""
    ix = state.index
    n = len(ix.ids)
    live = np.flatnonzero(ix.alive.data[:n])
    units = [ix.units[i] for i in live]
    degree = np.array([len(ix.graph.get(int(i), {})) for i in live], dtype=np.int64)
    last = ix.last_access.data[live]
    # Built through Arrow: a list column from Python lists costs polars a Series per row.
    frame = pl.from_arrow(pa.table({
        "memory_id": pa.array([ix.ids[i] for i in live], pa.string()),
        "agent": pa.array([u.agent for u in units], pa.string()),
        "layer": pa.array(["hippocampus"] * len(live), pa.string()),
        "created_at": pa.array((ix.occurred.data[live] * 1e6).astype(np.int64), pa.timestamp("us", "UTC")),
        "last_access": pa.array((last * 1e6).astype(np.int64), pa.timestamp("us", "UTC"), mask=~(last > 0)),
        "access_count": pa.array(ix.access_count.data[live].astype(np.int64)),
        "importance": pa.array(ix.importance.data[live]),
        "outcome": pa.array([u.outcome for u in units], pa.string()),
        "is_user_interaction": pa.array([u.user_interaction for u in units], pa.bool_()),
        "edge_count": pa.array(degree), "size_bytes": pa.array(
            [len(u.perception) + len(u.summary) + len(u.action) + 200 for u in units], pa.int64()),
        "long_term": pa.array(ix.long_term.data[live]), "compressed": pa.array(ix.compressed.data[live]),
        "index_keys": pa.array([[*u.tools[:3], *u.objects[:3]] for u in units], pa.list_(pa.string())),
        "domain": pa.array([(u.domains or [""])[0] for u in units], pa.string()),
    }))
    ids = ix.ids
    src, dst, weight = [], [], []
    for a, nbrs in ix.graph.items():
        for b, w in nbrs.items():
            if a < b:
                src.append(ids[a])
                dst.append(ids[b])
                weight.append(float(w))
    edges = pl.from_arrow(pa.table({"src": pa.array(src, pa.string()), "dst": pa.array(dst, pa.string()),
                                    "weight": pa.array(weight, pa.float64())}))
    return frame, edges


LOG_COLUMNS = ("run_id", "seq", "kind", "memory_id", "decided_at", "body")


class SleepJob:
    """The sleep clock and the runs, for one memory fold."""

    def __init__(self, con: duckdb.DuckDBPyConnection, max_episodes: Mapping[str, int], config: SleepConfig) -> None:
        self.config = config
        self.max_episodes = dict(max_episodes)
        self.state = load_state(con)
        self.pending_rows: dict[str, list[dict[str, Any]]] = {"sleep_runs": []}
        self.pending_log: dict[str, list[Any]] = {c: [] for c in LOG_COLUMNS}  # lifecycle_log, by column
        # Scheduled runs completed in the batch being written: (run_id, at). After the batch commits
        # the projector requests promotion for each (phase 2; ``take_scheduled``).
        self.scheduled: list[tuple[str, datetime]] = []

    def due(self, event_time: datetime) -> list[datetime]:
        """Advance the clock to a record's event time; the fire times passed (runs to do first)."""
        clock, due, dropped = advance(self.state.clock, event_time, self.config)
        if dropped:
            log.info("sleep: %d fire times skipped (catch-up limit %d)", dropped, self.config.max_catch_up)
        self.state.clock = clock
        return due

    def run(self, memory_state: Any, at: datetime, trigger: SleepTrigger, offset: int) -> list[Any]:
        """Plan and apply one run at ``at``; returns the MemoryForgotten events it applied."""
        frame, edges = memory_columns(memory_state)
        plan = plan_sleep(SleepInputs(memories=frame, edges=edges, max_episodes=self.max_episodes,
                                      fiedler_history=tuple(self.state.fiedler_history)),
                          now=at, trigger=trigger, watermark=self.state.watermark, config=self.config,
                          input_offset=offset)
        if plan is None:
            return []
        forgotten = []
        cols = self.pending_log
        for ev in plan.events():
            cols["run_id"].append(ev.run_id)
            cols["seq"].append(ev.seq)
            cols["kind"].append(type(ev).__name__)
            cols["memory_id"].append(getattr(ev, "memory_id", None))
            cols["decided_at"].append(ev.at)
            cols["body"].append(encode_lifecycle(ev).decode())
            if isinstance(ev, (MemoryPruned, MemoryCompressed)):
                reason = ForgetReason.REMOVED if isinstance(ev, MemoryPruned) else ForgetReason.COMPRESSED
                for fe in forget(memory_state, ev.memory_id, reason, at):
                    apply(memory_state, fe)
                    forgotten.append(fe)
            elif isinstance(ev, SleepCompleted):
                r = ev.report
                self.pending_rows["sleep_runs"].append({
                    "run_id": ev.run_id, "run_at": ev.at, "trigger": trigger.value, "memories_before": r.memories_before,
                    "memories_after": r.memories_after, "kept": r.kept, "compressed": r.compressed,
                    "pruned": r.pruned, "protected": r.protected, "rescored": r.rescored,
                    "bytes_before": r.bytes_before, "bytes_after": r.bytes_after,
                    "fiedler": r.fiedler.largest_component, "report": msgspec.json.encode(r).decode()})
                self.state.watermark = ev.watermark
                if trigger is SleepTrigger.SCHEDULE:
                    self.scheduled.append((ev.run_id, ev.at))
                self.state.fiedler_history = [*self.state.fiedler_history, float(r.fiedler.largest_component)][-50:]
        return forgotten

    def write(self, con: duckdb.DuckDBPyConnection) -> None:
        """Write the runs' rows and the clock (caller's transaction)."""
        if self.pending_log["run_id"]:
            log_frame = pa.table({  # noqa: F841
                "run_id": pa.array(self.pending_log["run_id"], pa.string()),
                "seq": pa.array(self.pending_log["seq"], pa.int64()),
                "kind": pa.array(self.pending_log["kind"], pa.string()),
                "memory_id": pa.array(self.pending_log["memory_id"], pa.string()),
                "decided_at": pa.array(self.pending_log["decided_at"], pa.timestamp("us", "UTC")),
                "body": pa.array(self.pending_log["body"], pa.string())})
            con.execute("INSERT INTO lifecycle_log SELECT run_id, seq, kind, memory_id, decided_at, body::JSON "
                        "FROM log_frame")
        for column in self.pending_log.values():
            column.clear()
        rows = self.pending_rows["sleep_runs"]
        if rows:
            frame = pa.Table.from_pylist(rows)  # noqa: F841
            con.execute("INSERT INTO sleep_runs SELECT * EXCLUDE (report), report::JSON FROM frame")
        rows.clear()
        con.execute("INSERT OR REPLACE INTO sleep_state VALUES (1, ?)", [msgspec.json.encode(self.state).decode()])

    def reload(self, con: duckdb.DuckDBPyConnection) -> None:
        self.state = load_state(con)
        for rows in self.pending_rows.values():
            rows.clear()
        for column in self.pending_log.values():
            column.clear()
        self.scheduled.clear()

    def take_scheduled(self) -> list[tuple[str, datetime]]:
        """The scheduled runs committed since the last call (call after the batch commits)."""
        runs, self.scheduled = self.scheduled, []
        return runs


def now_utc() -> datetime:  # the CLI's default event time for an on-demand run
    return datetime.now(timezone.utc)
