"""`somnus demo` (the README's first command, after set-up) on its own broker: it shows a briefing
and leaves nothing running behind it."""

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
    run = subprocess.run([sys.executable, "-m", "somnus.cli", "demo", "--sessions", "60", "--home", str(home)],
                         env=env, capture_output=True, text=True, timeout=600)
    settings = Settings.resolve(env={}, home=home)
    try:
        assert run.returncode == 0, run.stderr[-3000:]
        assert "## Session Briefing for scraper" in run.stdout
        assert "broker: stopped" in run.stdout
        assert broker.status(settings) is None
        assert all(procs.running(settings, role) is None for role in ("supervisor", "worker", "projector"))
    finally:
        broker.stop(settings)
