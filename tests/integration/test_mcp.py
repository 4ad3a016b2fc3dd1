"""``somnus mcp`` end to end: the mcp SDK's own client over stdio and over streamable HTTP (the server
``somnus up`` supervises), against a real stack (broker, worker, projector), with the same token
scoping as the HTTP read API."""

from __future__ import annotations

import dataclasses
import json
import socket
import subprocess
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import httpx2
import pytest
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

from somnus import procs
from somnus.projections import auth
from somnus.projections.projector import endpoint_file
from somnus.sample import generate
from tests.pipeline import Pipeline, wait_until

pytestmark = pytest.mark.integration

TOOLS = {
    "recall",
    "briefing",
    "context",
    "predict",
    "facts",
    "episodic_context",
    "rhythms",
    "advise",
    "remember",
    "goals",
    "goal_set",
    "wander",
}
NOTE = "The refund desk moved to building seven zebracorn"  # a word no sample session uses


def _text(result: Any) -> str:
    return " ".join(getattr(c, "text", "") for c in result.content)


def _ok(result: Any) -> Any:
    assert not result.is_error, _text(result)
    return json.loads(_text(result))


async def _calls(session: ClientSession, agent: str) -> dict[str, Any]:
    """List the tools and call each read once for ``agent``; the results by tool."""
    await session.initialize()
    assert {t.name for t in (await session.list_tools()).tools} == TOOLS
    calls = {
        "recall": {"agent": agent, "query": "refund desk building", "k": 5},
        "briefing": {"agent": agent},
        "context": {"agent": agent, "query": "refund"},
        "facts": {"agent": agent, "as_of": "2030-01-01T00:00:00Z", "limit": 5},
        "episodic_context": {"agent": agent, "query": "search the web", "token_budget": 300},
        "rhythms": {"agent": agent, "hours": "9,10,11"},
        "predict": {"tool": "web_search", "args": {"query": "x"}},
        "advise": {"agent": agent, "task": "search the web for a product and summarise the reviews"},
        "goals": {"agent": agent},
        "wander": {"agent": agent, "steps": 3, "seed": 1},
    }
    out = {name: await session.call_tool(name, args) for name, args in calls.items()}
    out["other"] = await session.call_tool("recall", {"agent": "researcher", "query": "refund desk"})
    out["remember_other"] = await session.call_tool("remember", {"agent": "researcher", "note": "not mine"})
    out["advise_other"] = await session.call_tool("advise", {"agent": "researcher", "task": "search the web"})
    out["goals_other"] = await session.call_tool("goals", {"agent": "researcher"})
    out["goal_set_other"] = await session.call_tool("goal_set", {"agent": "researcher", "text": "not mine"})
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(fn: Callable[[], Awaitable[Any]]) -> Any:
    return anyio.run(fn)


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "somnus.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )


