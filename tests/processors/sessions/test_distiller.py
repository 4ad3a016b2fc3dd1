"""somnus.processors.sessions.distiller: a pure fold of trace events into per-session state and episodes."""

from __future__ import annotations

import json
import uuid
from collections import Counter
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import msgspec
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from somnus.importers import openai_chat
from somnus.processors.sessions import distiller
from somnus.processors.sessions.distiller import (
    DistillOutput,
    SessionState,
    decode_state,
    distill,
    encode_state,
    error_text,
    is_rate_limit,
    session_key,
)
from somnus.schemas.causal import event_signature
from somnus.schemas.codec import Rejection, decode_trace, encode
from somnus.schemas.episodes import EpisodeDistilled, LessonKind, episode_id_for
from somnus.schemas.events import (
    Outcome,
    TraceEvent,
)
from tests.factories import Trace

T0 = datetime(2024, 5, 15, 15, 0, tzinfo=timezone.utc)
TAU_BENCH = Path(__file__).resolve().parents[4] / "shared" / "datasets" / "tau-bench-airline" / "gpt-4o-airline.json"


def only_episode(events: list[TraceEvent]) -> EpisodeDistilled:
    out = distill({}, events)
    assert len(out.episodes) == 1, out.episodes
    return out.episodes[0]


# ---- lessons --------------------------------------------------------------------------------


def test_a_429_resolved_after_a_pause_is_a_backoff_recovery_lesson():
    t = (
        Trace()
        .start()
        .call("http_get", "c1", 1)
        .fail("c1", 2, "Too Many Requests", 429)
        .call("http_get", "c2", 4)
        .fail("c2", 5, "Too Many Requests", 429)
        .call("http_get", "c3", 8)
        .ok("c3", 9)
        .end(Outcome.SUCCESS, 10)
    )
    ep = only_episode(t.events)
    recovery = [l for l in ep.lessons if l.kind is LessonKind.RECOVERY]
    assert len(recovery) == 1
    lesson = recovery[0]
    assert "rate limit encountered; exponential backoff resolved it" in lesson.text
    # attempts and the wait from the first failure to the success (2s -> 9s)
    assert lesson.text == "http_get: rate limit encountered; exponential backoff resolved it (2 failed attempts, 7s)"
    assert (lesson.tool, lesson.error) == ("http_get", "HTTP 429: Too Many Requests")
    assert [(e.tool, e.http_status, e.resolved) for e in ep.errors] == [("http_get", 429, True)]


@pytest.mark.parametrize(
    ("error", "status"),
    [
        ("rate limit exceeded", None),
        ("Throttled by upstream", None),
        ("too many requests", None),
        ("429", None),
        ("slow down", 429),
    ],
)
def test_rate_limits_are_recognised_by_status_or_wording(error, status):
    assert is_rate_limit(error, status)
    t = (
        Trace()
        .start()
        .call("api", "c1", 1)
        .fail("c1", 2, error, status)
        .call("api", "c2", 6)
        .ok("c2", 7)
        .end(Outcome.SUCCESS, 8)
    )
    (lesson,) = [l for l in only_episode(t.events).lessons if l.kind is LessonKind.RECOVERY]
    assert "exponential backoff resolved it (1 failed attempt, 5s)" in lesson.text


@pytest.mark.parametrize(
    ("error", "status"),
    [("HTTP 500 Internal Server Error", 500), ("timeout", None), ("4290 items", None), ("limit of 100 rows", 400)],
)
def test_other_errors_are_not_rate_limits(error, status):
    assert not is_rate_limit(error, status)


def test_a_429_resolved_without_a_pause_is_a_plain_retry_lesson():
    t = (
        Trace()
        .start()
        .call("http_get", "c1", 1)
        .fail("c1", 2, "Too Many Requests", 429)
        .call("http_get", "c2", 2)
        .ok("c2", 2)
        .end(Outcome.SUCCESS, 3)
    )
    (lesson,) = [l for l in only_episode(t.events).lessons if l.kind is LessonKind.RECOVERY]
    assert lesson.text == "http_get: 'HTTP 429: Too Many Requests' was resolved by retrying (1 failed attempt)"


