"""The runtime's long-lived publisher against the real broker."""

from __future__ import annotations

import asyncio
import threading

import orjson
import pytest
from aiokafka import AIOKafkaConsumer

from somnus.client import Publisher
from somnus.sample import generate
from somnus.schemas.sealed import open_value, sealed_key_id
from somnus.streams.topics import ensure_topics

pytestmark = pytest.mark.integration


async def _consume(bootstrap: str, topic: str, expected: int, keys: dict[str, bytes] | None = None) -> list[dict]:
    """The events on ``topic``; sealed records opened with ``keys`` (key id -> data key)."""
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", group_id=None)
    await consumer.start()
    out: list[dict] = []
    try:
        while len(out) < expected:
            batch = await asyncio.wait_for(consumer.getmany(timeout_ms=500), timeout=60)
            for records in batch.values():
                for rec in records:
                    raw = rec.value
                    if keys is not None:  # sealed by the publisher: every record, with its session's key
                        assert sealed_key_id(raw) is not None
                        raw = open_value(raw, keys)
                    value = orjson.loads(raw)
                    out += value if isinstance(value, list) else [value]  # a bundle, or one event
    finally:
        await consumer.stop()
    return out


def test_one_publisher_shared_by_threads_delivers_every_event_in_session_order(pipeline_settings):
    s = pipeline_settings
    ensure_topics(s, s.bootstrap)
    events = list(generate(sessions=60, seed=4))
    halves = (events[: len(events) // 2], events[len(events) // 2 :])
    acked = [0, 0]
    with Publisher(s.bootstrap, s.traces_topic, bundle_max=8) as pub:

        def send(i: int) -> None:
            for j in range(0, len(halves[i]), 25):
                acked[i] += pub.send(halves[i][j : j + 25])

        threads = [threading.Thread(target=send, args=(i,)) for i in (0, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        keys = {dk.key_id: dk.key for dk in pub.keys.known.values()} if pub.keys is not None else None
    assert sum(acked) == len(events)
    got = asyncio.run(_consume(s.bootstrap, s.traces_topic, len(events), keys))
    assert sorted(e["event_id"] for e in got) == sorted(e["event_id"] for e in events)
    # a session sent by one thread, in order, arrives in order (one key: one partition)
    one_thread = {e["session_id"] for e in halves[0]} ^ {e["session_id"] for e in halves[1]}
    assert len(one_thread) > 40
    for session in one_thread:
        seqs = [e["seq"] for e in got if e["session_id"] == session]
        assert seqs == sorted(seqs) and len(seqs) == len({*seqs}), session
