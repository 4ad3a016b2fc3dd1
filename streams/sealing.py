"""What the worker seals: each record it writes with one session's text, under that session's data key.

The worker holds a ``KeyFollower`` (``somnus.streams.keys``): it opens the trace records with it and seals
its outputs with the key of the session they came from (``KeyRing.key_for``), so one forget deletes the
trace and everything derived from it at once. A session published in plaintext (no key) gives plaintext
outputs. Sealed here: episodes, their facts, memory units (one record per session), dead letters of a
sealed record, and the values of the session and working-memory tables' changelogs. The causal links
table is an aggregate of every session that made a call, so no one session's key can seal it: its
values keep no session text at all (``link_state_value``) - docs/design/forget.md.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence
from typing import Any

import msgspec

from somnus.processors.prediction.causal_links import CausalLinkState, encode_link_state
from somnus.schemas.codec import Rejection, encode
from somnus.schemas.sealed import FORGOTTEN, HEADER, DataKey, seal, sealed_key_id
from somnus.streams.keys import KeyFollower, KeyRing
from somnus.streams.ordering import POSITION_PREFIX

log = logging.getLogger("somnus.worker")

REFRESH_S = 5.0  # a table restore reads the key topic again at most this often
# of one bundle record's JSON, when it holds more than one item: far under the producer's request size
# (8 MiB), which a bundle of long items could pass (a send that fails there stops the worker)
BUNDLE_BYTES = 1 << 20
Headers = list[tuple[str, bytes]] | None


def sealed(key: DataKey | None, value: bytes, headers: Headers = None) -> tuple[bytes, Headers]:
    """``value`` sealed under ``key`` with the header that marks it (as it is when ``key`` is None)."""
    if key is None:
        return value, headers
    return seal(key, value), [*(headers or []), (HEADER, key.key_id.encode())]


def key_of_record(ring: KeyRing, value: bytes | None) -> DataKey | None:
    """The key a consumed record was sealed with (None: plaintext, or the key is gone)."""
    kid = sealed_key_id(value)
    return ring.by_id.get(kid) if kid is not None else None


def dead_letter_value(
    ring: KeyRing, source: bytes | None, original: bytes | None, headers: Headers
) -> tuple[bytes, Headers]:
    """A dead letter's value and headers: the source record's bytes as they are when ``original`` is
    None (sealed ones keep their mark), else ``original`` (an element decoded from the opened source)
    sealed again with the source's key. A sealed source longer than a dead letter keeps is opened, its
    plaintext cut and sealed again: cut sealed bytes no longer open, and the projector recorded the
    dead letter as a sealed record that fails authentication, its source and reason lost."""
    from somnus.schemas.codec import MAX_ORIGINAL, dead_letter_original

    kid = sealed_key_id(source)
    if original is None:
        if kid is None:
            return dead_letter_original(source), headers
        key = key_of_record(ring, source)
        if len(source or b"") > MAX_ORIGINAL and key is not None:
            plain = ring.open(source)
            if isinstance(plain, bytes):
                return sealed(key, dead_letter_original(plain), headers)
        return dead_letter_original(source), [*(headers or []), (HEADER, kid.encode())]
    return sealed(key_of_record(ring, source), original, headers)


def bundles(items: Sequence[Any], per_record: int) -> list[bytes]:
    """``items`` as JSON arrays, in order, of at most ``per_record`` items and ``BUNDLE_BYTES`` (an item
    larger than that alone)."""
    out: list[bytes] = []
    for i in range(0, len(items), per_record):
        out.extend(_halved(items[i : i + per_record]))
    return out


def _halved(items: Sequence[Any]) -> list[bytes]:
    raw = encode(items)
    if len(raw) <= BUNDLE_BYTES or len(items) == 1:
        return [raw]
    mid = len(items) // 2
    return _halved(items[:mid]) + _halved(items[mid:])


def unit_records(ring: KeyRing, units: Sequence[Any], per_record: int) -> list[tuple[bytes, Headers]]:
    """Memory units as bundle records of one session each (at most ``per_record`` units), sealed with
    their session's key; the units of plaintext sessions together as before."""
    groups: dict[DataKey | None, list[Any]] = {}
    for u in units:
        groups.setdefault(ring.key_for(u.agent, u.run_id), []).append(u)
    out: list[tuple[bytes, Headers]] = []
    for key, items in groups.items():
        out.extend(sealed(key, raw) for raw in bundles(items, per_record))
    return out


