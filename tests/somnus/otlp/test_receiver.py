"""somnus.otlp.receiver: OTLP/HTTP status codes, partial success, retryable errors, hostile bodies."""

from __future__ import annotations

import asyncio
import gzip
import json
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from somnus.otlp.buffer import TraceBuffer
from somnus.otlp.mapping import group_by_trace, trace_events
from somnus.otlp.receiver import PROTOBUF, Receiver, rpc_status, varint
from somnus.otlp.spans import from_proto
from somnus.projections.auth import TokenStore
from tests.fixtures.otel.genai_agents import emit, otlp_json


def sdk_spans(sessions: int = 2) -> list[ReadableSpan]:
    """The SDK's finished spans of ``sessions`` sessions of the two agents."""
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "shop-agents"}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    emit(provider.get_tracer("t"), sessions)
    provider.shutdown()
    return list(memory.get_finished_spans())


def sdk_request(sessions: int = 2) -> ExportTraceServiceRequest:
    """What the SDK's OTLP exporter would send for ``sessions`` sessions of the two agents."""
    return encode_spans(sdk_spans(sessions))


class FakeBroker:
    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.down = False

    async def __call__(self, events: list[dict[str, Any]]) -> None:
        if self.down:
            raise ConnectionError("broker unreachable")
        self.events += events


class Harness:
    def __init__(self, home: Path) -> None:
        self.home = home
        store = TokenStore(home)
        self.operator, _ = store.create(operator=True)
        self.agent_token, _ = store.create(agent="billing")
        self.broker = FakeBroker()
        self.receiver = Receiver(TraceBuffer(home / "otlp" / "spans.journal"), self.broker, store, max_body=1 << 20)

    async def post(
        self, body: bytes, content_type: str = PROTOBUF, token: str | None = "operator", **headers: str
    ) -> tuple[int, dict[str, str], bytes]:
        if token is not None:
            headers["Authorization"] = f"Bearer {self.operator if token == 'operator' else token}"
        async with TestClient(TestServer(self.receiver.app())) as client:
            resp = await client.post("/v1/traces", data=body, headers={"Content-Type": content_type, **headers})
            return resp.status, dict(resp.headers), await resp.read()


@pytest.fixture()
def h(tmp_path: Path) -> Harness:
    return Harness(tmp_path)


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def expected_events(request: ExportTraceServiceRequest) -> list[dict[str, Any]]:
    return [
        e
        for spans in group_by_trace(from_proto(request.SerializeToString()).spans).values()
        for e in trace_events(spans)
    ]


def test_protobuf_spans_are_published_once_and_a_resend_changes_nothing(h):
    request = sdk_request(2)
    status, headers, body = run(h.post(request.SerializeToString()))
    assert status == 200 and headers["Content-Type"] == PROTOBUF
    assert not ExportTraceServiceResponse.FromString(body).HasField("partial_success")
    assert h.broker.events == expected_events(request)
    assert {e["agent"] for e in h.broker.events} == {"support", "billing"}
    assert run(h.post(request.SerializeToString()))[0] == 200  # the exporter sends it again
    assert h.broker.events == expected_events(request)


def test_json_and_gzip(h):
    request = sdk_request(2)
    raw = gzip.compress(json.dumps(otlp_json(request)).encode())
    status, headers, body = run(h.post(raw, "application/json", **{"Content-Encoding": "gzip"}))
    assert (status, headers["Content-Type"], json.loads(body)) == (200, "application/json", {})
    assert h.broker.events == expected_events(request)


def test_a_trace_is_published_when_its_root_arrives(h):
    request = sdk_request(1)
    spans = list(request.resource_spans[0].scope_spans[0].spans)
    root = next(s for s in spans if not s.parent_span_id)
    children = ExportTraceServiceRequest()
    children.CopyFrom(request)
    del children.resource_spans[0].scope_spans[0].spans[:]
    children.resource_spans[0].scope_spans[0].spans.extend([s for s in spans if s is not root])
    assert run(h.post(children.SerializeToString()))[0] == 200
    assert h.broker.events == [] and h.receiver.buffer.held_spans() == len(spans) - 1
    only_root = ExportTraceServiceRequest()
    only_root.CopyFrom(request)
    del only_root.resource_spans[0].scope_spans[0].spans[:]
    only_root.resource_spans[0].scope_spans[0].spans.append(root)
    assert run(h.post(only_root.SerializeToString()))[0] == 200
    assert h.broker.events == expected_events(request)


