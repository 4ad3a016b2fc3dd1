"""Spans of one trace -> v1 trace events, by the OpenTelemetry GenAI semantic conventions (and the
OpenInference and OpenLLMetry attributes). Pure: no clock, no I/O; the same spans give the same events.

Each *agent span* (``gen_ai.operation.name`` ``invoke_agent`` / ``create_agent`` / ``invoke_workflow``,
OpenInference ``AGENT``, OpenLLMetry ``agent`` / ``workflow``) is a session: ``session_start`` at
its start, ``session_end`` at its end, outcome from its status (``somnus.outcome`` wins when set).
Every other span belongs to the session of its nearest agent ancestor: a tool span gives a
``tool_call`` at its start and a ``tool_result`` at its end; a chat span gives ``user_message`` /
``agent_message`` events for the captured content it carries (each text once per session); an agent
span nested in another agent's session is a ``delegation`` / ``delegation_result`` pair there and a
session of its own. A trace without an agent span is one session per root span that holds tool or
chat spans. docs/integrations/otlp.md has the table.

Events are ordered by time within a session (``seq`` from the time: ``SEQ_PER_MICROSECOND``) and their ids are ``uuid5`` of
(trace id, span id, role): mapping a trace again (an exporter's retry, a restarted receiver, a file
imported twice) gives the same events, which the pipeline applies once.

>>> from somnus.otlp.spans import Span
>>> t = "0af7651916cd43dd8448eb211c80319c"
>>> root = Span(trace_id=t, span_id="b7ad6b7169203331", name="invoke_agent support", start_ns=10**18,
...             end_ns=10**18 + 3 * 10**9, attributes={"gen_ai.operation.name": "invoke_agent",
...             "gen_ai.agent.name": "support", "gen_ai.conversation.id": "conv-1"})
>>> tool = Span(trace_id=t, span_id="00f067aa0ba902b7", parent_span_id="b7ad6b7169203331",
...             name="execute_tool refund", start_ns=10**18 + 10**9, end_ns=10**18 + 2 * 10**9,
...             attributes={"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "refund",
...             "error.type": "TimeoutError"}, status_code=2)
>>> [(e["seq"] - 16 * 10**15, e["type"]) for e in trace_events([root, tool])]
[(0, 'session_start'), (16000000, 'tool_call'), (32000000, 'tool_result'), (48000000, 'session_end')]
>>> trace_events([root, tool])[2]["payload"]["error"], trace_events([root, tool])[3]["payload"]["outcome"]
('TimeoutError', 'success')
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import orjson

from somnus.otlp.spans import MAX_VALUE_DEPTH, Span
from somnus.schemas.codec import check_json
from somnus.schemas.events import MAX_NAME_CHARS, SCHEMA_VERSION

OTLP_NAMESPACE = uuid.UUID("0c5e7d1a-3b9f-4e62-8a41-6f2d9c7b1e35")
MAX_TEXT = 2000  # characters of a tool's output or a message kept on an event
MAX_TASK = 500
# values of a JSON string attribute (tool arguments, a result) read as JSON; more, or nested deeper than an
# attribute may be (MAX_VALUE_DEPTH), and it is kept as its text: the worker refuses an event of more than
# 100,000 values, and a whole bundle record (the session's other events) nested deeper than 65
MAX_JSON_VALUES = 10_000
MAX_ID_CHARS = MAX_NAME_CHARS  # of a session id, user id, agent or tool name: the trace contract's bound
MAX_LINKS = 128  # of a span (the OTel SDK's default limit): a session's start lists them
# bytes of a tool's arguments, encoded: what the worker's default event limit (SOMNUS_MAX_EVENT_BYTES,
# 1 MiB) leaves for the rest of the event; the call's event would be refused beyond
MAX_ARGS_BYTES = (1 << 20) - (16 << 10)
OUTCOME_ATTRIBUTE = "somnus.outcome"  # success | failure | partial, on an agent span: wins over its status
STATUS_ERROR = 2
# seq = the event's time in µs x 16 (one more than the previous event's when that is not above it): it
# grows with time across the traces of one session id, so a later trace of an ended session is a
# visible `late` dead letter, never a silent duplicate of the first trace's seqs 0, 1, 2...
SEQ_PER_MICROSECOND = 16

AGENT_OPERATIONS = frozenset({"invoke_agent", "create_agent", "invoke_workflow"})
CHAT_OPERATIONS = frozenset({"chat", "text_completion", "generate_content"})
AGENT, TOOL, CHAT, OTHER = "agent", "tool", "chat", "other"
# The order of events at one instant: a session starts before anything in it and ends after; what
# ends there (a result, an answer) comes before what starts there, except what also started there.
START, ENDED_BEFORE, STARTS, ENDS_AT_START, END = 0, 1, 2, 3, 9


def span_kind(span: Span) -> str:
    """``agent``, ``tool``, ``chat`` or ``other``, by the GenAI conventions, then OpenInference, then
    OpenLLMetry, then the span name's first word (``invoke_agent x``, ``execute_tool x``, ``chat x``).

    >>> span_kind(Span(trace_id="", span_id="", name="x", start_ns=0, end_ns=0,
    ...                attributes={"openinference.span.kind": "TOOL"}))
    'tool'
    """
    a = span.attributes
    op = str(a.get("gen_ai.operation.name", ""))
    if op in AGENT_OPERATIONS:
        return AGENT
    if op == "execute_tool":
        return TOOL
    if op in CHAT_OPERATIONS:
        return CHAT
    oi = str(a.get("openinference.span.kind", "")).upper()
    if oi in ("AGENT", "TOOL", "LLM"):
        return {"AGENT": AGENT, "TOOL": TOOL, "LLM": CHAT}[oi]
    tl = str(a.get("traceloop.span.kind", "")).lower()
    if tl in ("agent", "workflow"):
        return AGENT
    if tl == "tool":
        return TOOL
    if str(a.get("llm.request.type", "")) in ("chat", "completion") or "gen_ai.prompt.0.content" in a:
        return CHAT
    word = span.name.split(" ", 1)[0]
    if word in AGENT_OPERATIONS:
        return AGENT
    return {"execute_tool": TOOL, "chat": CHAT}.get(word, OTHER)


# ---- values ------------------------------------------------------------------------------------


def _first(a: Mapping[str, Any], *keys: str) -> Any:
    for k in keys:
        v = a.get(k)
        if v not in (None, ""):
            return v
    return None


def _json(value: Any) -> Any:
    """A JSON string's value (the conventions put structured data in string attributes), within
    ``MAX_VALUE_DEPTH`` and ``MAX_JSON_VALUES``; else as is."""
    if isinstance(value, str) and value[:1] in ("{", "["):
        if check_json(value.encode(errors="surrogatepass"), None, MAX_VALUE_DEPTH, MAX_JSON_VALUES) is not None:
            return value
        try:
            return orjson.loads(value)
        except orjson.JSONDecodeError:
            return value
    return value


def _text(value: Any, limit: int = MAX_TEXT) -> str | None:
    if value is None:
        return None
    text = value if isinstance(value, str) else orjson.dumps(value, default=str).decode()
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _after_word(name: str, word: str) -> str:
    return name[len(word) :].strip() if name.startswith(word) else ""


def agent_name(span: Span, fallback: str | None = None) -> str:
    a = span.attributes
    name = _first(a, "gen_ai.agent.name", "agent.name")
    if name is None and str(a.get("traceloop.span.kind", "")).lower() in ("agent", "workflow"):
        name = _first(a, "traceloop.entity.name", "traceloop.workflow.name")
    if name is None and "gen_ai.operation.name" not in a:
        name = _after_word(span.name, "invoke_agent") or _after_word(span.name, "create_agent") or None
    return str(name or fallback or span.resource.get("service.name") or "otel")


def user_id_of(span: Span) -> str | None:
    """The session's user: a string, or an integer as its digits (``enduser.id`` is often a number; a
    session_start whose ``user_id`` is not a string is dead-lettered, and its session with it); an
    array, a map or a float names no user.

    >>> def span(**a): return Span(trace_id="t", span_id="s", name="n", start_ns=0, end_ns=0, attributes=a)
    >>> user_id_of(span(**{"enduser.id": 42})), user_id_of(span(**{"user.id": {"a": 1}}))
    ('42', None)
    """
    value = _first(span.attributes, "user.id", "enduser.id", "traceloop.association.properties.user_id")
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        return None
    return str(value)


def session_id_of(span: Span) -> str:
    return str(
        _first(span.attributes, "gen_ai.conversation.id", "session.id", "traceloop.association.properties.session_id")
        or span.trace_id
    )


def tool_name(span: Span) -> str:
    a = span.attributes
    return str(
        _first(a, "gen_ai.tool.name", "tool.name", "traceloop.entity.name")
        or _after_word(span.name, "execute_tool")
        or span.name
        or "tool"
    )


def oversized(span: Span) -> str | None:
    """Why this span would make an event the worker refuses (a rejected span), or None: a session, user,
    agent, tool, call, operation or service name longer than ``MAX_ID_CHARS``, more than ``MAX_LINKS``
    links, or a tool's arguments over ``MAX_ARGS_BYTES``. Such a name is on every event of its session (a 1.1 MB conversation id put each one over the
    worker's 1 MiB, and the whole session was dead-lettered after the receiver's 200), the links on its start."""
    a = span.attributes
    names = [
        ("session id", session_id_of(span)),
        ("user id", user_id_of(span)),
        ("agent name", agent_name(span)),
        ("operation", str(a.get("gen_ai.operation.name") or span.name)),
        ("service name", str(span.resource.get("service.name") or "")),
    ]
    if span_kind(span) == TOOL:
        names += [("tool name", tool_name(span)), ("call id", str(_first(a, "gen_ai.tool.call.id", "tool_call.id")))]
    for what, value in names:
        if value is not None and len(value) > MAX_ID_CHARS:
            return f"span {span.span_id}: its {what} has {len(value)} characters (at most {MAX_ID_CHARS})"
    if len(span.links) > MAX_LINKS:
        return f"span {span.span_id}: {len(span.links)} links (at most {MAX_LINKS})"
    if span_kind(span) == TOOL:
        size = len(
            orjson.dumps(_first(a, "gen_ai.tool.call.arguments", "input.value", "traceloop.entity.input"), default=str)
        )
        if size > MAX_ARGS_BYTES:
            return f"span {span.span_id}: its tool arguments are {size} bytes (at most {MAX_ARGS_BYTES})"
    return None


def tool_args(span: Span) -> dict[str, Any]:
    """The call's arguments: ``gen_ai.tool.call.arguments``, OpenInference ``input.value``, or
    OpenLLMetry ``traceloop.entity.input`` (``{"args": [...], "kwargs": {...}}``); a value that is not
    an object is kept under ``input``."""
    a = span.attributes
    value = _json(_first(a, "gen_ai.tool.call.arguments", "input.value", "traceloop.entity.input"))
    if isinstance(value, dict) and "traceloop.entity.input" in a and set(value) <= {"args", "kwargs", "inputs"}:
        kwargs = value.get("kwargs") or value.get("inputs") or {}
        value = (
            {**kwargs, **({"args": value["args"]} if value.get("args") else {})} if isinstance(kwargs, dict) else value
        )
    if value is None:
        return {}
    return value if isinstance(value, dict) else {"input": value}


def failure(span: Span) -> str | None:
    """Why a span failed (``error.type``, the status message, an exception event's message), or None.

    A span failed when its status is ERROR or it has ``error.type``."""
    a = span.attributes
    if span.status_code != STATUS_ERROR and not a.get("error.type"):
        return None
    exc = next((e.attributes for e in span.events if e.name == "exception"), {})
    parts = [
        str(a.get("error.type") or exc.get("exception.type") or ""),
        span.status_message or str(exc.get("exception.message") or ""),
    ]
    text = ": ".join(p for p in parts if p)
    return _text(text or "error", MAX_TEXT)


def outcome(span: Span) -> tuple[str, str | None]:
    """The outcome of a session span: ``somnus.outcome`` when it is one; else failure when the span failed."""
    given = str(span.attributes.get(OUTCOME_ATTRIBUTE, "")).lower()
    why = failure(span)
    if given in ("success", "failure", "partial"):
        return given, why
    return ("failure", why) if why else ("success", None)


# ---- messages ------------------------------------------------------------------------------------


def _content_text(content: Any) -> str | None:
    """Text of a message's content: a string, or the text parts of a list of parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = [
            str(p.get("content") if "content" in p else p.get("text", ""))
            for p in content
            if isinstance(p, dict) and p.get("type", "text") == "text"
        ]
        return "\n".join(t for t in texts if t) or None
    return None


