"""Deep sleep inside the memory fold (real DuckDB file; records built here, no broker)."""

from __future__ import annotations

from datetime import timedelta

import duckdb
import msgspec
import orjson
import pytest

from somnus.processors.episodic.capture import episode_unit
from somnus.processors.sessions.distiller import distill
from somnus.processors.sleep.config import SleepConfig
from somnus.projections import queries, schema
from somnus.projections.writer import ReadModels, Topics, apply_batch, load_offsets
from somnus.sample import generate
from somnus.schemas.codec import decode_trace, encode
from somnus.schemas.lifecycle import KIND_SLEEP, SleepRequested
from somnus.schemas.memory import KIND_UNITS
from tests.factories import Rec

TOPICS = Topics("traces", "episodes", "dead-letters", "facts", "link-updates", "memory")
SLEEP_TABLES = ("lifecycle_log", "sleep_runs", "memory_log", "memories")


@pytest.fixture(scope="module")
def units():
    events = [decode_trace(orjson.dumps(e), 1 << 20) for e in generate(sessions=2000, seed=8)]
    return [episode_unit(ep) for ep in distill({}, events).episodes]


def _records(units, request_at=None, stamped=None):
    """Records of 100 units each, stamped ``stamped(units of the record)`` (ms; default: a second after
    the record's latest unit, as the worker sends them)."""
    stamped = stamped or (lambda part: int(max(u.occurred_at for u in part).timestamp() * 1000) + 1000)
    recs = [
        Rec(
            "memory",
            0,
            i,
            encode(units[j : j + 100]),
            headers=[("somnus-kind", KIND_UNITS)],
            timestamp=stamped(units[j : j + 100]),
        )
        for i, j in enumerate(range(0, len(units), 100))
    ]
    if request_at is not None:
        recs.append(
            Rec(
                "memory",
                0,
                len(recs),
                encode(SleepRequested(at=request_at, requested_by="test")),
                headers=[("somnus-kind", KIND_SLEEP)],
            )
        )
    return recs


def _project(tmp_path, name, chunks, restart_each_batch=False):
    con = duckdb.connect(str(tmp_path / name))
    schema.init(con)
    seen = ReadModels(con)
    for chunk in chunks:
        if restart_each_batch:
            seen = ReadModels(con)
        apply_batch(con, TOPICS, chunk, load_offsets(con), 1 << 20, seen)
    return con, seen


def test_scheduled_and_requested_runs_decide_the_same_whatever_the_batching(tmp_path, units):
    late = max(u.occurred_at for u in units) + timedelta(days=10)
    recs = _records(units, request_at=late)
    one, seen = _project(tmp_path, "one.duckdb", [recs])
    runs = one.execute("SELECT trigger, count(*) FROM sleep_runs GROUP BY 1 ORDER BY 1").fetchall()
    assert ("on_demand", 1) in runs and any(t == "schedule" for t, _ in runs)  # the fleet spans 03:00
    decided = dict(one.execute("SELECT kind, count(*) FROM lifecycle_log GROUP BY 1").fetchall())
    assert decided.get("MemoryCompressed", 0) + decided.get("MemoryPruned", 0) > 0  # over capacity
    # pruned memories are gone from the index recall reads; compressed ones are marked
    ix = seen.memory.state.index
    for (mid,) in one.execute("SELECT memory_id FROM lifecycle_log WHERE kind = 'MemoryPruned'").fetchall():
        assert not ix.alive.data[ix.pos[mid]]
    # user interactions and successes are never pruned
    protected = one.execute(
        "SELECT count(*) FROM lifecycle_log l JOIN memories m USING (memory_id) WHERE l.kind = 'MemoryPruned' "
        "AND (m.user_interaction OR m.outcome = 'success')"
    ).fetchone()[0]
    assert protected == 0
    many, _ = _project(tmp_path, "many.duckdb", [recs[:3], recs[3:4], recs[4:9], recs[9:]], restart_each_batch=True)
    a, b = queries.table_checksums(one), queries.table_checksums(many)
    for table in SLEEP_TABLES:
        assert a[table] == b[table], table


