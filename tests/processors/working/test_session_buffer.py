"""somnus.processors.working.session_buffer: the session ring buffer, summaries, the token budget, idempotence.

Run as a module for the benchmark: ``python -m tests.processors.working.test_session_buffer``.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta, timezone
from pathlib import Path

import msgspec
import orjson
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from somnus.importers import openai_chat
from somnus.processors.sessions.distiller import session_key
from somnus.processors.working import session_buffer as wm
from somnus.processors.working.session_buffer import (
    WorkingMemorySettings,
    add,
    apply,
    clip,
    content_words,
    decode_state,
    encode_state,
    estimate_tokens,
    extractive_summary,
    message,
    message_from_event,
    remember,
    resolve_max_tokens,
    summary_line,
)
from somnus.schemas.codec import decode_trace
from somnus.schemas.events import (
    TraceEvent,
)
from somnus.schemas.working_memory import (
    BufferedMessage,
    CompressionReason,
    MessagesSummarised,
    Role,
    SummariesMerged,
    SummaryEvicted,
    WorkingMemoryEvent,
    WorkingMemoryState,
    summary_id_for,
)
from tests import factories

T0 = datetime(2024, 5, 15, 15, 0, tzinfo=timezone.utc)
TAU_BENCH = Path(__file__).resolve().parents[4] / "shared" / "datasets" / "tau-bench-airline" / "gpt-4o-airline.json"


def Trace(agent: str = "support", session_id: str = "s1") -> factories.Trace:
    """One session's trace events, an event a second; a session starts as a rebooking by user u1."""
    return factories.Trace(agent, session_id, t0=T0, task="rebook a flight", user_id="u1")


_events = msgspec.json.Decoder(list[WorkingMemoryEvent])


def empty(agent: str = "support", session_id: str = "s1", user_id: str | None = None) -> WorkingMemoryState:
    return WorkingMemoryState(agent=agent, session_id=session_id, user_id=user_id)


def msg(seq: int, text: str | None = None, role: Role = Role.USER) -> BufferedMessage:
    return message(seq, T0 + timedelta(seconds=seq), role, text if text is not None else f"message number {seq}.")


def fill(
    state: WorkingMemoryState,
    texts: list[str],
    cfg: WorkingMemorySettings,
    start: int = 0,
) -> tuple[WorkingMemoryState, list[WorkingMemoryEvent]]:
    events: list[WorkingMemoryEvent] = []
    for i, text in enumerate(texts, start):
        state, out = add(state, msg(i, text), cfg)
        events += out
    return state, events


def check_invariants(state: WorkingMemoryState, cfg: WorkingMemorySettings) -> None:
    assert len(state.messages) <= cfg.buffer_size
    assert len(state.summaries) <= cfg.summary_capacity
    assert state.message_tokens == sum(m.tokens for m in state.messages)
    assert state.summary_tokens == sum(s.tokens for s in state.summaries)
    for s in state.summaries:
        assert s.tokens == estimate_tokens(summary_line(s)) + wm.MESSAGE_OVERHEAD_TOKENS
        assert len(s.text) <= wm.MAX_SUMMARY_CHARS
    seqs = [m.seq for m in state.messages]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)


# ---- the pinned numbers ---------------------------------------------------------------------


def test_settings_defaults_are_the_designs():
    cfg = WorkingMemorySettings()
    assert (
        cfg.buffer_size,
        cfg.summary_multiplier,
        cfg.summary_batch,
        cfg.keep_recent,
        cfg.max_tokens,
        cfg.model_context_tokens,
    ) == (50, 10, 10, 10, -1, 200_000)
    assert cfg.summary_capacity == 500
    assert cfg.token_budget == 120_000  # 60% of 200K
    assert (
        wm.MAX_MESSAGE_CHARS,
        wm.MAX_SUMMARY_CHARS,
        wm.MAX_SENTENCE_CHARS,
        wm.MAX_SENTENCES_PER_MESSAGE,
        wm.MESSAGE_OVERHEAD_TOKENS,
        wm.CHARS_PER_TOKEN,
    ) == (4000, 600, 200, 4, 4, 4)


