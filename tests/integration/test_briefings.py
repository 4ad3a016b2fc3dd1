"""Briefings end to end: real broker, Faust worker, projector (HTTP) and the CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from datetime import datetime, timedelta, timezone

import pytest

from somnus import client
from somnus.reads import read
from tests.factories import SessionLog
from tests.pipeline import Pipeline, wait_until

pytestmark = pytest.mark.integration

T0 = datetime(2024, 6, 3, 9, 0, tzinfo=timezone.utc)


def _rate_limited_session(agent: str, n: int) -> list[dict]:
    """A session of ``agent`` that hits a 429 on api.example.com, backs off, and succeeds."""
    sid = f"{agent}-rl-{n}"
    t = T0 + timedelta(hours=n)
    log = SessionLog(sid, t, agent)
    add = log.add

    add("session_start", {"task": "collect pricing pages", "goal": "prices by noon"})
    add("tool_call", {"tool": "http_get", "call_id": "c0", "args": {"url": "https://api.example.com/prices"}})
    add(
        "tool_result",
        {
            "call_id": "c0",
            "tool": "http_get",
            "ok": False,
            "http_status": 429,
            "error": "Too Many Requests",
            "headers": {"Retry-After": "4"},
        },
        dt=4.0,
    )
    add("tool_call", {"tool": "http_get", "call_id": "c1", "args": {"url": "https://api.example.com/prices"}})
    add("tool_result", {"call_id": "c1", "tool": "http_get", "ok": True, "http_status": 200, "output": "ok"})
    add("session_end", {"outcome": "success"})
    return log.events


def _plain_session(agent: str, n: int, url: str | None = None) -> list[dict]:
    """A short successful session; with ``url``, one successful http_get of it."""
    sid = f"{agent}-plain-{n}"
    t = T0 + timedelta(hours=n)
    payloads = [("session_start", {"task": "routine check"})]
    if url:
        payloads += [
            ("tool_call", {"tool": "http_get", "call_id": "c0", "args": {"url": url}}),
            ("tool_result", {"call_id": "c0", "tool": "http_get", "ok": True, "output": "ok"}),
        ]
    payloads.append(("session_end", {"outcome": "success"}))
    log = SessionLog(sid, t, agent, step_s=5)
    for type_, payload in payloads:
        log.add(type_, payload)
    return log.events


def test_a_lesson_reaches_the_agent_then_its_teammate_once_team_scoped_and_never_another_team(pipeline_settings):
    # Built-in fleet: scraper and researcher report to research-lead; deployer to ops-lead.
    p = Pipeline(pipeline_settings)
    s = p.s
    try:
        p.start_all()
        # researcher calls the same API (so a team fact about it concerns researcher); deployer does not
        p.publish(
            [e for n in range(3) for e in _rate_limited_session("scraper", n)]
            + _plain_session("researcher", 0, "https://api.example.com/catalog")
            + _plain_session("deployer", 0)
        )
        p.wait_idle()
        lesson = "[recovery] http_get: HTTP 429: Too Many Requests; resolved by exponential backoff (3 times"
        scraper = client.briefing("scraper", settings=s)  # through the running projector (HTTP)
        assert scraper is not None and lesson in scraper
        fact = "api.example.com rate_limit"
        assert fact in scraper  # its private fact about the API
        assert "http_get calls api.example.com" in (client.briefing("researcher", settings=s) or "")  # its own
        for other in ("researcher", "deployer"):
            assert fact not in (client.briefing(other, settings=s) or "")

        # The next session of scraper gets the lesson injected, fenced off, and the serving is recorded.
        prompt = client.inject("scraper", "You are the scraper.", session_id="scraper-next", settings=s)
        assert prompt.startswith("⟦BEGIN PRIOR EXPERIENCE") and lesson in prompt
        assert prompt.endswith("\n\nYou are the scraper.")
        assert client.inject("deployer", "You deploy.", settings=s).find(fact) == -1

        # Promote the rate-limit fact to the team by hand (an event on the facts topic).
        facts = read(s.db_path, "facts", "scraper", agents_dir=s.agents_dir, predicate="rate_limit")
        assert facts, "the extractor made a rate_limit fact from the Retry-After header"
        f = facts[0]
        env = {**p.s.as_env(), "KAFKA_BOOTSTRAP": p.boot}
        run = subprocess.run(
            [sys.executable, "-m", "somnus.cli", "promote", f["source"], "rate_limit", f["target"], "--to", "team"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert run.returncode == 0, run.stderr
        assert "agent:scraper -> team:research-lead" in run.stdout

        def teammate_knows() -> bool:
            return fact in (client.briefing("researcher", settings=s) or "")

        wait_until(teammate_knows, timeout_s=60, what="researcher's briefing to show the team fact")
        assert "api.example.com" not in (client.briefing("deployer", settings=s) or "")  # it never called the API
        team_fact = read(s.db_path, "facts", "researcher", agents_dir=s.agents_dir, predicate="rate_limit")
        assert [x["scope"] for x in team_fact] == ["team:research-lead"]

        # The HTTP API describes itself, and status shows the cache and the served record.
        st = json.loads(
            subprocess.run(
                [sys.executable, "-m", "somnus.cli", "status", "--json"],
                env=env,
                capture_output=True,
                text=True,
                timeout=120,
            ).stdout
        )
        assert st["memory"]["briefings"]["agents"] >= 3
        served = read(s.db_path, "sql", sql="SELECT agent, session_id FROM briefings_served")
        assert served["rows"] == [["scraper", "scraper-next"]]
        promotions = read(s.db_path, "sql", sql="SELECT reason, from_scope, to_scope FROM promotions")
        assert promotions["rows"] == [["manual", "agent:scraper", "team:research-lead"]]
    finally:
        p.stop_all()


def test_tau_bench_through_the_pipeline_briefs_the_airline_agent_with_its_own_facts_and_a_strategy(
    pipeline_settings, tau_bench_path
):
    """Issue 26: on the real pipeline, the airline briefing names its error classes once each, serves
    its own facts (they were dropped before) and a strategy (it was always empty)."""
    from somnus.importers import openai_chat
    from somnus.processors.knowledge.extraction import error_class

    p = Pipeline(pipeline_settings)
    s = p.s
    try:
        p.start_all()
        p.publish(list(openai_chat(tau_bench_path, agent="airline")))
        p.wait_idle()

        def briefed() -> bool:
            got = read(s.db_path, "sql", sql="SELECT count(*) FROM briefings_dirty")
            return got["rows"] == [[0]] and bool(client.briefing("airline", settings=s))

        wait_until(briefed, timeout_s=120, what="the airline briefing")
        md = client.briefing("airline", settings=s) or ""
        row = read(
            s.db_path, "sql", sql="SELECT facts, strategies, chars, budget FROM briefings WHERE agent = 'airline'"
        )
        facts, strategies, chars, budget = row["rows"][0]
        facts = json.loads(facts) if isinstance(facts, str) else facts
        assert any(f["scope"] == "agent:airline" for f in facts), md  # own facts
        assert strategies >= 1 and "### Active Strategies" in md and " -> " in md.split("### Active Strategies")[1]
        assert chars == len(md) <= budget
        lessons = [line for line in md.split("### Key Knowledge")[0].splitlines() if line.startswith("- [")]
        assert lessons
        errors = read(
            s.db_path,
            "sql",
            sql="SELECT DISTINCT tool, error FROM lessons WHERE agent = 'airline' AND error IS NOT NULL",
        )["rows"]
        classes = {(tool, error_class(e)) for tool, e in errors}
        # every tool lesson line names its tools and one error class of the agent's; no two lines
        # share a class (the other lines are failures without a tool error: "session ended in failure ...")
        tools = {t for t, _ in classes}
        tool_lines = [line for line in lessons if set(line.split("] ", 1)[1].split(": ")[0].split(", ")) <= tools]
        assert tool_lines
        named = [
            {c[1] for c in classes if c[0] in line.split(": ")[0] and (f": {c[1]} (" in line or f": {c[1]};" in line)}
            for line in tool_lines
        ]
        assert all(len(n) == 1 for n in named), (tool_lines, named)
        assert len({next(iter(n)) for n in named}) == len(tool_lines)
    finally:
        p.stop_all()


def test_toolbench_http_errors_become_error_entities_lessons_and_a_briefing(pipeline_settings):
    """ToolBench's answer files (real HTTP APIs) through the real pipeline: the calls that failed with an
    HTTP status or a timeout become the agent's error entities and lessons, and its briefing names them."""
    from somnus.importers import ImportRun, expand_paths, import_files
    from tests.conftest import DATASETS

    answers = DATASETS / "toolbench-sample" / "answer"
    if not answers.exists():
        pytest.skip(f"dataset missing: {answers}")
    run = ImportRun()
    events = list(import_files(expand_paths([answers], "toolbench"), "toolbench", agent="toolbench", run=run))
    assert len(run.skipped) == 2
    p = Pipeline(pipeline_settings)
    s = p.s
    try:
        p.start_all()
        p.publish(events)
        p.wait_idle()

        def briefed() -> bool:
            got = read(s.db_path, "sql", sql="SELECT count(*) FROM briefings_dirty")
            return got["rows"] == [[0]] and bool(client.briefing("toolbench", settings=s))

        wait_until(briefed, timeout_s=120, what="the toolbench briefing")
        outcomes = dict(
            read(s.db_path, "sql", sql="SELECT outcome, count(*) FROM episodes WHERE agent = 'toolbench' GROUP BY 1")[
                "rows"
            ]
        )
        ends = Counter(e["payload"]["outcome"] for e in events if e["type"] == "session_end")
        assert outcomes == ends == {"success": 9, "failure": 4}  # 9 give_answer, 4 give_up
        errors = {
            e.lower()
            for (e,) in read(s.db_path, "sql", sql="SELECT DISTINCT name FROM entity_versions WHERE type = 'error'")[
                "rows"
            ]
        }
        assert {"http 400: bad request", "http 403: forbidden", "endpoint '<path>' does not exist"} <= errors, errors
        assert any(e.startswith("timeout error") for e in errors), errors
        lessons = read(
            s.db_path, "sql", sql="SELECT tool, error FROM lessons WHERE agent = 'toolbench' AND error IS NOT NULL"
        )["rows"]
        assert ["api_tracking_for_pack_send", "HTTP 400: Bad Request"] in [list(r) for r in lessons], lessons
        md = client.briefing("toolbench", settings=s) or ""
        assert "api_tracking_for_pack_send" in md and "HTTP 400" in md, md
    finally:
        p.stop_all()
