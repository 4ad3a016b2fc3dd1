"""somnus.schemas.codec: bad input becomes a Rejection that names the problem; bundles are validated per element."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from somnus.schemas.codec import Rejection, _decode_elements, decode_record, decode_trace, encode, uuid_texts
from somnus.schemas.events import SessionEnded, ToolCalled, UserMessaged


def event(**overrides: Any) -> dict[str, Any]:
    base = {
        "event_id": "6f1c1a6e-7d0c-4a43-9a55-0c7f2d1f4b1e",
        "schema_version": 1,
        "ts": "2024-05-15T15:00:00Z",
        "agent": "support",
        "session_id": "s1",
        "seq": 0,
        "type": "tool_call",
        "payload": {"tool": "crm_lookup", "call_id": "c1"},
    }
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


@pytest.mark.parametrize(
    ("data", "kind", "names"),
    [
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
        (
            raw(type="tool_result", payload={"call_id": "c", "ok": True, "http_status": 99}),
            "schema",
            [">= 100", "`$.payload.http_status`"],
        ),
        (json.dumps({k: v for k, v in event().items() if k != "payload"}).encode(), "schema", ["`payload`"]),
        (b"42", "schema", ["object"]),
        (b'{"nope', "undecodable", []),
        (b"", "undecodable", []),
        (b"\xff\xfe{}", "undecodable", []),
        (None, "undecodable", ["empty message"]),
    ],
    ids=[
        "seq as string",
        "negative seq",
        "missing tool",
        "empty tool",
        "unknown type",
        "naive ts",
        "bad ts",
        "bad uuid",
        "future schema version",
        "empty agent",
        "bad outcome",
        "status 99",
        "missing payload",
        "not an object",
        "truncated json",
        "empty bytes",
        "not utf-8",
        "no value",
    ],
)
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
ELEMENTS = [
    raw(seq=0),
    raw(seq=3, type="user_message", payload={"text": "héllo"}),
    raw(seq=7, type="session_end", payload={"outcome": "failure"}),
    raw(seq=2.0),
    raw(seq=1.5),
    raw(seq="1"),
    raw(type="nope"),
    raw(payload={"tool": "t" * 300, "call_id": "c"}),
    b"1",
    b"null",
    b'{"a": 2}',
]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.sampled_from(ELEMENTS), min_size=0, max_size=6),
    st.sampled_from([b",", b" , ", b",\n"]),
    st.sampled_from([250, 10_000]),
)
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

    import somnus.schemas.codec

    assert doctest.testmod(somnus.schemas.codec).failed == 0


# ---- hostile bytes: bounded before any parser, and never an exception ------------------------

from hypothesis import HealthCheck, example  # noqa: E402

from somnus.schemas.codec import (  # noqa: E402
    MAX_DEPTH,
    MAX_ORIGINAL,
    check_json,
    dead_letter_original,
    decode_bounded,
    json_shape,
    poison_reason,
    record_rejection,
)

HOSTILE_PIECES = [
    b"{",
    b"}",
    b"[",
    b"]",
    b",",
    b":",
    b'"',
    b"\\",
    b"\\u",
    b"d800",
    b"dc00",
    b"\\ud83d\\ude00",
    b"\xff",
    b"\xc3",
    b"\xed\xa0\x80",
    b"NaN",
    b"Infinity",
    b"-Infinity",
    b"1e999",
    b"1.0",
    b"-0",
    b"null",
    b"true",
    b'"seq"',
    b'"type"',
    b'"tool_call"',
    b'"payload"',
    b'"args"',
    b"\x00",
    b" ",
    raw()[:40],
    raw()[40:],
]
hostile = st.one_of(
    st.binary(max_size=400),
    st.lists(st.sampled_from(HOSTILE_PIECES), max_size=300).map(b"".join),
    st.integers(0, 3000).map(lambda n: b"[" * n + b"]" * n),
    st.integers(0, 3000).map(lambda n: b'{"a":' * n + b"1" + b"}" * n),
    st.tuples(st.integers(0, 300), st.sampled_from([b"[", b"{", b'{"x":'])).map(
        lambda t: raw().replace(b'"call_id":"c1"', b'"call_id":"c1","args":{"a":' + t[1] * t[0])
    ),
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hostile, st.sampled_from([64, 10_000]))
@example(b"[" * 100_000 + b"]" * 100_000, 10_000)
@example(
    raw(seq=1.0).replace(b'"call_id":"c1"', b'"call_id":"c1","args":{"a":' + b"[" * 900 + b"]" * 900 + b"}"), 10_000
)
@example(raw(payload={"tool": "t", "call_id": "\ud800"}).replace(b"\\ud800", b"\\ud800"), 10_000)
@example(b"[" + b",".join([b"1"] * 2000) + b"]", 10_000)
def test_hostile_bytes_never_raise_and_every_result_is_an_event_or_a_rejection_with_a_reason(data, max_bytes):
    for decoded in (decode_record(data, max_bytes), [decode_trace(data, max_bytes)]):
        assert decoded
        for item in decoded:
            assert isinstance(item, (ToolCalled, Rejection)) or hasattr(item, "event_id")
            if isinstance(item, Rejection):
                assert (
                    item.kind in {"oversized", "undecodable", "schema", "poison"}
                    and len(item.reason) > len(item.kind) + 2
                )
    got = decode_bounded(msgspec.json.Decoder(list[int]), data)
    assert isinstance(got, (list, Rejection))


def _true_depth(value: Any) -> int:
    if isinstance(value, (list, dict)):
        children = value.values() if isinstance(value, dict) else value
        return 1 + max((_true_depth(c) for c in children), default=0)
    return 0


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(alphabet='ab"\\[]{},:\n\u00e9\U0001f600'),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(alphabet='k"\\[]{', max_size=4), inner, max_size=4)
    ),
    max_leaves=40,
)


@settings(max_examples=300, deadline=None)
@given(json_values, st.booleans())
def test_the_byte_scan_gives_the_nesting_depth_a_parser_sees(value, ascii_only):
    data = json.dumps(value, ensure_ascii=ascii_only).encode()
    depth, values = json_shape(data)
    assert depth == _true_depth(value)
    assert values >= 1


def test_nesting_is_bounded_before_parsing_and_the_limit_is_inclusive():
    at_limit = b"[" * MAX_DEPTH + b"]" * MAX_DEPTH
    assert check_json(at_limit) is None
    assert check_json(b"[" + at_limit + b"]") == f"oversized: JSON nested {MAX_DEPTH + 1} deep > limit {MAX_DEPTH}"
    assert check_json(b'["' + b"[" * 5000 + b'"]') is None  # brackets inside a string are text
    assert check_json(b'["\\"' + b"[" * 5000 + b'"]') is None  # after an escaped quote too
    assert check_json(b'["\\\\"' + b"[" * 5000) is not None  # an escaped backslash ends the string
    assert check_json(b"[" + b"0," * 100_000 + b"0]").startswith("oversized: 100002 JSON values")


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b'{"a": "\xff"}', "undecodable: invalid UTF-8 at byte 7"),
        (b'{"\xc3\x28": 1}', "undecodable: invalid UTF-8 at byte 2"),
        (b'{"a": "\xed\xa0\x80"}', "undecodable: invalid UTF-8 at byte 7"),  # a surrogate encoded as UTF-8
        (b'{"a": "\\ud800"}', "undecodable: a lone UTF-16 surrogate escape (\\ud800)"),
        (b'{"\\udc00": 1}', "undecodable: a lone UTF-16 surrogate escape (\\udc00)"),
        (b'{"a": "\\ud800\\u0041"}', "undecodable: a lone UTF-16 surrogate escape (\\ud800)"),
        (b'{"a": "\\\\ud800"}', None),  # an escaped backslash, then text
        (b'{"a": "\\ud83d\\ude00"}', None),  # a pair
    ],
)
def test_invalid_utf8_and_lone_surrogates_are_decode_errors(data, reason):
    assert check_json(data) == reason


def test_a_huge_seq_and_a_time_utc_cannot_hold_are_schema_rejections():
    assert "`$.seq`" in rejected(raw(seq=2**63)).reason
    assert isinstance(decode_trace(raw(seq=2**63 - 1), 10_000), ToolCalled)
    assert rejected(raw(ts="0001-01-01T00:00:00+01:00")).reason.startswith(
        "schema: ts 0001-01-01T00:00:00+01:00 is out"
    )
    assert rejected(raw(ts="9999-12-31T23:59:59-01:00")).kind == "schema"


def test_a_bundle_of_2000_bad_elements_is_one_rejection_that_lists_them_in_runs():
    items = decode_record(b"[" + b",".join([b"1"] * 1500 + [b'"x"'] * 500) + b"]", 10_000)
    assert len(items) == 2000
    index, why = record_rejection(items)
    assert index == 0 and why.kind == "schema" and why.original is None
    assert why.reason == (
        "schema: 2000 of 2000 events of the bundle rejected: #0-#1499 schema: Expected `object`, "
        "got `int`; #1500-#1999 schema: Expected `object`, got `str`"
    )
    many = [Rejection(f"schema: reason {i}", b"x") for i in range(500)]
    assert len(record_rejection(many)[1].reason) <= 3_000 and "more" in record_rejection(many)[1].reason
    assert record_rejection([decode_trace(raw(), 10_000)]) is None


def test_poison_names_the_exception_and_a_dead_letter_keeps_at_most_its_share_of_the_bytes():
    assert poison_reason(UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte")).startswith(
        "poison: UnicodeDecodeError: 'utf-8' codec can't decode"
    )
    assert len(dead_letter_original(b"x" * (MAX_ORIGINAL + 10))) == MAX_ORIGINAL
    assert dead_letter_original(None) == b""


def test_a_decoder_that_raises_anything_is_a_poison_rejection(monkeypatch):
    import somnus.schemas.codec as codec

    class Exploding:
        def decode(self, raw):
            raise RecursionError("maximum recursion depth exceeded while deserializing an object")

    monkeypatch.setattr(codec, "_trace_decoder", Exploding())
    (r,) = decode_record(raw(), 10_000)
    assert r.reason == "poison: RecursionError: maximum recursion depth exceeded while deserializing an object"
    assert decode_bounded(Exploding(), b"[]").kind == "poison"