@pytest.mark.parametrize(
    ("max_tokens", "context", "budget"),
    [
        (-1, 200_000, 120_000),
        (-1, 100_000, 60_000),
        (-1, 26_666, 16_000),  # 15,999.6 -> clamped up
        (-1, 26_667, 16_000),  # 16,000.2 -> floor
        (-1, 30_000, 18_000),
        (-1, 8_192, 16_000),
        (-1, 1_000_000, 600_000),
        (-1, 1_000_001, 600_000),
        (-1, 999_990, 599_994),
        (5_000, 200_000, 5_000),
        (1, 1, 1),
    ],
)
def test_the_token_budget_is_sixty_percent_of_the_context_clamped(max_tokens, context, budget):
    assert resolve_max_tokens(max_tokens, context) == budget
    assert WorkingMemorySettings(max_tokens=max_tokens, model_context_tokens=context).token_budget == budget


@pytest.mark.parametrize(
    "kw",
    [
        {"max_tokens": 0},
        {"max_tokens": -2},
        {"buffer_size": 0},
        {"summary_batch": 1},
        {"summary_multiplier": 0},
        {"buffer_size": 5, "summary_batch": 6},
        {"buffer_size": 5, "keep_recent": 6},
        {"keep_recent": -1},
        {"model_context_tokens": 0},
    ],
)
def test_invalid_settings_are_refused(kw):
    with pytest.raises(ValueError):
        WorkingMemorySettings(**kw)


@pytest.mark.parametrize(
    ("text", "tokens"), [("", 0), ("a", 1), ("abcd", 1), ("abcde", 2), ("é" * 8, 2), ("x" * 4000, 1000)]
)
def test_tokens_are_characters_over_four_rounded_up(text, tokens):
    assert estimate_tokens(text) == tokens
    assert msg(0, text).tokens == tokens + 4 if text else True


@given(st.lists(st.text(max_size=40), max_size=8))
def test_the_token_estimate_is_subadditive(parts):
    assert estimate_tokens("".join(parts)) <= sum(map(estimate_tokens, parts))


def test_a_long_message_is_clipped_at_a_word_and_its_tokens_counted_on_what_is_kept():
    m = msg(0, "word " * 2000)
    assert len(m.text) <= 4000 and m.text.endswith("word…")
    assert m.tokens == math.ceil(len(m.text) / 4) + 4


@given(st.text(max_size=300), st.integers(1, 200))
def test_clip_never_exceeds_its_limit_and_keeps_short_texts(text, limit):
    out = clip(text, limit)
    assert len(out) <= limit
    if len(text) <= limit:
        assert out == text
    else:
        assert out.endswith("…") or limit <= 1


# ---- messages from trace events ------------------------------------------------------------


def test_trace_events_become_messages_in_the_words_of_their_kind():
    t = (
        Trace()
        .start()
        .user("Change my flight")
        .say("Sure.")
        .call("get_reservation", "c1", id="ABC", a=1)
        .result("c1", True, "get_reservation", output='{"status": "ok"}')
        .result("c2", False, "book", error="Too Many Requests", http_status=429)
        .result("c3", True)
        .delegate("ops")
        .end()
    )
    texts = [(m.role, m.text, m.tool) if m else None for m in map(message_from_event, t.events)]
    assert texts == [
        None,
        (Role.USER, "Change my flight", None),
        (Role.AGENT, "Sure.", None),
        (Role.TOOL_CALL, 'get_reservation({"a":1,"id":"ABC"})', "get_reservation"),
        (Role.TOOL_RESULT, 'get_reservation: {"status": "ok"}', "get_reservation"),
        (Role.TOOL_RESULT, "book failed: HTTP 429: Too Many Requests", "book"),
        (Role.TOOL_RESULT, "tool: ok", None),
        None,
        None,
    ]