def _message(m: Any) -> tuple[str, str] | None:
    if not isinstance(m, dict):
        return None
    text = _content_text(m["parts"]) if "parts" in m else _content_text(m.get("content"))
    if text is None and isinstance(m.get("message"), dict):
        return _message(m["message"])
    return (str(m.get("role", "")), text) if text else None


def _indexed(a: Mapping[str, Any], prefix: str, role: str, content: str) -> list[tuple[str, str]]:
    """OpenLLMetry's ``gen_ai.prompt.0.role`` and OpenInference's ``llm.input_messages.0.message.role``."""
    out, i = [], 0
    while f"{prefix}.{i}.{content}" in a or f"{prefix}.{i}.{role}" in a:
        text = a.get(f"{prefix}.{i}.{content}")
        if isinstance(text, str) and text:
            out.append((str(a.get(f"{prefix}.{i}.{role}", "")), text))
        i += 1
    return out


def _listed(value: Any) -> list[tuple[str, str]]:
    value = _json(value)
    if isinstance(value, dict):
        value = [value]
    return [m for m in map(_message, value) if m] if isinstance(value, list) else []


_EVENT_ROLES = {"gen_ai.user.message": "user", "gen_ai.assistant.message": "assistant", "gen_ai.choice": "assistant"}


def _event_messages(span: Span, output: bool) -> list[tuple[str, str]]:
    """Messages in span events: ``gen_ai.user.message`` / ``gen_ai.assistant.message`` / ``gen_ai.choice``
    (content in ``content``, ``gen_ai.event.content`` or ``message``), and the older
    ``gen_ai.content.prompt`` / ``gen_ai.content.completion`` (``gen_ai.prompt`` / ``gen_ai.completion``)."""
    out: list[tuple[str, str]] = []
    for e in span.events:
        if e.name == ("gen_ai.content.completion" if output else "gen_ai.content.prompt"):
            key = "gen_ai.completion" if output else "gen_ai.prompt"
            value = e.attributes.get(key)
            out += _listed(value) or ([("assistant" if output else "user", value)] if isinstance(value, str) else [])
        elif e.name in _EVENT_ROLES and (_EVENT_ROLES[e.name] == "assistant") == output:
            body = _json(_first(e.attributes, "gen_ai.event.content", "message", "content"))
            got = _message(body) if isinstance(body, dict) else (("", body) if isinstance(body, str) else None)
            if got:
                out.append((_EVENT_ROLES[e.name], got[1]))
    return out


