"""somnus.processors.sleep.plan: phase order, watermark idempotence, crash and resume, determinism,
dream phase A inside the run, reviews and the wire.

Benchmark (synthetic columns, see ``bench``):
    .venv/bin/python -m tests.processors.sleep.test_plan --bench 1000000 --repeat 3
"""

from __future__ import annotations

import doctest
import random
import sys
import time
from collections.abc import Sequence
from datetime import timedelta, timezone
from typing import Any

import numpy as np
import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from somnus.processors.sleep import plan
from somnus.processors.sleep.config import (
    SleepConfig,
)
from somnus.processors.sleep.plan import RunAssembler, SleepInputs, SleepView, apply_run, plan_sleep
from somnus.processors.sleep.schedule import (
    run_id_for,
)
from somnus.schemas import lifecycle
from somnus.schemas.lifecycle import (
    PHASE_ORDER,
    MemoryPromoted,
    MemoryPruned,
    MemoryRefined,
    ObservationClustered,
    ObservationCreated,
    ObservationHeld,
    PruneReason,
    ReviewScheduled,
    RunEvent,
    SleepCompleted,
    SleepPhase,
    SleepPhaseCompleted,
    SleepRequested,
    SleepStarted,
    SleepTrigger,
    decode_lifecycle,
    encode_lifecycle,
)
from tests.processors.sleep.memories import DAY, NOW, STRUCTURAL, edge_list, frame, ids, mem, of, run


def test_doctests() -> None:
    assert doctest.testmod(plan).failed == 0
    assert doctest.testmod(lifecycle).failed == 0


# --- order of phases ------------------------------------------------------------------------------------


def test_phases_run_in_order_and_promotion_sees_the_slept_hippocampus() -> None:
    rows = [
        mem("old-ep", idle=30),
        mem("ep", idle=0.5),
        mem("old-concept", layer="atl", idle=40),
        mem("concept", layer="atl", idle=1),
    ]
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
    assert (
        seq[("MemoryPruned", "old-ep")]
        < seq[("SleepPhaseCompleted", SleepPhase.HIPPOCAMPUS)]
        < seq[("MemoryPromoted", "ep")]
        < seq[("SleepPhaseCompleted", SleepPhase.PROMOTION)]
        < seq[("MemoryPruned", "old-concept")]
        < seq[("SleepPhaseCompleted", SleepPhase.CONSOLIDATION)]
        < seq[("BriefingRefreshed", None)]
        < seq[("SleepPhaseCompleted", SleepPhase.REFRESH)]
    )
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
        rows.append(
            mem(
                f"m{k:02d}",
                agent=draw(st.sampled_from(["a", "b"])),
                layer=draw(st.sampled_from(["hippocampus", "hippocampus", "atl", "angular_gyrus"])),
                created=NOW - timedelta(hours=draw(st.integers(1, 24 * 60))) if draw(st.booleans()) else None,
                idle=draw(st.one_of(st.none(), st.floats(0, 45))),
                access=draw(st.integers(0, 30)),
                importance=draw(st.floats(0, 1)),
                outcome=draw(st.sampled_from(["success", "failure", "partial", ""])),
                user=draw(st.booleans()) and draw(st.booleans()),
                long_term=draw(st.booleans()) and draw(st.booleans()),
                compressed=draw(st.booleans()) and draw(st.booleans()),
                edges=draw(st.integers(0, 12)),
                retention=draw(st.one_of(st.none(), st.floats(0, 1))),
            )
        )
        if rows[-1]["created_at"] > (rows[-1]["last_access"] or NOW):
            rows[-1]["created_at"] = rows[-1]["last_access"]
    names = [r["memory_id"] for r in rows]
    pairs = draw(st.lists(st.tuples(st.sampled_from(names), st.sampled_from(names)), max_size=3 * n))
    return rows, pairs


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(states(), st.sampled_from([None, 2, 5]), st.booleans(), st.integers(0, 2**32 - 1))
def test_running_twice_changes_nothing(
    state: tuple[list[dict[str, Any]], list[tuple[str, str]]], cap: int | None, with_vectors: bool, seed: int
) -> None:
    rows, pairs = state
    config = SleepConfig(max_episodes=cap)
    # with vectors, dream phase B also connects recently active memories
    rng = np.random.default_rng(seed)
    vector_of = {
        r["memory_id"]: v / np.linalg.norm(v) for r, v in zip(rows, rng.standard_normal((len(rows), 3)), strict=True)
    }

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
def test_a_crashed_run_resumes_where_it_stopped(
    state: tuple[list[dict[str, Any]], list[tuple[str, str]]], data: st.DataObject
) -> None:
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
    rows = [
        mem(
            f"m{k:02d}",
            agent="ab"[k % 2],
            idle=rng.uniform(0, 40),
            access=rng.randint(0, 5),
            importance=rng.random(),
            created=NOW - timedelta(hours=rng.randint(1, 2000)),
        )
        for k in range(40)
    ]
    for r in rows:
        r["created_at"] = min(r["created_at"], r["last_access"])
    pairs = [(f"m{rng.randint(0, 39):02d}", f"m{rng.randint(0, 39):02d}") for _ in range(60)]
    a = [encode_lifecycle(e) for e in run(rows, pairs, config=SleepConfig(max_episodes=10)).events()]
    rng.shuffle(rows)
    rng.shuffle(pairs)
    b = [encode_lifecycle(e) for e in run(rows, pairs, config=SleepConfig(max_episodes=10)).events()]
    assert a == b


