"""The spine end to end against the real broker, real Faust workers and the real DuckDB file."""

from __future__ import annotations

import dataclasses
import json
import random
import subprocess
import sys
import time
import warnings
from collections import Counter
from pathlib import Path

import orjson
import pytest

from somnus.importers import openai_chat
from somnus.projections.schema import CONTENT_COLUMNS
from somnus.sample import generate
from tests.pipeline import ORDER_DEPENDENT, SEMANTIC, Pipeline, took_a_timed_decision, wait_until

pytestmark = pytest.mark.integration

CONTENT_TABLES = ("events", "episodes", "lessons")
# The SIGKILL test compares every table (CONTENT_COLUMNS) with a kill-free run's. Two kill-free runs are
# now equal in every table (test_determinism.py asserts it), and this test's runs of 2026-11-28 were
# equal in every table (3 of 3). But a worker restart can still change the order the worker writes
# memory units, facts and observations in: in a diagnostic with 2-3 worker SIGKILLs 0.5-3 s apart, 2
# of 6 runs parted from their reference (at units 1,280 and 1,496 of 1,500), cause not yet found
# (docs/design/scale-out.md, "Twenty-third session"). So the order-dependent folds and what is built
# on them may differ, reported as a warning; any other table that differs fails the test.
DIFFER_AFTER_A_WORKER_RESTART = ORDER_DEPENDENT | SEMANTIC


def test_tau_bench_transcripts_become_200_episodes(pipeline_settings, tau_bench_path):
    p = Pipeline(pipeline_settings)
    try:
        p.start_all()
        events = list(openai_chat(tau_bench_path, agent="airline"))
        assert p.publish(events) == len(events)
        p.wait_idle()
        p.stop_all()
        outcomes = dict(p.query("SELECT outcome, count(*) FROM episodes GROUP BY 1"))
        assert outcomes == {"success": 84, "failure": 116}
        assert p.query("SELECT count(DISTINCT episode_id), count(*) FROM episodes")[0] == (200, 200)
        assert p.query("SELECT count(*) FROM events")[0][0] == len(events)
        # outcomes match the source file trajectory by trajectory
        source = json.loads(tau_bench_path.read_bytes())
        expected = {
            f"{tau_bench_path.stem}-task{t['task_id']}-trial{t['trial']}": (
                "success" if t["reward"] >= 1.0 else "failure"
            )
            for t in source
        }
        got = dict(p.query("SELECT session_id, outcome FROM episodes"))
        assert got == expected
        # tool errors that were never resolved became failure lessons naming the tool
        assert p.query("SELECT count(*) FROM lessons WHERE kind = 'failure' AND tool IS NOT NULL")[0][0] > 0
    finally:
        p.stop_all()


def _reference(settings, events, tmp_path: Path, bundle_max: int) -> tuple[dict[str, str], list[str]]:
    """The no-crash result of the same input, through its own pipeline, and the timing-dependent
    decisions it said it took."""
    ref = dataclasses.replace(
        settings,
        topic_prefix=settings.topic_prefix + "ref.",
        app_id=settings.app_id + "-ref",
        home=tmp_path / "ref-home",
        db_path=tmp_path / "ref.duckdb",
    )
    p = Pipeline(ref)
    try:
        p.start_all()
        p.publish(events, bundle_max=bundle_max)
        p.wait_idle()
        return p.checksum()["tables"], took_a_timed_decision(ref.run_dir)
    finally:
        p.stop_all()