def messages(span: Span, output: bool) -> list[tuple[str, str]]:
    """``(role, text)`` of a span's captured input (or output) messages, in every convention we read."""
    a = span.attributes
    if output:
        found = (
            _listed(a.get("gen_ai.output.messages"))
            + _indexed(a, "gen_ai.completion", "role", "content")
            + _indexed(a, "llm.output_messages", "message.role", "message.content")
        )
    else:
        found = (
            _listed(a.get("gen_ai.input.messages"))
            + _indexed(a, "gen_ai.prompt", "role", "content")
            + _indexed(a, "llm.input_messages", "message.role", "message.content")
        )
    return found + _event_messages(span, output)


def _io_value(span: Span, output: bool) -> str | None:
    """An agent span's plain input or output (OpenInference ``input.value``, OpenLLMetry ``traceloop.entity.*``)."""
    value = _json(
        _first(
            span.attributes,
            *(("output.value", "traceloop.entity.output") if output else ("input.value", "traceloop.entity.input")),
        )
    )
    if isinstance(value, dict) and isinstance(value.get("kwargs"), dict):  # OpenLLMetry: {"args": [], "kwargs": {}}
        value = value["kwargs"] or (value["args"][0] if len(value.get("args") or []) == 1 else value)
    if isinstance(value, dict):
        value = next(
            (
                value[k]
                for k in ("output", "input", "query", "question", "task", "prompt")
                if isinstance(value.get(k), str)
            ),
            value,
        )
    return _text(value) if value is not None else None


