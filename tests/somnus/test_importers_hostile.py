"""Importers on hostile files: real files of every format with fields swapped for values of the wrong
type, and hand-made shapes no check foresaw. An import names what is wrong (``ImportShapeError`` or a
line of ``run.problems``) and keeps the rest; it never raises anything else, and every event it gives
is one the pipeline accepts."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from somnus.importers import ImportRun, ImportShapeError, import_files, openai_chat, swe_agent
from somnus.schemas.codec import Rejection, decode_trace
from tests.conftest import DATASETS
from tests.fixtures.otel.genai_agents import otlp_json
from tests.somnus.otlp.test_receiver import sdk_request, sdk_spans

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
WRONG: list[Any] = [
    None,
    0,
    -1,
    10**25,
    1e300,
    -1e308,
    True,
    "",
    "\u0000",
    "2024-13-45T99:00:00Z",
    "ERROR: x",
    [],
    [1, "a"],
    {},
    {"a": {"b": 1}},
]


def _seeds() -> dict[str, tuple[str, Any]]:
    """One real document per format (its file suffix and JSON), when the data is here; a key
    ``format:variant`` is another shape the format reads."""
    out: dict[str, tuple[str, Any]] = {
        "swe-agent": (".traj", json.loads((FIXTURES / "swe_agent" / "acme__widgets-101.traj").read_text())),
        # mini-swe-agent (read by the swe-agent format): 1.x text-based, 2.x tool calls
        **{
            f"swe-agent:mini-{n}": (
                ".traj.json",
                json.loads((FIXTURES / "mini_swe_agent" / i / f"{i}.traj.json").read_text()),
            )
            for n, i in (("1", "acme__widgets-301"), ("1.1", "acme__widgets-303"))
        },
        "otel": (".json", otlp_json(sdk_request(2))),
        "otel:console": (".json", json.loads(sdk_spans(1)[-1].to_json())),  # one span as the SDK prints it
        "openai-chat:agents-sdk-trace": (
            ".json",
            [json.loads(line) for line in (FIXTURES / "openai_agents" / "trace.jsonl").read_text().splitlines()],
        ),
        # OpenHands: an output.jsonl line (events), an older one (pairs), a saved session's bare event list
        **{
            f"openhands:{n}": (".jsonl", json.loads(line))
            for n, line in zip(("events", "pairs"), (FIXTURES / "openhands" / "output.jsonl").read_text().splitlines())
        },
        "openhands:session": (".json", json.loads((FIXTURES / "openhands" / "bugs-session.json").read_text())),
        # other frameworks' runs, read by openai-chat (files each framework wrote itself)
        **{
            f"openai-chat:{folder}-{name.split('.')[0]}": (".json", json.loads((FIXTURES / folder / name).read_text()))
            for folder, name in (
                ("chat", "tau2_results.json"),
                ("inspect", "weather.json"),
                ("langchain", "messages_to_dict.json"),
                ("langchain", "dumpd.json"),
                ("langchain", "langgraph_state.json"),
                ("autogen", "task_result.json"),
                ("autogen", "agent_state.json"),
                ("smolagents", "run_result.json"),
                ("gemini", "adk_session.json"),
                ("gemini", "contents.json"),
                ("openai_agents", "input_list.json"),
            )
        },
    }
    tau = DATASETS / "tau-bench-airline" / "gpt-4o-airline.json"
    if tau.exists():
        out["openai-chat"] = (".json", json.loads(tau.read_text())[:2])
    locomo = DATASETS / "locomo" / "locomo5.json"
    if locomo.exists():
        conv = json.loads(locomo.read_text())[0]
        keep = {k: v for k, v in conv["conversation"].items() if not k.startswith("session_") or k[8:9] in "12"}
        out["locomo"] = (".json", [{**conv, "conversation": keep, "qa": []}])
    answers = sorted((DATASETS / "toolbench-sample" / "answer").glob("*/*.json"))
    if answers:
        out["toolbench"] = (".json", json.loads(answers[0].read_text()))
    return out


SEEDS = _seeds()


def _paths(doc: Any, prefix: tuple[Any, ...] = (), depth: int = 0) -> list[tuple[Any, ...]]:
    """Paths to the document's values (the first 8 items of each list, a bounded depth)."""
    found = [prefix]
    if depth >= 8:
        return found
    if isinstance(doc, dict):
        for k, v in doc.items():
            found += _paths(v, (*prefix, k), depth + 1)
    elif isinstance(doc, list):
        for i, v in enumerate(doc[:8]):
            found += _paths(v, (*prefix, i), depth + 1)
    return found


def _set(doc: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    cur = doc
    for k in path[:-1]:
        cur = cur[k]
    cur[path[-1]] = value
    return doc


def _assert_accepted(events: list[dict[str, Any]]) -> None:
    bad = [
        (e.get("session_id"), e.get("seq"), r.reason)
        for e in events
        if isinstance(r := decode_trace(orjson.dumps(e), max_bytes=1_048_576), Rejection)
    ]
    assert bad == []


@pytest.mark.parametrize("fmt", sorted(SEEDS))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_real_file_with_wrong_values_is_named_never_a_crash(tmp_path: Path, fmt: str, data: st.DataObject) -> None:
    suffix, seed = SEEDS[fmt]
    doc = copy.deepcopy(seed)
    paths = _paths(doc)
    for _ in range(data.draw(st.integers(1, 3), label="changes")):
        # a field name first, then one of its places: every field is as likely as any other, however
        # many times it occurs (a transcript has hundreds of 'content' and a few 'tool_calls')
        names = sorted({str(p[-1]) for p in paths if p}) + ["(the document)"]
        name = data.draw(st.sampled_from(names), label="field")
        where = [p for p in paths if (str(p[-1]) if p else "(the document)") == name]
        value = copy.deepcopy(data.draw(st.sampled_from(WRONG), label="value"))
        doc = _set(doc, data.draw(st.sampled_from(where), label="path"), value)
        paths = _paths(doc)
    path = tmp_path / f"hostile{suffix}"
    path.write_bytes(json.dumps(doc).encode())
    run = ImportRun()
    try:
        events = list(import_files([path], fmt.split(":")[0], run=run))
    except ImportShapeError as exc:
        assert str(exc)  # a whole file of the wrong shape: named
        return
    _assert_accepted(events)


def _chat(ident: str, **assistant: Any) -> dict[str, Any]:
    return {
        "id": ident,
        "reward": 1.0,
        "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok", **assistant}],
    }


