"""mini-swe-agent ``.traj.json`` trajectories, 1.x and 2.x, text-based or with tool calls (read
through ``--format swe-agent``)."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from somnus.importers.common import MAX_OUTPUT, ImportRun, ImportShapeError, _args, _call_id, _given_time, _Session
from somnus.importers.swe_common import (
    _ISSUE_BLOCKS,
    SWE_NEXT_STEP_S,
    SWE_OBSERVATION_S,
    SWE_THOUGHT_S,
    _swe_outcome,
    _text,
    swe_failure,
    swe_tool,
)

# mini-swe-agent (github SWE-agent/mini-swe-agent) saves a run as ``<instance_id>.traj.json``: ``info``
# (exit_status, submission, model_stats, config, mini_version), the chat ``messages`` and a
# ``trajectory_format``: "mini-swe-agent-1" (1.x, run/utils/save.py: save_traj) or "mini-swe-agent-1.1"
# (2.x, agents/default.py: DefaultAgent.serialize), whose messages carry an ``extra`` object. Its batch
# run writes a ``preds.json`` (instance id -> model_patch) beside the trajectories.

# The action regexes of the text-based configs: 1.x ```bash (agents/default.py AgentConfig), 2.x
# ```mswea_bash_command (models/litellm_textbased_model.py), and the XML configs (swebench_xml.yaml).
_MINI_ACTIONS = (
    re.compile(r"```mswea_bash_command\s*\n(.*?)\n```", re.S),
    re.compile(r"```bash\s*\n(.*?)\n```", re.S),
    re.compile(r"<mswea_bash_command>(.*?)</mswea_bash_command>", re.S),
    re.compile(r"<bash_code>(.*?)</bash_code>", re.S),
)
_MINI_THOUGHT = re.compile(r"^\s*THOUGHT\s*:\s*", re.I)
# The observation template (config/*.yaml action_observation_template / observation_template).
_MINI_RETURNCODE = re.compile(r"<returncode>\s*(-?\d+)\s*</returncode>")
_MINI_EXCEPTION = re.compile(r"<exception>(.*?)</exception>", re.S)
_MINI_OUTPUT = re.compile(r"<output>\n?(.*?)</output>", re.S)
_MINI_HEAD_TAIL = re.compile(r"<output_head>\n?(.*?)</output_head>.*?<output_tail>\n?(.*?)</output_tail>", re.S)
# 1.x's timeout_template (agents/default.py AgentConfig); 2.x reports a timeout as the exception_info.
_MINI_TIMEOUT = re.compile(r"^\s*The last command <command>.*?</command> timed out and has been killed\.", re.S)
# The format error templates: 1.x and the 2.x text-based configs, the 2.x tool-call configs, and the
# output-token-limit branch of both.
_MINI_FORMAT_ERROR = re.compile(
    r"^\s*(?:Please always provide EXACTLY ONE action|Format error:|Tool call error:"
    r"|Your previous response reached the output token limit)",
    re.I,
)
_MINI_TASK = re.compile(r"^\s*Please solve this issue:\s*(.*?)\n\s*\nYou can execute bash commands", re.S)
_MINI_PR_INTRO = re.compile(r"^\s*Consider the following PR description:\s*", re.I)


def _is_mini_swe_agent(item: Any) -> bool:
    if not isinstance(item, dict):
        return False
    fmt = item.get("trajectory_format")
    if isinstance(fmt, str) and fmt.startswith("mini-swe-agent"):
        return True
    return isinstance(item.get("messages"), list) and isinstance(item.get("info"), dict) and "trajectory" not in item


def _is_predictions(data: Any) -> bool:
    """A SWE-bench predictions file (mini-swe-agent's and SWE-agent's ``preds.json``): instance id ->
    ``{"instance_id", "model_name_or_path", "model_patch"}``."""
    return (
        isinstance(data, dict)
        and bool(data)
        and not any(k in data for k in ("trajectory", "messages", "history", "info"))
        and all(isinstance(v, dict) and "model_patch" in v for v in data.values())
    )


def mini_task(content: str) -> str:
    """The task of a mini-swe-agent run from its first user message (the rendered ``instance_template``):
    the PR description of the SWE-bench configs, the issue of ``Please solve this issue: ...``, else the
    message.

    >>> mini_task("<pr_description>\\nConsider the following PR description:\\nFix paginate()\\n</pr_description>\\n...")
    'Fix paginate()'
    >>> mini_task("Please solve this issue: Fix paginate()\\n\\nYou can execute bash commands and edit files.")
    'Fix paginate()'
    """
    for rx in _ISSUE_BLOCKS:
        found = rx.search(content)
        if found and found.group(1).strip():
            return _MINI_PR_INTRO.sub("", found.group(1)).strip()
    found = _MINI_TASK.search(content)
    if found and found.group(1).strip():
        return found.group(1).strip()
    return content.strip()


def mini_command(content: str, action_regex: re.Pattern[str] | None = None) -> tuple[str, str] | None:
    """The thought and the command of a text-based mini-swe-agent response, or None when it has not
    exactly one action (a format error: nothing ran). The run's own ``action_regex`` when it has one,
    else the first of the configs' regexes that finds an action; the thought is the text before it.

    >>> mini_command("THOUGHT: Let me look.\\n\\n```mswea_bash_command\\nls -la\\n```")
    ('Let me look.', 'ls -la')
    >>> mini_command("```bash\\nls\\n```\\n```bash\\npwd\\n```") is None
    True
    """
    for rx in (action_regex,) if action_regex is not None else _MINI_ACTIONS:
        found = list(rx.finditer(content))
        if not found:
            continue
        if len(found) != 1 or not found[0].group(1).strip():
            return None
        return _MINI_THOUGHT.sub("", content[: found[0].start()]).strip(), found[0].group(1).strip()
    return None


def mini_thought(content: str) -> str:
    """The reasoning of a response the harness rejected (no action, or several): its text before the
    first action, without the ``THOUGHT:`` label."""
    starts = [m.start() for rx in _MINI_ACTIONS if (m := rx.search(content))]
    return _MINI_THOUGHT.sub("", content[: min(starts)] if starts else content).strip()


_MINI_PREFIX = re.compile(r"^\s*(?:(?:[A-Za-z_][A-Za-z0-9_]*=(?:'[^']*'|\"[^\"]*\"|\S*)\s+)+|cd\s+\S+\s*&&\s*)")


def mini_tool(command: str) -> str:
    """The tool of a bash command: ``swe_tool`` of it without leading variable assignments and a leading
    ``cd <dir> &&`` (``PYTHONPATH=src python x.py`` and ``cd /testbed && python x.py`` run ``python``).

    >>> mini_tool("PYTHONPATH=src python reproduce.py"), mini_tool("cd /testbed && git diff"), mini_tool("cd /tmp")
    ('python', 'git', 'cd')
    """
    rest = command
    while (found := _MINI_PREFIX.match(rest)) and rest[found.end() :].strip():
        rest = rest[found.end() :]
    return swe_tool(rest)


def _mini_action_regex(info: Mapping[str, Any]) -> re.Pattern[str] | None:
    """The run's configured ``action_regex`` (2.x: ``config.model``, 1.x: ``config.agent``), if usable."""
    config = info.get("config")
    for part in ("model", "agent"):
        section = config.get(part) if isinstance(config, dict) else None
        rx = section.get("action_regex") if isinstance(section, dict) else None
        if isinstance(rx, str) and rx:
            try:
                compiled = re.compile(rx, re.S)
            except re.error:
                return None
            return compiled if compiled.groups == 1 else None
    return None


