"""Bearer tokens for the HTTP reads: ``token create | list | revoke`` (SECURITY.md)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from somnus.cli.app import app
from somnus.cli.common import CsvOpt, HomeOpt, JsonOpt, fail, note, settings
from somnus.cli.tables import one_of, show

token_app = typer.Typer(help="Bearer tokens for the HTTP reads (SECURITY.md).", no_args_is_help=True)
app.add_typer(token_app, name="token")


@token_app.command("create")
def token_create(
    agent: Optional[str] = typer.Option(None, "--agent", help="The agent whose scope chain it reads."),
    user: Optional[str] = typer.Option(None, "--user", help="Only this user's memories of the agent."),
    operator: bool = typer.Option(False, "--operator", help="Every route (SQL, whole-store reads)."),
    label: str = typer.Option("", "--label", help="A note shown by `somnus token list`."),
    expires: Optional[str] = typer.Option(
        None, "--expires", help="Lifetime, e.g. 30d, 12h, 2w: refused (401) after it."
    ),
    home: Optional[Path] = HomeOpt,
) -> None:
    """Print a new token (stored hashed in SOMNUS_HOME; shown once): `export SOMNUS_TOKEN=$(somnus token create ...)`."""
    from datetime import datetime, timezone

    from somnus.projections.auth import TokenStore, parse_duration
    from somnus.schemas.agents import AgentFileError, load_agents

    s = settings(home)
    if operator and (agent or user):
        fail("an operator token reads everything: give --operator alone, or --agent [--user]")
    try:
        until = None if expires is None else datetime.now(timezone.utc) + parse_duration(expires)
        token, record = TokenStore(s.home).create(
            operator=operator, agent=agent, user=user, label=label, expires_at=until
        )
    except ValueError as exc:
        fail(str(exc))
    try:
        if agent and agent not in load_agents(s.agents_dir):
            note(f"note: {agent!r} is not declared in the agents folder; the token reads its own scope and global")
    except AgentFileError:
        pass
    note(
        f"token {record.id} for {record.principal().describe()}"
        + (f", expires {record.expires_at}" if record.expires_at else "")
    )
    print(token)


@token_app.command("list")
def token_list(home: Optional[Path] = HomeOpt, as_json: bool = JsonOpt, as_csv: bool = CsvOpt) -> None:
    """The issued tokens (ids and scopes; the tokens themselves are not stored)."""
    import msgspec

    from somnus.projections.auth import TokenStore

    one_of(as_json, as_csv)
    records = TokenStore(settings(home).home).records()
    if as_json:
        print(json.dumps([{k: v for k, v in msgspec.to_builtins(r).items() if k != "sha256"} for r in records]))
        return
    show(
        ["id", "reads", "created", "expires", "label"],
        [[r.id, r.principal().describe(), r.created_at, r.expires_at or "never", r.label] for r in records],
        as_csv=as_csv,
    )


@token_app.command("revoke")
def token_revoke(
    which: str = typer.Argument(..., help="A token id (from `somnus token list`) or the token."),
    home: Optional[Path] = HomeOpt,
) -> None:
    """Revoke a token: refused from the next request on (the servers follow the store)."""
    from somnus.projections.auth import TokenStore

    try:
        gone = TokenStore(settings(home).home).revoke(which)
    except ValueError as exc:
        fail(str(exc))
    if not gone:
        fail(f"no token matches {which!r} (ids have at least 6 characters)")
    for r in gone:
        print(f"revoked {r.id} ({r.principal().describe()})")
