"""Forget's keys-topic compaction against the real broker (docs/design/forget.md, "The envelope and the
key topic"): after a user's data key is deleted (a tombstone), the broker's log cleaner removes the
key's record from the log, and the tombstone itself soon after, while another user's key stays.

What is read is the log as the broker serves it from offset 0 (a consumer of no group): what any
reader of the topic, or a replay, can get. The segment files a cleaning replaced stay on the broker's
disk for the topic's ``file.delete.delay.ms`` more (not read here: the broker may be a container).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from somnus.schemas.sealed import encode_key, new_key
from somnus.streams.keys import delete_keys, keys_topic_for, publish_keys
from somnus.streams.topics import ensure_topics

pytestmark = pytest.mark.integration

COMPACTED_WITHIN_S = 90.0  # the cleaner wakes every log.cleaner.backoff.ms (15 s by default)


async def log_records(bootstrap: str, topic: str) -> list[tuple[bytes, bytes | None]]:
    """Every record of the key topic's partition from offset 0: (record key, value or None)."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None)
    await consumer.start()
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        end = (await consumer.end_offsets([tp]))[tp]
        out: list[tuple[bytes, bytes | None]] = []
        while await consumer.position(tp) < end:
            for batch in (await consumer.getmany(tp, timeout_ms=1000)).values():
                out += [(r.key, r.value) for r in batch]
        return out
    finally:
        await consumer.stop()


async def send(bootstrap: str, topic: str, keys: list[Any]) -> None:
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True)
    await producer.start()
    try:
        await publish_keys(producer, topic, keys)
    finally:
        await producer.stop()


def test_a_deleted_key_leaves_the_broker_log_and_another_users_key_stays(pipeline_settings: Any) -> None:
    s = pipeline_settings
    ensure_topics(s, s.bootstrap)
    topic = keys_topic_for(s.traces_topic)
    forgotten, kept = new_key("support", "s-u42", "u42"), new_key("support", "s-u7", "u7")
    asyncio.run(send(s.bootstrap, topic, [forgotten, kept]))
    assert (forgotten.key_id.encode(), encode_key(forgotten)) in asyncio.run(log_records(s.bootstrap, topic))
    assert asyncio.run(delete_keys(s.bootstrap, topic, [forgotten.key_id])) == 1

    deadline, n, records = time.monotonic() + COMPACTED_WITHIN_S, 0, []
    while time.monotonic() < deadline:
        # a segment rolls (segment.ms) only when a later record arrives: a publisher's next session
        time.sleep(2.0)
        asyncio.run(send(s.bootstrap, topic, [new_key("support", f"filler-{n}")]))
        n += 1
        records = asyncio.run(log_records(s.bootstrap, topic))
        if not any(k == forgotten.key_id.encode() for k, _ in records):
            break
    mine = [v for k, v in records if k == forgotten.key_id.encode()]
    assert mine == [], f"after {COMPACTED_WITHIN_S} s the log still holds the deleted key's records: {len(mine)}"
    assert not any(forgotten.key in (v or b"") for _, v in records)  # its bytes under no other record key
    assert (kept.key_id.encode(), encode_key(kept)) in records
