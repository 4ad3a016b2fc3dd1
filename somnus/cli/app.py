"""The root ``somnus`` typer app that every command module adds its commands to (``somnus/cli/__init__.py``)."""

from __future__ import annotations

import typer

app = typer.Typer(help="Somnus: memory for fleets of AI agents (Kafka -> Faust -> DuckDB).", no_args_is_help=True,
                  pretty_exceptions_enable=False, rich_markup_mode=None)
