"""OpenHands trajectories read by ``somnus import --format openhands``.

Fixtures (tests/fixtures/openhands), shaped as upstream All-Hands-AI/OpenHands writes them; checked
against openhands/events/serialization/event.py (``event_to_dict``: top keys, ``args`` of an action,
``content``/``extras``/``success`` of an observation), openhands/core/schema/action.py and
observation.py (the kinds), openhands/events/action/{commands,files,agent,message}.py and
openhands/events/observation/{commands,error,browse,delegate}.py (the args and extras), openhands/events/tool.py
(``tool_call_metadata``), evaluation/utils/shared.py (``EvalOutput``, ``compatibility_for_eval_history_pairs``)
and the benchmarks' run_infer.py (``history = [event_to_dict(e) for e in state.history]``, ``error =
state.last_error``). ``output.jsonl``: acme__widgets-401, a function-calling CodeActAgent run (system and
recall events, bash calls with exit codes 0 and 1, a str_replace_editor view and edit, an edit refused as an
``error`` observation, an IPython traceback, agent and user messages, ``finish`` with ``task_completed``
"true"); acme__widgets-402, an older run whose history is ``[action, observation]`` pairs (``exit_code`` in
``extras``, agentskills in IPython) that ended on an ``error``. ``bugs-session.json``: a saved session's
bare event list (``think``, a delegation to BrowsingAgent, a failed browse, ``finish`` "partial").
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from somnus.importers import ImportRun, ImportShapeError, expand_paths, import_files, openhands
from somnus.importers.common import MAX_OUTPUT
from tests.somnus.test_importers import assert_all_decode, by_session, calls_and_results, write

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "openhands"
OUTPUT, SESSION = FIXTURES / "output.jsonl", FIXTURES / "bugs-session.json"
REPO = "/workspace/acme__widgets__1.0"


def _lines() -> list[dict[str, Any]]:
    return [json.loads(line) for line in OUTPUT.read_text().splitlines()]


def _shape(events: list[dict[str, Any]]) -> list[tuple[str, Any]]:
    """Each event's type with what identifies it: a message's text, a call's tool, a result's ok."""
    out: list[tuple[str, Any]] = []
    for e in events:
        p = e["payload"]
        said = {
            "agent_message": lambda: p["text"],
            "user_message": lambda: p["text"][:40],
            "tool_call": lambda: p["tool"],
            "tool_result": lambda: p["ok"],
            "delegation": lambda: p["to_agent"],
            "delegation_result": lambda: p["outcome"],
            "session_end": lambda: p["outcome"],
        }.get(e["type"], lambda: None)()
        out.append((e["type"], said))
    return out


def test_a_directory_imports_both_files_as_three_sessions():
    files = expand_paths([FIXTURES], "openhands")
    assert files == [SESSION, OUTPUT]
    run = ImportRun()
    events = list(import_files(files, "openhands", run=run))
    assert_all_decode(events)
    assert run.problems == [] and run.skipped == []
    sessions = by_session(events)
    assert list(sessions) == ["bugs-session", "acme__widgets-401", "acme__widgets-402"]
    assert {e["agent"] for e in events} == {"openhands"}
    for sid, evs in sessions.items():
        assert [e["seq"] for e in evs] == list(range(len(evs))), sid
        assert [e["ts"] for e in evs] == sorted(e["ts"] for e in evs), sid


def test_importing_twice_gives_the_same_events():
    assert list(openhands(OUTPUT)) == list(openhands(OUTPUT))
    assert list(openhands(SESSION)) == list(openhands(SESSION))


def test_a_function_calling_run_as_the_run_it_records():
    events = by_session(list(openhands(OUTPUT)))["acme__widgets-401"]
    start = events[0]["payload"]
    assert start["task"] == _lines()[0]["instruction"][:500]
    assert start["metadata"] == {
        "instance_id": "acme__widgets-401",
        "agent_class": "CodeActAgent",
        "model": "anthropic/claude-3-5-sonnet-20241022",
    }
    assert events[0]["ts"] == "2025-03-10T14:02:00.412345Z"  # the first event's time, read as UTC
    assert _shape(events) == [
        ("session_start", None),
        ("agent_message", "Let me find the pager module first."),
        ("tool_call", "execute_bash"),
        ("tool_result", True),
        ("tool_call", "str_replace_editor"),  # view: a read action
        ("tool_result", True),
        ("agent_message", "Let me run the pager tests to see the failure."),
        ("tool_call", "execute_bash"),
        ("tool_result", False),  # exit code 1
        ("agent_message", "The floor division drops the last partial page; use ceiling division."),
        ("tool_call", "str_replace_editor"),
        ("tool_result", True),
        ("agent_message", "Let me also cover an empty pager."),
        ("tool_call", "str_replace_editor"),
        ("tool_result", False),  # an error observation
        ("tool_call", "execute_ipython_cell"),
        ("tool_result", False),  # a traceback, though upstream calls every cell a success
        ("tool_call", "execute_bash"),
        ("tool_result", True),
        ("agent_message", "The fix is in place: page_count() now rounds up, and the pager tests pass."),
        ("user_message", "Please continue working on the task on w"),
        ("agent_message", "Pager.page_count() now uses ceiling division, so 10 items in pages of 3 give 4 pages."),
        ("session_end", "success"),
    ]
    calls = [e["payload"] for e in events if e["type"] == "tool_call"]
    assert calls[0] == {
        "tool": "execute_bash",
        "call_id": "toolu_01FindPagerModule0001",
        "args": {"command": f"find {REPO} -name '*.py' | grep -i pager"},
    }
    assert calls[3] == {
        "tool": "str_replace_editor",
        "call_id": "toolu_01EditPager00000000004",
        "args": {
            "path": f"{REPO}/src/widgets/pager.py",
            "command": "str_replace",
            "old_str": "        return self.count // self.size",
            "new_str": "        return -(-self.count // self.size)",
            "start": 1,
            "end": -1,
        },
    }
    assert calls[5]["args"] == {"code": "from widgets.pager import Pager\nPager(10, 3).page_count()"}
    got = calls_and_results(events)
    assert got[2] == ("execute_bash", False, "exit code 1: 1 failed, 1 passed in 0.05s")
    assert got[4] == (
        "str_replace_editor",
        False,
        "ERROR:\nNo replacement was performed, old_str `assert Pager(9, 3).page_count() == 3` did not appear "
        f"verbatim in {REPO}/tests/test_pager.py.",
    )
    assert got[5] == ("execute_ipython_cell", False, "ModuleNotFoundError: No module named 'widgets'")
    results = [e["payload"] for e in events if e["type"] == "tool_result"]
    assert results[0] == {
        "call_id": "toolu_01FindPagerModule0001",
        "tool": "execute_bash",
        "ok": True,
        "output": f"{REPO}/src/widgets/pager.py\n{REPO}/tests/test_pager.py",
    }
    assert events[-1]["payload"] == {"outcome": "success", "reason": "the agent finished: task completed"}


def test_an_older_run_of_action_observation_pairs():
    events = by_session(list(openhands(OUTPUT)))["acme__widgets-402"]
    assert events[0]["payload"]["task"] == _lines()[1]["instruction"][:500]
    assert events[0]["payload"]["metadata"]["model"] == "gpt-4o-2024-05-13"
    assert events[0]["ts"] == "2024-06-20T09:15:00.118732Z"
    assert _shape(events) == [
        ("session_start", None),
        ("agent_message", "Let me look at the package first."),
        ("tool_call", "run"),  # no tool_call_metadata: the action's kind
        ("tool_result", True),
        ("agent_message", "The last page is read without a check; guard it."),
        ("tool_call", "run_ipython"),
        ("tool_result", False),
        ("tool_call", "run"),
        ("tool_result", False),
        ("agent_message", "I could not find where the pages list is built."),
        ("session_end", "failure"),
    ]
    assert [e["payload"]["call_id"] for e in events if e["type"] == "tool_call"] == ["2", "4", "6"]  # the event ids
    got = calls_and_results(events)
    assert got[1][2].startswith("ERROR: `to_replace` must not be empty")  # agentskills' error (swe_failure)
    assert got[2] == ("run", False, "exit code 1: 1 failed, 2 passed in 0.07s")  # extras.exit_code
    assert events[-1]["payload"] == {
        "outcome": "failure",
        "reason": "error: Agent reached maximum iteration in headless mode. Current iteration: 30, max iteration: 30",
    }


def test_a_saved_session_with_a_delegation():
    events = list(openhands(SESSION))
    assert_all_decode(events)
    assert events[0]["payload"] == {
        "task": "Summarize the open bugs of acme/widgets.",
        "metadata": {"instance_id": "bugs-session"},
    }
    assert _shape(events) == [
        ("session_start", None),
        ("agent_message", "The browsing agent can read the issue list; I will delegate."),  # think
        ("delegation", "BrowsingAgent"),
        ("delegation_result", "success"),
        ("agent_message", "Let me read #15 for details."),
        ("tool_call", "web_read"),
        ("tool_result", False),  # extras.error
        ("agent_message", "There are two open bugs: #12 (Pager off by one) and #15 (a crash on an empty list)."),
        ("agent_message", "Two open bugs: #12 and #15; I could not open #15 for details."),
        ("session_end", "partial"),
    ]
    assert events[2]["payload"] == {
        "to_agent": "BrowsingAgent",
        "task": "Open https://github.com/acme/widgets/issues?q=is%3Aopen+label%3Abug and list the open issues.",
        "delegation_id": "toolu_01Delegate00000000000002",
    }
    assert events[3]["payload"]["summary"] == (
        "BrowsingAgent finishes task with content: #12 Pager off by one; #15 Crash on an empty list"
    )
    assert events[6]["payload"]["error"] == "Timeout 30000ms exceeded."
    assert events[-1]["payload"] == {
        "outcome": "partial",
        "reason": "the agent finished (task_completed partial); resolution unknown (no --results)",
    }


# ---- outcomes ----------------------------------------------------------------------------------


def _outcome_of(tmp_path: Path, item: dict[str, Any], run: ImportRun | None = None) -> tuple[str, str]:
    events = list(openhands(write(tmp_path, "output.jsonl", item), run=run))
    assert_all_decode(events)
    end = events[-1]["payload"]
    return end["outcome"], end["reason"]


def test_the_results_file_comes_first(tmp_path: Path):
    item = _lines()[0]
    item["report"] = {"resolved": True}
    run = ImportRun(results={"acme__widgets-401": "failure"})
    assert _outcome_of(tmp_path, item, run) == ("failure", "not resolved per the results file")


@pytest.mark.parametrize(
    ("where", "value", "expected"),
    [
        ("report", {"resolved": True}, ("success", "resolved (report.resolved)")),
        ("resolved", False, ("failure", "not resolved (resolved)")),
        ("test_result", {"git_patch": "", "resolved": True}, ("success", "resolved (test_result.resolved)")),
        ("test_result", {"report": {"resolved": False}}, ("failure", "not resolved (test_result.report.resolved)")),
    ],
)
def test_the_instance_s_own_resolution_comes_before_what_the_agent_said(tmp_path: Path, where, value, expected):
    item = {**_lines()[0], where: value}  # the agent said task_completed "true"
    assert _outcome_of(tmp_path, item) == expected


def test_an_error_fails_the_session_and_is_its_reason(tmp_path: Path):
    item = {**_lines()[0], "error": "RuntimeError: Agent got stuck in a loop"}
    assert _outcome_of(tmp_path, item) == ("failure", "error: RuntimeError: Agent got stuck in a loop")


@pytest.mark.parametrize(
    ("completed", "expected"),
    [
        ("true", ("success", "the agent finished: task completed")),
        ("false", ("failure", "the agent finished: task not completed")),
        ("partial", ("partial", "the agent finished (task_completed partial); resolution unknown (no --results)")),
        (None, ("partial", "the agent finished; resolution unknown (no --results)")),
    ],
)
def test_the_finish_action_says_whether_the_task_was_completed(tmp_path: Path, completed, expected):
    item = _lines()[0]
    finish = next(e for e in item["history"] if e.get("action") == "finish")
    finish["args"]["task_completed"] = completed
    assert _outcome_of(tmp_path, item) == expected


def test_without_a_finish_the_outcome_is_partial_and_unanswered_calls_fail(tmp_path: Path):
    item = _lines()[0]
    item["history"] = item["history"][:5]  # up to the first command, without its observation
    events = list(openhands(write(tmp_path, "output.jsonl", item)))
    assert calls_and_results(events) == [("execute_bash", False, "no observation recorded")]
    assert events[-1]["payload"] == {
        "outcome": "partial",
        "reason": "the agent did not finish; resolution unknown (no --results)",
    }


def test_a_rejected_task_fails(tmp_path: Path):
    item = {
        "instance_id": "r",
        "history": [{"id": 1, "action": "reject", "source": "agent", "args": {"outputs": {"reason": "No repo."}}}],
    }
    events = list(openhands(write(tmp_path, "output.jsonl", item)))
    assert _shape(events)[1:] == [("agent_message", "No repo."), ("session_end", "failure")]
    assert events[-1]["payload"]["reason"] == "the agent rejected the task"


# ---- results and times -------------------------------------------------------------------------


def _one_command(tmp_path: Path, **observation: Any) -> dict[str, Any]:
    history = [
        {"id": 1, "action": "run", "source": "agent", "args": {"command": "sleep 999", "thought": ""}},
        {"id": 2, "cause": 1, "observation": "run", "source": "agent", "content": "", **observation},
    ]
    events = list(openhands(write(tmp_path, "t.json", history)))
    assert_all_decode(events)
    return next(e["payload"] for e in events if e["type"] == "tool_result")


def test_a_command_that_timed_out_fails_with_what_openhands_said(tmp_path: Path):
    suffix = (
        "\n[The command timed out after 120.0 seconds. You may wait longer to see additional output by sending "
        "empty command '', send other commands to interact with the current process, or send keys to interrupt/kill "
        "the command.]"
    )
    got = _one_command(tmp_path, extras={"metadata": {"exit_code": -1, "suffix": suffix}}, success=False)
    assert got["error"] == "The command timed out after 120.0 seconds."
    assert got["ok"] is False


def test_a_command_without_an_exit_code_fails_on_what_its_output_shows(tmp_path: Path):
    got = _one_command(tmp_path, content="/bin/bash: line 1: javac: command not found", extras={})
    assert got["error"] == "/bin/bash: line 1: javac: command not found"
    assert _one_command(tmp_path, content="done", extras={})["ok"] is True


def test_output_is_cut_to_max_output(tmp_path: Path):
    got = _one_command(tmp_path, content="x" * (MAX_OUTPUT * 3), extras={"metadata": {"exit_code": 0}})
    assert got["output"] == "x" * MAX_OUTPUT


def test_pairs_without_ids_are_matched_by_their_pair(tmp_path: Path):
    history = [
        [
            {"action": "run", "args": {"command": "ls"}},
            {"observation": "run", "content": "a", "extras": {"exit_code": 0}},
        ],
        [
            {"action": "run", "args": {"command": "false"}},
            {"observation": "run", "content": "", "extras": {"exit_code": 1}},
        ],
    ]
    events = list(openhands(write(tmp_path, "output.jsonl", {"instance_id": "p", "history": history})))
    assert_all_decode(events)
    assert calls_and_results(events) == [("run", True, None), ("run", False, "exit code 1")]
    assert [e["payload"]["call_id"] for e in events if e["type"] == "tool_call"] == ["event-0", "event-2"]
    assert [e["ts"] for e in events][:2] == ["2024-05-15T20:00:00Z", "2024-05-15T20:00:05Z"]  # the run's clock


def test_a_malformed_timestamp_is_ignored(tmp_path: Path):
    history = [
        {"id": 1, "timestamp": "yesterday", "source": "user", "action": "message", "args": {"content": "hi"}},
        {
            "id": 2,
            "timestamp": "2025-01-01T10:00:00",
            "source": "agent",
            "action": "message",
            "args": {"content": "ok"},
        },
    ]
    events = list(openhands(write(tmp_path, "s.json", history)))
    assert [e["ts"] for e in events] == ["2025-01-01T10:00:00Z", "2025-01-01T10:00:05Z", "2025-01-01T10:00:07Z"]


def test_unknown_kinds_are_skipped(tmp_path: Path):
    history = [
        {"id": 1, "source": "user", "action": "message", "args": {"content": "go"}},
        {"id": 2, "source": "agent", "action": "teleport", "args": {"to": "mars"}},
        {"id": 3, "cause": 2, "observation": "teleported", "content": "done", "extras": {}},
        {"id": 4, "source": "agent", "action": "condensation", "args": {"forgotten_event_ids": [1]}},
    ]
    events = list(openhands(write(tmp_path, "s.json", history)))
    assert _shape(events) == [("session_start", None), ("session_end", "partial")]


# ---- shapes ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("history", "named"),
    [
        ({"events": []}, "item 1: field 'history' must be a list of events"),
        ([7], "item 1: history[0]: an event must be an object, got int"),
        ([[{"action": "run"}]], "item 1: history[0]: a pair must be [action, observation]"),
        ([{"id": 1, "action": "run", "args": "ls"}], "item 1: history[0]: field 'args' must be an object"),
        ([{"id": 1, "action": 5}], "item 1: history[0]: field 'action' must be a string"),
        ([{"observation": "run", "cause": {"id": 1}}], "item 1: history[0]: field 'cause': must be a string"),
    ],
)
def test_an_instance_of_the_wrong_shape_is_named_and_the_others_imported(tmp_path: Path, history, named):
    good = _lines()[0]
    lines = [good, {"instance_id": "bad", "history": history}, {**good, "instance_id": "also-good"}]
    path = tmp_path / "output.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    run = ImportRun()
    events = list(openhands(path, run=run))
    assert set(by_session(events)) == {"acme__widgets-401", "also-good"}
    assert len(run.problems) == 1 and named in run.problems[0], run.problems
    with pytest.raises(ImportShapeError, match="item 1"):
        list(openhands(path))


def test_an_instance_without_a_history_is_named(tmp_path: Path):
    with pytest.raises(ImportShapeError, match="item 0: field 'history' must be a list of events"):
        list(openhands(write(tmp_path, "x.json", {"messages": []})))


def test_an_instance_that_errored_before_its_history_is_a_failed_session(tmp_path: Path):
    item = {"instance_id": "e", "test_result": {}, "history": None, "error": "Maximum retries (5) reached: boom"}
    events = list(openhands(write(tmp_path, "output.jsonl", item)))
    assert _shape(events) == [("session_start", None), ("session_end", "failure")]
    assert events[-1]["payload"]["reason"] == "error: Maximum retries (5) reached: boom"
