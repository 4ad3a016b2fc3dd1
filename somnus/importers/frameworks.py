"""Other agent frameworks' saved runs, read by ``--format openai-chat`` as chat transcripts.

- tau2-bench results are chat messages already (``somnus.importers.openai_chat``);
- LangChain messages (``model_dump()``, ``messages_to_dict``, ``dumpd``) and AutoGen messages and events
  become chat messages, one at a time (``framework_message``);
- a smolagents run (its steps) becomes one transcript (``smolagents_transcript``);
- a Google ADK session's events become Gemini contents (``adk_contents``), whose ``parts`` the chat
  reader takes as they are (``somnus.importers.openai_chat._Chat.gemini``);
- an Inspect AI log's samples are transcripts; a ``.eval`` archive is read here, within a bound
  (``inspect_archive``), and a sample's score is its outcome (``inspect_outcome``).

Each was checked against files the framework itself wrote (``tests/fixtures/<framework>/generate_fixture.py``).
"""

from __future__ import annotations

import struct
import zipfile
import zlib
from pathlib import Path
from typing import Any

import cramjam
import orjson

from somnus.importers.common import ImportShapeError, kind_of

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
FRAMEWORK_TYPES = set(LANGCHAIN_ROLES) | AUTOGEN  # ``type`` values of messages that have no ``role``
# Inspect AI scores: correct, incorrect, partial, no answer
INSPECT_VALUES = {"C": "success", "I": "failure", "P": "partial", "N": "failure"}
ARCHIVE_BYTES = 1 << 30  # the most an Inspect ``.eval`` archive's samples may decompress to, together
ATTACHMENT = "attachment://"
ZIP_ZSTD = 93  # the zip compression method of zstd (APPNOTE 4.4.5)


# smolagents: the run's state (RunResult.state) as an outcome
SMOLAGENTS_STATES = {"success": "success", "max_steps_error": "failure"}
# errors of a step's call: a tool that raised or was called wrong, a CodeAgent's code that failed
SMOLAGENTS_TOOL_ERRORS = frozenset({"AgentToolExecutionError", "AgentToolCallError", "AgentExecutionError"})


def smolagents_steps(data: Any) -> list[dict[str, Any]] | None:
    """A smolagents run's steps: ``agent.memory.get_full_steps()`` (a task step, then action steps) or
    a ``RunResult`` (``steps``, ``state``); None for anything else."""
    steps = data.get("steps") if isinstance(data, dict) and "state" in data else data
    if not isinstance(steps, list) or not steps or not all(isinstance(st, dict) for st in steps):
        return None
    if "task" not in steps[0] or not any("step_number" in st for st in steps):
        return None
    return steps


def smolagents_transcript(steps: list[dict[str, Any]], state: Any) -> dict[str, Any]:
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
            listed = out.get("tool_calls") or st.get("tool_calls")
            calls = [c for c in listed if isinstance(c, dict)] if isinstance(listed, list) else []  # else no call
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
                failed = kind_of(error) in SMOLAGENTS_TOOL_ERRORS
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
    if isinstance(state, str) and state in SMOLAGENTS_STATES:
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


def inspect_outcome(scores: dict[str, Any], where: str) -> str:
    """An Inspect AI sample's outcome from its first scorer's value: C, I, P, N, a number (1 = success,
    0 = failure, between: partial), a boolean, or a dict of them (all must succeed)."""
    name, score = next(iter(scores.items()))
    value = score.get("value") if isinstance(score, dict) else None
    values = list(value.values()) if isinstance(value, dict) else [value]
    if not values:
        raise ImportShapeError(f"{where}: score {name!r} has no value")
    outcomes = set()
    for v in values:
        if isinstance(v, str) and v in INSPECT_VALUES:
            outcomes.add(INSPECT_VALUES[v])
        elif isinstance(v, (int, float)):  # a boolean too
            outcomes.add("success" if v >= 1 else "failure" if v <= 0 else "partial")
        else:
            raise ImportShapeError(f"{where}: score {name!r} has a value that is no outcome: {v!r}")
    return "failure" if "failure" in outcomes else "partial" if "partial" in outcomes else "success"


def inspect_attached(m: Any, attachments: dict[str, Any]) -> Any:
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


def inspect_archive(path: Path) -> list[Any]:
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


