"""``--format locomo``: LoCoMo conversations, one session per conversation session."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from somnus.importers.common import (
    DEFAULT_START,
    ImportRun,
    ImportShapeError,
    _each_item,
    _load_json_or_jsonl,
    _run,
    _Session,
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
