"""somnus.importers: transcripts of other tools become valid v1 trace events, deterministically."""

from __future__ import annotations

import json
import re
import zipfile
from collections import Counter, defaultdict
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import orjson
import pytest

from somnus.importers import (
    DEFAULT_START,
    FORMATS,
    ImportRun,
    ImportShapeError,
    expand_paths,
    import_files,
    import_run,
    locomo,
    openai_chat,
    openhands,
    otel,
    swe_agent,
    toolbench,
    v1,
)
from somnus.importers.common import MAX_OUTPUT
from somnus.importers.locomo import LOCOMO_TURN_STEP_S, locomo_date
from somnus.importers.results import load_results
from somnus.importers.swe_common import swe_failure, swe_problem_statement
from somnus.importers.toolbench import toolbench_failure, toolbench_observation
from somnus.schemas.codec import Rejection, decode_trace

TAU_BENCH = Path(__file__).resolve().parents[3] / "shared" / "datasets" / "tau-bench-airline" / "gpt-4o-airline.json"


def by_session(events: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for e in events:
        out[e["session_id"]].append(e)
    return dict(out)


def assert_all_decode(events: list[dict[str, Any]]) -> None:
    bad = [
        (e["session_id"], e["seq"], r.reason)
        for e in events
        if isinstance(r := decode_trace(orjson.dumps(e), max_bytes=1_048_576), Rejection)
    ]
    assert bad == []


def write(tmp_path: Path, name: str, data: Any) -> Path:
    path = tmp_path / name
    path.write_bytes(data if isinstance(data, bytes) else json.dumps(data).encode())
    return path


# ---- tau-bench (OpenAI chat format, real data) ---------------------------------------------------


@pytest.fixture(scope="module")
def tau() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    if not TAU_BENCH.exists():
        pytest.skip(f"dataset missing: {TAU_BENCH}")
    return json.loads(TAU_BENCH.read_bytes()), list(openai_chat(TAU_BENCH, agent="airline"))


def test_tau_bench_gives_200_sessions_from_start_to_end_with_consecutive_seqs(tau):
    source, events = tau
    sessions = by_session(events)
    assert len(source) == len(sessions) == 200
    assert set(sessions) == {f"gpt-4o-airline-task{t['task_id']}-trial{t['trial']}" for t in source}
    for sid, evs in sessions.items():
        assert [e["seq"] for e in evs] == list(range(len(evs))), sid
        assert evs[0]["type"] == "session_start" and evs[-1]["type"] == "session_end", sid
        assert [e["type"] for e in evs].count("session_start") == 1
        assert [e["type"] for e in evs].count("session_end") == 1
        assert {e["agent"] for e in evs} == {"airline"}
        times = [datetime.fromisoformat(e["ts"]) for e in evs]
        assert times == sorted(times) and len(set(times)) == len(times), sid


def test_tau_bench_events_all_decode(tau):
    assert_all_decode(tau[1])


def test_tau_bench_event_counts_match_the_raw_transcripts(tau):
    source, events = tau
    kinds = Counter(e["type"] for e in events)
    messages = [m for t in source for m in t["traj"]]
    calls = [c for m in messages if m["role"] == "assistant" for c in (m.get("tool_calls") or [])]
    tool_messages = [m for m in messages if m["role"] == "tool"]
    failed = [m for m in tool_messages if (m.get("content") or "").lstrip().lower().startswith("error")]
    assert len(calls) == 1164  # the dataset's README
    assert kinds["tool_call"] == len(calls)
    assert kinds["tool_result"] == len(tool_messages)
    assert kinds["user_message"] == sum(m["role"] == "user" for m in messages)
    assert kinds["agent_message"] == sum(m["role"] == "assistant" and bool(m.get("content")) for m in messages)
    assert kinds["session_start"] == kinds["session_end"] == 200
    assert sum(1 for e in events if e["type"] == "tool_result" and not e["payload"]["ok"]) == len(failed) == 73
    assert {e["payload"]["tool"] for e in events if e["type"] == "tool_call"} == {c["function"]["name"] for c in calls}
    assert len({c["function"]["name"] for c in calls}) == 14


def test_tau_bench_results_name_the_tool_of_their_call(tau):
    for evs in by_session(tau[1]).values():
        called = {}
        for e in evs:
            if e["type"] == "tool_call":
                called[e["payload"]["call_id"]] = e["payload"]["tool"]
            elif e["type"] == "tool_result":
                assert e["payload"]["tool"] == called[e["payload"]["call_id"]]


def test_tau_bench_outcomes_come_from_the_reward(tau):
    source, events = tau
    ends = {e["session_id"]: e["payload"] for e in events if e["type"] == "session_end"}
    for t in source:
        end = ends[f"gpt-4o-airline-task{t['task_id']}-trial{t['trial']}"]
        assert end["outcome"] == ("success" if t["reward"] >= 1.0 else "failure")
        assert end["reason"] == f"reward {t['reward']}"
    assert Counter(p["outcome"] for p in ends.values()) == {"success": 84, "failure": 116}


def test_tau_bench_import_is_deterministic(tau):
    again = list(openai_chat(TAU_BENCH, agent="airline"))
    assert again == tau[1]
    ids = [e["event_id"] for e in tau[1]]
    assert len(set(ids)) == len(ids)


# ---- OpenAI chat shapes ------------------------------------------------------------------------

CHAT = {
    "id": "conv1",
    "reward": 1.0,
    "messages": [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "refund order 1042"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "call_a", "type": "function", "function": {"name": "get_order", "arguments": '{"id": 1042}'}},
                {"id": "call_b", "type": "function", "function": {"name": "get_user", "arguments": "not json"}},
            ],
        },
        {"role": "tool", "tool_call_id": "call_a", "content": '{"status": "paid"}'},
        {"role": "tool", "tool_call_id": "call_b", "content": "  Error: user not found"},
        {"role": "assistant", "content": "Refunded."},
    ],
}


def test_an_openai_chat_transcript_becomes_events(tmp_path):
    events = list(openai_chat(write(tmp_path, "chats.json", CHAT)))
    assert [e["type"] for e in events] == [
        "session_start",
        "user_message",
        "tool_call",
        "tool_call",
        "tool_result",
        "tool_result",
        "agent_message",
        "session_end",
    ]
    assert {e["session_id"] for e in events} == {"chats-conv1"}
    assert {e["agent"] for e in events} == {"assistant"}
    start, user, call_a, call_b, res_a, res_b, said, end = (e["payload"] for e in events)
    assert start == {"task": "refund order 1042", "metadata": {"reward": 1.0}}
    assert call_a == {"tool": "get_order", "call_id": "call_a", "args": {"id": 1042}}
    assert call_b["args"] == {"_raw": "not json"}
    assert res_a == {"call_id": "call_a", "tool": "get_order", "ok": True, "output": '{"status": "paid"}'}
    assert res_b == {"call_id": "call_b", "tool": "get_user", "ok": False, "error": "  Error: user not found"}
    assert said == {"text": "Refunded."}
    assert end == {"outcome": "success", "reason": "reward 1.0"}
    assert events[0]["ts"] == "2024-05-15T20:00:00Z" == DEFAULT_START.isoformat().replace("+00:00", "Z")
    assert_all_decode(events)


@pytest.mark.parametrize(
    ("fields", "outcome", "reason"),
    [
        ({"reward": 1}, "success", "reward 1"),
        ({"reward": 0.99}, "failure", "reward 0.99"),
        ({"reward": 0}, "failure", "reward 0"),
        ({"outcome": "partial"}, "partial", None),
        ({}, "partial", "the transcript has no reward or outcome"),
    ],
)
def test_the_outcome_comes_from_reward_or_outcome(tmp_path, fields, outcome, reason):
    item = {"messages": [{"role": "user", "content": "hi"}], **fields}
    end = list(openai_chat(write(tmp_path, "x.json", [item])))[-1]
    assert end["type"] == "session_end"
    assert end["payload"] == ({"outcome": outcome, "reason": reason} if reason else {"outcome": outcome})


def test_json_lines_sessions_ids_and_start_times(tmp_path):
    lines = [
        {"messages": [{"role": "user", "content": "a"}]},
        {"session_id": "custom", "messages": [{"role": "user", "content": "b"}]},
        {"task_id": 7, "trial": 2, "traj": [{"role": "user", "content": "c"}]},
        {"task_id": 8, "traj": [{"role": "user", "content": "d"}], "agent": "booker"},
    ]
    path = write(tmp_path, "runs.jsonl", b"\n".join(orjson.dumps(x) for x in lines) + b"\n\n")
    sessions = by_session(list(openai_chat(path)))
    assert list(sessions) == ["runs-0", "runs-custom", "runs-task7-trial2", "runs-task8-trial0"]
    starts = [datetime.fromisoformat(evs[0]["ts"]) for evs in sessions.values()]
    assert starts == [DEFAULT_START + timedelta(minutes=10 * i) for i in range(4)]
    assert sessions["runs-task8-trial0"][0]["agent"] == "booker"
    assert sessions["runs-0"][0]["agent"] == "assistant"


def test_a_results_file_overrides_a_transcripts_own_reward(tmp_path):
    path = write(tmp_path, "chats.json", [CHAT, {**CHAT, "id": "conv2"}])
    run = import_run(results=write(tmp_path, "results.json", {"conv1": "failure", "chats-conv2": "partial"}))
    ends = {e["session_id"]: e["payload"] for e in openai_chat(path, run=run) if e["type"] == "session_end"}
    assert ends == {
        "chats-conv1": {"outcome": "failure", "reason": "per the results file"},
        "chats-conv2": {"outcome": "partial", "reason": "per the results file"},
    }


def test_the_agent_argument_overrides_the_transcript(tmp_path):
    item = {"agent": "booker", "messages": [{"role": "user", "content": "x"}]}
    assert {e["agent"] for e in openai_chat(write(tmp_path, "a.json", item), agent="airline")} == {"airline"}


def test_long_tool_outputs_are_cut(tmp_path):
    item = {
        "messages": [
            {"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": "t"}}]},
            {"role": "tool", "tool_call_id": "c", "content": "y" * 5000},
        ]
    }
    (result,) = [e for e in openai_chat(write(tmp_path, "a.json", item)) if e["type"] == "tool_result"]
    assert MAX_OUTPUT == 2000
    assert result["payload"]["output"] == "y" * MAX_OUTPUT


def test_a_tool_call_without_id_gets_a_stable_one_and_arguments_of_any_shape_are_kept(tmp_path):
    item = {
        "messages": [
            {
                "role": "assistant",
                "tool_calls": [
                    {"function": {"name": "a", "arguments": {"k": 1}}},
                    {"function": {"name": "b", "arguments": "[1, 2]"}},
                    {"function": {"name": "c", "arguments": ""}},
                    {"function": {"name": "d"}},
                ],
            }
        ]
    }
    calls = [e["payload"] for e in openai_chat(write(tmp_path, "a.json", item)) if e["type"] == "tool_call"]
    assert [(c["call_id"], c["args"]) for c in calls] == [
        ("call-0-0", {"k": 1}),
        ("call-0-1", {"_value": [1, 2]}),
        ("call-0-2", {}),
        ("call-0-3", {}),
    ]