def test_mcp_tools_over_stdio_and_http_are_scoped_like_the_http_api(pipeline_settings: Any) -> None:
    """`somnus up` runs the worker, the projector and the MCP server over HTTP (SOMNUS_MCP_PORT); the
    stdio server is started by the SDK's client itself."""
    port = _free_port()
    s = dataclasses.replace(pipeline_settings, mcp_port=port)
    p = Pipeline(s)  # its publish and wait_idle; `somnus up` starts the processes
    home = s.home
    env = procs.child_env(s, p.boot)
    started = _cli(env, "up", "--detach")
    assert started.returncode == 0, started.stdout + started.stderr
    try:
        assert procs.running(s, "mcp") is not None  # supervised with the worker and the projector
        p.publish(list(generate(sessions=40, seed=7)))
        wait_until(lambda: endpoint_file(s.db_path).exists(), 120, what="the projector's endpoint")
        p.wait_idle()
        support = auth.TokenStore(home).create(agent="support")[0]
        operator = auth.token_file(home).read_text().strip()

        # stdio: the token from SOMNUS_TOKEN; `remember` writes a note through Kafka.
        params = StdioServerParameters(
            command=sys.executable, args=["-m", "somnus.cli", "mcp"], env={**env, "SOMNUS_TOKEN": support}
        )

        async def over_stdio() -> dict[str, Any]:
            async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
                got = await _calls(session, "support")
                got["remember"] = await session.call_tool("remember", {"agent": "support", "note": NOTE})
                return got

        got = _run(over_stdio)
        for name in (
            "recall",
            "briefing",
            "context",
            "facts",
            "episodic_context",
            "rhythms",
            "advise",
            "goals",
            "wander",
        ):
            _ok(got[name])
        assert all(step["agent"] == "support" for step in _ok(got["wander"]).get("steps", []) if "agent" in step)
        assert got["goals_other"].is_error and "'support' only" in _text(got["goals_other"])
        assert got["goal_set_other"].is_error and "'support' only" in _text(got["goal_set_other"])
        assert all(h["agent"] == "support" for h in _ok(got["recall"])["hits"])
        advice = _ok(got["advise"])  # the pre-flight read, as GET /agents/support/advise answers it
        assert advice["agent"] == "support" and {"planning", "risks", "escalation", "salience"} <= set(advice)
        assert got["advise_other"].is_error and "'support' only" in _text(got["advise_other"])
        # The same refusals as the HTTP API: another agent's scope, a whole-store read, another's note.
        assert got["other"].is_error and "403" in _text(got["other"]) and "'support' only" in _text(got["other"])
        assert got["predict"].is_error and "operator token" in _text(got["predict"])
        assert got["remember_other"].is_error and "'support' only" in _text(got["remember_other"])
        noted = _ok(got["remember"])
        assert noted["events"] == 3 and noted["session_id"].startswith("note-")

        # streamable HTTP, the server `somnus up` started: the bearer token of each request.
        url = f"http://127.0.0.1:{port}/mcp"

        def up() -> bool:
            try:
                return httpx2.post(url, json={}, timeout=60).status_code == 401  # no token: refused before the SDK
            except httpx2.TransportError:
                return False

        wait_until(up, 120, what="the MCP HTTP server under somnus up")
        # (timeouts for a machine this busy: the server, the stack and the test share two cores)
        assert httpx2.post(url, json={}, headers={"Authorization": "Bearer forged"}, timeout=60).status_code == 401

        async def over_http(token: str, agent: str) -> dict[str, Any]:
            async with (
                httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=120) as http,
                streamable_http_client(url, http_client=http) as (read, write),
                ClientSession(read, write) as session,
            ):
                got = await _calls(session, agent)
                got["note_recall"] = await session.call_tool("recall", {"agent": agent, "query": "zebracorn", "k": 3})
                return got

        p.wait_idle()  # the note is projected
        as_operator = _run(lambda: over_http(operator, "support"))
        for name in (
            "recall",
            "briefing",
            "context",
            "facts",
            "episodic_context",
            "rhythms",
            "predict",
            "other",
            "advise",
            "advise_other",
            "goals",
            "wander",
            "goals_other",
        ):
            _ok(as_operator[name])
        assert _ok(as_operator["advise"])["agent"] == "support"
        as_support = _run(lambda: over_http(support, "support"))
        hits = _ok(as_support["note_recall"])["hits"]
        assert hits and "zebracorn" in hits[0]["text"] and hits[0]["agent"] == "support"
        assert as_support["other"].is_error and as_support["predict"].is_error and as_support["advise_other"].is_error
        researcher = auth.TokenStore(home).create(agent="researcher")[0]
        theirs = _run(lambda: over_http(researcher, "researcher"))
        assert _ok(theirs["note_recall"])["hits"] == []  # support's note is not in researcher's scope
    finally:
        down = _cli(env, "down")
    assert down.returncode == 0 and "mcp: stopped" in down.stdout, down.stdout + down.stderr
    for role in ("supervisor", "worker", "projector", "mcp"):
        assert procs.running(s, role) is None, role