def test_an_error_never_resolved_is_a_failure_lesson_naming_tool_and_error():
    t = (
        Trace(agent="deployer")
        .start()
        .call("shell", "c1", 1)
        .fail("c1", 2, "bash: helm: command not found")
        .call("shell", "c2", 3)
        .fail("c2", 4, "bash: helm: command not found")
        .end(Outcome.FAILURE, 5)
    )
    ep = only_episode(t.events)
    (lesson,) = ep.lessons
    assert lesson.kind is LessonKind.FAILURE
    assert (lesson.tool, lesson.error) == ("shell", "bash: helm: command not found")
    assert lesson.text == "shell failed with 'bash: helm: command not found' and it was never resolved (2 attempts)"
    assert [(e.tool, e.resolved) for e in ep.errors] == [("shell", False)]
    assert ep.outcome is Outcome.FAILURE


def test_a_successful_session_is_a_success_lesson_with_its_tool_sequence():
    t = (
        Trace()
        .start()
        .call("crm_lookup", "a", 1)
        .ok("a", 2)
        .call("http_post", "b", 3)
        .ok("b", 4)
        .call("crm_lookup", "c", 5)
        .ok("c", 6)
        .call("send_email", "d", 7)
        .ok("d", 8)
        .end(Outcome.SUCCESS, 9)
    )
    ep = only_episode(t.events)
    (lesson,) = ep.lessons
    assert lesson.kind is LessonKind.SUCCESS
    assert lesson.text == "succeeded using crm_lookup -> http_post -> send_email"
    assert ep.tools == ["crm_lookup", "http_post", "send_email"] and ep.tool_calls == 4


def test_the_success_lesson_names_at_most_eight_tools():
    t = Trace().start()
    for i in range(10):
        t.call(f"tool{i}", f"c{i}", i + 1).ok(f"c{i}", i + 1)
    (lesson,) = only_episode(t.end(Outcome.SUCCESS, 20).events).lessons
    assert lesson.text == "succeeded using " + " -> ".join(f"tool{i}" for i in range(8))


def test_a_success_without_tools_teaches_nothing():
    assert only_episode(Trace().start().say("done", 1).end(Outcome.SUCCESS, 2).events).lessons == []


def test_a_failed_delegation_result_is_a_failure_lesson():
    t = (
        Trace(agent="ops-lead")
        .start()
        .delegate("deployer", "roll out web 2.4", 1)
        .delegated("deployer", Outcome.FAILURE, 60, summary="helm timed out")
        .end(Outcome.FAILURE, 61)
    )
    ep = only_episode(t.events)
    assert [(l.kind, l.text) for l in ep.lessons] == [
        (LessonKind.FAILURE, "delegation to deployer failed: helm timed out")
    ]
    assert [(d.to_agent, d.task, d.outcome) for d in ep.delegations] == [
        ("deployer", "roll out web 2.4", Outcome.FAILURE)
    ]


def test_a_delegation_result_without_its_delegation_is_still_recorded():
    t = Trace(agent="ops-lead").start().delegated("support", Outcome.SUCCESS, 5).end(Outcome.SUCCESS, 6)
    ep = only_episode(t.events)
    assert [(d.to_agent, d.task, d.outcome) for d in ep.delegations] == [("support", "", Outcome.SUCCESS)]
    assert ep.lessons == []


def test_a_failure_without_a_tool_error_is_a_lesson_from_the_terminal_state():
    t = Trace().start().call("crm_lookup", "a", 1).ok("a", 2).end(Outcome.FAILURE, 3, reason="the customer gave up")
    (lesson,) = only_episode(t.events).lessons
    assert (lesson.kind, lesson.tool) == (LessonKind.FAILURE, None)
    assert lesson.text == "session ended in failure after 1 tool calls (last tool: crm_lookup): the customer gave up"


def test_a_partial_outcome_teaches_nothing_by_itself():
    t = Trace().start().call("crm_lookup", "a", 1).ok("a", 2).end(Outcome.PARTIAL, 3)
    assert only_episode(t.events).lessons == []


def test_a_failed_result_without_a_known_call_is_charged_to_unknown_tool():
    t = Trace().start().fail("ghost", 1, "boom").end(Outcome.FAILURE, 2)
    (lesson,) = only_episode(t.events).lessons
    assert lesson.tool == "unknown_tool" and lesson.error == "boom"