# ---- sessions --------------------------------------------------------------------------------------


@dataclass
class _SessionBuilder:
    span: Span
    agent: str
    session_id: str
    items: list[tuple[int, int, str, str, str, dict[str, Any]]] = field(default_factory=list)
    said: set[tuple[str, str]] = field(default_factory=set)

    def add(self, t_ns: int, span: Span, role: str, type_: str, payload: dict[str, Any], end: bool = False) -> None:
        order = {"session_start": START, "session_end": END}.get(
            type_, (ENDED_BEFORE if t_ns > span.start_ns else ENDS_AT_START) if end else STARTS
        )
        self.items.append((t_ns, order, span.span_id, role, type_, {k: v for k, v in payload.items() if v is not None}))

    def say(self, t_ns: int, span: Span, found: Iterable[tuple[str, str]], where: str, end: bool = False) -> None:
        for i, (role, text) in enumerate(found):
            kind = {
                "user": "user_message",
                "human": "user_message",
                "assistant": "agent_message",
                "model": "agent_message",
                "ai": "agent_message",
            }.get(role.lower())
            if kind is None or (kind, text) in self.said:
                continue  # system and tool messages; a history repeated by each chat span
            self.said.add((kind, text))
            self.add(t_ns, span, f"{where}{i}", kind, {"text": _text(text)}, end)