def test_a_second_request_at_the_same_time_changes_nothing(tmp_path, units):
    late = max(u.occurred_at for u in units) + timedelta(days=10)
    recs = _records(units, request_at=late)
    con, seen = _project(tmp_path, "p.duckdb", [recs])
    before = queries.table_checksums(con)
    again = Rec("memory", 0, len(recs), encode(SleepRequested(at=late)), headers=[("somnus-kind", KIND_SLEEP)])
    apply_batch(con, TOPICS, [again], load_offsets(con), 1 << 20, seen)
    after = queries.table_checksums(con)
    for table in SLEEP_TABLES:
        assert after[table] == before[table], table


def test_oscillators_follow_each_agents_episodes_only_when_enabled_and_replay_the_same(tmp_path, units):
    from somnus.processors.prediction.oscillators import OscillatorConfig
    from somnus.projections import api

    recs = _records(units)
    off = duckdb.connect(str(tmp_path / "off.duckdb"))
    schema.init(off)
    apply_batch(off, TOPICS, recs, {}, 1 << 20, ReadModels(off))
    assert off.execute("SELECT count(*) FROM oscillators").fetchone()[0] == 0  # off by default

    def project(name, chunks):
        con = duckdb.connect(str(tmp_path / name))
        schema.init(con)
        for chunk in chunks:
            apply_batch(
                con, TOPICS, chunk, load_offsets(con), 1 << 20, ReadModels(con, oscillators=OscillatorConfig(True))
            )
        return con

    one = project("one.duckdb", [recs])
    many = project("many.duckdb", [recs[:2], recs[2:7], recs[7:]])
    assert queries.table_checksums(one)["oscillators"] == queries.table_checksums(many)["oscillators"]
    agents = {u.agent for u in units}
    kinds = dict(
        one.execute("SELECT agent, sum(events) FILTER (kind = 'session_end') FROM oscillators GROUP BY 1").fetchall()
    )
    assert set(kinds) == agents and all(kinds[a] == sum(1 for u in units if u.agent == a) for a in agents)
    shown = api.ReadService(one, {}).oscillators(sorted(agents)[0])
    assert shown and {"kind", "events", "locked", "coherence", "next_recurrence"} <= set(shown[0])
    assert 0.0 <= shown[0]["coherence"] <= 1.0


def test_a_batch_reports_every_run_it_committed_for_promotion(tmp_path, units):
    late = max(u.occurred_at for u in units) + timedelta(days=10)
    recs = _records(units, request_at=late)
    con = duckdb.connect(str(tmp_path / "s.duckdb"))
    schema.init(con)
    seen = ReadModels(con)
    reported = []
    for chunk in (recs[:4], recs[4:]):
        reported += apply_batch(con, TOPICS, chunk, load_offsets(con), 1 << 20, seen).scheduled_sleeps
    runs = con.execute("SELECT run_id, run_at, trigger FROM sleep_runs ORDER BY run_at").fetchall()
    # the on-demand run too: its promotion, requested after it, carries the topics it abstracted
    assert {t for _, _, t in runs} == {"schedule", "on_demand"}
    assert reported == [(r, at) for r, at, _ in runs]
    assert seen.memory.sleep.take_scheduled() == []


