"""What every sub-command shares: the common options, settings, errors, the bootstrap and event time.

Only typer and the standard library at import: every command module imports this, and ``somnus
--help`` imports every command module.
"""

from __future__ import annotations

import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, NoReturn, Optional

import typer

from somnus.config import Settings

HomeOpt = typer.Option(None, "--home", help="State folder (SOMNUS_HOME).")
DbOpt = typer.Option(None, "--db", help="DuckDB file (SOMNUS_DB).")
BootOpt = typer.Option(None, "--bootstrap", help="Kafka bootstrap servers (KAFKA_BOOTSTRAP).")
JsonOpt = typer.Option(False, "--json", help="Print JSON.")
CsvOpt = typer.Option(False, "--csv", help="Print CSV (a header line, then one line a row).")
KeepBrokerOpt = typer.Option(False, "--keep-broker", help="Leave the local broker running if this run started it.")
# `somnus import --format` (the registry is somnus.importers.FORMATS; a test holds the two together)
FORMATS_HELP = (
    "openai-chat (or: tau-bench, tau2, inspect, langchain, autogen, smolagents, gemini, adk, openai-agents)"
    " | swe-agent | openhands | locomo | toolbench | otel | v1"
)
AT_HELP = "Event time (ISO 8601; UTC unless it says); default: the stream time of the scope it concerns."


def settings(home: Optional[Path] = None, db: Optional[Path] = None, bootstrap: Optional[str] = None) -> Settings:
    return Settings.resolve(home=home, db_path=db, bootstrap=bootstrap)


def db_of(s: Settings) -> Path:
    return s.db


def note(message: str) -> None:
    """A line for the person, on stderr (stdout stays the command's answer)."""
    print(message, file=sys.stderr, flush=True)


def fail(message: str, code: int = 1) -> NoReturn:
    note(f"error: {message}")
    raise typer.Exit(code)


def bootstrap(s: Settings, start: bool = False) -> str:
    """Kafka's bootstrap servers: the configured ones, else the local broker's (started if ``start``)."""
    from somnus import broker

    try:
        return broker.bootstrap_for(s, start_if_missing=start)
    except broker.BrokerError as exc:
        fail(str(exc))


def keep_broker(keep: bool) -> None:
    """A run that starts the local broker stops it again (somnus.bench.isolated_pipeline) unless kept."""
    if keep:
        import os

        os.environ["SOMNUS_KEEP_BROKER"] = "1"


def event_time(s: Settings, at: Optional[str], scope: str) -> datetime:
    """The event time of a person's command about ``scope``: ``--at`` when given (UTC unless it says),
    else the scope's stream time (the newest event time of its agents: ``stream_time`` read), so a
    command on historical data is stamped in that data's time, as it would have been live. The wall
    clock only when the scope has no event yet."""
    from somnus import reads

    if at:
        try:
            when = datetime.fromisoformat(at.replace("Z", "+00:00"))
        except ValueError:
            fail(f"--at {at!r}: not an ISO 8601 time")
        return when if when.tzinfo is not None else when.replace(tzinfo=timezone.utc)
    got: dict[str, Any] = {"at": None}  # nothing projected yet: no event to be consistent with
    if db_of(s).exists():
        try:
            got = reads.read(db_of(s), "stream_time", agents_dir=s.agents_dir, scope=scope)
        except reads.ReadError as exc:
            fail(str(exc))
    if got["at"] is None:
        note(f"{scope} has no event yet: stamped with the wall clock")
        return datetime.now(timezone.utc)
    return datetime.fromisoformat(got["at"])


def read(s: Settings, handler: str, agent: Optional[str] = None, **params: Any) -> Any:
    """A read of the projections (``somnus.reads.read``), its error a clean exit."""
    from somnus import reads

    try:
        return reads.read(db_of(s), handler, agent, agents_dir=s.agents_dir, **params)
    except reads.ReadError as exc:
        fail(str(exc))


def sql(s: Settings, query: str, params: Optional[list[Any]] = None) -> dict[str, Any]:
    """A read-only SELECT on the projections (``somnus.reads.sql``), its error a clean exit."""
    from somnus import reads

    try:
        return reads.sql(db_of(s), query, params)
    except reads.ReadError as exc:
        fail(str(exc))
