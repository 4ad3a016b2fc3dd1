"""somnus.processors.sleep.job: the schedule on stream time, retention, protection, compression, pruning with
temporal coverage and maxEpisodes, triple retention, phase order, watermark idempotence, crash and
resume, determinism and the report.

Benchmark (synthetic columns, see ``bench``):
    .venv/bin/python -m tests.processors.sleep.test_job --bench 1000000 --repeat 3
"""

from __future__ import annotations

import doctest
import math
import random
import sys
import time
from collections.abc import Sequence
from datetime import datetime, timedelta, timezone
from typing import Any

import msgspec
import numpy as np
import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from somnus.processors.sleep import job as sleep
from somnus.processors.sleep.job import (
    ACCESS_SATURATION,
    DEFAULT_SCHEDULE,
    EDGE_SATURATION,
    KEEP_THRESHOLD,
    OUTCOME_VALUE,
    RESCORE_EPSILON,
    RETENTION_WEIGHTS,
    SCHEDULE_ENV,
    LayerPolicy,
    RunAssembler,
    SleepClock,
    SleepConfig,
    SleepInputs,
    SleepView,
    advance,
    apply_run,
    compact_memory,
    fire_times,
    plan_sleep,
    retention_scores,
    retire_triples,
    run_id_for,
    validate_schedule,
)
from somnus.schemas import lifecycle
from somnus.schemas.lifecycle import (
    COMPACT_MAX_BYTES,
    PHASE_ORDER,
    CompactMemory,
    MemoryCompressed,
    MemoryPromoted,
    MemoryProtected,
    MemoryPruned,
    MemoryRescored,
    ObservationClustered,
    ProtectReason,
    PruneReason,
    ReviewScheduled,
    RunEvent,
    SleepCompleted,
    SleepPhase,
    SleepPhaseCompleted,
    SleepRequested,
    SleepStarted,
    SleepTrigger,
    TripleRetired,
    compact_size,
    decode_lifecycle,
    encode_lifecycle,
)

NOW = datetime(2024, 6, 5, 3, 0, tzinfo=timezone.utc)  # a Wednesday, 03:00
DAY = timedelta(days=1)
STRUCTURAL = (SleepStarted, SleepPhaseCompleted, SleepCompleted)


def mem(mid: str, *, agent: str = "a", layer: str = "hippocampus", created: datetime | None = None,
        idle: float | None = 1.0, access: int = 0, importance: float = 0.5, outcome: str = "failure",
        user: bool = False, edges: int = 0, size: int = 2500, long_term: bool = False, compressed: bool = False,
        retention: float | None = None, keys: Sequence[str] = ("tool:x",), domain: str = "") -> dict[str, Any]:
    """One memory row; ``idle`` days since its last access (None: never accessed, idle since creation)."""
    created = created or NOW - timedelta(days=max(idle or 0.0, 0.0) + 1)
    return {"memory_id": mid, "agent": agent, "layer": layer, "created_at": created,
            "last_access": None if idle is None else NOW - timedelta(days=idle), "access_count": access,
            "importance": importance, "outcome": outcome, "is_user_interaction": user, "edge_count": edges,
            "size_bytes": size, "long_term": long_term, "compressed": compressed, "retention": retention,
            "index_keys": list(keys), "domain": domain}


def frame(rows: Sequence[dict[str, Any]]) -> pl.DataFrame:
    return sleep.memory_frame(pl.DataFrame(list(rows), schema_overrides={
        "created_at": pl.Datetime("us", "UTC"), "last_access": pl.Datetime("us", "UTC"), "retention": pl.Float64,
        "index_keys": pl.List(pl.String)}))


def edge_list(pairs: Sequence[tuple[str, str]]) -> pl.DataFrame:
    return pl.DataFrame({"src": [a for a, _ in pairs], "dst": [b for _, b in pairs],
                         "weight": [1.0] * len(pairs)}, schema={"src": pl.String, "dst": pl.String,
                                                                "weight": pl.Float64})


def run(rows: Sequence[dict[str, Any]], pairs: Sequence[tuple[str, str]] = (), *, config: SleepConfig = SleepConfig(),
        **kw: Any) -> sleep.SleepPlan:
    plan = plan_sleep(SleepInputs(frame(rows), edge_list(pairs), **kw.pop("inputs", {})), now=kw.pop("now", NOW),
                      config=config, **kw)
    assert plan is not None
    return plan


def of(plan: sleep.SleepPlan, kind: type) -> list[Any]:
    return [e for e in plan.events() if isinstance(e, kind)]


def ids(events: Sequence[Any]) -> list[str]:
    return [e.memory_id for e in events]