def test_sigkill_worker_and_projector_at_random_points(pipeline_settings, tmp_path):
    events = list(generate(sessions=1500, seed=11))  # ~20 hours of stream time on each partition
    # 30 sessions whose runtime died before the end, closed as abandoned after an hour of stream time
    # without an event; and closed sessions forgotten after an hour (somnus.processors.sessions.session_retention): the markers
    # removed, their working memory with them, and the abandoned episodes must not depend on where
    # the crashes fell.
    ids = sorted({e["session_id"] for e in events})
    unended = set(random.Random(7).sample(ids[:1200], 30))
    events = [e for e in events if not (e["session_id"] in unended and e["type"] == "session_end")]
    pipeline_settings = dataclasses.replace(pipeline_settings, session_retention_s=3600.0, session_idle_s=3600.0)
    reference, timed = _reference(pipeline_settings, events, tmp_path, bundle_max=4)
    rng = random.Random(2024)
    p = Pipeline(pipeline_settings)
    try:
        p.start_all()
        # The whole input first, as in the reference: the sequencer's merge of the trace partitions
        # releases a quiet partition's records, so an input published in pauses (chunks with sleeps
        # between) is ordered by when it arrived, and differs from the reference in 18 tables with
        # no kill at all (measured 2026-11-26). The crashes are the one difference between the runs.
        p.publish(events, bundle_max=4)
        wait_until(lambda: p.status()["counts"].get("episodes", 0) > 0, timeout_s=120, what="first episodes")
        kills = Counter()
        while kills["worker"] < 2 or kills["projector"] < 2:
            # let the pipeline get into the middle of something, then kill without warning
            time.sleep(rng.uniform(0.5, 3.0))
            victims = rng.choice([("worker",), ("projector",), ("worker", "projector")])
            for v in victims:
                p.kill(v)
                kills[v] += 1
            for v in victims:
                p.start(v)
        # Every restart is a rebalance; the pipeline must drain on its own afterwards (no supervisor
        # restarts: see streams/liveness.py for the two stalls this used to hit).
        p.wait_idle(timeout_s=240)
        crashed = p.checksum()["tables"]
        assert set(crashed) == set(reference) == set(CONTENT_COLUMNS)  # every projection, none left out
        differing = sorted(t for t in CONTENT_COLUMNS if crashed[t] != reference[t])
        assert set(differing) <= DIFFER_AFTER_A_WORKER_RESTART, sorted(set(differing) - DIFFER_AFTER_A_WORKER_RESTART)
        if differing:  # named in the test's output, never passed over
            timed += took_a_timed_decision(pipeline_settings.run_dir)
            warnings.warn(
                f"different from the kill-free run: {', '.join(differing)}"
                + (f" (a run took a timed decision: {timed[0]!r})" if timed else ""),
                stacklevel=1,
            )
        p.stop_all()
        n_sessions = len({e["session_id"] for e in events})
        # the working memory of sessions closed over an hour (stream time) before the end was removed
        assert 0 < p.query("SELECT count(*) FROM working_memory")[0][0] < n_sessions / 4
        assert p.query("SELECT count(DISTINCT episode_id), count(*) FROM episodes")[0] == (n_sessions, n_sessions)
        assert p.query(
            "SELECT count(DISTINCT episode_id) FROM lessons WHERE text LIKE '%abandoned: no event for "
            "3600 s of stream time%'"
        )[0][0] == len(unended)
        assert p.query("SELECT count(*) FROM events")[0][0] == len(events)
        assert p.query("SELECT count(*) FROM dead_letters")[0][0] == 0
    finally:
        p.stop_all()


def test_a_stalled_pipeline_reports_each_workers_tasks_threads_and_consumer_state(pipeline_settings):
    # What a test that times out waiting for idle appends to its failure (Pipeline.diagnose): the
    # worker's own dump of where it waits. A worker stalled once in CI, and its log was gone.
    p = Pipeline(pipeline_settings)
    try:
        p.start("worker")
        wait_until(lambda: bool(_faust_assignment(p)), timeout_s=120, what="the worker's first assignment")
        report = p.diagnose()
        assert p.procs["worker"].poll() is None  # the signals are handled, not fatal
        for part in (
            "--- worker.log (end) ---",
            "=== asyncio tasks: main loop",
            "=== asyncio tasks: consumer thread loop",
            "=== agents",
            "--- agent ",
            "=== threads",
            "--- consumer state",
            "--- recovery: in_recovery ",
            "    metadata of ",
            "_committed_offset = ",
            "_commit_fut = ",
            "--- producer: in flight",
            "--- producer client: ",
            "--- consumer client: ",
            "conn (",
        ):
            assert part in report, (part, report[-3000:])
    finally:
        p.stop_all()


