"""Somnus's files are private to its user: after a real run (``somnus up`` with its own broker, a
trace projected), SOMNUS_HOME and every folder in it are 0700, every file 0600."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from somnus import procs
from somnus.config import Settings

pytestmark = pytest.mark.integration


def _somnus(env: dict[str, str], *args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "somnus.cli", *args], env=env, capture_output=True, text=True, timeout=timeout
    )


def _modes(home: Path) -> dict[str, int]:
    found = {".": stat.S_IMODE(home.stat().st_mode)}
    for root, dirs, files in os.walk(home):
        for name in dirs + files:
            path = Path(root) / name
            if not path.is_symlink():
                found[str(path.relative_to(home))] = stat.S_IMODE(path.stat().st_mode)
    return found


def test_after_a_run_home_folders_are_0700_and_files_0600(tmp_path):
    from somnus.broker import bootstrap_for
    from somnus.client import publish
    from somnus.reads import summary
    from somnus.sample import generate

    home = tmp_path / "home"  # made by `somnus up`
    run = uuid.uuid4().hex[:8]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SOMNUS_", "KAFKA_"))}
    env.update(
        SOMNUS_HOME=str(home),
        SOMNUS_TOPIC_PREFIX=f"m{run}.",
        SOMNUS_APP_ID=f"somnus-modes-{run}",
        SOMNUS_PARTITIONS="2",
    )
    settings = Settings.resolve(env=env)
    umask = os.umask(0o022)  # as a usual shell: what Somnus makes private, it makes so itself
    try:
        up = _somnus(env, "up", "--detach")
        assert up.returncode == 0, up.stdout + up.stderr
        events = list(generate(sessions=20, seed=3))
        publish(events, bootstrap_for(settings, start_if_missing=False), settings.traces_topic)
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            try:
                if summary(Path(settings.db_path))["counts"]["episodes"] == 20:  # type: ignore[arg-type]
                    break
            except Exception:  # the projector is starting
                pass
            time.sleep(0.5)
        else:
            pytest.fail("the episodes were not projected")
        modes = _modes(home)
    finally:
        os.umask(umask)
        _somnus(env, "down")
        _somnus(env, "broker", "stop")
    # What a run leaves, each named (so the walk below is known to have seen them) ...
    for name in (
        "somnus.duckdb",
        "token",
        "run/projector.log",
        "run/worker.log",
        "run/supervisor.log",
        "run/projector.pid",
        "run/worker.pid",
        "broker/broker.log",
        "broker/data/meta.properties",
    ):
        assert modes.get(name) == 0o600, (name, oct(modes.get(name, 0)))
    for name in (".", "run", "broker", "broker/data", "faust"):
        assert modes.get(name) == 0o700, (name, oct(modes.get(name, 0)))
    assert any(name.startswith("broker/data/") and name.endswith(".log") for name in modes)  # topic segments
    # ... and nothing in SOMNUS_HOME is readable by anyone else.
    exposed = {name: oct(mode) for name, mode in modes.items() if mode & 0o077}
    assert exposed == {}
    assert procs.running(settings, "supervisor") is None and procs.running(settings, "projector") is None


def test_private_dir_tightens_a_home_made_before(tmp_path):
    home = tmp_path / "old-home"
    home.mkdir(mode=0o755)
    os.chmod(home, 0o755)
    procs.private_dir(home / "run")
    assert stat.S_IMODE((home / "run").stat().st_mode) == 0o700
    procs.private_dir(home)
    assert stat.S_IMODE(home.stat().st_mode) == 0o700
    with procs.open_private(home / "x.log") as f:
        f.write(b"x")
    assert stat.S_IMODE((home / "x.log").stat().st_mode) == 0o600