# --- dreaming inside the run, reviews and the report --------------------------------------------


def test_dream_phase_a_refreshes_the_memories_it_clusters_into() -> None:
    rows = [mem("kept", idle=20), mem("other", idle=20)]
    vectors = np.array([[1.0, 0.0], [0.0, 1.0]])
    observations = pl.DataFrame(
        {"observation_id": ["o1"], "agent": ["a"], "observed_at": [NOW - timedelta(hours=2)]},
        schema={"observation_id": pl.String, "agent": pl.String, "observed_at": pl.Datetime("us", "UTC")},
    )
    plan = run(
        rows,
        [("kept", "other")] * 0,
        config=SleepConfig(coverage_bins=()),
        inputs={"vectors": vectors, "observations": observations, "observation_vectors": np.array([[1.0, 0.0]])},
    )
    assert [(e.observation_id, e.memory_id) for e in of(plan, ObservationClustered)] == [("o1", "kept")]
    assert ids(of(plan, MemoryPruned)) == ["other"]  # "kept" was just reinforced: not idle any more
    events = list(plan.events())
    first_prune = next(e.seq for e in events if isinstance(e, MemoryPruned))
    assert next(e.seq for e in events if isinstance(e, ObservationClustered)) < first_prune


def test_only_due_survivors_are_reviewed() -> None:
    rows = [
        mem("new", idle=0.5, access=2),
        mem("gone", idle=30, importance=0.0),
        {**mem("recent", idle=0.5), "stability": 10.0, "difficulty": 5.0, "last_review": NOW - 7 * DAY},
        {**mem("due", idle=0.5), "stability": 10.0, "difficulty": 5.0, "last_review": NOW - 8 * DAY},
    ]
    plan = run(rows, config=SleepConfig(coverage_bins=()))
    reviews = {e.memory_id: e for e in of(plan, ReviewScheduled)}
    assert sorted(reviews) == ["due", "new"]
    assert reviews["new"].rating == 3 and reviews["new"].due_at == NOW + timedelta(days=reviews["new"].interval_days)
    assert reviews["due"].elapsed_days == 8.0


# --- the wire ------------------------------------------------------------------------------------------