def test_session_start_sets_the_user_and_task_and_session_end_closes():
    t = Trace().start(task="rebook HAT030", user_id="u7").user("hi").delegate("ops").end().user("late")
    out = remember({}, t.events)
    s = out.states[session_key("support", "s1")]
    assert (s.user_id, s.task, s.closed, s.last_seq, [m.text for m in s.messages]) == (
        "u7",
        "rebook HAT030",
        True,
        3,
        ["hi"],
    )
    assert out.late == 1
    again = remember(out.states, Trace().start().user("x").events)
    assert again.late == 2 and again.states[session_key("support", "s1")] == s


# ---- the ring buffer and the extended buffer -----------------------------------------------


def test_overflow_summarises_the_oldest_batch_of_ten_into_one_entry():
    cfg = WorkingMemorySettings()
    state, events = fill(empty(user_id="u1"), [f"message number {i}." for i in range(50)], cfg)
    assert events == [] and len(state.messages) == 50 and state.summaries == ()
    state, events = add(state, msg(50), cfg)
    (ev,) = events
    assert isinstance(ev, MessagesSummarised) and ev.reason is CompressionReason.OVERFLOW
    assert (ev.agent, ev.session_id, ev.user_id, ev.at) == ("support", "s1", "u1", T0 + timedelta(seconds=50))
    s = ev.summary
    assert (s.level, s.first_seq, s.last_seq, s.messages, s.first_ts, s.last_ts) == (
        0,
        0,
        9,
        10,
        T0,
        T0 + timedelta(seconds=9),
    )
    assert s.summary_id == summary_id_for("support", "s1", 0, 0, 9)
    assert state.summaries == (s,)
    assert [m.seq for m in state.messages] == list(range(10, 51))
    assert state.summarised == 10
    check_invariants(state, cfg)
    # the next overflow comes after 10 more messages (the buffer holds 41 now)
    state, events = fill(state, ["more."] * 9, cfg, start=51)
    assert events == []
    state, events = add(state, msg(60), cfg)
    assert [(e.summary.first_seq, e.summary.last_seq) for e in events] == [(10, 19)]


def test_an_overflow_batch_never_reaches_into_the_newest_keep_recent():
    cfg = WorkingMemorySettings(buffer_size=4, summary_batch=4, keep_recent=2)
    state, events = fill(empty(), [f"m{i}." for i in range(5)], cfg)
    assert [(e.summary.first_seq, e.summary.last_seq) for e in events] == [(0, 2)]
    assert [m.seq for m in state.messages] == [3, 4]


def test_a_summary_names_its_seq_range_size_and_tools():
    cfg = WorkingMemorySettings(buffer_size=3, summary_batch=3, keep_recent=0)
    state = empty()
    for i, m in enumerate(
        [
            message(0, T0, Role.TOOL_CALL, "get_user({})", "get_user"),
            message(1, T0, Role.TOOL_RESULT, "get_user failed: HTTP 404", "get_user"),
            message(2, T0, Role.TOOL_CALL, "search({})", "search"),
            message(3, T0, Role.USER, "thanks"),
        ]
    ):
        state, _ = add(state, m, cfg)
    assert summary_line(state.summaries[0]) == (
        "seq 0-2 (3 messages; tools: get_user, search): tool_call: get_user({}) | "
        "tool_result: get_user failed: HTTP 404 | tool_call: search({})"
    )


def test_the_extended_buffer_rotates_dropping_the_oldest_summary():
    cfg = WorkingMemorySettings(buffer_size=4, summary_multiplier=2, summary_batch=2, keep_recent=0)
    assert cfg.summary_capacity == 8
    state, events = fill(empty(), [f"turn {i} about topic{i}." for i in range(40)], cfg)
    summarised = [e for e in events if isinstance(e, MessagesSummarised)]
    evicted = [e for e in events if isinstance(e, SummaryEvicted)]
    # 40 messages, 4 kept: 36 summarised in 18 batches of 2; 8 summaries kept, 10 evicted oldest first
    assert [(e.summary.first_seq, e.summary.last_seq) for e in summarised] == [(i, i + 1) for i in range(0, 36, 2)]
    assert [e.summary for e in evicted] == [e.summary for e in summarised[:10]]
    assert all(e.reason is CompressionReason.CAPACITY for e in evicted)
    assert [s.first_seq for s in state.summaries] == list(range(20, 36, 2))
    assert (len(state.summaries), state.evicted, state.summarised) == (8, 10, 36)
    assert [m.seq for m in state.messages] == [36, 37, 38, 39]
    # an eviction is emitted right after the summary that caused it
    i = events.index(evicted[0])
    assert isinstance(events[i - 1], MessagesSummarised) and events[i - 1].summary.first_seq == 16
    check_invariants(state, cfg)


