"""somnus import --format otel: OTLP JSON lines (the collector's file exporter) or one document."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from somnus.importers import ImportShapeError, expand_paths, import_files
from somnus.otlp.files import otel
from tests.fixtures.otel.genai_agents import otlp_json
from tests.somnus.otlp.test_receiver import expected_events, sdk_request


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
