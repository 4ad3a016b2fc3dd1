"""Sealed records: a record's value encrypted with its session's data key (crypto-shredding, issue 25 item 6).

Every record that carries one session's text (a trace record, an episode, its facts, its memory units,
its working memory, a dead letter of its record) is published *sealed*: its value is AES-GCM ciphertext
under a 256-bit data key that belongs to one session ``(agent, session_id)`` and names its user. The
keys live on a compacted key topic (``somnus.streams.keys``); ``somnus forget`` publishes a tombstone
for every key of the subject, and a record whose key is gone *opens* as ``FORGOTTEN``: skipped and
counted, never a dead letter. docs/design/forget.md says why this and not rewriting topics.

A sealed value is self-describing, so a value without its headers (a Faust table restored from its
changelog) is still recognised: ``MAGIC``, one byte with the key id's length, the key id (ASCII), a
12-byte nonce, then the ciphertext and its 16-byte tag. The header ``somnus-sealed`` (the key id) marks
the record for routing and for readers that do not open it; a value that does not start with
``MAGIC`` is plaintext (an older client, a third-party producer) and is read as it is. JSON never
starts with a NUL byte.

>>> import os
>>> key = DataKey(key_id="k1", agent="aga", session_id="s-1", user_id="u1", key=os.urandom(32))
>>> sealed = seal(key, b'{"text": "tea"}')
>>> sealed.startswith(MAGIC), b"tea" in sealed
(True, False)
>>> open_value(sealed, {"k1": key.key})
b'{"text": "tea"}'
>>> open_value(sealed, {}) is FORGOTTEN
True
>>> open_value(b'{"plain": 1}', {})
b'{"plain": 1}'
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Annotated

import msgspec
from msgspec import Meta

from somnus.schemas.codec import Rejection, poison_reason

MAGIC = b"\x00somnus-sealed/1\x00"
HEADER = "somnus-sealed"  # the key id of a sealed record's value
NONCE_BYTES = 12
TAG_BYTES = 16
KEY_BYTES = 32  # AES-256
MAX_KEY_ID = 64


class DataKey(msgspec.Struct, frozen=True, kw_only=True):
    """One session's data key, as the key topic holds it (keyed by ``key_id``; a tombstone deletes it).

    A publisher makes one per session it publishes for; a session may have several (several publishers,
    or a user learnt later: the same key again with ``user_id`` set). Forget deletes every key of the
    subject: ``--session`` by session id, ``--agent`` by agent, ``--user`` by user and every key of a
    session one of whose keys names the user."""

    key_id: Annotated[str, Meta(min_length=1, max_length=MAX_KEY_ID, pattern="^[0-9A-Za-z_.-]+$")]
    agent: str
    session_id: str
    user_id: str | None = None
    key: Annotated[bytes, Meta(min_length=KEY_BYTES, max_length=KEY_BYTES)]


class _Forgotten:
    """What a sealed value opens as when its data key is gone (forgotten): skip it, count it."""

    _instance: _Forgotten | None = None

    def __new__(cls) -> _Forgotten:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "FORGOTTEN"


FORGOTTEN = _Forgotten()

_key_decoder = msgspec.json.Decoder(DataKey)
_key_encoder = msgspec.json.Encoder()


def new_key(agent: str, session_id: str, user_id: str | None = None) -> DataKey:
    """A fresh random data key for one session (a random 128-bit id)."""
    return DataKey(
        key_id=os.urandom(16).hex(), agent=agent, session_id=session_id, user_id=user_id, key=os.urandom(KEY_BYTES)
    )


def encode_key(key: DataKey) -> bytes:
    return _key_encoder.encode(key)


def decode_key(raw: bytes) -> DataKey:
    """A key record's value (raises ``msgspec.DecodeError`` when it is not one)."""
    return _key_decoder.decode(raw)


@functools.lru_cache(maxsize=4096)  # a cache, not state: one cipher object per key in use
def _aead(key: bytes):  # noqa: ANN202 - cryptography's type
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    return AESGCM(key)


