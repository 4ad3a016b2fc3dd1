"""mini-swe-agent trajectories (``.traj.json``) read by ``somnus import --format swe-agent``.

Fixtures (tests/fixtures/mini_swe_agent, shapes from the mini-swe-agent packages, see its README): a
SWE-bench batch run's directory, one ``<instance_id>/<instance_id>.traj.json`` per instance and a
``preds.json``. acme__widgets-301 is a 1.x text-based run ("mini-swe-agent-1", ```bash blocks, per
message ``timestamp``): a format error (two actions), a traceback (returncode 1), 1.x's timeout
template, then a fix and a submitted patch. acme__widgets-302 is a 2.x text-based run
("mini-swe-agent-1.1", ```mswea_bash_command, ``extra``) that hits its step limit after a format error
and a failing ``git log``. acme__widgets-303 is a 2.x tool-call run (``tool_calls``, ``role: tool``
results, two parallel calls, a timeout as ``exception_info``) that submits through a ``role: exit``
message.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from somnus.importers import ImportRun, ImportShapeError, expand_paths, import_files, import_run, swe_agent
from somnus.importers.mini_swe_agent import mini_command, mini_observation, mini_task, mini_tool
from tests.somnus.test_importers import assert_all_decode, by_session, calls_and_results, write

MINI = Path(__file__).resolve().parents[1] / "fixtures" / "mini_swe_agent"
RUN_301, RUN_302, RUN_303 = (MINI / f"acme__widgets-{n}" / f"acme__widgets-{n}.traj.json" for n in (301, 302, 303))


def test_a_directory_of_a_batch_run_imports_its_trajectories_and_not_preds_json():
    files = expand_paths([MINI], "swe-agent")
    assert files == [RUN_301, RUN_302, RUN_303]  # .traj.json picked up; preds.json and README.md not
    run = ImportRun()
    events = list(import_files(files, "swe-agent", run=run))
    assert_all_decode(events)
    assert run.problems == [] and run.skipped == []
    assert set(by_session(events)) == {"acme__widgets-301", "acme__widgets-302", "acme__widgets-303"}
    assert {e["agent"] for e in events} == {"mini-swe-agent"}


def test_preds_json_given_by_name_is_skipped_with_a_note():
    run = ImportRun()
    assert list(import_files([MINI / "preds.json"], "swe-agent", run=run)) == []
    assert run.problems == []
    assert len(run.skipped) == 1 and "preds.json: a predictions file" in run.skipped[0]


def test_a_1x_text_based_run_as_the_run_it_records():
    source = json.loads(RUN_301.read_bytes())
    events = list(swe_agent(RUN_301))
    assert_all_decode(events)
    start = events[0]["payload"]
    assert start["task"] == (
        "Pager.page_count() is one short when the item count is not a multiple of the page size.\n"
        "With 10 items and size 3 it returns 3; it should return 4."
    )
    assert start["metadata"] == {
        "instance_id": "acme__widgets-301",
        "exit_status": "Submitted",
        "trajectory_format": "mini-swe-agent-1",
        "mini_version": "1.17.5",
        "format_errors": 1,
    }
    got = calls_and_results(events)
    assert [(t, ok) for t, ok, _ in got] == [
        ("grep", True),
        ("cat", False),  # the traceback, returncode 1
        ("python", True),  # PYTHONPATH=src python reproduce.py
        ("python", False),  # cd /testbed && python -m pytest: timed out
        ("sed", True),
        ("python", True),
        ("echo", True),  # the submission
    ]
    assert got[1][2].startswith("returncode 1: Traceback (most recent call last):")
    assert got[1][2].endswith("ModuleNotFoundError: No module named 'widgets'")
    assert got[3][2] == (
        "The last command <command>cd /testbed && python -m pytest tests/ -x</command> timed out and has been killed."
    )
    results = [e["payload"] for e in events if e["type"] == "tool_result"]
    assert results[-1]["output"] == source["info"]["submission"]
    assert results[2]["output"] == "3\n"  # the <output> of the template, not the template
    thoughts = [e["payload"]["text"] for e in events if e["type"] == "agent_message"]
    assert thoughts[0] == "Let me find where the pager is defined."  # without THOUGHT: and the block
    assert thoughts[1] == "I will write a reproduction script and run it."  # the rejected response's reasoning
    assert not any("```" in t for t in thoughts)
    calls = [e["payload"] for e in events if e["type"] == "tool_call"]
    assert calls[0]["args"] == {"command": 'grep -rn "def page_count" src/'}
    assert events[-1]["payload"] == {
        "outcome": "partial",
        "reason": "exit_status Submitted; patch submitted, resolution unknown (no --results)",
    }
    assert events[0]["ts"] == "2025-11-27T08:00:04.500000Z"  # the first message's timestamp
    times = [e["ts"] for e in events]
    assert times == sorted(times) and len(set(times)) == len(times)


def test_a_2x_text_based_run_that_hit_its_limits():
    events = list(swe_agent(RUN_302))
    assert_all_decode(events)
    assert events[0]["payload"]["task"] == "Widget.render() double-escapes HTML entities in labels."
    assert events[0]["payload"]["metadata"]["format_errors"] == 1
    got = calls_and_results(events)
    assert got == [
        ("grep", True, None),
        ("nl", True, None),  # numbered source lines are never errors
        ("git", False, "returncode 128: fatal: file src/widgets/base.py has only 60 lines"),
    ]
    thoughts = [e["payload"]["text"] for e in events if e["type"] == "agent_message"]
    assert "The label is escaped twice; I should remove one escape call." in thoughts  # extra.model_response
    assert events[-1]["payload"] == {"outcome": "failure", "reason": "exit_status LimitsExceeded; no patch"}


def test_a_2x_tool_call_run_with_parallel_calls_and_a_timeout():
    events = list(swe_agent(RUN_303))
    assert_all_decode(events)
    calls = [e["payload"] for e in events if e["type"] == "tool_call"]
    assert [c["call_id"] for c in calls] == [f"toolu_01Acme303{n:04d}" for n in range(1, 6)]
    assert calls[1] == {"tool": "ls", "call_id": "toolu_01Acme3030002", "args": {"command": "ls tests/ | grep cache"}}
    got = calls_and_results(events)
    assert got == [
        ("cat", True, None),
        ("ls", False, "returncode 1"),
        (
            "python",
            False,
            "returncode -1: An error occurred while executing the command: "
            "Command 'python -m pytest -q' timed out after 60 seconds",
        ),
        ("sed", True, None),
        ("echo", True, None),
    ]
    results = {e["payload"]["call_id"]: e["payload"] for e in events if e["type"] == "tool_result"}
    assert results["toolu_01Acme3030001"]["output"] == "class Cache:\n    ttl = 0\n"  # extra.raw_output
    assert results["toolu_01Acme3030005"]["output"].startswith("diff --git a/src/widgets/cache.py")  # role exit
    assert "format_errors" not in events[0]["payload"]["metadata"]
    assert events[-1]["payload"]["outcome"] == "partial"


def test_outcomes_from_a_results_file_by_instance_id(tmp_path):
    results = write(tmp_path, "results.json", {"resolved": ["acme__widgets-301"], "unresolved": ["acme__widgets-303"]})
    events = list(import_files(expand_paths([MINI], "swe-agent"), "swe-agent", run=import_run(results=results)))
    ends = {e["session_id"]: e["payload"] for e in events if e["type"] == "session_end"}
    assert ends == {
        "acme__widgets-301": {"outcome": "success", "reason": "exit_status Submitted; resolved per the results file"},
        "acme__widgets-302": {"outcome": "failure", "reason": "exit_status LimitsExceeded; no patch"},
        "acme__widgets-303": {
            "outcome": "failure",
            "reason": "exit_status Submitted; not resolved per the results file",
        },
    }


def mini(messages: list[Any], **info: Any) -> dict[str, Any]:
    return {
        "info": {"exit_status": "Submitted", "submission": "", **info},
        "messages": [{"role": "system", "content": "sys"}, {"role": "user", "content": "Do X", "extra": {}}, *messages],
        "trajectory_format": "mini-swe-agent-1.1",
    }


def test_the_session_is_named_by_the_file_without_traj_json_and_the_run_ending_closes_open_calls(tmp_path):
    data = mini(
        [
            {
                "role": "assistant",
                "content": "```mswea_bash_command\nmake\n```",
                "extra": {"actions": [{"command": "make"}]},
            }
        ],
        exit_status="RuntimeError",
    )
    events = list(swe_agent(write(tmp_path, "django__django-1.traj.json", data)))
    assert_all_decode(events)
    assert events[0]["session_id"] == "django__django-1" and events[0]["payload"]["task"] == "Do X"
    assert calls_and_results(events) == [
        ("make", False, "no observation recorded (the run ended: exit_status RuntimeError)")
    ]
    assert events[-1]["payload"] == {"outcome": "failure", "reason": "exit_status RuntimeError; no patch"}


def test_detection_without_a_trajectory_format_and_a_humans_message(tmp_path):
    data = mini(
        [
            {"role": "assistant", "content": "Look.\n```bash\nls\n```"},
            {"role": "user", "content": "<returncode>0</returncode>\n<output>\na.py\n</output>"},
            {"role": "user", "content": "Please also check b.py"},  # interactive mode: the human's word
        ],
        exit_status="",
    )
    del data["trajectory_format"]
    events = list(swe_agent(write(tmp_path, "t.traj.json", data)))
    assert [e["type"] for e in events] == [
        "session_start",
        "agent_message",
        "tool_call",
        "tool_result",
        "user_message",
        "session_end",
    ]
    assert events[3]["payload"]["output"] == "a.py\n"
    assert events[-1]["payload"] == {"outcome": "partial", "reason": "the trajectory has no info.exit_status"}


def test_interactive_runs_a_humans_command_and_interruption(tmp_path):
    data = mini(
        [
            {
                "role": "assistant",
                "content": "Run it.",
                "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "bash", "arguments": "{}"}}],
            },
            {"role": "user", "content": "Interrupted by user: stop", "extra": {"interrupt_type": "UserInterruption"}},
            {
                "role": "user",
                "content": "User command: \n```bash\ngit status\n```",
                "extra": {"actions": [{"command": "git status"}]},
            },
            {
                "role": "user",
                "content": "<returncode>0</returncode>\n<output>\nclean\n</output>",
                "extra": {"returncode": 0},
            },
            {
                "role": "user",
                "content": "Tool call error:\n\n<error>\nUnknown tool 'python'.\n</error>",
                "extra": {
                    "interrupt_type": "FormatError",
                    "response": {"choices": [{"message": {"content": "THOUGHT: use python", "tool_calls": []}}]},
                },
            },
        ]
    )
    events = list(swe_agent(write(tmp_path, "i.traj.json", data)))
    assert_all_decode(events)
    assert calls_and_results(events) == [("bash", False, "interrupted (UserInterruption)"), ("git", True, None)]
    said = [(e["type"], e["payload"]["text"]) for e in events if e["type"] in ("user_message", "agent_message")]
    assert said == [
        ("agent_message", "Run it."),
        ("user_message", "Interrupted by user: stop"),
        ("agent_message", "use python"),  # the reasoning of the response the format error rejected
    ]
    assert events[0]["payload"]["metadata"]["format_errors"] == 1


def test_a_responses_api_run(tmp_path):
    """2.x with a Responses API model (models/litellm_response_model.py, actions_toolcall_response.py):
    the response object is the assistant's message, function_call_output items are its results."""
    response = {
        "id": "resp_1",
        "object": "response",
        "status": "completed",
        "output": [
            {"type": "reasoning", "id": "rs_1", "summary": []},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "List files."}]},
            {"type": "function_call", "call_id": "call_a", "name": "bash", "arguments": '{"command": "ls -a"}'},
        ],
        "extra": {"actions": [{"command": "ls -a", "tool_call_id": "call_a"}], "cost": 0.01, "timestamp": 1764230400.0},
    }
    result = {
        "type": "function_call_output",
        "call_id": "call_a",
        "output": "<returncode>2</returncode>\n<output>\nls: cannot access 'x': No such file or directory\n</output>",
        "extra": {"raw_output": "ls: cannot access 'x': No such file or directory\n", "returncode": 2},
    }
    rejected = {
        "type": "message",
        "role": "user",
        "content": [{"type": "input_text", "text": "Tool call error:\n\n<error>\nNo tool calls found.\n</error>"}],
        "extra": {
            "interrupt_type": "FormatError",
            "response": {"output": [{"type": "message", "content": [{"type": "output_text", "text": "I am done."}]}]},
        },
    }
    events = list(swe_agent(write(tmp_path, "r.traj.json", mini([response, result, rejected]))))
    assert_all_decode(events)
    assert calls_and_results(events) == [
        ("ls", False, "returncode 2: ls: cannot access 'x': No such file or directory")
    ]
    said = [e["payload"]["text"] for e in events if e["type"] == "agent_message"]
    assert said == ["List files.", "I am done."]
    with pytest.raises(ImportShapeError, match=r"messages\[2\]: field 'output' must be a list"):
        list(swe_agent(write(tmp_path, "bad.traj.json", mini([{"object": "response", "output": "ls"}]))))


