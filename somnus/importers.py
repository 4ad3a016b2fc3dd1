"""Turn agent transcripts from other tools into v1 trace events.

- ``openai-chat``: OpenAI-style chat transcripts (``messages`` or tau-bench's ``traj``) with
  ``tool_calls`` and ``role: tool`` results; outcome from ``reward`` (1.0 = success, else failure)
  or ``outcome``.
- ``swe-agent``: SWE-agent ``.traj`` trajectories, 0.x and 1.x (``swe_agent``): the task is the
  problem statement, thoughts are agent messages, each action a tool call whose observation is a
  failure only when it shows one (``swe_failure``); the outcome comes from ``--results``. Also
  mini-swe-agent ``.traj.json`` trajectories, 1.x and 2.x, text-based or with tool calls
  (``_mini_swe_agent``): each command a tool call whose result fails on a non-zero return code, a
  timeout or a format error; a batch run's ``preds.json`` is named in ``run.skipped``.
- ``locomo``: LoCoMo conversations (``conversation`` with ``session_<n>`` turn lists and
  ``session_<n>_date_time``): one session per conversation session, stamped with its date; each
  turn becomes a message event (speaker A as ``user_message``, speaker B as ``agent_message``)
  whose ``dia_id`` is kept (``message_refs`` in the session's start metadata, and on the payload).
- ``toolbench``: ToolBench answer files (``answer_generation.train_messages``, OpenAI legacy function
  calling) or its training data (``conversations``): each call's result fails when ToolBench put an
  error on it or it is an HTTP error all the same (``toolbench_failure``); ``Finish`` ends the session
  (give_answer: success, give_up: failure). A file without a trajectory is named in ``run.skipped``.
- ``otel``: OTLP JSON (``somnus.otlp.files``): spans mapped by the GenAI semantic conventions.
- ``v1``: our own trace events, one JSON object a line (as ``somnus publish`` reads them), passed on.

One import (``import_files``) may read many files, directories and globs (``expand_paths``): its
sessions that carry no time of their own start ``spacing`` apart from ``start``, in file order, so
a directory of trajectories is spread over time instead of starting at one instant.

Event ids and times are derived deterministically from the input, so importing the same files twice
gives the same events. Shapes that are not understood raise ``ImportShapeError`` naming the field.
"""

from __future__ import annotations

import ast
import glob
import re
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from http import HTTPStatus
from pathlib import Path
from typing import Any, Protocol

import orjson

from somnus.schemas.events import SCHEMA_VERSION

IMPORT_NAMESPACE = uuid.UUID("6d2f8a1e-95c4-4c43-8f0e-3a7b9e2c5d10")
DEFAULT_START = datetime(2024, 5, 15, 20, 0, 0, tzinfo=timezone.utc)
DEFAULT_SPACING = timedelta(minutes=10)  # between the starts of consecutive sessions without times of their own
MAX_OUTPUT = 2000
OUTCOMES = ("success", "failure", "partial")


class ImportShapeError(ValueError):
    """The input file is not of the shape the chosen format expects."""


@dataclass
class ImportRun:
    """What the sessions of one import share: the clock that spaces sessions without times of their
    own (``start`` + n × ``spacing``, in the order they are read), outcomes from a results file (id ->
    success|failure|partial), the session ids already used (a repeated id gets ``~2``, ``~3``...), the
    lines of JSON Lines files left out, each with its file, line and reason (``problems``), and the files
    of the format that hold nothing to import, each with why (``skipped``: not an error)."""

    start: datetime = DEFAULT_START
    spacing: timedelta = DEFAULT_SPACING
    results: Mapping[str, str] = field(default_factory=dict)
    sessions: int = 0
    used: set[str] = field(default_factory=set)
    problems: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    def next_start(self) -> datetime:
        t = self.start + self.spacing * self.sessions
        self.sessions += 1
        return t

    def session_id(self, wanted: str) -> str:
        sid, n = wanted, 1
        while sid in self.used:
            n += 1
            sid = f"{wanted}~{n}"
        self.used.add(sid)
        return sid


def _run(run: ImportRun | None, start: datetime, spacing: timedelta | None = None) -> ImportRun:
    return run if run is not None else ImportRun(start=start, spacing=spacing or DEFAULT_SPACING)


def _each_item(
    items: list[Any], run: ImportRun | None, where: str, one: Callable[[int, Any], Iterator[dict[str, Any]]]
) -> Iterator[dict[str, Any]]:
    """The events of every item of a file, each item whole or not at all. With a ``run``, an item of the
    wrong shape is named in ``run.problems`` and the file's other items are imported; without one it
    raises. Any other exception an item raises (a shape no check foresaw) is an ``ImportShapeError``
    naming the item, never a traceback."""
    for i, item in enumerate(items):
        try:
            events = list(one(i, item))
        except ImportShapeError as exc:
            if run is None:
                raise
            run.problems.append(f"{exc}: this item is left out")
            continue
        except Exception as exc:  # noqa: BLE001 - the boundary: unforeseen input never stops an import
            err = ImportShapeError(f"{where}: item {i}: could not be read ({type(exc).__name__}: {exc})")
            if run is None:
                raise err from exc
            run.problems.append(f"{err}: this item is left out")
            continue
        yield from events


class _Session:
    """Builds the events of one session with consecutive seqs and deterministic ids and times."""

    def __init__(self, source: str, agent: str, session_id: str, start: datetime) -> None:
        self.source, self.agent, self.session_id = source, agent, session_id
        self.t = start
        self.events: list[dict[str, Any]] = []

    def add(self, type_: str, payload: dict[str, Any], step_s: float = 5.0) -> None:
        seq = len(self.events)
        self.events.append(
            {
                "event_id": str(uuid.uuid5(IMPORT_NAMESPACE, f"{self.source}\x1f{self.session_id}\x1f{seq}")),
                "schema_version": SCHEMA_VERSION,
                "ts": _iso(self.t),
                "agent": self.agent,
                "session_id": self.session_id,
                "seq": seq,
                "type": type_,
                "payload": {k: v for k, v in payload.items() if v is not None},
            }
        )
        try:
            self.t += timedelta(seconds=step_s)
        except (OverflowError, ValueError):  # a step or a given time past year 9999
            raise ImportShapeError(
                f"session {self.session_id!r}: event {seq} ({type_}) moves the clock out of range "
                f"({self.t.isoformat()} + {step_s} s)"
            ) from None


def _iso(t: datetime) -> str:
    return t.isoformat().replace("+00:00", "Z")


MAX_BAD_LINES = 20  # of a JSON Lines file reported one by one; the rest are counted
BOM = b"\xef\xbb\xbf"  # a UTF-8 byte order mark, which Windows tools write at the start of a file


def _load_json_or_jsonl(path: Path, run: ImportRun | None = None) -> Any:
    """The file's JSON document, or its JSON lines (a UTF-8 byte order mark skipped). A line that is
    not JSON among lines that are is left out and reported in ``run.problems`` (with no ``run``, or
    when no line is JSON, an ``ImportShapeError``): one bad line does not lose the others."""
    data = path.read_bytes().removeprefix(BOM)
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        whole = f"{path}: not JSON ({exc})"  # a document's own error says where it breaks
    items, bad = [], []
    for n, line in enumerate(data.splitlines(), 1):
        if not line.strip():
            continue
        try:
            items.append(orjson.loads(line))
        except orjson.JSONDecodeError as exc:
            bad.append(f"{path}: line {n} is not JSON ({exc})")
    # JSON Lines when any line is an object or an array, even after a bad first line; a broken
    # document's lines are not (`  "key": value,` and `{` are no JSON), so it gets its own error
    if bad and not any(isinstance(item, (dict, list)) for item in items):
        raise ImportShapeError(whole if b"\n" in data.strip() else bad[0])
    if bad and run is None:
        raise ImportShapeError(bad[0])
    if run is not None:
        run.problems.extend(f"{b}: left out" for b in bad[:MAX_BAD_LINES])
        if len(bad) > MAX_BAD_LINES:
            run.problems.append(f"{path}: {len(bad) - MAX_BAD_LINES} more lines are not JSON: left out")
    return items