def test_with_the_defaults_the_extended_buffer_holds_five_hundred_summaries():
    cfg = WorkingMemorySettings()
    state, events = fill(empty(), ["ok."] * (50 + 500 * 10), cfg)
    assert len(state.summaries) == 500 and not any(isinstance(e, SummaryEvicted) for e in events)
    state, events = fill(state, ["ok."] * 10, cfg, start=5050)
    assert [type(e) for e in events] == [MessagesSummarised, SummaryEvicted]
    assert events[1].summary.first_seq == 0 and state.summaries[0].first_seq == 10


# ---- the token budget -----------------------------------------------------------------------


def test_over_budget_the_oldest_messages_are_summarised_and_the_newest_stay_intact():
    cfg = WorkingMemorySettings(max_tokens=300, keep_recent=3, summary_batch=4)
    filler = "the passenger asked about baggage allowance and seat upgrades. " * 2
    texts = [f"Message {i}: " + filler for i in range(12)]
    state, events = fill(empty(), texts, cfg)
    assert all(e.reason is CompressionReason.TOKEN_BUDGET for e in events)
    assert state.tokens <= 300
    assert state.messages[-3:] == tuple(msg(i, texts[i]) for i in (9, 10, 11))  # untouched, byte for byte
    check_invariants(state, cfg)


def test_the_newest_messages_are_kept_whole_even_when_they_alone_exceed_the_budget():
    cfg = WorkingMemorySettings(max_tokens=100, keep_recent=2, summary_batch=2)
    big = ["x" * 400, "y" * 400, "z" * 400]
    state, events = fill(empty(), big, cfg)
    assert [m.text for m in state.messages] == big[1:] and state.summaries == ()
    assert state.tokens > 100
    # the summary of the first message was made and then evicted for the budget
    assert [type(e) for e in events] == [MessagesSummarised, SummaryEvicted]
    assert events[1].reason is CompressionReason.TOKEN_BUDGET