def _faust_assignment(p: Pipeline) -> dict[str, set[int]]:
    """Which trace partitions each live worker says it owns (written after every rebalance)."""
    out = {}
    for name, proc in p.procs.items():
        path = p.s.run_dir / f"{name}.assignment.json"
        if name.startswith("worker") and proc.poll() is None and path.exists():
            out[name] = set(json.loads(path.read_text())["partitions"])
    return out


def _two_workers(p: Pipeline, partitions: int) -> None:
    p.start("projector")
    p.start("worker-a")
    p.start("worker-b")

    def split() -> bool:
        parts = list(_faust_assignment(p).values())
        return (
            len(parts) == 2
            and all(parts)
            and not (parts[0] & parts[1])
            and parts[0] | parts[1] == set(range(partitions))
        )

    wait_until(split, timeout_s=120, what="two workers sharing the partitions")


def test_two_workers_split_the_partitions(pipeline_settings, tmp_path):
    events = list(generate(sessions=1200, seed=5))
    reference, _ = _reference(pipeline_settings, events, tmp_path, bundle_max=8)
    p = Pipeline(pipeline_settings)
    try:
        _two_workers(p, pipeline_settings.partitions)
        p.publish(events, bundle_max=8)
        p.wait_idle(timeout_s=180)
        got = p.checksum()["tables"]
        for table in CONTENT_TABLES:
            assert got[table] == reference[table], table
    finally:
        p.stop_all()


def test_killing_a_worker_hands_its_partitions_to_the_other(pipeline_settings, tmp_path):
    """Issue 30: one of two workers SIGKILLed mid-run (and not started again): the group rebalances
    every trace partition to the survivor, which restores the killed one's tables (open sessions,
    working memory) from their changelogs; every published session's episode is projected exactly
    once, and the events, episodes, lessons and working memory equal a one-worker run's."""
    events = list(generate(sessions=1200, seed=5))
    reference, _ = _reference(pipeline_settings, events, tmp_path, bundle_max=8)
    p = Pipeline(pipeline_settings)
    try:
        _two_workers(p, pipeline_settings.partitions)
        half = len(events) // 2
        p.publish(events[:half], bundle_max=8)
        wait_until(lambda: p.status()["counts"].get("episodes", 0) > 0, timeout_s=120, what="first episodes")
        p.kill("worker-a")

        def one_owner() -> bool:
            a = _faust_assignment(p)
            return len(a) == 1 and next(iter(a.values())) == set(range(pipeline_settings.partitions))

        p.publish(events[half:], bundle_max=8)
        p.wait_until(one_owner, timeout_s=120, what="the survivor owning every partition")
        p.wait_idle(timeout_s=120)
        got = p.checksum()["tables"]
        for table in (*CONTENT_TABLES, "working_memory"):
            assert got[table] == reference[table], table
        p.stop_all()
        sessions = {e["session_id"] for e in events}
        assert p.query("SELECT count(DISTINCT session_id), count(*) FROM episodes")[0] == (len(sessions), len(sessions))
        assert {r[0] for r in p.query("SELECT session_id FROM episodes")} == sessions
    finally:
        p.stop_all()


def _malformed(i: int, good: dict) -> bytes:
    kind = i % 5
    if kind == 0:
        return b"\x00\xffnot json at all " + str(i).encode()
    if kind == 1:
        bad = dict(good, seq="seven")
        return orjson.dumps(bad)
    if kind == 2:
        bad = {k: v for k, v in good.items() if k != "payload"}
        return orjson.dumps(bad)
    if kind == 3:
        return orjson.dumps(dict(good, type="teleport"))
    return orjson.dumps(dict(good, payload={"text": "x" * 70_000}, type="user_message"))


