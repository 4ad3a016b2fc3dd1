"""How long the CLI takes from start to exit (``somnus bench cli``), on a stack of its own.

Starts a stack (broker, worker, projector) on a temporary ``SOMNUS_HOME``, projects a small seeded
sample so reads have something to read, then runs each measured command ``runs`` times, interleaved
(one run of each command in turn, and of each baseline in turn, so a busy moment of a shared machine
falls on all of them alike), and stops the stack and the broker it started. A baseline is another
copy of Somnus run by the same Python without ``site`` (``python -S``: not this checkout's editable
install), its package folder and this environment's site-packages on ``PYTHONPATH``, e.g. the main
branch as it was: ``--baseline main=/tmp/somnus-main-pkg`` (BENCHMARKS.md shows how to make one).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

THRESHOLD_MS = 300.0  # issue #28: a read command answers within this, median on this machine
COMMANDS: dict[str, list[str]] = {
    "help": ["--help"],
    "sql": ["sql", "select 1"],
    "brief": ["brief", "scraper"],
    "recall": ["recall", "rate limit", "--agent", "scraper"],
    "status": ["status"],
}


def _time_one(argv: list[str], env: dict[str, str]) -> float:
    """Milliseconds from start to exit of ``argv``; a failing command is an error (a fast failure is no answer)."""
    start = time.perf_counter()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, cwd=env["SOMNUS_HOME"])
    elapsed = (time.perf_counter() - start) * 1000
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.strip()[-500:]}")
    return elapsed


def measure(
    variants: dict[str, tuple[list[str], dict[str, str]]], runs: int, commands: dict[str, list[str]] = COMMANDS
) -> dict[str, dict[str, Any]]:
    """Per variant (a command prefix and its environment) and command: the median and every run, in ms."""
    times: dict[str, dict[str, list[float]]] = {v: {c: [] for c in commands} for v in variants}
    floor: list[float] = []
    for _ in range(runs):
        env = next(iter(variants.values()))[1]
        floor.append(_time_one([sys.executable, "-c", "pass"], env))  # the interpreter alone, for scale
        for name, args in commands.items():
            for variant, (prefix, env) in variants.items():
                times[variant][name].append(_time_one([*prefix, *args], env))
    got = {
        v: {
            c: {"median_ms": round(statistics.median(ts), 1), "runs_ms": [round(t, 1) for t in ts]}
            for c, ts in by_cmd.items()
        }
        for v, by_cmd in times.items()
    }
    got["python -c pass"] = {
        "floor": {"median_ms": round(statistics.median(floor), 1), "runs_ms": [round(t, 1) for t in floor]}
    }
    return got


def run_cli_bench(
    runs: int = 7,
    sessions: int = 40,
    baselines: dict[str, Path] | None = None,
    log: Callable[[str], None] = lambda m: None,
) -> dict[str, Any]:
    """Start a stack on a temporary home, measure ``COMMANDS`` (``measure``), stop the stack; the report."""
    from somnus import broker, procs, reads
    from somnus.broker import _free_port
    from somnus.client import publish
    from somnus.config import Settings
    from somnus.sample import generate

    with tempfile.TemporaryDirectory(prefix="somnus-bench-cli-") as tmp:
        home = Path(tmp)
        # The whole stack `somnus up` runs (its OTLP receiver and MCP server too), on free ports, not
        # on the shared defaults another stack of this machine may hold.
        env = {
            **os.environ,
            "SOMNUS_HOME": str(home),
            "COLUMNS": "80",
            "SOMNUS_OTLP_PORT": str(_free_port()),
            "SOMNUS_MCP_PORT": str(_free_port()),
        }
        for var in ("SOMNUS_DB", "KAFKA_BOOTSTRAP", "SOMNUS_TOKEN", "PYTHONPATH"):
            env.pop(var, None)
        s = Settings.resolve(home=home, env=env)
        me = [sys.executable, "-m", "somnus.cli"]
        try:
            log(f"starting a stack in {home}")
            subprocess.run([*me, "up", "--detach"], env=env, check=True, capture_output=True, timeout=300)
            boot = broker.bootstrap_for(s, start_if_missing=False)
            n = publish(generate(sessions=sessions, seed=42), boot, s.traces_topic)
            log(f"published {n} events; waiting for the projections")
            reads.wait_idle(s, boot, timeout_s=300)
            variants = {"this": (me, env)}
            purelib = sysconfig.get_paths()["purelib"]
            for name, folder in (baselines or {}).items():
                variants[name] = (
                    [sys.executable, "-S", "-m", "somnus.cli"],
                    {**env, "PYTHONPATH": os.pathsep.join([str(Path(folder).resolve()), purelib])},
                )
            log(f"measuring {len(COMMANDS)} commands x {runs} runs x {len(variants)} variants")
            got = measure(variants, runs)
        finally:
            subprocess.run([*me, "down"], env=env, capture_output=True, timeout=180)
            broker.stop(s)
            procs.stop(s, "supervisor")
    this = got["this"]
    return {
        "runs": runs,
        "threshold_ms": THRESHOLD_MS,
        "commands": {c: " ".join(["somnus", *a]) for c, a in COMMANDS.items()},
        "median_ms": {c: v["median_ms"] for c, v in this.items()},
        "under_threshold": all(v["median_ms"] < THRESHOLD_MS for v in this.values()),
        "python_floor_ms": got.pop("python -c pass")["floor"]["median_ms"],
        "baselines": {b: {c: v["median_ms"] for c, v in got[b].items()} for b in got if b != "this"},
        "runs_ms": {b: {c: v["runs_ms"] for c, v in by.items()} for b, by in got.items()},
    }
