"""``--format swe-agent``: SWE-agent ``.traj`` trajectories, 0.x and 1.x (mini-swe-agent's
``.traj.json`` are read by ``mini_swe_agent``)."""

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
    _each_item,
    _given_time,
    _load_json_or_jsonl,
    _run,
    _Session,
)
from somnus.importers.mini_swe_agent import _is_mini_swe_agent, _is_predictions, _mini_swe_agent
from somnus.importers.swe_common import (
    SWE_NEXT_STEP_S,
    SWE_OBSERVATION_S,
    SWE_THOUGHT_S,
    _swe_outcome,
    swe_command,
    swe_failure,
    swe_problem_statement,
    swe_tool,
)

# Where the problem statement sits in the first user message of a run that does not store it on its own:
# 0.x "ISSUE:\n...\n\nINSTRUCTIONS:", 1.x "<pr_description>...</pr_description>", and two common variants.


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
