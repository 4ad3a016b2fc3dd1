"""Working memory and get_context end to end: the worker's working-memory table, its changelog
projected by the projector, and the context assembled over HTTP."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from somnus.reads import read
from tests.factories import SessionLog
from tests.pipeline import Pipeline, wait_until

pytestmark = pytest.mark.integration

T0 = datetime(2024, 9, 2, 10, tzinfo=timezone.utc)


def _conversation(agent: str, sid: str, user: str, turns: list[tuple[str, str]], end: bool, hour: int) -> list[dict]:
    t = T0 + timedelta(hours=hour)
    log = SessionLog(sid, t, agent, step_s=30)
    add = log.add

    add("session_start", {"task": turns[0][1][:80], "user_id": user, "metadata": {"mode": "conversation"}})
    for who, text in turns:
        add("user_message" if who == "user" else "agent_message", {"text": text})
    if end:
        add("session_end", {"outcome": "success"})
    return log.events


def test_context_holds_the_open_session_and_only_the_readers_user(pipeline_settings):
    p = Pipeline(pipeline_settings)
    db = p.s.db_path
    try:
        p.start_all()
        events = (
            _conversation(
                "support",
                "past-u1",
                "u1",
                [("user", "My name is Dana and I prefer email over phone."), ("agent", "Noted, Dana: email it is.")],
                True,
                0,
            )
            + _conversation(
                "support",
                "past-u2",
                "u2",
                [("user", "My account secret word is pelican-42."), ("agent", "I will not repeat it.")],
                True,
                1,
            )
            + _conversation(
                "support",
                "open-u1",
                "u1",
                [
                    ("user", "The invoice for March is wrong again."),
                    ("agent", "Let me look at the March invoice."),
                    ("user", "It charged twice for the same seat."),
                ],
                False,
                2,
            )
        )
        p.publish(events)
        p.wait_idle()
        wait_until(
            lambda: read(db, "sql", sql="SELECT count(*) FROM working_memory WHERE NOT closed")["rows"][0][0] == 1,
            timeout_s=60,
            what="the open session's working memory",
        )
        ctx = read(
            db,
            "context",
            "support",
            agents_dir=p.s.agents_dir,
            query="invoice charged twice email",
            user_id="u1",
            max_tokens=600,
        )
        assert ctx["session_id"] == "open-u1"
        assert "charged twice for the same seat" in ctx["text"]  # the recent conversation, intact
        assert ctx["tokens"] <= 600
        assert "Dana" in ctx["text"]  # the user's synopsis / past memory
        assert "pelican" not in ctx["text"]  # another user's memory never reaches u1
        other = read(
            db,
            "context",
            "support",
            agents_dir=p.s.agents_dir,
            query="account secret word",
            user_id="u2",
            max_tokens=600,
        )
        assert "pelican-42" in other["text"]  # u2's own memory is there for u2 ...
        assert "seat" not in other["text"] and "Dana" not in other["text"]  # ... u1's buffer and synopsis are not
        nobody = read(db, "context", "support", agents_dir=p.s.agents_dir, query="secret word invoice", max_tokens=600)
        assert "pelican" not in nobody["text"] and "Dana" not in nobody["text"]
    finally:
        p.stop_all()
