"""``--format openai-chat``: OpenAI-style chat transcripts (tau-bench's ``traj``, tau2-bench's
``simulations`` and Inspect AI's eval logs included)."""

from __future__ import annotations

import struct
import zipfile
import zlib
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import cramjam
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
)


# parts of a message's content (OpenAI content parts, Responses API parts, Anthropic blocks) read as text
TEXT_PARTS = frozenset({"text", "input_text", "output_text"})
# parts that are the model's private reasoning, or read by the caller as calls and results
UNSAID_PARTS = frozenset({"thinking", "redacted_thinking", "reasoning", "tool_use", "tool_result"})
SYSTEM_ROLES = frozenset({"system", "developer"})  # instructions, not the conversation
# lines of a Claude Code session log that are not messages (its summaries, snapshots, system notes)
LOG_LINES = frozenset({"summary", "file-history-snapshot", "system", "queue-operation"})
# Responses API items (the OpenAI Agents SDK's ``to_input_list()``) that are not role messages
ITEMS = frozenset({"function_call", "function_call_output", "custom_tool_call", "custom_tool_call_output", "reasoning"})
# LangChain messages name their role in ``type`` (``model_dump()``, ``messages_to_dict``, ``dumpd``)
LANGCHAIN_ROLES = {
    "human": "user",
    "ai": "assistant",
    "AIMessageChunk": "assistant",
    "tool": "tool",
    "system": "system",
    "function": "function",
}
# AutoGen: AgentChat's messages and events (``TaskResult.messages``), autogen-core's model messages (an
# agent's saved ``llm_context``); its events that say nothing new (thoughts, streamed chunks) are skipped
AUTOGEN_SAID = frozenset(
    {"TextMessage", "MultiModalMessage", "HandoffMessage", "StopMessage", "ToolCallSummaryMessage"}
)
AUTOGEN_CALLS = frozenset({"ToolCallRequestEvent"})
AUTOGEN_RESULTS = frozenset({"ToolCallExecutionEvent", "FunctionExecutionResultMessage"})
AUTOGEN_CORE = {"UserMessage": "user", "AssistantMessage": "assistant", "SystemMessage": "system"}
AUTOGEN_SILENT = frozenset(
    {
        "ThoughtEvent",
        "ModelClientStreamingChunkEvent",
        "UserInputRequestedEvent",
        "MemoryQueryEvent",
        "CodeGenerationEvent",
        "CodeExecutionEvent",
        "SelectSpeakerEvent",
        "SelectorEvent",
    }
)
AUTOGEN = AUTOGEN_SAID | AUTOGEN_CALLS | AUTOGEN_RESULTS | set(AUTOGEN_CORE) | AUTOGEN_SILENT
NOT_ROLE_MESSAGES = ITEMS | LOG_LINES | set(LANGCHAIN_ROLES) | AUTOGEN
# Inspect AI scores: correct, incorrect, partial, no answer
INSPECT_VALUES = {"C": "success", "I": "failure", "P": "partial", "N": "failure"}
ARCHIVE_BYTES = 1 << 30  # the most an Inspect ``.eval`` archive's samples may decompress to, together
ATTACHMENT = "attachment://"
ZIP_ZSTD = 93  # the zip compression method of zstd (APPNOTE 4.4.5)


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
        kind = part.get("type") if isinstance(part, dict) else None
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
    steps = _smolagents_steps(data)
    if steps is not None:
        return [_smolagents(steps, data.get("state") if isinstance(data, dict) else None)]
    items = data if isinstance(data, list) else [data]
    messages = [
        m
        for m in items
        if isinstance(m, dict)
        and ("role" in m or "message" in m or m.get("type") in NOT_ROLE_MESSAGES or m.get("lc") == 1)
    ]
    if not items or len(messages) < len(items) or any(k in m for m in messages for k in ("messages", "traj", "input")):
        return items
    by_session: dict[Any, dict[str, Any]] = {}
    for m in messages:
        if "role" not in m and "message" not in m and m.get("type") in LOG_LINES and "data" not in m:
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
        failed = is_error is True or (is_error is None and text.lstrip().lower().startswith("error"))
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
        kind = m.get("type")
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
    items = _inspect_archive(path) if zipped else _transcripts(_load_json_or_jsonl(path, run))

    def one(i: int, item: Any) -> Iterator[dict[str, Any]]:
        where = f"{path.name}: item {i}"
        if not isinstance(item, dict):
            raise ImportShapeError(f"{where}: expected an object with 'messages' or 'traj', got {type(item).__name__}")
        messages = item.get("messages", item.get("traj", item.get("input")))  # input: a Responses API request
        context = item.get("llm_context")
        if messages is None and isinstance(context, dict):  # an AutoGen agent's saved state
            messages = context.get("messages")
        if not isinstance(messages, list):
            raise ImportShapeError(f"{where}: no 'messages' (or 'traj', 'input') list of chat messages")
        if isinstance(item.get("attachments"), dict):  # Inspect AI keeps long texts aside
            messages = [_attached(m, item["attachments"]) for m in messages]
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
        if own is None:  # AutoGen: the agent is the ``source`` of what is not the user's
            own = next(
                (
                    m["source"]
                    for m in messages
                    if isinstance(m, dict)
                    and m.get("type") in AUTOGEN
                    and isinstance(m.get("source"), str)
                    and m["source"] not in ("user", "")
                ),
                None,
            )
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
    """``item``, or its tau2-bench ``reward_info.reward``, or its SWE-bench verdict (``resolved``: true or
    false) as an outcome when it has no ``reward`` or ``outcome`` of its own."""
    info = item.get("reward_info")  # tau2-bench: the reward inside its breakdown
    if "reward" not in item and isinstance(info, dict) and "reward" in info:
        return {"reward": info["reward"]}
    scores = item.get("scores")
    if "reward" not in item and "outcome" not in item and isinstance(scores, dict) and scores:
        return {"outcome": _scored(scores, where)}
    resolved = item.get("resolved")
    if resolved is None or "reward" in item or "outcome" in item:
        return item
    return {"outcome": _resolved(resolved, where)}


