"""somnus.foresight scoring: every number of the report pinned on a small worked example (docs/foresight.md)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from somnus.foresight import (
    BriefingSeen,
    FailedCall,
    SessionSeen,
    Vocabulary,
    briefing_sections,
    duplicates,
    line_subjects,
    median_p95,
    peer_agents,
    read_briefing,
    schedule,
    score,
    sessions_of,
)
from somnus.processors.knowledge.extraction import error_class
from somnus.schemas.agents import AgentSpec

T0 = datetime(2024, 5, 15, tzinfo=timezone.utc)


def at(hours: float) -> datetime:
    return T0 + timedelta(hours=hours)


# The worked example of docs/foresight.md.
S1 = SessionSeen(
    "s1",
    "bot",
    at(1),
    at(1.5),
    ("deploy", "fetch"),
    (FailedCall("deploy", "bash: helm: command not found"), FailedCall("fetch", "HTTP 429: Too Many Requests")),
    "release 1.2 to staging",
)
S2 = SessionSeen("s2", "other", at(2), at(2.5), ("fetch",), (FailedCall("fetch", "HTTP 503: Service Unavailable"),))
S3 = SessionSeen(
    "s3",
    "bot",
    at(3),
    at(3.5),
    ("deploy", "fetch"),
    (
        FailedCall("deploy", "/bin/bash: line 9: helm: command not found"),
        FailedCall("fetch", "HTTP 503: Service Unavailable"),
        FailedCall("fetch", "HTTP 429: Too Many Requests"),
    ),
    "fetch https://api.example.com/v1/releases then deploy",
)
S4 = SessionSeen("s4", "bot", at(4), at(4.5), ("deploy",), (FailedCall("deploy", "bash: helm: command not found"),))

B3 = BriefingSeen(
    "## Session Briefing for bot\n\n"
    "### Recent Lessons\n"
    "- [failure] deploy failed with 'bash: helm: command not found' (2 hours ago)\n"
    "- [failure] deploy failed with 'helm: command not found' (2 hours ago)\n\n"
    "### Key Knowledge\n"
    "- fetch calls api.example.com (confidence 0.95)\n"
    "- billing uses invoices (confidence 0.90)\n\n"
    "### Active Strategies\n"
    "- deploy release: fetch -> deploy (worked 2 times, latest 2 hours ago)\n",
    budget=300,
    facts=(("fetch", "calls", "api.example.com"), ("billing", "uses", "invoices")),
)
B4 = BriefingSeen(
    "## Session Briefing for bot\n\n### Key Knowledge\n"
    '- deploy failed_with "command not found: helm" (confidence 0.95)\n',
    budget=2000,
    facts=(("deploy", "failed_with", "command not found: helm"),),
)
PEERS = {"bot": frozenset({"bot"}), "other": frozenset({"other"})}


@pytest.fixture(scope="module")
def report():
    return score([S4, S2, S3, S1], {"s3": B3, "s4": B4}, PEERS, first_n=2)  # any input order


def test_learnable_counts_failed_calls_whose_tool_and_class_failed_in_an_earlier_session_of_the_agent(report):
    # s3: deploy/"command not found: helm" and fetch/HTTP 429 failed in s1; HTTP 503 only in another agent's s2.
    # s4: deploy/"command not found: helm" again. s1 and s2 have no earlier session.
    assert report["failed_calls"] == 7
    assert report["learnable"] == 3


def test_foretold_are_learnable_calls_the_briefing_named_in_a_lesson_or_a_fact(report):
    # s3's briefing names deploy + helm (lessons), not fetch + HTTP 429; s4's names deploy + helm (a fact).
    assert report["foretold"] == 2
    assert report["foresight"] == round(2 / 3, 4)
    assert report["missed"] == [{"tool": "fetch", "error_class": "http 429: too many requests", "calls": 1}]


def test_foresight_by_session_index_splits_each_agents_first_sessions_from_the_rest(report):
    assert report["foresight_by_session_index"] == {
        "first_2": {"sessions": 3, "learnable": 2, "foretold": 1, "foresight": 0.5},  # s1, s2, s3
        "rest": {"sessions": 1, "learnable": 1, "foretold": 1, "foresight": 1.0},
    }  # s4 (bot's third)
    assert report["by_agent"] == {
        "bot": {"sessions": 3, "learnable": 3, "foretold": 2, "foresight": 0.6667},
        "other": {"sessions": 1, "learnable": 0, "foretold": 0, "foresight": None},
    }


def test_relevance_is_the_share_of_lines_whose_subject_the_session_touched(report):
    # s3: both lessons (deploy), "fetch calls api.example.com" (fetch), the strategy (fetch, deploy) are
    # touched; "billing uses invoices" is not. s4: its one fact (deploy). 5 of 6.
    assert (report["relevant_lines"], report["briefing_lines"]) == (5, 6)
    assert report["relevance"] == round(5 / 6, 4)
    assert report["lines_by_kind"] == {
        "fact": {"lines": 3, "relevant": 2},
        "lesson": {"lines": 2, "relevant": 2},
        "strategy": {"lines": 1, "relevant": 1},
    }


def test_duplicate_lines_share_a_tool_and_error_class_with_another_line(report):
    assert report["duplicate_lines"] == 2  # the two deploy/helm lessons of s3's briefing


def test_chars_against_the_budget(report):
    n3, n4 = len(B3.markdown), len(B4.markdown)
    assert report["chars"] == {
        "median": (n3 + n4) / 2,
        "p95": max(n3, n4),
        "max": max(n3, n4),
        "budget": 2000,
        "over_budget": 1,
    }  # s3's briefing is longer than its budget of 300
    assert (report["sessions"], report["briefings"], report["briefings_non_empty"]) == (4, 2, 2)


def test_a_session_still_running_is_not_earlier():
    long = SessionSeen("a", "bot", at(1), at(3), ("x",), (FailedCall("x", "Error: disk full"),))
    inside = SessionSeen("b", "bot", at(2), at(2.5), ("x",), (FailedCall("x", "Error: disk full"),))
    assert score([long, inside], {}, PEERS)["learnable"] == 0
    later = SessionSeen("c", "bot", at(3), at(3.5), ("x",), (FailedCall("x", "disk full"),))
    assert score([long, inside, later], {}, PEERS)["learnable"] == 1  # "a" ended at 3:00, not before 3:00: only "b"


def test_peers_share_a_team_scope_but_not_global():
    fleet = {
        "lead": AgentSpec(name="lead"),
        "a": AgentSpec(name="a", reports_to="lead"),
        "b": AgentSpec(name="b", reports_to="lead"),
        "c": AgentSpec(name="c", knowledge_scopes=["lead"]),
    }
    peers = peer_agents(fleet, ["a", "b", "c", "lead", "stranger"])
    assert {k: sorted(v) for k, v in peers.items()} == {
        "a": ["a", "b"],
        "b": ["a", "b"],
        "c": ["a", "b", "c"],
        "lead": ["lead"],
        "stranger": ["stranger"],
    }
    s_a = SessionSeen("1", "a", at(1), at(2), ("x",), (FailedCall("x", "boom"),))
    s_b = SessionSeen("2", "b", at(3), at(4), ("x",), (FailedCall("x", "boom"),))
    s_lead = SessionSeen("3", "lead", at(5), at(6), ("x",), (FailedCall("x", "boom"),))
    assert score([s_a, s_b, s_lead], {}, peers)["learnable"] == 1  # b learns from a; lead reads no team


def test_no_learnable_call_gives_no_foresight_rather_than_zero():
    assert score([S1], {}, PEERS)["foresight"] is None


def test_a_line_names_a_class_whatever_its_wording_and_case():
    vocab = Vocabulary.of(
        ["update_reservation_flights"], [error_class("Error: flight HAT030 not available on date 2024-05-13")]
    )
    want = (frozenset({"update_reservation_flights"}), frozenset({"flight <id> not available on date <date>"}))
    for line in (
        "- [failure] update_reservation_flights failed with 'Error: flight HAT1 not available on date "
        "2024-06-01' and it was never resolved (3 times, latest 1 day ago)",
        '- update_reservation_flights failed_with "flight <id> not available on date <date>" (confidence 0.95)',
        "- [failure ×4] Update_Reservation_Flights: Flight <ID> not available on date <date> (first 2 days ago)",
    ):
        assert line_subjects(line, vocab)[:2] == want, line
    assert line_subjects("- update_reservation_flights works", vocab)[1] == frozenset()
    assert (
        line_subjects("- [failure] update_reservation_flights_v2 failed", vocab)[0] == frozenset()
    )  # not a word of it


def test_a_line_cut_short_names_a_class_by_its_surviving_start():
    long = "Error: upstream " + "very " * 30 + "slow response from the pricing service"
    vocab = Vocabulary.of(["quote"], [error_class(long)])
    cut = "- [failure] quote failed with '" + long[:120] + "…"
    assert line_subjects(cut, vocab)[1] == vocab.classes
    assert (
        line_subjects("- [failure] quote failed with 'Error: upstream very…", vocab)[1] == frozenset()
    )  # too little left


def test_fact_lines_name_their_entities_but_not_the_reader():
    vocab = Vocabulary.of([], [], ["airline", "project x"])
    tools, classes, entities = line_subjects(
        '- airline works_on "project x" (confidence 0.90)',
        vocab,
        [("airline", "works_on", "project x")],
        reader="airline",
    )
    assert entities == frozenset({"project x"})


def test_briefing_sections_and_duplicates_of_a_class_without_a_tool():
    vocab = Vocabulary.of(["deploy"], [error_class("bash: helm: command not found")])
    b = BriefingSeen(
        "### Recent Lessons\n- [failure] deploy failed with 'helm: command not found'\n"
        "### Key Knowledge\n- helm: command not found happens on every host\n- other\n",
        budget=100,
    )
    assert [k for k, _ in briefing_sections(b.markdown)] == ["Recent Lessons", "Key Knowledge"]
    assert duplicates(read_briefing(b, vocab)) == 2


def test_median_and_p95_by_nearest_rank():
    assert median_p95([5]) == (5.0, 5)
    assert median_p95(list(range(1, 21))) == (10.5, 19)  # ceil(0.95 × 20) = 19th
    assert median_p95(list(range(1, 22))) == (11.0, 20)  # ceil(0.95 × 21) = 20th


def test_sessions_and_the_replay_plan_from_events():
    def ev(sid, seq, minute, type_, **payload):
        return {
            "session_id": sid,
            "agent": "bot",
            "seq": seq,
            "type": type_,
            "payload": payload,
            "ts": (T0 + timedelta(minutes=minute)).isoformat().replace("+00:00", "Z"),
        }

    events = [
        ev("a", 0, 0, "session_start", task="ship"),
        ev("a", 1, 1, "tool_call", tool="deploy", call_id="c1"),
        ev("a", 2, 2, "tool_result", call_id="c1", ok=False, error="bash: helm: command not found"),
        ev("b", 0, 3, "session_start", task="again"),
        ev("a", 3, 4, "session_end", outcome="failure"),
    ]
    [a, b] = sessions_of(events)
    assert (a.session_id, a.tools, a.failures) == (
        "a",
        ("deploy",),
        (FailedCall("deploy", "bash: helm: command not found"),),
    )
    assert (a.started_at, a.ended_at, b.started_at) == (T0, T0 + timedelta(minutes=4), T0 + timedelta(minutes=3))
    plan, rest = schedule(events)
    assert [(sid, [e["seq"] for e in batch]) for sid, batch in plan] == [("a", []), ("b", [0, 1, 2])]
    assert [(e["session_id"], e["seq"]) for e in rest] == [("b", 0), ("a", 3)]


def test_per_session_rows_add_up_to_the_report():
    r = score([S1, S2, S3, S4], {"s3": B3, "s4": B4}, PEERS, first_n=2, details=True)
    rows = {row["session_id"]: row for row in r["per_session"]}
    assert [row["session_id"] for row in r["per_session"]] == ["s1", "s2", "s3", "s4"]
    assert {
        k: rows["s3"][k]
        for k in ("index", "chars", "lines", "failed_calls", "learnable", "foretold", "relevant", "duplicate_lines")
    } == {
        "index": 1,
        "chars": len(B3.markdown),
        "lines": 5,
        "failed_calls": 3,
        "learnable": 2,
        "foretold": 1,
        "relevant": 4,
        "duplicate_lines": 2,
    }
    assert rows["s1"]["chars"] is None and rows["s4"]["foretold"] == 1
    assert sum(row["learnable"] for row in r["per_session"]) == r["learnable"]


def test_the_replay_names_formats_it_cannot_read():
    from somnus.foresight import load_events
    from somnus.importers import ImportShapeError

    with pytest.raises(ImportShapeError, match="x.json: no such file"):  # otel is read (tests/somnus/otlp)
        load_events(["x.json"], "otel")
    with pytest.raises(ImportShapeError, match="--format 'locomo'"):
        load_events(["x.json"], "locomo")
