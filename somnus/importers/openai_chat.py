"""``--format openai-chat``: OpenAI-style chat transcripts (tau-bench's ``traj`` and tau2-bench's
``simulations`` included), and other frameworks' runs read as such (``somnus.importers.frameworks``:
Inspect AI, LangChain, AutoGen, smolagents, Gemini and Google ADK, OpenAI Agents SDK traces)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson

from somnus.importers.common import (
    DEFAULT_START,
    MAX_OUTPUT,
    ImportRun,
    ImportShapeError,
    _args,
    _call_id,
    _each_item,
    _given_time,
    _load_json_or_jsonl,
    _outcome,
    _resolved,
    _result_for,
    _run,
    _Session,
    kind_of,
)
from somnus.importers.frameworks import (
    AUTOGEN_SILENT,
    agents_sdk_transcripts,
    adk_contents,
    FRAMEWORK_TYPES,
    framework_agent,
    framework_message,
    inspect_archive,
    inspect_attached,
    inspect_outcome,
    is_agents_sdk_export,
    smolagents_steps,
    smolagents_transcript,
)


# parts of a message's content (OpenAI content parts, Responses API parts, Anthropic blocks) read as text
TEXT_PARTS = frozenset({"text", "input_text", "output_text"})
# parts that are the model's private reasoning, or read by the caller as calls and results
UNSAID_PARTS = frozenset({"thinking", "redacted_thinking", "reasoning", "tool_use", "tool_result"})
SYSTEM_ROLES = frozenset({"system", "developer"})  # instructions, not the conversation
# how a result that carries no error flag says it failed (lower case): "Error: ...", and the OpenAI
# Agents SDK's default failure text (``default_tool_error_function``), which names no error
FAILURE_TEXTS = ("error", "an error occurred while running the tool")
# lines of a Claude Code session log that are not messages (its summaries, snapshots, system notes)
LOG_LINES = frozenset({"summary", "file-history-snapshot", "system", "queue-operation"})
# Responses API items (the OpenAI Agents SDK's ``to_input_list()``) that are not role messages
ITEMS = frozenset({"function_call", "function_call_output", "custom_tool_call", "custom_tool_call_output", "reasoning"})
NOT_ROLE_MESSAGES = ITEMS | LOG_LINES | FRAMEWORK_TYPES


def _text(content: Any) -> str:
    """A message's text: a string, or its text parts joined; any other part (an image, a file) as
    ``[type]``; calls, results and reasoning are not text."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return orjson.dumps(content).decode()
    out = []
    for part in content:
        kind = kind_of(part)
        if isinstance(part, str):
            out.append(part)
        elif kind in TEXT_PARTS and isinstance(part.get("text"), str):
            out.append(part["text"])
        elif kind not in UNSAID_PARTS:
            out.append(f"[{kind}]" if isinstance(kind, str) else orjson.dumps(part).decode())
    return "\n".join(t for t in out if t)


def _transcripts(data: Any) -> list[Any]:
    """The file's transcripts. Items with ``messages`` (or ``traj``) are transcripts; a file whose items
    are messages instead (a bare conversation, a message a line, Claude Code's session log) is one
    transcript per ``sessionId`` (the file's, when there is none), started at its first ``timestamp``."""
    if isinstance(data, dict) and isinstance(data.get("simulations"), list):  # a tau2-bench results file
        return list(data["simulations"])
    if isinstance(data, dict) and isinstance(data.get("samples"), list) and "eval" in data:  # an Inspect log
        return list(data["samples"])
    if is_agents_sdk_export(data):
        return agents_sdk_transcripts(data)  # an OpenAI Agents SDK trace: its exported spans
    steps = smolagents_steps(data)
    if steps is not None:
        return [smolagents_transcript(steps, data.get("state") if isinstance(data, dict) else None)]
    items = data if isinstance(data, list) else [data]
    messages = [
        m
        for m in items
        if isinstance(m, dict)
        and ("role" in m or "message" in m or kind_of(m) in NOT_ROLE_MESSAGES or m.get("lc") == 1)
    ]
    if not items or len(messages) < len(items) or any(k in m for m in messages for k in ("messages", "traj", "input")):
        return items
    by_session: dict[Any, dict[str, Any]] = {}
    for m in messages:
        if "role" not in m and "message" not in m and kind_of(m) in LOG_LINES and "data" not in m:
            continue  # a log's summary or note, not of any one session
        sid = m.get("sessionId")
        t = by_session.setdefault(sid if isinstance(sid, str) else None, {"messages": []})
        if isinstance(sid, str):
            t["id"] = sid
        if "timestamp" not in t and m.get("timestamp") is not None:
            t["timestamp"] = m["timestamp"]
        t["messages"].append(m)
    return list(by_session.values())


