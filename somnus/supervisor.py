"""Keeps the worker and the projector running: what ``somnus up`` runs, in the foreground or detached
(``python -m somnus.supervisor``, pid file ``<SOMNUS_HOME>/run/supervisor.pid``).

With the project's own broker (no ``KAFKA_BOOTSTRAP``), the broker is watched too, and started
again on the same port and log dir (``somnus.broker.start``) if it dies; ``somnus down`` leaves it
running, as before. A process that exits (a crash, a SIGKILL, a worker that gave up waiting for the
broker) is started again after a back-off: 1 s, doubled after each exit that came soon after its start, at most 60 s,
and back to 1 s once a process has run for a minute. Nothing is lost by a restart: the worker's
state is in changelogged tables and its offsets are committed after its outputs; the projector
writes rows and offsets in one transaction. ``somnus down`` stops the supervisor first (so nothing is
restarted), which stops its processes.

>>> [backoff_s(n) for n in range(1, 9)]
[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from somnus import broker as broker_mod
from somnus import procs
from somnus.config import SUPERVISOR_STATE_FILE, Settings

log = logging.getLogger("somnus.supervisor")

ROLES = ("projector", "worker")  # the projector first: the worker's outputs wait on the broker meanwhile
OTLP = "otlp"  # the OTLP/HTTP receiver (somnus/otlp/receiver.py)
MCP = "mcp"  # the MCP server over streamable HTTP (somnus/mcp_server.py), last: stopped first
SERVERS = (OTLP, MCP)  # what ``somnus up`` runs beside the pipeline, each unless its port is 0


def worker_names(workers: int) -> tuple[str, ...]:
    """The names of ``workers`` worker processes (their pid and log files): the first is ``worker``.

    >>> worker_names(3)
    ('worker', 'worker-2', 'worker-3')
    """
    if workers < 1:
        raise ValueError(f"SOMNUS_WORKERS (--workers) must be at least 1, got {workers}")
    return ("worker", *(f"worker-{i}" for i in range(2, workers + 1)))


def role_of(name: str) -> str:
    """The role of a supervised process's name (``worker-2`` is a worker)."""
    return "worker" if name.startswith("worker") else name


def roles_for(settings: Settings) -> tuple[str, ...]:
    """What ``somnus up`` supervises: the projector, ``settings.workers`` workers (one Faust app id, so
    Kafka splits the trace partitions among them), then the OTLP receiver and the MCP server, each
    unless its port is 0 (``SOMNUS_OTLP_PORT``, ``SOMNUS_MCP_PORT``)."""
    roles = ("projector", *worker_names(settings.workers))
    return (*roles, *(r for r, port in ((OTLP, settings.otlp_port), (MCP, settings.mcp_port)) if port))


MIN_BACKOFF_S = 1.0
MAX_BACKOFF_S = 60.0
STABLE_S = 60.0  # a process that ran this long before it exited is restarted after MIN_BACKOFF_S again


def backoff_s(failures: int, low: float = MIN_BACKOFF_S, high: float = MAX_BACKOFF_S) -> float:
    """The wait before the next start after ``failures`` exits in a row (each soon after its start)."""
    return min(high, low * 2.0 ** max(0, failures - 1))


@dataclasses.dataclass
class Child:
    """One supervised process: the process (``pid`` alone when it was adopted: started before this
    supervisor, so its exit code cannot be read), when it started, and its exits in a row."""

    role: str
    proc: subprocess.Popen | None = None
    pid: int | None = None
    started_at: float = 0.0
    failures: int = 0
    restart_at: float | None = None  # when it is due to start again (it is down until then)
    restarts: int = 0
    last_exit: str | None = None  # how it ended last ('signal 9', 'exit code 1', ...)
    last_exit_at: str | None = None  # when (UTC, ISO 8601)


