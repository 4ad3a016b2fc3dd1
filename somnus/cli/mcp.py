"""``somnus mcp``: the memory as MCP tools over stdio or streamable HTTP (docs/integrations/mcp.md)."""

from __future__ import annotations

from somnus.cli.app import app
from somnus.mcp_server import cli_command

app.command("mcp")(cli_command())
