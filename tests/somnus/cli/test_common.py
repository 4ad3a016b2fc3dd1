"""somnus.cli: what a person sees (the context footer) and when their commands happen (event time)."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import pytest
from typer.testing import CliRunner

from somnus import cli
from somnus.cli import common


@pytest.mark.parametrize("text", ["## Relevant memory\n- [episodic] refund order 1042", "## Relevant memory\n- x\n"])
def test_the_context_footer_is_a_line_of_its_own_after_the_text(monkeypatch, tmp_path, text):
    import somnus.reads

    monkeypatch.setattr(
        somnus.reads, "read", lambda *a, **k: {"text": text, "tokens": 9, "max_tokens": 100, "session_id": None}
    )
    got = CliRunner().invoke(cli.app, ["context", "refund", "--agent", "support", "--home", str(tmp_path)])
    assert got.exit_code == 0, got.output
    assert got.stdout.endswith("\n") and got.stdout.rstrip("\n") == text.rstrip("\n")
    assert got.output == got.stdout + "9 of 100 tokens; session None\n"


def test_a_command_is_stamped_with_its_scopes_stream_time_unless_at_is_given(monkeypatch, tmp_path):
    import somnus.reads

    asked: list[dict[str, Any]] = []

    def read(db: Any, handler: str, agent: Any = None, agents_dir: Any = None, **params: Any) -> dict[str, Any]:
        asked.append({"handler": handler, **params})
        return {"scope": params["scope"], "at": "2024-05-17T05:10:46+00:00" if params["scope"] != "team:x" else None}

    monkeypatch.setattr(somnus.reads, "read", read)
    s = common.settings(tmp_path)
    before = datetime.now(timezone.utc)
    assert common.event_time(s, None, "global") >= before and asked == []  # no database yet: no event, the wall clock
    s.db_path.write_bytes(b"")  # (read is stubbed: only its existence matters)
    assert common.event_time(s, None, "agent:airline") == datetime(2024, 5, 17, 5, 10, 46, tzinfo=timezone.utc)
    assert asked == [{"handler": "stream_time", "scope": "agent:airline"}]
    assert common.event_time(s, "2024-01-02T03:04:05", "global") == datetime(2024, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
    assert len(asked) == 1  # --at: nothing read
    assert common.event_time(s, None, "team:x") >= before  # a scope with no event yet: the wall clock
