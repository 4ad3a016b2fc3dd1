"""Runs that start the project's own broker stop it: `somnus demo` (the README's first command, after
set-up) shows a briefing and leaves nothing running; so do the benchmark and evaluation pipelines."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from somnus import broker, procs
from somnus.config import Settings

pytestmark = pytest.mark.integration


def test_demo_shows_a_briefing_and_stops_the_broker_it_started(tmp_path):
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SOMNUS_", "KAFKA_"))}
    run = subprocess.run(
        [sys.executable, "-m", "somnus.cli", "demo", "--sessions", "60", "--home", str(home)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    settings = Settings.resolve(env={}, home=home)
    try:
        assert run.returncode == 0, run.stderr[-3000:]
        assert "## Session Briefing for scraper" in run.stdout
        assert "broker: stopped" in run.stdout
        assert broker.status(settings) is None
        # nor anything `somnus up` started: the OTLP receiver and the MCP server are stopped by `down` too
        assert all(
            procs.running(settings, role) is None for role in ("supervisor", "worker", "projector", "otlp", "mcp")
        )
    finally:
        broker.stop(settings)


def test_a_benchmark_or_eval_pipeline_stops_the_broker_it_started(tmp_path, monkeypatch):
    # somnus bench e2e / eval locomo / eval foresight all run in somnus.bench.isolated_pipeline
    from somnus.bench import isolated_pipeline

    for var in [v for v in os.environ if v.startswith(("SOMNUS_", "KAFKA_"))]:
        monkeypatch.delenv(var)
    home = tmp_path / "home"
    settings = Settings.resolve(env={}, home=home)
    try:
        with isolated_pipeline(home, label="t") as (s, boot):
            assert broker.status(settings) is not None
        assert broker.status(settings) is None
        monkeypatch.setenv("SOMNUS_KEEP_BROKER", "1")  # what --keep-broker sets
        with isolated_pipeline(home, label="t", workers=2) as (s, boot):  # bench e2e --workers 2
            assert all(procs.running(s, name) for name in ("worker", "worker-2", "projector"))
        assert not any(procs.running(s, name) for name in ("worker", "worker-2", "projector"))
        assert broker.status(settings) is not None
    finally:
        broker.stop(settings)
