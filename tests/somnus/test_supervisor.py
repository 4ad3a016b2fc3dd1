"""The supervisor's wiring, with real child processes (``sleep``s standing in for the worker and the
projector) and a clock of the test's own. tests/integration/test_supervisor.py runs the real ones."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from somnus import procs
from somnus.config import Settings
from somnus.supervisor import (
    MAX_BACKOFF_S,
    MIN_BACKOFF_S,
    STABLE_S,
    Supervisor,
    backoff_s,
    role_of,
    roles_for,
    worker_names,
)


def test_up_supervises_the_otlp_receiver_and_the_mcp_server_unless_their_port_is_zero() -> None:
    assert roles_for(Settings.resolve(env={})) == ("projector", "worker", "otlp", "mcp")
    assert roles_for(Settings.resolve(env={"SOMNUS_OTLP_PORT": "0"})) == ("projector", "worker", "mcp")
    assert roles_for(Settings.resolve(env={"SOMNUS_MCP_PORT": "0"})) == ("projector", "worker", "otlp")
    assert roles_for(Settings.resolve(env={"SOMNUS_OTLP_PORT": "0", "SOMNUS_MCP_PORT": "0"})) == ("projector", "worker")
    assert procs.MODULES["otlp"] == "somnus.otlp.receiver" and procs.MODULES["mcp"] == "somnus.mcp_server"


def test_up_with_n_workers_supervises_n_named_worker_processes(monkeypatch, tmp_path: Path) -> None:
    three = Settings.resolve(
        env={"SOMNUS_WORKERS": "3", "SOMNUS_OTLP_PORT": "0", "SOMNUS_MCP_PORT": "0"}, home=tmp_path / "home"
    )
    assert roles_for(three) == ("projector", "worker", "worker-2", "worker-3")
    assert [role_of(n) for n in roles_for(three)] == ["projector", "worker", "worker", "worker"]
    with pytest.raises(ValueError, match="SOMNUS_WORKERS"):
        worker_names(0)
    spawned: list[tuple[str, str | None]] = []
    monkeypatch.setattr(procs, "spawn", lambda settings, boot, role, name=None: spawned.append((role, name)))
    Supervisor(three, "127.0.0.1:1", roles=roles_for(three))._spawn("worker-3")
    assert spawned == [("worker", "worker-3")]  # a worker, with its own name: its own log, pid and state folder


def test_backoff_doubles_from_one_second_up_to_a_minute() -> None:
    assert (MIN_BACKOFF_S, MAX_BACKOFF_S, STABLE_S) == (1.0, 60.0, 60.0)
    assert [backoff_s(n) for n in range(0, 9)] == [1.0, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0]


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture()
def sup(tmp_path: Path):
    settings = Settings.resolve(env={}, home=tmp_path / "home")
    settings.run_dir.mkdir(parents=True)
    started: list[tuple[str, subprocess.Popen]] = []

    def spawn(role: str) -> subprocess.Popen:
        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
        (settings.run_dir / f"{role}.pid").write_text(str(proc.pid))  # as procs.spawn does
        started.append((role, proc))
        return proc

    said: list[str] = []
    clock = Clock()
    s = Supervisor(
        settings,
        "127.0.0.1:1",
        spawn=spawn,
        clock=clock,
        say=said.append,
        state_file=settings.run_dir / "supervisor.json",
    )
    s.started, s.said, s.fake_clock = started, said, clock  # type: ignore[attr-defined]
    yield s
    for _, proc in started:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _kill(proc: subprocess.Popen) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()


def test_starts_every_role_and_restarts_one_that_was_killed_after_the_backoff(sup) -> None:
    sup.step()
    assert [r for r, _ in sup.started] == ["projector", "worker"]
    worker = sup.started[1][1]
    sup.fake_clock.t += 5
    _kill(worker)
    sup.step()
    assert "worker exited (signal 9) after 5.0 s; starting it again in 1 s" in sup.said[-1]
    assert len(sup.started) == 2  # not before its back-off
    sup.fake_clock.t += 0.5
    sup.step()
    assert len(sup.started) == 2
    sup.fake_clock.t += 0.5
    sup.step()
    assert [r for r, _ in sup.started] == ["projector", "worker", "worker"]
    assert procs.running(sup.settings, "worker") == sup.started[2][1].pid
    assert sup.children["worker"].restarts == 1
    assert sup.children["projector"].restarts == 0
    state = json.loads((sup.settings.run_dir / "supervisor.json").read_text())  # what `somnus status` shows
    assert state["worker"]["pid"] == sup.started[2][1].pid and state["worker"]["restarts"] == 1
    assert state["worker"]["last_exit"] == "signal 9" and state["worker"]["last_exit_at"]
    assert state["projector"] == {"pid": sup.started[0][1].pid, "restarts": 0, "last_exit": None, "last_exit_at": None}


def test_quick_exits_in_a_row_double_the_backoff_and_a_long_run_resets_it(sup) -> None:
    sup.step()
    waits = []
    for _ in range(4):  # each dies 2 s after its start
        sup.fake_clock.t += 2
        _kill(sup.started[-1][1])
        sup.step()
        wait = sup.children["worker"].restart_at - sup.fake_clock.t
        waits.append(wait)
        sup.fake_clock.t += wait
        sup.step()
    assert waits == [1.0, 2.0, 4.0, 8.0]
    sup.fake_clock.t += STABLE_S  # this one ran a minute: the next exit starts over
    _kill(sup.started[-1][1])
    sup.step()
    assert sup.children["worker"].restart_at - sup.fake_clock.t == 1.0
    assert sup.children["projector"].restart_at is None and sup.children["worker"].restarts == 4


def test_a_process_started_before_is_adopted_and_watched(sup, tmp_path: Path) -> None:
    before = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        (sup.settings.run_dir / "worker.pid").write_text(str(before.pid))
        sup.step()
        assert [r for r, _ in sup.started] == ["projector"]
        assert sup.children["worker"].pid == before.pid
        _kill(before)
        sup.step()
        assert "worker exited (exit code unknown)" in sup.said[-1]
        sup.fake_clock.t += 1
        sup.step()
        assert [r for r, _ in sup.started] == ["projector", "worker"]
    finally:
        if before.poll() is None:
            before.kill()


def test_shutdown_stops_both_and_nothing_restarts(sup) -> None:
    sup.step()
    sup.stop()
    sup.run(interval_s=0.01)  # stopped already: one look, then the shutdown
    assert all(proc.poll() is not None for _, proc in sup.started)
    assert procs.running(sup.settings, "worker") is None and procs.running(sup.settings, "projector") is None
    assert len(sup.started) == 2