def test_every_event_of_a_run_round_trips() -> None:
    rows = [mem("ui", idle=20, user=True, keys=["k"] * 3), mem("old", idle=4), mem("stale", idle=30)]
    plan = run(
        rows,
        inputs={"triples": pl.DataFrame({"triple_id": ["t"], "valid_to": [NOW - 100 * DAY]})},
        promotion=lambda v: [v.promoted("ui", "a", "c"), v.carried("concept_created", b'{"x":1}')],
        config=SleepConfig(coverage_bins=()),
    )
    events = list(plan.events())
    kinds = {type(e).__name__ for e in events}
    assert {
        "MemoryProtected",
        "MemoryCompressed",
        "MemoryPruned",
        "MemoryRescored",
        "TripleRetired",
        "DecisionCarried",
        "ReviewScheduled",
    } <= kinds
    for e in events:
        assert decode_lifecycle(encode_lifecycle(e)) == e
    req = SleepRequested(at=NOW, requested_by="cli")
    assert decode_lifecycle(encode_lifecycle(req)) == req
    assert encode_lifecycle(events[0]).startswith(b'{"kind":"sleep_started"')


@settings(max_examples=100, deadline=None)
@given(
    st.builds(
        MemoryPruned,
        run_id=st.text(min_size=1),
        seq=st.integers(0, 2**40),
        at=st.datetimes(timezones=st.just(timezone.utc)),
        memory_id=st.text(min_size=1),
        agent=st.text(),
        layer=st.text(),
        reason=st.sampled_from(PruneReason),
        retention=st.floats(0, 1),
        idle_days=st.floats(0, 1e6),
    )
)
def test_pruned_round_trip(ev: MemoryPruned) -> None:
    assert decode_lifecycle(encode_lifecycle(ev)) == ev


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
    memories = pl.DataFrame(
        {
            "memory_id": pl.int_range(0, n, eager=True).cast(pl.String).str.zfill(9),
            "agent": pl.Series(agent).cast(pl.String),
            "layer": pl.Series(rng.choice(["hippocampus"] * 8 + ["atl", "angular_gyrus"], n)),
            "created_at": pl.Series(created).cast(pl.Datetime("us", "UTC")),
            "last_access": pl.Series(last).cast(pl.Datetime("us", "UTC")),
            "access_count": rng.poisson(2, n),
            "importance": rng.random(n),
            "outcome": rng.choice(["success", "failure", "partial", ""], n, p=[0.3, 0.3, 0.1, 0.3]),
            "is_user_interaction": rng.random(n) < 0.05,
            "edge_count": np.zeros(n, dtype=np.int64),
            "size_bytes": rng.integers(1500, 3500, n),
            "long_term": np.zeros(n, dtype=bool),
        }
    ).with_columns(
        pl.concat_list(pl.lit("tool:").add(pl.col("agent")), pl.lit("error:timeout")).alias("index_keys"),
        pl.Series("domain", rng.choice(["web", "db", ""], n)),
    )
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
    print(
        f"plan median {sorted(plan_times)[len(plan_times) // 2]:.2f}s (runs {[round(t, 2) for t in plan_times]}); "
        f"build+encode events median {sorted(emit_times)[len(emit_times) // 2]:.2f}s"
    )
    print(plan.report.narrative)


if __name__ == "__main__":
    size = int(sys.argv[sys.argv.index("--bench") + 1]) if "--bench" in sys.argv else 1_000_000
    reps = int(sys.argv[sys.argv.index("--repeat") + 1]) if "--repeat" in sys.argv else 3
    # --no-cap: no maxEpisodes, so the graph stays large (the Fiedler value's worst case here)
    bench(size, reps, SleepConfig(max_episodes=None) if "--no-cap" in sys.argv else SleepConfig())


# --- dreaming fed by id (the fold's signatures) ---------------------------------------------------