@pytest.mark.parametrize(
    ("error", "status", "text"),
    [
        ("Too Many Requests", 429, "HTTP 429: Too Many Requests"),
        ("429 Too Many Requests", 429, "429 Too Many Requests"),
        (None, 500, "HTTP 500"),
        ("", None, "error (no message)"),
        (None, None, "error (no message)"),
        ("  read\n timed   out ", None, "read timed out"),
        ("x" * 400, None, "x" * 300),
    ],
)
def test_error_text_is_short_and_stable(error, status, text):
    assert error_text(error, status) == text


# ---- the episode -----------------------------------------------------------------------------


def test_the_episode_carries_the_session_facts():
    t = (
        Trace(agent="support", session_id="s1")
        .start("", goal="by noon", user_id="u7", at=5)
        .user("  please refund order 1042", 6)
        .call("crm_lookup", "a", 7)
        .ok("a", 8)
        .say("done", 9)
        .end(Outcome.SUCCESS, 65)
    )
    ep = only_episode(t.events)
    assert ep.episode_id == episode_id_for("support", "s1") == uuid.UUID("ddf526b7-6706-5e42-b35b-e9cf33ac0ebb")
    assert (ep.agent, ep.session_id, ep.goal, ep.user_id) == ("support", "s1", "by noon", "u7")
    assert ep.task == "  please refund order 1042"  # no task given: the first user message stands in
    assert (ep.started_at, ep.ended_at, ep.duration_s) == (T0 + timedelta(seconds=5), T0 + timedelta(seconds=65), 60.0)
    assert (ep.event_count, ep.tool_calls) == (6, 1)
    assert (ep.first_event_id, ep.last_event_id) == (t.events[0].event_id, t.events[-1].event_id)
    assert ep.summary == (
        "success:   please refund order 1042 | 1 tool calls (1 tools), 0 errors (0 unresolved), "
        "2 messages, 0 delegations, 60s"
    )


def test_each_call_carries_its_time_and_event_signature():
    t = (
        Trace()
        .start()
        .call("get_reservation", "c1", 3, {"reservation_id": "JG7FMM"})
        .ok("c1", 4)
        .call("get_reservation", "c2", 7, {"reservation_id": "LQ940Q"})
        .fail("c2", 9, "Error: not found")
        .call("book", "c3", 11, {"cabin": "economy"})
        .fail("zz", 12, "boom", tool="book")
        .call("notify", "c4", 13)
        .end(Outcome.FAILURE, 20)
    )
    ep = only_episode(t.events)
    assert [(c.tool, c.ok, c.at) for c in ep.calls] == [
        ("get_reservation", True, T0 + timedelta(seconds=3)),
        ("get_reservation", False, T0 + timedelta(seconds=7)),
        ("book", None, T0 + timedelta(seconds=11)),  # no result yet: the time of the call
        ("book", False, T0 + timedelta(seconds=12)),  # a result whose call was never seen: its own time
        ("notify", None, T0 + timedelta(seconds=13)),
    ]
    sigs = [c.signature for c in ep.calls]
    # the same call with another id has the same signature; a result without its call has none
    assert sigs[0] == sigs[1] == event_signature("get_reservation", {"reservation_id": "anything"})
    assert sigs[2] == event_signature("book", {"cabin": "economy"}) and sigs[4] == event_signature("notify", {})
    assert sigs[3] is None


def test_an_episode_from_before_call_times_and_signatures_still_decodes():
    ep = only_episode(Trace().start().call("x", "c1", 1).ok("c1", 2).end(Outcome.SUCCESS, 3).events)
    old = orjson.loads(encode(ep))
    for call in old["calls"]:
        del call["at"], call["signature"]
    back = msgspec.json.decode(orjson.dumps(old), type=EpisodeDistilled)
    assert [(c.tool, c.ok, c.at, c.signature) for c in back.calls] == [("x", True, None, None)]


def test_started_and_ended_are_the_earliest_and_latest_times_not_the_first_and_last_events():
    t = Trace().start(at=10).say("clock skew", 3).say("later", 40).end(Outcome.SUCCESS, 20)
    ep = only_episode(t.events)
    assert (ep.started_at, ep.ended_at, ep.duration_s) == (T0 + timedelta(seconds=3), T0 + timedelta(seconds=40), 37.0)


def test_a_long_task_is_cut_in_the_summary():
    ep = only_episode(Trace().start("t" * 200).end(Outcome.SUCCESS, 1).events)
    assert ep.task == "t" * 200
    assert ep.summary.startswith("success: " + "t" * 120 + "... | ")


