"""aiokafka's cluster metadata: a producer's refresh forgets the topics it sends to
(``track_topics_sent_to``), and a consumer has no public way to ask for a refresh (``refresh_metadata``)."""

from __future__ import annotations

from typing import Any

from aiokafka.client import AIOKafkaClient


def track_topics_sent_to() -> None:
    """Work around an aiokafka 0.14 defect that hung the worker's offset commits (stress-tested).

    A client refreshes metadata for the topics it tracks, or for every topic while it tracks none,
    and replaces what it knew with the answer. A producer starts tracking a topic on its first send
    only when it does not know the topic's partitions yet. Faust refreshes metadata after declaring
    each topic at startup, when nothing is tracked: every topic becomes known, untracked. Once any
    topic is tracked, the next refresh forgets all the others, and a batch queued for one of them
    waits for a leader that never comes back into view, until the request timeout (20 minutes in
    Faust) expires it; ``producer.flush()`` and every offset commit wait with it. Tracking each
    topic a producer sends to closes that gap (a refresh already in flight is repaired by the next
    one, which the sender asks for as soon as a leader is unknown). Idempotent.

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