class Supervisor:
    """Starts each role, watches it, and starts it again after a back-off when it exits.

    ``spawn(role)`` starts one (``procs.spawn`` by default; the broker: ``somnus.broker.start``) and
    returns it (a ``Popen``, or anything with a ``pid``); ``broker``: watch the local broker too (first);
    ``clock`` is monotonic seconds: the unit tests pass their own (they test this wiring, not the
    processes; tests/integration/test_supervisor.py runs the real ones)."""

    def __init__(
        self,
        settings: Settings,
        bootstrap: str,
        roles: tuple[str, ...] = ROLES,
        spawn: Callable[[str], Any] | None = None,
        clock: Callable[[], float] = time.monotonic,
        say: Callable[[str], None] | None = None,
        stable_s: float = STABLE_S,
        low: float = MIN_BACKOFF_S,
        high: float = MAX_BACKOFF_S,
        state_file: Path | None = None,
        broker: bool = False,
    ) -> None:
        self.settings, self.bootstrap = settings, bootstrap
        self.spawn = spawn or self._spawn
        if broker:
            roles = ("broker", *roles)
        self.clock = clock
        self.say = say or log.warning
        self.stable_s, self.low, self.high = stable_s, low, high
        self.children = {role: Child(role) for role in roles}
        self.state_file = state_file  # what ``somnus status`` shows of the processes (written on each change)
        self._stop = threading.Event()

    # -- one look at every child ------------------------------------------------------------
    def step(self) -> None:
        before = self.state()
        self._step(self.clock())
        if self.state_file is not None and self.state() != before:
            tmp = self.state_file.with_suffix(".tmp")
            tmp.write_text(json.dumps(self.state()))
            tmp.replace(self.state_file)  # whole, for a reader at any moment

    def state(self) -> dict[str, Any]:
        """Each process's pid (None while it waits to start again), restarts and last exit."""
        return {
            role: {"pid": c.pid, "restarts": c.restarts, "last_exit": c.last_exit, "last_exit_at": c.last_exit_at}
            for role, c in self.children.items()
        }

    def _step(self, now: float) -> None:
        for child in self.children.values():
            if child.restart_at is None and child.pid is None:  # never started: adopt a running one, or start
                pid = running(self.settings, child.role)
                if pid is not None:
                    child.pid, child.started_at = pid, now
                    self.say(f"{child.role}: already running (pid {pid}); watching it")
                else:
                    self._start(child, now)
                continue
            if child.restart_at is not None:
                if now >= child.restart_at:
                    self._start(child, now)
                continue
            code = self._exit_code(child)
            if code is None:
                continue
            ran = now - child.started_at
            wait = self._down(child, now, code, 1 if ran >= self.stable_s else child.failures + 1)
            where = (
                self.settings.home / "broker" / "broker.log"
                if child.role == "broker"
                else self.settings.run_dir / f"{child.role}.log"
            )
            self.say(
                f"{child.role} exited ({code}) after {ran:.1f} s; starting it again in {wait:.0f} s (log: {where})"
            )

    def _down(self, child: Child, now: float, how: str, failures: int) -> float:
        """Record that ``child`` is down (``how``) and when to start it again; returns the wait."""
        wait = backoff_s(failures, self.low, self.high)
        child.failures, child.restart_at, child.proc, child.pid = failures, now + wait, None, None
        child.last_exit, child.last_exit_at = how, datetime.now(timezone.utc).isoformat(timespec="seconds")
        return wait

    def _exit_code(self, child: Child) -> str | None:
        """None while it runs; else how it ended ('exit code 1', 'signal 9', 'unknown' when adopted)."""
        if child.proc is not None:
            rc = child.proc.poll()
            if rc is None:
                return None
            return f"signal {-rc}" if rc < 0 else f"exit code {rc}"
        if child.pid is None:
            return "exit code unknown"
        if procs.pid_alive(child.pid):
            return None
        with contextlib.suppress(ChildProcessError):  # a broker this supervisor started (broker.start): reap it
            pid, status = os.waitpid(child.pid, os.WNOHANG)
            if pid == child.pid:
                return (
                    f"signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status) else f"exit code {os.WEXITSTATUS(status)}"
                )
        return "exit code unknown"

    def _spawn(self, role: str) -> Any:
        if role == "broker":
            return broker_mod.start(self.settings)  # its port and log dir again; waits until it answers
        return procs.spawn(self.settings, self.bootstrap, role_of(role), name=role)

    def _start(self, child: Child, now: float) -> None:
        try:
            proc = self.spawn(child.role)
        except broker_mod.BrokerError as exc:  # counts as an exit: tried again after the back-off
            wait = self._down(child, now, "did not start", child.failures + 1)
            self.say(f"{child.role} did not start ({exc}); trying again in {wait:.0f} s")
            return
        child.proc = proc if isinstance(proc, subprocess.Popen) else None
        child.pid = getattr(proc, "pid", None)
        if child.restart_at is not None:
            child.restarts += 1
        child.started_at, child.restart_at = now, None

    # -- the loop ---------------------------------------------------------------------------
    def run(self, interval_s: float = 0.5) -> None:
        """Watch until ``stop()``; then stop every process (SIGTERM, then SIGKILL after 30 s)."""
        try:
            while not self._stop.is_set():
                self.step()
                self._stop.wait(interval_s)
        finally:
            self.shutdown()

    def stop(self, *_: Any) -> None:
        self._stop.set()

    def shutdown(self) -> None:
        for role in reversed(tuple(self.children)):  # the worker first, then the projector
            if role != "broker":  # it keeps running until `somnus broker stop`
                procs.stop(self.settings, role)


