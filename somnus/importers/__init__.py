"""Turn agent transcripts from other tools into v1 trace events.

- ``openai-chat``: chat transcripts (``messages``, tau-bench's ``traj``, a Responses API ``input``, or a
  bare list of messages, one a line too) in the dialects agents write: OpenAI chat completions
  (``tool_calls`` and ``role: tool``, legacy ``function_call`` and ``role: function``), Anthropic
  Messages (``tool_use`` and ``tool_result`` blocks; ``is_error`` marks a failed result, thinking is not
  said), Responses API items (``function_call``, ``function_call_output``), and Claude Code session logs
  (a message a line, one session per ``sessionId``), and tau2-bench results (``simulations``: flat
  tool calls, ``error`` on results, the simulated user's own tools said as the user's words), and
  Inspect AI logs (``samples`` of a JSON log or a ``.eval`` archive: ``function`` names the tool, a
  ``ToolCallError`` fails the result, the first scorer's value is the outcome), and LangChain messages
  (``model_dump()``, ``messages_to_dict``, ``dumpd``; a LangGraph state's ``messages``, named by its
  ``thread_id``; a tool message's ``status`` says whether it failed), and AutoGen (a ``TaskResult``'s
  AgentChat messages and events, an agent's saved ``llm_context``: calls, results with ``is_error``,
  the agent named by its ``source``), and smolagents runs (``memory.get_full_steps()`` or a ``RunResult``:
  each step's calls and results, the tool its error names failing, ``final_answer`` said, the run's
  ``state`` as its outcome), and Gemini API ``contents`` and Google ADK sessions (``parts``:
  ``function_call``, ``function_response`` with an ``error`` key when it failed, answered by ``id``
  or else by name), and OpenAI Agents SDK traces (the spans a TracingProcessor exports: each ``function``
  span a call, failed when it has an ``error``); outcome
  from ``reward`` (or tau2's ``reward_info.reward``; 1.0 = success, else failure) or ``outcome``, else
  partial. A result fails when it says so (``is_error``, ``error``) or, saying nothing, its text starts
  with "error" or is the Agents SDK's default failure text.
- ``swe-agent``: SWE-agent ``.traj`` trajectories, 0.x and 1.x (``swe_agent``): the task is the
  problem statement, thoughts are agent messages, each action a tool call whose observation is a
  failure only when it shows one (``swe_failure``); the outcome comes from ``--results``. Also
  mini-swe-agent ``.traj.json`` trajectories, 1.x and 2.x, text-based or with tool calls
  (``_mini_swe_agent``): each command a tool call whose result fails on a non-zero return code, a
  timeout or a format error; a batch run's ``preds.json`` is named in ``run.skipped``.
- ``openhands``: OpenHands trajectories (``openhands``): an evaluation's ``output.jsonl`` (one session
  per instance; its ``history`` a list of events, or of ``[action, observation]`` pairs in older runs)
  or a saved session's bare list of events. Each tool action is a call answered by the observation
  whose ``cause`` is its id: failed on a non-zero exit code, an ``error`` observation, ``success``
  false or an error its output shows; ``delegate`` is a delegation. Outcome from ``--results``, the
  instance's ``resolved``, its ``error``, else the ``finish`` action's ``task_completed``.
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

One module per format (``openai_chat``, ``swe_agent`` with ``mini_swe_agent`` and ``swe_common``,
``openhands``, ``locomo``, ``toolbench``, ``v1``; OTLP in ``somnus.otlp.files``), what they share in ``common``
(the run, the session builder, the reader, the per-item boundary) and ``results`` (``--results``).

Event ids and times are derived deterministically from the input, so importing the same files twice
gives the same events. Shapes that are not understood raise ``ImportShapeError`` naming the field.
"""

from __future__ import annotations

import glob
from collections.abc import Iterable, Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Protocol

from somnus.importers.common import DEFAULT_SPACING, DEFAULT_START, ImportRun, ImportShapeError
from somnus.importers.locomo import locomo
from somnus.importers.openai_chat import openai_chat
from somnus.importers.openhands import openhands
from somnus.importers.results import load_results
from somnus.importers.swe_agent import swe_agent
from somnus.importers.toolbench import toolbench
from somnus.importers.v1 import v1

__all__ = [
    "DEFAULT_START",
    "EXTENSIONS",
    "FORMATS",
    "ImportRun",
    "ImportShapeError",
    "Importer",
    "expand_paths",
    "import_files",
    "import_run",
    "locomo",
    "openai_chat",
    "openhands",
    "otel",
    "swe_agent",
    "toolbench",
    "v1",
]


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
    "openhands": openhands,
    "locomo": locomo,
    "toolbench": toolbench,
    "v1": v1,
    "otel": otel,
}
# Names of frameworks whose runs ``openai-chat`` reads (somnus.importers.frameworks): each is that format.
ALIASES = {
    name: "openai-chat"
    for name in ("tau-bench", "tau2", "inspect", "langchain", "autogen", "smolagents", "gemini", "adk", "openai-agents")
}
FORMATS.update({name: FORMATS[target] for name, target in ALIASES.items()})
# The files a directory contributes to an import of each format.
EXTENSIONS = {
    "openai-chat": (".json", ".jsonl", ".eval"),
    "swe-agent": (".traj", ".traj.json"),  # SWE-agent; mini-swe-agent (never its preds.json)
    "openhands": (".json", ".jsonl"),  # an evaluation's output.jsonl; a saved session's events
    "locomo": (".json",),
    "toolbench": (".json",),
    "v1": (".jsonl", ".json"),
    "otel": (".json", ".jsonl"),
}
EXTENSIONS.update({name: EXTENSIONS[target] for name, target in ALIASES.items()})


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
