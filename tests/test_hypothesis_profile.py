"""The hypothesis profile (tests/conftest.py): CI keeps each test's example count, local runs cap it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROBE = """
from hypothesis import given, settings, strategies as st

RUNS = []

@settings(max_examples=40, database=None)
@given(st.integers())
def test_counted(n):
    RUNS.append(n)

@given(st.integers())
def test_default(n):
    RUNS.append(n)

def test_report():
    print(f"RUNS={len(RUNS)}")
"""


def _runs(tmp_path: Path, ci: str | None) -> int:
    (tmp_path / "conftest.py").write_text((ROOT / "tests" / "conftest.py").read_text())  # the profile under test
    probe = tmp_path / "test_probe.py"
    probe.write_text(PROBE)
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "HYPOTHESIS_PROFILE")}
    if ci is not None:
        env["CI"] = ci
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-s", "--rootdir", str(tmp_path), str(probe)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    return int(next(line for line in out.stdout.splitlines() if "RUNS=" in line).split("RUNS=")[1].split()[0])


def test_ci_keeps_the_example_counts_and_a_local_run_caps_them(tmp_path: Path) -> None:
    assert _runs(tmp_path, "true") == 40 + 100  # the test's own count, and hypothesis's default
    assert _runs(tmp_path, None) == 10 + 10