def test_doctests() -> None:
    assert doctest.testmod(sleep).failed == 0
    assert doctest.testmod(lifecycle).failed == 0


def test_policy_numbers_are_pinned() -> None:
    assert RETENTION_WEIGHTS == {"access": 0.30, "recency": 0.25, "graph": 0.20, "importance": 0.15, "outcome": 0.10}
    assert sum(RETENTION_WEIGHTS.values()) == pytest.approx(1.0)
    assert (ACCESS_SATURATION, EDGE_SATURATION, KEEP_THRESHOLD, RESCORE_EPSILON) == (20, 10, 0.4, 0.05)
    assert OUTCOME_VALUE == {"success": 1.0, "failure": 0.6, "partial": 0.5}
    c = SleepConfig()
    assert (DEFAULT_SCHEDULE, SCHEDULE_ENV, c.schedule, c.schedule_tz) == ("0 3 * * *", "SOMNUS_SLEEP_SCHEDULE",
                                                                         "0 3 * * *", "UTC")
    assert c.hippocampus == LayerPolicy(7.0, 3.0) and c.semantic == LayerPolicy(30.0, 14.0)
    assert (c.max_episodes, c.coverage_bins, c.triple_retention_days) == (50, ("hour", "weekday"), 90.0)
    assert COMPACT_MAX_BYTES == 200


# --- retention -------------------------------------------------------------------------------------


def test_retention_formula() -> None:
    got = retention_scores(np.array([0, 3, 20, 100]), np.array([0.0, 7.0, 14.0, 0.0]), np.array([0, 1, 10, 50]),
                           np.array([0.0, 0.5, 1.0, 2.0]), np.array([0.0, 0.6, 1.0, 0.5]), 7.0)
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
    rows = [mem("ui", idle=60, user=True, importance=0), mem("win", idle=60, outcome="success", importance=0),
            mem("lost", idle=60, importance=0)]
    plan = run(rows, config=SleepConfig(max_episodes=0))  # even over capacity
    assert ids(of(plan, MemoryPruned)) == ["lost"]
    protected = {e.memory_id: e.reasons for e in of(plan, MemoryProtected)}
    assert protected == {"ui": [ProtectReason.USER_INTERACTION], "win": [ProtectReason.SUCCESS]}
    # the flag is sticky: the next run does not announce it again, and long_term alone protects
    again = run([{**r, "long_term": True} for r in rows[:2]] + [{**rows[2], "long_term": True, "outcome": ""}],
                config=SleepConfig(max_episodes=0))
    assert of(again, MemoryProtected) == [] and of(again, MemoryPruned) == []


# --- compression ------------------------------------------------------------------------------------


def test_compression_after_idle_days_per_layer() -> None:
    rows = [mem("h3", idle=3.0), mem("h29", idle=2.99), mem("s14", layer="atl", idle=14.0),
            mem("s13", layer="angular_gyrus", idle=13.9), mem("done", idle=5, compressed=True)]
    assert sorted(ids(of(run(rows), MemoryCompressed))) == ["h3", "s14"]


def test_compressed_form_keeps_what_retention_needs_and_drops_edges() -> None:
    created = datetime(2024, 5, 1, 10, 30, 15, 999_999, tzinfo=timezone.utc)
    rows = [mem("old", created=created, idle=4.0, access=7, outcome="partial", keys=["tool:book", "err:timeout"]),
            mem("n1", idle=0.1), mem("n2", idle=0.1)]
    plan = run(rows, [("old", "n1"), ("old", "n2"), ("n1", "n2")])
    (ev,) = of(plan, MemoryCompressed)
    assert ev.compact == CompactMemory(memory_id="old", created_at=created.replace(microsecond=0),
                                       last_access=(NOW - 4 * DAY).replace(microsecond=0), outcome="partial",
                                       access_count=7, edge_count=2, keys=["tool:book", "err:timeout"])
    assert ev.bytes_before == 2500 and ev.bytes_after == compact_size(ev.compact) <= COMPACT_MAX_BYTES
    after, edges = apply_run(frame(rows), edge_list([("old", "n1"), ("old", "n2"), ("n1", "n2")]), list(plan.events()))
    assert edges is not None and edges.select("src", "dst").rows() == [("n1", "n2")]
    row = after.filter(pl.col("memory_id") == "old").row(0, named=True)
    assert (row["compressed"], row["edge_count"], row["size_bytes"]) == (True, 2, ev.bytes_after)


@settings(max_examples=200, deadline=None)
@given(st.text(min_size=1, max_size=120), st.text(max_size=40), st.integers(0, 10**12), st.integers(0, 10**12),
       st.lists(st.text(max_size=300), max_size=40), st.integers(-(10**15), 4 * 10**15))
