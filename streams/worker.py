"""Entry point of a Faust worker: ``python -m streams.worker [--name NAME]``."""

from __future__ import annotations

import argparse
import logging
import os
import sys

from somnus.broker import bootstrap_for
from somnus.config import Settings
from streams.app import create_app
from streams.topics import ensure_topics


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="somnus-worker")
    parser.add_argument("--name", default="worker")
    parser.add_argument("--loglevel", default=os.environ.get("SOMNUS_LOGLEVEL", "warning"))
    args = parser.parse_args(argv)
    settings = Settings.resolve()
    bootstrap = bootstrap_for(settings, start_if_missing=False)
    ensure_topics(settings, bootstrap)
    app = create_app(settings, bootstrap, worker_name=args.name)
    logging.basicConfig(level=args.loglevel.upper())
    from faust import Worker

    worker = Worker(app, loglevel=args.loglevel, quiet=True, redirect_stdouts=False)
    sys.argv = [sys.argv[0]]
    worker.execute_from_commandline()


if __name__ == "__main__":
    main()