@pytest.mark.parametrize(
    ("data", "names"),
    [
        ([{"id": 1}], ["item 0", "'messages'"]),
        ([{"messages": {"role": "user"}}], ["item 0", "'messages'"]),
        ([{"messages": []}, "oops"], ["item 1", "expected an object"]),
        ([{"messages": [{"content": "no role"}]}], ["message 0", "'role'"]),
        ([{"messages": [{"role": "critic", "content": "x"}]}], ["message 0", "unknown role 'critic'"]),
        ([{"messages": [{"role": "function", "content": "x"}]}], ["message 0", "'function' message needs a 'name'"]),
        (
            [{"messages": [{"role": "user", "content": [{"type": "tool_result", "content": "x"}]}]}],
            ["message 0", "content[0]", "'tool_use_id'"],
        ),
        ([{"messages": [{"type": "function_call_output", "output": "x"}]}], ["message 0", "needs 'call_id'"]),
        ([{"messages": [{"type": "function_call", "call_id": "c"}]}], ["message 0", "no name string"]),
        ([{"messages": [], "reward": "1.0"}], ["field 'reward'", "'1.0'"]),
        ([{"messages": [], "reward": True}], ["field 'reward'", "True"]),
        ([{"messages": [], "outcome": "won"}], ["field 'outcome'", "'won'"]),
        (
            [{"messages": [{"role": "user", "content": "x"}, {"role": "tool", "content": "ok"}]}],
            ["message 1", "'tool_call_id'"],
        ),
        (
            [{"messages": [{"role": "assistant", "tool_calls": [{"id": "c", "function": {}}]}]}],
            ["message 0", "tool_calls[0]", "'function.name'"],
        ),
    ],
)
def test_unknown_shapes_name_the_field(tmp_path, data, names):
    path = write(tmp_path, "bad.json", data)
    with pytest.raises(ImportShapeError) as info:
        list(openai_chat(path))
    for name in names:
        assert name in str(info.value), str(info.value)
    assert "bad.json" in str(info.value)


def test_a_json_lines_file_with_a_broken_line_names_the_line_and_keeps_the_others(tmp_path):
    """Before, one bad line lost every line of the file (and the import stopped)."""
    good = orjson.dumps({"id": "g", "reward": 1.0, "messages": [{"role": "user", "content": "hi"}]})
    path = write(tmp_path, "bad.jsonl", good + b'\n{"messages": [\n' + good + b"\n")
    run = ImportRun()
    events = list(openai_chat(path, run=run))
    assert len({e["session_id"] for e in events}) == 2
    assert run.problems == [
        f"{path}: line 2 is not JSON (unexpected end of data: line 1 column 15 (char 14)): left out"
    ]
    with pytest.raises(ImportShapeError, match="line 1 is not JSON"):  # one line, not JSON
        list(openai_chat(write(tmp_path, "none.jsonl", b"{x\n")))
    # a broken document over many lines: its own error (where it breaks), not one problem per line
    broken = orjson.dumps([orjson.loads(good)] * 3, option=orjson.OPT_INDENT_2)[:-12]
    with pytest.raises(ImportShapeError, match=r"broken.json: not JSON \(unexpected end of data: line 29 "):
        list(openai_chat(write(tmp_path, "broken.json", broken), run=ImportRun()))
    run = ImportRun()  # thousands of bad lines: 20 named, the rest counted
    list(openai_chat(write(tmp_path, "many.jsonl", good + b"\n" + b"{x\n" * 5000), run=run))
    assert len(run.problems) == 21 and run.problems[-1].endswith("4980 more lines are not JSON: left out")


def test_a_file_with_a_utf8_byte_order_mark_imports(tmp_path):
    item = {"id": "bom", "reward": 1.0, "messages": [{"role": "user", "content": "hi"}]}
    for name, data in (("a.json", orjson.dumps([item])), ("b.jsonl", orjson.dumps(item) + b"\n")):
        path = tmp_path / name
        path.write_bytes(b"\xef\xbb\xbf" + data)
        assert_all_decode(list(openai_chat(path)))


def test_a_fifo_or_a_device_is_refused_before_it_is_read(tmp_path):
    import os

    os.mkfifo(tmp_path / "pipe.json")  # reading it would wait for a writer for ever
    for arg in (tmp_path / "pipe.json", "/dev/zero"):
        with pytest.raises(ImportShapeError, match="not a regular file or a directory"):
            expand_paths([arg], "openai-chat")


def test_user_content_given_as_content_parts_still_gives_valid_events(tmp_path):
    item = {
        "id": "parts",
        "reward": 1.0,
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "refund order 1042"}]},
            {"role": "assistant", "content": "done"},
        ],
    }
    assert_all_decode(list(openai_chat(write(tmp_path, "parts.json", item))))


# Other chat dialects, in fixtures shaped as their documentation and SDKs write them (tests/fixtures/chat):
# Anthropic Messages (tool_use / tool_result blocks, thinking), a Claude Code session log (one JSON line per
# message, a summary line), Responses API items (the OpenAI Agents SDK's input list), legacy function calling.
CHATS = Path(__file__).resolve().parents[1] / "fixtures" / "chat"