def test_compact_form_never_exceeds_200_bytes(memory_id: str, outcome: str, accesses: int, edges: int,
                                              keys: list[str], created_us: int) -> None:
    c = compact_memory(memory_id, created_us, created_us + 10**9, outcome, accesses, edges, keys)
    assert compact_size(c) <= COMPACT_MAX_BYTES
    assert c.keys == [k[:40] for k in keys[:len(c.keys)]]  # a prefix of the keys, in order
    assert msgspec.json.decode(msgspec.json.encode(c), type=CompactMemory) == c


def test_typical_memory_shrinks_from_kilobytes_to_under_200_bytes() -> None:
    c = compact_memory("3c8f4e2a-91d7-4b6e-a5f0-7e2d1c9b8a63", 1_700_000_000_000_000, 1_700_000_100_000_000,
                       "success", 12, 5, ["tool:book_reservation", "error:payment_mismatch", "api:airline"])
    assert compact_size(c) <= 200 and len(c.keys) >= 2


# --- pruning -----------------------------------------------------------------------------------------


def test_stale_means_idle_for_the_layers_max_age() -> None:
    rows = [mem("h7", idle=7.0), mem("h69", idle=6.9), mem("s30", layer="atl", idle=30.0),
            mem("s29", layer="atl", idle=29.9), mem("keep", idle=0.1)]
    rows.append(mem("keep2", layer="atl", idle=0.1))
    plan = run(rows, config=SleepConfig(coverage_bins=()))
    assert sorted(ids(of(plan, MemoryPruned))) == ["h7", "s30"]


def at_hour(day: int, hour: int) -> datetime:
    return datetime(2024, 5, day, hour, tzinfo=timezone.utc)


def test_temporal_coverage_keeps_the_best_memory_of_an_emptied_hour() -> None:
    rows = [mem("a5", created=at_hour(1, 5), idle=20), mem("b5", created=at_hour(2, 5), idle=20, importance=0.9),
            mem("c5", created=at_hour(3, 5), idle=20), mem("d9", created=at_hour(1, 9), idle=20),
            mem("e9", created=at_hour(2, 9), idle=0.5)]
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
    rows = [mem("mon1", created=at_hour(6, 5), idle=20), mem("mon2", created=at_hour(13, 6), idle=20),
            mem("tue", created=at_hour(7, 5), idle=0.5),
            mem("b-mon", agent="b", created=at_hour(6, 5), idle=20)]
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
    triples = pl.DataFrame({"triple_id": ["t1", "t2", "t3", "t4"],
                            "valid_to": [NOW - timedelta(days=90, seconds=1), NOW - timedelta(days=90), None,
                                         NOW - timedelta(days=400)]},
                           schema={"triple_id": pl.String, "valid_to": pl.Datetime("us", "UTC")})
    assert retire_triples(triples, NOW)["triple_id"].to_list() == ["t1", "t4"]
    plan = run([mem("m")], inputs={"triples": triples})
    assert [e.triple_id for e in of(plan, TripleRetired)] == ["t1", "t4"]


# --- order of phases ------------------------------------------------------------------------------------


def test_phases_run_in_order_and_promotion_sees_the_slept_hippocampus() -> None:
    rows = [mem("old-ep", idle=30), mem("ep", idle=0.5), mem("old-concept", layer="atl", idle=40),
            mem("concept", layer="atl", idle=1)]
    seen: dict[str, Any] = {}

    def promote(view: SleepView) -> list[RunEvent]:
        seen["memories"] = sorted(view.memories["memory_id"].to_list())
        seen["pruned"] = view.pruned
        return [view.promoted("ep", "a", "c-1")]

    def brief(view: SleepView) -> list[RunEvent]:
        seen["refresh"] = sorted(view.memories["memory_id"].to_list())
        return [view.briefing("a")]

    plan = run(rows, config=SleepConfig(coverage_bins=()), promotion=promote, refresh=brief)
    events = list(plan.events())
    assert [e.seq for e in events] == list(range(len(events)))
    assert isinstance(events[0], SleepStarted) and isinstance(events[-1], SleepCompleted)
    phases = [e for e in events if isinstance(e, SleepPhaseCompleted)]
    assert [p.phase for p in phases] == list(PHASE_ORDER)
    assert [p.phase.value for p in phases] == ["hippocampus", "promotion", "consolidation", "refresh"]
    # promotion ran after hippocampus sleep (old-ep already gone) and before consolidation (old-concept still there)
    assert seen["pruned"] == ("old-ep",)
    assert seen["memories"] == ["concept", "ep", "old-concept"]
    assert seen["refresh"] == ["concept", "ep"]
    seq = {(type(e).__name__, getattr(e, "memory_id", getattr(e, "phase", None))): e.seq for e in events}
    assert seq[("MemoryPruned", "old-ep")] < seq[("SleepPhaseCompleted", SleepPhase.HIPPOCAMPUS)] \
        < seq[("MemoryPromoted", "ep")] < seq[("SleepPhaseCompleted", SleepPhase.PROMOTION)] \
        < seq[("MemoryPruned", "old-concept")] < seq[("SleepPhaseCompleted", SleepPhase.CONSOLIDATION)] \
        < seq[("BriefingRefreshed", None)] < seq[("SleepPhaseCompleted", SleepPhase.REFRESH)]
    # each phase counts its own decisions
    bounds = [0, *(p.seq for p in phases)]
    assert [p.decisions for p in phases] == [b - a - 1 for a, b in zip(bounds, bounds[1:], strict=False)]
    assert events[-1].decisions == len(events) == len(plan)
    assert plan.report.promoted == 1


