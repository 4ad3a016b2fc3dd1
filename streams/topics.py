"""Topic names and explicit creation with the partition counts we mean (never auto-created)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError

from somnus.config import Settings
from somnus.streams.connection import kafka_options
from somnus.streams.kafka_compat.metadata import refresh_metadata


def topic_specs(settings: Settings) -> dict[str, int]:
    """Every topic Somnus reads or writes, with its partition count.

    ``traces`` and ``episodes`` are keyed by session id and share the partition count, so the
    distiller's table partitions line up with its source; dead letters keep the source key.
    ``facts`` has one partition: the knowledge fold reads it in one total order, so a replay
    rebuilds the same triple log (facts are a few per episode, far fewer than trace events).
    """
    return {
        settings.traces_topic: settings.partitions,
        settings.episodes_topic: settings.partitions,
        settings.dead_letter_topic: settings.partitions,
        settings.facts_topic: 1,
        settings.observations_topic: settings.partitions,
        settings.link_updates_topic: settings.partitions,
        settings.memory_topic: 1,
        settings.semantic_topic: 1,
        settings.working_memory_topic: settings.partitions,  # the Faust table's changelog, made here
        settings.keys_topic: 1,  # the sessions' data keys, compacted (somnus.streams.keys)
    }


def topic_config(name: str, append_time: bool = False) -> dict[str, str]:
    """A topic's configuration at creation: changelogs compacted, the rest kept for ever. With
    ``append_time`` (the traces topic) records carry the broker's append time, which bounds how far
    their events' times can move stream time (``somnus.processors.sessions.session_retention``, ``SOMNUS_MAX_CLOCK_SKEW_S``)."""
    if name.endswith("-changelog"):
        return {"cleanup.policy": "compact"}
    if name.endswith("keys"):
        from somnus.streams.keys import KEY_TOPIC_CONFIG

        return dict(KEY_TOPIC_CONFIG)
    config = {"retention.ms": "-1", "retention.bytes": "-1"}
    if append_time:
        config["message.timestamp.type"] = "LogAppendTime"
    return config


async def ensure_topics_async(
    bootstrap: str, specs: dict[str, int], append_time: frozenset[str] = frozenset(), replication_factor: int = 1
) -> dict[str, int]:
    """Create missing topics (those in ``append_time`` stamped with the broker's time) with
    ``replication_factor`` replicas; raise if an existing one has a different partition count."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=30000, **kafka_options())
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        missing = [
            NewTopic(
                name,
                num_partitions=n,
                replication_factor=replication_factor,
                topic_configs=topic_config(name, name in append_time),
            )
            for name, n in specs.items()
            if name not in existing
        ]
        if missing:
            try:
                await admin.create_topics(missing)
            except TopicAlreadyExistsError:
                pass
        # A topic just created may show no partitions until its metadata has propagated.
        for _ in range(100):
            described = await admin.describe_topics(list(specs))
            counts = {d["topic"]: len(d["partitions"]) for d in described}
            if all(counts.get(name) for name in specs):
                break
            await asyncio.sleep(0.1)
        for name, n in specs.items():
            if counts.get(name) != n:
                raise RuntimeError(
                    f"topic {name} has {counts.get(name)} partitions, expected {n} "
                    f"(set SOMNUS_PARTITIONS={counts.get(name)} or use a new topic prefix)"
                )
        return counts
    finally:
        await admin.close()


def ensure_topics(settings: Settings, bootstrap: str) -> dict[str, int]:
    return asyncio.run(
        ensure_topics_async(
            bootstrap, topic_specs(settings), frozenset({settings.traces_topic}), settings.replication_factor
        )
    )


async def partitions_of(consumer: AIOKafkaConsumer, topic: str, timeout_s: float = 20.0) -> list[int]:
    """The partition ids of ``topic`` as the consumer's metadata knows them (refreshed until found)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        parts = consumer.partitions_for_topic(topic)
        if parts:
            return sorted(parts)
        if asyncio.get_running_loop().time() > deadline:
            raise RuntimeError(f"topic {topic} does not exist (run `somnus up` or create it first)")
        await refresh_metadata(consumer)
        await asyncio.sleep(0.1)


def signature_partition(signature: str, partitions: int) -> int:
    """The partition of an event signature (hex digest) on the signature-keyed topics: stable, our own."""
    return int(signature[:8], 16) % partitions


@dataclass
class TopicHits:
    """What ``topic_hits`` found: records holding a needle as the project reads them (sealed records
    opened with the keys that remain) and in their raw bytes, {needle: {topic: records}}; how many
    sealed records could not be opened (their key is gone)."""

    opened: dict[str, dict[str, int]] = field(default_factory=dict)
    raw: dict[str, dict[str, int]] = field(default_factory=dict)  # in the raw values (what sealing covers)
    keys: dict[str, dict[str, int]] = field(default_factory=dict)  # in the record keys: routing ids, not sealed
    shredded: dict[str, int] = field(default_factory=dict)


async def topic_hits(
    bootstrap: str,
    topics: Sequence[str],
    needles: Sequence[str],
    settings: Any = None,
    ring: Any = None,
    optional: Sequence[str] = (),
) -> TopicHits:
    """Records of each topic (offset 0 to its end, as the projector reads them) whose key or value
    holds a needle's bytes once opened with ``ring`` (``somnus.schemas.sealed.KeyRing``; None: as they
    are; a record whose key is gone is not read), and whose raw value, or whose record key, holds one.
    ``optional`` topics (the worker's table changelogs) are read too when they exist."""
    from somnus.schemas.sealed import FORGOTTEN, open_shared
    from somnus.schemas.semantic import sealed_topics_of

    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        group_id=None,
        auto_offset_reset="earliest",
        **kafka_options(settings),
    )
    await consumer.start()
    out = TopicHits()
    try:
        tps = [TopicPartition(t, p) for t in topics for p in await partitions_of(consumer, t)]
        for t in optional:
            with contextlib.suppress(RuntimeError):  # not made yet (no worker ran): nothing to read
                tps += [TopicPartition(t, p) for p in await partitions_of(consumer, t, timeout_s=2.0)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        end = await consumer.end_offsets(tps)
        pos = {tp: 0 for tp in tps}
        raw = [(n, n.encode()) for n in needles]

        def count(found: dict[str, dict[str, int]], topic: str, body: bytes) -> None:
            for n, b in raw:
                if b in body:
                    found.setdefault(n, {})[topic] = found.get(n, {}).get(topic, 0) + 1

        while any(pos[tp] < end[tp] for tp in tps):
            batch = await consumer.getmany(timeout_ms=1000, max_records=5000)
            if not batch:
                continue
            for tp, recs in batch.items():
                for r in recs:
                    pos[tp] = r.offset + 1
                    key = (r.key or b"") + b"\x00"
                    count(out.raw, tp.topic, r.value or b"")
                    count(out.keys, tp.topic, r.key or b"")
                    value = ring.open(r.value) if ring is not None else r.value
                    if value is FORGOTTEN:
                        out.shredded[tp.topic] = out.shredded.get(tp.topic, 0) + 1
                    elif isinstance(value, bytes):
                        count(out.opened, tp.topic, key + value)
                        for shared in sealed_topics_of(value):  # a promotion request's sealed topics
                            topic = open_shared(shared, ring.keys) if ring is not None else None
                            if isinstance(topic, bytes):
                                count(out.opened, tp.topic, topic)
    finally:
        await consumer.stop()
    return out