def _calls_and_results(events: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return [
        (e["type"], e["payload"]["call_id"], e["payload"].get("tool"), e["payload"].get("ok"))
        for e in events
        if e["type"] in ("tool_call", "tool_result")
    ]


def test_an_anthropic_messages_transcript_gives_its_calls_and_results(tmp_path):
    events = list(openai_chat(CHATS / "anthropic_messages.json"))
    assert_all_decode(events)
    assert {e["session_id"] for e in events} == {"anthropic_messages-conv-weather-7"}
    assert _calls_and_results(events) == [
        ("tool_call", "toolu_01W1", "get_weather", None),
        ("tool_call", "toolu_01W2", "get_weather", None),
        ("tool_result", "toolu_01W1", "get_weather", True),
        ("tool_result", "toolu_01W2", "get_weather", False),  # is_error, whatever its text says
    ]
    start, said = events[0]["payload"], events[1]["payload"]
    assert start["task"] == "What's the weather in Paris and in Atlantis?"
    assert said == {"text": "What's the weather in Paris and in Atlantis?"}
    (call,) = [e["payload"] for e in events if e["payload"].get("call_id") == "toolu_01W2" and e["type"] == "tool_call"]
    assert call["args"] == {"location": "Atlantis", "unit": "celsius"}
    (failed,) = [e["payload"] for e in events if e["type"] == "tool_result" and not e["payload"]["ok"]]
    assert failed["error"] == "location not found: Atlantis"  # the text of its content blocks
    texts = [e["payload"]["text"] for e in events if e["type"] == "agent_message"]
    assert texts == ["Let me check both cities.", "Paris is 14°C with light rain. I could not find Atlantis."]
    assert events[-1]["payload"] == {"outcome": "failure", "reason": "reward 0.0"}
    # no tool_result block is taken for a user's words, and no block is written out as JSON
    assert not any("tool_use_id" in e["payload"].get("text", "") for e in events)


def test_a_claude_code_session_log_is_one_session_from_its_lines(tmp_path):
    events = list(openai_chat(CHATS / "claude_code_session.jsonl"))
    assert_all_decode(events)
    assert {e["session_id"] for e in events} == {"claude_code_session-3f9c2a71-5b8e-4d0a-9e61-2c7d4b1a8f05"}
    assert events[0]["ts"] == "2025-07-30T09:12:03.412000Z"  # its first line's time
    assert events[0]["payload"]["task"].startswith("The widget tests fail on main.")
    assert _calls_and_results(events) == [
        ("tool_call", "toolu_01A7", "Bash", None),
        ("tool_result", "toolu_01A7", "Bash", False),
        ("tool_call", "toolu_01B3", "Read", None),
        ("tool_result", "toolu_01B3", "Read", True),
    ]
    bash = next(e["payload"] for e in events if e["type"] == "tool_call")
    assert bash["args"]["command"] == "pytest tests/test_widgets.py -q"
    # the thinking block is not said; the user lines that only carry results are not user messages
    assert [e["type"] for e in events].count("user_message") == 1
    assert not any("Run the tests first" in str(e["payload"]) for e in events)
    assert events[-1]["payload"]["outcome"] == "partial"


def test_responses_api_items_are_one_conversation(tmp_path):
    events = list(openai_chat(CHATS / "responses_items.json"))
    assert_all_decode(events)
    assert {e["session_id"] for e in events} == {"responses_items-0"}
    assert _calls_and_results(events) == [
        ("tool_call", "call_Qm4x", "find_restaurant", None),
        ("tool_result", "call_Qm4x", "find_restaurant", True),
        ("tool_call", "call_Zp2k", "book_table", None),
        ("tool_result", "call_Zp2k", "book_table", False),
    ]
    book = [e["payload"] for e in events if e["type"] == "tool_call"][1]
    assert book["args"] == {"restaurant_id": "r-881", "party": 2, "time": "20:00"}
    assert [e["payload"]["text"] for e in events if e["type"] == "agent_message"] == [
        "Chez Léon has no table at 8; shall I try 9?"
    ]
    # the same items as a request's ``input``
    request = write(
        tmp_path, "request.json", {"id": "r1", "input": json.loads((CHATS / "responses_items.json").read_text())}
    )
    assert _calls_and_results(list(openai_chat(request))) == _calls_and_results(events)


def test_legacy_function_calls_are_answered_by_name(tmp_path):
    events = list(openai_chat(CHATS / "legacy_functions.json"))
    assert_all_decode(events)
    assert _calls_and_results(events) == [
        ("tool_call", "call-2", "get_current_weather", None),
        ("tool_result", "call-2", "get_current_weather", True),
    ]
    assert [e["payload"] for e in events if e["type"] == "tool_call"][0]["args"] == {"location": "Boston, MA"}
    assert events[-1]["payload"]["outcome"] == "success"


def test_a_swe_gym_line_is_named_by_its_instance_and_judged_by_resolved(tmp_path):
    """SWE-Gym's OpenHands-Sampled-Trajectories: chat ``messages`` with ``instance_id`` and ``resolved``."""
    line = {"instance_id": "conan-io__conan-123", "resolved": False, "messages": CHAT["messages"]}
    events = list(openai_chat(write(tmp_path, "swe_gym.jsonl", orjson.dumps(line))))
    assert {e["session_id"] for e in events} == {"swe_gym-conan-io__conan-123"}
    assert events[-1]["payload"] == {"outcome": "failure"}
    kept = {**line, "resolved": True, "reward": 0.0}  # a reward of its own wins
    assert list(openai_chat(write(tmp_path, "r.json", kept)))[-1]["payload"]["outcome"] == "failure"
    with pytest.raises(ImportShapeError, match="field 'resolved' must be true or false"):
        list(openai_chat(write(tmp_path, "bad.json", {**line, "resolved": "yes"})))


def test_a_tau2_bench_results_file_gives_a_session_per_simulation(tmp_path):
    """tau2-bench's results: ``simulations`` with flat tool calls (``name``, ``arguments``), tool messages
    answering by ``id`` with ``error`` true or false, a MultiToolMessage, the simulated user's own tools
    (``requestor: user``), and the outcome in ``reward_info.reward``."""
    events = list(openai_chat(CHATS / "tau2_results.json"))
    assert_all_decode(events)
    sessions = sorted({e["session_id"] for e in events})
    assert sessions == [
        "tau2_results-2f1b7c3e-0d5a-4c1e-9b7a-7f0c2e9d4a11",
        "tau2_results-9c4e0a52-77f3-4bde-8a0e-1b3f6d2c5e90",
    ]
    phone, flight = ([e for e in events if e["session_id"] == sid] for sid in sessions)
    # the agent's calls only; the error flag, not the text, says whether a result failed
    assert _calls_and_results(phone) == [
        ("tool_call", "call_q1", "get_customer_by_phone", None),
        ("tool_result", "call_q1", "get_customer_by_phone", True),
        ("tool_call", "call_q2", "get_details_by_id", None),
        ("tool_call", "call_q3", "get_data_usage", None),
        ("tool_result", "call_q2", "get_details_by_id", True),
        ("tool_result", "call_q3", "get_data_usage", False),
    ]
    said = [e["payload"]["text"] for e in phone if e["type"] == "user_message"]
    assert "[the user ran check_status_bar {}]" in said
    assert "I see an airplane icon.\n[the user ran toggle_airplane_mode {}]" in said
    assert "[the user's tool returned] Airplane Mode is now OFF." in said
    assert phone[0]["ts"] == "2025-06-12T09:30:04.120000Z"  # its start_time
    assert phone[0]["payload"]["metadata"]["task_id"] == "[mobile_data_issue]airplane_mode_on"
    assert phone[-1]["payload"] == {"outcome": "success", "reason": "reward 1.0"}
    assert _calls_and_results(flight) == [
        ("tool_call", "call_a1", "update_reservation_flights", None),
        ("tool_result", "call_a1", "update_reservation_flights", False),
    ]
    assert flight[0]["payload"]["metadata"]["termination_reason"] == "too_many_errors"
    assert flight[-1]["payload"] == {"outcome": "failure", "reason": "reward 0.0"}
    # a result flagged ok whose text begins with "Error" is ok; one flagged failed is not, whatever it says
    data = json.loads((CHATS / "tau2_results.json").read_text())
    sim = data["simulations"][1]
    sim["messages"][3] = {**sim["messages"][3], "content": "Error-free update", "error": True}
    flipped = list(openai_chat(write(tmp_path, "flipped.json", {"simulations": [sim]})))
    assert _calls_and_results(flipped)[-1][3] is False
    sim["messages"][3] = {**sim["messages"][3], "content": "Error: none, all set", "error": False}
    flipped = list(openai_chat(write(tmp_path, "flipped.json", {"simulations": [sim]})))
    assert _calls_and_results(flipped)[-1][3] is True


INSPECT = Path(__file__).resolve().parents[1] / "fixtures" / "inspect"  # written by inspect_ai (generate_fixture.py)


def test_an_inspect_ai_log_gives_a_session_per_sample_and_epoch():
    events = list(openai_chat(INSPECT / "weather.json"))
    assert_all_decode(events)
    by = {sid: [e for e in events if e["session_id"] == sid] for sid in sorted({e["session_id"] for e in events})}
    assert list(by) == ["weather-weather-oslo-epoch1", "weather-weather-paris-epoch1"]
    oslo, paris = by.values()
    # Inspect's tool calls name their function as a string; a ToolCallError fails the result
    assert _calls_and_results(paris) == [
        ("tool_call", "call_p1", "lookup", None),
        ("tool_result", "call_p1", "lookup", True),
        ("tool_call", "call_p2", "lookup", None),
        ("tool_result", "call_p2", "lookup", False),
    ]
    (failed,) = [e["payload"] for e in paris if e["type"] == "tool_result" and not e["payload"]["ok"]]
    assert failed["error"] == "unknown city: Atlantis"  # its empty content: the error's message
    assert paris[-1]["payload"]["outcome"] == "success"  # scored C
    assert oslo[-1]["payload"]["outcome"] == "failure"  # scored I
    assert paris[0]["payload"]["task"] == "What's the weather in Paris and in Atlantis?"
    data = json.loads((INSPECT / "weather.json").read_text())
    started = {f"weather-{s['id']}-epoch{s['epoch']}": s["started_at"] for s in data["samples"]}
    for sid, evs in by.items():
        assert evs[0]["ts"] == started[sid].replace("+00:00", "Z")


def test_an_inspect_ai_eval_archive_reads_as_its_json_log(tmp_path, monkeypatch):
    """The ``.eval`` log is a zip of zstd members (the same run as the JSON one, written again)."""
    from somnus.importers import frameworks

    def shape(events):
        return sorted((e["session_id"], e["seq"], e["type"], orjson.dumps(e["payload"])) for e in events)

    assert shape(openai_chat(INSPECT / "weather.eval")) == shape(openai_chat(INSPECT / "weather.json"))
    # a member that decompresses past the size its header declares is refused, not read on
    raw = bytearray((INSPECT / "weather.eval").read_bytes())
    member = raw.index(b"samples/", raw.index(b"PK\x01\x02")) - 46  # the first sample's central entry
    size = int.from_bytes(raw[member + 24 : member + 28], "little")
    raw[member + 24 : member + 28] = (size // 2).to_bytes(4, "little")
    lying = write(tmp_path, "lying.eval", bytes(raw))
    with pytest.raises(ImportShapeError, match="not a zstd stream of its declared size"):
        list(openai_chat(lying))
    # samples that decompress past the bound together are refused before they are read
    monkeypatch.setattr(frameworks, "ARCHIVE_BYTES", 20_000)
    with pytest.raises(ImportShapeError, match="its samples decompress to 28645 bytes, more than 20000"):
        list(openai_chat(INSPECT / "weather.eval"))
    plain = tmp_path / "plain.eval"  # a deflated archive (older Inspect versions) reads through zipfile
    sample = {"id": 1, "epoch": 1, "scores": {"m": {"value": "C"}}, "messages": CHAT["messages"]}
    with zipfile.ZipFile(plain, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("samples/1_epoch_1.json", orjson.dumps(sample))
    assert list(openai_chat(plain))[-1]["payload"]["outcome"] == "success"
    with zipfile.ZipFile(plain, "a", zipfile.ZIP_DEFLATED) as z:
        z.writestr("samples/2_epoch_1.json", b" " * 30_000)
    with pytest.raises(ImportShapeError, match="decompress to 30[0-9]{3} bytes, more than 20000"):
        list(openai_chat(plain))
    with zipfile.ZipFile(empty := tmp_path / "empty.eval", "w") as z:
        z.writestr("header.json", b"{}")
    with pytest.raises(ImportShapeError, match="no samples"):
        list(openai_chat(empty))


@pytest.mark.parametrize(
    ("value", "outcome"),
    [
        ("C", "success"),
        ("I", "failure"),
        ("P", "partial"),
        ("N", "failure"),
        (1, "success"),
        (0.0, "failure"),
        (0.5, "partial"),
        (True, "success"),
        ({"a": "C", "b": 0.5}, "partial"),
        ({"a": "C", "b": "I"}, "failure"),
    ],
)
def test_an_inspect_ai_score_is_an_outcome(tmp_path, value, outcome):
    sample = {"id": 1, "epoch": 1, "messages": CHAT["messages"], "scores": {"match": {"value": value}}}
    events = list(openai_chat(write(tmp_path, "log.json", {"eval": {}, "samples": [sample]})))
    assert events[-1]["payload"]["outcome"] == outcome


def test_inspect_ai_attachments_are_read_in_place(tmp_path):
    """Inspect AI keeps long texts in the sample's ``attachments``, named ``attachment://<hash>``."""
    long = "a very long observation " * 20
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "attachment://h1"}]},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": "c1", "function": "bash", "arguments": {"cmd": "attachment://h1"}}],
        },
        {"role": "tool", "tool_call_id": "c1", "function": "bash", "content": "attachment://h1"},
        {"role": "assistant", "content": "attachment://missing"},
    ]
    sample = {"id": 1, "epoch": 2, "messages": messages, "attachments": {"h1": long}, "scores": {"m": {"value": 1}}}
    events = list(openai_chat(write(tmp_path, "log.json", {"eval": {}, "samples": [sample]})))
    assert {e["session_id"] for e in events} == {"log-1-epoch2"}
    assert events[0]["payload"]["task"] == long[:500]
    (call,) = [e["payload"] for e in events if e["type"] == "tool_call"]
    (result,) = [e["payload"] for e in events if e["type"] == "tool_result"]
    assert call["args"] == {"cmd": long} and result["output"] == long
    assert events[-2]["payload"]["text"] == "attachment://missing"  # a reference to nothing stays as it is


def test_an_inspect_ai_score_that_is_no_outcome_names_it(tmp_path):
    sample = {"id": 1, "epoch": 1, "messages": CHAT["messages"], "scores": {"match": {"value": "maybe"}}}
    with pytest.raises(ImportShapeError, match="score 'match' has a value that is no outcome: 'maybe'"):
        list(openai_chat(write(tmp_path, "log.json", {"eval": {}, "samples": [sample]})))
    empty = {**sample, "scores": {"match": {"value": {}}}}  # a dict of no values: no outcome (not success)
    with pytest.raises(ImportShapeError, match="score 'match' has no value"):
        list(openai_chat(write(tmp_path, "log.json", {"eval": {}, "samples": [empty]})))


# the calls of the support run every framework fixture records: a lookup that works, a refund that fails
REFUND_CALLS = [
    ("tool_call", "call_lk1", "lookup_order", None),
    ("tool_result", "call_lk1", "lookup_order", True),
    ("tool_call", "call_rf1", "refund", None),
    ("tool_result", "call_rf1", "refund", False),
]
LANGCHAIN = Path(__file__).resolve().parents[1] / "fixtures" / "langchain"  # by langchain-core (generate_fixture.py)


@pytest.mark.parametrize("name", ["messages_to_dict.json", "langgraph_state.json", "dumpd.json"])
def test_langchain_messages_in_each_serialisation_give_the_same_session(name):
    events = list(openai_chat(LANGCHAIN / name))
    assert_all_decode(events)
    assert {e["session_id"] for e in events} == {
        "langgraph_state-thread-42" if name == "langgraph_state.json" else f"{name[:-5]}-0"
    }
    assert _calls_and_results(events) == REFUND_CALLS  # status "error"
    refund = next(e["payload"] for e in events if e["type"] == "tool_call" and e["payload"]["tool"] == "refund")
    assert refund["args"] == {"order_id": "1182", "amount": 49.9}
    assert [e["type"] for e in events].count("user_message") == 1  # the system prompt is not said
    assert events[0]["payload"]["task"] == "Order 1182 arrived broken, please refund it."
    said = [e["payload"]["text"] for e in events if e["type"] == "agent_message"]
    assert said == ["Refunding it now.", "The refund failed on the payment side; I opened ticket T-77 for you."]


