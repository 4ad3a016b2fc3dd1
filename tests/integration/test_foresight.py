"""somnus eval foresight on a slice of tau-bench, through the real broker, worker and projector."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import pytest

from somnus.foresight import run_foresight
from tests.tau_bench import tau_group

pytestmark = pytest.mark.integration

SESSIONS = 15


def raw_learnable(path: Path, n: int) -> tuple[int, int]:
    """Failed calls of the first n transcripts, and those whose (tool, kind of error) failed in an earlier
    one, counted from the raw file with tests/tau_bench.py's regexes (not the extractor's error_class)."""
    seen: set[tuple[str, str]] = set()
    failed = learnable = 0
    for traj in json.loads(path.read_bytes())[:n]:
        names, mine = {}, set()
        for m in traj["traj"]:
            for tc in m.get("tool_calls") or []:
                names[tc["id"]] = tc["function"]["name"]
            if m["role"] == "tool" and (m.get("content") or "").lstrip().lower().startswith("error"):
                key = (m.get("name") or names[m["tool_call_id"]], tau_group(m["content"].strip()))
                failed += 1
                learnable += key in seen
                mine.add(key)
        seen |= mine
    return failed, learnable


def test_foresight_of_15_tau_bench_sessions_through_the_pipeline(kafka_bootstrap, tau_bench_path, tmp_path):
    report = run_foresight(
        [tau_bench_path],
        "openai-chat",
        agent="airline",
        sessions=SESSIONS,
        home=tmp_path,
        bootstrap=kafka_bootstrap,
        details=True,
        timeout_s=300,
    )
    rows = report["per_session"]
    assert report["sessions"] == len(rows) == SESSIONS
    assert (report["failed_calls"], report["learnable"]) == raw_learnable(tau_bench_path, SESSIONS)
    assert 0 <= report["foretold"] <= report["learnable"]
    # Before the first session nothing is known; before every later one the briefing was refreshed with
    # everything earlier (as of the previous session's end) and nothing later (as of before its start).
    assert rows[0]["chars"] == 0 and all(r["chars"] > 0 for r in rows[1:])
    for prev, row in zip(rows, rows[1:]):
        as_of = datetime.fromisoformat(row["briefing_as_of"])
        assert datetime.fromisoformat(prev["ended_at"]) <= as_of < datetime.fromisoformat(row["started_at"]), row
    assert report["chars"]["max"] <= report["chars"]["budget"] == 2000
    assert report["briefing_lines"] > 0 and report["relevance"] is not None


def test_the_replay_stops_the_broker_worker_and_projector_it_started(tau_bench_path, tmp_path, monkeypatch):
    """Without a configured broker, the replay starts the project's own and stops it after, with the
    worker and the projector (their processes gone, the broker's status empty)."""
    from somnus import broker, procs
    from somnus.config import Settings

    monkeypatch.delenv("KAFKA_BOOTSTRAP", raising=False)
    home = tmp_path / "home"
    started: list[int] = []
    spawn, start = procs.spawn, broker.start

    def spawn_recorded(*args, **kwargs):
        proc = spawn(*args, **kwargs)
        started.append(proc.pid)
        return proc

    def start_recorded(*args, **kwargs):
        info = start(*args, **kwargs)
        started.append(info.pid)
        return info

    monkeypatch.setattr(procs, "spawn", spawn_recorded)
    monkeypatch.setattr(broker, "start", start_recorded)
    report = run_foresight([tau_bench_path], "openai-chat", agent="airline", sessions=2, home=home, timeout_s=300)
    assert report["sessions"] == 2
    assert len(started) == 3  # the broker, the projector, the worker
    assert [pid for pid in started if procs.pid_alive(pid)] == []
    assert broker.status(Settings.resolve(env={}, home=home)) is None
