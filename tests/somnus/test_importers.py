"""somnus.importers: transcripts of other tools become valid v1 trace events, deterministically."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import pytest

from schemas.codec import Rejection, decode_trace
from somnus.importers import (
    DEFAULT_START,
    FORMATS,
    LOCOMO_TURN_STEP_S,
    MAX_OUTPUT,
    ImportShapeError,
    locomo,
    locomo_date,
    openai_chat,
    swe_agent,
)

TAU_BENCH = Path(__file__).resolve().parents[3] / "shared" / "datasets" / "tau-bench-airline" / "gpt-4o-airline.json"


def by_session(events: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for e in events:
        out[e["session_id"]].append(e)
    return dict(out)


def assert_all_decode(events: list[dict[str, Any]]) -> None:
    bad = [(e["session_id"], e["seq"], r.reason) for e in events
           if isinstance(r := decode_trace(orjson.dumps(e), max_bytes=1_048_576), Rejection)]
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
    assert {e["payload"]["tool"] for e in events if e["type"] == "tool_call"} == \
        {c["function"]["name"] for c in calls}
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
    "id": "conv1", "reward": 1.0,
    "messages": [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "refund order 1042"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_a", "type": "function", "function": {"name": "get_order", "arguments": "{\"id\": 1042}"}},
            {"id": "call_b", "type": "function", "function": {"name": "get_user", "arguments": "not json"}},
        ]},
        {"role": "tool", "tool_call_id": "call_a", "content": "{\"status\": \"paid\"}"},
        {"role": "tool", "tool_call_id": "call_b", "content": "  Error: user not found"},
        {"role": "assistant", "content": "Refunded."},
    ],
}


def test_an_openai_chat_transcript_becomes_events(tmp_path):
    events = list(openai_chat(write(tmp_path, "chats.json", CHAT)))
    assert [e["type"] for e in events] == ["session_start", "user_message", "tool_call", "tool_call",
                                           "tool_result", "tool_result", "agent_message", "session_end"]
    assert {e["session_id"] for e in events} == {"chats-conv1"}
    assert {e["agent"] for e in events} == {"assistant"}
    start, user, call_a, call_b, res_a, res_b, said, end = (e["payload"] for e in events)
    assert start == {"task": "refund order 1042", "metadata": {"reward": 1.0}}
    assert call_a == {"tool": "get_order", "call_id": "call_a", "args": {"id": 1042}}
    assert call_b["args"] == {"_raw": "not json"}
    assert res_a == {"call_id": "call_a", "tool": "get_order", "ok": True, "output": "{\"status\": \"paid\"}"}
    assert res_b == {"call_id": "call_b", "tool": "get_user", "ok": False, "error": "  Error: user not found"}
    assert said == {"text": "Refunded."}
    assert end == {"outcome": "success", "reason": "reward 1.0"}
    assert events[0]["ts"] == "2024-05-15T20:00:00Z" == DEFAULT_START.isoformat().replace("+00:00", "Z")
    assert_all_decode(events)


@pytest.mark.parametrize(("fields", "outcome", "reason"), [
    ({"reward": 1}, "success", "reward 1"),
    ({"reward": 0.99}, "failure", "reward 0.99"),
    ({"reward": 0}, "failure", "reward 0"),
    ({"outcome": "partial"}, "partial", None),
    ({}, "partial", "the transcript has no reward or outcome"),
])
def test_the_outcome_comes_from_reward_or_outcome(tmp_path, fields, outcome, reason):
    item = {"messages": [{"role": "user", "content": "hi"}], **fields}
    end = list(openai_chat(write(tmp_path, "x.json", [item])))[-1]
    assert end["type"] == "session_end"
    assert end["payload"] == ({"outcome": outcome, "reason": reason} if reason else {"outcome": outcome})


def test_json_lines_sessions_ids_and_start_times(tmp_path):
    lines = [{"messages": [{"role": "user", "content": "a"}]},
             {"session_id": "custom", "messages": [{"role": "user", "content": "b"}]},
             {"task_id": 7, "trial": 2, "traj": [{"role": "user", "content": "c"}]},
             {"task_id": 8, "traj": [{"role": "user", "content": "d"}], "agent": "booker"}]
    path = write(tmp_path, "runs.jsonl", b"\n".join(orjson.dumps(x) for x in lines) + b"\n\n")
    sessions = by_session(list(openai_chat(path)))
    assert list(sessions) == ["runs-0", "runs-custom", "runs-task7-trial2", "runs-task8-trial0"]
    starts = [datetime.fromisoformat(evs[0]["ts"]) for evs in sessions.values()]
    assert starts == [DEFAULT_START + timedelta(minutes=10 * i) for i in range(4)]
    assert sessions["runs-task8-trial0"][0]["agent"] == "booker"
    assert sessions["runs-0"][0]["agent"] == "assistant"


def test_the_agent_argument_overrides_the_transcript(tmp_path):
    item = {"agent": "booker", "messages": [{"role": "user", "content": "x"}]}
    assert {e["agent"] for e in openai_chat(write(tmp_path, "a.json", item), agent="airline")} == {"airline"}


def test_long_tool_outputs_are_cut(tmp_path):
    item = {"messages": [{"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": "t"}}]},
                         {"role": "tool", "tool_call_id": "c", "content": "y" * 5000}]}
    (result,) = [e for e in openai_chat(write(tmp_path, "a.json", item)) if e["type"] == "tool_result"]
    assert MAX_OUTPUT == 2000
    assert result["payload"]["output"] == "y" * MAX_OUTPUT


def test_a_tool_call_without_id_gets_a_stable_one_and_arguments_of_any_shape_are_kept(tmp_path):
    item = {"messages": [{"role": "assistant", "tool_calls": [
        {"function": {"name": "a", "arguments": {"k": 1}}},
        {"function": {"name": "b", "arguments": "[1, 2]"}},
        {"function": {"name": "c", "arguments": ""}},
        {"function": {"name": "d"}}]}]}
    calls = [e["payload"] for e in openai_chat(write(tmp_path, "a.json", item)) if e["type"] == "tool_call"]
    assert [(c["call_id"], c["args"]) for c in calls] == [
        ("call-0-0", {"k": 1}), ("call-0-1", {"_value": [1, 2]}), ("call-0-2", {}), ("call-0-3", {})]


@pytest.mark.parametrize(("data", "names"), [
    ([{"id": 1}], ["item 0", "'messages'"]),
    ([{"messages": {"role": "user"}}], ["item 0", "'messages'"]),
    ([{"messages": []}, "oops"], ["item 1", "expected an object"]),
    ([{"messages": [{"content": "no role"}]}], ["message 0", "'role'"]),
    ([{"messages": [{"role": "function", "content": "x"}]}], ["message 0", "unknown role 'function'"]),
    ([{"messages": [], "reward": "1.0"}], ["field 'reward'", "'1.0'"]),
    ([{"messages": [], "reward": True}], ["field 'reward'", "True"]),
    ([{"messages": [], "outcome": "won"}], ["field 'outcome'", "'won'"]),
    ([{"messages": [{"role": "user", "content": "x"}, {"role": "tool", "content": "ok"}]}],
     ["message 1", "'tool_call_id'"]),
    ([{"messages": [{"role": "assistant", "tool_calls": [{"id": "c", "function": {}}]}]}],
     ["message 0", "tool_calls[0]", "'function.name'"]),
])
def test_unknown_shapes_name_the_field(tmp_path, data, names):
    path = write(tmp_path, "bad.json", data)
    with pytest.raises(ImportShapeError) as info:
        list(openai_chat(path))
    for name in names:
        assert name in str(info.value), str(info.value)
    assert "bad.json" in str(info.value)


def test_a_json_lines_file_with_a_broken_line_names_the_line(tmp_path):
    path = write(tmp_path, "bad.jsonl", b'{"messages": []}\n{"messages": [\n')
    with pytest.raises(ImportShapeError, match="line 2 is not JSON"):
        list(openai_chat(path))


def test_user_content_given_as_content_parts_still_gives_valid_events(tmp_path):
    item = {"id": "parts", "reward": 1.0,
            "messages": [{"role": "user", "content": [{"type": "text", "text": "refund order 1042"}]},
                         {"role": "assistant", "content": "done"}]}
    assert_all_decode(list(openai_chat(write(tmp_path, "parts.json", item))))


# ---- SWE-agent trajectories ---------------------------------------------------------------------

def traj(**info: Any) -> dict[str, Any]:
    return {
        "history": [{"role": "system", "content": "You are an autonomous programmer."},
                    {"role": "user", "content": "Fix the off-by-one in paginate()"}],
        "trajectory": [
            {"thought": "Let me find the function.", "action": "search_dir paginate\n", "observation": "Found 2 matches"},
            {"thought": "", "action": "python reproduce.py",
             "observation": "Traceback (most recent call last):\n  File ..."},
            {"action": "edit 10:12\n    return items[start:end]\nend_of_edit", "observation": None},
            {"thought": "Done.", "action": "  ", "observation": {"ok": True}},
        ],
        "info": info,
    }


def test_a_swe_agent_trajectory_becomes_events(tmp_path):
    events = list(swe_agent(write(tmp_path, "django-1234.traj", traj(exit_status="submitted"))))
    assert [e["type"] for e in events] == [
        "session_start",
        "agent_message", "tool_call", "tool_result",
        "tool_call", "tool_result",
        "tool_call", "tool_result",
        "agent_message", "tool_call", "tool_result",
        "session_end"]
    assert [e["seq"] for e in events] == list(range(len(events)))
    assert {(e["agent"], e["session_id"]) for e in events} == {("swe-agent", "django-1234")}
    assert events[0]["payload"] == {"task": "Fix the off-by-one in paginate()", "metadata": {"exit_status": "submitted"}}
    calls = [e["payload"] for e in events if e["type"] == "tool_call"]
    assert [(c["tool"], c["call_id"]) for c in calls] == [
        ("search_dir", "step-0"), ("python", "step-1"), ("edit", "step-2"), ("noop", "step-3")]
    assert calls[0]["args"] == {"command": "search_dir paginate"}
    results = [e["payload"] for e in events if e["type"] == "tool_result"]
    assert [r["ok"] for r in results] == [True, False, True, True]
    assert results[1]["error"].startswith("Traceback") and results[1]["tool"] == "python"
    assert results[2]["output"] == "" and results[3]["output"] == '{"ok":true}'
    assert events[-1]["payload"] == {"outcome": "partial", "reason": "exit_status submitted"}
    assert_all_decode(events)


@pytest.mark.parametrize(("where", "fields", "outcome"), [
    ("info", {"resolved": True}, "success"),
    ("info", {"resolved": False}, "failure"),
    ("item", {"reward": 1.0}, "success"),
    ("item", {"outcome": "failure"}, "failure"),
    ("info", {}, "partial"),
])
def test_swe_agent_outcomes(tmp_path, where, fields, outcome):
    item = traj(exit_status="submitted", **(fields if where == "info" else {}))
    item.update(fields if where == "item" else {})
    end = list(swe_agent(write(tmp_path, "t.traj", item)))[-1]
    assert end["payload"]["outcome"] == outcome


def test_swe_agent_problem_statement_wins_and_several_trajectories_get_numbered_sessions(tmp_path):
    a, b = traj(), traj()
    a["problem_statement"] = "the real issue text"
    sessions = by_session(list(swe_agent(write(tmp_path, "batch.json", [a, b]))))
    assert list(sessions) == ["batch-0", "batch-1"]
    assert sessions["batch-0"][0]["payload"]["task"] == "the real issue text"
    assert sessions["batch-1"][0]["payload"]["task"] == "Fix the off-by-one in paginate()"


def test_swe_agent_import_is_deterministic(tmp_path):
    path = write(tmp_path, "t.traj", traj(exit_status="submitted"))
    assert list(swe_agent(path)) == list(swe_agent(path))


@pytest.mark.parametrize(("data", "names"), [
    ({"history": []}, ["item 0", "'trajectory'"]),
    ({"trajectory": {"action": "ls"}}, ["'trajectory'"]),
    ({"trajectory": [{"thought": "no action"}]}, ["trajectory[0]", "'action'"]),
    ({"trajectory": [], "info": "done"}, ["field 'info'"]),
    ({"trajectory": [], "reward": "high"}, ["field 'reward'"]),
])
def test_swe_agent_unknown_shapes_name_the_field(tmp_path, data, names):
    with pytest.raises(ImportShapeError) as info:
        list(swe_agent(write(tmp_path, "x.traj", data)))
    for name in names:
        assert name in str(info.value), str(info.value)


def test_formats_registry():
    assert FORMATS == {"openai-chat": openai_chat, "swe-agent": swe_agent, "locomo": locomo}


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
            assert e["payload"]["speaker"] == by_session([x for x in events if x["session_id"] == e["session_id"]])[
                e["session_id"]][0]["payload"]["metadata"]["speakers"][role]
            break


def test_locomo_events_all_decode_and_keep_image_captions(loco):
    source, events = loco
    assert_all_decode(events)
    captioned = next(t for n in sessions_of(source[0]["conversation"])
                     for t in source[0]["conversation"][f"session_{n}"] if t.get("blip_caption"))
    ev = next(e for e in events if e["payload"].get("dia_id") == captioned["dia_id"]
              and e["agent"] == f"locomo-{source[0]['sample_id']}")
    assert ev["payload"]["text"] == f"{captioned['text']} [shares {captioned['blip_caption']}]"


def test_locomo_dates_and_agent_override(tmp_path):
    assert locomo_date("1:56 pm on 8 May, 2023").isoformat() == "2023-05-08T13:56:00+00:00"
    assert locomo_date("12:09 am on 13 September, 2023").isoformat() == "2023-09-13T00:09:00+00:00"
    assert locomo_date("12:30 pm on 1 January, 2024").hour == 12
    with pytest.raises(ValueError):
        locomo_date("yesterday")
    sample = {"sample_id": "x", "conversation": {"speaker_a": "A", "speaker_b": "B",
                                                 "session_1_date_time": "9:00 am on 2 June, 2023",
                                                 "session_1": [{"speaker": "A", "dia_id": "D1:1", "text": "hi"},
                                                               {"speaker": "B", "dia_id": "D1:2", "text": "yo"}]}}
    events = list(locomo(write(tmp_path, "c.json", sample), agent="chat"))
    assert [e["type"] for e in events] == ["session_start", "user_message", "agent_message", "session_end"]
    assert {e["agent"] for e in events} == {"chat"} and events[0]["session_id"] == "x-s1"
    assert list(locomo(write(tmp_path, "c.json", sample))) == list(locomo(write(tmp_path, "c.json", sample)))


@pytest.mark.parametrize(("conv", "names"), [
    ({}, ["'speaker_a'"]),
    ({"speaker_a": "A", "speaker_b": "B", "session_1": []}, ["'session_1_date_time'"]),
    ({"speaker_a": "A", "speaker_b": "B", "session_1": [], "session_1_date_time": "soon"}, ["session_1_date_time"]),
    ({"speaker_a": "A", "speaker_b": "B", "session_1": {}, "session_1_date_time": "9:00 am on 2 June, 2023"},
     ["'session_1' must be a list"]),
    ({"speaker_a": "A", "speaker_b": "B", "session_1_date_time": "9:00 am on 2 June, 2023",
      "session_1": [{"speaker": "C", "dia_id": "D1:1", "text": "hi"}]}, ["session_1[0]", "'C'"]),
    ({"speaker_a": "A", "speaker_b": "B", "session_1_date_time": "9:00 am on 2 June, 2023",
      "session_1": [{"speaker": "A", "text": "hi"}]}, ["session_1[0]", "'dia_id'"]),
])
def test_locomo_unknown_shapes_name_the_field(tmp_path, conv, names):
    with pytest.raises(ImportShapeError) as info:
        list(locomo(write(tmp_path, "c.json", {"sample_id": "x", "conversation": conv})))
    for name in names:
        assert name in str(info.value), str(info.value)
    with pytest.raises(ImportShapeError):
        list(locomo(write(tmp_path, "d.json", [{"qa": []}])))