def test_a_batch_the_broker_did_not_acknowledge_is_retryable_and_nothing_is_lost_or_doubled(h, tmp_path):
    request = sdk_request(2)
    h.broker.down = True
    status, headers, body = run(h.post(request.SerializeToString()))
    assert status == 503 and headers["Retry-After"] == "2"
    assert b"broker unreachable" in body and body.startswith(rpc_status(14, "")[:2])
    # the receiver is killed and started again: the journal still holds the spans
    h.receiver.buffer.close()
    h.receiver.buffer = TraceBuffer(tmp_path / "otlp" / "spans.journal")
    h.broker.down = False
    assert run(h.post(request.SerializeToString()))[0] == 200
    assert h.broker.events == expected_events(request)


@pytest.mark.parametrize(
    ("body", "content_type", "headers", "status", "message"),
    [
        (b"\xff\xff\xff\xff", PROTOBUF, {}, 400, "not a protobuf ExportTraceServiceRequest"),
        (b'{"resourceSpans": [', "application/json", {}, 400, "not JSON"),
        (b'{"resourceSpans": 5}', "application/json", {}, 400, "expected an array"),
        (b"[" * 5000 + b"]" * 5000, "application/json", {}, 400, "nested 5000 deep"),
        (b"x" * (2 << 20), PROTOBUF, {}, 400, "at most 1048576"),
        (gzip.compress(b"\0" * (3 << 20)), PROTOBUF, {"Content-Encoding": "gzip"}, 400, "once decompressed"),
        (b"not gzip", PROTOBUF, {"Content-Encoding": "gzip"}, 400, "not valid gzip"),
        (b"{}", "application/json", {"Content-Encoding": "br"}, 415, "Content-Encoding 'br'"),
        (b"{}", "text/plain", {}, 415, "Content-Type 'text/plain'"),
    ],
)
def test_hostile_or_unsupported_bodies_get_a_clear_4xx(h, body, content_type, headers, status, message):
    got, _, text = run(h.post(body, content_type, **headers))
    assert got == status and message.encode() in text, text[:300]
    assert h.broker.events == []


def nested_resource(request: bytes, depth: int) -> bytes:
    """``request`` with one more ResourceSpans whose resource has an attribute nested ``depth`` deep (bytes
    written by hand: the protobuf library refuses to build what it would not parse)."""
    v = AnyValue(string_value="leaf").SerializeToString()
    for _ in range(depth):
        kv = b"\x0a\x01k\x12" + varint(len(v)) + v  # KeyValue{key, value}
        kvl = b"\x0a" + varint(len(kv)) + kv  # KeyValueList{values}
        v = b"\x32" + varint(len(kvl)) + kvl  # AnyValue{kvlist_value}
    kv = b"\x0a\x04deep\x12" + varint(len(v)) + v
    resource = b"\x0a" + varint(len(kv)) + kv  # Resource{attributes}
    rs = b"\x0a" + varint(len(resource)) + resource  # ResourceSpans{resource}
    return request + b"\x0a" + varint(len(rs)) + rs


@pytest.mark.parametrize(("depth", "message"), [(20, "nests deeper than 16"), (300, "not a protobuf")])
def test_deeply_nested_protobuf_values(h, depth, message):
    status, _, body = run(h.post(nested_resource(sdk_request(1).SerializeToString(), depth)))
    assert status == 400 and message.encode() in body, body[:200]
    assert h.broker.events == []


