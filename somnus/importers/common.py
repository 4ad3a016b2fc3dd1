"""What every importer shares: the import run (clock, results, session ids, problems), the
session builder with deterministic ids and times, the JSON or JSON Lines reader, and the per-item
boundary that names a bad item and keeps the others."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

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
        name_bad_lines(run.problems, bad, path)
    return items


def name_bad_lines(problems: list[str], bad: list[str], path: Path | str) -> None:
    """Each bad line of a file as a problem, the first ``MAX_BAD_LINES`` named and the rest counted."""
    problems.extend(f"{b}: left out" for b in bad[:MAX_BAD_LINES])
    if len(bad) > MAX_BAD_LINES:
        problems.append(f"{path}: {len(bad) - MAX_BAD_LINES} more lines are not JSON: left out")


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


def _resolved(value: Any, where: str, field: str = "resolved") -> str:
    """A SWE-bench ``resolved`` verdict (true or false) as an outcome."""
    if not isinstance(value, bool):
        raise ImportShapeError(f"{where}: field '{field}' must be true or false, got {value!r}")
    return "success" if value else "failure"


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


def kind_of(item: Any) -> str | None:
    """An item's ``type`` when it is a string (a hostile one, a list, would fail every set lookup)."""
    kind = item.get("type") if isinstance(item, dict) else None
    return kind if isinstance(kind, str) else None


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