def seal(key: DataKey, plaintext: bytes) -> bytes:
    """``plaintext`` sealed under ``key`` (the envelope above; the key id is authenticated with it)."""
    kid = key.key_id.encode()
    head = MAGIC + bytes([len(kid)]) + kid
    nonce = os.urandom(NONCE_BYTES)
    return head + nonce + _aead(key.key).encrypt(nonce, plaintext, head)


def sealed_key_id(value: bytes | None) -> str | None:
    """The key id a sealed value names (None: a plaintext value, or not a well-formed envelope).

    >>> sealed_key_id(MAGIC + bytes([2]) + b"k9" + bytes(40))
    'k9'
    >>> sealed_key_id(b'{"a": 1}') is None
    True
    """
    if not value or not value.startswith(MAGIC) or len(value) <= len(MAGIC):
        return None
    n = value[len(MAGIC)]
    kid = value[len(MAGIC) + 1 : len(MAGIC) + 1 + n]
    if not n or len(kid) != n or not kid.isascii():
        return None
    return kid.decode()


def open_value(value: bytes | None, keys: Mapping[str, bytes]) -> bytes | None | _Forgotten | Rejection:
    """A record's value as its plaintext: a plaintext value as it is (None stays None), a sealed one
    opened with its key from ``keys`` (key id -> key bytes), ``FORGOTTEN`` when its key is not there,
    or a ``Rejection`` (kind ``undecodable``) when it is not a valid envelope or fails authentication
    (tampered, or sealed under another key). Never raises."""
    try:
        if value is None or not value.startswith(MAGIC):
            return _open_parts(value, keys) if value is not None and value.startswith(PARTS_MAGIC) else value
        kid = sealed_key_id(value)
        start = len(MAGIC) + 1 + (len(kid) if kid else 0)
        if kid is None or len(value) < start + NONCE_BYTES + TAG_BYTES:
            return Rejection("undecodable: a sealed record whose envelope is malformed (truncated or no key id)")
        key = keys.get(kid)
        if key is None:
            return FORGOTTEN
        nonce = value[start : start + NONCE_BYTES]
        try:
            return _aead(key).decrypt(nonce, value[start + NONCE_BYTES :], value[:start])
        except Exception as exc:
            # imported here, not per record: a ``from`` import costs ~2 µs a call, as much as decrypting
            from cryptography.exceptions import InvalidTag

            if not isinstance(exc, InvalidTag):
                raise
            return Rejection(
                f"undecodable: a sealed record that fails authentication under its key {kid} "
                "(altered, or sealed under another key)"
            )
    except Exception as exc:  # noqa: BLE001 - the boundary: opening a record never raises
        return Rejection(poison_reason(exc, "while opening a sealed record"))


def sealed_headers(headers: list[tuple[str, bytes]] | None, key: DataKey | None) -> list[tuple[str, bytes]] | None:
    """``headers`` with the ``somnus-sealed`` mark of ``key`` added (unchanged when ``key`` is None)."""
    if key is None:
        return headers
    return [*(headers or []), (HEADER, key.key_id.encode())]


class OpenedRecord:
    """A consumed record with its value opened (every other attribute is the record's own)."""

    __slots__ = ("record", "value")

    def __init__(self, record: object, value: bytes) -> None:
        self.record, self.value = record, value

    def __getattr__(self, name: str) -> object:
        return getattr(self.record, name)


def open_record(rec: object, keys: Mapping[str, bytes]) -> object:
    """``rec`` itself when its value is plaintext, an ``OpenedRecord`` when it was sealed and its key is in
    ``keys``, else ``FORGOTTEN`` or a ``Rejection`` (``open_value``). Never raises."""
    value = getattr(rec, "value", None)
    opened = open_value(value, keys)
    if opened is value:
        return rec
    if isinstance(opened, (_Forgotten, Rejection)):
        return opened
    return OpenedRecord(rec, opened)  # type: ignore[arg-type]