def test_two_agents_may_share_a_session_id():
    a = Trace(agent="researcher", session_id="s").start().end(Outcome.SUCCESS, 1)
    b = Trace(agent="scraper", session_id="s").start().end(Outcome.FAILURE, 1)
    out = distill({}, a.events + b.events)
    assert {(e.agent, e.outcome) for e in out.episodes} == {
        ("researcher", Outcome.SUCCESS),
        ("scraper", Outcome.FAILURE),
    }
    assert len({e.episode_id for e in out.episodes}) == 2
    assert set(out.states) == {session_key("researcher", "s"), session_key("scraper", "s")}


def test_episode_id_is_deterministic_across_replays_and_distinct_per_session():
    events = Trace().start().call("x", "c", 1).ok("c", 2).end(Outcome.SUCCESS, 3).events
    assert encode(only_episode(events)) == encode(only_episode(list(events)))
    assert episode_id_for("a", "s1") == episode_id_for("a", "s1")
    assert (
        len(
            {
                episode_id_for("a", "s1"),
                episode_id_for("a", "s2"),
                episode_id_for("b", "s1"),
                episode_id_for("a\x1fs", "1"),
            }
        )
        >= 3
    )


# ---- pinned limits -----------------------------------------------------------------------------


def test_pinned_limits():
    assert (distiller.MAX_ERRORS, distiller.MAX_LESSONS, distiller.MAX_TOOLS, distiller.MAX_TEXT) == (50, 20, 64, 300)


def test_at_most_50_errors_are_kept():
    t = Trace().start()
    for i in range(60):
        t.call(f"tool{i}", f"c{i}", 1).fail(f"c{i}", 2, f"error {i}")
    ep = only_episode(t.end(Outcome.FAILURE, 3).events)
    assert len(ep.errors) == 50
    assert [e.tool for e in ep.errors] == [f"tool{i}" for i in range(50)]


def test_at_most_20_lessons_are_kept():
    t = Trace().start()
    for i in range(30):
        t.call(f"tool{i}", f"c{i}", 1).fail(f"c{i}", 2, f"error {i}")
    ep = only_episode(t.end(Outcome.FAILURE, 3).events)
    assert len(ep.lessons) == 20
    assert all(l.kind is LessonKind.FAILURE for l in ep.lessons)


def test_at_most_64_distinct_tools_are_listed_but_every_call_counts():
    t = Trace().start()
    for i in range(70):
        t.call(f"tool{i}", f"c{i}", 1).ok(f"c{i}", 1)
    ep = only_episode(t.end(Outcome.SUCCESS, 2).events)
    assert ep.tools == [f"tool{i}" for i in range(64)]
    assert ep.tool_calls == 70


def test_texts_kept_from_the_trace_are_cut_at_300_characters():
    t = (
        Trace()
        .start("")
        .user("u" * 400, 1)
        .delegate("deployer", "d" * 400, 2)
        .delegated("deployer", Outcome.FAILURE, 3, summary="s" * 400)
        .end(Outcome.FAILURE, 4)
    )
    ep = only_episode(t.events)
    assert ep.task == "u" * 300
    assert ep.delegations[0].task == "d" * 300
    assert ep.lessons[0].text == "delegation to deployer failed: " + "s" * 300


# ---- at-least-once delivery -------------------------------------------------------------------


def _session(agent: str = "support", session_id: str = "s1") -> Trace:
    return (
        Trace(agent, session_id)
        .start()
        .call("http_get", "c1", 1)
        .fail("c1", 2, "Too Many Requests", 429)
        .call("http_get", "c2", 6)
        .ok("c2", 7)
        .end(Outcome.SUCCESS, 8)
    )


def test_a_redelivered_event_in_a_later_batch_is_a_duplicate_and_changes_nothing():
    events = _session().events
    first = distill({}, events[:3])
    again = distill(first.states, events[1:3])
    assert (again.duplicates, again.late, again.episodes) == (2, 0, [])
    key = session_key("support", "s1")
    assert encode_state(again.states[key]) == encode_state(first.states[key])


def test_a_redelivered_event_in_the_same_batch_is_a_duplicate():
    events = _session().events
    out = distill({}, events + events[2:4])
    assert (out.duplicates, out.late, len(out.episodes)) == (2, 0, 1)
    assert encode(out.episodes[0]) == encode(only_episode(events))