def test_summaries_are_merged_a_batch_at_a_time_before_any_is_dropped():
    cfg = WorkingMemorySettings(buffer_size=2, summary_batch=2, keep_recent=0, max_tokens=100_000)
    words = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel"]
    state, _ = fill(empty(), [f"Talked about {w} today. The {w} plan is ready." for w in words[:6]], cfg)
    assert [(s.first_seq, s.last_seq) for s in state.summaries] == [(0, 1), (2, 3)]
    assert [m.seq for m in state.messages] == [4, 5]
    # a budget the next add exceeds by a little: merging the two oldest summaries is enough
    tight = WorkingMemorySettings(buffer_size=2, summary_batch=2, keep_recent=1, max_tokens=state.tokens + 10)
    state2, events = add(state, msg(6, "Talked about golf today."), tight)
    assert [(type(e), e.reason) for e in events] == [
        (MessagesSummarised, CompressionReason.OVERFLOW),
        (SummariesMerged, CompressionReason.TOKEN_BUDGET),
    ]
    merged = events[1]
    assert merged.merged == tuple(s.summary_id for s in state.summaries)
    assert (merged.summary.level, merged.summary.first_seq, merged.summary.last_seq, merged.summary.messages) == (
        1,
        0,
        3,
        4,
    )
    assert merged.summary.summary_id == summary_id_for("support", "s1", 1, 0, 3)
    assert [(s.level, s.first_seq, s.last_seq) for s in state2.summaries] == [(1, 0, 3), (0, 4, 5)]
    assert state2.tokens <= tight.token_budget and state2.evicted == 0
    check_invariants(state2, tight)
    assert [m.seq for m in state2.messages] == [6]
    # tighter still: room for the two newest messages only -> merge again (level 2), then drop
    ok = msg(7, "ok")
    tighter = WorkingMemorySettings(
        buffer_size=2, summary_batch=2, keep_recent=2, max_tokens=state2.message_tokens + ok.tokens + 1
    )
    state3, events = add(state2, ok, tighter)
    assert [type(e) for e in events] == [SummariesMerged, SummaryEvicted]
    assert [(e.summary.level, e.summary.first_seq, e.summary.last_seq) for e in events] == [(2, 0, 5), (2, 0, 5)]
    assert events[0].merged == tuple(s.summary_id for s in state2.summaries)
    assert state3.summaries == () and [m.seq for m in state3.messages] == [6, 7] and state3.evicted == 1


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    sizes=st.lists(st.integers(0, 600), min_size=1, max_size=60),
    buffer_size=st.integers(2, 12),
    batch=st.integers(2, 12),
    keep=st.integers(0, 12),
    multiplier=st.integers(1, 3),
    budget=st.integers(20, 2000),
)
@example(sizes=[400] * 10, buffer_size=4, batch=2, keep=1, multiplier=1, budget=20)
def test_compression_conserves_every_message_and_keeps_the_newest_intact(
    sizes, buffer_size, batch, keep, multiplier, budget
):
    batch, keep = min(batch, buffer_size), min(keep, buffer_size)
    cfg = WorkingMemorySettings(
        buffer_size=buffer_size, summary_batch=batch, keep_recent=keep, summary_multiplier=multiplier, max_tokens=budget
    )
    texts = [f"Sentence {i} about seats. " * (n // 24 + 1) for i, n in enumerate(sizes)]
    state, events = fill(empty(), texts, cfg)
    check_invariants(state, cfg)
    # the newest min(keep, n) messages are exactly what was added
    newest = min(keep, len(texts))
    if newest:
        assert state.messages[-newest:] == tuple(msg(i, texts[i]) for i in range(len(texts) - newest, len(texts)))
    # within budget, or all that is left is at most keep_recent messages
    assert state.tokens <= cfg.token_budget or (state.summaries == () and len(state.messages) <= keep)
    # every seq is in exactly one place: a buffered message, a kept summary, or an evicted summary
    evicted = [e.summary for e in events if isinstance(e, SummaryEvicted)]
    covered: list[int] = []
    for s in sorted([*evicted, *state.summaries], key=lambda s: s.first_seq):
        covered += range(s.first_seq, s.last_seq + 1)
    covered += [m.seq for m in state.messages]
    assert covered == list(range(len(texts)))
    assert state.summarised + len(state.messages) == len(texts)


# ---- the summariser -------------------------------------------------------------------------


def test_sumbasic_squares_the_weights_of_what_it_picked_so_the_next_pick_says_something_else():
    parts = [
        ("user", "Flight refund requested."),
        ("user", "Refund for flight please."),
        ("user", "Baggage allowance question."),
    ]
    # weights: flight 2/8, refund 2/8, the rest 1/8. Scores: 5/24, 1/4, 1/8 -> pick #2 first;
    # squared, flight and refund weigh 1/16, so #1 scores 1/12 < #3's 1/8 and #3 goes second.
    assert extractive_summary(parts, 70) == "user: Refund for flight please. | user: Baggage allowance question."
    # with room for everything, all three in message order
    assert extractive_summary(parts, 600) == (
        "user: Flight refund requested. | user: Refund for flight please. | user: Baggage allowance question."
    )


def test_sentences_of_one_message_share_its_label_and_ties_go_to_the_earlier_sentence():
    assert extractive_summary([("agent", "Alpha one. Bravo two."), ("user", "Charlie three.")], 600) == (
        "agent: Alpha one. Bravo two. | user: Charlie three."
    )
    assert extractive_summary([("agent", "Alpha one. Bravo two.")], 20) == "agent: Alpha one."


def test_only_the_first_four_sentences_of_a_message_are_read():
    text = " ".join(f"Sentence{i} here." for i in range(10))
    out = extractive_summary([("user", text)], 600)
    assert out == "user: Sentence0 here. Sentence1 here. Sentence2 here. Sentence3 here."


def test_content_words_drop_stop_words_short_words_and_numbers():
    assert content_words("I would like to CHANGE my 2 flights on 05/20, ok? HAT030 it is") == [
        "change",
        "flights",
        "hat030",
    ]


@settings(max_examples=80, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from(["user", "agent", ""]), st.text(max_size=500)), max_size=12), st.integers(1, 700)
)
def test_a_summary_fits_its_limit_and_is_deterministic(parts, limit):
    out = extractive_summary(parts, limit)
    assert len(out) <= limit
    assert out == extractive_summary(list(parts), limit)


