"""somnus.streams.kafka_compat.track_topics_sent_to, against the real broker: the aiokafka defect that hung the
worker's offset commits (a batch waiting for a leader its producer had stopped looking up)."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.client import AIOKafkaClient
from aiokafka.structs import TopicPartition

from somnus.streams.kafka_compat import track_topics_sent_to

track_topics_sent_to()  # as the worker's and the projector's entry points do

pytestmark = pytest.mark.integration


async def _delivered(bootstrap: str, wait_s: float) -> bool:
    """Faust's startup order: a metadata refresh while no topic is tracked, a send to a topic known
    from it, then a send to a topic created since. Is the first record delivered?"""
    run = uuid.uuid4().hex[:8]
    known, new = f"meta-{run}-known", f"meta-{run}-new"
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=1000, request_timeout_ms=1_200_000)
    try:
        await admin.create_topics([NewTopic(known, 2, 1)])
        await producer.start()
        await producer.client.force_metadata_update()  # as Faust does after declaring each topic
        first = await producer.send(known, b"x", partition=0)  # lingers: still queued below
        await admin.create_topics([NewTopic(new, 1, 1)])
        await producer.send(new, b"y", partition=0)
        try:
            await asyncio.wait_for(asyncio.shield(first), wait_s)
            return True
        except TimeoutError:
            assert producer.client.cluster.leader_for_partition(TopicPartition(known, 0)) is None
            await producer.client.add_topic(known)  # tracked now: the record goes, and stop() can flush
            await asyncio.wait_for(asyncio.shield(first), 30)
            return False
    finally:
        await producer.stop()
        await admin.close()


def test_a_record_for_a_topic_known_before_any_was_tracked_is_delivered(kafka_bootstrap):
    assert asyncio.run(_delivered(kafka_bootstrap, wait_s=15.0))


def test_without_the_fix_that_record_waits_for_a_leader(kafka_bootstrap, monkeypatch):
    # aiokafka's own method for this test: the defect is real, so the test above can fail
    original = AIOKafkaClient._wait_on_metadata._somnus_original
    monkeypatch.setattr(AIOKafkaClient, "_wait_on_metadata", original)
    assert not asyncio.run(_delivered(kafka_bootstrap, wait_s=4.0))
