"""Workarounds for defects of aiokafka and Faust that Somnus's long-running processes need, applied
explicitly by their entry points (the worker's app, the projector), never on import: a runtime that
imports ``somnus.client`` to publish gets aiokafka as it is.

Each workaround names the defect and how to tell when it can go (how it was found:
docs/design/kafka-workarounds.md); each relies on a private attribute that
``tests/streams/test_kafka_compat.py`` checks is still there.
"""

from __future__ import annotations

from typing import Any

from aiokafka.client import AIOKafkaClient


def track_topics_sent_to() -> None:
    """Make every client track each topic its producer sends to (aiokafka 0.14). Idempotent.

    Why: aiokafka refreshes metadata only for tracked topics and forgets the rest, so a batch queued
    for an untracked topic (Faust's changelogs) waited 20 minutes for a leader, and every offset
    commit with it. The story: docs/design/kafka-workarounds.md, "The commit that hung".

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