def mini_observation(content: str, extra: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """(error, output) of an observation: failed when its return code is not 0 (with the code and the
    error the output shows, ``swe_failure``, else its last line), when the command raised (a timeout:
    the ``exception_info``, or 1.x's timeout template) or, without a return code, when ``swe_failure``
    finds an error. The output is 2.x's ``extra.raw_output``, else the template's ``<output>`` (or its
    head and tail)."""
    rc = extra.get("returncode")
    if not isinstance(rc, int) or isinstance(rc, bool):
        found = _MINI_RETURNCODE.search(content)
        rc = int(found.group(1)) if found else None
    exc = extra.get("exception_info")
    if not (isinstance(exc, str) and exc.strip()):
        found = _MINI_EXCEPTION.search(content)
        exc = found.group(1) if found else None
    output = extra.get("raw_output")
    if not isinstance(output, str):
        whole, ends = _MINI_OUTPUT.search(content), _MINI_HEAD_TAIL.search(content)
        if whole:
            output = whole.group(1)
        elif ends:
            output = ends.group(1).rstrip("\n") + "\n…\n" + ends.group(2)
        else:
            output = content
    if _MINI_TIMEOUT.match(content):
        return content.strip().split("\n", 1)[0][:MAX_OUTPUT], None
    if exc and exc.strip():
        said = f"returncode {rc}: " if rc is not None else ""
        return (said + exc.strip())[:MAX_OUTPUT], None
    if rc is None:
        error = swe_failure(output)
        return error, (output[:MAX_OUTPUT] if error is None else None)
    if rc != 0:
        lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
        detail = swe_failure(output) or (lines[-1] if lines else "")
        return (f"returncode {rc}: {detail}" if detail else f"returncode {rc}")[:MAX_OUTPUT], None
    return None, output[:MAX_OUTPUT]


def _mini_first_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.strip().startswith("<")]
    return lines[0][:MAX_OUTPUT] if lines else "format error"


