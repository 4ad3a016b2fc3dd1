"""The sealed envelope (somnus.schemas.sealed): what a forget's deleted key leaves unreadable."""

from __future__ import annotations

import os

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from somnus.schemas.codec import Rejection
from somnus.schemas.sealed import (
    FORGOTTEN,
    MAGIC,
    DataKey,
    OpenedRecord,
    decode_key,
    encode_key,
    new_key,
    open_record,
    open_value,
    seal,
    sealed_key_id,
)
from tests.factories import Rec

KEY = new_key("aga", "s-1", "u1")


@given(st.binary(max_size=2000))
@example(b"")
@example(b'{"text": "the code word is mkapk"}')
def test_sealed_round_trip_and_no_plaintext_left(plain):
    sealed = seal(KEY, plain)
    assert sealed.startswith(MAGIC) and sealed_key_id(sealed) == KEY.key_id
    assert open_value(sealed, {KEY.key_id: KEY.key}) == plain
    body = sealed[len(MAGIC) + 1 + len(KEY.key_id) :]  # nonce, ciphertext and tag
    if len(plain) >= 8:
        assert plain not in body  # ciphertext: the plaintext's bytes are not in the record


def test_two_seals_differ():  # a fresh nonce each time
    assert seal(KEY, b"x") != seal(KEY, b"x")


def test_a_gone_key_opens_as_forgotten_not_a_rejection():
    assert open_value(seal(KEY, b"{}"), {}) is FORGOTTEN
    assert open_value(seal(KEY, b"{}"), {"other": os.urandom(32)}) is FORGOTTEN


def test_plaintext_passes_as_it_is():
    raw = b'{"session_id": "s"}'
    assert open_value(raw, {}) is raw
    assert open_value(None, {}) is None


@pytest.mark.parametrize(
    "mutate",
    [
        lambda b: b[:-1] + bytes([b[-1] ^ 1]),  # the tag
        lambda b: b[: len(MAGIC) + 1 + 32 + 3] + bytes([b[len(MAGIC) + 1 + 32 + 3] ^ 1]) + b[len(MAGIC) + 1 + 32 + 4 :],
        lambda b: b[: len(MAGIC) + 10],  # truncated
        lambda b: MAGIC + b"\x00" + b[len(MAGIC) + 1 :],  # no key id
    ],
)
def test_tampered_or_malformed_is_a_rejection_never_an_exception(mutate):
    got = open_value(mutate(seal(KEY, b'{"a": 1}')), {KEY.key_id: KEY.key})
    assert isinstance(got, Rejection) and got.kind == "undecodable", got


def test_sealed_under_another_key_with_the_same_id_fails_authentication():
    other = DataKey(key_id=KEY.key_id, agent="aga", session_id="s-1", key=os.urandom(32))
    got = open_value(seal(other, b"{}"), {KEY.key_id: KEY.key})
    assert isinstance(got, Rejection) and "authentication" in got.reason


@given(
    st.builds(
        DataKey,
        key_id=st.from_regex(r"\A[0-9A-Za-z_.-]{1,64}\Z"),
        agent=st.text(),
        session_id=st.text(),
        user_id=st.none() | st.text(),
        key=st.binary(min_size=32, max_size=32),
    )
)
@example(KEY)
def test_key_record_round_trips(key):
    assert decode_key(encode_key(key)) == key


def test_key_record_bounds():
    import msgspec

    with pytest.raises(msgspec.ValidationError):
        decode_key(encode_key(KEY).replace(KEY.key_id.encode(), b"bad id/../"))


def test_open_record_keeps_coordinates():
    rec = Rec("somnus.traces", 2, 7, seal(KEY, b'{"x": 1}'), key=b"s-1")
    opened = open_record(rec, {KEY.key_id: KEY.key})
    assert isinstance(opened, OpenedRecord)
    assert (opened.topic, opened.partition, opened.offset, opened.key, opened.value) == (
        "somnus.traces",
        2,
        7,
        b"s-1",
        b'{"x": 1}',
    )
    plain = Rec("somnus.traces", 0, 0, b"{}")
    assert open_record(plain, {}) is plain
    assert open_record(rec, {}) is FORGOTTEN


def test_a_cipher_that_raises_something_else_is_a_poison_rejection(monkeypatch):
    """Only a failed tag reads as tampering; any other error of the cipher is the boundary's ``poison``."""
    import somnus.schemas.sealed as sealed_mod

    value = seal(KEY, b"{}")

    class Broken:
        def decrypt(self, *args):
            raise ValueError("boom")

    monkeypatch.setattr(sealed_mod, "_aead", lambda key: Broken())
    got = open_value(value, {KEY.key_id: KEY.key})
    assert isinstance(got, Rejection) and got.kind == "poison" and "boom" in got.reason, got