def test_a_langchain_tool_status_wins_over_its_text(tmp_path):
    state = json.loads((LANGCHAIN / "langgraph_state.json").read_text())
    state["messages"][3] = {**state["messages"][3], "content": "Error-free lookup", "status": "success"}
    state["messages"][5] = {**state["messages"][5], "content": "nothing came back", "status": "error"}
    events = list(openai_chat(write(tmp_path, "state.json", state)))
    assert [r[3] for r in _calls_and_results(events) if r[0] == "tool_result"] == [True, False]


AUTOGEN = Path(__file__).resolve().parents[1] / "fixtures" / "autogen"  # by autogen-agentchat (generate_fixture.py)


@pytest.mark.parametrize("name", ["task_result.json", "agent_state.json"])
def test_an_autogen_run_or_saved_state_gives_its_calls_and_results(name):
    events = list(openai_chat(AUTOGEN / name))
    assert_all_decode(events)
    assert {e["agent"] for e in events} == {"support"}  # the source of what is not the user's
    assert _calls_and_results(events) == REFUND_CALLS  # is_error
    assert next(e["payload"] for e in events if e["type"] == "tool_call")["args"] == {"order_id": "1182"}
    said = [(e["type"], e["payload"]["text"]) for e in events if e["type"].endswith("_message")]
    assert said == [  # the ThoughtEvent is not said
        ("user_message", "Order 1182 arrived broken, please refund it."),
        ("agent_message", "The refund failed; I opened ticket T-77."),
    ]
    if name == "task_result.json":  # the first message's created_at
        first = json.loads((AUTOGEN / name).read_text())["messages"][0]["created_at"]
        assert events[0]["ts"] == first


def test_an_autogen_multimodal_message_names_its_images(tmp_path):
    messages = [
        {"type": "MultiModalMessage", "source": "user", "content": ["What is broken here?", {"data": "iVBOR" * 1000}]},
        {"type": "TextMessage", "source": "vision", "content": "The hinge."},
    ]
    events = list(openai_chat(write(tmp_path, "team.json", {"messages": messages, "stop_reason": None})))
    assert events[1]["payload"] == {"text": "What is broken here?\n[image]"}
    assert events[2]["payload"] == {"text": "The hinge."} and events[0]["agent"] == "vision"


SMOLAGENTS = Path(__file__).resolve().parents[1] / "fixtures" / "smolagents"  # by smolagents (generate_fixture.py)


@pytest.mark.parametrize("name", ["steps.json", "run_result.json"])
def test_a_smolagents_run_gives_its_calls_results_and_final_answer(name):
    events = list(openai_chat(SMOLAGENTS / name))
    assert_all_decode(events)
    # the failed step lists no call of its own: the model's message names it; final_answer is said
    assert _calls_and_results(events) == REFUND_CALLS
    failed = next(e["payload"] for e in events if e["type"] == "tool_result" and not e["payload"]["ok"])
    assert "TimeoutError: payment gateway: no answer in 30 s" in failed["error"]
    said = [e["payload"]["text"] for e in events if e["type"] == "agent_message"]
    assert said == ["The refund failed; I opened ticket T-77."]
    assert events[0]["payload"]["task"] == "Order 1182 arrived broken, please refund it."
    steps = json.loads((SMOLAGENTS / name).read_text())
    first = (steps["steps"] if name == "run_result.json" else steps)[1]["timing"]["start_time"]
    assert events[0]["ts"] == datetime.fromtimestamp(first, tz=timezone.utc).isoformat().replace("+00:00", "Z")
    # a RunResult's state is its outcome; a list of steps has none
    assert events[-1]["payload"]["outcome"] == ("success" if name == "run_result.json" else "partial")


def test_a_smolagents_run_out_of_steps_failed():
    events = list(openai_chat(SMOLAGENTS / "out_of_steps.json"))
    assert [r[3] for r in _calls_and_results(events) if r[0] == "tool_result"] == [False, False]
    assert events[-1]["payload"]["outcome"] == "failure"


def test_a_smolagents_code_step_whose_code_failed_fails_its_call(tmp_path):
    code = {"id": "c1", "type": "function", "function": {"name": "python_interpreter", "arguments": "1/0"}}
    steps = [
        {"task": "divide"},
        {
            "step_number": 1,
            "tool_calls": [code],
            "model_output": "Thought: divide.",
            "observations": None,
            "error": {"type": "AgentExecutionError", "message": "Code execution failed: ZeroDivisionError"},
        },
    ]
    events = list(openai_chat(write(tmp_path, "code.json", steps)))
    assert _calls_and_results(events) == [
        ("tool_call", "c1", "python_interpreter", None),
        ("tool_result", "c1", "python_interpreter", False),
    ]
    assert [e["payload"]["text"] for e in events if e["type"] == "agent_message"] == ["Thought: divide."]


def test_each_framework_is_a_format_name_and_the_help_names_every_format():
    from somnus.cli.common import FORMATS_HELP
    from somnus.importers import ALIASES, EXTENSIONS, FORMATS

    assert set(re.findall(r"[a-z0-9-]+", FORMATS_HELP)) - {"or"} == set(FORMATS) == set(EXTENSIONS)
    for name in ALIASES:
        assert FORMATS[name] is openai_chat
    assert list(FORMATS["autogen"](AUTOGEN / "task_result.json")) == list(openai_chat(AUTOGEN / "task_result.json"))


GEMINI = Path(__file__).resolve().parents[1] / "fixtures" / "gemini"  # by google-adk (generate_fixture.py)


@pytest.mark.parametrize("name", ["adk_session.json", "contents.json"])
def test_a_google_adk_session_or_gemini_contents_give_their_calls_and_results(name):
    events = list(openai_chat(GEMINI / name))
    assert_all_decode(events)
    calls = _calls_and_results(events)
    assert [(kind, tool, ok) for kind, _, tool, ok in calls] == [
        ("tool_call", "lookup_order", None),
        ("tool_result", "lookup_order", True),
        ("tool_call", "refund", None),
        ("tool_result", "refund", False),  # its response holds an error
    ]
    assert calls[0][1] == calls[1][1] and calls[2][1] == calls[3][1]  # answered by their ids
    said = [(e["type"], e["payload"]["text"]) for e in events if e["type"].endswith("_message")]
    assert said == [
        ("user_message", "Order 1182 arrived broken, please refund it."),
        ("agent_message", "Let me look it up."),  # said before its call, as in its parts
        ("agent_message", "The refund failed; I opened ticket T-77."),
    ]
    assert events[0]["payload"]["task"] == "Order 1182 arrived broken, please refund it."
    if name == "adk_session.json":  # the session's id, its agent (the events' author), its first event's time
        session = json.loads((GEMINI / name).read_text())
        assert {e["session_id"] for e in events} == {"adk_session-s-1182"} and events[0]["agent"] == "support"
        first = datetime.fromtimestamp(session["events"][0]["timestamp"], tz=timezone.utc)
        assert events[0]["ts"] == first.isoformat().replace("+00:00", "Z")


def test_gemini_parts_without_ids_are_answered_by_name_and_thoughts_are_not_said(tmp_path):
    contents = [
        {"role": "user", "parts": [{"text": "Weather in Paris and Atlantis?"}]},
        {
            "role": "model",
            "parts": [
                {"text": "private", "thought": True},
                {"function_call": {"name": "weather", "args": {"city": "Paris"}}},
                {"function_call": {"name": "weather", "args": {"city": "Atlantis"}}},
            ],
        },
        {
            "role": "function",
            "parts": [
                {"function_response": {"name": "weather", "response": {"output": "14C"}}},
                {"function_response": {"name": "weather", "response": {"error": "unknown city"}}},
            ],
        },
    ]
    events = list(openai_chat(write(tmp_path, "gemini.json", {"contents": contents})))
    assert _calls_and_results(events) == [
        ("tool_call", "call-1-1", "weather", None),
        ("tool_call", "call-1-2", "weather", None),
        ("tool_result", "call-1-1", "weather", True),
        ("tool_result", "call-1-2", "weather", False),
    ]
    assert not any("private" in str(e["payload"]) for e in events)


AGENTS_SDK = (
    Path(__file__).resolve().parents[1] / "fixtures" / "openai_agents"
)  # by openai-agents (generate_fixture.py)


def test_an_openai_agents_sdk_input_list_fails_the_call_its_default_text_says_failed():
    """The SDK sends the model a fixed text for a tool that raised, and no flag: the call failed."""
    events = list(openai_chat(AGENTS_SDK / "input_list.json"))
    assert_all_decode(events)
    assert _calls_and_results(events) == REFUND_CALLS


def test_an_openai_agents_sdk_trace_gives_a_session_per_trace():
    events = list(openai_chat(AGENTS_SDK / "trace.jsonl"))
    assert_all_decode(events)
    exported = [json.loads(line) for line in (AGENTS_SDK / "trace.jsonl").read_text().splitlines()]
    (trace,) = [e for e in exported if e["object"] == "trace"]
    assert {e["session_id"] for e in events} == {f"trace-{trace['id']}"} and events[0]["agent"] == "support"
    calls = _calls_and_results(events)
    assert [(kind, tool, ok) for kind, _, tool, ok in calls] == [
        ("tool_call", "lookup_order", None),
        ("tool_result", "lookup_order", True),
        ("tool_call", "refund", None),
        ("tool_result", "refund", False),  # the span's error
    ]
    failed = next(e["payload"] for e in events if e["type"] == "tool_result" and not e["payload"]["ok"])
    assert failed["error"].startswith("Error running tool (non-fatal)")
    first = min(e["started_at"] for e in exported if e["object"] == "trace.span")
    assert events[0]["ts"] == first.replace("+00:00", "Z")


def test_a_bare_list_of_chat_messages_is_one_conversation(tmp_path):
    messages = CHAT["messages"]
    events = list(openai_chat(write(tmp_path, "bare.json", messages)))
    assert {e["session_id"] for e in events} == {"bare-0"}
    same = list(openai_chat(write(tmp_path, "wrapped.json", {"messages": messages})))
    assert [(e["type"], e["payload"]) for e in events] == [(e["type"], e["payload"]) for e in same]
    jsonl = write(tmp_path, "lines.jsonl", b"\n".join(orjson.dumps(m) for m in messages))
    assert [e["payload"] for e in openai_chat(jsonl)] == [e["payload"] for e in events]


# ---- SWE-agent trajectories ---------------------------------------------------------------------
# Fixtures in the real .traj shapes (tests/fixtures/swe_agent): acme__widgets-101 is a 0.x run (history
# with a demonstration block, thought/action/observation steps, file views, a traceback, a `ls`
# listing, a model discussion in the action field, an edit refused for a syntax error, `javac: command
# not found`, a submit); acme__widgets-202 is a 1.x run (function calls, str_replace_editor,
# execution_time, the problem statement in replay_config). results.json resolves 101, not 202.

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "swe_agent"
RUN_0X, RUN_1X, RESULTS = (
    FIXTURES / "acme__widgets-101.traj",
    FIXTURES / "acme__widgets-202.traj",
    FIXTURES / "results.json",
)


