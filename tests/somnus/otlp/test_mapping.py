"""somnus.otlp.mapping: GenAI, OpenInference and OpenLLMetry spans become valid v1 trace events."""

from __future__ import annotations

import json
import random
from typing import Any

import orjson
import pytest

from somnus.otlp.mapping import OUTCOME_ATTRIBUTE, span_kind, trace_events
from somnus.otlp.spans import Span, SpanEvent
from somnus.schemas.codec import Rejection, decode_trace
from tests.somnus.otlp.spans_for_tests import T0, span


def valid(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    for e in events:
        got = decode_trace(json.dumps(e).encode(), max_bytes=1 << 20)
        assert not isinstance(got, Rejection), (e, got)
    return events


def kinds(events: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(e["agent"], e["type"]) for e in events]


def genai_trace() -> list[Any]:
    """An agent (GenAI conventions, latest) that chats, calls two tools (one fails), and delegates."""
    msgs_in = json.dumps(
        [
            {"role": "system", "parts": [{"type": "text", "content": "be brief"}]},
            {"role": "user", "parts": [{"type": "text", "content": "refund order 42"}]},
        ]
    )
    msgs_out = json.dumps(
        [{"role": "assistant", "parts": [{"type": "text", "content": "done: refunded"}], "finish_reason": "stop"}]
    )
    return [
        span(
            "1",
            "invoke_agent support",
            0,
            10,
            gen_ai__operation__name="invoke_agent",
            gen_ai__agent__name="support",
            gen_ai__conversation__id="conv-7",
            user__id="u1",
        ),
        span("2", "chat gpt-4o", 1, 2, parent="1", gen_ai__operation__name="chat", gen_ai__input__messages=msgs_in),
        span(
            "3",
            "execute_tool lookup_order",
            3,
            4,
            parent="1",
            gen_ai__operation__name="execute_tool",
            gen_ai__tool__name="lookup_order",
            gen_ai__tool__call__id="call_a",
            gen_ai__tool__call__arguments='{"order": 42}',
            gen_ai__tool__call__result='{"status": "paid"}',
        ),
        span(
            "4",
            "execute_tool refund",
            5,
            6,
            parent="1",
            status=2,
            message="gateway timed out",
            gen_ai__operation__name="execute_tool",
            gen_ai__tool__name="refund",
            gen_ai__tool__call__id="call_b",
            error__type="TimeoutError",
            http__response__status_code=504,
        ),
        span(
            "5",
            "invoke_agent billing",
            6,
            8,
            parent="1",
            gen_ai__operation__name="invoke_agent",
            gen_ai__agent__name="billing",
            gen_ai__conversation__id="conv-7",
            gen_ai__input__messages=json.dumps(
                [{"role": "user", "parts": [{"type": "text", "content": "retry refund"}]}]
            ),
        ),
        span(
            "6",
            "execute_tool refund",
            6.5,
            7,
            parent="5",
            gen_ai__operation__name="execute_tool",
            gen_ai__tool__name="refund",
            gen_ai__tool__call__id="call_c",
        ),
        span(
            "7",
            "chat gpt-4o",
            8.5,
            9.5,
            parent="1",
            gen_ai__operation__name="chat",
            gen_ai__input__messages=msgs_in,
            gen_ai__output__messages=msgs_out,
        ),
    ]


def test_genai_agent_tools_chat_and_delegation():
    events = valid(trace_events(genai_trace()))
    support = [e for e in events if e["agent"] == "support"]
    billing = [e for e in events if e["agent"] == "billing"]
    assert [e["type"] for e in support] == [
        "session_start",
        "user_message",
        "tool_call",
        "tool_result",
        "tool_call",
        "tool_result",
        "delegation",
        "delegation_result",
        "agent_message",
        "session_end",
    ]
    seqs = [e["seq"] for e in support]
    assert seqs[0] == T0 // 1000 * 16 and all(a < b for a, b in zip(seqs, seqs[1:]))
    assert seqs[6] == seqs[5] + 1  # the delegation starts at the instant the refund ends: one after it
    start = support[0]
    assert start["session_id"] == "conv-7" and start["payload"]["task"] == "refund order 42"
    assert start["payload"]["user_id"] == "u1" and start["payload"]["metadata"]["trace_id"] == "ab" * 16
    call, ok, _, failed = support[2:6]
    assert call["payload"] == {"tool": "lookup_order", "call_id": "call_a", "args": {"order": 42}}
    assert ok["payload"]["ok"] is True and ok["payload"]["output"] == '{"status": "paid"}'
    assert ok["payload"]["latency_ms"] == pytest.approx(1000.0)
    assert failed["payload"]["ok"] is False and failed["payload"]["error"] == "TimeoutError: gateway timed out"
    assert failed["payload"]["http_status"] == 504
    assert support[6]["payload"]["to_agent"] == "billing" and support[6]["payload"]["task"] == "retry refund"
    assert support[7]["payload"]["outcome"] == "success"
    assert support[8]["payload"]["text"] == "done: refunded"  # the repeated history is not said again
    assert support[-1]["payload"] == {"outcome": "success"}
    assert support[-1]["ts"] == "2024-05-18T02:40:10.000000Z"
    assert [e["type"] for e in billing] == ["session_start", "user_message", "tool_call", "tool_result", "session_end"]
    assert billing[0]["session_id"] == "conv-7"


def test_event_ids_are_deterministic_and_the_input_order_does_not_matter():
    spans = genai_trace()
    first = trace_events(spans)
    shuffled = spans[:] + spans[:2]  # duplicates too
    random.Random(3).shuffle(shuffled)
    assert trace_events(shuffled) == first
    assert len({e["event_id"] for e in first}) == len(first)
    other = [s.__class__(**{**{f: getattr(s, f) for f in s.__struct_fields__}, "trace_id": "cd" * 16}) for s in spans]
    assert not {e["event_id"] for e in trace_events(other)} & {e["event_id"] for e in first}


@pytest.mark.parametrize(
    ("attrs", "status", "want"),
    [
        ({}, 0, ("success", None)),
        ({}, 2, ("failure", "error")),
        ({"error__type": "BudgetExceeded"}, 0, ("failure", "BudgetExceeded")),
        ({OUTCOME_ATTRIBUTE.replace(".", "__"): "partial"}, 0, ("partial", None)),
        ({OUTCOME_ATTRIBUTE.replace(".", "__"): "success", "error__type": "X"}, 2, ("success", "X")),
    ],
)
def test_the_session_outcome_comes_from_the_root_span(attrs, status, want):
    root = span(
        "1",
        "invoke_agent a",
        0,
        1,
        status=status,
        gen_ai__operation__name="invoke_agent",
        gen_ai__agent__name="a",
        **attrs,
    )
    end = valid(trace_events([root]))[-1]
    assert (end["payload"]["outcome"], end["payload"].get("reason")) == want


def test_the_agent_spans_links_are_kept_in_the_session_metadata():
    from somnus.otlp.spans import SpanLink

    root = span("1", "invoke_agent a", 0, 1, gen_ai__operation__name="invoke_agent", gen_ai__agent__name="a")
    linked = root.__class__(
        **{**{f: getattr(root, f) for f in root.__struct_fields__}, "links": [SpanLink("cd" * 16, "00000000000000aa")]}
    )
    assert trace_events([linked])[0]["payload"]["metadata"]["links"] == ["cd" * 16 + "/00000000000000aa"]
    assert "links" not in trace_events([root])[0]["payload"]["metadata"]


def test_without_a_conversation_id_the_session_is_the_trace_and_the_agent_falls_back():
    root = span("1", "invoke_agent", 0, 1, gen_ai__operation__name="invoke_agent")
    events = trace_events([root])
    assert {e["session_id"] for e in events} == {"ab" * 16}
    assert {e["agent"] for e in events} == {"shop"}  # service.name
    assert {e["agent"] for e in trace_events([root], fallback_agent="tok")} == {"tok"}


def test_an_inner_span_of_the_same_agent_is_the_same_session():
    spans = [
        span("1", "invoke_agent a", 0, 4, gen_ai__operation__name="invoke_agent", gen_ai__agent__name="a"),
        span("2", "invoke_agent a", 1, 3, parent="1", gen_ai__operation__name="invoke_agent", gen_ai__agent__name="a"),
        span("3", "execute_tool t", 1.5, 2, parent="2", gen_ai__operation__name="execute_tool", gen_ai__tool__name="t"),
    ]
    assert kinds(valid(trace_events(spans))) == [
        ("a", "session_start"),
        ("a", "tool_call"),
        ("a", "tool_result"),
        ("a", "session_end"),
    ]


def test_older_span_events_carry_messages():
    events = [
        SpanEvent("gen_ai.user.message", T0, {"content": "what is my balance?"}),
        SpanEvent("gen_ai.choice", T0, {"message": json.dumps({"role": "assistant", "content": "12 EUR"})}),
        SpanEvent("gen_ai.content.prompt", T0, {"gen_ai.prompt": "old style prompt"}),
    ]
    spans = [
        span("1", "invoke_agent a", 0, 4, gen_ai__operation__name="invoke_agent", gen_ai__agent__name="a"),
        span("2", "chat m", 1, 2, parent="1", events=events, gen_ai__operation__name="chat"),
    ]
    got = [(e["type"], e["payload"].get("text")) for e in valid(trace_events(spans))]
    assert ("user_message", "what is my balance?") in got and ("user_message", "old style prompt") in got
    assert ("agent_message", "12 EUR") in got


def test_a_trace_without_agent_spans_is_one_session_per_root_holding_work():
    spans = [
        span("1", "POST /checkout", 0, 3),
        span(
            "2", "execute_tool pay", 1, 2, parent="1", gen_ai__operation__name="execute_tool", gen_ai__tool__name="pay"
        ),
        span("9", "GET /health", 0, 1, trace="cd" * 16),
    ]
    assert kinds(valid(trace_events(spans))) == [
        ("shop", "session_start"),
        ("shop", "tool_call"),
        ("shop", "tool_result"),
        ("shop", "session_end"),
    ]
    assert trace_events([spans[2]]) == []
    assert [e["type"] for e in trace_events([spans[1]])] == ["session_start", "tool_call", "tool_result", "session_end"]


# ---- OpenInference (https://github.com/Arize-ai/openinference, spec/semantic_conventions.md) ----------


def test_openinference_agent_tool_and_llm_spans():
    spans = [
        span(
            "1",
            "Agent.run",
            0,
            5,
            openinference__span__kind="AGENT",
            agent__name="travel",
            session__id="s-oi",
            user__id="u9",
            input__value="Book a flight to New York",
            output__value="Booked AA123",
        ),
        span(
            "2",
            "ChatCompletion",
            1,
            2,
            parent="1",
            openinference__span__kind="LLM",
            **{
                "llm.input_messages.0.message.role": "system",
                "llm.input_messages.0.message.content": "sys",
                "llm.input_messages.1.message.role": "user",
                "llm.input_messages.1.message.content": "Book a flight to New York",
                "llm.output_messages.0.message.role": "assistant",
                "llm.output_messages.0.message.content": "Searching flights",
            },
        ),
        span(
            "3",
            "search_flights",
            2,
            3,
            parent="1",
            status=2,
            message="no seats",
            openinference__span__kind="TOOL",
            tool__name="search_flights",
            input__value='{"to": "JFK"}',
            output__value="[]",
            events=[SpanEvent("exception", T0, {"exception.type": "NoSeats", "exception.message": "no seats"})],
        ),
    ]
    assert [span_kind(s) for s in spans] == ["agent", "chat", "tool"]
    events = valid(trace_events(spans))
    assert {(e["agent"], e["session_id"]) for e in events} == {("travel", "s-oi")}
    assert [e["type"] for e in events] == [
        "session_start",
        "user_message",
        "agent_message",
        "tool_call",
        "tool_result",
        "agent_message",
        "session_end",
    ]
    assert events[0]["payload"]["task"] == "Book a flight to New York" and events[0]["payload"]["user_id"] == "u9"
    assert events[3]["payload"]["args"] == {"to": "JFK"}
    assert events[4]["payload"]["ok"] is False and events[4]["payload"]["error"] == "NoSeats: no seats"
    assert events[5]["payload"]["text"] == "Booked AA123"


# ---- OpenLLMetry (https://github.com/traceloop/openllmetry: traceloop.* and gen_ai.prompt.N.*) --------


def test_openllmetry_workflow_tool_and_llm_spans():
    spans = [
        span(
            "1",
            "support_flow.workflow",
            0,
            5,
            traceloop__span__kind="workflow",
            traceloop__entity__name="support_flow",
            traceloop__workflow__name="support_flow",
            traceloop__association__properties__session_id="s-tl",
            traceloop__entity__input=json.dumps({"args": [], "kwargs": {"question": "reset my password"}}),
        ),
        span(
            "2",
            "openai.chat",
            1,
            2,
            parent="1",
            llm__request__type="chat",
            **{
                "gen_ai.prompt.0.role": "user",
                "gen_ai.prompt.0.content": "reset my password",
                "gen_ai.completion.0.role": "assistant",
                "gen_ai.completion.0.content": "I will send a link",
            },
        ),
        span(
            "3",
            "send_reset_link.tool",
            2,
            3,
            parent="1",
            traceloop__span__kind="tool",
            traceloop__entity__name="send_reset_link",
            traceloop__entity__input=json.dumps({"args": [], "kwargs": {"email": "a@b.c"}}),
            traceloop__entity__output=json.dumps("sent"),
        ),
        span("4", "pick_template.task", 2.1, 2.2, parent="3", traceloop__span__kind="task"),
    ]
    assert [span_kind(s) for s in spans] == ["agent", "chat", "tool", "other"]
    events = valid(trace_events(spans))
    assert {(e["agent"], e["session_id"]) for e in events} == {("support_flow", "s-tl")}
    assert [e["type"] for e in events] == [
        "session_start",
        "user_message",
        "agent_message",
        "tool_call",
        "tool_result",
        "session_end",
    ]
    assert events[0]["payload"]["task"] == "reset my password"
    assert events[3]["payload"] == {
        "tool": "send_reset_link",
        "call_id": "0000000000000003",
        "args": {"email": "a@b.c"},
    }
    assert events[4]["payload"]["ok"] is True and events[4]["payload"]["output"] == '"sent"'


def test_seqs_grow_across_traces_of_one_conversation():
    """A second turn with the same conversation id is later in seq: the pipeline sees it as late (a dead
    letter naming it), never as a silent duplicate of the first turn's seqs."""

    def turn(trace: str, at: float) -> list[dict[str, Any]]:
        return trace_events(
            [
                span(
                    "1",
                    "invoke_agent a",
                    at,
                    at + 1,
                    trace=trace,
                    gen_ai__operation__name="invoke_agent",
                    gen_ai__agent__name="a",
                    gen_ai__conversation__id="c",
                )
            ]
        )

    first, second = turn("ab" * 16, 0), turn("cd" * 16, 5)
    assert {e["session_id"] for e in first + second} == {"c"}
    assert max(e["seq"] for e in first) < min(e["seq"] for e in second)


# ---- properties ------------------------------------------------------------------------------------

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

KIND_ATTRS = {
    "agent_a": {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "a"},
    "agent_b": {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "b"},
    "tool": {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "t"},
    "chat": {"gen_ai.operation.name": "chat", "gen_ai.input.messages": json.dumps([{"role": "user", "content": "hi"}])},
    "other": {},
}


@st.composite
def span_trees(draw: Any) -> list[Any]:
    """A trace of 1-12 spans: each child starts after its parent and ends before it; any kinds; the root
    sometimes missing."""
    n = draw(st.integers(1, 12))
    spans: list[Any] = []
    for i in range(n):
        parent = spans[draw(st.integers(0, i - 1))] if i else None
        lo, hi = ((parent.start_ns - T0) / 1e9, (parent.end_ns - T0) / 1e9) if parent else (0.0, 100.0)
        a = draw(st.floats(lo, hi, allow_nan=False))
        b = draw(st.floats(a, hi, allow_nan=False))
        kind = draw(st.sampled_from(sorted(KIND_ATTRS)))
        spans.append(
            span(
                f"{i + 1:x}",
                kind,
                a,
                b,
                parent=parent.span_id if parent else "",
                status=draw(st.sampled_from([0, 2])),
                **{k.replace(".", "__"): v for k, v in KIND_ATTRS[kind].items()},
            )
        )
    if n > 1 and draw(st.booleans()):
        spans = spans[1:]  # the root never arrived
    return spans


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(span_trees(), st.randoms(use_true_random=False))
def test_any_trace_maps_to_valid_ordered_events_whatever_the_arrival_order(spans, rnd):
    events = valid(trace_events(spans))
    again = spans + [rnd.choice(spans)]
    rnd.shuffle(again)
    assert trace_events(again) == events
    assert len({e["event_id"] for e in events}) == len(events)
    by_session: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for e in events:
        by_session.setdefault((e["agent"], e["session_id"]), []).append(e)
    for evs in by_session.values():
        seqs = [e["seq"] for e in evs]
        assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
        assert [e["type"] for e in evs].count("session_start") == [e["type"] for e in evs].count("session_end")
    tool_spans = [
        s for s in spans if s.attributes.get("gen_ai.operation.name") == "execute_tool" and _under_a_session(s, spans)
    ]
    assert sum(e["type"] == "tool_call" for e in events) == len(tool_spans)


def _under_a_session(s: Any, spans: list[Any]) -> bool:
    """Whether a tool span is mapped: under an agent span, or in a trace without agent spans."""
    agents = {x.span_id for x in spans if x.attributes.get("gen_ai.operation.name") == "invoke_agent"}
    if not agents:
        return True
    by_id = {x.span_id: x for x in spans}
    p = by_id.get(s.parent_span_id)
    while p is not None:
        if p.span_id in agents:
            return True
        p = by_id.get(p.parent_span_id)
    return False


@pytest.mark.parametrize(
    ("value", "user"), [(42, "42"), ("u1", "u1"), ({"a": 1}, None), ([1], None), (1.5, None), (True, None)]
)
def test_a_user_id_of_another_type_does_not_cost_the_session(value, user):
    # an integer enduser.id went into session_start as an integer: the worker dead-lettered the start
    # (`schema: Expected str | null`), and the session with it
    root = Span(
        trace_id="5b8efff798038103d269b633813fc60c",
        span_id="b7ad6b7169203331",
        name="invoke_agent support",
        start_ns=10**18,
        end_ns=10**18 + 10**9,
        attributes={"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "support", "enduser.id": value},
    )
    events = trace_events([root])
    start = next(e for e in events if e["type"] == "session_start")
    assert start["payload"].get("user_id") == user
    assert not any(isinstance(decode_trace(orjson.dumps(e), 1 << 20), Rejection) for e in events)
