"""``somnus mcp``: the memory as MCP tools (official ``mcp`` SDK), over stdio or streamable HTTP.

Every read tool is a thin call of the projector's HTTP read API (``somnus.reads.read`` with
``remote_only``) with the caller's bearer token, so a token sees over MCP exactly what it sees over
HTTP (``projections/auth.py``): an agent token reads its own agent's scope chain, whole-store reads
(``predict``) need an operator token. ``remember`` publishes the agent's note to the traces topic
through Kafka, as a session of three trace events, like every other write.

The token: over stdio, ``SOMNUS_TOKEN`` or the home's operator token (``somnus.reads.token_for``);
over HTTP, the ``Authorization: Bearer`` header of each MCP request, checked against the projector's
token store before the request reaches the SDK (401 otherwise). ``somnus up`` supervises the HTTP
server (``python -m somnus.mcp_server``: ``SOMNUS_MCP_HOST``, ``SOMNUS_MCP_PORT``; port 0: not started).
docs/integrations/mcp.md.
"""

import asyncio
import json
import logging
import uuid
from collections.abc import Awaitable, Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from somnus.config import Settings

log = logging.getLogger("somnus.mcp")

DEFAULT_PORT = 8765  # of the streamable HTTP server when SOMNUS_MCP_PORT is 0 (off under `somnus up`)
NOTE_TASK = "remember"  # the session_start task of a note; metadata.source says it came over MCP
MAX_NOTE_CHARS = 20_000


class McpRefused(Exception):
    """A tool call the caller's token may not make (its message is the tool's error)."""


def bearer(headers: Any) -> str | None:
    """The token of an ``Authorization: Bearer`` header (any case), or None.

    >>> bearer({"authorization": "Bearer abc "}), bearer({"Authorization": "Basic x"}), bearer(None)
    ('abc', None, None)
    """
    if not headers:
        return None
    value = next((v for k, v in dict(headers).items() if k.lower() == "authorization"), "")
    scheme, _, token = str(value).partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None


def note_events(
    agent: str, note: str, now: datetime, user_id: str | None = None, session_id: str | None = None
) -> list[dict[str, Any]]:
    """An agent's explicit note as v1 trace events: a session of its own that starts, says the note
    (an agent message) and ends in success.

    >>> evs = note_events("support", "refunds need a receipt", datetime(2026, 1, 1, tzinfo=timezone.utc))
    >>> [e["type"] for e in evs], evs[1]["payload"]["text"], len({e["session_id"] for e in evs})
    (['session_start', 'agent_message', 'session_end'], 'refunds need a receipt', 1)
    """
    if not note.strip():
        raise ValueError("argument `note`: the text to remember is required")
    if len(note) > MAX_NOTE_CHARS:
        raise ValueError(f"argument `note`: {len(note)} characters, more than {MAX_NOTE_CHARS}")
    sid = session_id or f"note-{uuid.uuid4()}"
    # "mode": "conversation" makes the worker keep the message itself as a memory unit (recallable by its
    # words; somnus.processors.sessions.batch.memory_units), beside the episode of the session.
    start: dict[str, Any] = {"task": NOTE_TASK, "metadata": {"source": "mcp", "kind": "note", "mode": "conversation"}}
    if user_id:
        start["user_id"] = user_id
    payloads = [
        ("session_start", start),
        ("agent_message", {"text": note}),
        ("session_end", {"outcome": "success", "reason": "note"}),
    ]
    return [
        {
            "event_id": str(uuid.uuid4()),
            "schema_version": 1,
            "ts": now.isoformat(),
            "agent": agent,
            "session_id": sid,
            "seq": i,
            "type": kind,
            "payload": payload,
        }
        for i, (kind, payload) in enumerate(payloads)
    ]


