"""``--format v1``: our own trace events, passed on for the pipeline to validate."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

from somnus.importers.common import DEFAULT_START, ImportRun, ImportShapeError, _load_json_or_jsonl


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
