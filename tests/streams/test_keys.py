"""The key ring (somnus.streams.keys): a fold of the key topic, and which keys a forget deletes."""

from __future__ import annotations

from somnus.schemas.sealed import FORGOTTEN, DataKey, encode_key, seal
from somnus.streams.keys import KEY_TOPIC_CONFIG, KeyRing, keys_topic_for
from somnus.streams.topics import topic_config


def dk(kid: str, agent: str, sid: str, user: str | None = None) -> DataKey:
    return DataKey(key_id=kid, agent=agent, session_id=sid, user_id=user, key=bytes([len(kid)]) * 32)


def ring_of(*keys: DataKey) -> KeyRing:
    ring = KeyRing()
    for k in keys:
        ring.apply(k.key_id.encode(), encode_key(k))
    return ring


FLEET = [
    dk("k1", "aga", "s1", "u1"),
    dk("k2", "aga", "s1"),  # a later key of s1 that does not name its user
    dk("k3", "agb", "s1", "u2"),
    dk("k4", "agb", "s2", "u1"),
    dk("k5", "agc", "s3", "u3"),
]


def test_select_by_subject():
    ring = ring_of(*FLEET)
    assert ring.select("session", "s1") == ["k1", "k2", "k3"]
    assert ring.select("agent", "agb") == ["k3", "k4"]
    # the user's keys and every key of a session one of whose keys names the user
    assert ring.select("user", "u1") == ["k1", "k2", "k4"]
    assert ring.select("user", "nobody") == []


def test_tombstone_deletes_and_the_record_opens_as_forgotten():
    ring = ring_of(*FLEET)
    sealed = seal(FLEET[0], b'{"a": 1}')
    assert ring.open(sealed) == b'{"a": 1}'
    ring.apply(b"k1", None)
    assert ring.open(sealed) is FORGOTTEN and ring.deleted == 1
    # the session's other live key takes over for the worker's outputs
    assert ring.key_for("aga", "s1").key_id == "k2"
    ring.apply(b"k2", None)
    assert ring.key_for("aga", "s1") is None


def test_a_key_sent_again_with_its_user_replaces_the_first():
    ring = ring_of(dk("k1", "aga", "s1"))
    assert ring.select("user", "u1") == []
    ring.apply(b"k1", encode_key(dk("k1", "aga", "s1", "u1")))
    assert ring.select("user", "u1") == ["k1"] and len(ring.by_id) == 1


def test_records_that_are_not_keys_are_skipped():
    ring = KeyRing()
    ring.apply(b"k1", b"not json")
    ring.apply(b"other", encode_key(dk("k1", "aga", "s1")))  # record key and key id disagree
    ring.apply(None, None)
    assert ring.invalid == 2 and not ring.keys


def test_missing_names_a_key_not_held():
    ring = ring_of(FLEET[0])
    assert not ring.missing([seal(FLEET[0], b"{}"), b"{}", None])
    assert ring.missing([seal(FLEET[1], b"{}")])


def test_key_topic_is_compacted_soon():
    assert keys_topic_for("somnus.traces") == "somnus.keys"
    config = topic_config("somnus.keys")
    assert config == KEY_TOPIC_CONFIG
    assert config["cleanup.policy"] == "compact" and config["min.compaction.lag.ms"] == "0"
    assert int(config["segment.ms"]) <= 1000 and int(config["delete.retention.ms"]) <= 1000
    assert int(config["file.delete.delay.ms"]) <= 1000  # the replaced segments (the key's bytes) leave the disk
