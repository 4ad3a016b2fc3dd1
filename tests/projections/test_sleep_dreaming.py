"""Dreaming fed from the memory fold's own state (issue 29 item 1): phase A's observations (memories
captured since the last run), vectors (the memories' MinHash signatures), capture prediction errors
(saturation) and dream phase B's connect, on the sample fleet; no broker."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta

import duckdb
import msgspec
import numpy as np
import orjson
import pytest

from somnus.processors.episodic.capture import MemoryState, capture, episode_unit
from somnus.processors.sessions.distiller import distill
from somnus.processors.sleep.config import SleepConfig
from somnus.processors.sleep.plan import plan_sleep
from somnus.projections import queries, schema
from somnus.projections.sleep import dream_inputs, memory_columns
from somnus.projections.writer import ReadModels, Topics, apply_batch
from somnus.sample import generate
from somnus.schemas.codec import decode_trace, encode
from somnus.schemas.lifecycle import SleepReport
from somnus.schemas.memory import KIND_UNITS, CaptureDecided
from tests.factories import Rec

TOPICS = Topics("traces", "episodes", "dead-letters", "facts", "link-updates", "memory")
DREAM_KINDS = ("ObservationClustered", "ObservationHeld", "ObservationCreated", "MemoryRefined", "MemoriesConnected")


@pytest.fixture(scope="module")
def units():
    events = [decode_trace(orjson.dumps(e), 1 << 20) for e in generate(sessions=300, seed=42)]
    return [episode_unit(ep) for ep in distill({}, events).episodes]


def test_every_input_of_dreaming_comes_from_the_fold_when_it_has_them(units):
    state = MemoryState()
    _, log = capture(state, units, max(u.occurred_at for u in units))
    frame, edges = memory_columns(state)
    config = SleepConfig()
    inputs = dream_inputs(state, frame, edges, None, config)
    # phase A: every agent's newest memories (none run yet: all memories are new), capped per agent
    per_agent = Counter(frame["agent"].to_list())
    assert inputs.observations.height == sum(min(n, config.dream_observations_per_agent) for n in per_agent.values())
    assert inputs.observations.height > 0
    # vectors: one unit-norm row per memory asked for, from its signature
    vectors = inputs.embed(frame["memory_id"].to_list())
    assert vectors.shape[0] == frame.height and np.allclose(np.linalg.norm(vectors, axis=1), 1.0)
    # saturation: one prediction error per capture decision
    decided = [ev for ev in log if isinstance(ev, CaptureDecided)]
    assert inputs.capture_errors.height == len(decided) > 0
    assert inputs.capture_errors["prediction_error"].to_list() == [ev.prediction_error for ev in decided]
    # after a run at the newest memory, nothing is new: phase A has nothing to route
    newest = frame["created_at"].max()
    assert dream_inputs(state, frame, edges, newest, config).observations.height == 0
    plan = plan_sleep(inputs, now=max(u.occurred_at for u in units) + timedelta(hours=1), config=config)
    assert plan is not None
    routed = plan.counts["clustered"] + plan.counts["held"] + plan.counts["created"]
    assert routed == inputs.observations.height  # every observation is routed, one decision each
    # every phase whose inputs the fold holds gets them, and does work with them
    for phase in ("clustered", "held", "created", "refined", "connected"):
        assert plan.counts.get(phase, 0) > 0, (phase, plan.counts)
    assert plan.report.reviewed > 0 and plan.report.abstracted > 0
    assert plan.report.saturation.samples > 0 and plan.report.saturation.status != "insufficient"


def _records(units, size=100):
    return [
        Rec(
            "memory",
            0,
            i,
            encode(units[j : j + size]),
            headers=[("somnus-kind", KIND_UNITS)],
            timestamp=int(max(u.occurred_at for u in units[j : j + size]).timestamp() * 1000) + 1000,
        )
        for i, j in enumerate(range(0, len(units), size))
    ]


def _project(tmp_path, name, chunks, restart_each_batch=False):
    con = duckdb.connect(str(tmp_path / name))
    schema.init(con)
    seen = ReadModels(con)
    for chunk in chunks:
        if restart_each_batch:  # the fold rebuilt from the memory log, as after a restart (replay)
            seen = ReadModels(con)
        apply_batch(con, TOPICS, chunk, {}, 1 << 20, seen)
    return con


def test_each_dream_phase_works_on_the_sample_fleet_and_replay_decides_the_same(tmp_path, units):
    recs = _records(units)
    live = _project(tmp_path, "live.duckdb", [recs])
    kinds = dict(live.execute("SELECT kind, count(*) FROM lifecycle_log GROUP BY 1").fetchall())
    for kind in DREAM_KINDS:
        assert kinds.get(kind, 0) > 0, (kind, kinds)
    reports = [
        msgspec.json.decode(r, type=SleepReport)
        for (r,) in live.execute("SELECT report FROM sleep_runs ORDER BY run_at").fetchall()
    ]
    assert len(reports) > 5
    for name in ("clustered", "held", "created", "connected"):
        assert sum(getattr(r, name) for r in reports) > 0, name
    assert {r.saturation.status for r in reports} - {"insufficient"}  # from the capture decisions' errors
    # a pattern is abstracted once, not again by every later run (SleepState.patterns)
    patterns = [
        p
        for (p,) in live.execute(
            "SELECT body->>'pattern_id' FROM lifecycle_log WHERE kind = 'PatternAbstracted'"
        ).fetchall()
    ]
    assert patterns and len(patterns) == len(set(patterns))
    replayed = _project(tmp_path, "replay.duckdb", [recs[:2], recs[2:3], recs[3:7], recs[7:]], restart_each_batch=True)
    a, b = queries.table_checksums(live), queries.table_checksums(replayed)
    for table in ("lifecycle_log", "sleep_runs"):
        assert a[table] == b[table], table


def test_phase_a_routes_every_memory_captured_since_the_last_run_whatever_its_event_time(tmp_path, units):
    # Records that each span days of event time (an import, a batch of sessions): the run their fire
    # times trigger happens before they are captured, so "created after the last run" by event time
    # alone left most of their memories unrouted (LoCoMo: 104 of 2,888 in 34 runs). Now every memory
    # captured before the last run, up to the newest ``dream_observations_per_agent`` of each agent
    # per run, is routed once, and connect counts it as recent.
    recs = _records(units, size=60)
    con = _project(tmp_path, "spans.duckdb", [recs])
    last_run = con.execute("SELECT max(run_at) FROM sleep_runs").fetchone()[0]
    before = {r.offset for r in recs if r.timestamp / 1000 <= last_run.timestamp()}
    captured = [
        (m, a)
        for m, a, o in con.execute(
            "SELECT body->>'memory_id', body->>'agent', src_offset FROM memory_log WHERE kind = 'CaptureDecided' "
            "AND body->>'action' <> 'merged'"
        ).fetchall()
        if o in before
    ]
    routed = [
        m
        for (m,) in con.execute(
            "SELECT body->>'observation_id' FROM lifecycle_log WHERE kind IN "
            "('ObservationClustered', 'ObservationHeld', 'ObservationCreated')"
        ).fetchall()
    ]
    assert len(routed) == len(set(routed))  # once each
    assert set(routed) <= {m for m, _ in captured} and len(set(routed)) > 0.9 * len(captured)
    kinds = dict(con.execute("SELECT kind, count(*) FROM lifecycle_log GROUP BY 1").fetchall())
    assert kinds.get("MemoriesConnected", 0) > 0