def _mini_time(m: Mapping[str, Any], extra: Mapping[str, Any], where: str) -> datetime | None:
    """When a message was added: 1.x's ``timestamp``, 2.x's ``extra.timestamp`` (epoch seconds)."""
    v = m.get("timestamp", extra.get("timestamp"))
    if v is None:
        return None
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        raise ImportShapeError(f"{where}: field 'timestamp' must be epoch seconds, got {v!r}")
    try:
        return datetime.fromtimestamp(float(v), tz=timezone.utc)
    except (ValueError, OverflowError, OSError):
        raise ImportShapeError(f"{where}: field 'timestamp' is not a time: {v!r}") from None


def _mini_actions(extra: Mapping[str, Any]) -> list[str]:
    """The commands of 2.x's ``extra.actions`` (what the harness parsed from a response and ran)."""
    actions = extra.get("actions")
    return [
        a["command"]
        for a in (actions if isinstance(actions, list) else [])
        if isinstance(a, dict) and isinstance(a.get("command"), str) and a["command"].strip()
    ]


def _mini_rejected(extra: Mapping[str, Any]) -> str:
    """The response a 2.x format error rejected: ``extra.model_response`` (text-based models), else the
    message content of the raw ``extra.response`` (tool-call models; the Responses API's output)."""
    said = extra.get("model_response")
    if isinstance(said, str):
        return said
    response = extra.get("response")
    if isinstance(response, dict) and isinstance(response.get("output"), list):  # the Responses API
        return str(_mini_responses_api({"object": "response", "output": response["output"]}, "")["content"])
    choices = response.get("choices") if isinstance(response, dict) else None
    first = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
    message = first.get("message")
    return _text(message.get("content")) if isinstance(message, dict) else ""


def _mini_responses_api(m: Any, where: str) -> Any:
    """A message of a Responses API model (2.x ``models/litellm_response_model.py``) as a chat message:
    a response object (``"object": "response"``, no role) as the assistant's message, its
    ``function_call`` output items as ``tool_calls``; a ``function_call_output`` as a ``role: tool``
    result. Any other message as it is."""
    if not isinstance(m, dict) or "role" in m:
        return m
    if m.get("type") == "function_call_output":
        return {"role": "tool", "tool_call_id": m.get("call_id"), "content": m.get("output"), "extra": m.get("extra")}
    output = m.get("output")
    if m.get("object") != "response" and not isinstance(output, list):
        return m
    if not isinstance(output, list):
        raise ImportShapeError(f"{where}: field 'output' must be a list of output items")
    items = [o for o in output if isinstance(o, dict)]
    said = [_text(o.get("content")) for o in items if o.get("type") == "message"]
    calls = [
        {"id": o.get("call_id") or o.get("id"), "function": {"name": o.get("name"), "arguments": o.get("arguments")}}
        for o in items
        if o.get("type") == "function_call"
    ]
    return {
        "role": "assistant",
        "content": "\n".join(t for t in said if t),
        "tool_calls": calls,
        "extra": m.get("extra"),
    }


def _optional_str(value: Any, where: str) -> str | None:
    if value is not None and not isinstance(value, str):
        raise ImportShapeError(f"{where} must be a string, got {str(value)[:80]!r}")
    return value