def _outcome(item: Mapping[str, Any], where: str) -> tuple[str, str | None]:
    if "reward" in item:
        reward = item["reward"]
        if not isinstance(reward, (int, float)) or isinstance(reward, bool):
            raise ImportShapeError(f"{where}: field 'reward' must be a number, got {reward!r}")
        return ("success" if reward >= 1.0 else "failure"), f"reward {reward}"
    if "outcome" in item:
        outcome = item["outcome"]
        if outcome not in OUTCOMES:
            raise ImportShapeError(f"{where}: field 'outcome' must be success|failure|partial, got {outcome!r}")
        return outcome, None
    return "partial", "the transcript has no reward or outcome"


def _given_time(item: Mapping[str, Any], where: str) -> datetime | None:
    """The session's own start time, when the file carries one (``start_time``, ``started_at``,
    ``created_at`` or ``timestamp``: ISO 8601, or epoch seconds)."""
    for key in ("start_time", "started_at", "created_at", "timestamp"):
        v = item.get(key)
        if v is None:
            continue
        try:
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                return datetime.fromtimestamp(float(v), tz=timezone.utc)
            t = datetime.fromisoformat(str(v).replace("Z", "+00:00"))
        except (ValueError, OverflowError, OSError):
            raise ImportShapeError(f"{where}: field '{key}' is not a time: {v!r}") from None
        return t if t.tzinfo else t.replace(tzinfo=timezone.utc)
    return None


# ---- OpenAI chat ---------------------------------------------------------------------------------


def openai_chat(
    path: Path, agent: str | None = None, start: datetime = DEFAULT_START, run: ImportRun | None = None
) -> Iterator[dict[str, Any]]:
    """Events from OpenAI-style chat transcripts (a list, one object, or JSON lines).

    A results file (``run.results``) names a transcript by its session id or its ``id`` / ``session_id``
    / ``task<n>-trial<m>``, and overrides its own reward."""
    given, run = run, _run(run, start)
    data = _load_json_or_jsonl(path, run)
    items = data if isinstance(data, list) else [data]

    def one(i: int, item: Any) -> Iterator[dict[str, Any]]:
        where = f"{path.name}: item {i}"
        if not isinstance(item, dict):
            raise ImportShapeError(f"{where}: expected an object with 'messages' or 'traj', got {type(item).__name__}")
        messages = item.get("messages", item.get("traj"))
        if not isinstance(messages, list):
            raise ImportShapeError(f"{where}: no 'messages' (or 'traj') list of chat messages")
        ident = item.get("id", item.get("session_id"))
        if ident is None and "task_id" in item:
            ident = f"task{item['task_id']}-trial{item.get('trial', 0)}"
        session_id = run.session_id(f"{path.stem}-{ident if ident is not None else i}")
        began = _given_time(item, where)
        own = item.get("agent")
        if own is not None and not isinstance(own, str):
            raise ImportShapeError(f"{where}: field 'agent' must be a string, got {own!r}")
        s = _Session(f"openai-chat:{path.name}", agent or own or "assistant", session_id, began or run.next_start())
        first_user = next((m.get("content") for m in messages if isinstance(m, dict) and m.get("role") == "user"), None)
        if first_user is not None and not isinstance(first_user, str):
            first_user = orjson.dumps(first_user).decode()  # content parts, as for every other message
        meta = {k: item[k] for k in ("task_id", "trial", "reward") if k in item}
        s.add("session_start", {"task": (first_user or "")[:500], "metadata": meta})
        names: dict[str, str] = {}
        for j, m in enumerate(messages):
            mwhere = f"{where}: message {j}"
            if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                raise ImportShapeError(f"{mwhere}: expected an object with a 'role' string")
            role, content = m["role"], m.get("content")
            if content is not None and not isinstance(content, str):
                content = orjson.dumps(content).decode()
            if role == "system":
                continue
            if role == "user":
                s.add("user_message", {"text": content or ""})
            elif role == "assistant":
                if content:
                    s.add("agent_message", {"text": content})
                calls = m.get("tool_calls") or []
                if not isinstance(calls, list):
                    raise ImportShapeError(f"{mwhere}: field 'tool_calls' must be a list, got {type(calls).__name__}")
                for k, call in enumerate(calls):
                    fn = call.get("function") if isinstance(call, dict) else None
                    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
                        raise ImportShapeError(f"{mwhere}: tool_calls[{k}] has no 'function.name' string")
                    call_id = _call_id(call.get("id"), f"{mwhere}: tool_calls[{k}].id") or f"call-{j}-{k}"
                    names[call_id] = fn["name"]
                    s.add(
                        "tool_call", {"tool": fn["name"], "call_id": call_id, "args": _args(fn.get("arguments"))}, 1.0
                    )
            elif role == "tool":
                answered = _call_id(m.get("tool_call_id"), f"{mwhere}: tool_call_id")
                if not answered:
                    raise ImportShapeError(f"{mwhere}: a 'tool' message needs 'tool_call_id'")
                name = m.get("name")
                if name is not None and not isinstance(name, str):
                    raise ImportShapeError(f"{mwhere}: field 'name' must be a string, got {name!r}")
                text = content or ""
                failed = text.lstrip().lower().startswith("error")
                s.add(
                    "tool_result",
                    {
                        "call_id": answered,
                        "tool": name or names.get(answered),
                        "ok": not failed,
                        "error": text[:MAX_OUTPUT] if failed else None,
                        "output": None if failed else text[:MAX_OUTPUT],
                    },
                    2.0,
                )
            else:
                raise ImportShapeError(f"{mwhere}: unknown role {role!r} (expected system, user, assistant or tool)")
        given = _result_for(run, session_id, None if ident is None else str(ident))
        outcome, reason = (given, "per the results file") if given else _outcome(item, where)
        s.add("session_end", {"outcome": outcome, "reason": reason})
        yield from s.events

    yield from _each_item(items, given, path.name, one)


def _call_id(value: Any, where: str) -> str | None:
    """A call id as the contract's string: a number is written out (some runtimes count calls),
    anything else (an object, a list, true) is a shape error."""
    if value is None or value == "":
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    raise ImportShapeError(f"{where}: must be a string, got {value!r}")


def _result_for(run: ImportRun, *idents: str | None) -> str | None:
    for ident in idents:
        if ident is not None and ident in run.results:
            return run.results[ident]
    return None


def _args(arguments: Any) -> dict[str, Any]:
    if isinstance(arguments, dict):
        return arguments
    if isinstance(arguments, str):
        try:
            parsed = orjson.loads(arguments) if arguments.strip() else {}
        except orjson.JSONDecodeError:
            return {"_raw": arguments}
        return parsed if isinstance(parsed, dict) else {"_value": parsed}
    return {} if arguments is None else {"_value": arguments}


# ---- SWE-agent -------------------------------------------------------------------------------------

