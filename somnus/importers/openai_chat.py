"""``--format openai-chat``: OpenAI-style chat transcripts (tau-bench's ``traj`` included)."""

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
    _result_for,
    _run,
    _Session,
)


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