def calls_and_results(events: list[dict[str, Any]]) -> list[tuple[str, bool, str | None]]:
    tools = {e["payload"]["call_id"]: e["payload"]["tool"] for e in events if e["type"] == "tool_call"}
    return [
        (tools[e["payload"]["call_id"]], e["payload"]["ok"], e["payload"].get("error"))
        for e in events
        if e["type"] == "tool_result"
    ]


def test_a_0x_trajectory_is_read_as_the_run_it_records():
    source = json.loads(RUN_0X.read_bytes())
    events = list(swe_agent(RUN_0X))
    assert_all_decode(events)
    start = events[0]["payload"]
    assert start["task"].startswith("Paginator drops the last page when the item count is a multiple")
    assert "demonstration" not in start["task"].lower() and "INSTRUCTIONS" not in start["task"]
    assert start["metadata"] == {"instance_id": "acme__widgets-101", "exit_status": "submitted"}
    assert {(e["agent"], e["session_id"]) for e in events} == {("swe-agent", "acme__widgets-101")}
    thoughts = [e["payload"]["text"] for e in events if e["type"] == "agent_message"]
    assert thoughts == [s["thought"].strip() for s in source["trajectory"] if s["thought"].strip()]
    got = calls_and_results(events)
    assert [t for t, _, _ in got] == [
        "create",
        "edit",
        "python",
        "ls",
        "find_file",
        "open",
        "goto",
        "edit",
        "edit",
        "javac",
        "search_dir",
        "python",
        "rm",
        "submit",
    ]  # no DISCUSSION tool
    failed = [(t, err.splitlines()[-1] if t == "python" else err) for t, ok, err in got if not ok]
    assert failed == [
        ("python", "ValueError: Error: page size must be positive, got 0"),
        ("edit", "edit refused: IndentationError: unindent does not match any outer indentation level"),
        ("javac", "/bin/bash: line 212: javac: command not found"),
    ]
    views = [ok for t, ok, _ in got if t in ("create", "open", "goto", "ls", "find_file", "search_dir", "rm", "submit")]
    assert all(views) and len(views) == 8  # file views (whose lines say "Error:" and "Traceback"), listings, searches
    end = events[-1]["payload"]
    assert end == {
        "outcome": "partial",
        "reason": "exit_status submitted; patch submitted, resolution unknown (no --results)",
    }


def test_failed_calls_reduce_to_the_knowledge_graphs_error_classes():
    from somnus.processors.knowledge.extraction import error_class

    errors = [err for _, ok, err in calls_and_results(list(swe_agent(RUN_0X))) if not ok]
    assert [error_class(e) for e in errors] == [
        "ValueError: Error: page size must be positive, got <n>",
        "edit refused: IndentationError: unindent does not match any outer indentation level",
        "command not found: javac",
    ]


def test_a_1x_trajectory_with_function_calls_and_execution_times():
    events = list(swe_agent(RUN_1X, start=datetime.fromisoformat("2025-03-01T08:00:00+00:00")))
    assert_all_decode(events)
    assert events[0]["payload"]["task"].startswith("`Paginator.last()` raises IndexError on an empty list")
    assert events[0]["ts"] == "2025-03-01T08:00:00Z"
    got = calls_and_results(events)
    assert [(t, ok) for t, ok, _ in got] == [
        ("ls", False),
        ("str_replace_editor", True),
        ("str_replace_editor", False),
        ("str_replace_editor", True),
        ("python", True),
        ("submit", True),
    ]
    assert got[0][2] == "ls: cannot access 'docs/api': No such file or directory"
    assert got[2][2].startswith("No replacement was performed, old_str `return list(self.pages())[-1]  `")
    call, result = [e for e in events if e["type"] in ("tool_call", "tool_result")][:2]
    took = datetime.fromisoformat(result["ts"]) - datetime.fromisoformat(call["ts"])
    assert took == timedelta(seconds=0.05)  # the step's execution_time
    times = [datetime.fromisoformat(e["ts"]) for e in events]
    assert times == sorted(times) and len(set(times)) == len(times)


def test_outcomes_come_from_the_results_file_and_reasons_from_the_exit_status():
    run = import_run(results=RESULTS)
    events = list(import_files(expand_paths([FIXTURES], "swe-agent"), "swe-agent", run=run))
    ends = {e["session_id"]: e["payload"] for e in events if e["type"] == "session_end"}
    assert ends == {
        "acme__widgets-101": {"outcome": "success", "reason": "exit_status submitted; resolved per the results file"},
        "acme__widgets-202": {
            "outcome": "failure",
            "reason": "exit_status submitted; not resolved per the results file",
        },
    }


@pytest.mark.parametrize(
    ("info", "outcome", "reason"),
    [
        (
            {"exit_status": "submitted", "submission": "diff --git a b"},
            "partial",
            "exit_status submitted; patch submitted, resolution unknown (no --results)",
        ),
        ({"exit_status": "submitted", "submission": None}, "failure", "exit_status submitted; no patch"),
        ({"exit_status": "exit_cost", "submission": ""}, "failure", "exit_status exit_cost; no patch"),
        (
            {"exit_status": "submitted (exit_cost)", "submission": "diff"},
            "partial",
            "exit_status submitted (exit_cost); patch submitted, resolution unknown (no --results)",
        ),
        ({"exit_status": "exit_format"}, "partial", "exit_status exit_format; resolution unknown (no --results)"),
        ({}, "partial", "the trajectory has no info.exit_status"),
        ({"exit_status": "submitted", "resolved": True}, "success", "exit_status submitted"),
        ({"resolved": False}, "failure", None),
    ],
)
def test_outcomes_without_a_results_file(tmp_path, info, outcome, reason):
    end = list(swe_agent(write(tmp_path, "t.traj", traj(**info))))[-1]["payload"]
    assert end == ({"outcome": outcome, "reason": reason} if reason else {"outcome": outcome})


def traj(**info: Any) -> dict[str, Any]:
    return {
        "history": [
            {"role": "system", "content": "You are an autonomous programmer."},
            {"role": "user", "content": "Fix the off-by-one in paginate()"},
        ],
        "trajectory": [
            {
                "thought": "Let me find the function.",
                "action": "search_dir paginate\n",
                "observation": "Found 2 matches",
            },
            {
                "thought": "",
                "action": "python reproduce.py",
                "observation": "Traceback (most recent call last):\n  File ...\nIndexError: list index out of range",
            },
            {"action": "edit 10:12\n    return items[start:end]\nend_of_edit", "observation": None},
            {"thought": "Done.", "action": "  ", "observation": {"ok": True}},
        ],
        "info": info,
    }


def test_a_minimal_trajectory_and_its_sequence_of_events(tmp_path):
    events = list(swe_agent(write(tmp_path, "django-1234.traj", traj(exit_status="submitted"))))
    assert [e["type"] for e in events] == [
        "session_start",
        "agent_message",
        "tool_call",
        "tool_result",
        "tool_call",
        "tool_result",
        "tool_call",
        "tool_result",
        "agent_message",
        "session_end",
    ]  # a blank action runs nothing
    assert [e["seq"] for e in events] == list(range(len(events)))
    assert events[0]["payload"]["task"] == "Fix the off-by-one in paginate()"
    calls = [e["payload"] for e in events if e["type"] == "tool_call"]
    assert [(c["tool"], c["call_id"], c["args"]) for c in calls] == [
        ("search_dir", "step-0", {"command": "search_dir paginate"}),
        ("python", "step-1", {"command": "python reproduce.py"}),
        ("edit", "step-2", {"command": "edit 10:12\n    return items[start:end]\nend_of_edit"}),
    ]
    results = [e["payload"] for e in events if e["type"] == "tool_result"]
    assert [r["ok"] for r in results] == [True, False, True]
    assert results[2]["output"] == ""
    assert_all_decode(events)


@pytest.mark.parametrize(
    ("observation", "error"),
    [
        (
            "[File: /r/a.py (158 lines total)]\n(40 more lines above)\n41:    raise ValueError('Error: bad')\n"
            "42:# bash: helm: command not found\n43:Traceback (most recent call last):\n(115 more lines below)",
            None,
        ),
        (
            "Here's the result of running `cat -n` on /testbed/a.py:\n     1\tError: not really\n     2\texit code 3",
            None,
        ),
        ("AUTHORS.rst  README.md  setup.py  src/  tests/", None),
        ('No matches found for "paginate" in /r', None),
        (
            "Warning: <line_number> (900) is greater than the number of lines in the file (158)\n[File: /r/a.py (158 lines total)]",
            None,
        ),
        ("", None),
        ("bash: helm: command not found", "bash: helm: command not found"),
        ("zsh: command not found: helm", "zsh: command not found: helm"),
        ("/bin/sh: 1: helm: not found", "/bin/sh: 1: helm: not found"),
        ("Usage: goto <line>\nError: <line> must be a number", "Usage: goto <line>"),
        ("Error: <line> must be less than or equal to 158", "Error: <line> must be less than or equal to 158"),
        (
            "Error: File 'reproduce.py' already exists.\n[File: /r/reproduce.py (3 lines total)]\n1:x",
            "Error: File 'reproduce.py' already exists.",
        ),
        ("File src/missing.py not found", "File src/missing.py not found"),
        ("No file open. Use the open command first.", "No file open. Use the open command first."),
        (
            "The path /testbed/nope does not exist. Please provide a valid path.",
            "The path /testbed/nope does not exist. Please provide a valid path.",
        ),
        ("cat: notes.txt: No such file or directory", "cat: notes.txt: No such file or directory"),
        (
            "python: can't open file '/r/x.py': [Errno 2] No such file or directory",
            "python: can't open file '/r/x.py': [Errno 2] No such file or directory",
        ),
        ("make: *** [all] Error 2\nCommand exited with code 2", "Command exited with code 2"),
        ("done\nexit code 0", None),
        ("EXECUTION TIMED OUT", "EXECUTION TIMED OUT"),
        (
            "collected 3 items\nTraceback (most recent call last):\n  File \"t.py\", line 1\nKeyError: 'x'",
            "Traceback (most recent call last):\n  File \"t.py\", line 1\nKeyError: 'x'",
        ),
        (
            "Your proposed edit has introduced new syntax error(s). Please understand the fixes and retry your edit commmand.\n\n"
            "ERRORS:\n- E999 SyntaxError: unmatched ']'\n- F821 undefined name 'np'\n\nThis is how your edit would have looked",
            "edit refused: SyntaxError: unmatched ']'; undefined name 'np'",
        ),
    ],
)
def test_an_observation_fails_only_when_it_shows_an_error(observation, error):
    assert swe_failure(observation) == error


def test_a_long_traceback_keeps_its_header_and_its_exception():
    got = swe_failure(
        "Traceback (most recent call last):\n" + '  File "x.py", line 1, in f\n' * 200 + "OSError: disk full"
    )
    assert got is not None and len(got) <= MAX_OUTPUT
    assert got.startswith("Traceback (most recent call last):") and got.endswith("OSError: disk full")