def _tool(s: _SessionBuilder, span: Span) -> None:
    call_id = str(_first(span.attributes, "gen_ai.tool.call.id", "tool_call.id") or span.span_id)
    name = tool_name(span)
    s.add(span.start_ns, span, "call", "tool_call", {"tool": name, "call_id": call_id, "args": tool_args(span)})
    why = failure(span)
    status = span.attributes.get("http.response.status_code")
    out = _first(span.attributes, "gen_ai.tool.call.result", "output.value", "traceloop.entity.output")
    s.add(
        span.end_ns,
        span,
        "result",
        "tool_result",
        {
            "call_id": call_id,
            "ok": why is None,
            "tool": name,
            "error": why,
            "http_status": status if isinstance(status, int) and 100 <= status <= 599 else None,
            "latency_ms": max(0.0, (span.end_ns - span.start_ns) / 1e6),
            "output": _text(out),
        },
        end=True,
    )


def _delegate(s: _SessionBuilder, child: Span, child_agent: str) -> None:
    task = _io_value(child, False) or next((t for r, t in messages(child, False) if r == "user"), None)
    s.add(
        child.start_ns,
        child,
        "delegation",
        "delegation",
        {"to_agent": child_agent, "task": _text(task or child.name, MAX_TASK), "delegation_id": child.span_id},
    )
    result, why = outcome(child)
    s.add(
        child.end_ns,
        child,
        "delegation_result",
        "delegation_result",
        {
            "to_agent": child_agent,
            "outcome": result,
            "delegation_id": child.span_id,
            "summary": why or _io_value(child, True),
        },
        end=True,
    )