def test_invalid_ids_are_rejected_spans(h):
    doc = otlp_json(sdk_request(1))
    doc["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["traceId"] = "abc"
    status, _, body = run(h.post(json.dumps(doc).encode(), "application/json"))
    assert status == 200
    assert json.loads(body)["partialSuccess"]["rejectedSpans"] == 1
    assert "traceId 'abc' is not 32 hex digits" in json.loads(body)["partialSuccess"]["errorMessage"]


def test_tokens(h):
    request = sdk_request(2).SerializeToString()
    assert run(h.post(request, token=None))[0] == 401
    assert run(h.post(request, token="not-a-token"))[0] == 401
    status, _, body = run(h.post(request, token=h.agent_token))  # billing's token: support's spans are refused
    partial = ExportTraceServiceResponse.FromString(body).partial_success
    assert status == 200 and partial.rejected_spans == 1
    assert "agent 'support' is not this token's agent 'billing'" in partial.error_message
    assert {e["agent"] for e in h.broker.events} == {"billing"}


def test_a_trace_whose_root_never_comes_is_published_after_the_timeout(h):
    request = sdk_request(1)
    spans = request.resource_spans[0].scope_spans[0].spans
    root = next(s for s in spans if not s.parent_span_id)
    spans.remove(root)
    assert run(h.post(request.SerializeToString()))[0] == 200
    run(h.receiver.tick())
    assert h.broker.events == []  # within the timeout: still waiting for the root
    h.receiver.trace_timeout_s = 0.0
    run(h.receiver.tick())
    assert {e["type"] for e in h.broker.events} >= {"tool_call", "tool_result"} and h.receiver.buffer.held_spans() == 0


def test_a_trace_the_mapping_fails_on_is_logged_and_the_others_published(h, monkeypatch, caplog):
    import somnus.otlp.receiver as receiver_mod

    real = receiver_mod.trace_events

    def flaky(spans, fallback=None):
        if any(s.attributes.get("gen_ai.agent.name") == "support" for s in spans):
            raise RuntimeError("a defect")
        return real(spans, fallback)

    monkeypatch.setattr(receiver_mod, "trace_events", flaky)
    assert run(h.post(sdk_request(2).SerializeToString()))[0] == 200
    assert {e["agent"] for e in h.broker.events} == {"billing"} and h.receiver.buffer.held_spans() == 0
    assert "could not be mapped" in caplog.text


# ---- attacks (issue 25): each failed on the code before its fix -----------------------------------


def one_span(
    trace_id: str,
    attributes: dict[str, dict[str, Any]],
    name: str = "agent run",
    span_id: str = "eee19b7ec3c1b175",
    parent: str = "",
    **fields: Any,
) -> bytes:
    span = {
        "traceId": trace_id,
        "spanId": span_id,
        "name": name,
        "startTimeUnixNano": "1700000000000000000",
        "endTimeUnixNano": "1700000001000000000",
        "parentSpanId": parent,
        "attributes": [{"key": k, "value": v} for k, v in attributes.items()],
        **fields,
    }
    return json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [span]}]}]}).encode()


class EncodingBroker(FakeBroker):
    """Encodes each event as the Kafka publisher does (orjson): a value it cannot encode fails the batch."""

    async def __call__(self, events: list[dict[str, Any]]) -> None:
        from somnus.client import to_bytes

        [to_bytes(e) for e in events]
        await super().__call__(events)


@pytest.mark.parametrize(
    "value",
    [
        {"intValue": "9" * 40},
        {"intValue": str(1 << 64)},
        {"intValue": "9" * 5000},
        {"intValue": "²"},
        {"bytesValue": "a"},
    ],
)
def test_an_integer_beyond_64_bits_is_a_rejected_span_and_does_not_wedge_the_receiver(h, value):
    # a 40-digit conversation id went into the session's metadata; orjson could not encode it, so the
    # trace's publish failed, stayed held, and every later request of every exporter got 503
    h.receiver.publish = h.broker = EncodingBroker()
    status, _, body = run(
        h.post(
            one_span(
                "5b8efff798038103d269b633813fc60c",
                {"gen_ai.operation.name": {"stringValue": "invoke_agent"}, "gen_ai.conversation.id": value},
            ),
            "application/json",
        )
    )
    assert status == 200 and json.loads(body)["partialSuccess"]["rejectedSpans"] == 1, body
    request = sdk_request(1)
    assert run(h.post(request.SerializeToString()))[0] == 200
    assert h.broker.events == expected_events(request)