# smolagents: the run's state (RunResult.state) as an outcome
SMOLAGENTS_STATES = {"success": "success", "max_steps_error": "failure"}
# errors of a step's call: a tool that raised or was called wrong, a CodeAgent's code that failed
SMOLAGENTS_TOOL_ERRORS = frozenset({"AgentToolExecutionError", "AgentToolCallError", "AgentExecutionError"})


def _smolagents_steps(data: Any) -> list[dict[str, Any]] | None:
    """A smolagents run's steps: ``agent.memory.get_full_steps()`` (a task step, then action steps) or
    a ``RunResult`` (``steps``, ``state``); None for anything else."""
    steps = data.get("steps") if isinstance(data, dict) and "state" in data else data
    if not isinstance(steps, list) or not steps or not all(isinstance(st, dict) for st in steps):
        return None
    if "task" not in steps[0] or not any("step_number" in st for st in steps):
        return None
    return steps


def _smolagents(steps: list[dict[str, Any]], state: Any) -> dict[str, Any]:
    """A smolagents run as a transcript: its task the user's message; each action step's calls (from the
    model's message: a step whose tool failed lists none of its own) and their results, the tool a
    ``AgentToolExecutionError`` names failing with its message; ``final_answer`` said, not called."""
    messages: list[dict[str, Any]] = []
    said_final = False
    for st in steps:
        if "task" in st:
            messages.append({"role": "user", "content": st.get("task")})
        elif "step_number" in st:
            out: dict[str, Any] = _dict(st.get("model_output_message"))
            calls = [c for c in (out.get("tool_calls") or st.get("tool_calls") or []) if isinstance(c, dict)]
            error: dict[str, Any] = _dict(st.get("error"))
            text = st.get("model_output") if isinstance(st.get("model_output"), str) else None
            tools, results = [], []
            for c in calls:
                fn = _dict(c.get("function"))
                if fn.get("name") == "final_answer":
                    args = fn.get("arguments")
                    answer = args.get("answer") if isinstance(args, dict) else args
                    text, said_final = "\n".join(filter(None, [text, str(answer)])), True
                    continue
                failed = error.get("type") in SMOLAGENTS_TOOL_ERRORS
                failed = failed and (len(calls) == 1 or f"tool '{fn.get('name')}'" in str(error.get("message")))
                tools.append(c)
                said = error.get("message") if failed else st.get("observations")
                results.append(
                    {
                        "role": "tool",
                        "tool_call_id": c.get("id"),
                        "name": fn.get("name"),
                        "content": said,
                        "error": bool(failed),
                    }
                )
            if text or tools:
                messages.append({"role": "assistant", "content": text or None, "tool_calls": tools or None})
            messages.extend(results)
        elif "output" in st and not said_final and st.get("output") not in (None, ""):
            messages.append({"role": "assistant", "content": str(st["output"])})
    transcript: dict[str, Any] = {"messages": messages}
    began = next((st["timing"].get("start_time") for st in steps if isinstance(st.get("timing"), dict)), None)
    if isinstance(began, (int, float)):
        transcript["start_time"] = began
    if state in SMOLAGENTS_STATES:
        transcript["outcome"] = SMOLAGENTS_STATES[state]
    return transcript


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _autogen(m: dict[str, Any], kind: str) -> dict[str, Any]:
    """An AutoGen message or event as a chat message: calls (``FunctionCall``: ``id``, ``name``, ``arguments``
    as JSON text) as an assistant's ``tool_calls``; results (``call_id``, ``is_error``) as tool messages;
    text from the user's ``source`` as the user's, from any other (an agent) as the assistant's."""
    content = m.get("content")
    if kind in AUTOGEN_RESULTS:
        results = content if isinstance(content, list) else []
        return {
            "role": "tool",
            "tool_messages": [
                {
                    "role": "tool",
                    "tool_call_id": r.get("call_id"),
                    "name": r.get("name"),
                    "content": r.get("content"),
                    "error": r.get("is_error"),
                }
                if isinstance(r, dict)
                else r
                for r in results
            ],
        }
    role = AUTOGEN_CORE.get(kind) or ("user" if m.get("source") == "user" else "assistant")
    if kind in AUTOGEN_CALLS or (kind == "AssistantMessage" and isinstance(content, list)):
        return {"role": "assistant", "content": None, "tool_calls": content}
    if kind == "MultiModalMessage" and isinstance(content, list):  # its images: named, not their bytes
        content = "\n".join(p if isinstance(p, str) else "[image]" for p in content)
    return {"role": role, "content": content}


