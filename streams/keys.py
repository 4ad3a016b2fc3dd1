"""The key topic: every session's data key (``somnus.schemas.sealed``), read and followed by every process
that opens records, written by publishers before their first sealed record, deleted by ``somnus forget``.

The topic is compacted (``KEY_TOPIC_CONFIG``): a tombstone deletes a key, and compaction removes the key's
bytes from the broker's log soon after. Order makes a missing key mean *forgotten*: a publisher sends a
session's key and waits for the broker's acknowledgement (acks=all) before it sends a record sealed with
it, so when a reader meets that record the key is below the key topic's end offset. A reader that does
not hold a record's key reads the key topic to its current end (``KeyFollower.ensure``); a key still
missing then was deleted (a tombstone, or compacted away after one).

>>> ring = KeyRing()
>>> k = DataKey(key_id="k1", agent="aga", session_id="s1", user_id="u1", key=bytes(32))
>>> ring.apply(b"k1", encode_key(k))
>>> ring.key_for("aga", "s1").key_id, ring.select("user", "u1")
('k1', ['k1'])
>>> ring.apply(b"k1", None)  # a tombstone
>>> ring.key_for("aga", "s1") is None, ring.deleted
(True, 1)
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Iterable, Mapping
from typing import Any

from somnus.schemas.sealed import DataKey, KeyRing, encode_key

log = logging.getLogger("somnus.keys")

# Compaction soon after a tombstone: segments roll after a second (once a later record arrives),
# any dirty segment is cleanable, and a tombstone itself is dropped a second after compaction. The
# segment files a cleaning replaced (which still hold the deleted key) are deleted from the broker's
# disk a second later (file.delete.delay.ms; the broker's default is 60 s). Set when the topic is made.
KEY_TOPIC_CONFIG = {
    "cleanup.policy": "compact",
    "segment.ms": "1000",
    "min.compaction.lag.ms": "0",
    "max.compaction.lag.ms": "1000",
    "min.cleanable.dirty.ratio": "0.01",
    "delete.retention.ms": "1000",
    "file.delete.delay.ms": "1000",
    "retention.ms": "-1",
}


def keys_topic_for(traces_topic: str) -> str:
    """The key topic beside a traces topic: ``somnus.traces`` -> ``somnus.keys``.

    >>> keys_topic_for("somnus.traces"), keys_topic_for("t-1-traces"), keys_topic_for("mine")
    ('somnus.keys', 't-1-keys', 'mine.keys')
    """
    if traces_topic.endswith("traces"):
        return traces_topic[: -len("traces")] + "keys"
    return f"{traces_topic}.keys"


class KeyFollower:
    """A ``KeyRing`` kept up to date from the key topic by one consumer of its own (no group)."""

    def __init__(self, bootstrap: str, topic: str, settings: Any = None) -> None:
        self.bootstrap, self.topic, self.settings = bootstrap, topic, settings
        self.ring = KeyRing()
        self._consumer: Any = None
        self._tp: Any = None
        self._lock = asyncio.Lock()

    async def start(self) -> KeyFollower:
        from aiokafka import AIOKafkaConsumer

        from somnus.streams.connection import kafka_options

        self._consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap,
            enable_auto_commit=False,
            group_id=None,
            auto_offset_reset="earliest",
            **kafka_options(self.settings),
        )
        await self._consumer.start()
        try:
            await self.catch_up()
        except RuntimeError as exc:  # no key topic (yet): plaintext records only; tried again on a miss
            log.warning("%s; sealed records cannot be opened until it exists", exc)
        return self

    async def stop(self) -> None:
        if self._consumer is not None:
            await self._consumer.stop()
            self._consumer = None

    @property
    def offline(self) -> bool:
        """A follower of no broker (no bootstrap): its ring is all it has (tests, tools)."""
        return not self.bootstrap

    async def catch_up(self) -> None:
        """Read the key topic from where this ring stopped to its current end."""
        if self.offline:
            return
        if self._consumer is None:
            await self.start()
            return
        async with self._lock:
            if self._tp is None:
                self._tp = await _assign(self._consumer, self.topic, self.ring.position, timeout_s=5.0)
            await _read_to_end(self._consumer, self._tp, self.ring)

    async def ensure(self, values: Iterable[bytes | None]) -> None:
        """Every key the sealed ``values`` name is in the ring, or was deleted (read to the end first)."""
        if self.ring.missing(values):
            try:
                await self.catch_up()
            except RuntimeError as exc:  # no key topic: the record opens as forgotten (its key is nowhere)
                log.error("%s: sealed records whose key is not held are skipped as forgotten", exc)

    def catch_up_blocking(self) -> None:
        """``catch_up`` from code that cannot await (a Faust table restoring its changelog): a consumer of
        its own, in a thread with its own event loop; this thread waits for it."""
        if self.offline:
            return

        def run() -> None:
            try:
                asyncio.run(read_keys(self.bootstrap, self.topic, self.settings, self.ring))
            except Exception as exc:  # noqa: BLE001 - the caller goes on with the keys it has
                log.warning("could not read the key topic %s: %r", self.topic, exc)

        t = threading.Thread(target=run, name="somnus-keys", daemon=True)
        t.start()
        t.join(60)


async def _assign(consumer: Any, topic: str, position: int, timeout_s: float = 20.0) -> Any:
    from aiokafka import TopicPartition

    from somnus.streams.topics import partitions_of

    await partitions_of(consumer, topic, timeout_s)
    tp = TopicPartition(topic, 0)
    consumer.assign([tp])
    consumer.seek(tp, position)
    return tp


async def _read_to_end(consumer: Any, tp: Any, ring: KeyRing) -> None:
    end = (await consumer.end_offsets([tp]))[tp]
    if ring.position >= end:
        return
    consumer.seek(tp, ring.position)
    while ring.position < end:
        got = await consumer.getmany(tp, timeout_ms=1000, max_records=10000)
        for r in got.get(tp, []):
            ring.apply(r.key, r.value)
            ring.position = r.offset + 1
        if not got:
            # compaction may have removed the last records below the end: nothing more comes
            if await consumer.position(tp) >= end:
                ring.position = end


async def read_keys(bootstrap: str, topic: str, settings: Any = None, ring: KeyRing | None = None) -> KeyRing:
    """The key topic read to its end (into ``ring`` from its position, or a new ring)."""
    from aiokafka import AIOKafkaConsumer

    from somnus.streams.connection import kafka_options

    ring = ring if ring is not None else KeyRing()
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        group_id=None,
        auto_offset_reset="earliest",
        **kafka_options(settings),
    )
    await consumer.start()
    try:
        tp = await _assign(consumer, topic, ring.position)
        await _read_to_end(consumer, tp, ring)
    finally:
        await consumer.stop()
    return ring


async def publish_keys(producer: Any, topic: str, keys: Iterable[DataKey]) -> int:
    """Send data keys to the key topic and wait for the broker's acknowledgements (before any record
    sealed with them is sent)."""
    futures = [await producer.send(topic, encode_key(k), key=k.key_id.encode(), partition=0) for k in keys]
    if futures:
        await asyncio.gather(*futures)
    return len(futures)


async def delete_keys(bootstrap: str, topic: str, key_ids: Iterable[str], settings: Any = None) -> int:
    """Tombstones for ``key_ids`` on the key topic, acknowledged; how many were sent."""
    from aiokafka import AIOKafkaProducer

    from somnus.streams.connection import kafka_options

    ids = list(key_ids)
    if not ids:
        return 0
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, acks="all", enable_idempotence=True, **kafka_options(settings)
    )
    await producer.start()
    try:
        futures = [await producer.send(topic, None, key=k.encode(), partition=0) for k in ids]
        await asyncio.gather(*futures)
    finally:
        await producer.stop()
    return len(ids)


class SessionKeys:
    """A publisher's data keys: one per session it publishes for, made on first use and sent to the key
    topic (acknowledged) before the caller seals a record with it; sent again with the user once the
    publisher sees the session's start. ``limit`` bounds how many it remembers (a session met again
    after that gets a new key: any number of keys per session is fine)."""

    def __init__(self, topic: str, limit: int = 100_000) -> None:
        self.topic, self.limit = topic, limit
        self.known: dict[tuple[str, str], DataKey] = {}

    async def for_sessions(
        self, producer: Any, sessions: Mapping[tuple[str, str], str | None]
    ) -> dict[tuple[str, str], DataKey]:
        """The key of each ``(agent, session_id)`` of ``sessions`` (-> its user id when known), new or
        changed ones published first."""
        from somnus.schemas.sealed import new_key

        out: dict[tuple[str, str], DataKey] = {}
        changed: list[DataKey] = []
        for (agent, sid), user in sessions.items():
            dk = self.known.get((agent, sid))
            if dk is None:
                dk = new_key(agent, sid, user)
                changed.append(dk)
            elif user is not None and dk.user_id != user:
                dk = DataKey(key_id=dk.key_id, agent=agent, session_id=sid, user_id=user, key=dk.key)
                changed.append(dk)
            out[(agent, sid)] = dk
        await publish_keys(producer, self.topic, changed)
        if len(self.known) + len(changed) > self.limit:
            self.known.clear()
        self.known.update(out)
        return out
