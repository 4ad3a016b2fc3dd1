"""``somnus import``: a bad file or line among good ones is reported, and the good ones are imported."""

from __future__ import annotations

from pathlib import Path

import orjson
from typer.testing import CliRunner

from somnus.cli import app


def test_a_bad_file_or_line_is_reported_and_the_good_ones_are_imported(tmp_path: Path) -> None:
    """Before, the first bad item stopped the import: the files after it were never read."""
    good = {"reward": 1.0, "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}]}
    (tmp_path / "a.json").write_bytes(orjson.dumps([{**good, "id": "a1"}, {"messages": None}, {**good, "id": "a2"}]))
    (tmp_path / "b.json").write_bytes(b"[" * 100_000 + b"]" * 100_000)
    (tmp_path / "c.jsonl").write_bytes(
        orjson.dumps({**good, "id": "c1"}) + b"\n{bad\n" + orjson.dumps({**good, "id": "c2"}) + b"\n"
    )
    out = tmp_path / "out.jsonl"
    got = CliRunner().invoke(
        app,
        [
            "import",
            "--format",
            "openai-chat",
            "--agent",
            "a",
            "--out",
            str(out),
            "--home",
            str(tmp_path / "home"),
            str(tmp_path),
        ],
    )
    assert got.exit_code == 1, got.output
    sessions = {orjson.loads(line)["session_id"] for line in out.read_bytes().splitlines()}
    assert sessions == {"a-a1", "a-a2", "c-c1", "c-c2"}  # a bad item loses only itself
    assert "a.json: item 1: no 'messages'" in got.output and "this item is left out" in got.output
    assert "b.json: line 1 is not JSON (depth limit exceeded" in got.output
    assert "c.jsonl: line 2 is not JSON" in got.output and "Traceback" not in got.output


def test_an_event_over_the_pipelines_limit_is_reported_and_left_out(tmp_path: Path) -> None:
    """A 50 MB message became one 50 MB event: over the producer's 8 MiB, it stopped the import."""
    item = {
        "id": "big",
        "reward": 1.0,
        "messages": [{"role": "user", "content": "x" * 2_000_000}, {"role": "assistant", "content": "ok"}],
    }
    (tmp_path / "big.json").write_bytes(orjson.dumps([item]))
    out = tmp_path / "out.jsonl"
    got = CliRunner().invoke(
        app,
        [
            "import",
            "--format",
            "openai-chat",
            "--out",
            str(out),
            "--home",
            str(tmp_path / "home"),
            str(tmp_path / "big.json"),
        ],
    )
    assert got.exit_code == 1, got.output
    assert "session 'big-big' event 1 (user_message) is 2000" in got.output and "left out" in got.output
    assert [orjson.loads(line)["type"] for line in out.read_bytes().splitlines()] == [
        "session_start",
        "agent_message",
        "session_end",
    ]
