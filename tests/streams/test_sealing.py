"""What the worker seals (somnus.streams.sealing): each output under the key of the session it came from."""

from __future__ import annotations

from types import SimpleNamespace

from somnus.schemas.sealed import HEADER, encode_key, new_key, open_value, seal, sealed_key_id
from somnus.streams.keys import KeyFollower
from somnus.streams.ordering import position_key
from somnus.streams.sealing import (
    BUNDLE_BYTES,
    TableSealing,
    bundles,
    dead_letter_value,
    sealed,
    session_of_table_key,
    unit_records,
)

A, B = new_key("aga", "s1", "u1"), new_key("aga", "s2", "u2")


def follower(*keys):
    f = KeyFollower("", "")  # offline: its ring is all it has
    for k in keys:
        f.ring.apply(k.key_id.encode(), encode_key(k))
    return f


def test_sealed_marks_the_record_and_plaintext_sessions_stay_plaintext():
    value, headers = sealed(A, b"{}", [("somnus-kind", b"units")])
    assert sealed_key_id(value) == A.key_id and headers == [("somnus-kind", b"units"), (HEADER, A.key_id.encode())]
    assert sealed(None, b"{}") == (b"{}", None)


def test_dead_letter_keeps_a_sealed_source_and_seals_an_element_again():
    ring = follower(A).ring
    source = seal(A, b'[{"a": 1}, 2]')
    value, headers = dead_letter_value(ring, source, None, [("somnus-reason", b"schema: x")])
    assert value == source and (HEADER, A.key_id.encode()) in headers
    value, headers = dead_letter_value(ring, source, b"2", [])
    assert open_value(value, ring.keys) == b"2" and headers == [(HEADER, A.key_id.encode())]
    assert dead_letter_value(ring, b"[2]", b"2", []) == (b"2", [])  # a plaintext source


def test_a_long_sealed_source_keeps_the_start_of_its_plaintext_sealed_again():
    """Cut sealed bytes would not open: the projector saw a record failing authentication, not the dead letter."""
    from somnus.schemas.codec import MAX_ORIGINAL

    ring = follower(A).ring
    plain = b'{"tool": "' + b"t" * (3 * MAX_ORIGINAL) + b'"}'
    value, headers = dead_letter_value(ring, seal(A, plain), None, [("somnus-reason", b"schema: x")])
    assert open_value(value, ring.keys) == plain[:MAX_ORIGINAL]
    assert headers == [("somnus-reason", b"schema: x"), (HEADER, A.key_id.encode())]
    gone = seal(new_key("support", "s9"), plain)  # its key is not here: as it is, cut, still marked
    value, headers = dead_letter_value(ring, gone, None, [])
    assert value == gone[:MAX_ORIGINAL] and headers == [(HEADER, sealed_key_id(gone).encode())]


def test_units_are_bundled_per_session_under_its_key(monkeypatch):
    import msgspec

    import somnus.streams.sealing as sealing

    ring = follower(A, B).ring
    units = [SimpleNamespace(agent="aga", run_id=s, n=i) for i, s in enumerate(["s1", "s2", "s1", "s3", "s1"])]
    monkeypatch.setattr(sealing, "encode", lambda items: msgspec.json.encode([[u.run_id, u.n] for u in items]))
    opened = [
        (sealed_key_id(v), msgspec.json.decode(open_value(v, ring.keys))) for v, _ in unit_records(ring, units, 2)
    ]
    assert opened == [
        (A.key_id, [["s1", 0], ["s1", 2]]),
        (A.key_id, [["s1", 4]]),
        (B.key_id, [["s2", 1]]),
        (None, [["s3", 3]]),
    ]


def test_table_changelog_values_sealed_and_opened_on_restore():
    f = follower(A)
    tables = TableSealing(f)
    value, headers = tables.seal(b"aga\x1fs1", b'{"state": 1}')
    assert sealed_key_id(value) == A.key_id and headers == [(HEADER, A.key_id.encode())]
    assert tables.open(value) == b'{"state": 1}'
    assert tables.seal(position_key("traces", 0), b"12") == (b"12", None)  # positions stay plaintext
    assert session_of_table_key(position_key("traces", 0)) is None
    assert tables.seal(b"aga\x1fs9", b"{}") == (b"{}", None)  # a plaintext session
    f.ring.apply(A.key_id.encode(), None)  # forgotten: the restored value is dropped
    assert tables.open(value) is None and tables.dropped == 1
    assert tables.open(b'{"plain": 1}') == b'{"plain": 1}' and tables.open(None) is None


