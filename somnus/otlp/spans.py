"""OTLP trace data (``ExportTraceServiceRequest``), protobuf or JSON, as plain typed spans.

Both encodings of the OTLP specification become the same ``Span`` structs: ids as lowercase hex,
times as Unix nanoseconds, attributes as Python values (``AnyValue`` unwrapped; nesting bounded by
``MAX_VALUE_DEPTH``), resource attributes kept beside each span. A span whose ids are not valid
(a trace id of 16 bytes, a span id of 8, not all zero) is not returned: it is counted as rejected
with the reason, for the response's ``partial_success``.

OTLP/JSON differs from the protobuf JSON mapping in two ways (the specification's "JSON Protobuf
Encoding"): trace and span ids are hex strings (not base64), and enums are integers. 64-bit
integers may be strings or numbers.

>>> doc = {"resourceSpans": [{"resource": {"attributes": [
...     {"key": "service.name", "value": {"stringValue": "shop"}}]},
...   "scopeSpans": [{"spans": [{"traceId": "5b8efff798038103d269b633813fc60c",
...     "spanId": "eee19b7ec3c1b174", "name": "execute_tool search", "startTimeUnixNano": "1700000000000000000",
...     "endTimeUnixNano": 1700000001000000000,
...     "attributes": [{"key": "gen_ai.tool.name", "value": {"stringValue": "search"}}],
...     "status": {"code": 2, "message": "boom"}}]}]}]}
>>> got = from_json(doc)
>>> s = got.spans[0]
>>> s.name, s.attributes["gen_ai.tool.name"], s.resource["service.name"], s.status_code, got.rejected
('execute_tool search', 'search', 'shop', 2, [])
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from datetime import datetime, timedelta, timezone
from typing import Any

import msgspec

MAX_VALUE_DEPTH = 16  # arrays and key-value lists within one attribute value
# spans in one request: twice the Collector's default batch (8192). Each span is mapped on the receiver's
# event loop (about 0.4 ms a trace): 100,000 one-span traces (6.4 MB) held it 43 s and 450 MB
MAX_SPANS = 16_384
# attributes, values within them, events and links in one request: twice what the OTel SDK's defaults
# send (512 spans a batch, 128 of each a span). One span of 3.5 million empty events (7 MB) held the event
# loop 21 s and 1 GB
MAX_ITEMS = 1 << 18
# bytes of resource attributes and scope names held again with each of their spans (the journal writes
# them per span): a 400 KB resource over 1,000 spans (a 466 KB request) wrote 410 MB and took 1.4 GB
MAX_SHARED_BYTES = 32 << 20


class ShapeError(ValueError):
    """The request is not an ``ExportTraceServiceRequest`` (a message for a 400 response)."""


class TooLarge(ShapeError):
    """The request as a whole expands beyond a bound: a 400 for the request, not a rejected span."""


class Budget:
    """What one request may still expand to once decoded (``MAX_ITEMS``, ``MAX_SHARED_BYTES``), counted
    from the containers' lengths before their items are decoded."""

    def __init__(self) -> None:
        self.items, self.shared = MAX_ITEMS, MAX_SHARED_BYTES

    def take(self, n: int) -> None:
        self.items -= n
        if self.items < 0:
            raise TooLarge(f"more than {MAX_ITEMS} attributes, values, events and links in one request")

    def share(self, size: int, spans: int, what: str) -> None:
        self.shared -= size * spans
        if self.shared < 0:
            raise TooLarge(
                f"a {what} of {size} bytes held with each of its {spans} spans: more than "
                f"{MAX_SHARED_BYTES} bytes in one request"
            )


class SpanEvent(msgspec.Struct, frozen=True, omit_defaults=True):
    name: str
    time_ns: int = 0
    attributes: dict[str, Any] = {}


class SpanLink(msgspec.Struct, frozen=True, omit_defaults=True):
    trace_id: str
    span_id: str
    attributes: dict[str, Any] = {}


