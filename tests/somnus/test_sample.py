"""somnus.sample: seeded synthetic traces with the situations the memory must learn from."""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from datetime import datetime, timedelta
from typing import Any

import orjson
import pytest

from somnus.processors.briefing.generator import task_kind
from somnus.processors.knowledge.extraction import TraceExtractor
from somnus.processors.sessions.distiller import distill
from somnus.sample import AGENT_TOOLS, ARRIVAL_SKEW, FAULTS, START, TASK_KINDS, TEAMS, TOOL_KIND, TOOL_ORDER, generate
from somnus.schemas.agents import load_agents, teams
from somnus.schemas.codec import Rejection, decode_trace
from somnus.schemas.episodes import LessonKind
from somnus.schemas.events import Outcome


@pytest.fixture(scope="module")
def fleet() -> list[dict[str, Any]]:
    return list(generate(sessions=300, seed=11))


def sessions_of(events: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for e in events:
        out[e["session_id"]].append(e)
    return dict(out)


def test_the_same_seed_gives_the_same_events(fleet):
    assert list(generate(sessions=300, seed=11)) == fleet


def test_a_different_seed_gives_different_events(fleet):
    other = list(generate(sessions=300, seed=12))
    assert other != fleet
    assert [e["event_id"] for e in other] != [e["event_id"] for e in fleet]


def test_every_event_decodes(fleet):
    bad = [r.reason for e in fleet if isinstance(r := decode_trace(orjson.dumps(e), 1_048_576), Rejection)]
    assert bad == []


def test_sessions_count_and_every_session_runs_from_start_to_end_in_seq_order(fleet):
    sessions = sessions_of(fleet)
    assert len(sessions) == 300
    for sid, evs in sessions.items():
        assert [e["seq"] for e in evs] == list(range(len(evs))), sid
        assert evs[0]["type"] == "session_start" and evs[-1]["type"] == "session_end", sid
        assert sum(e["type"] == "session_end" for e in evs) == 1
        assert len({e["agent"] for e in evs}) == 1 and evs[0]["agent"] in AGENT_TOOLS
        times = [datetime.fromisoformat(e["ts"]) for e in evs]
        assert times == sorted(times), sid
    assert min(datetime.fromisoformat(e["ts"]) for e in fleet) == START
    assert len({e["event_id"] for e in fleet}) == len(fleet)


def test_sessions_are_interleaved_like_a_fleet(fleet):
    switches = sum(a["session_id"] != b["session_id"] for a, b in zip(fleet, fleet[1:]))
    assert switches > len(sessions_of(fleet))  # far more switches than one-session-after-another would give
    dense = list(generate(sessions=300, seed=11, days=1))
    assert sum(a["session_id"] != b["session_id"] for a, b in zip(dense, dense[1:])) > 5 * 300
    with pytest.raises(ValueError):
        next(generate())


def test_events_arrive_at_most_the_arrival_skew_out_of_time_order():
    """Sessions mix, but yesterday's events never arrive after today's: a stream's time moves on
    without leaving a session's events behind (``somnus.processors.sessions.session_retention`` would dead-letter them)."""
    for events in (list(generate(sessions=600, seed=12)), list(generate(events=20_000, seed=3))):
        latest = START
        for e in events:
            t = datetime.fromisoformat(e["ts"])
            assert latest - t <= ARRIVAL_SKEW
            latest = max(latest, t)


def test_interleave_1_gives_one_session_after_another():
    events = list(generate(sessions=20, seed=3, interleave=1))
    order = [e["session_id"] for e in events]
    assert sum(a != b for a, b in zip(order, order[1:])) == 19


def test_an_event_budget_gives_whole_sessions():
    events = list(generate(events=500, seed=5))
    assert len(events) >= 500
    for evs in sessions_of(events).values():
        assert evs[-1]["type"] == "session_end"


def test_it_contains_every_situation_the_distiller_learns_from(fleet):
    kinds = Counter(e["type"] for e in fleet)
    assert kinds["delegation"] > 0 and kinds["delegation"] == kinds["delegation_result"]
    results = [e["payload"] for e in fleet if e["type"] == "tool_result"]
    assert any(r.get("http_status") == 429 for r in results)
    assert any(not r["ok"] and r.get("http_status") != 429 for r in results)

    out = distill({}, [decode_trace(orjson.dumps(e), 1_048_576) for e in fleet])
    assert len(out.episodes) == 300 and (out.duplicates, out.late) == (0, 0)
    outcomes = Counter(e.outcome for e in out.episodes)
    assert set(outcomes) == set(Outcome)  # successes, failures and partial results
    lessons = [l for e in out.episodes for l in e.lessons]
    backoff = [
        l
        for l in lessons
        if l.kind is LessonKind.RECOVERY and "rate limit encountered; exponential backoff resolved it" in l.text
    ]
    assert backoff, "429s resolved later by backoff"
    assert any(l.kind is LessonKind.FAILURE and l.tool and "never resolved" in l.text for l in lessons)
    assert any(l.kind is LessonKind.FAILURE and l.text.startswith("delegation to ") for l in lessons)
    assert any(l.kind is LessonKind.SUCCESS for l in lessons)
    # every 429 in the sample is eventually resolved: no failure lesson blames a rate limit
    assert not any(l.kind is LessonKind.FAILURE and l.error and "429" in l.error for l in lessons)


def test_delegations_go_from_a_lead_to_its_own_team(fleet):
    for e in fleet:
        if e["type"] in ("delegation", "delegation_result"):
            assert e["payload"]["to_agent"] in TEAMS[e["agent"]]


def test_the_sample_fleet_matches_the_declared_agents():
    agents = load_agents()
    assert set(AGENT_TOOLS) == set(agents)
    assert {lead: sorted(m) for lead, m in TEAMS.items()} == {lead: m[1:] for lead, m in teams(agents).items()}


# ---- a fleet that looks like a real one (issue 26, section 6) ------------------------------------

HTTP_ERROR = re.compile(r"\bHTTP \d{3}\b|Too Many Requests|ConnectionTimeout")
SHELL_ERROR = re.compile(r"exit status \d+|command not found")


def _failed_results(events: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    """(agent, tool, error) of every failed tool result."""
    return [
        (e["agent"], e["payload"]["tool"], e["payload"]["error"])
        for e in events
        if e["type"] == "tool_result" and not e["payload"]["ok"]
    ]


def test_errors_belong_to_their_tools(fleet):
    failed = _failed_results(fleet)
    assert failed
    for agent, tool, error in failed:
        kind = TOOL_KIND[tool]
        assert bool(HTTP_ERROR.search(error)) == (kind == "http"), (tool, error)  # no HTTP error on a shell tool
        assert bool(SHELL_ERROR.search(error)) == (kind == "shell"), (tool, error)
    for e in fleet:
        if e["type"] == "tool_result" and "http_status" in e["payload"]:
            assert TOOL_KIND[e["payload"]["tool"]] == "http"


def test_recurring_faults_recur_in_their_window_and_not_outside_it():
    events = list(generate(sessions=1500, seed=3))
    failed = _failed_results(events)
    for fault in FAULTS:
        seen = [
            datetime.fromisoformat(e["ts"])
            for e in events
            if e["type"] == "tool_result"
            and e["agent"] == fault.agent
            and not e["payload"]["ok"]
            and e["payload"]["error"] == fault.error
        ]
        assert len(seen) >= 5, fault.error  # recurs: something a memory should learn
        days = {(t - START).days for t in seen}
        assert min(days) >= fault.first_day and max(days) <= fault.last_day, fault.error
        assert len({(t - START).days // 7 for t in seen}) >= min(
            2, (min(fault.last_day, 27) - fault.first_day) // 7 + 1
        )
    # faults are their agents' own: no other agent meets them
    for fault in FAULTS:
        assert {a for a, _, err in failed if err == fault.error} == {f.agent for f in FAULTS if f.error == fault.error}


def test_sessions_span_weeks_with_working_hours_and_weekdays(fleet):
    starts = [datetime.fromisoformat(e["ts"]) for e in fleet if e["type"] == "session_start"]
    assert (max(starts) - min(starts)) >= timedelta(days=21)
    weekday = [t for t in starts if t.weekday() < 5]
    assert len(weekday) >= 0.9 * len(starts)  # weekends are a trickle
    assert sum(7 <= t.hour < 19 for t in weekday) >= 0.9 * len(weekday)  # working hours
    per_day = Counter(t.date() for t in weekday)
    assert len(per_day) >= 15  # every working day has sessions


def test_rate_limits_change_rarely(fleet):
    values: dict[str, list[str]] = defaultdict(list)
    for e in sorted(
        (e for e in fleet if e["type"] == "tool_result" and e["payload"].get("http_status") == 429),
        key=lambda e: e["ts"],
    ):
        call = next(
            c
            for c in fleet
            if c["type"] == "tool_call"
            and c["session_id"] == e["session_id"]
            and c["payload"]["call_id"] == e["payload"]["call_id"]
        )
        host = call["payload"]["args"]["url"].split("/")[2]
        values[host].append(e["payload"]["headers"]["Retry-After"])
    assert values
    for host, seen in values.items():
        changes = sum(a != b for a, b in zip(seen, seen[1:]))
        assert changes <= 1, (host, seen)  # one change at most over the weeks


def test_tasks_recur_with_the_same_successful_tool_sequence(fleet):
    out = distill({}, [decode_trace(orjson.dumps(e), 1_048_576) for e in fleet])
    by_kind: dict[tuple[str, str], Counter[tuple[str, ...]]] = defaultdict(Counter)
    for ep in out.episodes:
        if ep.outcome is Outcome.SUCCESS:
            by_kind[(ep.agent, task_kind(ep.task))][tuple(ep.tools)] += 1
    repeated = {k for k, seqs in by_kind.items() if seqs.most_common(1)[0][1] >= 2}
    assert {a for a, _ in repeated} == set(AGENT_TOOLS)  # every agent has a strategy to learn


def test_no_depends_on_cycles(fleet):
    out = distill({}, [decode_trace(orjson.dumps(e), 1_048_576) for e in fleet])
    edges = {
        (f.source, f.target)
        for fx in TraceExtractor().extract(out.episodes)
        for f in fx.facts
        if f.predicate == "depends_on"
    }
    assert edges
    graph: dict[str, set[str]] = defaultdict(set)
    for a, b in edges:
        graph[a].add(b)

    def reaches(a: str, b: str, seen: set[str]) -> bool:
        return any(n == b or (n not in seen and not seen.add(n) and reaches(n, b, seen)) for n in graph[a])

    assert not any(reaches(b, a, set()) for a, b in edges)


def test_every_task_follows_the_global_tool_order():
    rank = {t: i for i, t in enumerate(TOOL_ORDER)}
    assert set(rank) == set(TOOL_KIND)
    for kind in TASK_KINDS:
        tools = [s.tool for s in kind.steps]
        assert all(rank[a] < rank[b] for a, b in zip(tools, tools[1:]) if a != b), kind


def test_an_event_budget_spreads_over_the_same_weeks():
    events = list(generate(events=3000, seed=2))
    starts = [datetime.fromisoformat(e["ts"]) for e in events if e["type"] == "session_start"]
    first = [t for t in starts if t - START < timedelta(days=28)]
    assert timedelta(days=20) <= max(first) - START and len(first) >= 0.9 * len(starts)  # about one block of weeks