def test_a_phase_may_not_inject_events_of_another_run() -> None:
    def rogue(view: SleepView) -> list[RunEvent]:
        return [MemoryPromoted(run_id="other", seq=0, at=NOW, memory_id="m", agent="a", concept_id="c")]

    with pytest.raises(ValueError, match="another run"):
        run([mem("m")], promotion=rogue)


# --- watermark, idempotence, crash and resume -------------------------------------------------------


def test_watermark_makes_a_done_run_a_no_op() -> None:
    inputs = SleepInputs(frame([mem("m", idle=30)]))
    assert plan_sleep(inputs, now=NOW, watermark=NOW) is None
    assert plan_sleep(inputs, now=NOW - DAY, watermark=NOW) is None
    plan = plan_sleep(inputs, now=NOW, watermark=NOW - DAY)
    assert plan is not None
    started = next(plan.events())
    assert isinstance(started, SleepStarted) and started.previous == NOW - DAY
    completed = list(plan.events())[-1]
    assert isinstance(completed, SleepCompleted) and completed.watermark == NOW
    assert plan.run_id == run_id_for(NOW) == "sleep-20240605T030000Z"


@st.composite
def states(draw: st.DrawFn) -> tuple[list[dict[str, Any]], list[tuple[str, str]]]:
    n = draw(st.integers(1, 25))
    rows = []
    for k in range(n):
        rows.append(mem(
            f"m{k:02d}", agent=draw(st.sampled_from(["a", "b"])),
            layer=draw(st.sampled_from(["hippocampus", "hippocampus", "atl", "angular_gyrus"])),
            created=NOW - timedelta(hours=draw(st.integers(1, 24 * 60))) if draw(st.booleans()) else None,
            idle=draw(st.one_of(st.none(), st.floats(0, 45))), access=draw(st.integers(0, 30)),
            importance=draw(st.floats(0, 1)), outcome=draw(st.sampled_from(["success", "failure", "partial", ""])),
            user=draw(st.booleans()) and draw(st.booleans()), long_term=draw(st.booleans()) and draw(st.booleans()),
            compressed=draw(st.booleans()) and draw(st.booleans()), edges=draw(st.integers(0, 12)),
            retention=draw(st.one_of(st.none(), st.floats(0, 1)))))
        if rows[-1]["created_at"] > (rows[-1]["last_access"] or NOW):
            rows[-1]["created_at"] = rows[-1]["last_access"]
    names = [r["memory_id"] for r in rows]
    pairs = draw(st.lists(st.tuples(st.sampled_from(names), st.sampled_from(names)), max_size=3 * n))
    return rows, pairs


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(states(), st.sampled_from([None, 2, 5]), st.booleans(), st.integers(0, 2**32 - 1))
def test_running_twice_changes_nothing(state: tuple[list[dict[str, Any]], list[tuple[str, str]]],
                                       cap: int | None, with_vectors: bool, seed: int) -> None:
    rows, pairs = state
    config = SleepConfig(max_episodes=cap)
    # with vectors, dream phase B also connects recently active memories
    rng = np.random.default_rng(seed)
    vector_of = {r["memory_id"]: v / np.linalg.norm(v) for r, v in zip(rows, rng.standard_normal((len(rows), 3)),
                                                                       strict=True)}

    def vectors(ids_in_order: list[str]) -> dict[str, Any]:
        return {"vectors": np.array([vector_of[m] for m in ids_in_order])} if with_vectors else {}

    first = run(rows, pairs, config=config, inputs=vectors([r["memory_id"] for r in rows]))
    after, edges = apply_run(frame(rows), edge_list(pairs), list(first.events()))
    second = plan_sleep(SleepInputs(after, edges, **vectors(after["memory_id"].to_list())), now=NOW, config=config)
    assert second is not None
    leftover = [e for e in second.events() if not isinstance(e, STRUCTURAL)]
    # the second plan finds nothing to compress, prune, protect, re-score or review
    assert leftover == []
    assert second.report.memories_after == second.report.memories_before == first.report.memories_after
    # and the watermark stops it before it even plans
    assert plan_sleep(SleepInputs(after, edges), now=NOW, watermark=NOW) is None


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(states(), st.data())
def test_a_crashed_run_resumes_where_it_stopped(state: tuple[list[dict[str, Any]], list[tuple[str, str]]],
                                                data: st.DataObject) -> None:
    rows, pairs = state
    uncrashed = [encode_lifecycle(e) for e in run(rows, pairs).events()]
    crash_at = data.draw(st.integers(0, len(uncrashed) - 1))
    emitted = uncrashed[:crash_at]
    # the producer died after ``crash_at`` events (the last one maybe delivered twice); on restart it
    # re-plans from the same pre-run state and continues from the consumer's next seq
    redelivered = emitted + emitted[-1:]
    assembler = RunAssembler()
    assert assembler.feed([decode_lifecycle(b) for b in redelivered]) == []  # type: ignore[misc]
    resume_at = assembler.next_seq(run_id_for(NOW))
    assert resume_at == crash_at
    resumed = [encode_lifecycle(e) for e in run(rows, pairs).events(resume_at)]
    assert emitted + resumed == uncrashed
    done = assembler.feed([decode_lifecycle(b) for b in resumed])  # type: ignore[misc]
    assert len(done) == 1 and [encode_lifecycle(e) for e in done[0]] == uncrashed
    assert assembler.feed([decode_lifecycle(uncrashed[0])]) == []  # type: ignore[misc]  # a complete run is closed


