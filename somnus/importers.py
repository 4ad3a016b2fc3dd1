"""Turn agent transcripts from other tools into v1 trace events.

- ``openai-chat``: OpenAI-style chat transcripts (``messages`` or tau-bench's ``traj``) with
  ``tool_calls`` and ``role: tool`` results; outcome from ``reward`` (1.0 = success, else failure)
  or ``outcome``.
- ``swe-agent``: SWE-agent ``.traj`` trajectories (``trajectory`` steps of thought/action/observation).
- ``locomo``: LoCoMo conversations (``conversation`` with ``session_<n>`` turn lists and
  ``session_<n>_date_time``): one session per conversation session, stamped with its date; each
  turn becomes a message event (speaker A as ``user_message``, speaker B as ``agent_message``)
  whose ``dia_id`` is kept (``message_refs`` in the session's start metadata, and on the payload).

Event ids and times are derived deterministically from the input, so importing the same file twice
gives the same events. Shapes that are not understood raise ``ImportShapeError`` naming the field.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import orjson

from schemas.events import SCHEMA_VERSION

IMPORT_NAMESPACE = uuid.UUID("6d2f8a1e-95c4-4c43-8f0e-3a7b9e2c5d10")
DEFAULT_START = datetime(2024, 5, 15, 20, 0, 0, tzinfo=timezone.utc)
MAX_OUTPUT = 2000


class ImportShapeError(ValueError):
    """The input file is not of the shape the chosen format expects."""


class _Session:
    """Builds the events of one session with consecutive seqs and deterministic ids and times."""

    def __init__(self, source: str, agent: str, session_id: str, start: datetime) -> None:
        self.source, self.agent, self.session_id = source, agent, session_id
        self.t = start
        self.events: list[dict[str, Any]] = []

    def add(self, type_: str, payload: dict[str, Any], step_s: float = 5.0) -> None:
        seq = len(self.events)
        self.events.append({
            "event_id": str(uuid.uuid5(IMPORT_NAMESPACE, f"{self.source}\x1f{self.session_id}\x1f{seq}")),
            "schema_version": SCHEMA_VERSION,
            "ts": self.t.isoformat().replace("+00:00", "Z"),
            "agent": self.agent,
            "session_id": self.session_id,
            "seq": seq,
            "type": type_,
            "payload": {k: v for k, v in payload.items() if v is not None},
        })
        self.t += timedelta(seconds=step_s)


def _load_json_or_jsonl(path: Path) -> Any:
    data = path.read_bytes()
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        pass
    items = []
    for n, line in enumerate(data.splitlines(), 1):
        if not line.strip():
            continue
        try:
            items.append(orjson.loads(line))
        except orjson.JSONDecodeError as exc:
            raise ImportShapeError(f"{path}: line {n} is not JSON ({exc})") from None
    return items


def _outcome(item: dict[str, Any], where: str) -> tuple[str, str | None]:
    if "reward" in item:
        reward = item["reward"]
        if not isinstance(reward, (int, float)) or isinstance(reward, bool):
            raise ImportShapeError(f"{where}: field 'reward' must be a number, got {reward!r}")
        return ("success" if reward >= 1.0 else "failure"), f"reward {reward}"
    if "outcome" in item:
        outcome = item["outcome"]
        if outcome not in ("success", "failure", "partial"):
            raise ImportShapeError(f"{where}: field 'outcome' must be success|failure|partial, got {outcome!r}")
        return outcome, None
    return "partial", "the transcript has no reward or outcome"


def openai_chat(path: Path, agent: str | None = None, start: datetime = DEFAULT_START) -> Iterator[dict[str, Any]]:
    """Events from OpenAI-style chat transcripts (a list, one object, or JSON lines)."""
    data = _load_json_or_jsonl(path)
    items = data if isinstance(data, list) else [data]
    for i, item in enumerate(items):
        where = f"{path.name}: item {i}"
        if not isinstance(item, dict):
            raise ImportShapeError(f"{where}: expected an object with 'messages' or 'traj', got {type(item).__name__}")
        messages = item.get("messages", item.get("traj"))
        if not isinstance(messages, list):
            raise ImportShapeError(f"{where}: no 'messages' (or 'traj') list of chat messages")
        ident = item.get("id", item.get("session_id"))
        if ident is None and "task_id" in item:
            ident = f"task{item['task_id']}-trial{item.get('trial', 0)}"
        session_id = f"{path.stem}-{ident if ident is not None else i}"
        s = _Session(f"openai-chat:{path.name}", agent or item.get("agent") or "assistant", session_id,
                     start + timedelta(minutes=10 * i))
        first_user = next((m.get("content") for m in messages if isinstance(m, dict) and m.get("role") == "user"), None)
        if first_user is not None and not isinstance(first_user, str):
            first_user = orjson.dumps(first_user).decode()  # content parts, as for every other message
        meta = {k: item[k] for k in ("task_id", "trial", "reward") if k in item}
        s.add("session_start", {"task": (first_user or "")[:500], "metadata": meta})
        names: dict[str, str] = {}
        for j, m in enumerate(messages):
            mwhere = f"{where}: message {j}"
            if not isinstance(m, dict) or "role" not in m:
                raise ImportShapeError(f"{mwhere}: expected an object with a 'role' field")
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
                for k, call in enumerate(m.get("tool_calls") or []):
                    fn = call.get("function") if isinstance(call, dict) else None
                    if not isinstance(fn, dict) or not fn.get("name"):
                        raise ImportShapeError(f"{mwhere}: tool_calls[{k}] has no 'function.name'")
                    call_id = call.get("id") or f"call-{j}-{k}"
                    names[call_id] = fn["name"]
                    s.add("tool_call", {"tool": fn["name"], "call_id": call_id, "args": _args(fn.get("arguments"))}, 1.0)
            elif role == "tool":
                call_id = m.get("tool_call_id")
                if not call_id:
                    raise ImportShapeError(f"{mwhere}: a 'tool' message needs 'tool_call_id'")
                text = content or ""
                failed = text.lstrip().lower().startswith("error")
                s.add("tool_result", {"call_id": call_id, "tool": m.get("name") or names.get(call_id),
                                      "ok": not failed, "error": text[:MAX_OUTPUT] if failed else None,
                                      "output": None if failed else text[:MAX_OUTPUT]}, 2.0)
            else:
                raise ImportShapeError(f"{mwhere}: unknown role {role!r} (expected system, user, assistant or tool)")
        outcome, reason = _outcome(item, where)
        s.add("session_end", {"outcome": outcome, "reason": reason})
        yield from s.events


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


_ERROR_MARKERS = ("command not found", "traceback (most recent call last)", "error:", "no such file or directory",
                  "syntaxerror", "exception")


def swe_agent(path: Path, agent: str | None = None, start: datetime = DEFAULT_START) -> Iterator[dict[str, Any]]:
    """Events from one SWE-agent ``.traj`` file (or a list of them in one JSON file)."""
    data = _load_json_or_jsonl(path)
    items = data if isinstance(data, list) else [data]
    for i, item in enumerate(items):
        where = f"{path.name}: item {i}"
        if not isinstance(item, dict) or not isinstance(item.get("trajectory"), list):
            raise ImportShapeError(f"{where}: no 'trajectory' list of steps (is this a SWE-agent .traj file?)")
        info = item.get("info") or {}
        if not isinstance(info, dict):
            raise ImportShapeError(f"{where}: field 'info' must be an object")
        session_id = f"{path.stem}" if len(items) == 1 else f"{path.stem}-{i}"
        s = _Session(f"swe-agent:{path.name}", agent or "swe-agent", session_id, start + timedelta(minutes=10 * i))
        task = ""
        for m in item.get("history") or []:
            if isinstance(m, dict) and m.get("role") == "user":
                c = m.get("content")
                task = c if isinstance(c, str) else orjson.dumps(c).decode()
                break
        s.add("session_start", {"task": (item.get("problem_statement") or task)[:500],
                                "metadata": {k: info[k] for k in ("exit_status",) if k in info}})
        for j, step in enumerate(item["trajectory"]):
            swhere = f"{where}: trajectory[{j}]"
            if not isinstance(step, dict) or "action" not in step:
                raise ImportShapeError(f"{swhere}: a step needs an 'action' field")
            thought = step.get("thought")
            if thought:
                s.add("agent_message", {"text": str(thought)}, 1.0)
            action = str(step["action"]).strip()
            tool = action.split()[0] if action else "noop"
            call_id = f"step-{j}"
            s.add("tool_call", {"tool": tool, "call_id": call_id, "args": {"command": action}}, 1.0)
            obs = step.get("observation")
            obs = "" if obs is None else (obs if isinstance(obs, str) else orjson.dumps(obs).decode())
            low = obs.lower()
            failed = any(marker in low for marker in _ERROR_MARKERS)
            s.add("tool_result", {"call_id": call_id, "tool": tool, "ok": not failed,
                                  "error": obs[:MAX_OUTPUT] if failed else None,
                                  "output": None if failed else obs[:MAX_OUTPUT]}, 3.0)
        merged = dict(info)
        merged.update({k: item[k] for k in ("reward", "outcome") if k in item})
        if "resolved" in merged and "outcome" not in merged and "reward" not in merged:
            merged["outcome"] = "success" if merged["resolved"] else "failure"
        outcome, reason = _outcome(merged, where)
        if reason and "exit_status" in info:
            reason = f"exit_status {info['exit_status']}"
        s.add("session_end", {"outcome": outcome, "reason": reason})
        yield from s.events


LOCOMO_TURN_STEP_S = 30.0  # the dataset dates sessions, not turns: turns are spaced this far apart
_LOCOMO_DATE = re.compile(r"^\s*(\d{1,2}):(\d{2})\s*([ap]m)\s+on\s+(\d{1,2})\s+([A-Za-z]+),?\s+(\d{4})\s*$", re.I)
_MONTHS = {m: i for i, m in enumerate(("january", "february", "march", "april", "may", "june", "july", "august",
                                       "september", "october", "november", "december"), 1)}


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


def locomo(path: Path, agent: str | None = None, start: datetime = DEFAULT_START) -> Iterator[dict[str, Any]]:
    """Events from LoCoMo conversations (a list of samples, or one sample).

    Agent: ``agent``, else ``locomo-<sample_id>`` (each conversation its own agent, so its own
    memory scope). Session ``<sample_id>-s<n>``. A turn's text is its ``text``, followed by
    ``[shares <blip_caption>]`` when it shared an image (the caption is all we have of it).
    ``start`` is unused: every session carries its own date.
    """
    data = _load_json_or_jsonl(path)
    items = data if isinstance(data, list) else [data]
    for i, item in enumerate(items):
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
            s = _Session(f"locomo:{path.name}", agent or f"locomo-{sample}", f"{sample}-s{n}", when)
            refs: dict[str, str] = {}
            for j, turn in enumerate(turns):
                twhere = f"{where}: session_{n}[{j}]"
                if not isinstance(turn, dict) or not isinstance(turn.get("text"), str):
                    raise ImportShapeError(f"{twhere}: a turn needs a 'text' string")
                if turn.get("speaker") not in speakers.values():
                    raise ImportShapeError(f"{twhere}: speaker {turn.get('speaker')!r} is neither speaker_a nor speaker_b")
                if not isinstance(turn.get("dia_id"), str):
                    raise ImportShapeError(f"{twhere}: a turn needs a 'dia_id' string")
                refs[str(j + 1)] = turn["dia_id"]  # seq 0 is the session start
            first_user = next((t["text"] for t in turns if t["speaker"] == speakers["user"]), "")
            s.add("session_start", {"task": first_user[:500], "metadata": {
                "source": "locomo", "mode": "conversation", "conversation": sample, "session": n, "session_date": date_text,
                "speakers": speakers, "message_refs": refs}}, 1.0)
            for turn in turns:
                text = turn["text"]
                caption = turn.get("blip_caption")
                if isinstance(caption, str) and caption.strip():
                    text = f"{text} [shares {caption.strip()}]"
                kind = "user_message" if turn["speaker"] == speakers["user"] else "agent_message"
                s.add(kind, {"text": text, "speaker": turn["speaker"], "dia_id": turn["dia_id"]}, LOCOMO_TURN_STEP_S)
            s.add("session_end", {"outcome": "partial", "reason": "conversation session ended"})
            yield from s.events


FORMATS = {"openai-chat": openai_chat, "swe-agent": swe_agent, "locomo": locomo}