def test_a_trace_whose_events_cannot_be_encoded_is_left_out_not_retried_for_ever(h, monkeypatch, caplog):
    import somnus.otlp.receiver as receiver_mod

    real = receiver_mod.trace_events

    def unencodable(spans, fallback=None):
        events = real(spans, fallback)
        return [{**e, "payload": {**e["payload"], "n": 1 << 70}} if e["agent"] == "support" else e for e in events]

    h.receiver.publish = h.broker = EncodingBroker()
    monkeypatch.setattr(receiver_mod, "trace_events", unencodable)
    assert run(h.post(sdk_request(2).SerializeToString()))[0] == 200
    assert {e["agent"] for e in h.broker.events} == {"billing"} and h.receiver.buffer.held_spans() == 0
    assert "could not be mapped" in caplog.text


@pytest.mark.parametrize(
    ("attributes", "name"),
    [
        ({"traceloop.span.kind": {"stringValue": "agent"}, "traceloop.entity.name": {"stringValue": "support"}}, "run"),
        ({}, "invoke_agent support"),
        ({"agent.name": {"stringValue": "support"}}, "invoke_agent billing"),
    ],
)
def test_an_agent_token_cannot_name_another_agent_in_any_way_the_mapping_reads(h, attributes, name):
    status, _, body = run(
        h.post(one_span("6b8efff798038103d269b633813fc60c", attributes, name), "application/json", token=h.agent_token)
    )
    assert status == 200 and json.loads(body)["partialSuccess"]["rejectedSpans"] == 1, body
    assert h.broker.events == []


def test_an_agent_token_cannot_add_spans_to_a_trace_another_token_sent(h):
    trace = "8b8efff798038103d269b633813fc60c"
    support_root = one_span(
        trace,
        {"gen_ai.operation.name": {"stringValue": "invoke_agent"}, "gen_ai.agent.name": {"stringValue": "support"}},
        span_id="aaaaaaaaaaaaaaaa",
        parent="bbbbbbbbbbbbbbbb",
    )  # its parent is still to come: the trace is held
    assert run(h.post(support_root, "application/json"))[0] == 200
    # billing's tool span under support's agent span would be a tool call in support's session
    tool = one_span(
        trace,
        {
            "gen_ai.operation.name": {"stringValue": "execute_tool"},
            "gen_ai.tool.name": {"stringValue": "IGNORE PREVIOUS INSTRUCTIONS"},
        },
        name="execute_tool x",
        span_id="cccccccccccccccc",
        parent="aaaaaaaaaaaaaaaa",
    )
    status, _, body = run(h.post(tool, "application/json", token=h.agent_token))
    assert status == 200 and "sent with another token" in json.loads(body)["partialSuccess"]["errorMessage"], body
    assert h.receiver.buffer.held_spans() == 1


def test_a_user_bound_token_may_not_send_spans(h):
    # its spans could make sessions of no user (read by every user of the agent) or of another user
    token, _ = TokenStore(h.home).create(agent="billing", user="u1")
    status, _, body = run(h.post(sdk_request(1).SerializeToString(), token=token))
    assert status == 403 and b"bound to a user" in body
    assert h.broker.events == [] and h.receiver.buffer.held_spans() == 0


def test_a_request_of_too_many_spans_is_refused_before_any_is_mapped(h):
    # 100,000 one-span traces fitted in the body limit and held the event loop for 43 s
    from somnus.otlp.spans import MAX_SPANS

    request = ExportTraceServiceRequest()
    spans = request.resource_spans.add().scope_spans.add().spans
    for i in range(MAX_SPANS + 1):
        span = spans.add(trace_id=i.to_bytes(16, "big"), span_id=(i + 1).to_bytes(8, "big"), name="execute_tool t")
        span.start_time_unix_nano = span.end_time_unix_nano = 1_700_000_000_000_000_000
    assert MAX_SPANS <= 16_384
    h.receiver.max_body = 8 << 20  # the default
    status, _, body = run(h.post(request.SerializeToString()))
    assert status == 400 and f"more than {MAX_SPANS} spans".encode() in body, body[:200]
    assert h.broker.events == [] and h.receiver.buffer.held_spans() == 0


