"""The ``somnus`` command line: a root typer app (``somnus.cli.app``) and one module per group of
sub-commands, each a thin layer over library functions.

To add a command: write ``somnus/cli/<name>.py`` whose functions are decorated with
``@app.command()`` (``from somnus.cli.app import app``) or which adds its own group with
``app.add_typer(...)``, and add its module name to ``COMMANDS`` below: that one line registers it.
A command module imports only typer and ``somnus.cli.common`` at its top; what a command needs is
imported inside it, so ``somnus --help`` and the read commands start at once (``somnus bench cli``).
"""

from __future__ import annotations

import importlib
import sys

from somnus.cli.app import app

COMMANDS = (
    "stack",  # up, down, broker *, demo
    "tokens",  # token create | list | revoke
    "ingest",  # publish, import, sample, ingest-knowledge
    "read",  # sql, checksum, status, inspect, brief, recall, context, predict, rhythms
    "memory",  # promote, consolidate, sleep, replay
    "goals",  # goal set | done | list, wander
    "graph",  # graph [--plot] (the associative memory graph's health)
    "forget",  # forget [--verify]
    "export",  # export parquet
    "otlp",  # otlp (the OTLP/HTTP receiver)
    "mcp",  # mcp (the memory as MCP tools)
    "advise",  # advise; bench advise | oscillators
    "eval",  # eval locomo | foresight
    "bench",  # bench e2e | ... | cli
)

for _name in COMMANDS:
    importlib.import_module(f"somnus.cli.{_name}")


def main() -> None:
    """The console entry point ``somnus``."""
    from somnus import procs

    procs.private_files()  # SOMNUS_HOME, the token, the broker's and the processes' files: private (0700 / 0600)
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)


__all__ = ["COMMANDS", "app", "main"]