def _first_time(messages: list[Any]) -> datetime | None:
    """The time of the first message that carries one (AutoGen's ``created_at``); a value that is not a
    time is no time here (the transcript then starts where the run's others do)."""
    first = next((m for m in messages if isinstance(m, dict)), None)
    try:
        return _given_time(first, "") if first is not None else None
    except ImportShapeError:
        return None


def _scored(scores: dict[str, Any], where: str) -> str:
    """An Inspect AI sample's outcome from its first scorer's value: C, I, P, N, a number (1 = success,
    0 = failure, between: partial), a boolean, or a dict of them (all must succeed)."""
    name, score = next(iter(scores.items()))
    value = score.get("value") if isinstance(score, dict) else None
    values = list(value.values()) if isinstance(value, dict) else [value]
    outcomes = set()
    for v in values:
        if isinstance(v, str) and v in INSPECT_VALUES:
            outcomes.add(INSPECT_VALUES[v])
        elif isinstance(v, (int, float)):  # a boolean too
            outcomes.add("success" if v >= 1 else "failure" if v <= 0 else "partial")
        else:
            raise ImportShapeError(f"{where}: score {name!r} has a value that is no outcome: {v!r}")
    return "failure" if "failure" in outcomes else "partial" if "partial" in outcomes else "success"


def _attached(m: Any, attachments: dict[str, Any]) -> Any:
    """An Inspect AI message with its ``attachment://`` references (content, text parts, call arguments)
    replaced by the texts they name."""

    def text(v: Any) -> Any:
        if isinstance(v, str) and v.startswith(ATTACHMENT):
            got = attachments.get(v[len(ATTACHMENT) :])
            return got if isinstance(got, str) else v
        return v

    if not isinstance(m, dict):
        return m
    out = {**m, "content": text(m.get("content"))}
    if isinstance(out["content"], list):
        out["content"] = [
            {**p, "text": text(p.get("text"))} if isinstance(p, dict) and "text" in p else p for p in out["content"]
        ]
    if isinstance(m.get("tool_calls"), list):
        out["tool_calls"] = [
            {**c, "arguments": {k: text(v) for k, v in c["arguments"].items()}}
            if isinstance(c, dict) and isinstance(c.get("arguments"), dict)
            else c
            for c in m["tool_calls"]
        ]
    return out


