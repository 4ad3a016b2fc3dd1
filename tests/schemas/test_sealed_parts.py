"""Multi-part values (somnus.schemas.sealed.join_parts): several sessions' JSON arrays in one record, each
part shredded by its own session's forget, the record read as one array of the parts still held."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from somnus.schemas.codec import Rejection
from somnus.schemas.sealed import (
    FORGOTTEN,
    PARTS_MAGIC,
    KeyRing,
    encode_key,
    join_parts,
    new_key,
    open_value,
    parts_of,
    seal,
    seal_shared,
    split_parts,
)

A, B, C = (new_key("aga", s, f"u-{s}") for s in ("s1", "s2", "s3"))
KEYS = {k.key_id: k.key for k in (A, B, C)}


@given(
    st.lists(
        st.tuples(
            st.sampled_from([A, B, C, None]),
            st.lists(st.integers(-(2**63), 2**63 - 1) | st.text(max_size=5), max_size=4),
        ),
        min_size=1,
        max_size=8,
    ),
    st.sets(st.sampled_from([A.key_id, B.key_id, C.key_id])),
)
def test_parts_open_as_the_items_of_the_parts_whose_keys_are_held(parts, forgotten):
    value = join_parts([seal(k, orjson.dumps(items)) if k else orjson.dumps(items) for k, items in parts])
    assert split_parts(value) is not None and len(parts_of(value)) == len(parts)
    held = {kid: key for kid, key in KEYS.items() if kid not in forgotten}
    kept = [items for k, items in parts if k is None or k.key_id in held]
    got = open_value(value, held)
    if not kept:
        assert got is FORGOTTEN
    else:
        assert orjson.loads(got) == [x for items in kept for x in items]
    for (k, items), part in zip(parts, parts_of(value), strict=True):  # a sealed part's JSON is not readable
        plain = orjson.dumps(items)
        assert (part == plain) if k is None else (len(plain) < 8 or plain not in part)


def test_a_lone_value_is_its_own_only_part():
    sealed = seal(A, b"[1]")
    assert parts_of(sealed) == [sealed] and parts_of(None) == [None] and split_parts(sealed) is None


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (join_parts([seal(A, b"[1]")])[:-3], "malformed"),  # truncated
        (join_parts([seal(A, b"[1]")]) + b"x", "malformed"),  # bytes after the last part
        (PARTS_MAGIC + b"\x00\x00", "malformed"),  # no part
        (join_parts([seal(A, b"[1]"), seal(B, b"[2]")[:-1] + b"\x00"]), "fails authentication"),  # tampered
        (join_parts([seal(A, b'{"a": 1}')]), "not a JSON array"),
        (join_parts([b"[1]", join_parts([b"[2]"])]), "not a sealed or plain value"),  # nested
        (join_parts([seal_shared([A], b"[1]")]), "not a sealed or plain value"),
    ],
    ids=["truncated", "trailing", "no-part", "tampered", "not-array", "nested", "shared"],  # values are random
)
def test_a_malformed_or_altered_record_is_rejected_whole(value, reason):
    got = open_value(value, KEYS)
    assert isinstance(got, Rejection) and got.reason.startswith("undecodable: ") and reason in got.reason


def test_a_forgotten_part_is_not_checked_and_an_empty_array_is_kept():
    value = join_parts([seal(A, b"[1]"), b"[]", seal(B, b" [ ] ")])
    assert open_value(value, {B.key_id: B.key}) == b"[]"
    assert open_value(join_parts([seal(A, b"[1]"), b"[]"]), {}) == b"[]"  # the plaintext part is held


def test_the_ring_asks_for_the_key_of_every_part():
    ring = KeyRing()
    ring.apply(A.key_id.encode(), encode_key(A))
    assert not ring.missing([join_parts([seal(A, b"[1]"), b"[2]"])])
    assert ring.missing([join_parts([seal(A, b"[1]"), seal(B, b"[2]")])])


def test_part_count_bounds():
    with pytest.raises(ValueError):
        join_parts([])


@given(st.binary(max_size=300), st.lists(st.binary(max_size=40), max_size=5))
def test_hostile_multi_part_bytes_never_raise(tail, parts):
    """Any bytes behind the magic, or any parts, open as a value, ``FORGOTTEN`` or a ``Rejection``."""
    ring = KeyRing()
    for value in (PARTS_MAGIC + tail, join_parts(parts) if parts else PARTS_MAGIC):
        got = open_value(value, KEYS)
        assert got is FORGOTTEN or isinstance(got, (bytes, Rejection))
        ring.missing([value])
        assert parts_of(value)