@dataclass
class KeyRing:
    """The live data keys as far as the key topic has been read (a fold of its records)."""

    by_id: dict[str, DataKey] = field(default_factory=dict)
    keys: dict[str, bytes] = field(default_factory=dict)  # key id -> key bytes (what ``open_value`` takes)
    by_session: dict[tuple[str, str], str] = field(default_factory=dict)  # (agent, session_id) -> latest key id
    position: int = 0  # the next offset of the key topic's one partition to read
    deleted: int = 0  # tombstones read
    invalid: int = 0  # key records that are not DataKeys (skipped)

    def apply(self, key: bytes | None, value: bytes | None) -> None:
        """Fold one record of the key topic: a DataKey, or a tombstone (None) deleting its key id."""
        kid = key.decode(errors="replace") if key is not None else None
        if value is None:
            if kid is not None:
                self._drop(kid)
                self.deleted += 1
            return
        try:
            dk = decode_key(value)
        except Exception:  # noqa: BLE001 - not ours: a key record that cannot be read is skipped
            self.invalid += 1
            return
        if kid is not None and kid != dk.key_id:
            self.invalid += 1
            return
        self.by_id[dk.key_id] = dk
        self.keys[dk.key_id] = dk.key
        self.by_session[(dk.agent, dk.session_id)] = dk.key_id

    def _drop(self, kid: str) -> None:
        dk = self.by_id.pop(kid, None)
        self.keys.pop(kid, None)
        if dk is not None and self.by_session.get((dk.agent, dk.session_id)) == kid:
            del self.by_session[(dk.agent, dk.session_id)]
            for other in self.by_id.values():  # another live key of the session, if any
                if (other.agent, other.session_id) == (dk.agent, dk.session_id):
                    self.by_session[(dk.agent, dk.session_id)] = other.key_id

    def key_for(self, agent: str, session_id: str) -> DataKey | None:
        """The key a record of this session is sealed with (None: the session was published in plaintext)."""
        kid = self.by_session.get((agent, session_id))
        return self.by_id.get(kid) if kid is not None else None

    def open(self, value: bytes | None) -> bytes | None | _Forgotten | Rejection:
        return open_value(value, self.keys)

    def missing(self, values: Iterable[bytes | None]) -> bool:
        """Whether some sealed value (or a share of a shared one, or a part of a multi-part one) names a
        key this ring does not hold."""
        for v in values:
            kids: list[str | None] | None
            if v and v.startswith(SHARED_MAGIC):
                kids = list(shared_key_ids(v) or ())
            elif v and v.startswith(PARTS_MAGIC):
                kids = [sealed_key_id(p) for p in split_parts(v) or ()]
            else:
                kids = [sealed_key_id(v)]
            if any(kid is not None and kid not in self.keys for kid in kids or ()):
                return True
        return False

    def select(self, subject: str, value: str) -> list[str]:
        """The key ids ``somnus forget --<subject> <value>`` deletes: a session's by its id, an agent's by
        agent, a user's by user and every key of a session one of whose keys names the user (a key
        made before the publisher saw the session's start does not)."""
        if subject == "session":
            return sorted(k for k, dk in self.by_id.items() if dk.session_id == value)
        if subject == "agent":
            return sorted(k for k, dk in self.by_id.items() if dk.agent == value)
        if subject != "user":
            raise ValueError(f"unknown forget subject {subject!r} (user, agent or session)")
        sessions = {(dk.agent, dk.session_id) for dk in self.by_id.values() if dk.user_id == value}
        return sorted(k for k, dk in self.by_id.items() if dk.user_id == value or (dk.agent, dk.session_id) in sessions)

    def select_sessions(self, sessions: Iterable[tuple[str, str]]) -> list[str]:
        """The key ids of these ``(agent, session_id)``."""
        wanted = set(sessions)
        return sorted(k for k, dk in self.by_id.items() if (dk.agent, dk.session_id) in wanted)


# ---- shared sealing: a value that any one of its sessions' forgets shreds ----------------------------

SHARED_MAGIC = b"\x00somnus-shared/1\x00"
MAX_SHARES = 1024  # source sessions of one shared value


