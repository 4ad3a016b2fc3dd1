"""Workarounds for defects of aiokafka and Faust that Somnus's long-running processes need, applied
explicitly by their entry points (the worker's app, the projector), never on import: a runtime that
imports ``somnus.client`` to publish gets aiokafka as it is.

Each workaround names the defect, how it was found, and how to tell when it can go; each relies on a
private attribute that ``tests/streams/test_kafka_compat.py`` checks is still there.
"""

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

    Relies on ``AIOKafkaClient._wait_on_metadata(topic)`` and ``AIOKafkaClient._topics``. It can go
    when ``tests/integration/test_kafka_metadata.py``'s test without the fix starts to pass (the
    record is delivered by aiokafka alone).
    """
    if getattr(AIOKafkaClient._wait_on_metadata, "_somnus_tracks", False):
        return
    original = AIOKafkaClient._wait_on_metadata

    async def _wait_on_metadata(self: AIOKafkaClient, topic: str) -> Any:
        self._topics.add(topic)
        return await original(self, topic)

    _wait_on_metadata._somnus_tracks = True  # type: ignore[attr-defined]
    _wait_on_metadata._somnus_original = original  # type: ignore[attr-defined]
    AIOKafkaClient._wait_on_metadata = _wait_on_metadata  # type: ignore[method-assign]
