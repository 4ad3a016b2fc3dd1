"""somnus import --format otel: OTLP JSON lines (the collector's file exporter) or one document."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

from somnus.importers import ImportRun, ImportShapeError, expand_paths, import_files
from somnus.otlp.files import otel
from tests.fixtures.otel.genai_agents import otlp_json
from tests.somnus.otlp.test_receiver import expected_events, sdk_request, sdk_spans


def test_json_lines_and_one_document_give_the_receivers_events(tmp_path: Path):
    request = sdk_request(4)
    lines = tmp_path / "traces.jsonl"
    halves = [otlp_json(request), otlp_json(request)]  # a trace spread over two lines: each span in one of them
    for i, doc in enumerate(halves):
        spans = doc["resourceSpans"][0]["scopeSpans"][0]["spans"]
        doc["resourceSpans"][0]["scopeSpans"][0]["spans"] = spans[i::2]
    lines.write_text("\n".join(json.dumps(d) for d in halves) + "\n")
    one = tmp_path / "one.json"
    one.write_text(json.dumps(otlp_json(request), indent=2))
    want = expected_events(request)
    assert sorted(list(otel(lines)), key=lambda e: e["event_id"]) == sorted(want, key=lambda e: e["event_id"])
    assert list(otel(one)) == want
    got = list(import_files(expand_paths([str(tmp_path)], "otel"), "otel", agent="renamed"))
    assert len(got) == 2 * len(want) and {e["agent"] for e in got} == {"renamed"}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"resourceSpans": []}\nnot json\n', "traces.jsonl:2: not JSON"),
        ('{"spans": []}', "expected an OTLP ExportTraceServiceRequest"),
        ('{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "zz", "spanId": "00"}]}]}]}', "1 spans rejected"),
        ("[" * 100 + "]" * 100, "nested 100 deep"),
    ],
)
def test_shapes_it_cannot_read_are_named(tmp_path: Path, text, message):
    path = tmp_path / "traces.jsonl"
    path.write_text(text)
    with pytest.raises(ImportShapeError, match=message):
        list(otel(path))


def test_eval_foresight_reads_otel(tmp_path: Path):
    from somnus.foresight import load_events

    path = tmp_path / "traces.jsonl"
    path.write_text(json.dumps(otlp_json(sdk_request(2))) + "\n")
    assert load_events([str(path)], "otel") == list(otel(path))


def _loose(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Events without what the console exporter rounds to microseconds (times, the order key, latency)."""
    out = []
    for e in events:
        payload = {k: v for k, v in e["payload"].items() if k != "latency_ms"}
        out.append({**{k: v for k, v in e.items() if k not in ("ts", "seq")}, "payload": payload})
    return out


def test_the_sdks_console_exporter_output_gives_the_otlp_files_events(tmp_path: Path):
    """ConsoleSpanExporter prints each span as ``span.to_json()``: pretty-printed objects one after the
    other, ids "0x..."-prefixed, ISO times to the microsecond. It used to be refused as 'not JSON'."""
    spans = sdk_spans(3)
    console = tmp_path / "console.json"
    console.write_text("".join(s.to_json() + os.linesep for s in spans))  # ConsoleSpanExporter's formatter
    otlp = tmp_path / "otlp.json"
    otlp.write_text(json.dumps(otlp_json(encode_spans(spans))))
    got, want = list(otel(console)), list(otel(otlp))
    assert len(want) > 10 and _loose(got) == _loose(want)
    in_order = lambda es: [e["event_id"] for e in sorted(es, key=lambda e: (e["session_id"], e["seq"]))]  # noqa: E731
    assert in_order(got) == in_order(want)
    latency = {e["event_id"]: e["payload"].get("latency_ms") for e in want}
    assert all(abs((e["payload"].get("latency_ms") or 0) - (latency[e["event_id"]] or 0)) < 0.002 for e in got)


def test_a_bad_console_span_is_named_and_the_others_read(tmp_path: Path):
    spans = [json.loads(s.to_json()) for s in sdk_spans(1)]
    spans[0]["context"]["trace_id"] = "0x00000000000000000000000000000000"
    path = tmp_path / "console.json"
    path.write_text("\n".join(json.dumps(s, indent=4) for s in spans))
    run = ImportRun()
    events = list(import_files([path], "otel", run=run))
    assert events and len(run.problems) == 1 and "context.trace_id is all zeros" in run.problems[0]
    with pytest.raises(ImportShapeError, match="context.trace_id is all zeros"):
        list(otel(path))


def test_a_file_of_another_format_is_one_error_not_one_a_line(tmp_path: Path):
    path = tmp_path / "notes.txt"
    path.write_text("\n".join(f"line {i}: hello" for i in range(500)))
    with pytest.raises(ImportShapeError, match="notes.txt:1: not JSON"):
        list(import_files([path], "otel", run=ImportRun()))


def test_a_console_span_beyond_the_item_bound_is_rejected(tmp_path: Path):
    """The receiver's bound on attributes, values, events and links holds for console spans too."""
    from somnus.otlp.spans import MAX_ITEMS

    spans = [json.loads(s.to_json()) for s in sdk_spans(1)]
    spans[0]["events"] = [{"name": "e", "timestamp": spans[0]["start_time"], "attributes": {}}] * (MAX_ITEMS + 1)
    path = tmp_path / "console.json"
    path.write_text("\n".join(json.dumps(s, indent=4) for s in spans))
    run = ImportRun()
    events = list(import_files([path], "otel", run=run))
    assert len(run.problems) == 1 and f"more than {MAX_ITEMS}" in run.problems[0], run.problems
    assert events  # the other spans are read
