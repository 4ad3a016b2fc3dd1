"""Counters of one worker process (logged; the projections hold the durable counts)."""

import json
import os
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any


@dataclass
class WorkerCounters:
    events: int = 0
    episodes: int = 0
    dead_letters: int = 0
    duplicates: int = 0
    late: int = 0  # events of a session that had ended, or too old to tell (dead letters)
    forgotten: int = 0  # closed sessions whose marker expired (somnus.processors.sessions.session_retention)
    abandoned: int = 0  # open sessions closed after the idle time (somnus.processors.sessions.session_retention)
    future: int = 0  # events stamped ahead of their record by more than the clock skew allowed (dead letters)
    shredded: int = 0  # sealed records (parts of multi-part ones) whose data key a forget deleted: skipped
    poison: int = 0  # records whose distillation raised (dead letters, kind poison)
    facts: int = 0
    observations: int = 0
    link_updates: int = 0
    memory_units: int = 0
    # trace records handed on after waiting max_hold_s for a stalled partition (streams/sequencer.py):
    # the one timing-dependent ordering decision; 0 in a run whose derived records are in the canonical order
    sequencer_forced: int = 0


# ---- Prometheus: each worker serves its counters on 127.0.0.1 (docs/integrations/metrics.md) ----


def worker_collector(counters: WorkerCounters, worker: str) -> Any:
    """A Prometheus collector reading ``counters`` when scraped: ``somnus_worker_<field>_total{worker}``.

    >>> from prometheus_client import CollectorRegistry
    >>> reg = CollectorRegistry(); c = WorkerCounters(events=5)
    >>> reg.register(worker_collector(c, "w1"))
    >>> reg.get_sample_value("somnus_worker_events_total", {"worker": "w1"})
    5
    """
    from prometheus_client.core import CounterMetricFamily
    from prometheus_client.registry import Collector

    class _Counters(Collector):
        def collect(self) -> Any:
            for f in fields(counters):
                c = CounterMetricFamily(
                    f"somnus_worker_{f.name}", f"Worker counter {f.name} since the process started.", labels=["worker"]
                )
                c.add_metric([worker], getattr(counters, f.name))
                yield c

    return _Counters()


def serve_worker_metrics(counters: WorkerCounters, worker: str, run_dir: Path, port: int = 0) -> int:
    """Serve ``GET /metrics`` of this worker on 127.0.0.1 (``port`` 0: any free one) in a daemon thread,
    and write the port to ``<run_dir>/<worker>.metrics.json``; returns the port. Counters only, no
    memory content: unauthenticated, like a node exporter, and bound to loopback."""
    from prometheus_client import CollectorRegistry, start_http_server

    registry = CollectorRegistry()
    registry.register(worker_collector(counters, worker))
    server, _ = start_http_server(port, addr="127.0.0.1", registry=registry)
    bound = int(server.server_port)
    run_dir.mkdir(parents=True, exist_ok=True)
    tmp = run_dir / f"{worker}.metrics.tmp"
    tmp.write_text(json.dumps({"worker": worker, "pid": os.getpid(), "port": bound}))
    tmp.replace(run_dir / f"{worker}.metrics.json")
    return bound
