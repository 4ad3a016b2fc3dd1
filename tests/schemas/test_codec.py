"""schemas.codec: bad input becomes a Rejection that names the problem; bundles are validated per element."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.codec import Rejection, _decode_elements, decode_record, decode_trace, encode, uuid_texts
from schemas.events import SessionEnded, ToolCalled, UserMessaged


def event(**overrides: Any) -> dict[str, Any]:
    base = {"event_id": "6f1c1a6e-7d0c-4a43-9a55-0c7f2d1f4b1e", "schema_version": 1,
            "ts": "2024-05-15T15:00:00Z", "agent": "support", "session_id": "s1", "seq": 0,
            "type": "tool_call", "payload": {"tool": "crm_lookup", "call_id": "c1"}}
    base.update(overrides)
    return base


def raw(**overrides: Any) -> bytes:
    return json.dumps(event(**overrides), separators=(",", ":")).encode()


def rejected(data: bytes | None, max_bytes: int = 10_000) -> Rejection:
    result = decode_trace(data, max_bytes)
    assert isinstance(result, Rejection), result
    return result


def test_a_good_event_decodes_to_its_type():
    ev = decode_trace(raw(), 10_000)
    assert isinstance(ev, ToolCalled)
    assert (ev.payload.tool, ev.payload.call_id, ev.seq) == ("crm_lookup", "c1", 0)


@pytest.mark.parametrize(("data", "kind", "names"), [
    (raw(seq="1"), "schema", ["`int`", "`$.seq`"]),
    (raw(seq=-1), "schema", [">= 0", "`$.seq`"]),
    (raw(payload={"call_id": "c1"}), "schema", ["`tool`", "`$.payload`"]),
    (raw(payload={"tool": "", "call_id": "c1"}), "schema", ["length >= 1", "`$.payload.tool`"]),
    (raw(type="tool_called"), "schema", ["'tool_called'", "`$.type`"]),
    (raw(ts="2024-05-15T15:00:00"), "schema", ["timezone", "`$.ts`"]),
    (raw(ts="yesterday"), "schema", ["datetime", "`$.ts`"]),
    (raw(event_id="not-a-uuid"), "schema", ["UUID", "`$.event_id`"]),
    (raw(schema_version=2), "schema", ["<= 1", "`$.schema_version`"]),
    (raw(agent=""), "schema", ["`$.agent`"]),
    (raw(type="session_end", payload={"outcome": "won"}), "schema", ["'won'", "`$.payload.outcome`"]),
    (raw(type="tool_result", payload={"call_id": "c", "ok": True, "http_status": 99}), "schema",
     [">= 100", "`$.payload.http_status`"]),
    (json.dumps({k: v for k, v in event().items() if k != "payload"}).encode(), "schema", ["`payload`"]),
    (b"42", "schema", ["object"]),
    (b'{"nope', "undecodable", []),
    (b"", "undecodable", []),
    (b"\xff\xfe{}", "undecodable", []),
    (None, "undecodable", ["empty message"]),
], ids=["seq as string", "negative seq", "missing tool", "empty tool", "unknown type", "naive ts", "bad ts",
        "bad uuid", "future schema version", "empty agent", "bad outcome", "status 99", "missing payload",
        "not an object", "truncated json", "empty bytes", "not utf-8", "no value"])
def test_a_rejection_names_the_problem(data, kind, names):
    r = rejected(data)
    assert r.kind == kind
    assert r.reason.startswith(f"{kind}: ")
    for name in names:
        assert name in r.reason, r.reason
    assert r.original is None  # only bundle elements carry their bytes


def test_the_size_limit_is_inclusive_and_the_reason_gives_both_numbers():
    data = raw()
    assert isinstance(decode_trace(data, max_bytes=len(data)), ToolCalled)
    r = rejected(data, max_bytes=len(data) - 1)
    assert r.reason == f"oversized: {len(data)} bytes > limit {len(data) - 1}"
    assert r.kind == "oversized"


def test_size_is_checked_before_parsing():
    # a huge non-JSON blob is oversized, not undecodable: the limit protects the parser
    assert rejected(b"x" * 101, max_bytes=100).kind == "oversized"


def test_a_single_event_record_is_a_list_of_one():
    (ev,) = decode_record(raw(), 10_000)
    assert isinstance(ev, ToolCalled)
    (r,) = decode_record(b"nope", 10_000)
    assert isinstance(r, Rejection) and r.kind == "undecodable" and r.original is None


def test_a_bundle_gives_one_result_per_element_in_order_with_the_bytes_of_each_rejected_element():
    good0 = raw(seq=0, type="user_message", payload={"text": "hi"})
    bad1 = raw(seq="one")
    good2 = raw(seq=2)
    bad3 = b'{"type": "nope"}'
    good4 = raw(seq=4, type="session_end", payload={"outcome": "success"})
    record = b"[ " + b" ,\n ".join([good0, bad1, good2, bad3, good4]) + b" ]"
    out = decode_record(record, 10_000)
    assert [type(x) for x in out] == [UserMessaged, Rejection, ToolCalled, Rejection, SessionEnded]
    assert out[1].original == bad1 and "`$.seq`" in out[1].reason
    assert out[3].original == bad3 and out[3].kind == "schema"
    assert [x.seq for x in out if not isinstance(x, Rejection)] == [0, 2, 4]


def test_a_bundle_with_leading_whitespace_is_still_a_bundle():
    out = decode_record(b"  \n[" + raw(seq=0) + b"," + raw(seq=1) + b"]", 10_000)
    assert [x.seq for x in out] == [0, 1]


def test_the_size_limit_applies_to_each_element_of_a_bundle():
    small, big = raw(seq=0), raw(seq=1, payload={"tool": "t" * 500, "call_id": "c"})
    out = decode_record(b"[" + small + b"," + big + b"]", max_bytes=len(small))
    assert isinstance(out[0], ToolCalled)
    assert isinstance(out[1], Rejection) and out[1].kind == "oversized" and out[1].original == big


@pytest.mark.parametrize("record", [b"[]", b"[ ]", b" [\n] "])
def test_an_empty_bundle_is_rejected(record):
    (r,) = decode_record(record, 10_000)
    assert isinstance(r, Rejection)
    assert r.reason == "schema: an empty bundle (a record must hold at least one event)"


@pytest.mark.parametrize("record", [b"[" + raw(), b"[1,", b"[}"])
def test_a_broken_bundle_is_one_undecodable_rejection(record):
    (r,) = decode_record(record, 10_000)
    assert isinstance(r, Rejection) and r.kind == "undecodable"


def test_non_event_elements_of_a_bundle_are_rejected_each_with_its_bytes():
    out = decode_record(b'[1, {"a": 2}, null, [3]]', 100)
    assert [r.original for r in out] == [b"1", b'{"a": 2}', b"null", b"[3]"]
    assert all(isinstance(r, Rejection) and r.kind == "schema" for r in out)


# Bundle elements: valid events of several types, and elements each rejected for its own reason or
# taking decode_trace's slower path (a whole float where the contract says integer).
ELEMENTS = [raw(seq=0), raw(seq=3, type="user_message", payload={"text": "héllo"}),
            raw(seq=7, type="session_end", payload={"outcome": "failure"}), raw(seq=2.0), raw(seq=1.5),
            raw(seq="1"), raw(type="nope"), raw(payload={"tool": "t" * 300, "call_id": "c"}), b"1", b"null",
            b'{"a": 2}']


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(ELEMENTS), min_size=0, max_size=6), st.sampled_from([b",", b" , ", b",\n"]),
       st.sampled_from([250, 10_000]))
def test_a_bundle_decodes_as_its_elements_do_one_by_one(elements, sep, max_bytes):
    # decode_record decodes a bundle in one go when it can; the result must be what decoding each
    # element on its own gives (events, rejections with their bytes, the size limit per element).
    record = b"[" + sep.join(elements) + b"]"
    assert decode_record(record, max_bytes) == _decode_elements(record, max_bytes)


def test_no_value_is_one_undecodable_rejection():
    (r,) = decode_record(None, 100)
    assert isinstance(r, Rejection) and r.kind == "undecodable"


def test_encode_is_canonical_and_decode_gives_the_same_bytes_back():
    ev = decode_trace(raw(), 10_000)
    once = encode(ev)
    assert encode(decode_trace(once, 10_000)) == once
    assert json.loads(once)["type"] == "tool_call"  # the tag travels on the wire


def test_rejection_kind_is_the_reason_prefix():
    assert Rejection("schema: x: y").kind == "schema"
    assert Rejection("oversized: 5 bytes > limit 4").kind == "oversized"


@given(st.lists(st.uuids(), max_size=20))
def test_uuid_texts_are_str_of_each(ids):
    assert uuid_texts(ids) == [str(u) for u in ids]


def test_codec_doctests():
    import doctest

    import schemas.codec

    assert doctest.testmod(schemas.codec).failed == 0