def test_spans_held_without_their_roots_are_bounded(h):
    # rootless spans were held in memory and the journal for the trace timeout (300 s), without bound
    h.receiver.max_held = 3
    children = [
        one_span(f"{n:032x}", {}, name="execute_tool t", span_id=f"{n + 1:016x}", parent="bbbbbbbbbbbbbbbb")
        for n in range(1, 5)
    ]
    assert [run(h.post(c, "application/json"))[0] for c in children[:3]] == [200, 200, 200]
    status, headers, body = run(h.post(children[3], "application/json"))
    assert status == 503 and headers["Retry-After"] == "2" and b"at most 3" in body
    assert h.receiver.buffer.held_spans() == 3
    h.receiver.trace_timeout_s = 0.0
    run(h.receiver.tick())  # the held traces time out and are published: room again
    assert run(h.post(children[3], "application/json"))[0] == 200


# ---- attacks (issue 25, 2026-11-27): each failed on the code before its fix ---------------------------


def test_every_gzip_member_is_read_and_trailing_garbage_is_refused(h):
    # a body of two gzip members was read to the end of the first: the second's spans were lost, and a 200
    first, second = sdk_request(1), sdk_request(2)
    two = gzip.compress(first.SerializeToString()) + gzip.compress(second.SerializeToString())
    assert run(h.post(two, **{"Content-Encoding": "gzip"}))[0] == 200
    merged = ExportTraceServiceRequest.FromString(first.SerializeToString() + second.SerializeToString())
    assert len(h.broker.events) == len(expected_events(merged))
    padded = gzip.compress(first.SerializeToString()) + b"\0" * 16  # NUL padding, as gzip.decompress allows
    assert run(h.post(padded, **{"Content-Encoding": "gzip"}))[0] == 200
    status, _, body = run(h.post(gzip.compress(b"") + b"not gzip", **{"Content-Encoding": "gzip"}))
    assert status == 400 and b"not valid gzip" in body, body


def _spans_sharing(resource_bytes: int = 0, scope_bytes: int = 0, n: int = 1000) -> bytes:
    """``n`` rootless one-span traces under one resource and one scope of the given sizes."""
    from opentelemetry.proto.common.v1.common_pb2 import KeyValue

    request = ExportTraceServiceRequest()
    rs = request.resource_spans.add()
    rs.resource.attributes.append(KeyValue(key="big", value=AnyValue(string_value="x" * resource_bytes)))
    ss = rs.scope_spans.add()
    ss.scope.name = "s" * scope_bytes
    for i in range(1, n + 1):
        ss.spans.add(
            trace_id=i.to_bytes(16, "big"),
            span_id=i.to_bytes(8, "big"),
            parent_span_id=b"\7" * 8,
            name="execute_tool t",
        )
    return request.SerializeToString()


@pytest.mark.parametrize(("resource_bytes", "scope_bytes", "what"), [(40 << 10, 0, "resource"), (0, 40 << 10, "scope")])
def test_a_resource_or_scope_repeated_for_each_span_is_bounded(h, resource_bytes, scope_bytes, what):
    # the journal holds each span with its resource and scope: a 400 KB resource over 1,000 spans (a 466 KB
    # request) wrote 410 MB to the journal and took 1.4 GB; an 8 MB one could take the receiver down
    from somnus.otlp.spans import MAX_SHARED_BYTES

    body = _spans_sharing(resource_bytes, scope_bytes)
    status, _, text = run(h.post(body))
    assert status == 400 and f"more than {MAX_SHARED_BYTES} bytes".encode() in text and what.encode() in text, text
    assert h.receiver.buffer.held_spans() == 0 and h.receiver.buffer.path.stat().st_size < 1000
    assert run(h.post(_spans_sharing(resource_bytes, scope_bytes, n=100)))[0] == 200  # 4 MB held: served