class _Chat:
    """The events of one transcript's calls and results, whichever dialect each message is in."""

    def __init__(self, s: _Session) -> None:
        self.s = s
        self.names: dict[str, str] = {}  # call id -> tool
        self.unanswered: dict[str, list[str]] = {}  # legacy function calls (no id) by name, oldest first

    def call(self, tool: Any, call_id: str | None, arguments: Any, where: str, fallback: str) -> None:
        if not isinstance(tool, str) or not tool:
            raise ImportShapeError(f"{where}: a tool call with no name string")
        call_id = call_id or fallback
        self.names[call_id] = tool
        self.s.add("tool_call", {"tool": tool, "call_id": call_id, "args": _args(arguments)}, 1.0)

    def result(self, call_id: str, tool: Any, content: Any, is_error: Any = None) -> None:
        if tool is not None and not isinstance(tool, str):
            raise ImportShapeError(f"result of {call_id!r}: field 'name' must be a string, got {tool!r}")
        text = _text(content)
        failed = is_error is True or (is_error is None and text.lstrip().lower().startswith(FAILURE_TEXTS))
        self.s.add(
            "tool_result",
            {
                "call_id": call_id,
                "tool": tool or self.names.get(call_id),
                "ok": not failed,
                "error": text[:MAX_OUTPUT] if failed else None,
                "output": None if failed else text[:MAX_OUTPUT],
            },
            2.0,
        )

    def message(self, j: int, m: Any, where: str) -> None:
        """One message: chat completions (``tool_calls``, ``role: tool``, legacy ``function_call`` and
        ``role: function``), Anthropic Messages (``tool_use`` and ``tool_result`` blocks), Responses API
        items (``function_call``, ``function_call_output``), or a Claude Code log line around one."""
        m = _unwrapped(m)
        if not isinstance(m, dict):
            raise ImportShapeError(f"{where}: expected an object with a 'role' string")
        kind = kind_of(m)
        if "role" not in m and kind in ("function_call", "custom_tool_call"):
            call_id = _call_id(m.get("call_id", m.get("id")), f"{where}: call_id")
            self.call(m.get("name"), call_id, m.get("arguments", m.get("input")), where, f"call-{j}")
            return
        if "role" not in m and kind in ("function_call_output", "custom_tool_call_output"):
            answered = _call_id(m.get("call_id"), f"{where}: call_id")
            if not answered:
                raise ImportShapeError(f"{where}: a '{kind}' needs 'call_id'")
            self.result(answered, None, m.get("output"))
            return
        if "role" not in m and kind in ("reasoning", *LOG_LINES, *AUTOGEN_SILENT):  # reasoning; a log's notes
            return
        if not isinstance(m.get("role"), str):
            raise ImportShapeError(f"{where}: expected an object with a 'role' string")
        role, content = m["role"], m.get("content")
        if isinstance(m.get("parts"), list) and "content" not in m:  # Gemini: a Content's parts (role model)
            self.gemini(j, m["parts"], role, where)
            return
        blocks = [b for b in content if isinstance(b, dict)] if isinstance(content, list) else []
        if role in SYSTEM_ROLES:
            return
        if (role == "user" and m.get("tool_calls")) or (role == "tool" and m.get("requestor") == "user"):
            self.users_tool(m, role, where)  # tau2-bench: a tool the simulated user ran, on their side
            return
        if role == "user":
            for k, b in enumerate(blocks):
                if b.get("type") == "tool_result":
                    answered = _call_id(b.get("tool_use_id"), f"{where}: content[{k}].tool_use_id")
                    if not answered:
                        raise ImportShapeError(f"{where}: content[{k}]: a 'tool_result' needs 'tool_use_id'")
                    self.result(answered, None, b.get("content"), b.get("is_error"))
            text = _text(content)
            if text or not blocks:
                self.s.add("user_message", {"text": text})
        elif role == "assistant":
            text = _text(content)
            if text:
                self.s.add("agent_message", {"text": text})
            for k, b in enumerate(blocks):
                if b.get("type") == "tool_use":
                    call_id = _call_id(b.get("id"), f"{where}: content[{k}].id")
                    self.call(b.get("name"), call_id, b.get("input"), f"{where}: content[{k}]", f"call-{j}-{k}")
            for k, call, fn in _tool_calls(m, where):
                call_id = _call_id(call.get("id"), f"{where}: tool_calls[{k}].id")
                self.call(fn["name"], call_id, fn.get("arguments"), where, f"call-{j}-{k}")
            legacy = m.get("function_call")
            if legacy is not None:
                if not isinstance(legacy, dict):
                    raise ImportShapeError(f"{where}: field 'function_call' must be an object")
                self.call(legacy.get("name"), None, legacy.get("arguments"), f"{where}: function_call", f"call-{j}")
                self.unanswered.setdefault(legacy["name"], []).append(f"call-{j}")
        elif role == "tool" and isinstance(m.get("tool_messages"), list):  # tau2-bench's MultiToolMessage
            for k, one in enumerate(m["tool_messages"]):
                self.message(j, one, f"{where}: tool_messages[{k}]")
        elif role == "tool":  # tau2-bench: the call's id in ``id``, and ``error`` true or false
            answered = _call_id(m.get("tool_call_id", m.get("id")), f"{where}: tool_call_id")
            if not answered:
                raise ImportShapeError(f"{where}: a 'tool' message needs 'tool_call_id'")
            error = m.get("error")
            if isinstance(error, dict):  # Inspect AI: a ToolCallError (type, message); its content is often empty
                said = _text(content)
                kind = error.get("type")
                content = said or f"{'' if kind in (None, 'unknown') else f'{kind}: '}{error.get('message', '')}"
                error = True
            self.result(answered, m.get("name", m.get("function")), content, error if isinstance(error, bool) else None)
        elif role == "function":  # legacy: answers the oldest unanswered call of its name
            name = m.get("name")
            if not isinstance(name, str) or not name:
                raise ImportShapeError(f"{where}: a 'function' message needs a 'name' string")
            waiting = self.unanswered.get(name)
            self.result(waiting.pop(0) if waiting else f"call-{j}", name, content)
        else:
            raise ImportShapeError(
                f"{where}: unknown role {role!r} (expected system, developer, user, assistant, tool or function)"
            )

    def gemini(self, j: int, parts: list[Any], role: str, where: str) -> None:
        """A Gemini API Content (and a Google ADK event's): text parts said by its role (``model`` is the
        agent), ``function_call`` parts called, ``function_response`` parts their results (a response
        with an ``error`` key failed). A part without an ``id`` answers the oldest unanswered call of its
        name; thoughts are not said."""
        said: list[str] = []

        def say() -> None:  # the text so far, before the call or result that follows it
            if said:
                self.s.add("agent_message" if role == "model" else "user_message", {"text": "\n".join(said)})
                said.clear()

        for k, part in enumerate(parts):
            if not isinstance(part, dict) or part.get("thought") is True:
                continue
            call = part.get("function_call", part.get("functionCall"))
            answer = part.get("function_response", part.get("functionResponse"))
            if isinstance(call, dict) or isinstance(answer, dict):
                say()
            if isinstance(call, dict):
                call_id = _call_id(call.get("id"), f"{where}: parts[{k}].function_call.id")
                self.call(call.get("name"), call_id, call.get("args"), f"{where}: parts[{k}]", f"call-{j}-{k}")
                if call_id is None:
                    self.unanswered.setdefault(call["name"], []).append(f"call-{j}-{k}")
            elif isinstance(answer, dict):
                name = answer.get("name")
                if not isinstance(name, str) or not name:
                    raise ImportShapeError(f"{where}: parts[{k}]: a function_response needs a 'name' string")
                call_id = _call_id(answer.get("id"), f"{where}: parts[{k}].function_response.id")
                waiting = self.unanswered.get(name)
                call_id = call_id or (waiting.pop(0) if waiting else f"call-{j}-{k}")
                response = answer.get("response")
                failed = isinstance(response, dict) and response.get("error") not in (None, "", False)
                out = (
                    response.get("error" if failed else "output", response) if isinstance(response, dict) else response
                )
                self.result(call_id, name, out if isinstance(out, str) else orjson.dumps(out).decode(), failed)
            elif isinstance(part.get("text"), str) and part["text"]:
                said.append(part["text"])
        say()

    def users_tool(self, m: dict[str, Any], role: str, where: str) -> None:
        """What the simulated user did with their own tools (tau2-bench's ``requestor: user``), as the
        user's words: the agent neither called those tools nor saw them fail."""
        if role == "tool":
            self.s.add("user_message", {"text": f"[the user's tool returned] {_text(m.get('content'))}"[:MAX_OUTPUT]})
            return
        said = _text(m.get("content"))
        for _, _, fn in _tool_calls(m, where):
            args = orjson.dumps(_args(fn.get("arguments")), option=orjson.OPT_SORT_KEYS).decode()
            said = "\n".join(filter(None, [said, f"[the user ran {fn['name']} {args}]"]))
        if said:
            self.s.add("user_message", {"text": said[:MAX_OUTPUT]})