@pytest.mark.parametrize(
    ("item", "task"),
    [
        (
            {"problem_statement": "the issue itself", "history": [{"role": "user", "content": "other"}]},
            "the issue itself",
        ),
        ({"problem_statement": {"text": "from an object", "id": "x"}}, "from an object"),
        ({"replay_config": json.dumps({"problem_statement": {"text": "from replay_config"}})}, "from replay_config"),
        (
            {
                "history": [
                    {
                        "role": "user",
                        "content": "Here is a demonstration of how to correctly accomplish this task.\n"
                        "--- DEMONSTRATION ---\nISSUE:\ndemo issue\n\nINSTRUCTIONS:\n...",
                    },
                    {"role": "user", "content": "ISSUE:\nthe real one\n\nINSTRUCTIONS:\nsolve it"},
                ]
            },
            "the real one",
        ),
        (
            {
                "history": [
                    {
                        "role": "user",
                        "content": "--- DEMONSTRATION ---\nISSUE:\ndemo\n\nINSTRUCTIONS:\n--- END OF DEMONSTRATION ---\n"
                        "ISSUE:\ninline after the demo\n\nINSTRUCTIONS:\nx",
                    }
                ]
            },
            "inline after the demo",
        ),
        (
            {
                "history": [
                    {
                        "role": "user",
                        "content": [{"type": "text", "text": "<pr_description>\nparts\n</pr_description>"}],
                    }
                ]
            },
            "parts",
        ),
        ({"history": [{"role": "user", "is_demo": True, "content": "ISSUE:\ndemo\n\nINSTRUCTIONS:"}]}, ""),
    ],
)
def test_the_task_is_the_problem_statement(item, task):
    assert swe_problem_statement(item) == task


def test_a_directory_of_trajectories_is_spaced_in_file_order(tmp_path):
    (tmp_path / "runs").mkdir()
    for name in ("b-2", "a-1", "c-3"):
        write(tmp_path / "runs", f"{name}.traj", traj(exit_status="submitted"))
    write(tmp_path / "runs", "preds.json", {"a-1": {"model_patch": ""}})  # not a trajectory: not read
    timed = traj(exit_status="submitted")
    timed["created_at"] = "2023-01-02T03:04:05Z"
    write(tmp_path, "timed.traj", timed)
    run = import_run(start="2025-02-01T09:00:00", spacing_s=3600)
    files = expand_paths([tmp_path / "runs", str(tmp_path / "tim*.traj")], "swe-agent")
    assert [f.name for f in files] == ["a-1.traj", "b-2.traj", "c-3.traj", "timed.traj"]
    starts = {sid: evs[0]["ts"] for sid, evs in by_session(list(import_files(files, "swe-agent", run=run))).items()}
    assert starts == {
        "a-1": "2025-02-01T09:00:00Z",
        "b-2": "2025-02-01T10:00:00Z",
        "c-3": "2025-02-01T11:00:00Z",
        "timed": "2023-01-02T03:04:05Z",
    }  # a file that carries its time keeps it


def test_one_import_never_repeats_a_session_id(tmp_path):
    for d in ("run1", "run2"):
        (tmp_path / d).mkdir()
        write(tmp_path / d, "x-1.traj", traj(exit_status="submitted"))
    events = list(import_files(expand_paths([tmp_path], "swe-agent"), "swe-agent"))
    assert list(by_session(events)) == ["x-1", "x-1~2"]
    assert len({e["event_id"] for e in events}) == len(events)


def test_paths_that_match_nothing_are_named(tmp_path):
    with pytest.raises(ImportShapeError, match="nope.traj: no such file"):
        expand_paths([tmp_path / "nope.traj"], "swe-agent")
    with pytest.raises(ImportShapeError, match="matches no file"):
        expand_paths([str(tmp_path / "*.traj")], "swe-agent")
    with pytest.raises(ImportShapeError, match="--start"):
        import_run(start="tomorrow")
    with pytest.raises(ImportShapeError, match="--spacing"):
        import_run(spacing_s=0)


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"resolved": ["a"], "unresolved": ["b"]}, {"a": "success", "b": "failure"}),
        (
            {
                "resolved_ids": ["a"],
                "completed_ids": ["a", "b"],
                "error_ids": ["c"],
                "incomplete_ids": ["d"],
                "total_instances": 4,
            },
            {"a": "success", "b": "failure", "c": "failure"},
        ),
        (
            {
                "a": "success",
                "b": "failure",
                "c": "partial",
                "d": True,
                "e": False,
                "f": "resolved",
                "g": {"resolved": False},
            },
            {
                "a": "success",
                "b": "failure",
                "c": "partial",
                "d": "success",
                "e": "failure",
                "f": "success",
                "g": "failure",
            },
        ),
    ],
)
def test_results_files(tmp_path, data, expected):
    assert load_results(write(tmp_path, "results.json", data)) == expected


@pytest.mark.parametrize(
    ("data", "names"),
    [
        ([1, 2], ["expected an object"]),
        ({"resolved": ["a"], "flaky": ["b"]}, ["field 'flaky'"]),
        ({"resolved": "a"}, ["field 'resolved'", "list of instance ids"]),
        ({"a": "won"}, ["field 'a'", "'won'"]),
    ],
)
def test_results_files_of_unknown_shapes_name_the_field(tmp_path, data, names):
    with pytest.raises(ImportShapeError) as info:
        load_results(write(tmp_path, "r.json", data))
    for name in names:
        assert name in str(info.value), str(info.value)


def test_swe_agent_problem_statement_wins_and_several_trajectories_get_numbered_sessions(tmp_path):
    a, b = traj(), traj()
    a["problem_statement"] = "the real issue text"
    sessions = by_session(list(swe_agent(write(tmp_path, "batch.json", [a, b]))))
    assert list(sessions) == ["batch-0", "batch-1"]
    assert sessions["batch-0"][0]["payload"]["task"] == "the real issue text"
    assert sessions["batch-1"][0]["payload"]["task"] == "Fix the off-by-one in paginate()"


def test_swe_agent_import_is_deterministic(tmp_path):
    assert list(swe_agent(RUN_0X)) == list(swe_agent(RUN_0X))
    assert list(import_files([RUN_0X, RUN_1X], "swe-agent")) == list(import_files([RUN_0X, RUN_1X], "swe-agent"))


@pytest.mark.parametrize(
    ("data", "names"),
    [
        ({"history": []}, ["item 0", "'trajectory'"]),
        ({"trajectory": {"action": "ls"}}, ["'trajectory'"]),
        ({"trajectory": [{"thought": "no action"}]}, ["trajectory[0]", "'action'"]),
        ({"trajectory": [], "info": "done"}, ["field 'info'"]),
        ({"trajectory": [], "history": {"role": "user"}}, ["field 'history'"]),
        ({"trajectory": [], "info": {"exit_status": 1}}, ["field 'info.exit_status'"]),
        ({"trajectory": [], "reward": "high"}, ["field 'reward'"]),
        ({"trajectory": [], "info": {"resolved": "yes"}}, ["field 'resolved'"]),
        ({"trajectory": [], "created_at": "last week"}, ["field 'created_at'"]),
    ],
)
def test_swe_agent_unknown_shapes_name_the_field(tmp_path, data, names):
    with pytest.raises(ImportShapeError) as info:
        list(swe_agent(write(tmp_path, "x.traj", data)))
    for name in names:
        assert name in str(info.value), str(info.value)


def test_v1_events_pass_through_and_the_formats_registry(tmp_path):
    ev = {"session_id": "s1", "agent": "a", "seq": 0, "type": "session_start"}
    path = write(tmp_path, "e.jsonl", orjson.dumps(ev) + b"\n")
    assert list(v1(path)) == [ev] and list(v1(path, agent="b")) == [{**ev, "agent": "b"}]
    with pytest.raises(ImportShapeError, match="event 1"):
        list(v1(write(tmp_path, "bad.jsonl", b"[1]\n")))
    assert FORMATS == {
        "openai-chat": openai_chat,
        "swe-agent": swe_agent,
        "openhands": openhands,
        "locomo": locomo,
        "toolbench": toolbench,
        "v1": v1,
        "otel": otel,
        **dict.fromkeys(
            ["tau-bench", "tau2", "inspect", "langchain", "autogen", "smolagents", "gemini", "adk", "openai-agents"],
            openai_chat,
        ),
    }


def test_somnus_import_takes_files_directories_and_globs_in_one_call(tmp_path):
    from typer.testing import CliRunner

    from somnus.cli import app

    out = tmp_path / "events.jsonl"
    got = CliRunner().invoke(
        app,
        [
            "import",
            str(FIXTURES),
            str(FIXTURES / "*.traj"),
            "--format",
            "swe-agent",
            "--results",
            str(RESULTS),
            "--start",
            "2025-01-01T00:00:00Z",
            "--spacing",
            "60",
            "--out",
            str(out),
        ],
    )
    assert got.exit_code == 0, got.output
    events = [orjson.loads(line) for line in out.read_bytes().splitlines()]
    assert events == list(
        import_files(
            [RUN_0X, RUN_1X], "swe-agent", run=import_run(start="2025-01-01T00:00:00Z", spacing_s=60, results=RESULTS)
        )
    )
    assert "imported 2 sessions from 2 files" in got.output
    bad = CliRunner().invoke(app, ["import", str(tmp_path / "missing"), "--format", "swe-agent", "--out", str(out)])
    assert bad.exit_code == 1 and "no such file or directory" in " ".join(bad.output.split())


# ---- LoCoMo (real data) ----------------------------------------------------------------------------

LOCOMO = TAU_BENCH.parents[1] / "locomo" / "locomo5.json"


@pytest.fixture(scope="module")
def loco() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    if not LOCOMO.exists():
        pytest.skip(f"dataset missing: {LOCOMO}")
    return json.loads(LOCOMO.read_bytes()), list(locomo(LOCOMO))


def sessions_of(conv: dict[str, Any]) -> list[int]:
    return sorted(int(k.split("_")[1]) for k in conv if k.startswith("session_") and k.count("_") == 1)


def test_locomo_turns_become_message_events_with_their_dia_ids(loco):
    source, events = loco
    sessions = by_session(events)
    expected = {f"{c['sample_id']}-s{n}" for c in source for n in sessions_of(c["conversation"])}
    assert set(sessions) == expected and len(expected) == 128
    turns = [t for c in source for n in sessions_of(c["conversation"]) for t in c["conversation"][f"session_{n}"]]
    messages = [e for e in events if e["type"] in ("user_message", "agent_message")]
    assert len(messages) == len(turns) == 2760
    assert [m["payload"]["dia_id"] for m in messages] == [t["dia_id"] for t in turns]
    for sid, evs in sessions.items():
        start = evs[0]
        assert start["type"] == "session_start" and evs[-1]["type"] == "session_end", sid
        assert [e["seq"] for e in evs] == list(range(len(evs)))
        refs = start["payload"]["metadata"]["message_refs"]
        assert refs == {str(e["seq"]): e["payload"]["dia_id"] for e in evs[1:-1]}
        times = [datetime.fromisoformat(e["ts"]) for e in evs]
        assert times == sorted(times) and len(set(times)) == len(times)
        assert times[2] - times[1] == timedelta(seconds=LOCOMO_TURN_STEP_S)