@pytest.mark.parametrize("content_type", [PROTOBUF, "application/json"])
def test_a_request_of_too_many_events_or_values_is_refused_before_any_is_mapped(h, content_type):
    # one span of 3.5 million empty events (7 MB) held the event loop 21 s and 1 GB; the span count
    # (MAX_SPANS) did not see them
    from somnus.otlp.spans import MAX_ITEMS

    n = MAX_ITEMS + 1
    h.receiver.max_body = 8 << 20  # the default
    if content_type == PROTOBUF:
        span = b"\x0a\x10" + b"\1" * 16 + b"\x12\x08" + b"\2" * 8 + b"\x5a\x00" * n  # Span{trace, span, events}
        ss = b"\x12" + varint(len(span)) + span
        rs = b"\x12" + varint(len(ss)) + ss
        bodies = [b"\x0a" + varint(len(rs)) + rs]
    else:
        bodies = [
            one_span("01" * 16, {}, events=[{}] * n),
            one_span("01" * 16, {"a": {"arrayValue": {"values": [{}] * n}}}),
            one_span("01" * 16, {}, events=[{"attributes": [{}] * n}]),
        ]
    for body in bodies:
        status, _, text = run(h.post(body, content_type))
        assert status == 400 and f"more than {MAX_ITEMS} attributes".encode() in text, text[:200]
    assert h.broker.events == [] and h.receiver.buffer.held_spans() == 0


@pytest.mark.parametrize("arguments", ["[" * 100 + "]" * 100, "[" + "0," * 150_000 + "0]"])
def test_json_arguments_the_worker_would_refuse_are_kept_as_their_text(h, arguments):
    # a tool's arguments nested 100 deep went into its event as JSON: the worker refused the session's
    # whole bundle record (nested 104 > 65: start, call, result and end lost); 150,001 values lost the
    # call's event (> 100,000). The receiver had answered 200 for both
    from somnus.client import session_bundles, to_bytes
    from somnus.schemas.codec import Rejection, decode_record

    trace = "0a" * 16
    spans = [
        json.loads(one_span(trace, {}, name="invoke_agent billing", span_id="a" * 16)),
        json.loads(
            one_span(
                trace,
                {"gen_ai.tool.name": {"stringValue": "t"}, "gen_ai.tool.call.arguments": {"stringValue": arguments}},
                name="execute_tool t",
                span_id="b" * 16,
                parent="a" * 16,
            )
        ),
    ]
    request = {
        "resourceSpans": [
            {"scopeSpans": [{"spans": [s["resourceSpans"][0]["scopeSpans"][0]["spans"][0] for s in spans]}]}
        ]
    }
    assert run(h.post(json.dumps(request).encode(), "application/json"))[0] == 200
    records = session_bundles([to_bytes(e) for e in h.broker.events], 64)
    decoded = [x for *_, value in records for x in decode_record(value, 1 << 20)]  # as the worker reads them
    assert [x.reason for x in decoded if isinstance(x, Rejection)] == []
    kinds = [type(x).__struct_config__.tag for x in decoded]
    assert kinds == ["session_start", "tool_call", "tool_result", "session_end"]
    assert decoded[1].payload.args == {"input": arguments}  # its text, whole