def _iso(t_ns: int) -> str:
    t = datetime.fromtimestamp(t_ns // 1000 / 1e6, tz=timezone.utc)
    return t.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _events(s: _SessionBuilder) -> list[dict[str, Any]]:
    span, a = s.span, s.span.attributes
    if span_kind(span) == TOOL:  # a trace that is one tool call
        _tool(s, span)
    s.say(span.start_ns, span, messages(span, False) or ([("user", t)] if (t := _io_value(span, False)) else []), "in")
    s.say(
        span.end_ns,
        span,
        messages(span, True) or ([("assistant", t)] if (t := _io_value(span, True)) else []),
        "out",
        end=True,
    )
    task = next((p["text"] for *_, kind, p in sorted(s.items, key=lambda x: x[:3]) if kind == "user_message"), None)
    result, why = outcome(span)
    metadata = {
        "source": "otlp",
        "trace_id": span.trace_id,
        "span_id": span.span_id,
        "operation": a.get("gen_ai.operation.name") or span.name,
        "service": span.resource.get("service.name"),
        "conversation_id": a.get("gen_ai.conversation.id"),
        # links (a batch's cause, a previous turn): "trace id/span id" of each, kept for the analyst
        "links": [f"{k.trace_id}/{k.span_id}" for k in span.links] or None,
    }
    s.add(
        span.start_ns,
        span,
        "start",
        "session_start",
        {
            "task": _text(task or a.get("gen_ai.agent.description") or span.name, MAX_TASK),
            "user_id": user_id_of(span),
            "metadata": {k: v for k, v in metadata.items() if v is not None},
        },
    )
    s.add(max(span.end_ns, span.start_ns), span, "end", "session_end", {"outcome": result, "reason": why})
    out, seq = [], -1
    for t_ns, _, span_id, role, type_, payload in sorted(s.items, key=lambda x: x[:4]):
        seq = max(seq + 1, t_ns // 1000 * SEQ_PER_MICROSECOND)
        out.append(
            {
                "event_id": str(uuid.uuid5(OTLP_NAMESPACE, f"{span.trace_id}/{span_id}/{role}")),
                "schema_version": SCHEMA_VERSION,
                "ts": _iso(t_ns),
                "agent": s.agent,
                "session_id": s.session_id,
                "seq": seq,
                "type": type_,
                "payload": payload,
            }
        )
    return out


def _owner(span: Span, by_id: Mapping[str, Span], sessions: Mapping[str, Any]) -> str | None:
    """The span id of the session a span belongs to: its nearest ancestor that is a session span."""
    seen = 0
    parent = by_id.get(span.parent_span_id)
    while parent is not None and seen < len(by_id):
        if parent.span_id in sessions:
            return parent.span_id
        parent, seen = by_id.get(parent.parent_span_id), seen + 1
    return None


def _session_spans(spans: Sequence[Span], by_id: Mapping[str, Span], kinds: Mapping[str, str]) -> list[Span]:
    """The agent spans; a trace without one: each root span that holds tool or chat spans."""
    agents = [s for s in spans if kinds[s.span_id] == AGENT]
    if agents:
        return agents
    roots = [s for s in spans if s.parent_span_id not in by_id]
    work = [s for s in spans if kinds[s.span_id] in (TOOL, CHAT)]
    if not work:
        return []
    held = {_owner(s, by_id, {r.span_id: r for r in roots}) or s.span_id for s in work}
    return [r for r in roots if r.span_id in held]


def trace_events(spans: Sequence[Span], fallback_agent: str | None = None) -> list[dict[str, Any]]:
    """The v1 events of one trace's spans (duplicates by span id ignored), session by session.

    ``fallback_agent``: the agent of a session whose span names none (before ``service.name``)."""
    by_id = {s.span_id: s for s in spans}
    by_id |= {v.span_id: v for v in _missing_parents(list(by_id.values()), by_id)}
    spans = sorted(by_id.values(), key=lambda s: (s.start_ns, s.span_id))
    kinds = {s.span_id: span_kind(s) for s in spans}
    builders: dict[str, _SessionBuilder] = {}
    for s in _session_spans(spans, by_id, kinds):
        builders[s.span_id] = _SessionBuilder(s, agent_name(s, fallback_agent), session_id_of(s))
    # an agent span of the same agent inside another's session is the same session (a framework's inner span)
    for sid in list(builders):
        b = builders[sid]
        owner = _owner(b.span, by_id, builders)
        if owner is not None and builders[owner].agent == b.agent:
            del builders[sid]
    _distinct_sessions(list(builders.values()))
    for s in spans:
        owner = _owner(s, by_id, builders)
        if owner is None:
            continue
        b = builders[owner]
        if s.span_id in builders:
            _delegate(b, s, builders[s.span_id].agent)
        elif kinds[s.span_id] == TOOL:
            _tool(b, s)
        else:  # chat spans, and the agent spans merged into this session: their captured messages
            b.say(s.start_ns, s, messages(s, False), f"in{s.span_id}:")
            b.say(s.end_ns, s, messages(s, True), f"out{s.span_id}:", end=True)
    return [e for b in builders.values() for e in _events(b)]


def _distinct_sessions(builders: Sequence[_SessionBuilder]) -> None:
    """Two sessions of one agent under one session id in a trace (an agent invoked twice in a workflow,
    without a conversation id or with the same one): the later ones get ``~<span id>`` appended."""
    seen: set[tuple[str, str]] = set()
    for b in sorted(builders, key=lambda b: (b.span.start_ns, b.span.span_id)):
        if (b.agent, b.session_id) in seen:
            b.session_id = f"{b.session_id}~{b.span.span_id}"
        seen.add((b.agent, b.session_id))


def _missing_parents(spans: Sequence[Span], by_id: Mapping[str, Span]) -> list[Span]:
    """A stand-in for each parent that is not among the spans (a root that never arrived, or one in
    another service): it spans its children's times, so they stay one session, not one each."""
    orphans: dict[str, list[Span]] = {}
    for s in spans:
        if s.parent_span_id and s.parent_span_id not in by_id:
            orphans.setdefault(s.parent_span_id, []).append(s)
    return [
        Span(
            trace_id=kids[0].trace_id,
            span_id=parent,
            name=f"missing parent {parent}",
            start_ns=min(k.start_ns for k in kids),
            end_ns=max(k.end_ns for k in kids),
            resource=kids[0].resource,
        )
        for parent, kids in orphans.items()
    ]


def group_by_trace(spans: Iterable[Span]) -> dict[str, list[Span]]:
    """Spans by trace id, in the order traces were first seen."""
    out: dict[str, list[Span]] = {}
    for s in spans:
        out.setdefault(s.trace_id, []).append(s)
    return out
