"""somnus.processors.sleep.scoring: retention, protection, compression, pruning with temporal coverage
and maxEpisodes, the fixpoint, triple retention, re-scoring and idle time on the scope's stream time."""

from __future__ import annotations

import doctest
import math
from datetime import datetime, timedelta, timezone

import msgspec
import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from somnus.processors.sleep import config, scoring
from somnus.processors.sleep.config import (
    ACCESS_SATURATION,
    DEFAULT_SCHEDULE,
    EDGE_SATURATION,
    KEEP_THRESHOLD,
    OUTCOME_VALUE,
    RESCORE_EPSILON,
    RETENTION_WEIGHTS,
    SCHEDULE_ENV,
    LayerPolicy,
    SleepConfig,
)
from somnus.processors.sleep.plan import apply_run
from somnus.processors.sleep.scoring import compact_memory, retention_scores, retire_triples
from somnus.schemas.lifecycle import (
    COMPACT_MAX_BYTES,
    CompactMemory,
    MemoryCompressed,
    MemoryProtected,
    MemoryPruned,
    MemoryRescored,
    ProtectReason,
    PruneReason,
    TripleRetired,
    compact_size,
)
from tests.processors.sleep.memories import DAY, NOW, edge_list, frame, ids, mem, of, run


def test_doctests() -> None:
    assert doctest.testmod(config).failed == 0
    assert doctest.testmod(scoring).failed == 0


def test_policy_numbers_are_pinned() -> None:
    assert RETENTION_WEIGHTS == {"access": 0.30, "recency": 0.25, "graph": 0.20, "importance": 0.15, "outcome": 0.10}
    assert sum(RETENTION_WEIGHTS.values()) == pytest.approx(1.0)
    assert (ACCESS_SATURATION, EDGE_SATURATION, KEEP_THRESHOLD, RESCORE_EPSILON) == (20, 10, 0.4, 0.05)
    assert OUTCOME_VALUE == {"success": 1.0, "failure": 0.6, "partial": 0.5}
    c = SleepConfig()
    assert (DEFAULT_SCHEDULE, SCHEDULE_ENV, c.schedule, c.schedule_tz) == (
        "0 3 * * *",
        "SOMNUS_SLEEP_SCHEDULE",
        "0 3 * * *",
        "UTC",
    )
    assert c.hippocampus == LayerPolicy(7.0, 3.0) and c.semantic == LayerPolicy(30.0, 14.0)
    assert (c.max_episodes, c.coverage_bins, c.triple_retention_days) == (50, ("hour", "weekday"), 90.0)
    assert COMPACT_MAX_BYTES == 200


# --- retention -------------------------------------------------------------------------------------


def test_retention_formula() -> None:
    got = retention_scores(
        np.array([0, 3, 20, 100]),
        np.array([0.0, 7.0, 14.0, 0.0]),
        np.array([0, 1, 10, 50]),
        np.array([0.0, 0.5, 1.0, 2.0]),
        np.array([0.0, 0.6, 1.0, 0.5]),
        7.0,
    )
    expected = [
        0.25,
        0.30 * math.log(4) / math.log(21) + 0.25 * 0.5 + 0.20 * math.log(2) / math.log(11) + 0.15 * 0.5 + 0.06,
        0.30 + 0.25 * 0.25 + 0.20 + 0.15 + 0.10,
        0.30 + 0.25 + 0.20 + 0.15 + 0.05,  # everything saturates; importance is clipped to 1
    ]
    assert got.tolist() == pytest.approx([round(x, 6) for x in expected], abs=1e-6)


def test_semantic_memories_decay_four_times_slower() -> None:
    hip = retention_scores(np.array([0]), np.array([7.0]), np.array([0]), np.array([0.0]), np.array([0.0]), 7.0)
    atl = retention_scores(np.array([0]), np.array([30.0]), np.array([0]), np.array([0.0]), np.array([0.0]), 30.0)
    assert hip[0] == atl[0] == 0.125