def _tool_calls(m: dict[str, Any], where: str) -> Iterator[tuple[int, dict[str, Any], dict[str, Any]]]:
    """``(index, call, function)`` of a message's ``tool_calls``; the function (its ``name`` and
    ``arguments``) is chat completions' ``function``, or the call itself (tau2-bench's flat calls)."""
    calls = m.get("tool_calls") or []
    if not isinstance(calls, list):
        raise ImportShapeError(f"{where}: field 'tool_calls' must be a list, got {type(calls).__name__}")
    for k, call in enumerate(calls):
        fn = call.get("function", call if "name" in call else None) if isinstance(call, dict) else None
        if isinstance(fn, str) and isinstance(call, dict):  # Inspect AI: ``function`` is the name
            fn = {"name": fn, "arguments": call.get("arguments")}
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise ImportShapeError(f"{where}: tool_calls[{k}] has no 'function.name' (or 'name') string")
        yield k, call, fn


def openai_chat(
    path: Path, agent: str | None = None, start: datetime = DEFAULT_START, run: ImportRun | None = None
) -> Iterator[dict[str, Any]]:
    """Events from chat transcripts (a list, one object, or JSON lines): OpenAI chat completions
    (``tool_calls`` and legacy ``function_call``), Anthropic Messages (``tool_use`` / ``tool_result``
    blocks), Responses API items, and bare message lists or Claude Code session logs (``_transcripts``).

    A results file (``run.results``) names a transcript by its session id or its ``id`` / ``session_id``
    / ``instance_id`` / ``task<n>-trial<m>``, and overrides its own reward (or ``resolved``)."""
    given, run = run, _run(run, start)
    with path.open("rb") as f:
        zipped = f.read(4) == b"PK\x03\x04"  # an archive (Inspect AI's .eval); no JSON begins so
    items = inspect_archive(path) if zipped else _transcripts(_load_json_or_jsonl(path, run))

    def one(i: int, item: Any) -> Iterator[dict[str, Any]]:
        where = f"{path.name}: item {i}"
        if not isinstance(item, dict):
            raise ImportShapeError(f"{where}: expected an object with 'messages' or 'traj', got {type(item).__name__}")
        messages = item.get("messages", item.get("traj", item.get("input")))  # input: a Responses API request
        context = item.get("llm_context")
        if messages is None and isinstance(context, dict):  # an AutoGen agent's saved state
            messages = context.get("messages")
        if messages is None:  # a Gemini API request's contents; a Google ADK session's events' contents
            messages = item.get("contents", adk_contents(item.get("events")))
        if not isinstance(messages, list):
            raise ImportShapeError(f"{where}: no 'messages' (or 'traj', 'input') list of chat messages")
        if isinstance(item.get("attachments"), dict):  # Inspect AI keeps long texts aside
            messages = [inspect_attached(m, item["attachments"]) for m in messages]
        # instance_id: SWE-Gym and the like; thread_id: a LangGraph thread
        ident = item.get("id", item.get("session_id", item.get("instance_id", item.get("thread_id"))))
        if ident is None and "task_id" in item:
            ident = f"task{item['task_id']}-trial{item.get('trial', 0)}"
        elif ident is not None and isinstance(item.get("epoch"), int) and "scores" in item:  # Inspect AI
            ident = f"{ident}-epoch{item['epoch']}"
        session_id = run.session_id(f"{path.stem}-{ident if ident is not None else i}")
        began = _given_time(item, where) or _first_time(messages)
        own = item.get("agent")
        if own is not None and not isinstance(own, str):
            raise ImportShapeError(f"{where}: field 'agent' must be a string, got {own!r}")
        if own is None:  # AutoGen, ADK: the agent is the ``source`` or ``author`` of what is not the user's
            own = framework_agent(messages)
        s = _Session(f"openai-chat:{path.name}", agent or own or "assistant", session_id, began or run.next_start())
        first_user = next(filter(None, map(_said, messages)), None)
        meta = {k: item[k] for k in ("task_id", "trial", "reward", "termination_reason") if k in item}
        s.add("session_start", {"task": (first_user or "")[:500], "metadata": meta})
        chat = _Chat(s)
        for j, m in enumerate(messages):
            chat.message(j, m, f"{where}: message {j}")
        given = _result_for(run, session_id, None if ident is None else str(ident))
        outcome, reason = (given, "per the results file") if given else _outcome(_judged(item, where), where)
        s.add("session_end", {"outcome": outcome, "reason": reason})
        yield from s.events

    yield from _each_item(items, given, path.name, one)