def _inspect_archive(path: Path) -> list[Any]:
    """The samples of an Inspect AI ``.eval`` log (a zip archive: ``samples/<id>_epoch_<n>.json``), at
    most ``ARCHIVE_BYTES`` of them decompressed (as their headers declare, which each member's read
    holds to): a bigger archive is refused before it is read."""
    try:
        with zipfile.ZipFile(path) as archive:
            names = sorted(n for n in archive.namelist() if n.startswith("samples/") and n.endswith(".json"))
            total = sum(archive.getinfo(n).file_size for n in names)
            if total > ARCHIVE_BYTES:
                raise ImportShapeError(
                    f"{path}: its samples decompress to {total} bytes, more than {ARCHIVE_BYTES}: not read"
                )
            samples = [orjson.loads(_member(archive, archive.getinfo(n), path)) for n in names]
    except (zipfile.BadZipFile, orjson.JSONDecodeError, KeyError, OSError, struct.error) as exc:
        raise ImportShapeError(f"{path}: not an Inspect AI log archive ({type(exc).__name__}: {exc})") from None
    if not names:
        raise ImportShapeError(f"{path}: a zip archive with no samples/*.json (not an Inspect AI .eval log)")
    return samples


def _member(archive: zipfile.ZipFile, info: zipfile.ZipInfo, path: Path) -> bytes:
    """One member of an archive, decompressed to the size its header declares and no more. Inspect AI
    writes its members with zstd (method 93), which ``zipfile`` reads from Python 3.14 only: those are
    read raw and decompressed by cramjam into a buffer of that size, checked by their CRC."""
    if info.compress_type != ZIP_ZSTD:
        with archive.open(info) as f:  # reads no more than the declared size, and checks the CRC
            return f.read()
    fp = archive.fp
    assert fp is not None
    fp.seek(info.header_offset)
    header = fp.read(30)
    if header[:4] != b"PK\x03\x04":
        raise ImportShapeError(f"{path}: {info.filename}: no local header where the directory says")
    name_len, extra_len = struct.unpack("<HH", header[26:30])
    fp.seek(info.header_offset + 30 + name_len + extra_len)
    buf = bytearray(info.file_size + 1)  # one more: a stream longer than declared fills it
    try:
        n = cramjam.zstd.decompress_into(fp.read(info.compress_size), buf)
    except cramjam.DecompressionError as exc:
        raise ImportShapeError(f"{path}: {info.filename}: not a zstd stream of its declared size ({exc})") from None
    out = bytes(buf[:n])
    if n != info.file_size or zlib.crc32(out) != info.CRC:
        raise ImportShapeError(f"{path}: {info.filename}: decompresses to other bytes than its header declares")
    return out


def _unwrapped(m: Any) -> Any:
    """The message a Claude Code log line carries (``message``); a LangChain message as a chat message;
    else ``m`` itself."""
    if not isinstance(m, dict) or "role" in m:
        return m
    if isinstance(m.get("message"), dict):
        return m["message"]
    if m.get("lc") == 1 and isinstance(m.get("kwargs"), dict):  # dumpd: {"lc": 1, "id": [..., class], "kwargs"}
        m = m["kwargs"]
    elif isinstance(m.get("data"), dict) and m.get("type") in LANGCHAIN_ROLES:  # messages_to_dict
        m = {**m["data"], "type": m["type"]}
    kind = m.get("type")
    if kind in AUTOGEN and kind not in AUTOGEN_SILENT:
        return _autogen(m, kind)
    role = LANGCHAIN_ROLES.get(kind) if isinstance(kind, str) else None
    if role is None:
        return m
    out = {**m, "role": role}
    if role == "assistant" and isinstance(m.get("tool_calls"), list):  # {"name", "args", "id"}
        out["tool_calls"] = [
            {"id": c.get("id"), "name": c.get("name"), "arguments": c.get("args")} if isinstance(c, dict) else c
            for c in m["tool_calls"]
        ]
    if role == "tool" and m.get("status") in ("success", "error"):
        out["error"] = m["status"] == "error"
    return out


def _said(m: Any) -> str | None:
    """The text of a user's message (the task is the first), None for any other message."""
    m = _unwrapped(m)
    if not isinstance(m, dict) or m.get("role") != "user":
        return None
    text = _text(m.get("content"))
    return text or None