def test_well_linked_and_much_used_memories_resist_pruning() -> None:
    rows = [mem("stale"), mem("linked"), mem("used", access=20)]
    rows = [{**r, "last_access": NOW - 8 * DAY} for r in rows]
    fresh = [mem(f"f{k}", idle=0.5) for k in range(10)]
    plan = run(rows + fresh, [("linked", f"f{k}") for k in range(10)])
    assert ids(of(plan, MemoryPruned)) == ["stale"]
    assert of(plan, MemoryPruned)[0].reason == PruneReason.STALE


# --- protection --------------------------------------------------------------------------------------


def test_user_interactions_and_successes_are_never_pruned() -> None:
    rows = [
        mem("ui", idle=60, user=True, importance=0),
        mem("win", idle=60, outcome="success", importance=0),
        mem("lost", idle=60, importance=0),
    ]
    plan = run(rows, config=SleepConfig(max_episodes=0))  # even over capacity
    assert ids(of(plan, MemoryPruned)) == ["lost"]
    protected = {e.memory_id: e.reasons for e in of(plan, MemoryProtected)}
    assert protected == {"ui": [ProtectReason.USER_INTERACTION], "win": [ProtectReason.SUCCESS]}
    # the flag is sticky: the next run does not announce it again, and long_term alone protects
    again = run(
        [{**r, "long_term": True} for r in rows[:2]] + [{**rows[2], "long_term": True, "outcome": ""}],
        config=SleepConfig(max_episodes=0),
    )
    assert of(again, MemoryProtected) == [] and of(again, MemoryPruned) == []


# --- compression ------------------------------------------------------------------------------------


def test_compression_after_idle_days_per_layer() -> None:
    rows = [
        mem("h3", idle=3.0),
        mem("h29", idle=2.99),
        mem("s14", layer="atl", idle=14.0),
        mem("s13", layer="angular_gyrus", idle=13.9),
        mem("done", idle=5, compressed=True),
    ]
    assert sorted(ids(of(run(rows), MemoryCompressed))) == ["h3", "s14"]


def test_compressed_form_keeps_what_retention_needs_and_drops_edges() -> None:
    created = datetime(2024, 5, 1, 10, 30, 15, 999_999, tzinfo=timezone.utc)
    rows = [
        mem("old", created=created, idle=4.0, access=7, outcome="partial", keys=["tool:book", "err:timeout"]),
        mem("n1", idle=0.1),
        mem("n2", idle=0.1),
    ]
    plan = run(rows, [("old", "n1"), ("old", "n2"), ("n1", "n2")])
    (ev,) = of(plan, MemoryCompressed)
    assert ev.compact == CompactMemory(
        memory_id="old",
        created_at=created.replace(microsecond=0),
        last_access=(NOW - 4 * DAY).replace(microsecond=0),
        outcome="partial",
        access_count=7,
        edge_count=2,
        keys=["tool:book", "err:timeout"],
    )
    assert ev.bytes_before == 2500 and ev.bytes_after == compact_size(ev.compact) <= COMPACT_MAX_BYTES
    after, edges = apply_run(frame(rows), edge_list([("old", "n1"), ("old", "n2"), ("n1", "n2")]), list(plan.events()))
    assert edges is not None and edges.select("src", "dst").rows() == [("n1", "n2")]
    row = after.filter(pl.col("memory_id") == "old").row(0, named=True)
    assert (row["compressed"], row["edge_count"], row["size_bytes"]) == (True, 2, ev.bytes_after)


@settings(max_examples=200, deadline=None)
@given(
    st.text(min_size=1, max_size=120),
    st.text(max_size=40),
    st.integers(0, 10**12),
    st.integers(0, 10**12),
    st.lists(st.text(max_size=300), max_size=40),
    st.integers(-(10**15), 4 * 10**15),
)
def test_compact_form_never_exceeds_200_bytes(
    memory_id: str, outcome: str, accesses: int, edges: int, keys: list[str], created_us: int
) -> None:
    c = compact_memory(memory_id, created_us, created_us + 10**9, outcome, accesses, edges, keys)
    assert compact_size(c) <= COMPACT_MAX_BYTES
    assert c.keys == [k[:40] for k in keys[: len(c.keys)]]  # a prefix of the keys, in order
    assert msgspec.json.decode(msgspec.json.encode(c), type=CompactMemory) == c


