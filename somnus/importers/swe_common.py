"""What SWE-agent and mini-swe-agent trajectories share: the problem statement, a command's tool,
whether an observation shows a failure, and the outcome of a run."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

import orjson

from somnus.importers.common import MAX_OUTPUT, ImportRun, _outcome, _resolved, _result_for

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
        own = {"outcome": _resolved(resolved, where)}
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
