"""somnus.sample: seeded synthetic traces with the situations the memory must learn from."""

from __future__ import annotations

from collections import Counter, defaultdict
from datetime import datetime
from typing import Any

import orjson
import pytest

from processors.distiller import distill
from schemas.codec import Rejection, decode_trace
from schemas.episodes import LessonKind
from schemas.events import Outcome
from somnus.agents import load_agents, teams
from somnus.sample import AGENT_TOOLS, START, TEAMS, generate


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
    with pytest.raises(ValueError):
        next(generate())


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
    backoff = [l for l in lessons if l.kind is LessonKind.RECOVERY
               and "rate limit encountered; exponential backoff resolved it" in l.text]
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