def test_locomo_sessions_are_stamped_with_their_dates_and_speakers_keep_their_roles(loco):
    source, events = loco
    first = source[0]["conversation"]
    start = next(e for e in events if e["session_id"] == f"{source[0]['sample_id']}-s1")
    assert start["ts"] == locomo_date(first["session_1_date_time"]).isoformat().replace("+00:00", "Z")
    assert start["agent"] == f"locomo-{source[0]['sample_id']}"
    meta = start["payload"]["metadata"]
    assert meta["speakers"] == {"user": first["speaker_a"], "agent": first["speaker_b"]}
    assert meta["session_date"] == first["session_1_date_time"]
    for e in events:
        if e["type"] in ("user_message", "agent_message"):
            role = "user" if e["type"] == "user_message" else "agent"
            assert (
                e["payload"]["speaker"]
                == by_session([x for x in events if x["session_id"] == e["session_id"]])[e["session_id"]][0]["payload"][
                    "metadata"
                ]["speakers"][role]
            )
            break


def test_locomo_events_all_decode_and_keep_image_captions(loco):
    source, events = loco
    assert_all_decode(events)
    captioned = next(
        t
        for n in sessions_of(source[0]["conversation"])
        for t in source[0]["conversation"][f"session_{n}"]
        if t.get("blip_caption")
    )
    ev = next(
        e
        for e in events
        if e["payload"].get("dia_id") == captioned["dia_id"] and e["agent"] == f"locomo-{source[0]['sample_id']}"
    )
    assert ev["payload"]["text"] == f"{captioned['text']} [shares {captioned['blip_caption']}]"


def test_locomo_dates_and_agent_override(tmp_path):
    assert locomo_date("1:56 pm on 8 May, 2023").isoformat() == "2023-05-08T13:56:00+00:00"
    assert locomo_date("12:09 am on 13 September, 2023").isoformat() == "2023-09-13T00:09:00+00:00"
    assert locomo_date("12:30 pm on 1 January, 2024").hour == 12
    with pytest.raises(ValueError):
        locomo_date("yesterday")
    sample = {
        "sample_id": "x",
        "conversation": {
            "speaker_a": "A",
            "speaker_b": "B",
            "session_1_date_time": "9:00 am on 2 June, 2023",
            "session_1": [
                {"speaker": "A", "dia_id": "D1:1", "text": "hi"},
                {"speaker": "B", "dia_id": "D1:2", "text": "yo"},
            ],
        },
    }
    events = list(locomo(write(tmp_path, "c.json", sample), agent="chat"))
    assert [e["type"] for e in events] == ["session_start", "user_message", "agent_message", "session_end"]
    assert {e["agent"] for e in events} == {"chat"} and events[0]["session_id"] == "x-s1"
    assert list(locomo(write(tmp_path, "c.json", sample))) == list(locomo(write(tmp_path, "c.json", sample)))


@pytest.mark.parametrize(
    ("conv", "names"),
    [
        ({}, ["'speaker_a'"]),
        ({"speaker_a": "A", "speaker_b": "B", "session_1": []}, ["'session_1_date_time'"]),
        ({"speaker_a": "A", "speaker_b": "B", "session_1": [], "session_1_date_time": "soon"}, ["session_1_date_time"]),
        (
            {"speaker_a": "A", "speaker_b": "B", "session_1": {}, "session_1_date_time": "9:00 am on 2 June, 2023"},
            ["'session_1' must be a list"],
        ),
        (
            {
                "speaker_a": "A",
                "speaker_b": "B",
                "session_1_date_time": "9:00 am on 2 June, 2023",
                "session_1": [{"speaker": "C", "dia_id": "D1:1", "text": "hi"}],
            },
            ["session_1[0]", "'C'"],
        ),
        (
            {
                "speaker_a": "A",
                "speaker_b": "B",
                "session_1_date_time": "9:00 am on 2 June, 2023",
                "session_1": [{"speaker": "A", "text": "hi"}],
            },
            ["session_1[0]", "'dia_id'"],
        ),
    ],
)
def test_locomo_unknown_shapes_name_the_field(tmp_path, conv, names):
    with pytest.raises(ImportShapeError) as info:
        list(locomo(write(tmp_path, "c.json", {"sample_id": "x", "conversation": conv})))
    for name in names:
        assert name in str(info.value), str(info.value)
    with pytest.raises(ImportShapeError):
        list(locomo(write(tmp_path, "d.json", [{"qa": []}])))


# ---- ToolBench (real data) -------------------------------------------------------------------------

TOOLBENCH = TAU_BENCH.parents[1] / "toolbench-sample" / "answer"


@pytest.fixture(scope="module")
def tb() -> tuple[dict[Path, dict[str, Any]], list[dict[str, Any]], ImportRun]:
    if not TOOLBENCH.exists():
        pytest.skip(f"dataset missing: {TOOLBENCH}")
    files = expand_paths([TOOLBENCH], "toolbench")
    run = ImportRun()
    events = list(import_files(files, "toolbench", run=run))
    return {f: json.loads(f.read_bytes()) for f in files}, events, run


def raw_trajectory(answer: dict[str, Any]) -> list[dict[str, Any]] | None:
    steps = answer["answer_generation"].get("train_messages")
    return steps[-1] if steps else None


def raw_failed(content: str) -> bool:
    """Read from the raw text, not as the importer reads it: the server's error field is not empty, or
    the response passed on is an HTTP error all the same (a 4xx/5xx status field, an error page, the
    gateway's "does not exist" or a timeout)."""
    assert content.startswith('{"error": "')
    if not content.startswith('{"error": "", '):
        return True
    response = content.split('"response": ', 1)[1]
    return bool(
        re.search(r"""['"](?:status|statusCode|status_code)['"]: ['"]?[45]\d\d\b""", response)
        or re.search(r"<title>[^<]*(?:Forbidden|Unauthorized|Not Found|Bad Request|Error)", response)
        or "does not exist" in response
        or "timed out" in response
    )


def test_toolbench_gives_a_session_per_trajectory_and_skips_the_files_without_one(tb):
    raw, events, run = tb
    assert len(raw) == 15
    sessions = by_session(events)
    without = sorted(f.name for f, a in raw.items() if raw_trajectory(a) is None)
    assert len(without) == 2 and all(
        not raw_trajectory(raw[f]) and raw[f]["answer_generation"]["valid_data"] is False
        for f in raw
        if f.name in without
    )
    assert len(sessions) == 13 == len(raw) - len(without)
    assert len(run.skipped) == 2 and run.problems == []
    assert all("valid_data false" in note and "neither answered nor gave up" in note for note in run.skipped)
    assert sorted(Path(note.split(": ")[0]).name for note in run.skipped) == without
    for sid, evs in sessions.items():
        assert [e["seq"] for e in evs] == list(range(len(evs))), sid
        assert evs[0]["type"] == "session_start" and evs[-1]["type"] == "session_end", sid
        times = [datetime.fromisoformat(e["ts"]) for e in evs]
        assert times == sorted(times) and len(set(times)) == len(times), sid
    assert_all_decode(events)
    assert list(import_files(list(raw), "toolbench")) == events  # deterministic


def test_toolbench_calls_and_failed_calls_match_each_raw_file(tb):
    raw, events, _ = tb
    sessions = by_session(events)
    stems = Counter(f.stem for f in raw if raw_trajectory(raw[f]))
    seen: Counter[str] = Counter()
    totals = Counter()
    for f, answer in raw.items():
        messages = raw_trajectory(answer)
        if messages is None:
            continue
        seen[f.stem] += 1
        sid = f.stem if seen[f.stem] == 1 else f"{f.stem}~{seen[f.stem]}"
        evs = sessions[sid]
        assert evs[0]["payload"]["task"] == answer["answer_generation"]["query"].strip()[:500], sid
        calls = [m["function_call"]["name"] for m in messages if m["role"] == "assistant" and m.get("function_call")]
        results = [m for m in messages if m["role"] == "function"]
        failed = [m for m in results if raw_failed(m["content"])]
        got_calls = [e["payload"]["tool"] for e in evs if e["type"] == "tool_call"]
        got_results = [e["payload"] for e in evs if e["type"] == "tool_result"]
        assert calls[-1] == "Finish" and "Finish" not in calls[:-1], sid  # the Finish call is the end, no tool
        assert got_calls == calls[:-1], sid
        assert [r["tool"] for r in got_results] == [m["name"] for m in results], sid
        assert [not r["ok"] for r in got_results] == [raw_failed(m["content"]) for m in results], sid
        assert [e["type"] for e in evs].count("user_message") == 1, sid  # the query; not the search's prompts
        totals.update(calls=len(calls) - 1, failed=len(failed))
    assert max(stems.values()) == 2  # G1 and G2 both have a 10_...: the second gets ~2
    assert totals == {"calls": 37, "failed": 13}


def test_toolbench_http_errors_keep_their_status_and_text(tb):
    _, events, _ = tb
    failed = {
        (e["session_id"], e["payload"]["tool"], e["payload"].get("http_status"), e["payload"]["error"])
        for e in events
        if e["type"] == "tool_result" and not e["payload"]["ok"]
    }
    assert ("127_ChatGPT_DFS_woFilter_w2", "api_tracking_for_pack_send", 400, "Bad Request") in failed
    assert ("21_ChatGPT_DFS_woFilter_w2", "dota_2_steam_web", 403, "Forbidden") in failed
    assert (
        "21_ChatGPT_DFS_woFilter_w2",
        "raiderio_call_for_raider_io",
        400,
        "Message error... Invalid request query input",
    ) in failed
    assert any(
        sid == "10_ChatGPT_DFS_woFilter_w2~2" and err.startswith("Timeout error...") and "Read timed out" in err
        for sid, _, _, err in failed
    )
    assert sum(1 for *_, err in failed if "does not exist" in err) >= 2


def test_toolbench_outcomes_come_from_the_finish_type(tb):
    raw, events, _ = tb
    ends = [e["payload"] for e in events if e["type"] == "session_end"]
    types = [a["answer_generation"]["finish_type"] for a in raw.values() if raw_trajectory(a)]
    assert Counter(p["outcome"] for p in ends) == Counter(
        {"give_answer": "success", "give_up": "failure"}[t] for t in types
    )
    assert {p["reason"] for p in ends} == {"finish_type give_answer", "finish_type give_up"}


def tb_answer(messages: list[Any], **gen: Any) -> dict[str, Any]:
    return {
        "answer_generation": {
            "valid_data": True,
            "query": "weather in Paris?",
            "finish_type": "give_answer",
            "train_messages": [messages[:3], messages],
            **gen,
        },
        "win": True,
    }


TB_MESSAGES: list[dict[str, Any]] = [
    {"role": "system", "content": "You are AutoGPT..."},
    {"role": "user", "content": "\nweather in Paris?\nBegin!\n"},
    {
        "role": "assistant",
        "content": None,
        "function_call": {"name": "now_for_weather", "arguments": '{"city": "Paris"}'},
    },
    {
        "role": "function",
        "name": "now_for_weather",
        "content": '{"error": "", "response": "{\'status\': 500, \'message\': \'Internal error\'}"}',
    },
    {"role": "user", "content": "This is not the first time you try this task...", "valid": False},
    {
        "role": "assistant",
        "content": "Retry with the forecast.",
        "function_call": {"name": "forecast_for_weather", "arguments": "{}"},
    },
    {"role": "function", "name": "forecast_for_weather", "content": '{"error": "", "response": "{\'t\': 21}"}'},
    {
        "role": "assistant",
        "content": None,
        "function_call": {"name": "Finish", "arguments": '{"return_type": "give_answer", "final_answer": "21 C"}'},
    },
]