# Where the problem statement sits in the first user message of a run that does not store it on its own:
# 0.x "ISSUE:\n...\n\nINSTRUCTIONS:", 1.x "<pr_description>...</pr_description>", and two common variants.
_ISSUE_BLOCKS = (
    re.compile(r"ISSUE:\s*\n(.*?)\n\s*INSTRUCTIONS:", re.S),
    re.compile(r"<pr_description>\s*(.*?)\s*</pr_description>", re.S),
    re.compile(r"<issue>\s*(.*?)\s*</issue>", re.S),
    re.compile(r"<problem_statement>\s*(.*?)\s*</problem_statement>", re.S),
)
_DEMO_START = "--- DEMONSTRATION ---"
_DEMO_END = "--- END OF DEMONSTRATION ---"
_FENCE = re.compile(r"```[^\n]*\n(.*?)```", re.S)
SWE_THOUGHT_S = 1.0  # a thought is followed by its action this much later
SWE_OBSERVATION_S = 3.0  # a call's result comes this much later, unless the step has its execution_time
SWE_NEXT_STEP_S = 2.0  # after a result, the next step


def _text(content: Any) -> str:
    """A message's text: a string, or the text parts of a list of content parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


def swe_problem_statement(item: Mapping[str, Any]) -> str:
    """The issue a trajectory solves: ``problem_statement`` (a string, or an object with ``text``), the
    1.x ``replay_config``'s problem statement, else the issue text in the first user message of
    ``history`` that is not a demonstration (``is_demo``, or a message framed by SWE-agent's
    ``--- DEMONSTRATION ---`` markers, whose issue is the demonstration's, not this run's).

    >>> swe_problem_statement({"history": [
    ...     {"role": "user", "is_demo": True, "content": "Here is a demonstration ... ISSUE:\\nold bug\\n\\nINSTRUCTIONS: ..."},
    ...     {"role": "user", "content": "We're solving this issue. ISSUE:\\nPixel data fails\\n\\nINSTRUCTIONS:\\nNow..."}]})
    'Pixel data fails'
    """
    for source in (item.get("problem_statement"), _replay_problem_statement(item.get("replay_config"))):
        if isinstance(source, str) and source.strip():
            return source.strip()
        if isinstance(source, dict) and isinstance(source.get("text"), str) and source["text"].strip():
            return source["text"].strip()
    for m in item.get("history") or []:
        if (
            not isinstance(m, dict)
            or m.get("role") != "user"
            or m.get("is_demo")
            or m.get("message_type") == "demonstration"
        ):
            continue
        content = _text(m.get("content"))
        if _DEMO_START in content or content.lstrip().startswith("Here is a demonstration"):
            if _DEMO_END not in content:
                continue  # the demonstration alone
            content = content.split(_DEMO_END, 1)[1]
        for rx in _ISSUE_BLOCKS:
            found = rx.search(content)
            if found and found.group(1).strip():
                return found.group(1).strip()
        if content.strip():
            return content.strip()
    return ""


def _replay_problem_statement(config: Any) -> Any:
    if isinstance(config, str):
        try:
            config = orjson.loads(config)
        except orjson.JSONDecodeError:
            return None
    return config.get("problem_statement") if isinstance(config, dict) else None


def swe_command(action: Any) -> str | None:
    """The command a step ran, or None when it ran none: an empty action, or a model's discussion that
    landed in the action field (a first line ``DISCUSSION``: its last fenced block is the command, if any).

    >>> swe_command("open src/fields.py 1474\\n"), swe_command("  "), swe_command("DISCUSSION\\nLet me look.")
    ('open src/fields.py 1474', None, None)
    >>> swe_command("DISCUSSION\\nLet me look.\\n```\\nls -a\\n```")
    'ls -a'
    """
    text = action.strip() if isinstance(action, str) else ""
    if not text:
        return None
    if text.splitlines()[0].strip().rstrip(":").upper() == "DISCUSSION":
        blocks = [b.strip() for b in _FENCE.findall(text) if b.strip()]
        return blocks[-1] if blocks else None
    return text


def swe_tool(command: str) -> str:
    """The tool of a command: its first word (``open``, ``edit``, ``python``, ``str_replace_editor``)."""
    first = command.split(None, 1)[0]
    return first.strip("'\"") or first


_EDIT_REFUSED = re.compile(r"your proposed edit has introduced new syntax error", re.I)
_LINT_LINE = re.compile(r"^-?\s*(?:[A-Z]\d{3}\s+)?(.+)$")  # "- E999 IndentationError: unexpected indent"
_NOT_FOUND = re.compile(
    r"^(?:[\w./-]*sh:\s*(?:line\s*\d+:\s*)?)?(?:[^\s:'\"]{1,100}:\s*command not found\b|command not found:\s*\S+)"
    r"|^[\w./-]*sh:\s*\d+:\s*[^\s:'\"]{1,100}:\s*not found\b",
    re.I,
)
_TRACEBACK = re.compile(r"^\s*Traceback \(most recent call last\):")
_EXIT = re.compile(
    r"\b(?:exit(?:ed)?\s+(?:with\s+)?(?:code|status)|returned non-zero exit status|exit_code)"
    r"\s*[:=]?\s*(-?\d+)",
    re.I,
)
# The tools' own error messages (SWE-agent's open/goto/edit/create/search commands, the 1.x editor),
# timeouts, and a shell's refusals.
_TOOL_ERROR = re.compile(
    r"^(?:error:|usage:\s|no file open\b|(?:file|directory) .{1,300} not found\b|the path .{1,300} does not exist"
    r"|no replacement was performed\b|invalid `|goto allows only one|more than \d+ (?:files|lines) matched"
    r"|execution timed out|the command .{1,300} was cancelled because it took more than"
    r"|[\w.+-]+: (?:cannot|can't) (?:access|open|stat|remove|create)\b|[\w.+-]+: .{0,300}no such file or directory"
    r"|python[\d.]*: can't open file)",
    re.I,
)
# Lines of a file view or a search result (numbered source lines) are never read as errors.
_SOURCE_LINE = re.compile(r"^\s*\d+(?::|\t)|^Line \d+:")


def swe_failure(observation: str) -> str | None:
    """The error an observation shows, or None when it shows none.

    A failure is an edit refused for syntax errors (``edit refused: <the linter's errors>``), a shell's
    "command not found", a Python traceback, a non-zero exit status, or a tool's own error message
    (``Usage:``, ``Error:``, ``File ... not found``, ``No replacement was performed``, a timeout...). A file
    view ("[File: ... (158 lines total)]"), a listing or a search result is not, whatever its lines say:
    numbered source lines are never read.

    >>> swe_failure("[File: /repo/fields.py (1997 lines total)]\\n1474:    raise ValueError(msg)")
    >>> swe_failure("AUTHORS.rst  setup.py  src/  tests/")
    >>> swe_failure("/bin/bash: line 2784: javac: command not found")
    '/bin/bash: line 2784: javac: command not found'
    >>> swe_failure("Your proposed edit has introduced new syntax error(s). Please read this...\\n\\nERRORS:\\n"
    ...             "- E999 IndentationError: unexpected indent\\n\\nThis is how your edit would have looked")
    'edit refused: IndentationError: unexpected indent'
    """
    text = observation.replace("\r\n", "\n").replace("\r", "\n")
    if _EDIT_REFUSED.search(text):
        return "edit refused: " + "; ".join(_lint_errors(text))
    lines = [ln for ln in text.split("\n") if ln.strip() and not _SOURCE_LINE.match(ln)]
    for i, line in enumerate(lines):
        if _NOT_FOUND.search(line.strip()):
            return line.strip()[:MAX_OUTPUT]
        if _TRACEBACK.match(line):
            return _traceback(lines[i:])
    for line in lines:
        m = _EXIT.search(line)
        if m and int(m.group(1)) != 0:
            return line.strip()[:MAX_OUTPUT]
    for line in lines:
        if _TOOL_ERROR.match(line.strip()):
            return line.strip()[:MAX_OUTPUT]
    return None


def _lint_errors(text: str) -> list[str]:
    after = text.split("ERRORS:", 1)[1] if "ERRORS:" in text else ""
    out: list[str] = []
    for line in after.split("\n"):
        if not line.strip():
            if out:
                break
            continue
        if line.startswith("This is how your edit"):
            break
        m = _LINT_LINE.match(line.strip())
        if m:
            out.append(m.group(1).strip())
    return out or ["syntax error"]


def _traceback(lines: list[str]) -> str:
    """The traceback from its header, with its last lines (where the exception is) when it is long."""
    text = "\n".join(ln.rstrip() for ln in lines)
    if len(text) <= MAX_OUTPUT:
        return text
    head = lines[0].strip()
    return head + "\n…\n" + text[-(MAX_OUTPUT - len(head) - 3) :]


def swe_agent(
    path: Path, agent: str | None = None, start: datetime = DEFAULT_START, run: ImportRun | None = None
) -> Iterator[dict[str, Any]]:
    """Events from one SWE-agent ``.traj`` file (0.x or 1.x; or a list of trajectories in one JSON file).

    Session: the ``instance_id`` (else the file's name). Task: ``swe_problem_statement``. Each step:
    its ``thought`` as an agent message, then its command (``swe_command``) as a call of ``swe_tool``
    whose result fails only when ``swe_failure`` finds an error. End: the outcome from the results
    file (``run.results``, by instance id), else the item's own ``reward`` / ``outcome`` / ``resolved``,
    else from ``info.exit_status`` (a submitted patch: partial, its resolution unknown; no patch:
    failure); the reason names the exit status. Times: the item's own (``_given_time``), else the run's
    clock; a step's ``execution_time`` (1.x) is the time its result took.

    A mini-swe-agent trajectory (a ``trajectory_format`` "mini-swe-agent-1" or "-1.1", or ``messages``
    and ``info`` without ``trajectory``) is read by ``_mini_swe_agent``: session the ``instance_id``
    (else the file's name without ``.traj.json``), task from the first user message (``mini_task``),
    each command a call (``_MiniWalk``), the outcome as above. A predictions file (``preds.json``) is
    not a trajectory: it is named in ``run.skipped``.
    """
    given, run = run, _run(run, start)
    data = _load_json_or_jsonl(path, run)
    if _is_predictions(data):
        run.skipped.append(
            f"{path}: a predictions file (instance id -> model_patch), not a trajectory: the patches are "
            f"in the trajectories' info.submission"
        )
        return
    items = data if isinstance(data, list) else [data]

    def one(i: int, item: Any) -> Iterator[dict[str, Any]]:
        where = f"{path.name}: item {i}"
        if _is_mini_swe_agent(item):
            yield from _mini_swe_agent(path, item, where, i if len(items) > 1 else None, agent, run)
            return
        if not isinstance(item, dict) or not isinstance(item.get("trajectory"), list):
            raise ImportShapeError(
                f"{where}: no 'trajectory' list of steps and no mini-swe-agent 'messages' "
                f"(is this a SWE-agent .traj or a mini-swe-agent .traj.json file?)"
            )
        info = item.get("info") or {}
        if not isinstance(info, dict):
            raise ImportShapeError(f"{where}: field 'info' must be an object")
        if not isinstance(item.get("history") or [], list):
            raise ImportShapeError(f"{where}: field 'history' must be a list of messages")
        status = info.get("exit_status")
        if status is not None and not isinstance(status, str):
            raise ImportShapeError(f"{where}: field 'info.exit_status' must be a string, got {status!r}")
        ident = item.get("instance_id") or info.get("instance_id")
        name = str(ident) if ident else (path.stem if len(items) == 1 else f"{path.stem}-{i}")
        session_id = run.session_id(name)
        began = _given_time(item, where) or _given_time(info, f"{where}: info")
        s = _Session(f"swe-agent:{path.name}", agent or "swe-agent", session_id, began or run.next_start())
        meta: dict[str, Any] = {"instance_id": name}
        if status is not None:
            meta["exit_status"] = status
        s.add("session_start", {"task": swe_problem_statement(item)[:500], "metadata": meta})
        for j, step in enumerate(item["trajectory"]):
            _swe_step(s, step, f"{where}: trajectory[{j}]", j)
        outcome, reason = _swe_outcome(item, info, where, run, (name, path.stem))
        s.add("session_end", {"outcome": outcome, "reason": reason})
        yield from s.events

    yield from _each_item(items, given, path.name, one)


def _swe_step(s: _Session, step: Any, where: str, j: int) -> None:
    if not isinstance(step, dict) or "action" not in step:
        raise ImportShapeError(f"{where}: a step needs an 'action' field")
    thought = step.get("thought")
    if isinstance(thought, str) and thought.strip():
        s.add("agent_message", {"text": thought.strip()}, SWE_THOUGHT_S)
    command = swe_command(step["action"])
    if command is None:
        return  # a thought (or a format error) without a command: nothing was run
    took = step.get("execution_time")
    took_s = float(took) if isinstance(took, (int, float)) and not isinstance(took, bool) and took >= 0 else None
    tool, call_id = swe_tool(command), f"step-{j}"
    s.add(
        "tool_call",
        {"tool": tool, "call_id": call_id, "args": {"command": command}},
        max(took_s, 0.001) if took_s is not None else SWE_OBSERVATION_S,
    )
    obs = step.get("observation")
    obs = "" if obs is None else (obs if isinstance(obs, str) else orjson.dumps(obs).decode())
    error = swe_failure(obs)
    s.add(
        "tool_result",
        {
            "call_id": call_id,
            "tool": tool,
            "ok": error is None,
            "error": error,
            "output": obs[:MAX_OUTPUT] if error is None else None,
        },
        SWE_NEXT_STEP_S,
    )


def _swe_outcome(
    item: Mapping[str, Any], info: Mapping[str, Any], where: str, run: ImportRun, idents: Iterable[str]
) -> tuple[str, str | None]:
    status = info.get("exit_status")
    said = f"exit_status {status}" if status is not None else None
    given = _result_for(run, *idents)
    if given is not None:
        verdict = "resolved" if given == "success" else ("not resolved" if given == "failure" else given)
        return given, "; ".join(x for x in (said, f"{verdict} per the results file") if x)
    own = {k: item[k] for k in ("reward", "outcome") if k in item}
    resolved = item.get("resolved", info.get("resolved"))
    if not own and resolved is not None:
        if not isinstance(resolved, bool):
            raise ImportShapeError(f"{where}: field 'resolved' must be true or false, got {resolved!r}")
        own = {"outcome": "success" if resolved else "failure"}
    if own:
        outcome, reason = _outcome(own, where)
        return outcome, said or reason
    if status is None:
        return "partial", "the trajectory has no info.exit_status"
    if "submission" not in info:
        return "partial", f"{said}; resolution unknown (no --results)"
    if status.lower().startswith("submitted") and info["submission"]:
        return "partial", f"{said}; patch submitted, resolution unknown (no --results)"
    return "failure", f"{said}; no patch"


# ---- mini-swe-agent ------------------------------------------------------------------------------
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


# ---- results files -------------------------------------------------------------------------------

RESOLVED_KEYS = ("resolved", "resolved_ids")
# Lists of ids a SWE-bench report holds that were evaluated (or failed to be) and are not resolved
# unless also listed as resolved.
UNRESOLVED_KEYS = (
    "unresolved",
    "unresolved_ids",
    "error_ids",
    "empty_patch_ids",
    "completed_ids",
    "submitted_ids",
    "no_generation",
    "generated",
    "with_logs",
    "install_fail",
    "reset_failed",
    "no_apply",
    "applied",
    "test_errored",
    "test_timeout",
)
IGNORED_KEYS = (
    "incomplete_ids",
    "schema_version",
    "total_instances",
    "submitted_instances",
    "completed_instances",
    "resolved_instances",
    "unresolved_instances",
    "empty_patch_instances",
    "error_instances",
)


def load_results(path: Path) -> dict[str, str]:
    """Outcomes by instance id from a results file: a SWE-bench style report (``resolved`` /
    ``resolved_ids`` lists are successes; ids in its other lists (``unresolved``, ``error_ids``,
    ``empty_patch_ids``, ``completed_ids``...) are failures unless also resolved), or a JSON map
    id -> outcome (``success`` | ``failure`` | ``partial``, ``resolved`` | ``unresolved``, true | false,
    or an object with a boolean ``resolved``, as SWE-bench's per-instance report has)."""
    try:
        data = orjson.loads(Path(path).read_bytes())
    except orjson.JSONDecodeError as exc:
        raise ImportShapeError(f"{path}: not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ImportShapeError(
            f"{path}: expected an object (a SWE-bench report or a map id -> outcome), got {type(data).__name__}"
        )
    if any(k in data for k in RESOLVED_KEYS + UNRESOLVED_KEYS):
        return _report_outcomes(path, data)
    return {str(k): _one_outcome(path, str(k), v) for k, v in data.items()}


def _report_outcomes(path: Path, data: Mapping[str, Any]) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in data.items():
        if key in IGNORED_KEYS:
            continue
        if key not in RESOLVED_KEYS + UNRESOLVED_KEYS:
            raise ImportShapeError(
                f"{path}: field '{key}' is not a list a SWE-bench report has "
                f"(known: {', '.join(RESOLVED_KEYS + UNRESOLVED_KEYS)})"
            )
        if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
            raise ImportShapeError(f"{path}: field '{key}' must be a list of instance ids")
    for key in UNRESOLVED_KEYS:
        for ident in data.get(key) or []:
            out[ident] = "failure"
    for key in RESOLVED_KEYS:
        for ident in data.get(key) or []:
            out[ident] = "success"
    return out


_RESULT_WORDS = {
    "success": "success",
    "failure": "failure",
    "partial": "partial",
    "resolved": "success",
    "unresolved": "failure",
}


def _one_outcome(path: Path, ident: str, value: Any) -> str:
    if isinstance(value, bool):
        return "success" if value else "failure"
    if isinstance(value, str) and value in _RESULT_WORDS:
        return _RESULT_WORDS[value]
    if isinstance(value, dict) and isinstance(value.get("resolved"), bool):
        return "success" if value["resolved"] else "failure"
    raise ImportShapeError(
        f"{path}: field '{ident}': expected success|failure|partial, resolved|unresolved, "
        f"true|false or an object with a boolean 'resolved', got {value!r}"
    )


LOCOMO_TURN_STEP_S = 30.0  # the dataset dates sessions, not turns: turns are spaced this far apart
_LOCOMO_DATE = re.compile(r"^\s*(\d{1,2}):(\d{2})\s*([ap]m)\s+on\s+(\d{1,2})\s+([A-Za-z]+),?\s+(\d{4})\s*$", re.I)
_MONTHS = {
    m: i
    for i, m in enumerate(
        (
            "january",
            "february",
            "march",
            "april",
            "may",
            "june",
            "july",
            "august",
            "september",
            "october",
            "november",
            "december",
        ),
        1,
    )
}


def locomo_date(text: str) -> datetime:
    """A LoCoMo session date ("1:56 pm on 8 May, 2023") as an aware UTC time.

    >>> locomo_date("1:56 pm on 8 May, 2023").isoformat()
    '2023-05-08T13:56:00+00:00'
    """
    m = _LOCOMO_DATE.match(text)
    if m is None or m[5].lower() not in _MONTHS:
        raise ValueError(f"not a LoCoMo session date: {text!r}")
    hour = int(m[1]) % 12 + (12 if m[3].lower() == "pm" else 0)
    return datetime(int(m[6]), _MONTHS[m[5].lower()], int(m[4]), hour, int(m[2]), tzinfo=timezone.utc)


def locomo(
    path: Path, agent: str | None = None, start: datetime = DEFAULT_START, run: ImportRun | None = None
) -> Iterator[dict[str, Any]]:
    """Events from LoCoMo conversations (a list of samples, or one sample).

    Agent: ``agent``, else ``locomo-<sample_id>`` (each conversation its own agent, so its own
    memory scope). Session ``<sample_id>-s<n>``. A turn's text is its ``text``, followed by
    ``[shares <blip_caption>]`` when it shared an image (the caption is all we have of it).
    ``start`` is unused: every session carries its own date. A repeated session id (the same
    conversation in two files of one import) gets a suffix from ``run``.
    """
    given, run = run, _run(run, start)
    data = _load_json_or_jsonl(path, run)
    items = data if isinstance(data, list) else [data]

    def one(i: int, item: Any) -> Iterator[dict[str, Any]]:
        where = f"{path.name}: item {i}"
        if not isinstance(item, dict) or not isinstance(item.get("conversation"), dict):
            raise ImportShapeError(f"{where}: no 'conversation' object (is this a LoCoMo file?)")
        conv = item["conversation"]
        sample = str(item.get("sample_id", i))
        speakers = {"user": conv.get("speaker_a"), "agent": conv.get("speaker_b")}
        if not all(isinstance(v, str) and v for v in speakers.values()):
            raise ImportShapeError(f"{where}: 'conversation' needs 'speaker_a' and 'speaker_b' names")
        numbers = sorted(int(k.split("_")[1]) for k in conv if re.fullmatch(r"session_\d+", k))
        for n in numbers:
            turns = conv[f"session_{n}"]
            if not isinstance(turns, list):
                raise ImportShapeError(f"{where}: 'session_{n}' must be a list of turns")
            date_text = conv.get(f"session_{n}_date_time")
            if not isinstance(date_text, str):
                raise ImportShapeError(f"{where}: no 'session_{n}_date_time' for session {n}")
            try:
                when = locomo_date(date_text)
            except ValueError as exc:
                raise ImportShapeError(f"{where}: 'session_{n}_date_time': {exc}") from None
            s = _Session(f"locomo:{path.name}", agent or f"locomo-{sample}", run.session_id(f"{sample}-s{n}"), when)
            refs: dict[str, str] = {}
            for j, turn in enumerate(turns):
                twhere = f"{where}: session_{n}[{j}]"
                if not isinstance(turn, dict) or not isinstance(turn.get("text"), str):
                    raise ImportShapeError(f"{twhere}: a turn needs a 'text' string")
                if turn.get("speaker") not in speakers.values():
                    raise ImportShapeError(
                        f"{twhere}: speaker {turn.get('speaker')!r} is neither speaker_a nor speaker_b"
                    )
                if not isinstance(turn.get("dia_id"), str):
                    raise ImportShapeError(f"{twhere}: a turn needs a 'dia_id' string")
                refs[str(j + 1)] = turn["dia_id"]  # seq 0 is the session start
            first_user = next((t["text"] for t in turns if t["speaker"] == speakers["user"]), "")
            s.add(
                "session_start",
                {
                    "task": first_user[:500],
                    "metadata": {
                        "source": "locomo",
                        "mode": "conversation",
                        "conversation": sample,
                        "session": n,
                        "session_date": date_text,
                        "speakers": speakers,
                        "message_refs": refs,
                    },
                },
                1.0,
            )
            for turn in turns:
                text = turn["text"]
                caption = turn.get("blip_caption")
                if isinstance(caption, str) and caption.strip():
                    text = f"{text} [shares {caption.strip()}]"
                kind = "user_message" if turn["speaker"] == speakers["user"] else "agent_message"
                s.add(kind, {"text": text, "speaker": turn["speaker"], "dia_id": turn["dia_id"]}, LOCOMO_TURN_STEP_S)
            s.add("session_end", {"outcome": "partial", "reason": "conversation session ended"})
            yield from s.events

    yield from _each_item(items, given, path.name, one)


# ---- our own v1 events -----------------------------------------------------------------------------


def v1(
    path: Path, agent: str | None = None, start: datetime = DEFAULT_START, run: ImportRun | None = None
) -> Iterator[dict[str, Any]]:
    """v1 trace events as they are (JSON lines, or a JSON list): they carry their own times and
    sessions. ``agent`` (when given) replaces each event's agent. The pipeline validates them."""
    data = _load_json_or_jsonl(path, run)
    for n, event in enumerate(data if isinstance(data, list) else [data], 1):
        if not isinstance(event, dict) or not isinstance(event.get("session_id"), str):
            bad = f"{path.name}: event {n}: expected a v1 trace event (an object with 'session_id')"
            if run is None:
                raise ImportShapeError(bad)
            run.problems.append(f"{bad}: left out")  # the pipeline validates the rest
            continue
        yield {**event, "agent": agent} if agent else event


# ---- ToolBench ------------------------------------------------------------------------------------

TOOLBENCH_FINISH = "Finish"  # ToolBench's pseudo-function that ends a trajectory: not a tool call
TOOLBENCH_OUTCOMES = {"give_answer": "success", "give_up": "failure", "give_up_and_restart": "failure"}
_TB_BEGIN = re.compile(r"\s*Begin!\s*$")  # FORMAT_INSTRUCTIONS_USER_FUNCTION: "\n{query}\nBegin!\n"
# The error field of a result whose observation was cut (rapidapi.py keeps max_observation_length chars + "...").
_TB_CUT = re.compile(r'^\s*\{\s*"error"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"response"\s*:\s*', re.S)
# RapidAPI's own refusals, as ToolBench's server (toolbench/inference/server.py, process_error) knows them,
# and its gateway's answer for an endpoint that does not exist: an older server, or its cache, passed
# some of them on with an empty error.
_TB_GATEWAY = re.compile(
    r"The request to the API has timed out|Gateway \(working\) ---> API \(not working\)|You are not subscribed to this API"
    r"|Too many requests|You have exceeded|you are being rate limited|Access restricted\. Check credits balance"
    r"|an error in the gateway has occurred|Blocked User\. Please contact your API provider"
    r"|Endpoint '[^']{0,300}' does not exist",
    re.I,
)
_TB_STATUS_KEYS = ("status", "statusCode", "status_code")
_TB_MESSAGE_KEYS = ("message", "msg", "title", "error", "detail")
_TB_STATUS_IN_TEXT = re.compile(
    r"\bstatus_code\s*=\s*(\d{3})\b"
)  # rapidapi.py: "request invalid, data error. status_code=500"
_HTTP_PHRASES = {s.phrase.lower(): s.value for s in HTTPStatus if s.value >= 400}
_TB_HTML_TITLE = re.compile(r"<title>\s*(?:(\d{3})\s*)?([^<]{1,80}?)\s*</title>", re.I)
TOOLBENCH_PARSE_MAX = 20_000  # a response longer than this is not parsed for a status (errors are short)
TOOLBENCH_DETAIL = 200  # characters of a response that follow an error label ("Message error... <response>")


def toolbench_observation(content: Any) -> tuple[str, str]:
    """The ``error`` and ``response`` of a ToolBench function result: a JSON string
    ``{"error": ..., "response": ...}``, possibly cut after its first characters (then the error is read
    from its start and the response is the rest); anything else is all response.

    >>> toolbench_observation('{"error": "", "response": "[1, 2]"}')
    ('', '[1, 2]')
    >>> toolbench_observation('{"error": "Message error...", "response": "{statusCode: 400, err...')
    ('Message error...', '{statusCode: 400, err...')
    """
    text = _plain(content)
    try:
        obj = orjson.loads(text)
    except orjson.JSONDecodeError:
        obj = None
    if isinstance(obj, dict) and ("error" in obj or "response" in obj):
        error, response = obj.get("error"), obj.get("response")
        return (_plain(error), _plain(response))
    cut = _TB_CUT.match(text)
    if cut:
        try:
            error = orjson.loads(f'"{cut.group(1)}"')
        except orjson.JSONDecodeError:
            error = cut.group(1)
        rest = text[cut.end() :]
        return str(error), rest[1:] if rest.startswith('"') else rest
    return "", text


def _plain(value: Any) -> str:
    if value is None:
        return ""
    return value if isinstance(value, str) else orjson.dumps(value).decode()


def toolbench_failure(error: str, response: str) -> tuple[str | None, int | None]:
    """Whether a ToolBench call failed: ``(error text, HTTP status)``, or ``(None, None)`` when it did not.

    A call failed when ToolBench's server or environment put an ``error`` on it (a timeout, "Message
    error..." for a response that mentions an error, Unauthorized/Unsubscribed/rate limits, "No such
    function name", "Function executing ... error", "Tool input parse error"), or when the response it
    passed on with an empty error is an HTTP error all the same: an object whose ``status`` /
    ``statusCode`` / ``status_code`` is 400-599, an HTML page titled with an HTTP error ("403 Forbidden"),
    or one of RapidAPI's refusals (a timeout, "API (not working)", not subscribed, too many requests, a
    rate limit, "Endpoint '...' does not exist"). Anything else is the API's answer, even one that says
    it found nothing ({'message': 'Tracking information not found'}): the agent read it as such.

    >>> toolbench_failure("", "{'status': '401', 'msg': 'Authentication required'}")
    ('Authentication required', 401)
    >>> toolbench_failure("", '"<html><head><title>Forbidden</title></head>...')
    ('Forbidden', 403)
    >>> toolbench_failure("", "Endpoint '/search/people' does not exist")
    ("Endpoint '/search/people' does not exist", None)
    >>> toolbench_failure("Timeout error...Read timed out. (read timeout=30)", "")
    ('Timeout error...Read timed out. (read timeout=30)', None)
    >>> toolbench_failure("", "{'meta': {'code': 200}, 'data': []}")
    (None, None)
    """
    status, message = _tb_status(response)
    if status is None and (m := _TB_STATUS_IN_TEXT.search(error)):
        status = int(m.group(1))
    said = message or " ".join(response.split())[:TOOLBENCH_DETAIL]
    if error.strip():  # a label ("Message error...") is followed by what the response says
        text = " ".join(error.split())
        return (f"{text} {said}" if said and text.endswith("...") else text)[:MAX_OUTPUT], status
    if status is not None:
        return (said or f"HTTP {status}")[:MAX_OUTPUT], status
    if _TB_GATEWAY.search(response[:TOOLBENCH_PARSE_MAX]):
        return said[:MAX_OUTPUT], None
    return None, None


def _tb_status(response: str) -> tuple[int | None, str | None]:
    """The HTTP error status a response carries (a top-level status field of an object, JSON or a Python
    repr as ToolBench's server passes ``str(response)`` on, or an HTML error page's title) and its message
    (the object's ``message`` / ``msg`` / ``title`` / ``error`` / ``detail``, or the title)."""
    if len(response) > TOOLBENCH_PARSE_MAX:
        return None, None
    stripped = response.strip()
    obj: Any = None
    if stripped.startswith("{"):
        try:
            obj = orjson.loads(stripped)
        except orjson.JSONDecodeError:
            try:
                obj = ast.literal_eval(stripped)
            except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
                obj = None
    if isinstance(obj, dict):
        message = next((obj[k] for k in _TB_MESSAGE_KEYS if isinstance(obj.get(k), str) and obj[k].strip()), None)
        for key in _TB_STATUS_KEYS:
            v = obj.get(key)
            code = (
                v
                if isinstance(v, int) and not isinstance(v, bool)
                else (int(v) if isinstance(v, str) and v.strip().isdigit() else None)
            )
            if code is not None and 400 <= code <= 599:
                return code, message
        return None, message
    head = stripped[:300].lower()  # an HTML page, perhaps quoted: '"<html><head><title>Forbidden</title>...'
    title = _TB_HTML_TITLE.search(stripped) if "<html" in head or "<!doctype html" in head else None
    if title:
        code = int(title.group(1)) if title.group(1) else _HTTP_PHRASES.get(title.group(2).lower())
        if code is not None and 400 <= code <= 599:
            return code, title.group(2)
    return None, None


def toolbench(
    path: Path, agent: str | None = None, start: datetime = DEFAULT_START, run: ImportRun | None = None
) -> Iterator[dict[str, Any]]:
    """Events from one ToolBench answer file (``<query_id>_<model>_<method>.json``, as its inference
    pipeline writes it: toolbench/inference/Algorithms/DFS.py and single_chain.py ``to_json``).

    The trajectory is ``answer_generation.train_messages``' last message list (one list per step, each
    the path up to that step; the last is the whole path to the answer or the give-up), in OpenAI's
    legacy function calling. A file with ``valid_data`` false has none: the search neither answered nor
    gave up, and its ``tree`` holds every branch it tried with no one chosen (ToolBench's own
    preprocessing drops such files). It is skipped and named in ``run.skipped``.

    Session: the file's name. Task: ``query``. The system prompt and the search's own prompts (messages
    with ``valid`` false: "This is not the first time you try this task...") are not the conversation
    and are left out; the user message is the query (without its "Begin!"). Each ``function_call`` is a
    tool call (its ``arguments`` parsed), each ``role: function`` message its result, failed as
    ``toolbench_failure`` says, with the HTTP status when one is known. The ``Finish`` call is no tool
    call: its ``final_answer`` is the agent's last message and the session ends with ``finish_type``
    give_answer -> success (an answer was given; ToolBench's evaluation of it is not in the file),
    give_up -> failure; without ``finish_type`` (single_chain's files), the Finish call's ``return_type``
    decides the same way; with neither, partial. A results file (``run.results``, by session id) wins.
    """
    run = _run(run, start)
    data = _load_json_or_jsonl(path, run)
    if isinstance(data, list) or (isinstance(data, dict) and "conversations" in data):
        yield from _toolbench_conversations(path, data, agent, run)
        return
    if not isinstance(data, dict) or not isinstance(data.get("answer_generation"), dict):
        raise ImportShapeError(f"{path.name}: no 'answer_generation' object (is this a ToolBench answer file?)")
    gen = data["answer_generation"]
    where = f"{path.name}: answer_generation"
    valid = gen.get("valid_data", True)
    if not isinstance(valid, bool):
        raise ImportShapeError(f"{where}: field 'valid_data' must be true or false, got {valid!r}")
    query = gen.get("query", "")
    if not isinstance(query, str):
        raise ImportShapeError(f"{where}: field 'query' must be a string, got {type(query).__name__}")
    finish = gen.get("finish_type")
    if finish is not None and not isinstance(finish, str):
        raise ImportShapeError(f"{where}: field 'finish_type' must be a string, got {finish!r}")
    steps = gen.get("train_messages")
    if not valid or steps is None or steps == []:
        run.skipped.append(
            f"{path}: no trajectory (valid_data {str(valid).lower()}, no train_messages): the search "
            f"neither answered nor gave up"
        )
        return
    if not isinstance(steps, list) or not all(isinstance(s, list) for s in steps):
        raise ImportShapeError(f"{where}: field 'train_messages' must be a list of message lists")
    session_id = run.session_id(path.stem)
    s = _Session(f"toolbench:{path.name}", agent or "toolbench", session_id, run.next_start())
    meta = {k: gen[k] for k in ("finish_type", "query_count") if isinstance(gen.get(k), (str, int))}
    if isinstance(data.get("win"), bool):
        meta["win"] = data["win"]
    s.add(
        "session_start", {"task": _TB_BEGIN.sub("", query).strip()[:500], "metadata": {"source": "toolbench", **meta}}
    )
    said = _toolbench_messages(s, steps[-1], f"{where}: train_messages[{len(steps) - 1}]")
    outcome, reason = _toolbench_outcome(finish, said, run, (session_id, path.stem))
    s.add("session_end", {"outcome": outcome, "reason": reason})
    yield from s.events


def _toolbench_messages(s: _Session, messages: list[Any], where: str) -> str | None:
    """The events of one message list; the Finish call's ``return_type`` (None without one)."""
    pending: list[tuple[str, str]] = []  # (call_id, tool) of calls not yet answered, oldest first
    said: str | None = None
    for j, m in enumerate(messages):
        mwhere = f"{where}: message {j}"
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ImportShapeError(f"{mwhere}: expected an object with a 'role' string")
        role, content = m["role"], m.get("content")
        if content is not None and not isinstance(content, str):
            content = orjson.dumps(content).decode()
        if role == "system" or m.get("valid") is False:
            continue
        if role == "user":
            s.add("user_message", {"text": _TB_BEGIN.sub("", content or "").strip()})
        elif role == "assistant":
            if content and content.strip():
                s.add("agent_message", {"text": content.strip()}, 1.0)
            call = m.get("function_call")
            if call is None:
                continue
            if not isinstance(call, dict) or not isinstance(call.get("name"), str) or not call["name"]:
                raise ImportShapeError(f"{mwhere}: 'function_call' needs a 'name' string")
            args = _args(call.get("arguments"))
            if call["name"] == TOOLBENCH_FINISH:
                said = str(args.get("return_type") or "") or None
                answer = args.get("final_answer")
                if isinstance(answer, str) and answer.strip():
                    s.add("agent_message", {"text": answer.strip()}, 1.0)
                continue
            call_id = f"call-{j}"
            pending.append((call_id, call["name"]))
            s.add("tool_call", {"tool": call["name"], "call_id": call_id, "args": args}, 1.0)
        elif role == "function":
            name = m.get("name")
            if name is not None and not isinstance(name, str):
                raise ImportShapeError(f"{mwhere}: field 'name' must be a string, got {name!r}")
            call_id, tool = pending.pop(0) if pending else (f"call-{j}", name or "unknown")
            error, response = toolbench_observation(content)
            failed, status = toolbench_failure(error, response)
            s.add(
                "tool_result",
                {
                    "call_id": call_id,
                    "tool": name or tool,
                    "ok": failed is None,
                    "error": failed,
                    "http_status": status,
                    "output": response[:MAX_OUTPUT] if failed is None else None,
                },
                2.0,
            )
        else:
            raise ImportShapeError(f"{mwhere}: unknown role {role!r} (expected system, user, assistant or function)")
    return said


# ToolBench's training data (preprocess/preprocess_toolllama_data.py): one item per step of a trajectory,
# {"id": "Step <n>: <query>", "conversations": [{"from": ..., "value": ...}]}, each a longer prefix.
_TB_STEP_ID = re.compile(r"^Step \d+: ", re.S)
_TB_REACT = re.compile(r"^\s*Thought:(.*?)\nAction:\s*(.*?)\s*\nAction Input:\s*(.*)$", re.S)
_TB_RETRY = "This is not the first time you try this task"  # the search's prompt (DIVERSITY_PROMPT), not the user


def _toolbench_conversations(path: Path, data: Any, agent: str | None, run: ImportRun) -> Iterator[dict[str, Any]]:
    """ToolBench training items: per query (the ``id`` without its "Step <n>: "), the longest
    conversation is the trajectory; assistant turns are "Thought: ... Action: ... Action Input: ..."."""
    items = data if isinstance(data, list) else [data]
    longest: dict[str, list[dict[str, Any]]] = {}
    for i, item in enumerate(items):
        where = f"{path.name}: item {i}"
        if not isinstance(item, dict) or not isinstance(item.get("conversations"), list):
            raise ImportShapeError(f"{where}: expected an object with a 'conversations' list (ToolBench training data)")
        ident = item.get("id", str(i))
        query = _TB_STEP_ID.sub("", ident) if isinstance(ident, str) else str(ident)
        messages = [_tb_turn(t, f"{where}: conversations[{j}]") for j, t in enumerate(item["conversations"])]
        if len(messages) >= len(longest.get(query, [])):
            longest[query] = messages
    for n, (query, messages) in enumerate(longest.items()):
        session_id = run.session_id(f"{path.stem}-{n}")
        s = _Session(f"toolbench:{path.name}", agent or "toolbench", session_id, run.next_start())
        s.add("session_start", {"task": _TB_BEGIN.sub("", query).strip()[:500], "metadata": {"source": "toolbench"}})
        said = _toolbench_messages(s, messages, f"{path.name}: {query[:60]!r}")
        outcome, reason = _toolbench_outcome(None, said, run, (session_id,))
        s.add("session_end", {"outcome": outcome, "reason": reason})
        yield from s.events


def _tb_turn(turn: Any, where: str) -> dict[str, Any]:
    """One training turn as the chat message it was made from."""
    if not isinstance(turn, dict) or not isinstance(turn.get("from"), str) or not isinstance(turn.get("value"), str):
        raise ImportShapeError(f"{where}: expected an object with 'from' and 'value' strings")
    role, value = turn["from"], turn["value"]
    if role == "user" and value.lstrip().startswith(_TB_RETRY):
        return {"role": "user", "content": value, "valid": False}
    if role != "assistant":
        return {"role": role, "content": value, **({"name": ""} if role == "function" else {})}
    m = _TB_REACT.match(value)
    if m is None:
        return {"role": "assistant", "content": value.strip()}
    thought = m.group(1).strip()
    return {
        "role": "assistant",
        "content": thought or None,
        "function_call": {"name": m.group(2), "arguments": m.group(3).strip()},
    }


def _toolbench_outcome(finish: str | None, said: str | None, run: ImportRun, idents: Iterable[str]) -> tuple[str, str]:
    given = _result_for(run, *idents)
    if given is not None:
        return given, "per the results file"
    if finish is not None:
        if finish in TOOLBENCH_OUTCOMES:
            return TOOLBENCH_OUTCOMES[finish], f"finish_type {finish}"
        return "partial", f"finish_type {finish} (neither give_answer nor give_up)"
    if said in TOOLBENCH_OUTCOMES:
        return TOOLBENCH_OUTCOMES[said], f"Finish return_type {said}"
    return "partial", "no finish_type and no Finish call"


class Importer(Protocol):
    def __call__(
        self, path: Path, agent: str | None = ..., start: datetime = ..., run: ImportRun | None = ...
    ) -> Iterator[dict[str, Any]]: ...


def otel(
    path: Path, agent: str | None = None, start: datetime = DEFAULT_START, run: ImportRun | None = None
) -> Iterator[dict[str, Any]]:
    """OTLP JSON files (the collector's file exporter): ``somnus.otlp.files.otel``."""
    from somnus.otlp.files import otel as read_otel

    return read_otel(path, agent=agent, start=start, run=run)


FORMATS: dict[str, Importer] = {
    "openai-chat": openai_chat,
    "swe-agent": swe_agent,
    "locomo": locomo,
    "toolbench": toolbench,
    "v1": v1,
    "otel": otel,
}
# The files a directory contributes to an import of each format.
EXTENSIONS = {
    "openai-chat": (".json", ".jsonl"),
    "swe-agent": (".traj", ".traj.json"),  # SWE-agent; mini-swe-agent (never its preds.json)
    "locomo": (".json",),
    "toolbench": (".json",),
    "v1": (".jsonl", ".json"),
    "otel": (".json", ".jsonl"),
}


def expand_paths(args: Iterable[str | Path], fmt: str) -> list[Path]:
    """Files to import, in order: a file as given; a directory's files of the format (``EXTENSIONS``,
    searched recursively, sorted by path); a glob's matches, sorted (``**`` descends). Each file once.
    A name that matches nothing is an ``ImportShapeError``."""
    exts = EXTENSIONS[fmt]
    out: list[Path] = []

    def add_dir(d: Path) -> None:
        out.extend(sorted(p for p in d.rglob("*") if p.is_file() and p.name.endswith(exts)))

    for arg in args:
        p = Path(arg)
        if p.is_file():
            out.append(p)
        elif p.is_dir():
            add_dir(p)
        elif glob.has_magic(str(arg)):
            matches = sorted(glob.glob(str(arg), recursive=True))
            if not matches:
                raise ImportShapeError(f"{arg}: the pattern matches no file")
            for m in map(Path, matches):
                add_dir(m) if m.is_dir() else out.append(m)
        elif p.exists():  # a FIFO, a device (/dev/zero), a socket: reading it could block or never end
            raise ImportShapeError(f"{arg}: not a regular file or a directory")
        else:
            raise ImportShapeError(f"{arg}: no such file or directory")
    return list(dict.fromkeys(out))


def import_run(
    start: str | datetime | None = None, spacing_s: float | None = None, results: Path | None = None
) -> ImportRun:
    """An ``ImportRun`` from command-line values: ``start`` an ISO time (UTC unless it says otherwise),
    ``spacing_s`` seconds (> 0), ``results`` a results file (``load_results``)."""
    when = DEFAULT_START
    if isinstance(start, datetime):
        when = start
    elif start:
        try:
            when = datetime.fromisoformat(start.replace("Z", "+00:00"))
        except ValueError:
            raise ImportShapeError(f"--start: not an ISO time: {start!r}") from None
    when = when if when.tzinfo else when.replace(tzinfo=timezone.utc)
    if spacing_s is not None and not spacing_s > 0:
        raise ImportShapeError(f"--spacing: must be a positive number of seconds, got {spacing_s}")
    spacing = timedelta(seconds=spacing_s) if spacing_s is not None else DEFAULT_SPACING
    return ImportRun(start=when, spacing=spacing, results=load_results(results) if results is not None else {})


def import_files(
    paths: Iterable[Path], fmt: str, agent: str | None = None, run: ImportRun | None = None
) -> Iterator[dict[str, Any]]:
    """The events of every file, in order, sharing one ``ImportRun`` (clock, results, session ids)."""
    if fmt not in FORMATS:
        raise ImportShapeError(f"unknown format {fmt!r}; choose one of: {', '.join(FORMATS)}")
    run = run or ImportRun()
    for path in paths:
        yield from FORMATS[fmt](Path(path), agent=agent, run=run)
