"""``--format toolbench``: ToolBench answer files and training data."""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from datetime import datetime
from http import HTTPStatus
from pathlib import Path
from typing import Any

import orjson

from somnus.importers.common import (
    DEFAULT_START,
    MAX_OUTPUT,
    ImportRun,
    ImportShapeError,
    _args,
    _load_json_or_jsonl,
    _result_for,
    _run,
    _Session,
)
from somnus.schemas.codec import json_or_literal

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
        obj = json_or_literal(stripped)
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