# ---- idempotence and replay -----------------------------------------------------------------


def conversation(n: int, session_id: str = "s1") -> list[TraceEvent]:
    t = Trace(session_id=session_id).start(user_id=f"user-of-{session_id}")
    for i in range(n):
        if i % 4 == 0:
            t.user(f"Please change reservation R{i}. I need an aisle seat on flight F{i}.")
        elif i % 4 == 1:
            t.call("update_reservation", f"c{i}", reservation=f"R{i}")
        elif i % 4 == 2:
            t.result(f"c{i - 1}", i % 8 != 2, "update_reservation", error="seat not available", output="done")
        else:
            t.say(f"I updated reservation R{i - 3}. Anything else?")
    return t.end().events


CFG_SMALL = WorkingMemorySettings(buffer_size=8, summary_batch=3, keep_recent=2, summary_multiplier=2, max_tokens=400)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_any_batching_with_redeliveries_gives_the_same_states_and_events(data):
    events = conversation(30, "s1") + conversation(25, "s2")
    once = remember({}, events, CFG_SMALL)
    # deliver in random batches; each batch may redeliver a random earlier stretch (at least once)
    states: dict[str, WorkingMemoryState] = {}
    emitted: list[WorkingMemoryEvent] = []
    i = 0
    while i < len(events):
        n = data.draw(st.integers(1, 12))
        back = data.draw(st.integers(0, i))
        batch = events[i - back : i + n]
        out = remember(states, batch, CFG_SMALL)
        states = {**states, **out.states}
        emitted += out.events
        i += n
    assert {k: encode_state(v) for k, v in states.items()} == {k: encode_state(v) for k, v in once.states.items()}
    assert sorted(map(wm._state_encoder.encode, emitted)) == sorted(map(wm._state_encoder.encode, once.events))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_events_out_of_seq_order_give_the_same_states_and_events_however_they_are_batched(data):
    events = data.draw(st.permutations(conversation(30, "s1") + conversation(25, "s2")))
    once = remember({}, events, CFG_SMALL)
    cuts = sorted(set(data.draw(st.lists(st.integers(1, len(events) - 1), max_size=8))))
    states: dict[str, WorkingMemoryState] = {}
    emitted: list[WorkingMemoryEvent] = []
    for lo, hi in zip([0, *cuts], [*cuts, len(events)]):
        out = remember(states, events[lo:hi], CFG_SMALL)
        states = {**states, **out.states}
        emitted += out.events
    assert {k: encode_state(v) for k, v in states.items()} == {k: encode_state(v) for k, v in once.states.items()}
    assert sorted(map(wm._state_encoder.encode, emitted)) == sorted(map(wm._state_encoder.encode, once.events))


def test_remember_does_not_modify_the_prior_states():
    first = remember({}, conversation(10)[:8], CFG_SMALL)
    before = {k: encode_state(v) for k, v in first.states.items()}
    remember(first.states, conversation(10)[8:], CFG_SMALL)
    assert {k: encode_state(v) for k, v in first.states.items()} == before