def _mini_swe_agent(
    path: Path, item: dict[str, Any], where: str, index: int | None, agent: str | None, run: ImportRun
) -> Iterator[dict[str, Any]]:
    """Events from one mini-swe-agent trajectory (see ``swe_agent``)."""
    info = item.get("info")
    info = {} if info is None else info
    if not isinstance(info, dict):
        raise ImportShapeError(f"{where}: field 'info' must be an object")
    messages = item.get("messages")
    if not isinstance(messages, list):
        raise ImportShapeError(f"{where}: field 'messages' must be a list of messages")
    fmt, status, submission = (
        _optional_str(m.get(key), f"{where}: field '{name}'")
        for m, key, name in (
            (item, "trajectory_format", "trajectory_format"),
            (info, "exit_status", "info.exit_status"),
            (info, "submission", "info.submission"),
        )
    )
    status = status or None  # 2.x saves "" while the run has not ended
    ident = item.get("instance_id") or info.get("instance_id")
    stem = path.name.removesuffix(".traj.json") if path.name.endswith(".traj.json") else path.stem
    name = str(ident) if ident else (stem if index is None else f"{stem}-{index}")
    checked = [(k, _mini_responses_api(m, f"{where}: messages[{k}]")) for k, m in enumerate(messages)]
    for k, m in checked:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ImportShapeError(f"{where}: messages[{k}]: a message needs a 'role' string")
        if m.get("extra") is not None and not isinstance(m["extra"], dict):
            raise ImportShapeError(f"{where}: messages[{k}]: field 'extra' must be an object")
    first_times = (_mini_time(m, m.get("extra") or {}, f"{where}: messages[{k}]") for k, m in checked)
    began = (
        _given_time(item, where)
        or _given_time(info, f"{where}: info")
        or next((t for t in first_times if t is not None), None)
    )
    session_id = run.session_id(name)
    s = _Session(f"mini-swe-agent:{path.name}", agent or "mini-swe-agent", session_id, began or run.next_start())
    meta: dict[str, Any] = {"instance_id": name}
    for key, value in (("exit_status", status), ("trajectory_format", fmt), ("mini_version", info.get("mini_version"))):
        if isinstance(value, str) and value:
            meta[key] = value
    task_at = next((k for k, m in checked if m["role"] == "user"), None)
    task = mini_task(_text(messages[task_at].get("content"))) if task_at is not None else ""
    s.add("session_start", {"task": task[:500], "metadata": meta})
    format_errors = _MiniWalk(s, _mini_action_regex(info), status, submission).walk(checked, task_at, where)
    if format_errors:
        meta["format_errors"] = format_errors  # the session_start payload holds this very dict
    outcome, reason = _swe_outcome(item, {**info, "exit_status": status}, where, run, (name, stem))
    s.add("session_end", {"outcome": outcome, "reason": reason})
    yield from s.events


