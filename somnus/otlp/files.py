"""``somnus import --format otel``: OTLP JSON files, as the OpenTelemetry Collector's file exporter
writes them (one ``ExportTraceServiceRequest`` JSON a line), or one JSON document.

Spans carry their own times and ids, so ``--start`` and ``--spacing`` do not apply; the events are
those the receiver gives for the same spans (``somnus.otlp.mapping``), with the same ids: importing a
file the receiver already took in changes nothing. Every trace of the files is mapped once all are
read (a trace may be spread over lines and files); a span whose parent is not in the files counts as
a root.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson

from somnus.otlp.mapping import group_by_trace, trace_events
from somnus.otlp.spans import ShapeError, Span, from_json
from somnus.schemas.codec import MAX_DEPTH, check_json


def _documents(path: Path, problems: list[str] | None = None) -> Iterator[tuple[str, Any]]:
    """``(where, parsed JSON)`` of a file: the whole file as one document, else each line. A line that
    is not JSON is named in ``problems`` and skipped (without ``problems``, it raises)."""
    data = path.read_bytes().removeprefix(b"\xef\xbb\xbf")  # a UTF-8 byte order mark
    why = check_json(data, None, MAX_DEPTH, None)
    if why is None:
        try:
            yield path.name, orjson.loads(data)
            return
        except orjson.JSONDecodeError:
            pass
    from somnus.importers import ImportShapeError

    for n, line in enumerate(data.split(b"\n"), 1):
        if not line.strip():
            continue
        where = f"{path.name}:{n}"
        why = check_json(line, None, MAX_DEPTH, None)
        if why is None:
            try:
                doc = orjson.loads(line)
            except orjson.JSONDecodeError as exc:
                why = f"not JSON ({exc}); expected OTLP JSON (one ExportTraceServiceRequest a line, or one document)"
        if why is not None:
            if problems is None:
                raise ImportShapeError(f"{where}: {why}")
            problems.append(f"{where}: {why}: this line is left out")
            continue
        yield where, doc


def read_spans(path: Path, problems: list[str] | None = None) -> list[Span]:
    """The spans of an OTLP JSON file. A line, request or span of the wrong shape is named in
    ``problems`` (its file, line and why) and the file's other spans are read, as the receiver answers
    a partial success; without ``problems``, the first raises ``ImportShapeError``."""
    from somnus.importers import ImportShapeError

    def bad(why: str) -> None:
        if problems is None:
            raise ImportShapeError(why)
        problems.append(why)

    spans: list[Span] = []
    for where, doc in _documents(path, problems):
        if not isinstance(doc, dict) or "resourceSpans" not in doc:
            bad(f"{where}: expected an OTLP ExportTraceServiceRequest (an object with 'resourceSpans'): left out")
            continue
        try:
            got = from_json(doc)
        except ShapeError as exc:
            bad(f"{where}: {exc}: left out")
            continue
        if got.rejected:
            bad(f"{where}: {len(got.rejected)} spans rejected ({got.rejected[0]}): left out")
        spans += got.spans
    return spans


def otel(
    path: Path, agent: str | None = None, start: datetime | None = None, run: Any = None
) -> Iterator[dict[str, Any]]:
    """The v1 events of one OTLP JSON file (``somnus.importers`` signature; ``agent`` replaces every
    session's agent; ``start`` is not used: spans carry their own times; a bad line or span is named in
    ``run.problems`` and the rest are read)."""
    del start
    problems = run.problems if run is not None else None
    for spans in group_by_trace(read_spans(Path(path), problems)).values():
        for event in trace_events(spans):
            yield {**event, "agent": agent} if agent else event
