"""``somnus import --format otel``: OTLP JSON files, as the OpenTelemetry Collector's file exporter
writes them (one ``ExportTraceServiceRequest`` JSON a line), or one JSON document.

Spans carry their own times and ids, so ``--start`` and ``--spacing`` do not apply; the events are
those the receiver gives for the same spans (``somnus.otlp.mapping``), with the same ids: importing a
file the receiver already took in changes nothing. Every trace of the files is mapped once all are
read (a trace may be spread over lines and files); a span whose parent is not in the files counts as
a root.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson

from somnus.importers.common import ImportShapeError, name_bad_lines
from somnus.otlp.mapping import group_by_trace, trace_events
from somnus.otlp.spans import ShapeError, Span, from_console, from_json, is_console_span
from somnus.schemas.codec import MAX_DEPTH, check_json


def _documents(path: Path, problems: list[str] | None = None) -> Iterator[tuple[str, Any]]:
    """``(where, parsed JSON)`` of a file: the whole file as one document, else pretty-printed objects one
    after another (the SDK's console exporter), else each line. A line that is not JSON is named in
    ``problems`` and skipped, when other lines are objects (else, or without ``problems``, it raises)."""
    data = path.read_bytes().removeprefix(b"\xef\xbb\xbf")  # a UTF-8 byte order mark
    why = check_json(data, None, MAX_DEPTH, None)
    if why is None:
        try:
            yield path.name, orjson.loads(data)
            return
        except orjson.JSONDecodeError:
            pass
    if data.lstrip().startswith(b"{\n") or data.lstrip().startswith(b"{\r\n"):  # pretty-printed objects
        pretty = _concatenated(path, data)
        if pretty is not None:
            yield from pretty
            return
    docs: list[tuple[str, Any]] = []
    bad: list[str] = []
    for n, line in enumerate(data.split(b"\n"), 1):
        if not line.strip():
            continue
        where = f"{path.name}:{n}"
        why = check_json(line, None, MAX_DEPTH, None)
        if why is None:
            try:
                docs.append((where, orjson.loads(line)))
                continue
            except orjson.JSONDecodeError as exc:
                why = f"not JSON ({exc}); expected OTLP JSON (one ExportTraceServiceRequest a line, or one document)"
        bad.append(f"{where}: {why}")
    # no line an object: not JSON lines at all (a broken document, another format): one error, not one a line
    if bad and (problems is None or not any(isinstance(doc, dict) for _, doc in docs)):
        raise ImportShapeError(bad[0])
    if problems is not None:
        name_bad_lines(problems, bad, path.name)
    yield from docs


def _concatenated(path: Path, data: bytes) -> list[tuple[str, Any]] | None:
    """``(where, parsed JSON)`` of a file of pretty-printed JSON objects one after another, as the
    SDK's console exporter writes them; None when the file is not that (every object must parse)."""
    if check_json(data, None, MAX_DEPTH, None) is not None:
        return None
    text = data.decode("utf-8", errors="strict")
    decoder, at = json.JSONDecoder(), 0
    docs: list[tuple[str, Any]] = []
    while True:
        while at < len(text) and text[at].isspace():
            at += 1
        if at == len(text):
            return docs
        try:
            doc, end = decoder.raw_decode(text, at)
        except ValueError:
            return None
        docs.append((f"{path.name}:{text.count(chr(10), 0, at) + 1}", doc))
        at = end


def read_spans(path: Path, problems: list[str] | None = None) -> list[Span]:
    """The spans of an OTLP JSON file. A line, request or span of the wrong shape is named in
    ``problems`` (its file, line and why) and the file's other spans are read, as the receiver answers
    a partial success; without ``problems``, the first raises ``ImportShapeError``."""

    def bad(why: str) -> None:
        if problems is None:
            raise ImportShapeError(why)
        problems.append(why)

    spans: list[Span] = []
    for where, doc in _documents(path, problems):
        if is_console_span(doc):  # one span as the SDK's ConsoleSpanExporter prints it
            try:
                got = from_console(doc)
            except ShapeError as exc:  # beyond a request's bounds: this span is left out
                bad(f"{where}: a console span rejected ({exc}): left out")
                continue
            if got.rejected:
                bad(f"{where}: a console span rejected ({got.rejected[0]}): left out")
            spans += got.spans
            continue
        if not isinstance(doc, dict) or "resourceSpans" not in doc:
            bad(
                f"{where}: expected an OTLP ExportTraceServiceRequest (an object with 'resourceSpans') "
                "or a span of the SDK's console exporter: left out"
            )
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
