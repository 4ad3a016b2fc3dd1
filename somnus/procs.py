"""Start and stop the worker and projector processes (pid files in ``<SOMNUS_HOME>/run``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from somnus.config import Settings

MODULES = {"worker": "streams.worker", "projector": "projections.projector", "supervisor": "somnus.supervisor"}


# Young-generation collections every 50,000 net allocations instead of CPython's 700. The worker and
# the projector allocate many short-lived objects per batch over a large long-lived heap (session
# states, the memory index). Measured in `somnus bench e2e --events 300000` (gc callbacks timing every
# collection): the worker spent 3.38 s in 6,413 collections (47 of them full) with the defaults and
# 0.25 s in 24 with this; its CPU went from 75.7 to 64.7 µs an event. The projector's replay was ~5%
# faster (48.9 / 50.2 s -> 47.6 / 46.8 s). Cycles are still collected.
GC_THRESHOLD = (50_000, 20, 100)


def tune_gc() -> None:
    """Set the garbage collector's thresholds for a long-running worker or projector process."""
    import gc

    gc.set_threshold(*GC_THRESHOLD)


def pidfile(settings: Settings, name: str) -> Path:
    return settings.run_dir / f"{name}.pid"


def child_env(settings: Settings, bootstrap: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(settings.as_env())
    env["KAFKA_BOOTSTRAP"] = bootstrap
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def spawn(settings: Settings, bootstrap: str, role: str, name: str | None = None,
          extra_args: list[str] | None = None) -> subprocess.Popen:
    """Start ``role`` (worker|projector|supervisor) in its own session; its log goes to ``<run>/<name>.log``."""
    name = name or role
    settings.run_dir.mkdir(parents=True, exist_ok=True)
    log = open(settings.run_dir / f"{name}.log", "ab")
    args = [sys.executable, "-m", MODULES[role], *(extra_args or [])]
    if role == "worker":
        args += ["--name", name]
    proc = subprocess.Popen(args, env=child_env(settings, bootstrap), stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    pidfile(settings, name).write_text(str(proc.pid))
    return proc


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
    path = pidfile(settings, name)
    if not path.exists():
        return None
    pid = int(path.read_text())
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