class _MiniWalk:
    """The messages of a mini-swe-agent run after its task, as events. An assistant message is its
    thought (an agent message) and its command (text-based: ``mini_command``, or 2.x's
    ``extra.actions``) or each of its ``tool_calls`` (tool-call models), each a call of ``mini_tool``
    with args ``{"command": ...}``; the next observation (a user message, or a ``role: tool`` message
    answering the call's id) is its result (``mini_observation``). A format error runs nothing: it is
    counted (``format_errors``), and the reasoning of the response 2.x rejected (``_mini_rejected``) is
    kept as an agent message. The submit command's result is the submission (1.x: the last user message, 2.x:
    the ``role: exit`` message). In a 2.x interactive run, a user message with ``extra.actions`` is the
    human's command (a call), one with another ``extra.interrupt_type`` an interruption (a user message,
    and the calls it cut short fail)."""

    def __init__(
        self, s: _Session, action_regex: re.Pattern[str] | None, status: str | None, submission: str | None
    ) -> None:
        self.s, self.action_regex, self.status, self.submission = s, action_regex, status, submission
        self.pending: list[tuple[str, str]] = []  # (call_id, tool) of calls awaiting their result
        self.format_errors = 0
        self.unparsed = False  # the last assistant message had no command: the next user message says why

    def walk(self, messages: list[tuple[int, dict[str, Any]]], task_at: int | None, where: str) -> int:
        last_user = max((k for k, m in messages if m["role"] == "user"), default=None)
        for k, m in messages:
            w = f"{where}: messages[{k}]"
            extra: Mapping[str, Any] = m.get("extra") or {}
            t = _mini_time(m, extra, w)
            if t is not None and t > self.s.t:
                self.s.t = t
            role, content = m["role"], _text(m.get("content"))
            if k == task_at or role == "system":
                continue
            if role == "assistant":
                self._close("no observation recorded")
                self._assistant(m, content, extra, k, w)
            elif role == "tool":
                self._tool(m, content, extra, w)
            elif role == "user":
                self._user(content, extra, k == last_user, k)
            elif role == "exit":
                done = extra.get("exit_status", self.status) == "Submitted"
                ended = f"not executed: the run ended ({content.strip() or self.status})"
                self._close(None if done else ended, (content or self.submission or "") if done else None)
        self._close(f"no observation recorded (the run ended: exit_status {self.status})")
        return self.format_errors

    def _call(self, command: str | None, args: dict[str, Any], call_id: str, name: str = "bash") -> None:
        tool = mini_tool(command) if command and command.strip() else (name or "bash")
        self.s.add("tool_call", {"tool": tool, "call_id": call_id, "args": args}, SWE_OBSERVATION_S)
        self.pending.append((call_id, tool))

    def _assistant(self, m: Mapping[str, Any], content: str, extra: Mapping[str, Any], k: int, w: str) -> None:
        calls = m.get("tool_calls")
        if calls is not None and not isinstance(calls, list):
            raise ImportShapeError(f"{w}: field 'tool_calls' must be a list")
        if calls:
            if content.strip():
                self.s.add("agent_message", {"text": content.strip()}, SWE_THOUGHT_S)
            for n, call in enumerate(calls):
                fn = call.get("function") if isinstance(call, dict) else None
                if not isinstance(fn, dict):
                    raise ImportShapeError(f"{w}: tool_calls[{n}]: field 'function' must be an object")
                args = _args(fn.get("arguments"))
                command = args.get("command") if isinstance(args.get("command"), str) else None
                call_id = _call_id(call.get("id"), f"{w}: tool_calls[{n}]: field 'id'") or f"msg-{k}-{n}"
                self._call(command, {"command": command} if command else args, call_id, str(fn.get("name") or ""))
            return
        commands = _mini_actions(extra)
        parsed = mini_command(content, self.action_regex)
        if parsed is None and not commands:
            if thought := mini_thought(content):
                self.s.add("agent_message", {"text": thought}, SWE_THOUGHT_S)
            self.unparsed = True
            return
        thought = parsed[0] if parsed is not None else mini_thought(content)
        if thought:
            self.s.add("agent_message", {"text": thought}, SWE_THOUGHT_S)
        for n, command in enumerate(commands or ([parsed[1]] if parsed is not None else [])):
            self._call(command, {"command": command}, f"msg-{k}" if n == 0 else f"msg-{k}-{n}")

    def _tool(self, m: Mapping[str, Any], content: str, extra: Mapping[str, Any], w: str) -> None:
        call_id = _call_id(m.get("tool_call_id"), f"{w}: field 'tool_call_id'")
        at = next((i for i, (c, _) in enumerate(self.pending) if c == call_id), 0 if self.pending else None)
        if at is None:
            return  # a result for no call of this trajectory
        error, output = mini_observation(content, extra)
        self._result(self.pending.pop(at), error, output)

    def _user(self, content: str, extra: Mapping[str, Any], last: bool, k: int) -> None:
        unparsed, self.unparsed = self.unparsed, False
        itype = extra.get("interrupt_type")
        if (commands := _mini_actions(extra)) and not self.pending:  # 2.x interactive: the human's command
            for n, command in enumerate(commands):
                self._call(command, {"command": command}, f"msg-{k}" if n == 0 else f"msg-{k}-{n}")
            return
        if isinstance(itype, str) and itype != "FormatError":  # 2.x interactive: the human interrupted
            self._close(f"interrupted ({itype})")
            if content.strip():
                self.s.add("user_message", {"text": content.strip()}, SWE_NEXT_STEP_S)
            return
        if itype == "FormatError" or _MINI_FORMAT_ERROR.match(content) or (unparsed and not self.pending):
            self.format_errors += 1
            if thought := mini_thought(_mini_rejected(extra)):
                self.s.add("agent_message", {"text": thought}, SWE_THOUGHT_S)
            self._close(f"format error: {_mini_first_line(content)}")
            return
        if not self.pending:
            if content.strip() and "returncode" not in extra and not _MINI_RETURNCODE.search(content):
                self.s.add("user_message", {"text": content.strip()}, SWE_NEXT_STEP_S)  # a human's word
            return
        if last and self.status == "Submitted" and not _MINI_RETURNCODE.search(content) and "returncode" not in extra:
            self._result(self.pending.pop(0), None, content[:MAX_OUTPUT])  # 1.x: the submission
            return
        error, output = mini_observation(content, extra)
        self._result(self.pending.pop(0), error, output)

    def _result(self, call: tuple[str, str], error: str | None, output: str | None) -> None:
        call_id, tool = call
        self.s.add(
            "tool_result",
            {"call_id": call_id, "tool": tool, "ok": error is None, "error": error, "output": output},
            SWE_NEXT_STEP_S,
        )

    def _close(self, error: str | None, output: str | None = None) -> None:
        """Every call still awaiting its result gets one: failed with ``error``, or ok with ``output``."""
        while self.pending:
            self._result(self.pending.pop(0), error, output if error is None else None)