def test_plans_do_not_depend_on_input_row_order() -> None:
    rng = random.Random(7)
    rows = [mem(f"m{k:02d}", agent="ab"[k % 2], idle=rng.uniform(0, 40), access=rng.randint(0, 5),
                importance=rng.random(), created=NOW - timedelta(hours=rng.randint(1, 2000))) for k in range(40)]
    for r in rows:
        r["created_at"] = min(r["created_at"], r["last_access"])
    pairs = [(f"m{rng.randint(0, 39):02d}", f"m{rng.randint(0, 39):02d}") for _ in range(60)]
    a = [encode_lifecycle(e) for e in run(rows, pairs, config=SleepConfig(max_episodes=10)).events()]
    rng.shuffle(rows)
    rng.shuffle(pairs)
    b = [encode_lifecycle(e) for e in run(rows, pairs, config=SleepConfig(max_episodes=10)).events()]
    assert a == b


# --- the schedule on event time ---------------------------------------------------------------------


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=timezone.utc)


def test_fire_times_are_strictly_between() -> None:
    got, dropped = fire_times("0 3 * * *", utc(2024, 5, 1, 3), utc(2024, 5, 4, 3))
    assert got == [utc(2024, 5, 2, 3), utc(2024, 5, 3, 3)] and dropped == 0
    assert fire_times("0 */6 * * *", utc(2024, 5, 1, 0), utc(2024, 5, 1, 13))[0] == [utc(2024, 5, 1, 6),
                                                                                     utc(2024, 5, 1, 12)]


def test_fire_times_follow_the_schedule_zone_across_dst() -> None:
    got, _ = fire_times("0 3 * * *", utc(2024, 3, 8), utc(2024, 3, 12), tz="America/New_York")
    assert got == [utc(2024, 3, 8, 8), utc(2024, 3, 9, 8), utc(2024, 3, 10, 7), utc(2024, 3, 11, 7)]
    # 02:30 does not exist on the day DST starts: that run happens at 03:00 local, once
    spring, _ = fire_times("30 2 * * *", utc(2024, 3, 9, 12), utc(2024, 3, 11, 12), tz="America/New_York")
    assert spring == [utc(2024, 3, 10, 7), utc(2024, 3, 11, 6, 30)]


def test_catch_up_is_limited_to_the_last_runs() -> None:
    got, dropped = fire_times("0 3 * * *", utc(2024, 1, 1), utc(2024, 2, 1), limit=7)
    assert got[0] == utc(2024, 1, 25, 3) and got[-1] == utc(2024, 1, 31, 3) and dropped == 24