def test_10000_malformed_events_go_to_dead_letters_while_good_ones_flow(pipeline_settings):
    settings = dataclasses.replace(pipeline_settings, max_event_bytes=65_536)
    good = list(generate(sessions=600, seed=3))
    template = good[0]
    bad = [_malformed(i, dict(template, session_id=f"bad-{i}")) for i in range(10_000)]
    # interleave: good events keep flowing between the bad ones
    mixed: list = []
    gi = 0
    for i, b in enumerate(bad):
        mixed.append(b)
        if i % 2 == 0 and gi < len(good):
            mixed.append(good[gi])
            gi += 1
    mixed.extend(good[gi:])
    p = Pipeline(settings)
    try:
        p.start_all()
        p.publish(mixed, bundle_max=1)
        st = p.wait_idle(timeout_s=300)
        assert st["dead_letters"] == 10_000
        assert st["dead_letter_kinds"] == {"undecodable": 2000, "schema": 6000, "oversized": 2000}
        assert st["counts"]["events"] == len(good)
        assert st["counts"]["episodes"] == len({e["session_id"] for e in good})
        p.stop_all()
        rows = p.query("SELECT reason, original FROM dead_letters WHERE reason LIKE 'schema:%$.seq%' LIMIT 1")
        assert rows and b"seven" in rows[0][1]
        # the original bytes are kept exactly
        originals = {r[0] for r in p.query("SELECT original FROM dead_letters")}
        assert originals == set(bad)
    finally:
        p.stop_all()


def test_replay_checksum_equals_live(pipeline_settings, tmp_path):
    p = Pipeline(pipeline_settings)
    try:
        p.start_all()
        p.publish(list(generate(sessions=400, seed=9)))
        p.publish([b"{broken", orjson.dumps({"event_id": "nope"})], bundle_max=1)
        p.wait_idle()
        live = p.checksum()  # served by the running projector (it holds the file)
        env = {**p.s.as_env(), "KAFKA_BOOTSTRAP": p.boot}
        replay_db = tmp_path / "replayed.duckdb"
        cli = [sys.executable, "-m", "somnus.cli"]
        run = subprocess.run(
            cli + ["replay", "--to", str(replay_db)], env=env, capture_output=True, text=True, timeout=300
        )
        assert run.returncode == 0, run.stderr
        assert "time by stage: " in run.stdout and "decode " in run.stdout  # where the replay's time went
        out = subprocess.run(
            cli + ["checksum", "--db", str(replay_db), "--json"], env=env, capture_output=True, text=True
        )
        assert out.returncode == 0, out.stderr
        replayed = json.loads(out.stdout)
        differ = {t: (live["tables"].get(t), v) for t, v in replayed["tables"].items() if live["tables"].get(t) != v}
        assert replayed["checksum"] == live["checksum"], differ
        live_cli = subprocess.run(cli + ["checksum"], env=env, capture_output=True, text=True)
        assert live_cli.stdout.split()[0] == live["checksum"]
        assert live["tables"]["dead_letters"].startswith("2:")
        # somnus sql and status through the running projector
        sql = subprocess.run(
            cli + ["sql", "SELECT count(*) AS n FROM episodes", "--json"], env=env, capture_output=True, text=True
        )
        assert json.loads(sql.stdout)[0]["n"] == 400
        refused = subprocess.run(cli + ["sql", "DELETE FROM episodes"], env=env, capture_output=True, text=True)
        assert refused.returncode != 0 and "only a SELECT" in refused.stderr
        st = json.loads(subprocess.run(cli + ["status", "--json"], env=env, capture_output=True, text=True).stdout)
        assert st["idle"] is True and set(st["lag"]) == set(p.s.projected_topics)
        assert all(v == 0 for v in st["lag"].values())
    finally:
        p.stop_all()