def test_a_toolbench_answer_file_and_its_sequence_of_events(tmp_path):
    events = list(toolbench(write(tmp_path, "7_ChatGPT_DFS_woFilter_w2.json", tb_answer(TB_MESSAGES))))
    assert [e["type"] for e in events] == [
        "session_start",
        "user_message",
        "tool_call",
        "tool_result",
        "agent_message",
        "tool_call",
        "tool_result",
        "agent_message",
        "session_end",
    ]
    start, user, c0, r0, thought, c1, r1, answer, end = (e["payload"] for e in events)
    assert {e["session_id"] for e in events} == {"7_ChatGPT_DFS_woFilter_w2"} and events[0]["agent"] == "toolbench"
    assert start == {
        "task": "weather in Paris?",
        "metadata": {"source": "toolbench", "finish_type": "give_answer", "win": True},
    }
    assert user == {"text": "weather in Paris?"}
    assert c0 == {"tool": "now_for_weather", "call_id": "call-2", "args": {"city": "Paris"}}
    assert r0 == {
        "call_id": "call-2",
        "tool": "now_for_weather",
        "ok": False,
        "error": "Internal error",
        "http_status": 500,
    }
    assert thought == {"text": "Retry with the forecast."}
    assert r1 == {"call_id": "call-5", "tool": "forecast_for_weather", "ok": True, "output": "{'t': 21}"}
    assert answer == {"text": "21 C"}
    assert end == {"outcome": "success", "reason": "finish_type give_answer"}
    assert_all_decode(events)


@pytest.mark.parametrize(
    ("gen", "outcome", "reason"),
    [
        ({"finish_type": "give_up"}, "failure", "finish_type give_up"),
        ({"finish_type": "timeout"}, "partial", "finish_type timeout (neither give_answer nor give_up)"),
        ({"finish_type": None}, "success", "Finish return_type give_answer"),  # single_chain's files have none
    ],
)
def test_toolbench_outcomes(tmp_path, gen, outcome, reason):
    answer = tb_answer(TB_MESSAGES)
    answer["answer_generation"].update(gen)
    if gen["finish_type"] is None:
        del answer["answer_generation"]["finish_type"]
    end = list(toolbench(write(tmp_path, "a.json", answer)))[-1]["payload"]
    assert end == {"outcome": outcome, "reason": reason}
    run = ImportRun(results={"a": "partial"})
    assert list(toolbench(write(tmp_path, "a.json", answer), run=run))[-1]["payload"]["outcome"] == "partial"


@pytest.mark.parametrize(
    ("error", "response", "expected"),
    [
        ("", "{'status': '401', 'msg': 'Authentication required'}", ("Authentication required", 401)),
        ("", '{"statusCode": 503}', ('{"statusCode": 503}', 503)),
        (
            "",
            "{'type': 'https://tools.ietf.org/html/rfc7231#section-6.5.1', 'title': 'Bad Request', 'status': 400}",
            ("Bad Request", 400),
        ),
        ("", "<html><head><title>502 Bad Gateway</title></head></html>", ("Bad Gateway", 502)),
        ("", "Too many requests", ("Too many requests", None)),
        ("", "{'message': 'You have exceeded the MONTHLY quota'}", ("You have exceeded the MONTHLY quota", None)),
        ("request invalid, data error. status_code=500", "", ("request invalid, data error. status_code=500", 500)),
        ("No such function name: login", "", ("No such function name: login", None)),
        ("", "{'meta': {'code': 200, 'type': 'Success'}, 'data': []}", (None, None)),
        ("", "{'success': False, 'message': 'Tracking information not found'}", (None, None)),
        ("", "{'status': 'ok', 'code': 404}", (None, None)),  # only a status field is read, and only 4xx/5xx
        ("", "<html><title>Welcome</title></html>", (None, None)),
        ("", "{'status': 400" + ", 'x': 1" * 10_000 + "}", (None, None)),  # too long to be an error body: not parsed
    ],
)
def test_a_toolbench_result_fails_only_when_it_shows_an_error(error, response, expected):
    assert toolbench_failure(error, response) == expected


def test_a_cut_toolbench_observation_still_gives_its_error():
    cut = '{"error": "Message error...", "response": "{\'result\': [{\'title\': \'Black Sum...'
    assert toolbench_observation(cut) == ("Message error...", "{'result': [{'title': 'Black Sum...")
    assert toolbench_observation("plain text") == ("", "plain text")
    assert toolbench_observation(None) == ("", "")


# ToolBench's training data as preprocess/preprocess_toolllama_data.py writes it: one item per step.
TB_TRAINING = [
    {
        "id": "Step 2: Give me a love quote.",
        "conversations": [
            {"from": "system", "value": "You are AutoGPT..."},
            {"from": "user", "value": "\nGive me a love quote.\nBegin!\n"},
            {"from": "assistant", "value": "\nThought: \nAction: love_quote_for_olato_quotes\nAction Input: {}"},
        ],
    },
    {
        "id": "Step 4: Give me a love quote.",
        "conversations": [
            {"from": "system", "value": "You are AutoGPT..."},
            {"from": "user", "value": "\nGive me a love quote.\nBegin!\n"},
            {"from": "assistant", "value": "\nThought: \nAction: love_quote_for_olato_quotes\nAction Input: {}"},
            {
                "from": "function",
                "value": '{"error": "Rate limit error...", "response": "You have exceeded the rate limit"}',
            },
            {"from": "user", "value": "This is not the first time you try this task, all previous trails failed."},
            {
                "from": "assistant",
                "value": "\nThought: I cannot get a quote.\nAction: Finish\nAction Input: "
                '{"return_type": "give_up_and_restart"}',
            },
        ],
    },
]


def test_toolbench_training_conversations_give_one_session_per_query(tmp_path):
    events = list(toolbench(write(tmp_path, "toolllama.json", TB_TRAINING)))
    assert [e["type"] for e in events] == [
        "session_start",
        "user_message",
        "tool_call",
        "tool_result",
        "agent_message",
        "session_end",
    ]
    assert {e["session_id"] for e in events} == {"toolllama-0"}
    start, user, call, result, thought, end = (e["payload"] for e in events)
    assert start["task"] == "Give me a love quote." and user == {"text": "Give me a love quote."}
    assert call == {"tool": "love_quote_for_olato_quotes", "call_id": "call-2", "args": {}}
    assert result["ok"] is False and result["tool"] == "love_quote_for_olato_quotes"
    assert result["error"] == "Rate limit error... You have exceeded the rate limit"
    assert thought == {"text": "I cannot get a quote."}
    assert end == {"outcome": "failure", "reason": "Finish return_type give_up_and_restart"}
    assert_all_decode(events)


@pytest.mark.parametrize(
    ("data", "names"),
    [
        ("just text", ["'answer_generation'"]),
        ({"answer_generation": []}, ["'answer_generation'"]),
        ({"answer_generation": {"valid_data": "yes"}}, ["answer_generation", "'valid_data'", "'yes'"]),
        ({"answer_generation": {"query": 5, "train_messages": [[]]}}, ["'query'", "int"]),
        ({"answer_generation": {"finish_type": 1, "train_messages": [[]]}}, ["'finish_type'"]),
        ({"answer_generation": {"train_messages": {"a": 1}}}, ["'train_messages'", "list of message lists"]),
        ({"answer_generation": {"train_messages": [[], "x"]}}, ["'train_messages'"]),
        ({"answer_generation": {"train_messages": [["oops"]]}}, ["train_messages[0]", "message 0", "'role'"]),
        ({"answer_generation": {"train_messages": [[{"role": 3}]]}}, ["message 0", "'role'"]),
        (
            {"answer_generation": {"train_messages": [[{"role": "tool", "content": "x"}]]}},
            ["message 0", "unknown role 'tool'"],
        ),
        (
            {"answer_generation": {"train_messages": [[{"role": "assistant", "function_call": "f()"}]]}},
            ["message 0", "'function_call'"],
        ),
        (
            {"answer_generation": {"train_messages": [[{"role": "assistant", "function_call": {"name": ["f"]}}]]}},
            ["message 0", "'function_call'"],
        ),
        (
            {"answer_generation": {"train_messages": [[{"role": "function", "name": {}, "content": "x"}]]}},
            ["message 0", "'name'"],
        ),
        ([{"id": "Step 1: q", "conversations": "hi"}], ["item 0", "'conversations'"]),
        ([{"id": "Step 1: q", "conversations": [{"from": "user"}]}], ["item 0", "conversations[0]", "'value'"]),
        ([{"conversations": []}, 7], ["item 1", "'conversations'"]),
    ],
)
def test_toolbench_unknown_shapes_name_the_file_and_the_field(tmp_path, data, names):
    with pytest.raises(ImportShapeError) as info:
        list(toolbench(write(tmp_path, "bad.json", data)))
    for name in [*names, "bad.json"]:
        assert name in str(info.value), str(info.value)


def test_toolbench_odd_values_still_give_valid_events(tmp_path):
    messages = [
        {"role": "user", "content": ["parts"]},
        {"role": "assistant", "content": {"x": 1}, "function_call": {"name": "f", "arguments": 5}},
        {"role": "function", "content": {"error": 404, "response": None}},
        {"role": "function", "name": "g", "content": "[1, 2"},
        {"role": "assistant", "function_call": {"name": "Finish", "arguments": "not json"}},
    ]
    events = list(toolbench(write(tmp_path, "odd.json", {"answer_generation": {"train_messages": [messages]}})))
    results = [e["payload"] for e in events if e["type"] == "tool_result"]
    assert [(r["tool"], r["ok"]) for r in results] == [("f", False), ("g", True)]
    assert events[-1]["payload"] == {"outcome": "partial", "reason": "no finish_type and no Finish call"}
    assert_all_decode(events)
    skip = ImportRun()
    assert (
        list(
            toolbench(
                write(tmp_path, "none.json", {"answer_generation": {"valid_data": False, "train_messages": []}}),
                run=skip,
            )
        )
        == []
    )
    assert len(skip.skipped) == 1 and "none.json" in skip.skipped[0] and skip.problems == []


def test_somnus_import_format_toolbench_takes_the_folder_and_names_what_it_skipped(tmp_path, tb):
    from typer.testing import CliRunner

    from somnus.cli import app

    out = tmp_path / "events.jsonl"
    got = CliRunner().invoke(app, ["import", str(TOOLBENCH), "--format", "toolbench", "--out", str(out)])
    assert got.exit_code == 0, got.output
    assert [orjson.loads(line) for line in out.read_bytes().splitlines()] == tb[1]
    text = " ".join(got.output.split())
    assert "imported 13 sessions from 15 files (2 skipped: no trajectory)" in text
    assert text.count("skipped: ") == 3 and "69_ChatGPT_DFS_woFilter_w2.json: no trajectory" in text