def test_a_compacted_closed_session_still_ignores_late_and_redelivered_events():
    events = conversation(12)
    closed = remember({}, events, CFG_SMALL).states[session_key("support", "s1")]
    small = wm.compact(closed)
    assert (small.closed, small.last_seq, small.messages, small.summaries, small.tokens) == (
        True,
        closed.last_seq,
        (),
        (),
        0,
    )
    again = remember({session_key("support", "s1"): small}, events, CFG_SMALL)
    assert again.events == [] and again.late == len(events)
    assert len(encode_state(small)) < len(encode_state(closed)) // 5


def test_apply_ignores_a_redelivered_event():
    events = conversation(5)
    state = empty()
    for ev in events[:4]:
        state, _ = apply(state, ev)
    again, out = apply(state, events[2])
    assert again is state and out == []


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 40))
def test_states_and_events_round_trip_through_their_encodings(n):
    out = remember({}, conversation(n), CFG_SMALL)
    for state in out.states.values():
        assert decode_state(encode_state(state)) == state
    assert _events.decode(msgspec.json.encode(out.events)) == out.events


@pytest.fixture(scope="module")
def tau_events() -> list[TraceEvent]:
    if not TAU_BENCH.exists():
        pytest.skip(f"dataset missing: {TAU_BENCH}")
    return [decode_trace(orjson.dumps(e), max_bytes=1_048_576) for e in openai_chat(TAU_BENCH, agent="airline")]


def test_tau_bench_sessions_replay_byte_identically_and_keep_their_invariants(tau_events):
    cfg = WorkingMemorySettings(buffer_size=20, summary_batch=5, keep_recent=5, max_tokens=3000)
    a = remember({}, tau_events, cfg)
    b = remember({}, tau_events, cfg)
    assert len(a.states) == 200
    assert [encode_state(s) for s in a.states.values()] == [encode_state(s) for s in b.states.values()]
    assert msgspec.json.encode(a.events) == msgspec.json.encode(b.events)
    for s in a.states.values():
        check_invariants(s, cfg)
        assert s.closed and s.tokens <= 3000 or len(s.messages) <= 5
    summaries = [e.summary for e in a.events if isinstance(e, MessagesSummarised)]
    assert summaries and all(s.text for s in summaries)
    assert any("tools: " in summary_line(s) for s in summaries)


# ---- benchmark --------------------------------------------------------------------------------


def bench(repeat: int = 3) -> None:
    """Buffer add latency over every tau-bench message, played as one long session (default settings:
    an overflow summary every 10 adds once the buffer is full, 500 summaries kept)."""
    import time

    import numpy as np

    evs = [decode_trace(orjson.dumps(e), max_bytes=1_048_576) for e in openai_chat(TAU_BENCH, agent="airline")]
    msgs = [m for m in map(message_from_event, evs) if m is not None]
    msgs = [msgspec.structs.replace(m, seq=i) for i, m in enumerate(msgs)]
    cfg = WorkingMemorySettings()
    for r in range(repeat):
        state, times, overflow, cpu = empty(), [], [], []
        for m in msgs:
            t0, c0 = time.perf_counter_ns(), time.thread_time_ns()
            state, events = add(state, m, cfg)
            cpu.append((time.thread_time_ns() - c0) / 1e3)
            dt = (time.perf_counter_ns() - t0) / 1e3
            (overflow if events else times).append(dt)
        every = np.array(times + overflow)
        print(
            f"run {r}: {len(every)} adds, wall p50 {np.percentile(every, 50):.1f} us, "
            f"p99 {np.percentile(every, 99):.1f} us, "
            f"thread CPU p99 {np.percentile(cpu, 99):.1f} us, "
            f"max {every.max():.0f} us | plain adds p99 {np.percentile(times, 99):.1f} us | "
            f"adds that summarised ({len(overflow)}) p50 {np.percentile(overflow, 50):.0f} us "
            f"p99 {np.percentile(overflow, 99):.0f} us | {len(state.summaries)} summaries, "
            f"state {len(encode_state(state)) / 1024:.0f} KiB"
        )


if __name__ == "__main__":
    bench()