def _judged(item: dict[str, Any], where: str) -> dict[str, Any]:
    """``item``, or, when it has no ``reward`` or ``outcome`` of its own, its tau2-bench
    ``reward_info.reward``, its Inspect AI ``scores`` or its SWE-bench verdict (``resolved``) as one."""
    info = item.get("reward_info")  # tau2-bench: the reward inside its breakdown
    if "reward" not in item and isinstance(info, dict) and "reward" in info:
        return {"reward": info["reward"]}
    scores = item.get("scores")
    if "reward" not in item and "outcome" not in item and isinstance(scores, dict) and scores:
        return {"outcome": inspect_outcome(scores, where)}
    resolved = item.get("resolved")
    if resolved is None or "reward" in item or "outcome" in item:
        return item
    return {"outcome": _resolved(resolved, where)}


def _first_time(messages: list[Any]) -> datetime | None:
    """The time the first message carries (AutoGen's ``created_at``, an ADK event's ``timestamp``); a value
    that is not a time is no time here (the transcript then starts where the run's others do)."""
    first = next((m for m in messages if isinstance(m, dict)), None)
    try:
        return _given_time(first, "") if first is not None else None
    except ImportShapeError:
        return None


def _unwrapped(m: Any) -> Any:
    """The message a Claude Code log line carries (``message``); another framework's message as a chat
    message (``framework_message``); else ``m`` itself."""
    if not isinstance(m, dict) or "role" in m:
        return m
    if isinstance(m.get("message"), dict):
        return m["message"]
    return framework_message(m)


def _said(m: Any) -> str | None:
    """The text of a user's message (the task is the first), None for any other message."""
    m = _unwrapped(m)
    if not isinstance(m, dict) or m.get("role") != "user":
        return None
    parts = m.get("parts") if "content" not in m else None
    if isinstance(parts, list):  # Gemini: its text parts
        text = "\n".join(p["text"] for p in parts if isinstance(p, dict) and isinstance(p.get("text"), str))
    else:
        text = _text(m.get("content"))
    return text or None
