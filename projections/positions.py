"""Kafka positions for ``somnus status``: every reported topic's end offsets and the worker group's
committed offsets.

Asked of Kafka with a short-lived consumer and admin client. The running projector answers them
(``GET /kafka-positions``, operator token) on its own event loop, where aiokafka is already
imported, so ``somnus status`` itself needs no Kafka client; with no projector, the CLI asks Kafka
itself (``somnus.reads.status``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from somnus.config import Settings
from somnus.streams.connection import kafka_options
from somnus.streams.topics import partitions_of

Positions = tuple[dict[str, dict[int, int]], dict[str, dict[int, int]]]  # (end offsets, worker committed)


async def kafka_positions(settings: Settings, bootstrap: str) -> Positions:
    """The end offsets of the projected topics and observations, and the worker group's committed offsets
    of the topics it consumes (traces, episodes, observations), by topic and partition."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                                **kafka_options(settings))
    await consumer.start()
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, **kafka_options(settings))
    await admin.start()
    try:
        tps: list[Any] = []
        for topic in (*settings.projected_topics, settings.observations_topic):
            tps.extend(TopicPartition(topic, p) for p in await partitions_of(consumer, topic))
        ends: dict[str, dict[int, int]] = {}
        for tp, off in (await consumer.end_offsets(tps)).items() if tps else []:
            ends.setdefault(tp.topic, {})[tp.partition] = off
        committed: dict[str, dict[int, int]] = {}
        try:
            group = await admin.list_consumer_group_offsets(settings.app_id)
        except Exception:  # no group yet (the worker has not committed): nothing committed
            group = {}
        for tp, meta in group.items():
            if tp.topic in (settings.traces_topic, settings.episodes_topic, settings.observations_topic):
                committed.setdefault(tp.topic, {})[tp.partition] = meta.offset
        return ends, committed
    finally:
        await admin.close()
        await consumer.stop()


def on_loop(settings: Settings, bootstrap: str, loop: asyncio.AbstractEventLoop,
            timeout_s: float = 60.0) -> Callable[[], dict[str, Any]]:
    """``kafka_positions`` run on ``loop`` (the projector's) from another thread (a read's), as JSON."""
    def positions() -> dict[str, Any]:
        ends, committed = asyncio.run_coroutine_threadsafe(kafka_positions(settings, bootstrap), loop).result(timeout_s)
        return {"ends": ends, "committed": committed}
    return positions


def from_json(got: dict[str, Any]) -> Positions:
    """``on_loop``'s answer as read back from JSON (partitions are strings there)."""
    return tuple({t: {int(p): int(o) for p, o in parts.items()} for t, parts in got[k].items()}  # type: ignore[return-value]
                 for k in ("ends", "committed"))