@pytest.mark.parametrize(
    ("attribute", "name", "what"),
    [
        ("gen_ai.conversation.id", "invoke_agent billing", "session id"),
        ("enduser.id", "invoke_agent billing", "user id"),
        ("gen_ai.agent.name", "invoke_agent", "agent name"),
        ("gen_ai.tool.name", "execute_tool", "tool name"),
        ("gen_ai.tool.call.id", "execute_tool t", "call id"),
        ("gen_ai.operation.name", "invoke_agent billing", "operation"),
    ],
)
def test_a_name_too_long_to_key_a_session_by_is_a_rejected_span(h, attribute, name, what):
    # a 1.1 MB conversation id went on every event of its session: each one over the worker's 1 MiB, the
    # whole session dead-lettered after a 200 (a user id: its start; a tool name: its call and result)
    from somnus.otlp.mapping import MAX_ID_CHARS

    h.receiver.max_body = 8 << 20
    body = one_span("0b" * 16, {attribute: {"stringValue": "n" * 1_100_000}}, name=name)
    status, _, text = run(h.post(body, "application/json"))
    assert status == 200 and json.loads(text)["partialSuccess"]["rejectedSpans"] == 1, text[:200]
    assert (
        f"its {what} has 1100000 characters (at most {MAX_ID_CHARS})"
        in json.loads(text)["partialSuccess"]["errorMessage"]
    )
    assert h.broker.events == [] and h.receiver.buffer.held_spans() == 0
    body = one_span("0c" * 16, {attribute: {"stringValue": "n" * MAX_ID_CHARS}}, name=name)
    assert run(h.post(body, "application/json"))[2] == b"{}"  # at the limit: taken


def test_a_span_of_too_many_links_is_rejected(h):
    # a session's start lists its span's links: 262,144 of them made a 13 MB event the worker refused
    from somnus.otlp.mapping import MAX_LINKS

    links = [{"traceId": f"{i + 1:032x}", "spanId": f"{i + 1:016x}"} for i in range(MAX_LINKS + 1)]
    status, _, text = run(h.post(one_span("0d" * 16, {}, name="invoke_agent billing", links=links), "application/json"))
    got = json.loads(text)["partialSuccess"]
    assert (
        status == 200
        and got["rejectedSpans"] == 1
        and f"{MAX_LINKS + 1} links (at most {MAX_LINKS})" in got["errorMessage"]
    )
    body = one_span("0e" * 16, {}, name="invoke_agent billing", links=links[:MAX_LINKS])
    assert run(h.post(body, "application/json"))[2] == b"{}"
    assert [e["payload"]["metadata"]["links"] for e in h.broker.events if e["type"] == "session_start"][0][:1] == [
        f"{1:032x}/{1:016x}"
    ]


def test_a_service_name_too_long_is_a_rejected_span(h):
    h.receiver.max_body = 8 << 20
    request = json.loads(one_span("0f" * 16, {}, name="invoke_agent billing"))
    request["resourceSpans"][0]["resource"] = {
        "attributes": [{"key": "service.name", "value": {"stringValue": "s" * 1_100_000}}]
    }
    status, _, text = run(h.post(json.dumps(request).encode(), "application/json"))
    assert status == 200 and "its service name has 1100000 characters" in text.decode(), text[:200]
    assert h.broker.events == []


def test_tool_arguments_the_worker_would_refuse_make_a_rejected_span(h):
    # 1.1 MB of arguments: answered 200, then the call's event (over the worker's 1 MiB) dead-lettered
    from somnus.client import session_bundles, to_bytes
    from somnus.otlp.mapping import MAX_ARGS_BYTES
    from somnus.schemas.codec import Rejection, decode_record

    h.receiver.max_body = 8 << 20
    answers = []
    for n, size in enumerate([1_100_000, MAX_ARGS_BYTES - 2]):  # the string's quotes: 2 bytes
        arguments = {
            "gen_ai.tool.call.arguments": {"stringValue": "a" * size},
            "gen_ai.tool.name": {"stringValue": "t"},
        }
        status, _, text = run(h.post(one_span(f"{n + 1:032x}", arguments, name="execute_tool t"), "application/json"))
        assert status == 200
        answers.append(json.loads(text).get("partialSuccess", {}).get("errorMessage", ""))
    assert "its tool arguments are 1100002 bytes" in answers[0] and answers[1] == ""
    records = session_bundles([to_bytes(e) for e in h.broker.events], 64)
    decoded = [x for *_, value in records for x in decode_record(value, 1 << 20)]  # as the worker reads them
    assert decoded and not [x for x in decoded if isinstance(x, Rejection)]
