"""somnus.client: record keys and bundles (no broker: publishing itself is an integration test)."""

from __future__ import annotations

import uuid
from collections import defaultdict
from datetime import datetime, timezone
from typing import Any

import msgspec
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from somnus.client import bundles, key_of, to_bytes
from somnus.schemas.codec import Rejection, decode_record, encode
from somnus.schemas.events import Message, UserMessaged

_elements = msgspec.json.Decoder(list[msgspec.Raw])


def flatten(records: list[tuple[bytes | None, bytes]]) -> list[bytes]:
    """The events of the records, as the consumer splits them (a JSON array is a bundle)."""
    out: list[bytes] = []
    for _, value in records:
        if value.lstrip()[:1] == b"[":
            out.extend(bytes(r) for r in _elements.decode(value))
        else:
            out.append(value)
    return out


def ev(session: str, seq: int) -> bytes:
    return encode(
        UserMessaged(
            event_id=uuid.uuid5(uuid.NAMESPACE_OID, f"{session}/{seq}"),
            schema_version=1,
            ts=datetime(2024, 5, 15, tzinfo=timezone.utc),
            agent="support",
            session_id=session,
            seq=seq,
            payload=Message(text=f"m{seq}"),
        )
    )


@st.composite
def streams(draw: Any) -> list[bytes]:
    """Events of several sessions in any interleaving, plus a few records whose session can't be read."""
    counts = draw(st.lists(st.integers(1, 12), min_size=1, max_size=5))
    queues = [[ev(f"s{i}", seq) for seq in range(n)] for i, n in enumerate(counts)]
    junk = draw(st.lists(st.sampled_from([b"not json", b'{"seq": 1}', b'{"session_id": null}', b'"s0"']), max_size=3))
    queues += [[j] for j in junk]
    out: list[bytes] = []
    while any(queues):
        out.append(draw(st.sampled_from([q for q in queues if q])).pop(0))
    return out


@settings(max_examples=200, deadline=None)
@given(streams(), st.integers(-1, 20))
def test_bundles_keep_every_event_once_and_each_sessions_order(raws, bundle_max):
    records = bundles(raws, bundle_max)
    flat = flatten(records)
    assert sorted(flat) == sorted(raws)  # every event exactly once, bytes unchanged

    def per_session(seq_of: list[bytes]) -> dict[bytes | None, list[bytes]]:
        out: dict[bytes | None, list[bytes]] = defaultdict(list)
        for r in seq_of:
            out[key_of(r)].append(r)
        return out

    assert per_session(flat) == per_session(raws)
    for key, value in records:
        elements = flatten([(key, value)])
        assert len(elements) <= max(bundle_max, 1)
        assert {key_of(e) for e in elements} == {key}  # one session per record, keyed by it
        if len(elements) == 1:
            assert value == elements[0]  # a bundle of one is the plain event
        if key is None:
            assert len(elements) == 1  # unreadable session ids travel alone


