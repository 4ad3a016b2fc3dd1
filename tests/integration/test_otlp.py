"""OTLP in: a program instrumented with the real OpenTelemetry SDK and its OTLP/HTTP exporter sends
GenAI spans of two agents to `somnus otlp`; they become episodes and lessons (real broker, worker,
projector). The same spans as OTLP JSON through `somnus import --format otel`. A receiver SIGKILLed
in the middle of the export loses nothing and duplicates nothing after the exporter's retries."""

from __future__ import annotations

import dataclasses
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from somnus.config import Settings
from somnus.otlp.receiver import journal_path
from somnus.projections import auth
from tests.pipeline import Pipeline, wait_until

pytestmark = pytest.mark.integration

PROGRAM = Path(__file__).resolve().parents[1] / "fixtures" / "otel" / "genai_agents.py"
EVENTS = {"support": 8, "billing": 5}  # events of one session of each agent (genai_agents.py)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def receiver_pipeline(settings: Settings) -> tuple[Pipeline, Settings, str]:
    s = dataclasses.replace(settings, otlp_port=free_port())
    token = auth.TokenStore(s.home).create(operator=True, label="otel exporter")[0]
    p = Pipeline(s)
    p.start_all()
    p.start("otlp", role="otlp")
    wait_until(lambda: "OTLP/HTTP receiver on" in p.log("otlp"), 60, what="the receiver listening")
    return p, s, token


def run_program(s: Settings, token: str, *args: str, timeout_s: float = 300) -> subprocess.Popen:
    env = {
        **os.environ,
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": f"http://127.0.0.1:{s.otlp_port}/v1/traces",
        "OTEL_EXPORTER_OTLP_HEADERS": f"Authorization=Bearer {token}",
    }
    return subprocess.Popen(
        [sys.executable, str(PROGRAM), *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def finished(proc: subprocess.Popen, timeout_s: float = 300) -> str:
    out, _ = proc.communicate(timeout=timeout_s)
    assert proc.returncode == 0, out
    assert "Failed to export" not in out, out  # the exporter dropped no batch
    return out


def settle(p: Pipeline) -> None:
    p.wait_idle()
    p.stop_all()


def check_episodes(p: Pipeline, sessions: int) -> None:
    """Every session once, with its outcome, its events once, and its lessons."""
    rows = p.query("SELECT agent, session_id, outcome, event_count, tool_calls FROM episodes ORDER BY session_id")
    assert len(rows) == sessions and len({r[1] for r in rows}) == sessions, rows
    for agent, session_id, outcome, events, calls in rows:
        assert session_id == f"conv-{agent}-{session_id.rsplit('-', 1)[1]}"
        assert (outcome, events, calls) == (("failure", 8, 2) if agent == "support" else ("success", 5, 1)), rows
    want = sum(EVENTS["support" if i % 2 == 0 else "billing"] for i in range(sessions))
    assert p.query("SELECT count(*), count(DISTINCT event_id) FROM events") == [(want, want)]
    assert p.query("SELECT count(*) FROM dead_letters") == [(0,)], p.query("SELECT kind, reason FROM dead_letters")
    lessons = p.query("SELECT agent, kind, tool, error FROM lessons ORDER BY agent, kind")
    support = [r for r in lessons if r[0] == "support"]
    billing = [r for r in lessons if r[0] == "billing"]
    assert len(support) == (sessions + 1) // 2 and len(billing) == sessions // 2, lessons
    assert {(k, t, e) for _, k, t, e in support} == {("failure", "refund", "TimeoutError: payment gateway timed out")}
    assert {k for _, k, _, _ in billing} == {"success"}


def test_sdk_spans_of_two_agents_become_episodes_and_lessons(pipeline_settings: Any) -> None:
    p, s, token = receiver_pipeline(pipeline_settings)
    try:
        finished(run_program(s, token, "--sessions", "2", "http"))
        settle(p)
        check_episodes(p, 2)
    finally:
        p.stop_all()


def test_the_same_spans_as_otlp_json_through_somnus_import(pipeline_settings: Any, tmp_path: Path) -> None:
    s = pipeline_settings
    out = tmp_path / "collector-file-exporter.jsonl"
    finished(run_program(s, "unused", "--sessions", "4", "file", str(out)))
    p = Pipeline(s)
    p.start_all()
    try:
        env = {**os.environ, **s.as_env()}
        somnus = [str(Path(sys.executable).parent / "somnus"), "import", "--format", "otel", str(out)]
        for _ in range(2):  # imported twice: the second changes nothing (the same event ids and seqs)
            done = subprocess.run(somnus, env=env, capture_output=True, text=True, timeout=300)
            assert done.returncode == 0, done.stdout + done.stderr
            assert "imported 4 sessions" in done.stdout, done.stdout
        settle(p)
        check_episodes(p, 4)
        assert p.query("SELECT count(*) FROM duplicate_events") == [(sum(EVENTS.values()) * 2,)]
    finally:
        p.stop_all()


def test_a_receiver_killed_mid_export_loses_and_duplicates_nothing(pipeline_settings: Any) -> None:
    p, s, token = receiver_pipeline(pipeline_settings)
    journal = journal_path(s.home)
    try:
        program = run_program(s, token, "--sessions", "40", "--pause", "0.05", "--timeout", "60", "http")
        wait_until(
            lambda: journal.exists() and b'"type":"done"' in journal.read_bytes(), 120, what="the first trace published"
        )
        receiver = p.procs.pop("otlp")
        os.kill(receiver.pid, signal.SIGKILL)  # in the middle of the export: batches are still coming
        receiver.wait(timeout=30)
        assert program.poll() is None, "the program ended before the kill: nothing was tested"
        time.sleep(2.0)  # the exporter meets a closed port and retries with back-off
        p.start("otlp", role="otlp")
        finished(program, timeout_s=300)
        log = p.log("otlp")
        assert log.count("OTLP/HTTP receiver on") == 2 and "published" in log.split("OTLP/HTTP receiver on")[-1], log
        settle(p)
        check_episodes(p, 40)
    finally:
        if program.poll() is None:
            program.kill()
        p.stop_all()