def seal_shared(keys: Iterable[DataKey | None], plaintext: bytes) -> bytes:
    """``plaintext`` sealed so that it opens only while *every* one of ``keys`` is live: an aggregate
    of several sessions' text (a sleep's topic on the semantic topic) that forgetting any one of them
    must shred (docs/design/forget.md, "Topic keys on the semantic topic").

    A random content key ``K`` seals the plaintext; ``K`` is split into one share per distinct key
    (N-of-N XOR: every share but the last random, the last ``K`` xor the others), each share sealed
    under its key. A missing key loses its share, and without it ``K`` is uniformly random to the
    reader. ``None`` (a session published in plaintext) keeps its share in plaintext.

    >>> import os
    >>> a, b = (DataKey(key_id=k, agent="aga", session_id=k, key=os.urandom(32)) for k in ("ka", "kb"))
    >>> v = seal_shared([a, b, a], b'{"key": "pottery"}')
    >>> open_shared(v, {"ka": a.key, "kb": b.key})
    b'{"key": "pottery"}'
    >>> open_shared(v, {"ka": a.key}) is FORGOTTEN, b"pottery" in v
    (True, False)
    """
    distinct: dict[str | None, DataKey | None] = {}
    for k in keys:
        distinct.setdefault(k.key_id if k is not None else None, k)
    if len(distinct) > MAX_SHARES:
        raise ValueError(f"a shared value has at most {MAX_SHARES} keys, not {len(distinct)}")
    content = os.urandom(KEY_BYTES)
    holders = list(distinct.values()) or [None]
    shares = [os.urandom(KEY_BYTES) for _ in holders[:-1]]
    last = content
    for s in shares:
        last = bytes(x ^ y for x, y in zip(last, s, strict=True))
    shares.append(last)
    parts = [seal(k, s) if k is not None else s for k, s in zip(holders, shares, strict=True)]
    body = seal(DataKey(key_id="content", agent="", session_id="", key=content), plaintext)
    return SHARED_MAGIC + len(parts).to_bytes(2, "big") + b"".join(len(p).to_bytes(2, "big") + p for p in parts) + body


def shared_key_ids(value: bytes | None) -> list[str] | None:
    """The key ids a shared value's shares name (None: not a well-formed shared value)."""
    parsed = _parse_shared(value)
    return None if parsed is None else [kid for kid in map(sealed_key_id, parsed[0]) if kid is not None]


def _length_prefixed(value: bytes, pos: int, size_bytes: int, max_items: int) -> tuple[list[bytes], int] | None:
    """The items of a count-then-sized list at ``pos`` of ``value`` (a 2-byte count, each item's size in
    ``size_bytes`` bytes, big-endian) and where the list ends; None when the count is not 1 to
    ``max_items`` or the list is truncated."""
    if len(value) < pos + 2:
        return None
    n = int.from_bytes(value[pos : pos + 2], "big")
    pos += 2
    if not 1 <= n <= max_items:
        return None
    items = []
    for _ in range(n):
        if len(value) < pos + size_bytes:
            return None
        size = int.from_bytes(value[pos : pos + size_bytes], "big")
        pos += size_bytes
        if len(value) < pos + size:
            return None
        items.append(value[pos : pos + size])
        pos += size
    return items, pos


def _parse_shared(value: bytes | None) -> tuple[list[bytes], bytes] | None:
    if not value or not value.startswith(SHARED_MAGIC):
        return None
    got = _length_prefixed(value, len(SHARED_MAGIC), 2, MAX_SHARES)
    return None if got is None else (got[0], value[got[1] :])


def open_shared(value: bytes | None, keys: Mapping[str, bytes]) -> bytes | None | _Forgotten | Rejection:
    """A shared value's plaintext (``seal_shared``): ``FORGOTTEN`` when any share's key is gone, a
    ``Rejection`` when it is malformed or a share or the body fails authentication; any other value
    is read as ``open_value`` reads it. Never raises."""
    try:
        if value is None or not value.startswith(SHARED_MAGIC):
            return open_value(value, keys)
        parsed = _parse_shared(value)
        if parsed is None:
            return Rejection("undecodable: a shared sealed value whose envelope is malformed (truncated)")
        parts, body = parsed
        content = bytes(KEY_BYTES)
        for part in parts:
            share = open_value(part, keys) if part.startswith(MAGIC) else part
            if share is FORGOTTEN or isinstance(share, Rejection):
                return share
            if not isinstance(share, bytes) or len(share) != KEY_BYTES:
                return Rejection("undecodable: a shared sealed value with a share of the wrong size")
            content = bytes(x ^ y for x, y in zip(content, share, strict=True))
        if sealed_key_id(body) != "content":  # the body is always sealed: anything else was altered
            return Rejection("undecodable: a shared sealed value whose body is not sealed (altered)")
        return open_value(body, {"content": content})
    except Exception as exc:  # noqa: BLE001 - the boundary: opening a record never raises
        return Rejection(poison_reason(exc, "while opening a shared sealed record"))