class Span(msgspec.Struct, frozen=True, omit_defaults=True):
    """One span, decoded; ``status_code`` 0 unset, 1 ok, 2 error (OTLP ``Status.StatusCode``)."""

    trace_id: str
    span_id: str
    name: str
    start_ns: int
    end_ns: int
    parent_span_id: str = ""
    kind: int = 0
    attributes: dict[str, Any] = {}
    events: list[SpanEvent] = []
    links: list[SpanLink] = []
    status_code: int = 0
    status_message: str = ""
    resource: dict[str, Any] = {}
    scope: str = ""

    @property
    def key(self) -> tuple[str, str]:
        return self.trace_id, self.span_id


class Decoded(msgspec.Struct):
    """What a request held: its valid spans, and each rejected span's reason."""

    spans: list[Span]
    rejected: list[str]


# ---- ids ---------------------------------------------------------------------------------------


def _hex_id(raw: bytes | str, size: int, what: str) -> str:
    """A valid id as lowercase hex, else ``ShapeError`` naming it."""
    if isinstance(raw, str):
        text = raw.lower()
        if len(text) != 2 * size or any(c not in "0123456789abcdef" for c in text):
            raise ShapeError(f"{what} {raw[:64]!r} is not {2 * size} hex digits")
    else:
        if len(raw) != size:
            raise ShapeError(f"{what} has {len(raw)} bytes, not {size}")
        text = raw.hex()
    if text == "0" * (2 * size):
        raise ShapeError(f"{what} is all zeros (invalid)")
    return text


def _parent_id(raw: bytes | str) -> str:
    return "" if not raw else _hex_id(raw, 8, "parentSpanId")


# ---- JSON (OTLP/JSON) --------------------------------------------------------------------------

INT_RANGE = (-(1 << 63), 1 << 64)  # OTLP's integers are int64 or (times) fixed64: nothing outside both


def _int(value: Any, what: str) -> int:
    """An OTLP/JSON integer (a number or a decimal string) within 64 bits, else ``ShapeError``: a larger
    one cannot be encoded again (orjson), and a trace that cannot be published held the receiver in 503."""
    got: int | None = None
    if isinstance(value, int) and not isinstance(value, bool):
        got = value
    elif (
        isinstance(value, str)
        and 0 < len(value.removeprefix("-")) <= 20
        and value.removeprefix("-").isascii()
        and value.removeprefix("-").isdigit()
    ):
        got = int(value)
    elif isinstance(value, float) and value.is_integer():
        got = int(value)
    if got is None or not INT_RANGE[0] <= got < INT_RANGE[1]:
        raise ShapeError(f"{what}: expected a 64-bit integer, got {str(value)[:40]!r}")
    return got


def _list(obj: Mapping[str, Any], key: str, what: str) -> list[Any]:
    value = obj.get(key, [])
    if value is None:
        return []
    if not isinstance(value, list):
        raise ShapeError(f"{what}.{key}: expected an array, got {type(value).__name__}")
    return value