def test_advance_drives_runs_from_stream_time() -> None:
    clock, due, _ = advance(SleepClock(), utc(2024, 5, 1, 10))
    assert due == [] and clock.last_fired == utc(2024, 5, 1, 10)  # no runs before the stream began
    clock, due, _ = advance(clock, utc(2024, 5, 2, 3))
    assert due == []  # an event exactly at the fire time still belongs to that window
    clock, due, _ = advance(clock, utc(2024, 5, 2, 3, 0, 1))
    assert due == [utc(2024, 5, 2, 3)]
    clock, due, _ = advance(clock, utc(2024, 5, 1, 23))  # a late event: nothing more
    assert due == [] and clock.last_fired == utc(2024, 5, 2, 3)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(0, 10 * 24 * 60), min_size=1, max_size=30))
def test_replay_in_any_batching_fires_the_same_runs(minutes: list[int]) -> None:
    times = [utc(2024, 5, 1) + timedelta(minutes=m) for m in sorted(minutes)]
    config = SleepConfig(max_catch_up=1000)
    clock, live = SleepClock(), []
    for t in times:
        clock, due, _ = advance(clock, t, config)
        live += due
    # a replay sees the same records in the same order: only first and last matter for what fires
    replay_clock, _, _ = advance(SleepClock(), times[0], config)
    _, replayed, _ = advance(replay_clock, times[-1], config)
    assert live == replayed
    assert all(times[0] < f < times[-1] for f in live)


def test_schedule_validation_and_naive_times() -> None:
    assert validate_schedule("0 */6 * * *") == "0 */6 * * *"
    with pytest.raises(ValueError, match="invalid sleep schedule"):
        validate_schedule("61 3 * * *")
    with pytest.raises(ValueError, match="timezone-aware"):
        advance(SleepClock(utc(2024, 5, 1)), datetime(2024, 5, 2))
    with pytest.raises(ValueError, match="timezone-aware"):
        plan_sleep(SleepInputs(frame([mem("m")])), now=datetime(2024, 5, 2))


def test_schedule_off_never_fires_but_the_clock_still_starts() -> None:
    assert validate_schedule(" OFF ") == "off"
    config = SleepConfig(schedule=validate_schedule("off"))
    clock, due, _ = advance(SleepClock(), utc(2024, 5, 1), config)
    assert clock.last_fired == utc(2024, 5, 1) and due == []
    later, due, dropped = advance(clock, utc(2024, 9, 1), config)
    assert (later, due, dropped) == (clock, [], 0)
    # the same span under the default schedule would have fired (so the test can fail)
    assert advance(clock, utc(2024, 9, 1), SleepConfig())[1]


# --- dreaming inside the run, reviews and the report --------------------------------------------


def test_dream_phase_a_refreshes_the_memories_it_clusters_into() -> None:
    rows = [mem("kept", idle=20), mem("other", idle=20)]
    vectors = np.array([[1.0, 0.0], [0.0, 1.0]])
    observations = pl.DataFrame({"observation_id": ["o1"], "agent": ["a"], "observed_at": [NOW - timedelta(hours=2)]},
                                schema={"observation_id": pl.String, "agent": pl.String,
                                        "observed_at": pl.Datetime("us", "UTC")})
    plan = run(rows, [("kept", "other")] * 0, config=SleepConfig(coverage_bins=()), inputs={
        "vectors": vectors, "observations": observations, "observation_vectors": np.array([[1.0, 0.0]])})
    assert [(e.observation_id, e.memory_id) for e in of(plan, ObservationClustered)] == [("o1", "kept")]
    assert ids(of(plan, MemoryPruned)) == ["other"]  # "kept" was just reinforced: not idle any more
    events = list(plan.events())
    first_prune = next(e.seq for e in events if isinstance(e, MemoryPruned))
    assert next(e.seq for e in events if isinstance(e, ObservationClustered)) < first_prune


def test_only_due_survivors_are_reviewed() -> None:
    rows = [mem("new", idle=0.5, access=2), mem("gone", idle=30, importance=0.0),
            {**mem("recent", idle=0.5), "stability": 10.0, "difficulty": 5.0, "last_review": NOW - 7 * DAY},
            {**mem("due", idle=0.5), "stability": 10.0, "difficulty": 5.0, "last_review": NOW - 8 * DAY}]
    plan = run(rows, config=SleepConfig(coverage_bins=()))
    reviews = {e.memory_id: e for e in of(plan, ReviewScheduled)}
    assert sorted(reviews) == ["due", "new"]
    assert reviews["new"].rating == 3 and reviews["new"].due_at == NOW + timedelta(days=reviews["new"].interval_days)
    assert reviews["due"].elapsed_days == 8.0