class Memory:
    """What the tools call: the projector's reads with a token, and the publishing of notes."""

    def __init__(
        self,
        settings: Settings,
        token_of: Callable[[Any], str | None],
        publish: Callable[[list[dict[str, Any]]], Awaitable[int]] | None = None,
    ) -> None:
        self.settings, self.token_of = settings, token_of
        self.db = settings.db
        self._publish = publish
        self.publish_goal: Callable[[str, str, str | None, str], Awaitable[None]] | None = None  # tests: no Kafka

    async def read(self, ctx: Any, handler: str, agent: str | None = None, **params: Any) -> Any:
        from somnus.reads import ReadError, read

        token = self.token_of(ctx)
        if not token:
            raise McpRefused("no token: set SOMNUS_TOKEN (stdio) or send `Authorization: Bearer <token>` (HTTP)")
        try:
            return await asyncio.to_thread(read, self.db, handler, agent, token=token, remote_only=True, **params)
        except ReadError as exc:
            raise McpRefused(str(exc)) from None

    def principal(self, token: str) -> Any:
        """What ``token`` stands for in the projector's token store (None: not a token of it)."""
        from somnus.projections import auth

        return auth.TokenStore(token_home(self.settings)).principal(token)

    def writer(self, ctx: Any, what: str, agent: str, user_id: str | None) -> str | None:
        """Whether the caller's token may write for ``agent`` (else ``McpRefused``), and the user the
        write is for: a user-bound token's own."""
        token = self.token_of(ctx)
        principal = self.principal(token) if token else None
        if principal is None:
            raise McpRefused(f"{what} needs a valid token of this Somnus home")
        if not principal.operator and principal.agent != agent:
            raise McpRefused(f"this token writes for agent {principal.agent!r} only, not {agent!r}")
        if principal.user is not None:
            if user_id not in (None, principal.user):
                raise McpRefused(f"this token writes for user {principal.user!r} only")
            user_id = principal.user
        return user_id

    async def set_goal(self, ctx: Any, agent: str, text: str, user_id: str | None) -> dict[str, Any]:
        """Publish a goal for ``agent`` on the memory topic (docs/concepts/goals.md), stamped now."""
        from somnus.schemas.goals import MAX_GOAL_TEXT

        user_id = self.writer(ctx, "goal_set", agent, user_id)
        if not text.strip() or len(text) > MAX_GOAL_TEXT:
            raise McpRefused(f"argument `text`: a goal is a sentence of 1 to {MAX_GOAL_TEXT} characters")
        goal_id = f"g-{uuid.uuid4().hex[:12]}"
        await (self.publish_goal or self._goal_to_kafka)(agent, text.strip(), user_id, goal_id)
        return {"agent": agent, "goal_id": goal_id}

    async def _goal_to_kafka(self, agent: str, text: str, user_id: str | None, goal_id: str) -> None:
        from somnus import memory_requests
        from somnus.broker import BrokerError, bootstrap_for

        try:
            bootstrap = await asyncio.to_thread(bootstrap_for, self.settings, start_if_missing=False)
        except BrokerError as exc:
            raise McpRefused(f"no broker to publish to: {exc}") from None
        await asyncio.to_thread(
            memory_requests.set_goal,
            self.settings,
            bootstrap,
            agent,
            text,
            datetime.now(timezone.utc),
            user_id,
            "mcp",
            goal_id,
        )

    async def remember(self, ctx: Any, agent: str, note: str, user_id: str | None) -> dict[str, Any]:
        user_id = self.writer(ctx, "remember", agent, user_id)
        try:
            events = note_events(agent, note, datetime.now(timezone.utc), user_id)
        except ValueError as exc:
            raise McpRefused(str(exc)) from None
        sent = await (self._publish or self._to_kafka)(events)
        return {"agent": agent, "session_id": events[0]["session_id"], "events": sent}

    async def _to_kafka(self, events: list[dict[str, Any]]) -> int:
        from somnus.broker import BrokerError, bootstrap_for
        from somnus.client import publish_async

        try:
            bootstrap = await asyncio.to_thread(bootstrap_for, self.settings, start_if_missing=False)
        except BrokerError as exc:
            raise McpRefused(f"no broker to publish to: {exc}") from None
        return await publish_async(events, bootstrap, self.settings.traces_topic)


def token_home(settings: Settings) -> Path:
    """The home whose token store the running projector checks (its endpoint file names it), else ours."""
    from somnus.reads import _projector

    info = _projector(settings.db) or {}
    return Path(info["token_file"]).parent if info.get("token_file") else Path(settings.home)


