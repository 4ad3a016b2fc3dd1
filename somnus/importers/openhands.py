"""``--format openhands``: OpenHands (V0) trajectories, its events as ``event_to_dict`` writes them: an
evaluation's ``output.jsonl`` (one instance a line, its ``history`` a list of events, or of
``[action, observation]`` pairs in older runs) or a saved session's bare list of events."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import orjson

from somnus.importers.common import (
    DEFAULT_START,
    MAX_OUTPUT,
    ImportRun,
    ImportShapeError,
    _call_id,
    _each_item,
    _load_json_or_jsonl,
    _resolved,
    _result_for,
    _run,
    _Session,
)
from somnus.importers.swe_common import SWE_NEXT_STEP_S, SWE_OBSERVATION_S, SWE_THOUGHT_S, swe_failure
from somnus.schemas.events import MAX_NAME_CHARS

# The actions that run something (ActionType in openhands/core/schema/action.py); ``delegate`` is a delegation.
TOOL_ACTIONS = frozenset(
    {"run", "run_ipython", "read", "write", "edit", "browse", "browse_interactive", "call_tool_mcp", "search"}
)
# The observations that answer a call (ObservationType in openhands/core/schema/observation.py).
RESULT_OBSERVATIONS = frozenset(
    {"run", "run_ipython", "read", "write", "edit", "browse", "download", "mcp", "delegate", "success"}
    | {"error", "user_rejected"}  # the call failed, or the user would not let it run
)
# An action's args that say how it ran, not what it did.
UNSAID_ARGS = frozenset(
    {
        "thought",
        "security_risk",
        "is_confirmed",
        "confirmation_state",
        "impl_source",
        "translated_ipython_code",
        "kernel_init_code",
        "keep_prompt",
        "hidden",
        "blocking",
        "is_input",
        "is_static",
        "include_extra",
        "background",
    }
)
MESSAGE_S = 2.0  # after a message, the next event
_IPYTHON_TRACEBACK = re.compile(r"^\s*(\w+)\s+Traceback \(most recent call last\)", re.M)
_TIMED_OUT = re.compile(r"\[?(The command (?:timed out after|has no new output after) [\d.]+ seconds\.)")


def openhands(
    path: Path, agent: str | None = None, start: datetime = DEFAULT_START, run: ImportRun | None = None
) -> Iterator[dict[str, Any]]:
    """Events from an OpenHands ``output.jsonl`` (one session per instance) or a bare list of events
    (one session, named after the file).

    Session: the ``instance_id`` (else the file's name). Task: the first user message, else the
    ``instruction``. Messages are user or agent messages, a ``think`` or an action's ``thought`` an agent
    message; each tool action (``TOOL_ACTIONS``) is a call (tool: ``tool_call_metadata.function_name``,
    else the action; call id: ``tool_call_metadata.tool_call_id``, else the event id; args without
    ``UNSAID_ARGS``, long strings cut) answered by the observation whose ``cause`` is its id (failed: ``_failure``);
    ``delegate`` is a delegation. Other kinds are skipped. Outcome: ``_outcome``. Times: the events' own
    (``timestamp``, UTC), else the run's clock."""
    given, run = run, _run(run, start)
    data = _load_json_or_jsonl(path, run)
    items = [{"history": data}] if _is_event_list(data) else (data if isinstance(data, list) else [data])

    def one(i: int, item: Any) -> Iterator[dict[str, Any]]:
        where = f"{path.name}: item {i}"
        if not isinstance(item, dict):
            raise ImportShapeError(
                f"{where}: expected an object with a 'history' list of events, got {type(item).__name__}"
            )
        history = item.get("history")
        if (history is None and "instance_id" not in item) or (history is not None and not isinstance(history, list)):
            raise ImportShapeError(f"{where}: field 'history' must be a list of events")
        events = _flatten(history or [], where)
        name = _name(item, where) or (path.stem if len(items) == 1 else f"{path.stem}-{i}")
        began = next((t for _, e, _ in events if (t := _time(e)) is not None), None)
        s = _Session(f"openhands:{path.name}", agent or "openhands", run.session_id(name), began or run.next_start())
        task_at = next((j for j, (_, e, _) in enumerate(events) if _user_text(e)), None)
        task = _user_text(events[task_at][1]) if task_at is not None else _text(item.get("instruction"))
        s.add("session_start", {"task": task.strip()[:500], "metadata": _metadata(item, name)})
        walk = _Walk(s)
        for j, (w, event, pair) in enumerate(events):
            if j != task_at:
                walk.event(j, w, event, pair)
        walk.close("no observation recorded")
        outcome, reason = _outcome(item, where, run, (name, path.stem), walk.finish)
        s.add("session_end", {"outcome": outcome, "reason": reason})
        yield from s.events

    yield from _each_item(items, given, path.name, one)


def _is_event_list(data: Any) -> bool:
    """A saved session's events (``event_to_trajectory`` of each), not a list of instances."""
    return (
        isinstance(data, list)
        and any(isinstance(e, dict) and ("action" in e or "observation" in e) for e in data)
        and not any(isinstance(e, dict) and ("history" in e or "instance_id" in e) for e in data)
    )


def _flatten(history: list[Any], where: str) -> list[tuple[str, dict[str, Any], str | None]]:
    """(where, event, the key of the action it is paired with) for each event, pairs taken apart."""
    out: list[tuple[str, dict[str, Any], str | None]] = []
    for j, entry in enumerate(history):
        w = f"{where}: history[{j}]"
        if isinstance(entry, list):
            if len(entry) != 2 or not all(isinstance(e, dict) for e in entry):
                raise ImportShapeError(f"{w}: a pair must be [action, observation], two objects")
            out.append((f"{w}[0]", entry[0], None))
            out.append((f"{w}[1]", entry[1], _key(entry[0], f"{w}[0]", len(out) - 1)))
        elif isinstance(entry, dict):
            out.append((w, entry, None))
        else:
            raise ImportShapeError(f"{w}: an event must be an object, got {type(entry).__name__}")
    return out


def _key(event: Mapping[str, Any], where: str, j: int) -> str:
    """What an observation's ``cause`` names its action by: the action's id, else its place."""
    ident = _call_id(event.get("id"), f"{where}: field 'id'")
    return ident if ident is not None else f"event-{j}"


def _name(item: Mapping[str, Any], where: str) -> str | None:
    ident = item.get("instance_id")
    if ident is None or ident == "":
        return None
    if not isinstance(ident, (str, int)) or isinstance(ident, bool):
        raise ImportShapeError(f"{where}: field 'instance_id' must be a string, got {ident!r}")
    if len(str(ident)) > MAX_NAME_CHARS - 8:
        raise ImportShapeError(f"{where}: field 'instance_id' is longer than {MAX_NAME_CHARS - 8} characters")
    return str(ident)


def _metadata(item: Mapping[str, Any], name: str) -> dict[str, Any]:
    meta: dict[str, Any] = {"instance_id": name}
    run_meta = item.get("metadata")
    if isinstance(run_meta, dict):
        llm = run_meta.get("llm_config")
        for key, value in (
            ("agent_class", run_meta.get("agent_class")),
            ("model", llm.get("model") if isinstance(llm, dict) else None),
        ):
            if isinstance(value, str) and value:
                meta[key] = value
    return meta


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _object(event: Mapping[str, Any], key: str, where: str) -> dict[str, Any]:
    value = event.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ImportShapeError(f"{where}: field '{key}' must be an object, got {type(value).__name__}")
    return value


def _user_text(event: Mapping[str, Any]) -> str:
    """The text of a user's message, "" for any other event."""
    if event.get("action") != "message" or event.get("source") != "user":
        return ""
    args = event.get("args")
    return _text(args.get("content")).strip() if isinstance(args, dict) else ""


def _time(event: Mapping[str, Any]) -> datetime | None:
    """An event's ``timestamp`` (``datetime.isoformat()``, no zone: UTC), None when it has none or
    not a well-formed one."""
    v = event.get("timestamp")
    if not isinstance(v, str):
        return None
    try:
        t = datetime.fromisoformat(v.replace("Z", "+00:00"))
    except ValueError:
        return None
    return t if t.tzinfo else t.replace(tzinfo=timezone.utc)


@dataclass
class _Call:
    call_id: str
    tool: str
    delegate: bool = False


class _Walk:
    """The events of one history after its task, as v1 events."""

    def __init__(self, s: _Session) -> None:
        self.s = s
        self.pending: dict[str, _Call] = {}  # by the key an observation's cause names
        self.finish: Mapping[str, Any] | None = None  # the args of the finish (or reject) action, with its kind

    def event(self, j: int, where: str, event: dict[str, Any], pair: str | None) -> None:
        t = _time(event)
        if t is not None and t > self.s.t:
            self.s.t = t
        if "action" in event:
            self.action(j, where, event)
        elif "observation" in event:
            self.observation(where, event, pair)

    def say(self, *texts: Any) -> None:
        said: list[str] = []
        for text in texts:
            text = _text(text).strip()
            if text and text not in said:
                said.append(text)
                self.s.add("agent_message", {"text": text}, SWE_THOUGHT_S)

    def action(self, j: int, where: str, event: dict[str, Any]) -> None:
        kind = event["action"]
        if not isinstance(kind, str):
            raise ImportShapeError(f"{where}: field 'action' must be a string, got {kind!r}")
        args = _object(event, "args", where)
        if kind == "message":
            text = _text(args.get("content")).strip()
            if text:
                self.s.add(
                    "user_message" if event.get("source") == "user" else "agent_message", {"text": text}, MESSAGE_S
                )
        elif kind == "think":
            self.say(args.get("thought"))
        elif kind in ("finish", "reject"):
            outputs = args.get("outputs")
            outputs = outputs if isinstance(outputs, dict) else {}
            self.say(args.get("thought"), args.get("final_thought"), outputs.get("content"), outputs.get("reason"))
            self.finish = {**args, "action": kind}
        elif kind == "delegate":
            self.say(args.get("thought"))
            to_agent = _text(args.get("agent"))[:MAX_NAME_CHARS] or "delegate"
            inputs = args.get("inputs")
            task = inputs.get("task") if isinstance(inputs, dict) else None
            task = task if isinstance(task, str) else ("" if inputs is None else orjson.dumps(inputs).decode())
            key, call_id = self.ids(j, where, event)
            self.s.add("delegation", {"to_agent": to_agent, "task": task[:MAX_OUTPUT], "delegation_id": call_id})
            self.pending[key] = _Call(call_id, to_agent, delegate=True)
        elif kind in TOOL_ACTIONS:
            self.say(args.get("thought"))
            meta = _object(event, "tool_call_metadata", where)
            tool = meta.get("function_name")
            tool = tool if isinstance(tool, str) and tool else kind
            if len(tool) > MAX_NAME_CHARS:
                raise ImportShapeError(f"{where}: field 'tool_call_metadata.function_name' is too long")
            key, call_id = self.ids(j, where, event)
            said = {k: (v[:MAX_OUTPUT] if isinstance(v, str) else v) for k, v in args.items() if k not in UNSAID_ARGS}
            self.s.add(
                "tool_call",
                {"tool": tool, "call_id": call_id, "args": {k: v for k, v in said.items() if v not in ("", None)}},
                SWE_OBSERVATION_S,
            )
            self.pending[key] = _Call(call_id, tool)

    def ids(self, j: int, where: str, event: Mapping[str, Any]) -> tuple[str, str]:
        """(the key observations name the action by, its call id)."""
        key = _key(event, where, j)
        meta = _object(event, "tool_call_metadata", where)
        call_id = _call_id(meta.get("tool_call_id"), f"{where}: field 'tool_call_metadata.tool_call_id'") or key
        if len(call_id) > MAX_NAME_CHARS:
            raise ImportShapeError(f"{where}: field 'tool_call_metadata.tool_call_id' is too long")
        return key, call_id

    def observation(self, where: str, event: dict[str, Any], pair: str | None) -> None:
        kind = event["observation"]
        if not isinstance(kind, str):
            raise ImportShapeError(f"{where}: field 'observation' must be a string, got {kind!r}")
        cause = _call_id(event.get("cause"), f"{where}: field 'cause'")
        key = cause if cause in self.pending else pair
        if kind not in RESULT_OBSERVATIONS or key is None or key not in self.pending:
            return  # not a result, or the result of no call here (a background command's output)
        call = self.pending.pop(key)
        content = event.get("content")
        content = "" if content is None else (content if isinstance(content, str) else orjson.dumps(content).decode())
        error = _failure(kind, content, _object(event, "extras", where), event.get("success"))
        if call.delegate:
            self.s.add(
                "delegation_result",
                {
                    "to_agent": call.tool,
                    "outcome": "failure" if error is not None else "success",
                    "delegation_id": call.call_id,
                    "summary": (error if error is not None else content)[:MAX_OUTPUT] or None,
                },
                SWE_NEXT_STEP_S,
            )
            return
        self.result(call, error, content[:MAX_OUTPUT])

    def result(self, call: _Call, error: str | None, output: str | None) -> None:
        self.s.add(
            "tool_result",
            {
                "call_id": call.call_id,
                "tool": call.tool,
                "ok": error is None,
                "error": error,
                "output": output if error is None else None,
            },
            SWE_NEXT_STEP_S,
        )

    def close(self, error: str) -> None:
        """Every call still awaiting its result fails with ``error``."""
        for call in self.pending.values():
            if call.delegate:
                self.s.add(
                    "delegation_result",
                    {"to_agent": call.tool, "outcome": "failure", "delegation_id": call.call_id, "summary": error},
                )
            else:
                self.result(call, error, None)
        self.pending.clear()


def _failure(kind: str, content: str, extras: Mapping[str, Any], success: Any) -> str | None:
    """The error an observation shows, or None. ``error`` and ``user_rejected`` observations fail; a
    command (``run``) fails on a non-zero exit code (``extras.metadata.exit_code``, older runs'
    ``extras.exit_code``), else when ``success`` is false (a timeout: exit code -1), else when
    ``swe_failure`` finds an error in its output; an IPython cell on a traceback or ``swe_failure``; a
    browser action on ``extras.error``; any other on ``success`` false."""
    first = next((ln.strip() for ln in content.splitlines() if ln.strip()), "")
    if kind == "error":
        return content.strip()[:MAX_OUTPUT] or "error"
    if kind == "user_rejected":
        return (content.strip() or "rejected by the user")[:MAX_OUTPUT]
    if kind == "run":
        meta = extras.get("metadata")
        rc = meta.get("exit_code") if isinstance(meta, dict) else None
        rc = rc if isinstance(rc, int) and not isinstance(rc, bool) else extras.get("exit_code")
        rc = rc if isinstance(rc, int) and not isinstance(rc, bool) else None
        if rc is not None and rc != -1:
            if rc == 0:
                return None
            lines = [ln.strip() for ln in content.splitlines() if ln.strip()]
            detail = swe_failure(content) or (lines[-1] if lines else "")
            return (f"exit code {rc}: {detail}" if detail else f"exit code {rc}")[:MAX_OUTPUT]
        if success is False:
            suffix = meta.get("suffix") if isinstance(meta, dict) else None
            found = _TIMED_OUT.search(suffix) if isinstance(suffix, str) else None
            return found.group(1) if found else "the command did not finish (exit code -1)"
        return swe_failure(content)
    if kind == "run_ipython":
        return _ipython_failure(content) or swe_failure(content)
    if kind == "browse" and extras.get("error") is True:
        said = extras.get("last_browser_action_error")
        return (_text(said).strip() or first or "browser error")[:MAX_OUTPUT]
    if success is False:
        return (first or f"{kind} failed")[:MAX_OUTPUT]
    return None


def _ipython_failure(content: str) -> str | None:
    """The exception of an IPython traceback (``NameError  Traceback (most recent call last)`` ... its
    last line ``NameError: ...``), or None.

    >>> _ipython_failure("---\\nNameError    Traceback (most recent call last)\\nCell In[1], line 1\\n"
    ...                  "----> 1 foo\\n\\nNameError: name 'foo' is not defined")
    "NameError: name 'foo' is not defined"
    """
    found = _IPYTHON_TRACEBACK.search(content)
    if not found:
        return None
    name = found.group(1)
    said = [ln.strip() for ln in content[found.end() :].splitlines() if ln.strip().startswith(name)]
    return (said[-1] if said else found.group(0).strip())[:MAX_OUTPUT]


def _resolution(item: Mapping[str, Any], where: str) -> tuple[bool, str] | None:
    """A resolution the instance carries: ``report.resolved``, ``resolved``, ``test_result.resolved`` or
    ``test_result.report.resolved`` (what SWE-bench's evaluation adds)."""
    test_result = item.get("test_result")
    places = (
        ("report.resolved", item.get("report")),
        ("resolved", item),
        ("test_result.resolved", test_result),
        ("test_result.report.resolved", test_result.get("report") if isinstance(test_result, dict) else None),
    )
    for name, holder in places:
        if not isinstance(holder, dict) or holder.get("resolved") is None:
            continue
        return _resolved(holder["resolved"], where, name) == "success", name
    return None


def _outcome(
    item: Mapping[str, Any], where: str, run: ImportRun, idents: tuple[str, str], finish: Mapping[str, Any] | None
) -> tuple[str, str | None]:
    """The results file's outcome (by instance id, else the file's name), else the instance's own
    resolution (``_resolution``), else its ``error`` (failure), else what the agent said when it stopped:
    ``finish`` with ``task_completed`` "true" (success), "false" (failure), else partial; ``reject``
    (failure). Without any of these: partial."""
    given = _result_for(run, *idents)
    if given is not None:
        verdict = "resolved" if given == "success" else ("not resolved" if given == "failure" else given)
        return given, f"{verdict} per the results file"
    resolved = _resolution(item, where)
    if resolved is not None:
        return ("success", f"resolved ({resolved[1]})") if resolved[0] else ("failure", f"not resolved ({resolved[1]})")
    error = item.get("error")
    if error is not None and not isinstance(error, str):
        raise ImportShapeError(f"{where}: field 'error' must be a string, got {error!r}")
    if error:
        return "failure", f"error: {error.strip()[:500]}"
    if finish is None:
        return "partial", "the agent did not finish; resolution unknown (no --results)"
    if finish["action"] == "reject":
        return "failure", "the agent rejected the task"
    completed = finish.get("task_completed")
    if completed == "true":
        return "success", "the agent finished: task completed"
    if completed == "false":
        return "failure", "the agent finished: task not completed"
    said = f" (task_completed {completed})" if isinstance(completed, str) and completed else ""
    return "partial", f"the agent finished{said}; resolution unknown (no --results)"