def _obj(value: Any, what: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ShapeError(f"{what}: expected an object, got {type(value).__name__}")
    return value


def json_value(v: Any, depth: int = 0, budget: Budget | None = None) -> Any:
    """An OTLP/JSON ``AnyValue`` as a Python value.

    >>> json_value({"arrayValue": {"values": [{"intValue": "3"}, {"boolValue": True}]}})
    [3, True]
    """
    if depth > MAX_VALUE_DEPTH:
        raise ShapeError(f"an attribute value nests deeper than {MAX_VALUE_DEPTH} levels")
    budget = budget or Budget()
    v = _obj(v, "AnyValue")
    if "stringValue" in v:
        return str(v["stringValue"])
    if "boolValue" in v:
        return bool(v["boolValue"])
    if "intValue" in v:
        return _int(v["intValue"], "intValue")
    if "doubleValue" in v:
        d = v["doubleValue"]
        return float(d) if isinstance(d, (int, float, str)) and not isinstance(d, bool) else None
    if "arrayValue" in v:
        values = _list(_obj(v["arrayValue"], "arrayValue"), "values", "arrayValue")
        budget.take(len(values))
        return [json_value(x, depth + 1, budget) for x in values]
    if "kvlistValue" in v:
        return json_attributes(_list(_obj(v["kvlistValue"], "kvlistValue"), "values", "kvlistValue"), depth + 1, budget)
    if "bytesValue" in v:
        try:
            return base64.b64decode(str(v["bytesValue"]), validate=True).hex()
        except ValueError:
            raise ShapeError(f"bytesValue {str(v['bytesValue'])[:40]!r} is not base64") from None
    return None


def json_attributes(items: list[Any], depth: int = 0, budget: Budget | None = None) -> dict[str, Any]:
    budget = budget or Budget()
    budget.take(len(items))
    out: dict[str, Any] = {}
    for kv in items:
        kv = _obj(kv, "KeyValue")
        out[str(kv.get("key", ""))] = json_value(kv.get("value"), depth, budget)
    return out


def _json_span(s: Mapping[str, Any], resource: dict[str, Any], scope: str, budget: Budget) -> Span:
    status = _obj(s.get("status"), "status")
    events, links = _list(s, "events", "span"), _list(s, "links", "span")
    budget.take(len(events) + len(links))
    return Span(
        trace_id=_hex_id(str(s.get("traceId", "")), 16, "traceId"),
        span_id=_hex_id(str(s.get("spanId", "")), 8, "spanId"),
        parent_span_id=_parent_id(str(s.get("parentSpanId") or "")),
        name=str(s.get("name", "")),
        kind=_int(s.get("kind", 0), "kind"),
        start_ns=_int(s.get("startTimeUnixNano", 0), "startTimeUnixNano"),
        end_ns=_int(s.get("endTimeUnixNano", 0), "endTimeUnixNano"),
        attributes=json_attributes(_list(s, "attributes", "span"), 0, budget),
        events=[
            SpanEvent(
                name=str(_obj(e, "event").get("name", "")),
                time_ns=_int(e.get("timeUnixNano", 0), "event.timeUnixNano"),
                attributes=json_attributes(_list(e, "attributes", "event"), 0, budget),
            )
            for e in events
        ],
        links=[
            SpanLink(
                trace_id=_hex_id(str(_obj(k, "link").get("traceId", "")), 16, "link.traceId"),
                span_id=_hex_id(str(k.get("spanId", "")), 8, "link.spanId"),
                attributes=json_attributes(_list(k, "attributes", "link"), 0, budget),
            )
            for k in links
        ],
        status_code=_int(status.get("code", 0), "status.code"),
        status_message=str(status.get("message", "") or ""),
        resource=resource,
        scope=scope,
    )


def from_json(doc: Any) -> Decoded:
    """The spans of an OTLP/JSON ``ExportTraceServiceRequest`` (parsed JSON); ``ShapeError`` when its
    structure is wrong, a rejected span (with its reason) when only that span is."""
    out, budget = Decoded([], []), Budget()
    for rs in _list(_obj(doc, "ExportTraceServiceRequest"), "resourceSpans", "request"):
        rs = _obj(rs, "resourceSpans[]")
        resource = json_attributes(_list(_obj(rs.get("resource"), "resource"), "attributes", "resource"), 0, budget)
        scopes = [_obj(ss, "scopeSpans[]") for ss in _list(rs, "scopeSpans", "resourceSpans[]")]
        spans = [_list(ss, "spans", "scopeSpans[]") for ss in scopes]
        budget.share(len(msgspec.json.encode(resource)), sum(map(len, spans)), "resource")
        for ss, scope_spans in zip(scopes, spans):
            scope = str(_obj(ss.get("scope"), "scope").get("name", ""))
            budget.share(len(scope.encode(errors="replace")), len(scope_spans), "scope name")
            for s in scope_spans:
                _add(
                    out,
                    lambda s=s, resource=resource, scope=scope: _json_span(_obj(s, "span"), resource, scope, budget),
                )
    return out


# ---- the SDK's console exporter ----------------------------------------------------------------

# ``ConsoleSpanExporter`` (opentelemetry-sdk, ``ReadableSpan.to_json``): one pretty-printed JSON object
# per span, ids as "0x" + hex, times as ISO 8601 in UTC, enums by name, attributes as a plain object.
CONSOLE_KINDS = {"SpanKind.INTERNAL": 1, "SpanKind.SERVER": 2, "SpanKind.CLIENT": 3}
CONSOLE_KINDS |= {"SpanKind.PRODUCER": 4, "SpanKind.CONSUMER": 5}
CONSOLE_STATUS = {"UNSET": 0, "OK": 1, "ERROR": 2}
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def is_console_span(doc: Any) -> bool:
    """Whether a parsed JSON value has the shape of one span of the console exporter."""
    return isinstance(doc, dict) and isinstance(doc.get("context"), dict) and "name" in doc


def _console_id(raw: Any, size: int, what: str) -> str:
    if not isinstance(raw, str):
        raise ShapeError(f"{what}: expected a hex string, got {type(raw).__name__}")
    return _hex_id(raw.removeprefix("0x"), size, what)


def _console_time(raw: Any, what: str) -> int:
    """Unix nanoseconds of an ISO 8601 time (UTC unless it says otherwise); 0 when absent."""
    if raw is None:
        return 0
    try:
        t = datetime.fromisoformat(str(raw).replace("Z", "+00:00"))
    except ValueError:
        raise ShapeError(f"{what}: not an ISO 8601 time: {str(raw)[:40]!r}") from None
    t = t if t.tzinfo else t.replace(tzinfo=timezone.utc)
    return _int((t - _EPOCH) // timedelta(microseconds=1) * 1000, what)


def _plain_attributes(value: Any, what: str, budget: Budget) -> dict[str, Any]:
    """A console span's attributes (a plain object), nesting and size bounded as OTLP's are."""
    attributes = _obj(value, what)
    budget.take(len(attributes))
    return {str(k): json_value(_plain(v), 0, budget) for k, v in attributes.items()}


def _plain(v: Any, depth: int = 0) -> Any:
    """A plain JSON value as an OTLP ``AnyValue`` object, for ``json_value`` to bound and unwrap."""
    if depth > MAX_VALUE_DEPTH:
        raise ShapeError(f"attribute value nested deeper than {MAX_VALUE_DEPTH}")
    if isinstance(v, bool):
        return {"boolValue": v}
    if isinstance(v, int):
        return {"intValue": v}
    if isinstance(v, float):
        return {"doubleValue": v}
    if isinstance(v, list):
        return {"arrayValue": {"values": [_plain(x, depth + 1) for x in v]}}
    if isinstance(v, dict):
        return {"kvlistValue": {"values": [{"key": str(k), "value": _plain(x, depth + 1)} for k, x in v.items()]}}
    return {"stringValue": "" if v is None else str(v)}


def _console_span(s: Mapping[str, Any], budget: Budget) -> Span:
    context = _obj(s.get("context"), "context")
    status = _obj(s.get("status"), "status")
    code = status.get("status_code", "UNSET")
    if not isinstance(code, str) or code not in CONSOLE_STATUS:  # (a list is no key: TypeError before)
        raise ShapeError(f"status.status_code: expected UNSET, OK or ERROR, got {str(code)[:40]!r}")
    kind = s.get("kind", "SpanKind.INTERNAL")
    resource = _obj(s.get("resource"), "resource")
    events, links = _list(s, "events", "span"), _list(s, "links", "span")
    budget.take(len(events) + len(links))
    return Span(
        trace_id=_console_id(context.get("trace_id"), 16, "context.trace_id"),
        span_id=_console_id(context.get("span_id"), 8, "context.span_id"),
        parent_span_id="" if not s.get("parent_id") else _console_id(s["parent_id"], 8, "parent_id"),
        name=str(s.get("name", "")),
        kind=CONSOLE_KINDS.get(str(kind), 0),
        start_ns=_console_time(s.get("start_time"), "start_time"),
        end_ns=_console_time(s.get("end_time"), "end_time"),
        attributes=_plain_attributes(s.get("attributes"), "attributes", budget),
        events=[
            SpanEvent(
                name=str(_obj(e, "event").get("name", "")),
                time_ns=_console_time(e.get("timestamp"), "event.timestamp"),
                attributes=_plain_attributes(e.get("attributes"), "event.attributes", budget),
            )
            for e in events
        ],
        links=[
            SpanLink(
                trace_id=_console_id(
                    _obj(_obj(k, "link").get("context"), "link.context").get("trace_id"), 16, "link.trace_id"
                ),
                span_id=_console_id(_obj(k.get("context"), "link.context").get("span_id"), 8, "link.span_id"),
                attributes=_plain_attributes(k.get("attributes"), "link.attributes", budget),
            )
            for k in links
        ],
        status_code=CONSOLE_STATUS[code],
        status_message=str(status.get("description", "") or ""),
        resource=_plain_attributes(resource.get("attributes"), "resource.attributes", budget),
    )


def from_console(doc: Any) -> Decoded:
    """One span of the console exporter (parsed JSON) as ``Decoded``: the span, or its rejection; a
    span beyond a request's bounds (``MAX_ITEMS``) raises ``TooLarge``, as a request would."""
    out = Decoded([], [])
    _add(out, lambda: _console_span(_obj(doc, "span"), Budget()))
    return out


def _add(out: Decoded, make: Any) -> None:
    if len(out.spans) + len(out.rejected) >= MAX_SPANS:
        raise ShapeError(f"more than {MAX_SPANS} spans in one request")
    try:
        out.spans.append(make())
    except TooLarge:
        raise
    except ShapeError as exc:
        out.rejected.append(str(exc))


# ---- protobuf ----------------------------------------------------------------------------------


def proto_value(v: Any, depth: int = 0, budget: Budget | None = None) -> Any:
    """An ``opentelemetry.proto.common.v1.AnyValue`` message as a Python value."""
    if depth > MAX_VALUE_DEPTH:
        raise ShapeError(f"an attribute value nests deeper than {MAX_VALUE_DEPTH} levels")
    budget = budget or Budget()
    which = v.WhichOneof("value")
    if which == "array_value":
        budget.take(len(v.array_value.values))
        return [proto_value(x, depth + 1, budget) for x in v.array_value.values]
    if which == "kvlist_value":
        return proto_attributes(v.kvlist_value.values, depth + 1, budget)
    if which == "bytes_value":
        return v.bytes_value.hex()
    return getattr(v, which) if which else None


def proto_attributes(items: Any, depth: int = 0, budget: Budget | None = None) -> dict[str, Any]:
    budget = budget or Budget()
    budget.take(len(items))
    return {kv.key: proto_value(kv.value, depth, budget) for kv in items}


def _proto_span(s: Any, resource: dict[str, Any], scope: str, budget: Budget) -> Span:
    budget.take(len(s.events) + len(s.links))
    return Span(
        trace_id=_hex_id(s.trace_id, 16, "trace_id"),
        span_id=_hex_id(s.span_id, 8, "span_id"),
        parent_span_id=_parent_id(s.parent_span_id),
        name=s.name,
        kind=int(s.kind),
        start_ns=int(s.start_time_unix_nano),
        end_ns=int(s.end_time_unix_nano),
        attributes=proto_attributes(s.attributes, 0, budget),
        events=[
            SpanEvent(name=e.name, time_ns=int(e.time_unix_nano), attributes=proto_attributes(e.attributes, 0, budget))
            for e in s.events
        ],
        links=[
            SpanLink(
                trace_id=_hex_id(k.trace_id, 16, "link.trace_id"),
                span_id=_hex_id(k.span_id, 8, "link.span_id"),
                attributes=proto_attributes(k.attributes, 0, budget),
            )
            for k in s.links
        ],
        status_code=int(s.status.code),
        status_message=s.status.message,
        resource=resource,
        scope=scope,
    )


def from_proto(raw: bytes) -> Decoded:
    """The spans of a protobuf ``ExportTraceServiceRequest``; ``ShapeError`` when it does not parse."""
    from google.protobuf.message import DecodeError
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    try:
        request = ExportTraceServiceRequest.FromString(raw)
    except (DecodeError, RecursionError, ValueError) as exc:
        raise ShapeError(f"the body is not a protobuf ExportTraceServiceRequest: {exc}") from None
    if sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans) > MAX_SPANS:
        raise ShapeError(f"more than {MAX_SPANS} spans in one request")
    out, budget = Decoded([], []), Budget()
    for rs in request.resource_spans:
        resource = proto_attributes(rs.resource.attributes, 0, budget)
        budget.share(len(msgspec.json.encode(resource)), sum(len(ss.spans) for ss in rs.scope_spans), "resource")
        for ss in rs.scope_spans:
            budget.share(len(ss.scope.name.encode(errors="replace")), len(ss.spans), "scope name")
            for s in ss.spans:
                _add(out, lambda s=s, resource=resource, scope=ss.scope.name: _proto_span(s, resource, scope, budget))
    return out
