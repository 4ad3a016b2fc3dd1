"""Entry point of a Faust worker: ``python -m somnus.streams.worker [--name NAME]``."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Any, cast

from somnus.broker import BrokerError, await_broker, bootstrap_for
from somnus.config import Settings
from somnus.procs import private_files, tune_gc
from somnus.streams import kafka_compat
from somnus.streams.kafka_compat.signals import route_debug_signals
from somnus.streams.app import create_app
from somnus.streams.liveness import diagnostics
from somnus.streams.metrics import serve_worker_metrics
from somnus.streams.topics import ensure_topics
from faust import Worker


def make_worker(app: Any, loglevel: str) -> Any:
    """A Faust worker without its terminal spinner. The spinner turns every log call into a record
    (it sets the root logger to DEBUG and spins once a record); aiokafka logs each message sent at
    debug, so that was about 5% of the worker's CPU (py-spy) for a log file nobody watches spin."""
    worker = Worker(app, loglevel=loglevel, quiet=True, redirect_stdouts=False)
    worker.spinner = None
    # mode installs these as its SIGUSR1 / SIGUSR2 handlers (instead of its dump and pdb)
    route_debug_signals(worker, *diagnostics(app))
    return worker


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="somnus-worker")
    parser.add_argument("--name", default="worker")
    parser.add_argument("--loglevel", default=os.environ.get("SOMNUS_LOGLEVEL", "warning"))
    args = parser.parse_args(argv)
    private_files()  # the Faust data folder and what it writes: private to this user
    tune_gc()
    logging.basicConfig(level=args.loglevel.upper())
    settings = Settings.resolve()
    bootstrap = bootstrap_for(settings, start_if_missing=False)
    try:
        await_broker(bootstrap, settings.broker_wait_s, logging.getLogger("somnus.worker"))
    except BrokerError as exc:
        sys.exit(f"somnus worker: {exc}")
    kafka_compat.apply(settings.max_batch_bytes)  # before any Kafka client is made (somnus.streams.kafka_compat)
    ensure_topics(settings, bootstrap)
    app = create_app(settings, bootstrap, worker_name=args.name)
    metrics_port = os.environ.get("SOMNUS_WORKER_METRICS_PORT", "0").strip()  # docs/integrations/metrics.md
    if metrics_port != "off":
        if not metrics_port.isdigit() or int(metrics_port) > 65535:
            sys.exit(
                f"somnus worker: SOMNUS_WORKER_METRICS_PORT: a port (0: any free one) or off, not {metrics_port!r}"
            )
        serve_worker_metrics(cast(Any, app).somnus_counters, args.name, settings.run_dir, int(metrics_port))
    worker = make_worker(app, args.loglevel)
    sys.argv = [sys.argv[0]]
    worker.execute_from_commandline()


if __name__ == "__main__":
    main()