# Routes whose answers the read API neutralises itself (labelled lines of neutral text).
PROMPT_ROUTES = frozenset({"briefing", "context", "episodic_context"})


def build(memory: Memory) -> Any:
    """The MCPServer with Somnus's tools over ``memory``."""
    from mcp.server.mcpserver import Context, MCPServer
    from mcp.server.mcpserver.exceptions import ToolError

    from somnus.processors.briefing.injection import neutral_json, one_line

    class NeutralErrors(MCPServer):
        """A tool's error goes to the model as its answer, and it echoes the caller's arguments (the
        read API's 400s name the value, a refusal names the agent asked for, the SDK's own argument
        checks quote the input): each error's text is neutralised like an answer (one line, no
        marker, no invisible character)."""

        async def call_tool(self, name: str, arguments: dict[str, Any], context: Any = None) -> Any:
            try:
                return await super().call_tool(name, arguments, context)
            except ToolError as exc:
                exc.args = (one_line(str(exc)),)
                raise

    server = NeutralErrors(
        "somnus",
        instructions="Memory for AI agents: recall past work, read briefings and facts, "
        "predict a call's outcome, and remember notes. Each tool reads one agent's scope.",
    )

    async def call(ctx: Context, handler: str, agent: str | None = None, **params: Any) -> str:
        """The route's JSON, as one text block (a list would otherwise be one block per item). A tool's
        answer goes into a model's context: every string of a data route's answer (recall, facts, predict,
        rhythms) is neutralised (no marker, no invisible character, one line); the prompt routes'
        answers are neutral already, with their labelled lines (issue 25 item 5)."""
        try:
            got = await memory.read(ctx, handler, agent, **params)
        except McpRefused as exc:
            raise ToolError(str(exc)) from None
        return json.dumps(got if handler in PROMPT_ROUTES else neutral_json(got), default=str)

    @server.tool(structured_output=False)
    async def recall(agent: str, query: str, ctx: Context, k: int = 10) -> str:
        """Memories of the agent's scope chain that best answer the query (fused lexical, similarity and graph recall)."""
        return await call(ctx, "recall", agent, query=query, k=k)

    @server.tool(structured_output=False)
    async def briefing(agent: str, ctx: Context) -> str:
        """The agent's cached briefing (Markdown: key knowledge, lessons, warnings); null when it has none."""
        return await call(ctx, "briefing", agent)

    @server.tool(structured_output=False)
    async def context(
        agent: str,
        query: str,
        ctx: Context,
        user_id: str | None = None,
        session_id: str | None = None,
        max_tokens: int = 4000,
    ) -> str:
        """One fitted context for a prompt: user synopsis, the session's recent conversation, recall, knowledge, briefing."""
        return await call(
            ctx, "context", agent, query=query, user_id=user_id, session_id=session_id, max_tokens=max_tokens
        )

    @server.tool(structured_output=False)
    async def predict(
        tool: str, ctx: Context, args: dict[str, Any] | None = None, agent: str | None = None, hour: str | None = None
    ) -> str:
        """Likely outcomes of a tool call before it is made (causal links learned from the stream). Operator token."""
        return await call(
            ctx, "predict", tool=tool, args=json.dumps(args) if args is not None else None, agent=agent, hour=hour
        )

    @server.tool(structured_output=False)
    async def facts(
        agent: str,
        ctx: Context,
        as_of: str | None = None,
        limit: int = 50,
        predicate: str | None = None,
        entity: str | None = None,
    ) -> str:
        """Facts of the agent's scope chain, highest confidence first; as_of (ISO 8601) gives those active then."""
        return await call(ctx, "facts", agent, as_of=as_of, limit=limit, predicate=predicate, entity=entity)

    @server.tool(structured_output=False)
    async def episodic_context(
        agent: str, query: str, ctx: Context, top_k: int = 5, token_budget: int = 2000, success_only: bool = False
    ) -> str:
        """Token-budgeted text of the agent's relevant past work: task, result, lessons, tools."""
        return await call(
            ctx,
            "episodic_context",
            agent,
            query=query,
            top_k=top_k,
            token_budget=token_budget,
            success_only="true" if success_only else None,
        )

    @server.tool(structured_output=False)
    async def rhythms(agent: str, ctx: Context, hours: str = "9", days: str | None = None) -> str:
        """What usually happens for the agent at these local hours ("9" or "8,9,10"; days "weekdays", "weekend", "0,1")."""
        return await call(ctx, "rhythms", agent, hours=hours, days=days)

    @server.tool(structured_output=False)
    async def advise(agent: str, task: str, ctx: Context, user_id: str | None = None) -> str:
        """Before a task: strategies that worked, tools likely to fail, whether to ask a human, and the entities
        that mattered, from the agent's related past episodes (with their ids). Call it before starting work."""
        return await call(ctx, "advise", agent, task=task, user_id=user_id)

    @server.tool(structured_output=False)
    async def goals(agent: str, ctx: Context, user_id: str | None = None) -> str:
        """The agent's open goals and their forward prediction error (1: nothing it remembers is near the goal)."""
        return await call(ctx, "goals", agent, user_id=user_id)

    @server.tool(structured_output=False)
    async def goal_set(agent: str, text: str, ctx: Context, user_id: str | None = None) -> str:
        """Set a goal for the agent: a desired future state, in a sentence. Recall then leans towards
        memories near it, and `goals` says how far the agent's memories are from it (forward PE)."""
        try:
            return json.dumps(neutral_json(await memory.set_goal(ctx, agent, text, user_id)))
        except McpRefused as exc:
            raise ToolError(str(exc)) from None

    @server.tool(structured_output=False)
    async def wander(agent: str, ctx: Context, steps: int = 10, seed: int = 0, user_id: str | None = None) -> str:
        """A walk over the agent's memories by information gain (under-explored, uncertain, goal-adjacent,
        stale, random), each step with why it was taken: for exploring what the agent has not looked at."""
        return await call(ctx, "wander", agent, steps=steps, seed=seed, user_id=user_id)

    @server.tool(structured_output=False)
    async def remember(agent: str, note: str, ctx: Context, user_id: str | None = None) -> str:
        """Write an explicit note to the agent's memory (published through Kafka; recallable once projected)."""
        try:
            return json.dumps(neutral_json(await memory.remember(ctx, agent, note, user_id)))
        except McpRefused as exc:
            raise ToolError(str(exc)) from None

    return server