def link_state_value(state: CausalLinkState) -> bytes:
    """The links table's value for ``state``, without its outcomes' texts: ``error:<class>`` is the
    templated error text of the session that first met it (it held a forgotten user's text), and the
    state sums every session with the call. The worker never reads them back (an update's outcome text
    is its observation's: ``learn``); its outcome signatures, strengths and counts stay."""
    links = {sig: msgspec.structs.replace(link, outcome="") for sig, link in state.links.items()}
    return encode_link_state(msgspec.structs.replace(state, links=links))


def session_of_table_key(key: bytes) -> tuple[str, str] | None:
    """``(agent, session_id)`` of a session table key (``agent\\x1fsession_id``), None for another key."""
    if key.startswith(POSITION_PREFIX):
        return None
    agent, sep, sid = key.decode(errors="replace").partition("\x1f")
    return (agent, sid) if sep else None


class TableSealing:
    """Seals a session table's changelog values and opens them again when Faust restores the table."""

    def __init__(self, keys: KeyFollower) -> None:
        self.keys = keys
        self.dropped = 0  # restored values whose key is gone (forgotten) or that fail to open
        self.refreshed_at = float("-inf")  # a restore that meets many forgotten values reads the keys once

    def seal(self, key: Any, value: bytes | None) -> tuple[bytes | None, Headers]:
        session = session_of_table_key(key) if isinstance(key, bytes) and value is not None else None
        if session is None:
            return value, None
        return sealed(self.keys.ring.key_for(*session), value)  # type: ignore[arg-type]

    def open(self, value: Any) -> Any:
        if not isinstance(value, bytes) or sealed_key_id(value) is None:
            return value
        got = self.keys.ring.open(value)
        if got is FORGOTTEN and time.monotonic() - self.refreshed_at > REFRESH_S:
            self.keys.catch_up_blocking()  # a key newer than this process's ring, or gone
            self.refreshed_at = time.monotonic()
            got = self.keys.ring.open(value)
        if got is FORGOTTEN or isinstance(got, Rejection):
            self.dropped += 1
            if isinstance(got, Rejection):
                log.error("a table changelog value could not be opened and is dropped: %s", got.reason)
            return None
        return got


def opened_values(records: Iterable[Any]) -> list[bytes | None]:
    return [getattr(getattr(r, "message", r), "value", None) for r in records]


class OpenedOnce:
    """Trace records' plaintexts, each record opened once rather than twice.

    The sequencer reads a trace record's stream time from its plaintext (``Distiller.ordered``) and the
    batch that distils it reads its events: two AES-GCM opens of every trace record. The first open's
    plaintext is kept here, by record, until its batch takes it (``take``); a batch uses it only if the
    record's key is still the very key it was opened with (a forget read in between: the record is
    opened again, as forgotten), else it opens the record itself. A cache, not state: a record not
    found here is opened again, with the same result.
    """

    LIMIT = 20_000  # records opened and not yet taken; beyond, all are forgotten (opened again)
    LIMIT_BYTES = 64 << 20  # of their plaintexts (a record may hold up to max_event_bytes per event)

    def __init__(self) -> None:
        # id(record) -> (its sealed value, plaintext, key id, key bytes); the value kept is the record's
        # own object, so an id reused by another record never matches
        self.held: dict[int, tuple[bytes, bytes, str, bytes]] = {}
        self.bytes = 0  # of the plaintexts held

    def open(self, ring: KeyRing, msg: Any) -> Any:
        """``ring.open(msg.value)``, its plaintext kept for ``take`` when the record was sealed."""
        value = msg.value
        got = ring.open(value)
        if isinstance(got, bytes) and got is not value:  # opened: sealed, and its key held
            kid = sealed_key_id(value)
            key = ring.keys.get(kid) if kid is not None else None
            if kid is not None and key is not None:
                if len(self.held) >= self.LIMIT or self.bytes + len(got) > self.LIMIT_BYTES:
                    self.clear()
                before = self.held.get(id(msg))  # the same record opened again
                self.held[id(msg)] = (value, got, kid, key)
                self.bytes += len(got) - (len(before[1]) if before is not None else 0)
        return got

    def take(self, ring: KeyRing, msgs: Iterable[Any]) -> dict[int, bytes]:
        """The kept plaintexts of ``msgs`` (by ``id``) that ``ring`` still opens the same way; every one of
        ``msgs`` leaves the cache."""
        out: dict[int, bytes] = {}
        held, keys = self.held, ring.keys
        for msg in msgs:
            entry = held.pop(id(msg), None)
            if entry is None:
                continue
            self.bytes -= len(entry[1])
            if entry[0] is msg.value and keys.get(entry[2]) is entry[3]:
                out[id(msg)] = entry[1]
        return out

    def clear(self) -> None:
        self.held.clear()
        self.bytes = 0