def test_typical_memory_shrinks_from_kilobytes_to_under_200_bytes() -> None:
    c = compact_memory(
        "3c8f4e2a-91d7-4b6e-a5f0-7e2d1c9b8a63",
        1_700_000_000_000_000,
        1_700_000_100_000_000,
        "success",
        12,
        5,
        ["tool:book_reservation", "error:payment_mismatch", "api:airline"],
    )
    assert compact_size(c) <= 200 and len(c.keys) >= 2


# --- pruning -----------------------------------------------------------------------------------------


def test_stale_means_idle_for_the_layers_max_age() -> None:
    rows = [
        mem("h7", idle=7.0),
        mem("h69", idle=6.9),
        mem("s30", layer="atl", idle=30.0),
        mem("s29", layer="atl", idle=29.9),
        mem("keep", idle=0.1),
    ]
    rows.append(mem("keep2", layer="atl", idle=0.1))
    plan = run(rows, config=SleepConfig(coverage_bins=()))
    assert sorted(ids(of(plan, MemoryPruned))) == ["h7", "s30"]


def at_hour(day: int, hour: int) -> datetime:
    return datetime(2024, 5, day, hour, tzinfo=timezone.utc)


def test_temporal_coverage_keeps_the_best_memory_of_an_emptied_hour() -> None:
    rows = [
        mem("a5", created=at_hour(1, 5), idle=20),
        mem("b5", created=at_hour(2, 5), idle=20, importance=0.9),
        mem("c5", created=at_hour(3, 5), idle=20),
        mem("d9", created=at_hour(1, 9), idle=20),
        mem("e9", created=at_hour(2, 9), idle=0.5),
    ]
    plan = run(rows, config=SleepConfig(coverage_bins=("hour",)))
    # hour 5 had only stale memories: its best (b5, higher importance) stays; hour 9 keeps e9
    assert sorted(ids(of(plan, MemoryPruned))) == ["a5", "c5", "d9"]
    # ties go to the smallest id
    tie = run([{**r, "importance": 0.5} for r in rows], config=SleepConfig(coverage_bins=("hour",)))
    assert sorted(ids(of(tie, MemoryPruned))) == ["b5", "c5", "d9"]
    # without coverage every stale one goes
    none = run(rows, config=SleepConfig(coverage_bins=()))
    assert sorted(ids(of(none, MemoryPruned))) == ["a5", "b5", "c5", "d9"]


def test_temporal_coverage_by_weekday_and_by_agent_and_layer() -> None:
    # 2024-05-06 is a Monday; 05-13 too; 05-07 a Tuesday
    rows = [
        mem("mon1", created=at_hour(6, 5), idle=20),
        mem("mon2", created=at_hour(13, 6), idle=20),
        mem("tue", created=at_hour(7, 5), idle=0.5),
        mem("b-mon", agent="b", created=at_hour(6, 5), idle=20),
    ]
    plan = run(rows, config=SleepConfig(coverage_bins=("weekday",)))
    assert sorted(ids(of(plan, MemoryPruned))) == ["mon2"]  # mon1 keeps Monday for a; b keeps its own Monday
    # hour then weekday: mon2 is alone in hour 6, so it stays; then Monday is covered by mon2, and
    # hour 5 by "tue": mon1 goes
    both = run(rows)
    assert ids(of(both, MemoryPruned)) == ["mon1"]


def test_max_episodes_prunes_the_lowest_retention_first() -> None:
    rows = [mem(f"e{k:02d}", idle=1.0, importance=k / 100, created=at_hour(20, 3)) for k in range(55)]
    rows += [mem("ui", idle=1.0, importance=0.0, user=True, created=at_hour(20, 3))]
    rows += [mem(f"c{k}", layer="atl", idle=1.0) for k in range(60)]  # concepts are not episodes
    plan = run(rows)
    pruned = of(plan, MemoryPruned)
    assert sorted(ids(pruned)) == ["e00", "e01", "e02", "e03", "e04", "e05"]  # 56 episodes, cap 50
    assert {e.reason for e in pruned} == {PruneReason.OVER_CAPACITY}
    per_agent = run(rows, inputs={"max_episodes": {"a": 53}})
    assert sorted(ids(of(per_agent, MemoryPruned))) == ["e00", "e01", "e02"]
    assert of(run(rows, config=SleepConfig(max_episodes=None)), MemoryPruned) == []


