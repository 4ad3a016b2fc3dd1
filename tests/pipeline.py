"""Test helper: run the real worker and projector processes for one isolated pipeline."""

from __future__ import annotations

import os
import signal
import subprocess
import time
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import duckdb

from somnus import procs
from somnus.client import publish
from somnus.config import Settings
from somnus.projections.schema import CONTENT_COLUMNS
from somnus.reads import checksum, status, wait_idle
from somnus.streams.topics import ensure_topics

DIAGNOSIS_CHARS = 40_000  # of each worker's log, in a stalled test's failure message


class Pipeline:
    def __init__(self, settings: Settings) -> None:
        self.s = settings
        self.boot = settings.bootstrap
        assert self.boot
        self.procs: dict[str, subprocess.Popen] = {}
        ensure_topics(settings, self.boot)

    def start(self, name: str, role: str | None = None) -> subprocess.Popen:
        role = role or ("projector" if name == "projector" else "worker")
        proc = procs.spawn(self.s, self.boot, role, name=name)  # type: ignore[arg-type]
        self.procs[name] = proc
        return proc

    def cli(self, *args: str, timeout_s: float = 300.0) -> str:
        """``somnus ARGS`` against this pipeline (its settings and broker); its stdout, or a failure."""
        import sys

        run = subprocess.run(
            [sys.executable, "-m", "somnus.cli", *args],
            env={**self.s.as_env(), "KAFKA_BOOTSTRAP": self.boot},
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
        assert run.returncode == 0, (args, run.stdout, run.stderr)
        return run.stdout

    def start_all(self) -> None:
        self.start("projector")
        self.start("worker")

    def kill(self, name: str) -> None:
        """SIGKILL: no shutdown code runs."""
        proc = self.procs.pop(name)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)

    def stop_all(self) -> None:
        for name, proc in list(self.procs.items()):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for name, proc in list(self.procs.items()):
            try:
                proc.wait(timeout=40)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.procs.clear()

    def publish(self, events: Iterable[Any], bundle_max: int = 64) -> int:
        return publish(events, self.boot, self.s.traces_topic, bundle_max=bundle_max)  # type: ignore[arg-type]

    def wait_idle(self, timeout_s: float = 300.0) -> dict[str, Any]:
        for name, proc in self.procs.items():
            assert proc.poll() is None, f"{name} exited with {proc.returncode}: {self.log(name)[-3000:]}"
        try:
            return wait_idle(self.s, self.boot, timeout_s=timeout_s)  # type: ignore[arg-type]
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}\n{self.diagnose()}") from None

    def wait_until(self, predicate: Any, timeout_s: float = 120.0, what: str = "condition") -> None:
        """``wait_until``, with every live worker's dump (``diagnose``) in the error when it times out."""
        try:
            wait_until(predicate, timeout_s=timeout_s, what=what)
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}\n{self.diagnose()}") from None

    def diagnose(self) -> str:
        """The end of every live worker's log after it dumped its asyncio tasks and consumer state
        (SIGUSR1, SIGUSR2: ``somnus.streams.liveness.install_diagnostics``): a stall then shows where it is
        waiting in the test's own failure message."""
        workers = {n: p for n, p in self.procs.items() if n != "projector" and p.poll() is None}
        for proc in workers.values():
            for sig in (signal.SIGUSR1, signal.SIGUSR2):
                try:
                    os.kill(proc.pid, sig)
                except ProcessLookupError:
                    pass
        time.sleep(2.0)
        return "\n".join(f"--- {name}.log (end) ---\n{self.log(name)[-DIAGNOSIS_CHARS:]}" for name in workers)

    def status(self) -> dict[str, Any]:
        return status(self.s, self.boot)  # type: ignore[arg-type]

    def checksum(self) -> dict[str, Any]:
        return checksum(Path(self.s.db_path))  # type: ignore[arg-type]

    def log(self, name: str) -> str:
        path = self.s.run_dir / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def query(self, sql: str) -> list[tuple]:
        """Query the DuckDB file directly (only when the projector is stopped)."""
        assert "projector" not in self.procs
        con = duckdb.connect(str(self.s.db_path), read_only=True)
        try:
            return con.execute(sql).fetchall()
        finally:
            con.close()


def wait_until(predicate, timeout_s: float = 120.0, poll_s: float = 0.3, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(poll_s)
    raise TimeoutError(f"{what} not reached in {timeout_s}s")


# The folds whose result depends on the order of their topic (capture, knowledge, Rescorla-Wagner, sleeps)
ORDER_DEPENDENT = frozenset(
    {
        "memories",
        "memory_log",
        "memory_merges",
        "memory_edges",
        "lifecycle_log",
        "sleep_runs",
        "triples",
        "triple_history",
        "entity_versions",
        "causal_links",
        "causal_link_updates",
    }
)
# The semantic layers: fed by the sleeps' promotion requests, so by the folds above.
SEMANTIC = frozenset(
    {
        "concepts",
        "concept_relationships",
        "cross_layer_edges",
        "math_patterns",
        "promotion_audit",
        "semantic_log",
        "sleep_layer_reports",
        "briefings",
    }
)
# What a worker or the projector logs when it takes a timing-dependent decision (streams/app.py's
# Ordered, projections/projector.py's promotion wait): the one way two runs of one input may differ.
TIMED = ("trace record(s) handed on after waiting", "requested after waiting")


def took_a_timed_decision(run_dir: Path) -> list[str]:
    """The log lines in which a run's processes said they took a timing-dependent decision."""
    return [
        line
        for log in sorted(Path(run_dir).glob("*.log"))
        for line in log.read_text(errors="replace").splitlines()
        if any(t in line for t in TIMED)
    ]


def assert_every_table_equal(first: dict[str, str], second: dict[str, str], timed: list[str]) -> None:
    """Every projection equal; differences are reported rather than failed only when a run said it
    took a timing-dependent decision (``timed``: its log lines)."""
    assert set(first) == set(second) == set(CONTENT_COLUMNS)  # every projection is compared, none left out
    differing = sorted(t for t in first if first[t] != second[t])
    if differing and timed:
        warnings.warn(f"a run took a timed decision ({timed[0]!r}): {', '.join(differing)} differ", stacklevel=2)
        return
    assert differing == [], (differing, timed)
