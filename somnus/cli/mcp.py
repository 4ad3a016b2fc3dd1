"""``somnus mcp``: the memory as MCP tools over stdio or streamable HTTP (docs/integrations/mcp.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from somnus.cli.app import app


@app.command("mcp")
def mcp(
    transport: str = typer.Option("stdio", "--transport", help="stdio, or http (streamable HTTP at /mcp)."),
    host: Optional[str] = typer.Option(
        None, "--host", help="HTTP: the address to bind (SOMNUS_MCP_HOST, default 127.0.0.1)."
    ),
    port: Optional[int] = typer.Option(None, "--port", help="HTTP: the port (SOMNUS_MCP_PORT, default 8765)."),
    home: Optional[Path] = typer.Option(None, "--home", help="State folder (SOMNUS_HOME)."),
    db: Optional[Path] = typer.Option(None, "--db", help="DuckDB file (SOMNUS_DB)."),
) -> None:
    """Serve the memory as MCP tools (recall, briefing, context, predict, facts, episodic context, rhythms,
    remember) over stdio or streamable HTTP, with the same tokens and scopes as the HTTP API."""
    from somnus.config import Settings
    from somnus.mcp_server import DEFAULT_PORT, serve  # the SDK and asyncio: only for this command

    s = Settings.resolve(home=home, db_path=db)
    try:
        serve(s, transport, host or s.mcp_host, port or s.mcp_port or DEFAULT_PORT)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--transport") from None