def _dream_rows() -> tuple[list[dict[str, Any]], np.ndarray, pl.DataFrame, np.ndarray]:
    rows = [mem(f"m{k}", agent="a" if k % 2 else "b", idle=0.5) for k in range(8)]
    rng = np.random.default_rng(3)
    vectors = rng.normal(size=(8, 6))
    vectors[3] = vectors[1] + 0.3 * vectors[3]  # m1 and m3 (agent a) alike: connected
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    # o0 and o1 are near-copies of each other and far from every memory: o0 is created, o1 clusters into it
    far = -vectors.mean(axis=0)
    far /= np.linalg.norm(far)
    obs_vec = np.array([far, far + 0.001 * vectors[0], vectors[3] + 0.01 * vectors[1]])
    obs_vec /= np.linalg.norm(obs_vec, axis=1, keepdims=True)
    observations = pl.DataFrame(
        {
            "observation_id": ["o0", "o1", "o2"],
            "agent": ["a", "a", "a"],
            "observed_at": [NOW - timedelta(hours=3), NOW - timedelta(hours=2), NOW - timedelta(hours=1)],
        },
        schema={"observation_id": pl.String, "agent": pl.String, "observed_at": pl.Datetime("us", "UTC")},
    )
    return rows, vectors, observations, obs_vec


def test_an_observation_clustering_into_one_created_in_the_same_run_is_refined_not_a_crash() -> None:
    rows, vectors, observations, obs_vec = _dream_rows()
    plan = run(
        rows,
        config=SleepConfig(coverage_bins=()),
        inputs={"vectors": vectors, "observations": observations, "observation_vectors": obs_vec},
    )
    clustered = [(e.observation_id, e.memory_id) for e in of(plan, ObservationClustered)]
    assert ("o1", "o0") in clustered
    assert "o0" in {e.memory_id for e in of(plan, MemoryRefined)}


def test_vectors_by_id_decide_what_the_dense_vectors_decide() -> None:
    rows, vectors, observations, obs_vec = _dream_rows()
    by_id = {r["memory_id"]: v for r, v in zip(rows, vectors, strict=True)}
    by_id.update(zip(observations["observation_id"].to_list(), obs_vec, strict=True))
    asked: list[list[str]] = []

    def embed(ids: Sequence[str]) -> np.ndarray:
        asked.append(list(ids))
        return np.array([by_id[i] for i in ids])

    config = SleepConfig(coverage_bins=())
    dense = run(
        rows, config=config, inputs={"vectors": vectors, "observations": observations, "observation_vectors": obs_vec}
    )
    lazy = run(rows, config=config, inputs={"embed": embed, "observations": observations})
    assert [encode_lifecycle(e) for e in lazy.events()] == [encode_lifecycle(e) for e in dense.events()]
    assert dense.counts["connected"] > 0 and dense.counts["created"] > 0
    # asked one agent at a time, never for all memories at once
    agent_of = {r["memory_id"]: r["agent"] for r in rows}
    assert asked and all(len({agent_of[i] for i in ids if i in agent_of}) <= 1 for ids in asked)


def test_embed_must_return_one_row_per_id() -> None:
    rows, _, observations, _ = _dream_rows()
    with pytest.raises(ValueError, match="one row per id"):
        run(rows, inputs={"embed": lambda ids: np.zeros((1, 6)), "observations": observations})


def test_applying_a_run_keeps_an_observation_that_is_already_a_memory_once() -> None:
    rows, vectors, _, _ = _dream_rows()
    # the fold's case: the observations are memories captured since the last run
    observations = pl.DataFrame(
        {"observation_id": ["m1"], "agent": ["a"], "observed_at": [NOW - timedelta(hours=1)]},
        schema={"observation_id": pl.String, "agent": pl.String, "observed_at": pl.Datetime("us", "UTC")},
    )
    by_id = {r["memory_id"]: v for r, v in zip(rows, vectors, strict=True)}
    plan = run(
        rows,
        config=SleepConfig(coverage_bins=()),
        inputs={"embed": lambda ids: np.array([by_id[i] for i in ids]), "observations": observations},
    )
    routed = of(plan, ObservationCreated) + of(plan, ObservationClustered) + of(plan, ObservationHeld)
    assert [e.observation_id for e in routed] == ["m1"]
    assert all(getattr(e, "memory_id", None) != "m1" for e in of(plan, ObservationClustered))  # not into itself
    after, _ = apply_run(frame(rows), None, list(plan.events()))
    assert after["memory_id"].to_list().count("m1") == 1
