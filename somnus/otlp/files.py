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


def _documents(path: Path) -> Iterator[tuple[str, Any]]:
    """``(where, parsed JSON)`` of a file: the whole file as one document, else each line."""
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
        if why is not None:
            raise ImportShapeError(f"{where}: {why}")
        try:
            yield where, orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            raise ImportShapeError(
                f"{where}: not JSON ({exc}); expected OTLP JSON (one ExportTraceServiceRequest a line, or one document)"
            ) from None


def read_spans(path: Path) -> list[Span]:
    """The spans of an OTLP JSON file (``ImportShapeError`` naming the line when its shape is wrong)."""
    from somnus.importers import ImportShapeError

    spans: list[Span] = []
    for where, doc in _documents(path):
        if not isinstance(doc, dict) or "resourceSpans" not in doc:
            raise ImportShapeError(
                f"{where}: expected an OTLP ExportTraceServiceRequest (an object with 'resourceSpans')"
            )
        try:
            got = from_json(doc)
        except ShapeError as exc:
            raise ImportShapeError(f"{where}: {exc}") from None
        if got.rejected:
            raise ImportShapeError(f"{where}: {len(got.rejected)} spans rejected: {got.rejected[0]}")
        spans += got.spans
    return spans


def otel(
    path: Path, agent: str | None = None, start: datetime | None = None, run: Any = None
) -> Iterator[dict[str, Any]]:
    """The v1 events of one OTLP JSON file (``somnus.importers`` signature; ``agent`` replaces every
    session's agent; ``start`` and ``run`` are not used: spans carry their own times)."""
    del start, run
    for spans in group_by_trace(read_spans(Path(path))).values():
        for event in trace_events(spans):
            yield {**event, "agent": agent} if agent else event