def test_report_counts_bytes_and_fiedler() -> None:
    rows = [mem(f"p{k}", idle=0.5) for k in range(5)] + [mem("old", idle=4.0), mem("stale", idle=30)]
    pairs = [(f"p{k}", f"p{k + 1}") for k in range(4)]
    plan = run(rows, pairs, config=SleepConfig(coverage_bins=()), inputs={"fiedler_history": (0.5, 0.45, 0.4)})
    r = plan.report
    assert (r.memories_before, r.memories_after, r.compressed, r.pruned, r.kept) == (7, 6, 1, 1, 5)
    assert r.bytes_before == 7 * 2500 and r.bytes_after == 5 * 2500 + of(plan, MemoryCompressed)[0].bytes_after
    assert r.per_layer == {"hippocampus": {"before": 7, "after": 6, "compressed": 1, "pruned": 1}}
    # survivors' live graph: the path p0..p4 (plus the compressed memory, isolated)
    assert r.fiedler.value == 0.0 and r.fiedler.components == 2 and r.fiedler.largest_size == 5
    assert r.fiedler.largest_component == pytest.approx(2 * (1 - math.cos(math.pi / 5)), rel=1e-6)
    assert r.fiedler.trend == "fragmenting"
    assert r.saturation.status == "insufficient"
    assert "6 of 7 memories kept" in r.narrative
    # the same report whether read before emitting (sizes computed on demand) or after (cached)
    fresh = run(rows, pairs, config=SleepConfig(coverage_bins=()), inputs={"fiedler_history": (0.5, 0.45, 0.4)})
    assert list(fresh.events())[-1].report == r == fresh.report


def test_history_figure_draws_counts_and_fiedler() -> None:
    pytest.importorskip("matplotlib", reason="matplotlib not installed yet (the lead adds it)")
    plan = run([mem("m")])
    fig = sleep.history_figure([(NOW, plan.report), (NOW + DAY, plan.report)])
    top, bottom = fig.axes
    assert len(top.lines) == 4 and len(bottom.lines) == 1


# --- the wire ------------------------------------------------------------------------------------------


def test_every_event_of_a_run_round_trips() -> None:
    rows = [mem("ui", idle=20, user=True, keys=["k"] * 3), mem("old", idle=4), mem("stale", idle=30)]
    plan = run(rows, inputs={"triples": pl.DataFrame({"triple_id": ["t"], "valid_to": [NOW - 100 * DAY]})},
               promotion=lambda v: [v.promoted("ui", "a", "c"), v.carried("concept_created", b'{"x":1}')],
               config=SleepConfig(coverage_bins=()))
    events = list(plan.events())
    kinds = {type(e).__name__ for e in events}
    assert {"MemoryProtected", "MemoryCompressed", "MemoryPruned", "MemoryRescored", "TripleRetired",
            "DecisionCarried", "ReviewScheduled"} <= kinds
    for e in events:
        assert decode_lifecycle(encode_lifecycle(e)) == e
    req = SleepRequested(at=NOW, requested_by="cli")
    assert decode_lifecycle(encode_lifecycle(req)) == req
    assert encode_lifecycle(events[0]).startswith(b'{"kind":"sleep_started"')


@settings(max_examples=100, deadline=None)
@given(st.builds(MemoryPruned, run_id=st.text(min_size=1), seq=st.integers(0, 2**40),
                 at=st.datetimes(timezones=st.just(timezone.utc)), memory_id=st.text(min_size=1), agent=st.text(),
                 layer=st.text(), reason=st.sampled_from(PruneReason), retention=st.floats(0, 1),
                 idle_days=st.floats(0, 1e6)))
def test_pruned_round_trip(ev: MemoryPruned) -> None:
    assert decode_lifecycle(encode_lifecycle(ev)) == ev


def test_rescoring_only_when_the_score_moved() -> None:
    base = mem("m", idle=0.5, access=1)
    score = run([base]).report and of(run([base]), MemoryRescored)[0].retention
    assert of(run([{**base, "retention": score + 0.049}]), MemoryRescored) == []
    moved = of(run([{**base, "retention": score + 0.05}]), MemoryRescored)
    assert [(e.retention, e.previous) for e in moved] == [(score, pytest.approx(score + 0.05))]


def test_sleep_trigger_is_recorded() -> None:
    plan = run([mem("m")], trigger=SleepTrigger.ON_DEMAND)
    started = next(plan.events())
    assert isinstance(started, SleepStarted) and started.trigger == SleepTrigger.ON_DEMAND
    assert started.config == SleepConfig().digest() != SleepConfig(max_episodes=3).digest()