def test_events_after_session_end_are_late_and_change_nothing():
    events = _session().events
    closed = distill({}, events)
    extra = Trace()
    extra.events = list(events)
    extra.say("one more thing", 20)
    later = distill(closed.states, extra.events[-1:])
    assert (later.late, later.duplicates, later.episodes) == (1, 0, [])
    key = session_key("support", "s1")
    assert encode_state(later.states[key]) == encode_state(closed.states[key])


def test_events_after_session_end_in_the_same_batch_are_late():
    t = _session()
    t.say("after the end", 9).say("and again", 10)
    out = distill({}, t.events)
    assert (out.late, out.duplicates, len(out.episodes)) == (2, 0, 1)
    assert out.episodes[0].event_count == len(t.events) - 2


def test_a_closed_session_keeps_only_what_identifies_it():
    events = _session().events
    state = distill({}, events).states[session_key("support", "s1")]
    assert state.closed and state.last_seq == len(events) - 1 and state.outcome is Outcome.SUCCESS
    assert (state.tools, state.errors, state.lessons, state.pending, state.open_errors) == ([], [], [], {}, {})
    assert state.event_count == len(events) and state.last_event_id == events[-1].event_id


def test_prior_states_are_not_mutated():
    events = _session().events
    first = distill({}, events[:4])
    prior = dict(first.states)
    before = {k: encode_state(v) for k, v in prior.items()}
    out = distill(prior, events[4:])
    assert len(out.episodes) == 1
    assert {k: encode_state(v) for k, v in prior.items()} == before
    assert out.states[session_key("support", "s1")] is not prior[session_key("support", "s1")]


def test_events_are_applied_in_arrival_order_and_a_seq_skipped_earlier_is_dead_lettered_not_dropped():
    events = _session().events  # seqs 0-5
    shuffled = [events[3], events[0], events[5], events[1], events[2], events[4]]
    copy = list(shuffled)
    out = distill({}, shuffled)
    assert shuffled == copy  # the input is not reordered either
    # 3 opens the session and skips 0-2; 5 ends it and skips 4; the rest arrive after a higher seq
    assert [ev.seq for ev, _ in out.late_events] == [0, 1, 2, 4] and out.late == 4 and out.duplicates == 0
    assert all(r.startswith("order: ") and f"seq {ev.seq}, skipped earlier" in r for ev, r in out.late_events)
    assert [ep.event_count for ep in out.episodes] == [2]
    assert out.states[session_key("support", "s1")].skipped == [(0, 2), (4, 4)]


def test_out_of_order_events_get_the_same_verdicts_wherever_the_batches_end():
    events = _session().events
    arrival = [events[0], events[2], events[1], events[4], events[3], events[5], events[3]]
    whole = distill({}, arrival)
    assert [ev.seq for ev, _ in whole.late_events] == [1, 3, 3]  # the second 3 again: still out of order
    for cut in range(1, len(arrival)):
        first = distill({}, arrival[:cut])
        second = distill(first.states, arrival[cut:])
        assert [e.seq for e, _ in first.late_events + second.late_events] == [1, 3, 3]
        assert [encode(ep) for ep in first.episodes + second.episodes] == [encode(ep) for ep in whole.episodes]
        key = session_key("support", "s1")
        assert encode_state(second.states[key]) == encode_state(whole.states[key])


def test_a_seq_applied_already_is_a_duplicate_and_one_skipped_is_out_of_order():
    assert distiller.seq_verdict(4, [], 5) == distiller.APPLY
    assert distiller.seq_verdict(4, [], 4) == distiller.DUPLICATE
    assert distiller.seq_verdict(9, [(2, 3), (6, 8)], 7) == distiller.OUT_OF_ORDER
    assert distiller.seq_verdict(9, [(2, 3), (6, 8)], 5) == distiller.DUPLICATE
    assert distiller.skip_to(4, [], 5) == [] and distiller.skip_to(4, [(1, 2)], 8) == [(1, 2), (5, 7)]


def test_a_session_remembers_only_the_newest_skipped_ranges():
    skipped: list[tuple[int, int]] = []
    last = 0
    for k in range(distiller.MAX_SKIPPED + 3):
        skipped, last = distiller.skip_to(last, skipped, last + 2), last + 2
    assert len(skipped) == distiller.MAX_SKIPPED and skipped[0] == (7, 7) and skipped[-1] == (last - 1, last - 1)