def test_units_stamped_ahead_of_their_records_move_the_sleep_clock_only_to_the_records_time(tmp_path, units):
    # Then a runtime whose clock is 30 days ahead: its units' times are, the worker's records' are not.
    ahead = units[:200] + [
        msgspec.structs.replace(u, occurred_at=u.occurred_at + timedelta(days=30)) for u in units[200:400]
    ]
    sent = [int((max(u.occurred_at for u in units[j : j + 100])).timestamp() * 1000) + 1000 for j in range(0, 400, 100)]
    recs = _records(ahead, stamped=lambda part: sent[ahead.index(part[0]) // 100])
    last_sent = max(sent) / 1000 + 300  # the record's time plus the skew allowed (s)

    def sleep_clock(config):
        con = duckdb.connect(str(tmp_path / f"skew{config.max_clock_skew_s:g}.duckdb"))
        schema.init(con)
        seen = ReadModels(con, None, config)
        apply_batch(con, TOPICS, recs, load_offsets(con), 1 << 20, seen)
        runs = con.execute("SELECT count(*) FROM sleep_runs WHERE trigger = 'schedule'").fetchone()[0]
        return seen.memory.sleep.state.clock.last_fired.timestamp(), runs

    bounded, bounded_runs = sleep_clock(SleepConfig())
    free, free_runs = sleep_clock(SleepConfig(max_clock_skew_s=0))
    assert bounded <= last_sent  # no sleep run dated in the future
    assert free >= min(u.occurred_at for u in ahead[200:]).timestamp() - 86400  # unbounded: a month on
    assert free_runs > bounded_runs, (free_runs, bounded_runs)  # ... after a catch-up of runs for the nights to come


def test_another_datasets_newer_events_never_make_a_scopes_memories_idle(tmp_path, units):
    # Two datasets: "new" (the same sessions 60 days later, other agents) is imported first, then "old".
    # The fold keeps a stream time per scope, and a run judges each scope's memories by its own time.
    old = units[:600]
    new = [
        msgspec.structs.replace(
            u,
            memory_id=f"new-{u.memory_id}",
            agent=f"new-{u.agent}",
            scope=f"agent:new-{u.agent}",
            occurred_at=u.occurred_at + timedelta(days=60),
        )
        for u in old
    ]
    off = SleepConfig(schedule="off")  # on demand only: the same runs in both projections

    def project(name, datasets, request_at):
        recs = [r for d in datasets for r in _records(d)]
        recs = [Rec(r.topic, 0, i, r.value, headers=r.headers, timestamp=r.timestamp) for i, r in enumerate(recs)]
        recs.append(
            Rec("memory", 0, len(recs), encode(SleepRequested(at=request_at)), headers=[("somnus-kind", KIND_SLEEP)])
        )
        con = duckdb.connect(str(tmp_path / name))
        schema.init(con)
        seen = ReadModels(con, None, off)
        apply_batch(con, TOPICS, recs, {}, 1 << 20, seen)
        decided = con.execute(
            "SELECT kind, memory_id FROM lifecycle_log WHERE kind IN ('MemoryPruned', "
            "'MemoryCompressed') AND NOT starts_with(memory_id, 'new-') ORDER BY 1, 2"
        ).fetchall()
        return decided, seen.memory.sleep.state.scopes

    old_end = max(u.occurred_at for u in old)
    alone, alone_scopes = project("alone.duckdb", [old], old_end)  # "somnus sleep" stamped with old's stream time
    both, scopes = project("both.duckdb", [new, old], max(u.occurred_at for u in new))
    assert both == alone  # 60 days of the other dataset made none of old's memories idle
    # the stream times: each scope's newest unit, whatever came in between
    for agent in {u.agent for u in old}:
        newest = max(u.occurred_at for u in old if u.agent == agent)
        assert scopes[f"agent:{agent}"] == newest == alone_scopes[f"agent:{agent}"]
        assert scopes[f"agent:new-{agent}"] == newest + timedelta(days=60)
    # the control: a scope's own newer events do age its memories (one more session each, 10 days on)
    late = [
        msgspec.structs.replace(u, memory_id=f"late-{u.memory_id}", occurred_at=old_end + timedelta(days=10))
        for u in {u.agent: u for u in old}.values()
    ]
    later, _ = project("later.duckdb", [old, late], old_end + timedelta(days=10))
    assert {m for k, m in later if k == "MemoryCompressed"} - {m for k, m in alone if k == "MemoryCompressed"}


def test_status_counts_pruned_memories_apart_from_live_ones(tmp_path, units):
    # every agent works again 4 days on: some memories pruned (over capacity), some compressed (idle)
    late = max(u.occurred_at for u in units) + timedelta(days=4)
    again = [
        msgspec.structs.replace(u, memory_id=f"again-{u.memory_id}", occurred_at=late)
        for u in {u.agent: u for u in units}.values()
    ]
    con, seen = _project(tmp_path, "counts.duckdb", [_records(units + again, request_at=late)])
    pruned = con.execute("SELECT count(DISTINCT memory_id) FROM lifecycle_log WHERE kind = 'MemoryPruned'").fetchone()[
        0
    ]
    compressed = con.execute(
        "SELECT count(DISTINCT memory_id) FROM lifecycle_log WHERE kind = 'MemoryCompressed' "
        "AND memory_id NOT IN (SELECT memory_id FROM lifecycle_log WHERE kind = 'MemoryPruned')"
    ).fetchone()[0]
    got = queries.summary(con)["memories"]
    assert pruned and compressed
    assert got == {
        "stored": queries.counts(con)["memories"],
        "live": len(seen.memory.state.index),
        "compressed": compressed,
        "pruned": pruned,
    }
    assert got["live"] == got["stored"] - pruned