# --- benchmark -----------------------------------------------------------------------------------------


def synthetic(n: int, *, per_agent: int = 1000, degree: int = 3, seed: int = 0) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Synthetic memory columns and an edge list (``degree`` edges a memory, within its agent)."""
    rng = np.random.default_rng(seed)
    base = int(NOW.timestamp() * 1_000_000)
    created = base - rng.integers(0, 40 * 86_400_000_000, n)
    last = np.maximum(created, base - rng.exponential(5 * 86_400_000_000, n).astype(np.int64))
    agent = np.arange(n) // per_agent
    memories = pl.DataFrame({
        "memory_id": pl.int_range(0, n, eager=True).cast(pl.String).str.zfill(9),
        "agent": pl.Series(agent).cast(pl.String),
        "layer": pl.Series(rng.choice(["hippocampus"] * 8 + ["atl", "angular_gyrus"], n)),
        "created_at": pl.Series(created).cast(pl.Datetime("us", "UTC")),
        "last_access": pl.Series(last).cast(pl.Datetime("us", "UTC")),
        "access_count": rng.poisson(2, n), "importance": rng.random(n),
        "outcome": rng.choice(["success", "failure", "partial", ""], n, p=[0.3, 0.3, 0.1, 0.3]),
        "is_user_interaction": rng.random(n) < 0.05, "edge_count": np.zeros(n, dtype=np.int64),
        "size_bytes": rng.integers(1500, 3500, n), "long_term": np.zeros(n, dtype=bool),
    }).with_columns(pl.concat_list(pl.lit("tool:").add(pl.col("agent")), pl.lit("error:timeout")).alias("index_keys"),
                    pl.Series("domain", rng.choice(["web", "db", ""], n)))
    src = rng.integers(0, n, degree * n)
    dst = (src // per_agent) * per_agent + rng.integers(0, per_agent, len(src))
    dst = np.minimum(dst, n - 1)
    ids = memories["memory_id"]
    edges = pl.DataFrame({"src": ids.gather(src), "dst": ids.gather(dst), "weight": rng.random(len(src))})
    return memories, edges


def bench(n: int, repeat: int, config: SleepConfig = SleepConfig()) -> None:
    memories, edges = synthetic(n)
    plan_times, emit_times = [], []
    plan = None
    for _ in range(repeat):
        t0 = time.perf_counter()
        plan = plan_sleep(SleepInputs(memories, edges), now=NOW, config=config)
        t1 = time.perf_counter()
        assert plan is not None
        count = sum(len(encode_lifecycle(e)) > 0 for e in plan.events())
        emit_times.append(time.perf_counter() - t1)
        plan_times.append(t1 - t0)
    assert plan is not None
    print(f"memories={n} edges={edges.height} events={count} counts={plan.counts}")
    print(f"plan median {sorted(plan_times)[len(plan_times) // 2]:.2f}s (runs {[round(t, 2) for t in plan_times]}); "
          f"build+encode events median {sorted(emit_times)[len(emit_times) // 2]:.2f}s")
    print(plan.report.narrative)


if __name__ == "__main__":
    size = int(sys.argv[sys.argv.index("--bench") + 1]) if "--bench" in sys.argv else 1_000_000
    reps = int(sys.argv[sys.argv.index("--repeat") + 1]) if "--repeat" in sys.argv else 3
    # --no-cap: no maxEpisodes, so the graph stays large (the Fiedler value's worst case here)
    bench(size, reps, SleepConfig(max_episodes=None) if "--no-cap" in sys.argv else SleepConfig())


def test_idle_time_runs_to_the_scopes_stream_time_never_past_the_run() -> None:
    # Ten idle days at the run's time, but the memory's scope saw its last event nine days ago: one idle day.
    behind = NOW - 9 * DAY
    rows = [{**mem("own-time", idle=10.0), "stream_time": behind},
            {**mem("run-time", idle=10.0), "stream_time": None},  # no stream time: the run's
            {**mem("ahead", idle=10.0), "stream_time": NOW + 5 * DAY}]  # a stream time past the run: the run's
    plan = run(rows, config=SleepConfig(coverage_bins=()))
    assert sorted(ids(of(plan, MemoryPruned))) == ["ahead", "run-time"]
    assert ids(of(plan, MemoryCompressed)) == []  # one idle day: nothing to compress either
    rescored = {e.memory_id: e.retention for e in of(plan, MemoryRescored)}
    assert rescored["own-time"] == float(retention_scores(np.array([0]), np.array([1.0]), np.array([0]),
                                                          np.array([0.5]), np.array([0.6]), 7.0)[0])