@pytest.mark.parametrize(
    ("content", "extra", "expected"),
    [
        ("<returncode>0</returncode>\n<output>\nok\n</output>", {}, (None, "ok\n")),
        (
            "<returncode>2</returncode>\n<output>\nls: cannot access 'x': No such file or directory\n</output>",
            {},
            ("returncode 2: ls: cannot access 'x': No such file or directory", None),
        ),
        ("<returncode>1</returncode>\n<output>\n</output>", {}, ("returncode 1", None)),
        ("ignored", {"returncode": 0, "raw_output": "raw"}, (None, "raw")),
        (
            "<returncode>0</returncode>\n<warning>\ntoo long\n</warning><output_head>\nhead\n</output_head>\n"
            "<elided_chars>\n9 characters elided\n</elided_chars>\n<output_tail>\ntail\n</output_tail>",
            {},
            (None, "head\n…\ntail\n"),
        ),
        ("bash: foo: command not found", {}, ("bash: foo: command not found", None)),  # a template without returncode
    ],
)
def test_observations(content, extra, expected):
    assert mini_observation(content, extra) == expected


def test_commands_tools_and_tasks():
    assert mini_command("THOUGHT: x\n```bash\nls\n```") == ("x", "ls")
    assert mini_command("<mswea_bash_command>ls -la</mswea_bash_command>") == ("", "ls -la")
    assert mini_command("no action at all") is None
    assert mini_tool("A=1 B='x y' pytest -q") == "pytest" and mini_tool("cd /testbed && cd src && ls") == "ls"
    assert mini_task("Just a task") == "Just a task"