def running(settings: Settings, role: str) -> int | None:
    """The pid of ``role`` (supervisor, worker, projector, or this home's local broker) if it runs."""
    if role == "broker":
        info = broker_mod.status(settings)
        return info.pid if info is not None else None
    return procs.running(settings, role)


def state_file(settings: Settings) -> Path:
    return settings.run_dir / SUPERVISOR_STATE_FILE


def processes(settings: Settings) -> dict[str, Any]:
    """What runs (pids, None when not) and, under a supervisor, each process's restarts and last exit."""
    out: dict[str, Any] = {role: running(settings, role) for role in ("supervisor", "broker", *roles_for(settings))}
    path = state_file(settings)
    if out["supervisor"] is not None and path.exists():
        try:
            out["supervised"] = json.loads(path.read_text())
        except ValueError:  # being written
            pass
    return out


def serve(
    settings: Settings,
    bootstrap: str,
    broker: bool,
    say: Callable[[str], None] | None = None,
    started: Callable[[], None] | None = None,
) -> None:
    """Supervise until SIGTERM or SIGINT (``somnus down``, Ctrl-C): in the foreground of ``somnus up`` or as
    ``python -m somnus.supervisor``. Its pid file is how ``somnus down`` finds it, so that nothing is
    started again behind ``down``'s back; ``started`` is called after the first look (both started)."""
    sup = Supervisor(
        settings, bootstrap, roles=roles_for(settings), say=say, state_file=state_file(settings), broker=broker
    )
    previous = {sig: signal.signal(sig, sup.stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    settings.run_dir.mkdir(parents=True, exist_ok=True)
    procs.write_pidfile(settings, "supervisor", os.getpid())
    try:
        sup.step()
        if started is not None:
            started()
        sup.run()
    finally:
        procs.pidfile(settings, "supervisor").unlink(missing_ok=True)
        state_file(settings).unlink(missing_ok=True)
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def main() -> None:
    """Entry point: ``python -m somnus.supervisor [--broker]`` (settings and KAFKA_BOOTSTRAP from the environment)."""
    parser = argparse.ArgumentParser(prog="somnus-supervisor")
    parser.add_argument("--broker", action="store_true", help="Watch the local broker too.")
    args = parser.parse_args()
    procs.private_files()  # its pid and state files, and what the processes it starts create: 0600 / 0700
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    settings = Settings.resolve()
    serve(settings, broker_mod.bootstrap_for(settings, start_if_missing=False), args.broker)


if __name__ == "__main__":
    main()