def test_state_round_trips_through_its_table_encoding():
    state = distill({}, _session().events[:4]).states[session_key("support", "s1")]
    assert state.pending and state.open_errors  # an open call and an open error are in it
    assert decode_state(encode_state(state)) == state


def test_an_empty_batch_does_nothing():
    out = distill({"k": SessionState(agent="a", session_id="s")}, [])
    assert out == DistillOutput()


# ---- property: batching and redelivery never change the episodes -------------------------------

TOOLS = ["http_get", "shell", "crm_lookup"]
step = st.tuples(
    st.sampled_from(["call_ok", "call_fail", "retry", "say", "user", "delegate"]),
    st.sampled_from(TOOLS),
    st.sampled_from([None, 429, 500]),
    st.integers(0, 30),
)


@st.composite
def fleets(draw: Any) -> list[TraceEvent]:
    """Events of 1-3 sessions, interleaved as a partition would carry them (each session in seq order)."""
    per_session: list[list[TraceEvent]] = []
    for n in range(draw(st.integers(1, 3))):
        t = Trace(agent=draw(st.sampled_from(["support", "deployer"])), session_id=f"s{n}")
        at = draw(st.integers(0, 100))
        t.start(at=at)
        call = 0
        for kind, tool, status, dt in draw(st.lists(step, max_size=10)):
            at += dt
            call += 1
            cid = f"c{call}"
            if kind == "call_ok":
                t.call(tool, cid, at).ok(cid, at + 1)
            elif kind == "call_fail":
                t.call(tool, cid, at).fail(cid, at + 1, "Too Many Requests" if status == 429 else "boom", status)
            elif kind == "retry":  # a result that names its tool but matches no call
                t.ok(cid, at, tool=tool)
            elif kind == "say":
                t.say("working", at)
            elif kind == "user":
                t.user("hello", at)
            else:
                t.delegate("researcher", "look it up", at).delegated(
                    "researcher", draw(st.sampled_from(Outcome)), at + 5
                )
        if draw(st.booleans()) or n == 0:
            t.end(draw(st.sampled_from(Outcome)), at + 1)
        per_session.append(t.events)
    merged: list[TraceEvent] = []
    while any(per_session):
        live = [s for s in per_session if s]
        merged.append(draw(st.sampled_from(live)).pop(0))
    return merged


def feed(batches: list[list[TraceEvent]]) -> tuple[dict[str, bytes], dict[str, bytes], int, int]:
    """Run batches one after the other, states carried forward; episodes and final states as bytes."""
    states: dict[str, SessionState] = {}
    episodes: dict[str, bytes] = {}
    duplicates = late = 0
    for batch in batches:
        out = distill(states, batch)
        for ep in out.episodes:
            key = session_key(ep.agent, ep.session_id)
            assert key not in episodes, "an episode was emitted twice"
            episodes[key] = encode(ep)
        states = {**states, **out.states}
        duplicates += out.duplicates
        late += out.late
    return episodes, {k: encode_state(v) for k, v in states.items()}, duplicates, late


def split(events: list[TraceEvent], cuts: list[int]) -> list[list[TraceEvent]]:
    bounds = [0, *sorted({c % (len(events) + 1) for c in cuts}), len(events)]
    return [events[a:b] for a, b in zip(bounds, bounds[1:])]


PROPERTY = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPERTY
@given(fleets(), st.lists(st.integers(0, 200), max_size=6))
def test_any_split_into_batches_gives_byte_identical_episodes(events, cuts):
    whole = feed([events])
    assert feed(split(events, cuts)) == whole
    assert feed([[e] for e in events]) == whole
    assert whole[2:] == (0, 0)


@PROPERTY
@given(fleets(), st.integers(0, 200), st.integers(0, 200), st.lists(st.integers(0, 200), max_size=6))
def test_redelivering_from_any_earlier_offset_changes_nothing(events, a, b, cuts):
    """A consumer processed events[:stop], crashed, and resumes from an earlier offset ``resume``."""
    stop = a % (len(events) + 1)
    resume = min(b % (len(events) + 1), stop)
    clean_episodes, clean_states, _, _ = feed([events])
    delivered = events[:stop] + events[resume:]
    episodes, states, duplicates, late = feed(split(delivered, cuts))
    assert (episodes, states) == (clean_episodes, clean_states)
    assert duplicates + late == stop - resume  # every redelivered event is accounted for, nothing else


