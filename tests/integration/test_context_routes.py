"""The context routes over HTTP, end to end (issue 26, section 5): the user synopsis of
``GET /agents/{agent}/context`` holds what the user said of themselves, and
``GET /agents/{agent}/episodic-context`` finds an agent's own past task by its text, with the
caller's ``success_only``, ``domain_hint`` and ``min_relevance``."""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone

import pytest

from somnus.reads import ReadError, read
from tests.factories import SessionLog
from tests.pipeline import Pipeline

pytestmark = pytest.mark.integration

T0 = datetime(2024, 9, 2, 10, tzinfo=timezone.utc)


def _Session(agent: str, sid: str, hour: float) -> SessionLog:
    return SessionLog(sid, T0 + timedelta(hours=hour), agent, step_s=30)


def _task(agent: str, sid: str, hour: float, task: str, tools: list[str], outcome: str, domain: str) -> list[dict]:
    s = _Session(agent, sid, hour).add("session_start", {"task": task, "metadata": {"domain": domain}})
    for k, tool in enumerate(tools):
        s.add("tool_call", {"tool": tool, "call_id": f"c{k}", "args": {"order": "1042"}})
        s.add("tool_result", {"call_id": f"c{k}", "tool": tool, "ok": True, "output": "done"})
    return s.add("session_end", {"outcome": outcome}).events


def test_synopsis_and_episodic_context_through_the_http_routes(pipeline_settings):
    p = Pipeline(pipeline_settings)
    db = p.s.db_path
    try:
        p.start_all()
        chat = (
            _Session("concierge", "chat-zed", 0)
            .add("session_start", {"task": "seat preference", "user_id": "u-zed", "metadata": {"mode": "conversation"}})
            .add("user_message", {"text": "Hi, my name is Zed Quinn, I prefer aisle seats."})
            .add("agent_message", {"text": "Noted, Zed: aisle seats from now on."})
            .add("session_end", {"outcome": "success"})
            .events
        )
        work = (
            _task(
                "support", "refund-1042", 1, "refund order 1042", ["crm_lookup", "issue_refund"], "success", "billing"
            )
            + _task(
                "support",
                "flight-lis",
                2,
                "book a flight to Lisbon for the offsite",
                ["search_flights"],
                "failure",
                "travel",
            )
            + _task(
                "support",
                "flight-osl",
                3,
                "book a flight to Oslo for the sales team",
                ["search_flights", "book_flight"],
                "success",
                "travel",
            )
            + _task("support", "escalation", 4, "answer the acme escalation", ["send_email"], "success", "billing")
        )
        p.publish(chat + work)
        p.wait_idle()
        assert (
            read(db, "sql", sql="SELECT count(*) FROM memories WHERE user_id = 'u-zed' AND kind = 'message'")["rows"][
                0
            ][0]
            == 2
        )

        # The synopsis: the user's name and preference, from their own words (through the projector's HTTP).
        ctx = read(
            db,
            "context",
            "concierge",
            agents_dir=p.s.agents_dir,
            query="which seat should I book",
            user_id="u-zed",
            max_tokens=800,
        )
        assert "name: Zed Quinn" in ctx["synopsis"], ctx
        assert "preferences: prefers aisle seats" in ctx["synopsis"], ctx
        assert ctx["text"].startswith("## About the user\nname: Zed Quinn\n"), ctx["text"]

        def episodic(query: str, **params: object) -> dict:
            return read(db, "episodic_context", "support", query=query, **params)

        def relevances(got: dict) -> list[float]:
            return [float(x) for x in re.findall(r"\(relevance ([0-9.]+)\)", got["text"])]

        # The agent's own past task, by its text (no tool named in the query).
        got = episodic("refund order 1042")
        assert got["text"].startswith("[1] task: refund order 1042 (relevance "), got["text"]
        assert "result: success: 2 tool calls (2 tools)" in got["text"]
        assert "success: success:" not in got["text"] and "refund order 1042 |" not in got["text"]
        flights = episodic("book a flight")
        assert flights["entries"] == 2 and "Lisbon" in flights["text"] and "Oslo" in flights["text"]
        assert "refund" not in flights["text"]
        only_ok = episodic("book a flight", success_only="true")
        assert only_ok["entries"] == 1 and "Oslo" in only_ok["text"] and "Lisbon" not in only_ok["text"]
        # domain_hint: past work of that domain is more relevant (+0.15), of another not
        plain, travel, billing = (
            relevances(episodic("book a flight", domain_hint=h)) for h in (None, "travel", "billing")
        )
        assert plain == billing and len(plain) == 2
        assert [round(t - p, 2) for t, p in zip(travel, plain)] == [0.15, 0.15]
        assert episodic("book a flight", min_relevance="0.99")["entries"] == 0
        with pytest.raises(ReadError, match="min_relevance"):
            episodic("book a flight", min_relevance="2")
    finally:
        p.stop_all()