@pytest.mark.parametrize(
    ("hostile", "named"),
    [
        ({"tool_calls": 7}, "field 'tool_calls' must be a list"),
        ({"tool_calls": [{"id": {"a": 1}, "function": {"name": "f"}}]}, "tool_calls[0].id: must be a string"),
        ({"tool_calls": [{"function": {"name": 5}}]}, "has no 'function.name' (or 'name') string"),
    ],
)
def test_a_hostile_chat_item_is_named_and_the_others_imported(tmp_path: Path, hostile, named) -> None:
    """Before, these raised TypeError out of the importer: a traceback, and every later file lost."""
    path = tmp_path / "chats.json"
    path.write_bytes(orjson.dumps([_chat("a"), _chat("b", **hostile), _chat("c")]))
    run = ImportRun()
    events = list(openai_chat(path, run=run))
    assert {e["session_id"] for e in events} == {"chats-a", "chats-c"}
    assert len(run.problems) == 1 and "item 1" in run.problems[0] and named in run.problems[0], run.problems
    _assert_accepted(events)
    with pytest.raises(ImportShapeError, match="item 1"):  # called without a run, it raises as before
        list(openai_chat(path))


@pytest.mark.parametrize(
    "doc",
    [
        [{"type": ["a"]}, {"role": "user", "content": "hi"}],  # a type no set can hold (TypeError before)
        {"messages": [{"role": "user", "content": [{"type": {"a": 1}, "text": "x"}]}]},
        {"steps": [{"task": "t"}, {"step_number": 1}], "state": []},
        {"eval": {}, "samples": [{"id": 1, "epoch": 1, "messages": [], "scores": {"m": {"value": {}}}}]},
    ],
)
def test_a_type_or_a_value_of_the_wrong_kind_is_named_not_a_type_error(tmp_path: Path, doc: Any) -> None:
    path = tmp_path / "odd.json"
    path.write_bytes(orjson.dumps(doc))
    try:
        events = list(openai_chat(path))
    except ImportShapeError as exc:
        assert str(exc) and "could not be read" not in str(exc), exc  # named by a check, not the boundary
        return
    _assert_accepted(events)


def test_numeric_call_ids_are_written_out(tmp_path: Path) -> None:
    item = _chat("n", tool_calls=[{"id": 3, "function": {"name": "f", "arguments": "{}"}}])
    item["messages"].append({"role": "tool", "tool_call_id": 3, "content": "done"})
    path = tmp_path / "n.json"
    path.write_bytes(orjson.dumps([item]))
    events = list(openai_chat(path))
    assert [e["payload"]["call_id"] for e in events if e["type"] in ("tool_call", "tool_result")] == ["3", "3"]
    _assert_accepted(events)


def test_a_json_lines_file_whose_first_line_is_bad_keeps_the_others(tmp_path: Path) -> None:
    """Before, a bad first line (here: not UTF-8) made the whole file 'not JSON'."""
    good = orjson.dumps(_chat("g"))
    path = tmp_path / "chats.jsonl"
    path.write_bytes(b'{"a": "\xff\xfe"}\n' + good + b"\n")
    run = ImportRun()
    events = list(openai_chat(path, run=run))
    assert {e["session_id"] for e in events} == {"chats-g"}
    assert len(run.problems) == 1 and "line 1 is not JSON" in run.problems[0]


def test_a_step_time_out_of_range_is_named(tmp_path: Path) -> None:
    doc = json.loads((FIXTURES / "swe_agent" / "acme__widgets-101.traj").read_text())
    doc["trajectory"][0]["execution_time"] = 1e300
    path = tmp_path / "far.traj"
    path.write_text(json.dumps(doc))
    with pytest.raises(ImportShapeError, match="moves the clock out of range"):
        list(swe_agent(path))


def test_an_otlp_file_keeps_its_good_spans_and_names_the_bad(tmp_path: Path) -> None:
    good = otlp_json(sdk_request(2))
    bad_span = {"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "zz", "spanId": "00"}]}]}]}
    path = tmp_path / "traces.jsonl"
    path.write_text("\n".join([json.dumps(bad_span), "not json", json.dumps({"spans": []}), json.dumps(good)]))
    clean = tmp_path / "clean.jsonl"
    clean.write_text(json.dumps(good))
    run = ImportRun()
    events = list(import_files([path], "otel", run=run))
    assert events == list(import_files([clean], "otel"))
    named = {p.split(":")[1]: p for p in run.problems}
    assert sorted(named) == ["1", "2", "3"], run.problems
    assert "spans rejected" in named["1"] and "not JSON" in named["2"] and "ExportTraceServiceRequest" in named["3"]