@PROPERTY
@given(fleets(), st.randoms(use_true_random=False), st.lists(st.integers(0, 200), max_size=6))
def test_events_out_of_seq_order_get_the_same_verdicts_however_they_are_batched_and_none_is_lost(events, rnd, cuts):
    shuffled = list(events)
    rnd.shuffle(shuffled)
    whole = feed([shuffled])
    assert feed(split(shuffled, cuts)) == whole
    assert feed([[e] for e in shuffled]) == whole
    _, states, duplicates, late = whole
    applied = sum(decode_state(raw).event_count for raw in states.values())
    assert duplicates == 0 and applied + late == len(events)  # each applied once or dead-lettered


# ---- real data: tau-bench through the importer and the codec ------------------------------------


def test_tau_bench_gives_200_episodes_84_successes_and_116_failures():
    if not TAU_BENCH.exists():
        pytest.skip(f"dataset missing: {TAU_BENCH}")
    decoded = [decode_trace(orjson.dumps(e), max_bytes=1_048_576) for e in openai_chat(TAU_BENCH, agent="airline")]
    rejections = [d for d in decoded if isinstance(d, Rejection)]
    assert rejections == []
    out = distill({}, decoded)
    assert (out.duplicates, out.late) == (0, 0)
    assert len(out.episodes) == 200
    assert len({e.episode_id for e in out.episodes}) == 200
    assert Counter(e.outcome for e in out.episodes) == {Outcome.SUCCESS: 84, Outcome.FAILURE: 116}
    # trajectory by trajectory, the outcome is the file's reward
    source = json.loads(TAU_BENCH.read_bytes())
    expected = {
        f"{TAU_BENCH.stem}-task{t['task_id']}-trial{t['trial']}": Outcome.SUCCESS
        if t["reward"] >= 1.0
        else Outcome.FAILURE
        for t in source
    }
    assert {e.session_id: e.outcome for e in out.episodes} == expected
    assert sum(e.tool_calls for e in out.episodes) == 1164
    # the tool errors of the file ("Error: ...") that were never retried successfully are failure lessons
    assert any(l.kind is LessonKind.FAILURE and l.tool for e in out.episodes for l in e.lessons)
    assert all(
        any(l.kind is LessonKind.SUCCESS for l in e.lessons)
        for e in out.episodes
        if e.outcome is Outcome.SUCCESS and e.tools
    )


def test_a_closed_sessions_marker_stores_only_what_identifies_it():
    """The worker keeps a marker per closed session (late and redelivered events are recognised by
    it), so its encoding leaves out every empty default: 214 bytes instead of 468 on the sample fleet."""
    from somnus.processors.sessions.distiller import decode_state, encode_state
    from somnus.sample import generate

    events = [decode_trace(orjson.dumps(e), 1 << 20) for e in generate(sessions=40, seed=4)]
    out = distill({}, events)
    markers = [s for s in out.states.values() if s.closed]
    assert markers
    for marker in markers:
        raw = encode_state(marker)
        assert set(orjson.loads(raw)) <= {
            "agent",
            "session_id",
            "last_seq",
            "closed",
            "outcome",
            "event_count",
            "ended_at",
            "last_event_id",
        }
        assert decode_state(raw) == marker
    # a state written before (every field present) still decodes to the same marker
    full = msgspec.json.encode(msgspec.structs.asdict(markers[0]))
    assert decode_state(full) == markers[0]


def test_an_abandoned_session_is_a_failure_that_says_so_and_ends_at_its_last_event():
    t = Trace().start().call("http_get", "c1", 1).fail("c1", 2, "boom", 500)  # no end: its runtime died
    open_state = distill({}, t.events).states[session_key("support", "s1")]
    before = encode_state(open_state)
    marker, ep = distiller.abandon(open_state, "abandoned: no event for 3600 s of stream time")
    assert encode_state(open_state) == before  # the prior state is not modified
    assert marker.closed and marker.last_seq == open_state.last_seq and marker.outcome is Outcome.FAILURE
    assert ep.outcome is Outcome.FAILURE and ep.ended_at == T0 + timedelta(seconds=2) and ep.event_count == 3
    assert [lesson.text for lesson in ep.lessons] == [
        "session abandoned: no event for 3600 s of stream time; 1 tool calls (last tool: http_get)",
        "http_get failed with 'HTTP 500: boom' and it was never resolved (1 attempt)",
    ]