MAX_BODY_BYTES = 1 << 20  # of an MCP request: a JSON-RPC message; the SDK reads whatever comes, unbounded


class BearerGuard:
    """ASGI middleware of the HTTP transport: a request without a valid bearer token of the projector's
    token store gets 401 before the SDK sees it (503 when no token store can be read); a body larger
    than ``max_body`` (declared or as it streams) gets 413 before the SDK reads it (the SDK's
    ``request.body()`` has no bound: one request could take the process's memory)."""

    def __init__(self, app: Any, principal: Callable[[str], Any], max_body: int = MAX_BODY_BYTES) -> None:
        self.app, self.principal, self.max_body = app, principal, max_body

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope.get("headers", [])}
            token = bearer(headers)
            try:
                ok = token is not None and self.principal(token) is not None
            except Exception as exc:  # an unreadable store: the server cannot check, so it refuses
                return await _deny(send, 503, f"the token store cannot be read: {exc}")
            if not ok:
                return await _deny(
                    send,
                    401,
                    "an `Authorization: Bearer <token>` header with a valid Somnus "
                    "token is required (`somnus token create --agent A`)",
                )
            declared = headers.get("content-length", headers.get("Content-Length", ""))
            if declared.strip().isdigit() and int(declared) > self.max_body:
                return await _deny(send, 413, f"the body is {int(declared)} bytes; at most {self.max_body}")
            if scope.get("method") in ("POST", "PUT", "PATCH"):
                body = await self._body(receive)
                if body is None:
                    return await _deny(send, 413, f"the body is larger than {self.max_body} bytes")
                receive = _replay(body, receive)
        await self.app(scope, receive, send)

    async def _body(self, receive: Any) -> bytes | None:
        """The request's body, read within ``max_body`` (None once it is over)."""
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return b"".join(chunks)  # a disconnect: the app sees an empty body, then the disconnect
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body:
                return None
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)


