"""somnus.cli.bench_cli: start-to-exit times, interleaved across variants; a failing command is no figure."""

from __future__ import annotations

import os
import sys

import pytest

from somnus.cli.bench_cli import measure


def test_each_variant_and_command_gets_every_run_and_its_median(tmp_path) -> None:
    env = {**os.environ, "SOMNUS_HOME": str(tmp_path)}
    got = measure(
        {"a": ([sys.executable, "-c"], env), "b": ([sys.executable, "-S", "-c"], env)},
        runs=3,
        commands={"nothing": ["pass"], "sleep": ["import time; time.sleep(0.2)"]},
    )
    assert set(got) == {"a", "b", "python -c pass"}
    for v in ("a", "b"):
        assert len(got[v]["sleep"]["runs_ms"]) == 3 and got[v]["sleep"]["median_ms"] >= 200
        assert got[v]["sleep"]["median_ms"] > got[v]["nothing"]["median_ms"]
    assert len(got["python -c pass"]["floor"]["runs_ms"]) == 3


def test_a_command_that_fails_is_an_error_not_a_time(tmp_path) -> None:
    env = {**os.environ, "SOMNUS_HOME": str(tmp_path)}
    with pytest.raises(RuntimeError, match="exited 3"):
        measure({"a": ([sys.executable, "-c"], env)}, runs=1, commands={"bad": ["raise SystemExit(3)"]})
