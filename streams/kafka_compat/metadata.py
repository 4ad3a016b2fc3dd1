"""aiokafka's cluster metadata: a producer's refresh forgets the topics it sends to
(``track_topics_sent_to``), and a consumer has no public way to ask for a refresh (``refresh_metadata``)."""

from __future__ import annotations

from typing import Any

from aiokafka.client import AIOKafkaClient


def track_topics_sent_to() -> None:
    """Make every client track each topic its producer sends to (aiokafka 0.14). Idempotent.

    Why: aiokafka refreshes metadata only for tracked topics and forgets the rest, so a batch queued
    for an untracked topic (Faust's changelogs) waited 20 minutes for a leader, and every offset
    commit with it. The story: docs/design/kafka-workarounds.md, "The commit that hung".

    Upstream: no aiokafka issue found for it (searched aio-libs/aiokafka for metadata refreshes that
    drop untracked topics); the Java client tracks every topic a producer sends to
    (``KafkaProducer.waitOnMetadata`` adds it, KAFKA-2948), which is what this does.

    Relies on ``AIOKafkaClient._wait_on_metadata(topic)`` and ``AIOKafkaClient._topics``
    (``tests/streams/kafka_compat/test_metadata.py``). It can go when
    ``tests/integration/test_kafka_metadata.py``'s test without the fix starts to pass (the record is
    delivered by aiokafka alone).
    """
    if getattr(AIOKafkaClient._wait_on_metadata, "_somnus_tracks", False):
        return
    original = AIOKafkaClient._wait_on_metadata

    async def _wait_on_metadata(self: AIOKafkaClient, topic: str) -> Any:
        self._topics.add(topic)
        return await original(self, topic)

    _wait_on_metadata._somnus_tracks = True  # type: ignore[attr-defined]
    _wait_on_metadata._somnus_original = original  # type: ignore[attr-defined]
    AIOKafkaClient._wait_on_metadata = _wait_on_metadata


async def refresh_metadata(consumer: Any) -> None:
    """Ask ``consumer``'s client for fresh cluster metadata now (a topic just created is then known).

    ``AIOKafkaConsumer`` has no public call for it: ``partitions_for_topic`` answers from what the
    client knows, which is refreshed every ``metadata_max_age_ms`` (5 minutes by default). Relies on
    ``AIOKafkaConsumer._client`` and ``AIOKafkaClient.force_metadata_update`` (public on the client).
    No upstream issue found. It can go when the consumer offers such a call.
    """
    await consumer._client.force_metadata_update()