def test_max_episodes_prunes_bin_representatives_last() -> None:
    rows = [mem(f"e{k}", idle=1.0, importance=0.9, created=at_hour(20, 3)) for k in range(3)]
    rows += [mem("lonely", idle=1.0, importance=0.0, created=at_hour(20, 4))]  # the only memory of hour 4
    plan = run(rows, config=SleepConfig(max_episodes=3, coverage_bins=("hour",)))
    assert ids(of(plan, MemoryPruned)) == ["e2"]  # not "lonely", though its retention is the lowest


def test_pruning_cascades_through_the_graph_to_a_fixpoint() -> None:
    # "hub" resists only thanks to its 4 stale neighbours; once they go, it goes in the same run
    rows = [mem("hub", idle=10, access=3, importance=0.5)]
    rows += [mem(f"s{k}", idle=10, importance=0.0) for k in range(4)]
    rows += [mem("fresh", idle=0.1)]
    pairs = [("hub", f"s{k}") for k in range(4)]
    base = retention_scores(np.array([3]), np.array([10.0]), np.array([4]), np.array([0.5]), np.array([0.6]), 7.0)
    alone = retention_scores(np.array([3]), np.array([10.0]), np.array([0]), np.array([0.5]), np.array([0.6]), 7.0)
    assert base[0] >= KEEP_THRESHOLD > alone[0]  # the premise of the test
    plan = run(rows, pairs, config=SleepConfig(coverage_bins=()))
    assert sorted(ids(of(plan, MemoryPruned))) == ["hub", "s0", "s1", "s2", "s3"]


# --- triples -----------------------------------------------------------------------------------------


def test_triples_closed_more_than_90_days_ago_retire() -> None:
    triples = pl.DataFrame(
        {
            "triple_id": ["t1", "t2", "t3", "t4"],
            "valid_to": [
                NOW - timedelta(days=90, seconds=1),
                NOW - timedelta(days=90),
                None,
                NOW - timedelta(days=400),
            ],
        },
        schema={"triple_id": pl.String, "valid_to": pl.Datetime("us", "UTC")},
    )
    assert retire_triples(triples, NOW)["triple_id"].to_list() == ["t1", "t4"]
    plan = run([mem("m")], inputs={"triples": triples})
    assert [e.triple_id for e in of(plan, TripleRetired)] == ["t1", "t4"]


def test_rescoring_only_when_the_score_moved() -> None:
    base = mem("m", idle=0.5, access=1)
    score = run([base]).report and of(run([base]), MemoryRescored)[0].retention
    assert of(run([{**base, "retention": score + 0.049}]), MemoryRescored) == []
    moved = of(run([{**base, "retention": score + 0.05}]), MemoryRescored)
    assert [(e.retention, e.previous) for e in moved] == [(score, pytest.approx(score + 0.05))]


def test_idle_time_runs_to_the_scopes_stream_time_never_past_the_run() -> None:
    # Ten idle days at the run's time, but the memory's scope saw its last event nine days ago: one idle day.
    behind = NOW - 9 * DAY
    rows = [
        {**mem("own-time", idle=10.0), "stream_time": behind},
        {**mem("run-time", idle=10.0), "stream_time": None},  # no stream time: the run's
        {**mem("ahead", idle=10.0), "stream_time": NOW + 5 * DAY},
    ]  # a stream time past the run: the run's
    plan = run(rows, config=SleepConfig(coverage_bins=()))
    assert sorted(ids(of(plan, MemoryPruned))) == ["ahead", "run-time"]
    assert ids(of(plan, MemoryCompressed)) == []  # one idle day: nothing to compress either
    rescored = {e.memory_id: e.retention for e in of(plan, MemoryRescored)}
    assert rescored["own-time"] == float(
        retention_scores(np.array([0]), np.array([1.0]), np.array([0]), np.array([0.5]), np.array([0.6]), 7.0)[0]
    )