@settings(max_examples=100, deadline=None)
@given(streams(), st.integers(2, 20))
def test_bundles_are_as_few_as_the_limit_allows(raws, bundle_max):
    per_key: dict[bytes | None, int] = defaultdict(int)
    for r in raws:
        per_key[key_of(r)] += 1
    expected = per_key.pop(None, 0) + sum(-(-n // bundle_max) for n in per_key.values())
    assert len(bundles(raws, bundle_max)) == expected


@pytest.mark.parametrize("bundle_max", [1, 0, -5])
def test_bundle_max_1_gives_one_record_per_event_in_input_order(bundle_max):
    raws = [ev("a", 0), ev("b", 0), ev("a", 1), b"junk"]
    assert bundles(raws, bundle_max) == [(b"a", raws[0]), (b"b", raws[1]), (b"a", raws[2]), (None, b"junk")]


def test_a_bundle_decodes_to_its_events_in_order():
    raws = [ev("a", i) for i in range(5)]
    ((key, value),) = bundles(raws, 8)
    assert key == b"a"
    decoded = decode_record(value, max_bytes=10_000)
    assert not any(isinstance(d, Rejection) for d in decoded)
    assert [d.seq for d in decoded] == [0, 1, 2, 3, 4]


def test_a_session_longer_than_the_limit_is_split_in_order():
    raws = [ev("a", i) for i in range(5)]
    records = bundles(raws, 2)
    assert [len(flatten([r])) for r in records] == [2, 2, 1]
    assert flatten(records) == raws


@pytest.mark.parametrize(
    ("raw", "key"),
    [
        (b'{"session_id": "s-1", "seq": 0}', b"s-1"),
        (b'{"seq": 0, "payload": {"session_id": "inner"}, "session_id": "outer"}', b"outer"),
        (b'{"session_id": 42}', b"42"),
        ('{"session_id": "café"}'.encode(), "café".encode()),
        (b'{"session_id": ""}', b""),
        (b'{"session_id": null}', None),
        (b'{"seq": 0}', None),
        (b"not json", None),
        (b"[1, 2]", None),
        (b'"s-1"', None),
        (b"", None),
    ],
)
def test_key_of(raw, key):
    assert key_of(raw) == key


def test_key_of_a_real_event_is_its_session_id():
    assert key_of(ev("s0000042-support", 3)) == b"s0000042-support"


def test_to_bytes_accepts_dicts_typed_events_and_raw_bytes():
    typed = msgspec.json.decode(ev("a", 0), type=UserMessaged)
    assert to_bytes(typed) == ev("a", 0)
    assert to_bytes(bytearray(b"raw")) == b"raw"
    assert msgspec.json.decode(to_bytes({"session_id": "a", "seq": 0})) == {"session_id": "a", "seq": 0}


def test_the_client_sets_and_closes_a_goal_at_its_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """``set_goal`` / ``close_goal`` publish the goal records on the memory topic (publisher replaced)."""
    from somnus import client, memory_requests
    from somnus.client import close_goal, set_goal
    from somnus.schemas.goals import KIND_GOAL_SET, GoalClosed, GoalSet

    sent: list[Any] = []
    monkeypatch.setattr(memory_requests, "_send", lambda bootstrap, topic, records: sent.append((topic, records)))
    sealed: list[Any] = []
    monkeypatch.setattr(client, "publish_sealed", lambda *args, **kw: sealed.append((args, kw)))

    at = datetime(2024, 5, 1, tzinfo=timezone.utc)
    goal_id = set_goal("127.0.0.1:1", "support", "answer every refund within a day", user_id="u1", at=at)
    close_goal("127.0.0.1:1", "support", goal_id, at=at)
    [((_, value, headers, _, topic, keys_topic, subject, user), kw)] = sealed
    [(_, [(_, closed, _)])] = sent
    goal = msgspec.json.decode(value, type=GoalSet)
    assert headers == [(memory_requests.KIND, KIND_GOAL_SET)] and topic.endswith("memory") and keys_topic != topic
    # the goal's text may be a person's: sealed under a key of the goal's own that names its user
    assert subject == ("support", f"goal:{goal_id}") and user == "u1" and kw == {"partition": 0}
    assert goal.goal_id == goal_id and goal.set_by == "support" and goal.at == at and goal.user_id == "u1"
    assert msgspec.json.decode(closed, type=GoalClosed) == GoalClosed(goal_id=goal_id, agent="support", at=at)


def test_a_bundle_stays_within_the_byte_limit_unless_it_is_one_event() -> None:
    """64 events of 200 KB made one 13 MB record: over the producer's 8 MiB, the publish failed whole."""
    BUNDLE_MAX_BYTES = 1 << 20  # the producer's batch size (somnus.client.BUNDLE_MAX_BYTES)
    big = [to_bytes({"session_id": "s", "seq": i, "payload": {"text": "x" * 200_000}}) for i in range(64)]
    huge = to_bytes({"session_id": "s", "seq": 64, "payload": {"text": "y" * (2 * BUNDLE_MAX_BYTES)}})
    records = bundles([*big, huge], 64)
    assert all(len(v) <= BUNDLE_MAX_BYTES for _, v in records[:-1]) and records[-1][1] == huge
    parsed = [orjson.loads(v) for _, v in records]
    assert [e["seq"] for p in parsed for e in (p if isinstance(p, list) else [p])] == list(range(65))
