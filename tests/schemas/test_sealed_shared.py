"""Shared sealing (``schemas.sealed.seal_shared``): a value that opens only while every source
session's key is live, for aggregates such as a sleep's topics (docs/design/forget.md)."""

from __future__ import annotations

import os

from hypothesis import given
from hypothesis import strategies as st

from somnus.schemas.codec import Rejection
from somnus.schemas.sealed import FORGOTTEN, DataKey, open_shared, seal_shared, shared_key_ids


def keys(n: int) -> list[DataKey]:
    return [DataKey(key_id=f"k{i}", agent="aga", session_id=f"s{i}", key=os.urandom(32)) for i in range(n)]


def ring(ks: list[DataKey]) -> dict[str, bytes]:
    return {k.key_id: k.key for k in ks}


def test_it_opens_with_every_key_and_is_forgotten_without_any_one():
    ks = keys(5)
    value = seal_shared([*ks, ks[0], None], b'{"key": "mkapk"}')
    assert b"mkapk" not in value
    assert open_shared(value, ring(ks)) == b'{"key": "mkapk"}'
    assert sorted(shared_key_ids(value) or []) == [k.key_id for k in ks]
    for gone in ks:
        assert open_shared(value, {k: v for k, v in ring(ks).items() if k != gone.key_id}) is FORGOTTEN


def test_a_value_of_plaintext_sessions_only_opens_without_keys():
    assert open_shared(seal_shared([None, None], b"[1]"), {}) == b"[1]"


def test_a_tampered_or_cut_value_is_a_rejection_never_an_exception():
    ks = keys(3)
    value = seal_shared(ks, b'{"key": "tea"}')
    for i in range(len(value)):
        flipped = value[:i] + bytes([value[i] ^ 1]) + value[i + 1 :]
        got = open_shared(flipped, ring(ks))
        # no magic any more: read as plaintext, as ``open_value`` reads any value (its decoder rejects it)
        assert isinstance(got, Rejection) or got is FORGOTTEN or got == flipped, i
        cut = open_shared(value[:i], ring(ks))
        assert isinstance(cut, Rejection) or cut is FORGOTTEN or cut == value[:i], i


@given(st.binary(max_size=300))
def test_any_bytes_after_the_magic_never_raise(tail):
    from somnus.schemas.sealed import SHARED_MAGIC

    got = open_shared(SHARED_MAGIC + tail, ring(keys(2)))
    assert isinstance(got, Rejection) or got is FORGOTTEN or isinstance(got, bytes)