def test_a_bad_item_is_named_and_the_rest_imported(tmp_path):
    good = mini([], instance_id="good")
    bad = mini([{"role": "assistant", "content": "x", "tool_calls": "bash"}], instance_id="bad")
    run = ImportRun()
    events = list(swe_agent(write(tmp_path, "batch.json", [bad, good]), run=run))
    assert set(by_session(events)) == {"good"}
    assert run.problems == ["batch.json: item 0: messages[2]: field 'tool_calls' must be a list: this item is left out"]


@pytest.mark.parametrize(
    ("data", "names"),
    [
        ({"trajectory_format": "mini-swe-agent-1", "messages": {"role": "user"}}, ["item 0", "field 'messages'"]),
        ({"trajectory_format": "mini-swe-agent-1", "messages": [], "info": []}, ["field 'info'"]),
        ({"trajectory_format": "mini-swe-agent-1", "messages": ["hi"]}, ["messages[0]", "'role'"]),
        ({"trajectory_format": 1.1, "messages": [], "info": {}}, ["field 'trajectory_format'"]),
        ({"trajectory_format": "mini-swe-agent-1", "messages": [], "info": {"exit_status": 0}}, ["'info.exit_status'"]),
        ({"trajectory_format": "mini-swe-agent-1", "messages": [], "info": {"submission": 3}}, ["'info.submission'"]),
        (
            {"trajectory_format": "mini-swe-agent-1.1", "messages": [{"role": "user", "content": "", "extra": "x"}]},
            ["messages[0]", "field 'extra'"],
        ),
        (
            {"trajectory_format": "mini-swe-agent-1", "messages": [{"role": "user", "timestamp": "noon"}]},
            ["messages[0]", "field 'timestamp'"],
        ),
        (
            {
                "trajectory_format": "mini-swe-agent-1.1",
                "messages": [{"role": "assistant", "content": "", "tool_calls": [{"id": "a", "function": "bash"}]}],
            },
            ["messages[0]", "tool_calls[0]", "field 'function'"],
        ),
        (
            {
                "trajectory_format": "mini-swe-agent-1.1",
                "messages": [{"role": "assistant", "tool_calls": [{"id": {}, "function": {"name": "bash"}}]}],
            },
            ["tool_calls[0]", "field 'id'"],
        ),
        ({"messages": []}, ["item 0", "'trajectory'", "mini-swe-agent"]),  # messages without info: not detected
    ],
)
def test_unknown_shapes_name_the_field(tmp_path, data, names):
    with pytest.raises(ImportShapeError) as info:
        list(swe_agent(write(tmp_path, "x.traj.json", data)))
    for name in names:
        assert name in str(info.value), str(info.value)
