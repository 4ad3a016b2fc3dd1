"""``somnus goal set | done | list`` and ``somnus wander`` (somnus/cli/goals.py): the events they
publish (no broker: the publisher is replaced), and the reads from a projected file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest
from typer.testing import CliRunner

import somnus.cli  # noqa: F401  (registers every command)
from somnus import memory_requests
from somnus.cli.app import app
from somnus.schemas.goals import KIND_GOAL_CLOSED, KIND_GOAL_SET, GoalClosed, GoalSet, GoalStatus


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, list[Any]]]:
    out: list[tuple[str, list[Any]]] = []
    from somnus import client

    monkeypatch.setattr(memory_requests, "_send", lambda bootstrap, topic, records: out.append((topic, records)))

    def sealed(
        key: bytes | None,
        value: bytes,
        headers: list[tuple[str, bytes]],
        bootstrap: str,
        topic: str,
        keys_topic: str,
        subject: tuple[str, str],
        user_id: str | None,
        partition: int | None = None,
    ) -> None:
        assert subject[1].startswith("goal:") and keys_topic != topic  # a goal's own data key (forget)
        out.append((topic, [(key, value, dict(headers)[memory_requests.KIND])]))

    monkeypatch.setattr(client, "publish_sealed", sealed)
    return out


def test_goal_set_and_done_publish_their_events_on_the_memory_topic(tmp_path: Path, sent: list[Any]) -> None:
    args = ["--home", str(tmp_path), "--bootstrap", "127.0.0.1:1", "--at", "2024-05-01T10:00:00Z"]
    run = CliRunner().invoke(
        app, ["goal", "set", "ship the refund flow", "--agent", "support", "--user", "u1", "--id", "g7", *args]
    )
    assert run.exit_code == 0, run.output
    assert "goal g7 set for support at 2024-05-01T10:00:00+00:00" in run.output
    run = CliRunner().invoke(app, ["goal", "done", "g7", "--agent", "support", "--dropped", *args])
    assert run.exit_code == 0, run.output
    (topic, [(key, value, kind)]), (_, [(_, closed, closed_kind)]) = sent
    assert topic.endswith("memory") and key == b"support" and kind == KIND_GOAL_SET
    goal = msgspec.json.decode(value, type=GoalSet)
    assert (goal.goal_id, goal.agent, goal.text, goal.user_id, goal.set_by) == (
        "g7",
        "support",
        "ship the refund flow",
        "u1",
        "somnus goal",
    )
    assert closed_kind == KIND_GOAL_CLOSED
    assert msgspec.json.decode(closed, type=GoalClosed).status is GoalStatus.DROPPED


def test_a_goal_must_be_a_sentence(tmp_path: Path, sent: list[Any]) -> None:
    run = CliRunner().invoke(
        app, ["goal", "set", "x" * 501, "--agent", "a", "--home", str(tmp_path), "--at", "2024-05-01T10:00:00Z"]
    )
    assert run.exit_code == 1 and not sent


def test_goal_list_and_wander_read_a_projected_file(tmp_path: Path) -> None:
    from tests.projections.test_goals import project, stream

    con, _ = project(tmp_path, "g.duckdb", [stream()])
    con.close()
    db = ["--db", str(tmp_path / "g.duckdb"), "--home", str(tmp_path)]
    run = CliRunner().invoke(app, ["goal", "list", "--agent", "a", "--all", "--json", *db])
    assert run.exit_code == 0, run.output
    got = json.loads(run.output)["goals"]
    assert [(g["goal_id"], g["status"], g["nearest_id"]) for g in got] == [("g1", "done", "m3")]
    run = CliRunner().invoke(app, ["wander", "--agent", "a", "--seed", "1", "--json", *db])
    assert run.exit_code == 0, run.output
    steps = json.loads(run.output)["steps"]
    assert sorted(s["memory_id"] for s in steps) == ["m1", "m2", "m3"] and steps[0]["hop"] == "start"
    run = CliRunner().invoke(app, ["wander", "--agent", "a", "--seed", "1", *db])
    assert run.exit_code == 0 and "wander for a (seed 1)" in run.output