def test_the_links_table_keeps_no_session_text_and_learns_the_same():
    """The NAc's links table sums every session with a call, so no one session's key can seal it: its
    values keep no outcome text (``error:<class>`` is templated error text: it held a forgotten user's
    marker), and learning from them gives the same updates and strengths as from the full states."""
    import uuid
    from datetime import datetime, timedelta, timezone

    from somnus.processors.prediction.causal_links import decode_link_state, encode_link_state, learn
    from somnus.schemas.causal import LinkLevel, OutcomeObserved, Valence, outcome_signature, tool_signature
    from somnus.streams.sealing import link_state_value

    t0 = datetime(2024, 6, 3, 8, tzinfo=timezone.utc)

    def observed(n: int, outcome: str) -> OutcomeObserved:
        return OutcomeObserved(
            event_signature=tool_signature("search"),
            level=LinkLevel.TOOL,
            tool="search",
            outcome_signature=outcome_signature(outcome),
            outcome=outcome,
            valence=Valence.POSITIVE if outcome == "ok" else Valence.NEGATIVE,
            agent="aga",
            observed_at=t0 + timedelta(minutes=n),
            context={"agent": "aga"},
            episode_id=uuid.UUID(int=n),
            src_partition=0,
            src_offset=n,
            index=0,
        )

    secret = "error:order mkapk tea not found"
    first = [observed(0, secret), observed(1, "ok")]
    later = [observed(2, secret), observed(3, "ok"), observed(4, "error:timeout")]
    full, _ = learn({}, first, per_link_rows=False)
    stored = {sig: link_state_value(state) for sig, state in full.items()}
    assert all(b"mkapk" not in v and b"order" not in v for v in stored.values())
    assert b"mkapk" in encode_link_state(full[tool_signature("search")])  # what the table held before
    restored = {sig: decode_link_state(v) for sig, v in stored.items()}
    from_full, updates_full = learn(full, later, per_link_rows=False)
    from_stored, updates_stored = learn(restored, later, per_link_rows=False)
    assert updates_stored == updates_full and updates_full[0].outcome == secret
    assert {s: link_state_value(v) for s, v in from_stored.items()} == {
        s: link_state_value(v) for s, v in from_full.items()
    }


def test_opened_once_gives_a_batch_the_plaintext_only_while_the_key_is_the_same():
    from somnus.streams.sealing import OpenedOnce

    f = follower(A, B)
    ring = f.ring
    a, b, plain = (SimpleNamespace(value=v) for v in (seal(A, b'{"a": 1}'), seal(B, b'{"b": 2}'), b'{"c": 3}'))
    once = OpenedOnce()
    assert [once.open(ring, m) for m in (a, b, plain)] == [b'{"a": 1}', b'{"b": 2}', b'{"c": 3}']
    assert len(once.held) == 2  # a plaintext record is not kept: nothing to open
    ring.apply(B.key_id.encode(), None)  # B forgotten before the batch
    other = SimpleNamespace(value=a.value)  # another record: never the kept one's plaintext by id
    assert once.take(ring, [a, b, plain, other]) == {id(a): b'{"a": 1}'}
    assert not once.held and once.take(ring, [a]) == {}  # taken once, then opened by the batch itself
    c = SimpleNamespace(value=seal(A, b"{}"))
    once.open(ring, c)
    c.value = seal(A, b"[]")  # an id that names another value now: not taken
    assert once.take(ring, [c]) == {}


def test_opened_once_keeps_at_most_its_limit():
    from somnus.streams.sealing import OpenedOnce

    ring = follower(A).ring
    once = OpenedOnce()
    once.LIMIT = 3
    msgs = [SimpleNamespace(value=seal(A, b"%d" % i)) for i in range(5)]
    for m in msgs:
        once.open(ring, m)
    assert len(once.held) == 2  # cleared at the limit: those records are opened again by their batch
    assert once.take(ring, msgs) == {id(msgs[3]): b"3", id(msgs[4]): b"4"}
    assert once.bytes == 0  # empty again
    once.LIMIT_BYTES = 10
    big = [SimpleNamespace(value=seal(A, b"x" * 6)) for _ in range(3)]
    for m in big:
        once.open(ring, m)
    assert len(once.held) == 1 and once.bytes == 6  # plaintext bytes bound it too


def test_bundles_are_bounded_in_items_and_in_bytes_and_keep_the_order():
    """A bundle of long items (tool names of 1,024 characters, each repeated in an item) is split before
    it nears the producer's request size; an item larger than the bound travels alone."""
    import orjson

    items = [{"i": i, "tool": f"{i}" + "t" * (1024 + 37 * (i % 50))} for i in range(3000)]
    items.insert(1234, {"i": -1, "huge": "h" * (BUNDLE_BYTES + 1)})
    out = bundles(items, 1000)
    assert [x for raw in out for x in orjson.loads(raw)] == items  # every item, in order
    assert all(len(orjson.loads(raw)) <= 1000 for raw in out)
    assert all(len(raw) <= BUNDLE_BYTES or len(orjson.loads(raw)) == 1 for raw in out)
    assert any(len(raw) > BUNDLE_BYTES for raw in out)  # the huge item, alone
    small = [{"i": i} for i in range(2500)]
    assert [len(orjson.loads(raw)) for raw in bundles(small, 1000)] == [1000, 1000, 500]  # as before
