"""Start and stop the worker and projector processes (pid files in ``<SOMNUS_HOME>/run``)."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from somnus.config import Settings

MODULES = {
    "worker": "somnus.streams.worker",
    "projector": "somnus.projections.projector",
    "supervisor": "somnus.supervisor",
    "otlp": "somnus.otlp.receiver",
    "mcp": "somnus.mcp_server",
}


# Young-generation collections every 50,000 net allocations instead of CPython's 700. The worker and
# the projector allocate many short-lived objects per batch over a large long-lived heap (session
# states, the memory index). Measured in `somnus bench e2e --events 300000` (gc callbacks timing every
# collection): the worker spent 3.38 s in 6,413 collections (47 of them full) with the defaults and
# 0.25 s in 24 with this; its CPU went from 75.7 to 64.7 µs an event. The projector's replay was ~5%
# faster (48.9 / 50.2 s -> 47.6 / 46.8 s). Cycles are still collected.
GC_THRESHOLD = (50_000, 20, 100)


def tune_gc() -> None:
    """Set the garbage collector's thresholds for a long-running worker or projector process."""
    gc.set_threshold(*GC_THRESHOLD)


# Somnus's state is private to its user: SOMNUS_HOME and every folder in it 0700, every file 0600
# (the DuckDB file holds every agent's memory; the logs quote traces; the token is a credential).
PRIVATE_UMASK = 0o077


def private_files() -> None:
    """Make every file and folder this process (and its children) creates private to its user: the
    entry points of the CLI, the supervisor, the worker and the projector call it first."""
    os.umask(PRIVATE_UMASK)


def private_dir(path: Path) -> Path:
    """``path`` and its missing parents created 0700; an existing ``path`` of ours made 0700 too (a
    SOMNUS_HOME made before files were private)."""
    missing = [p for p in (path, *path.parents) if not p.exists()]
    for p in reversed(missing):
        p.mkdir(mode=0o700, exist_ok=True)
    if not missing and path.stat().st_uid == os.getuid() and path.stat().st_mode & 0o077:
        path.chmod(0o700)
    return path


def open_private(path: Path, mode: str = "ab") -> Any:
    """``open(path, mode)``, a new file created 0600 whatever the process's umask."""
    flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if "a" in mode else os.O_TRUNC)
    return os.fdopen(os.open(path, flags, 0o600), mode)


def server_process(prog: str, argv: list[str] | None = None) -> tuple[Settings, str | None, int | None]:
    """The start of a supervised server's process (``python -m <module> [--host H] [--port P]``: the
    OTLP receiver, the MCP server): its files private, INFO logs to its log, settings from the
    environment; returns them and the ``--host`` / ``--port`` given (None when not)."""
    import argparse
    import logging

    parser = argparse.ArgumentParser(prog=prog)
    parser.add_argument("--host", default=None)
    parser.add_argument("--port", type=int, default=None)
    args = parser.parse_args(argv)
    private_files()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    return Settings.resolve(), args.host, args.port


def pidfile(settings: Settings, name: str) -> Path:
    return settings.run_dir / f"{name}.pid"


def child_env(settings: Settings, bootstrap: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(settings.as_env())
    env["KAFKA_BOOTSTRAP"] = bootstrap
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def spawn(
    settings: Settings, bootstrap: str, role: str, name: str | None = None, extra_args: list[str] | None = None
) -> subprocess.Popen:
    """Start ``role`` (worker|projector|supervisor) in its own session; its log goes to ``<run>/<name>.log``."""
    name = name or role
    private_dir(settings.home)
    private_dir(settings.run_dir)
    log = open_private(settings.run_dir / f"{name}.log")
    args = [sys.executable, "-m", MODULES[role], *(extra_args or [])]
    if role == "worker":
        args += ["--name", name]
    proc = subprocess.Popen(
        args,
        env=child_env(settings, bootstrap),
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
        umask=PRIVATE_UMASK,
    )
    write_pidfile(settings, name, proc.pid)
    return proc


def write_pidfile(settings: Settings, name: str, pid: int) -> None:
    """``<run>/<name>.pid`` holding ``pid``, replaced whole: a reader never sees it empty or half
    written (`somnus up --detach` polls the supervisor's while the supervisor writes its own)."""
    path = pidfile(settings, name)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    with open_private(tmp, "w") as f:
        f.write(str(pid))
    os.replace(tmp, path)


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system) ``pid`` has used so far, from ``/proc/<pid>/stat``."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def peak_rss_mb(pid: int) -> float | None:
    """The largest resident set ``pid`` has had (``VmHWM`` in ``/proc/<pid>/status``), in MiB."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return None


def pid_alive(pid: int) -> bool:
    """Is ``pid`` a live process? A zombie (exited, not yet reaped) counts as dead."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except OSError:
        return True


def running(settings: Settings, name: str) -> int | None:
    try:  # the process may remove its pid file between a check and the read
        pid = int(pidfile(settings, name).read_text())
    except (FileNotFoundError, ValueError):  # gone, or half written
        return None
    return pid if pid_alive(pid) else None


def stop(settings: Settings, name: str, timeout_s: float = 30.0) -> bool:
    pid = running(settings, name)
    path = pidfile(settings, name)
    if pid is None:
        path.unlink(missing_ok=True)
        return False
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if running(settings, name) is None:
            break
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
        time.sleep(0.1)
    else:
        os.kill(pid, signal.SIGKILL)
    path.unlink(missing_ok=True)
    return True