def framework_message(m: dict[str, Any]) -> dict[str, Any]:
    """A LangChain message (``model_dump()``, ``messages_to_dict``, ``dumpd``) or an AutoGen message or
    event as a chat message (``role``, ``content``, ``tool_calls``, tool messages); else ``m`` itself."""
    if m.get("lc") == 1 and isinstance(m.get("kwargs"), dict):  # dumpd: {"lc": 1, "id": [..., class], "kwargs"}
        m = m["kwargs"]
    elif isinstance(m.get("data"), dict) and kind_of(m) in LANGCHAIN_ROLES:  # messages_to_dict
        m = {**m["data"], "type": m["type"]}
    kind = kind_of(m)
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


def framework_agent(messages: list[Any]) -> str | None:
    """The agent of an AutoGen or Google ADK transcript: the ``source`` (AutoGen) or ``author`` (ADK) of
    its first message that is not the user's."""
    for m in messages:
        if not isinstance(m, dict):
            continue
        who = m.get("source") if kind_of(m) in AUTOGEN else m.get("author") if m.get("role") == "model" else None
        if isinstance(who, str) and who not in ("user", ""):
            return who
    return None


def adk_contents(events: Any) -> list[Any] | None:
    """A Google ADK session's events as Gemini contents (each event's ``content``, with its ``author``
    and ``timestamp``); None when ``events`` is not such a list."""
    if not isinstance(events, list) or not any(isinstance(e, dict) and "content" in e for e in events):
        return None
    return [
        {**e["content"], "author": e.get("author"), "timestamp": e.get("timestamp")}
        for e in events
        if isinstance(e, dict) and isinstance(e.get("content"), dict)
    ]


def is_agents_sdk_export(data: Any) -> bool:
    """Whether ``data`` is an OpenAI Agents SDK export: a list of its objects only (``{"object": "trace"}``
    or ``"trace.span"``), none of them a message of another kind."""
    return (
        isinstance(data, list)
        and bool(data)
        and all(isinstance(d, dict) and kind_of(d) is None and d.get("object") in ("trace", "trace.span") for d in data)
    )


def agents_sdk_transcripts(exported: list[Any]) -> list[dict[str, Any]]:
    """An OpenAI Agents SDK trace, as a ``TracingProcessor`` exports it (``trace.export()`` and each
    ``span.export()``), as one transcript per trace: each ``function`` span a call and its result (failed
    when the span has an ``error``: its message and data), in the order the calls started; the agent
    is the first ``agent`` span's name, the task the user's first words a ``generation`` span kept (a
    ``response`` span keeps none), the start its first span's."""
    traces: dict[str, dict[str, Any]] = {}
    spans: dict[str, list[dict[str, Any]]] = {}
    for e in exported:
        if not isinstance(e, dict):
            continue
        if e.get("object") == "trace" and isinstance(e.get("id"), str):
            traces[e["id"]] = e
        elif e.get("object") == "trace.span" and isinstance(e.get("trace_id"), str):
            spans.setdefault(e["trace_id"], []).append(e)
    out = []
    for trace_id in sorted(set(traces) | set(spans)):
        mine = sorted(spans.get(trace_id, []), key=lambda sp: str(sp.get("started_at", "")))
        data = [(sp, _dict(sp.get("span_data"))) for sp in mine]
        agent = next(
            (d.get("name") for _, d in data if d.get("type") == "agent" and isinstance(d.get("name"), str)), None
        )
        # the user's words, where a generation span (a chat completions model) kept its input
        asked = next(
            (
                m.get("content")
                for _, d in data
                if d.get("type") == "generation" and isinstance(d.get("input"), list)
                for m in d["input"]
                if isinstance(m, dict) and m.get("role") == "user"
            ),
            None,
        )
        messages: list[dict[str, Any]] = [{"role": "user", "content": asked}] if asked else []
        for sp, d in data:
            if d.get("type") != "function":
                continue
            error = sp.get("error")
            said = d.get("output")
            if isinstance(error, dict):
                detail = _dict(error.get("data")).get("error")
                said = "; ".join(str(x) for x in (error.get("message"), detail, d.get("output")) if x)
            messages.append(
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [{"id": sp.get("id"), "name": d.get("name"), "arguments": d.get("input")}],
                }
            )
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": sp.get("id"),
                    "name": d.get("name"),
                    "content": said,
                    "error": error is not None,
                }
            )
        first = mine[0].get("started_at") if mine else None
        out.append({"id": trace_id, "agent": agent, "started_at": first, "messages": messages})
    return out