# ---- multi-part values: several sessions' JSON arrays in one record, each part sealed with its own key --

PARTS_MAGIC = b"\x00somnus-parts/1\x00"
MAX_PARTS = 65535


def join_parts(parts: Sequence[bytes]) -> bytes:
    """One record's value holding ``parts``: JSON arrays, each sealed under its own session's key (``seal``)
    or plaintext. Faust's, aiokafka's and the broker's costs are per record, and a batch of causal
    observations touches many sessions per partition: one record per partition instead of one per
    partition and session (docs/design/forget.md, "Multi-part records"). Forgetting a session shreds its
    part; the others still open.

    >>> import os
    >>> a, b = (DataKey(key_id=k, agent="aga", session_id=k, key=os.urandom(32)) for k in ("ka", "kb"))
    >>> v = join_parts([seal(a, b'[1,2]'), seal(b, b'[3]'), b'[]', b'[4]'])
    >>> open_value(v, {"ka": a.key, "kb": b.key}), open_value(v, {"kb": b.key}), split_parts(v)[2]
    (b'[1,2,3,4]', b'[3,4]', b'[]')
    >>> open_value(join_parts([seal(a, b'[1]')]), {}) is FORGOTTEN
    True
    """
    if not 1 <= len(parts) <= MAX_PARTS:
        raise ValueError(f"a multi-part value has 1 to {MAX_PARTS} parts, not {len(parts)}")
    return PARTS_MAGIC + len(parts).to_bytes(2, "big") + b"".join(len(p).to_bytes(4, "big") + p for p in parts)


def split_parts(value: bytes | None) -> list[bytes] | None:
    """The parts of a multi-part value (None: not one, or malformed: truncated, or bytes after the last
    part)."""
    if not value or not value.startswith(PARTS_MAGIC):
        return None
    got = _length_prefixed(value, len(PARTS_MAGIC), 4, 0xFFFF)
    return got[0] if got is not None and got[1] == len(value) else None


def parts_of(value: bytes | None) -> list[bytes | None]:
    """The values a record carries: a multi-part value's parts, else the value itself (a malformed
    multi-part value too: opening it gives the ``Rejection``)."""
    parts = split_parts(value) if value is not None and value.startswith(PARTS_MAGIC) else None
    return list(parts) if parts is not None else [value]


def _open_parts(value: bytes, keys: Mapping[str, bytes]) -> bytes | _Forgotten | Rejection:
    """A multi-part value as one JSON array of its parts' items, the forgotten parts left out;
    ``FORGOTTEN`` when every part is; a ``Rejection`` when it or any part is malformed or fails
    authentication (the record goes to the dead letters whole: nothing of it is lost)."""
    parts = split_parts(value)
    if parts is None:
        return Rejection("undecodable: a multi-part record whose envelope is malformed (truncated)")
    inner: list[bytes] = []
    kept = 0
    for part in parts:
        if part.startswith(PARTS_MAGIC) or part.startswith(SHARED_MAGIC):
            return Rejection("undecodable: a multi-part record with a part that is not a sealed or plain value")
        got = open_value(part, keys)
        if got is FORGOTTEN:
            continue
        if not isinstance(got, bytes):
            return got if isinstance(got, Rejection) else Rejection("undecodable: an empty part of a multi-part record")
        body = got.strip()
        if not (body.startswith(b"[") and body.endswith(b"]")):
            return Rejection("undecodable: a part of a multi-part record that is not a JSON array")
        kept += 1
        if body[1:-1].strip():
            inner.append(body[1:-1])
    if not kept:
        return FORGOTTEN
    return b"[" + b",".join(inner) + b"]"