def _replay(body: bytes, receive: Any) -> Any:
    """A ``receive`` that gives the body read already, then what the client sends next (a disconnect)."""
    sent = False

    async def replay() -> Any:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


async def _deny(send: Any, status: int, message: str) -> None:
    body = json.dumps({"error": message}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if status == 401:
        headers.append((b"www-authenticate", b'Bearer realm="somnus"'))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def serve(
    settings: Settings, transport: str, host: str = "127.0.0.1", port: int = DEFAULT_PORT, token: str | None = None
) -> None:
    """Run the server until stopped: ``stdio`` (token from ``token``, SOMNUS_TOKEN or the home) or ``http``
    (streamable HTTP at ``http://host:port/mcp``, the bearer token of each request)."""
    from somnus.reads import token_for

    if transport == "stdio":
        fixed = token_for(settings.db, token)
        build(Memory(settings, lambda ctx: fixed)).run("stdio")
        return
    if transport != "http":
        raise ValueError(f"transport: stdio or http, not {transport!r}")
    import uvicorn

    memory = Memory(settings, lambda ctx: bearer(ctx.headers))
    app = build(memory).streamable_http_app(host=host)
    log.info("MCP server on http://%s:%d/mcp (streamable HTTP)", host, port)
    uvicorn.Server(http_config(BearerGuard(app, memory.principal), host, port)).run()


def http_config(app: Any, host: str, port: int) -> Any:
    """The uvicorn configuration of the HTTP transport: its connections bounded (``bounded_protocol``)."""
    import uvicorn

    return uvicorn.Config(app, host=host, port=port, log_level="warning", http=bounded_protocol())


def bounded_protocol(idle_timeout_s: float | None = None, max_connections: int | None = None) -> type:
    """uvicorn's HTTP protocol with the read API's connection bounds (``somnus.projections.http``): a
    connection with no request in progress, from its start or since its last response, is closed after
    ``idle_timeout_s``, and each one beyond ``max_connections`` closes the oldest. uvicorn keeps a
    connection that has not sent its headers for ever (its ``timeout_keep_alive`` starts after a
    response; it has no header timeout) and its ``limit_concurrency`` counts such connections, then
    answers 503 to everyone else. Relies on the protocol's ``loop``, ``transport``, ``cycle``,
    ``connections`` and ``on_response_complete`` (uvicorn 0.54; pinned by
    ``tests/somnus/test_mcp_server.py``)."""
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    from somnus.projections.http import IDLE_TIMEOUT_S, MAX_CONNECTIONS

    idle_s = IDLE_TIMEOUT_S if idle_timeout_s is None else idle_timeout_s
    most = MAX_CONNECTIONS if max_connections is None else max_connections

    class Bounded(AutoHTTPProtocol):  # type: ignore[misc, valid-type]
        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self.opened_at = self.loop.time()
            self._arm()
            open_now = [c for c in self.connections if c.transport is not None and not c.transport.is_closing()]
            if len(open_now) > most:
                min(open_now, key=lambda c: getattr(c, "opened_at", 0.0)).transport.close()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._arm()

        def _arm(self) -> None:
            self.idle_since = armed = self.loop.time()
            self.loop.call_later(idle_s, self._close_if_idle, armed)

        def _close_if_idle(self, armed: float) -> None:
            busy = self.cycle is not None and not self.cycle.response_complete
            if self.idle_since == armed and not busy and not self.transport.is_closing():
                self.transport.close()

    return Bounded


def main(argv: list[str] | None = None) -> None:
    """``python -m somnus.mcp_server [--host H] [--port P]``: the streamable HTTP server that ``somnus up``
    supervises (``SOMNUS_MCP_HOST``, ``SOMNUS_MCP_PORT``; settings from the environment)."""
    from somnus import procs

    settings, host, port = procs.server_process("somnus-mcp", argv)
    serve(settings, "http", host or settings.mcp_host, port or settings.mcp_port or DEFAULT_PORT)


if __name__ == "__main__":
    main()
