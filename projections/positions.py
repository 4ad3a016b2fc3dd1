"""Kafka positions for ``somnus status``: every reported topic's end offsets and the worker group's
committed offsets.

Asked of Kafka with a consumer and an admin client. The running projector answers them (``GET
/kafka-positions``, operator token) on its own event loop with one pair of clients kept open
(``KafkaPositions``): a status then costs a few round trips to the broker instead of two clients'
start (~130 ms of a ~0.5 s ``somnus status``), and ``somnus status`` itself needs no Kafka client;
with no projector, the CLI asks Kafka itself (``kafka_positions``, ``somnus.reads.status``). aiokafka
is imported when Kafka is asked, so reading the answer (``from_json``) costs nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import asyncio

from somnus.config import Settings

Positions = tuple[dict[str, dict[int, int]], dict[str, dict[int, int]]]  # (end offsets, worker committed)


async def _open(settings: Settings, bootstrap: str) -> tuple[Any, Any]:
    """A started consumer (no group) and admin client for ``_ask``."""
    from aiokafka import AIOKafkaConsumer
    from aiokafka.admin import AIOKafkaAdminClient

    from somnus.streams.connection import kafka_options

    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False, **kafka_options(settings)
    )
    await consumer.start()
    try:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, **kafka_options(settings))
        await admin.start()
    except BaseException:
        await consumer.stop()
        raise
    return consumer, admin


async def _close(consumer: Any, admin: Any) -> None:
    try:
        await admin.close()
    finally:
        await consumer.stop()


async def _ask(settings: Settings, consumer: Any, admin: Any) -> Positions:
    """The end offsets of the projected topics and observations, and the worker group's committed offsets
    of the topics it consumes (traces, episodes, observations), by topic and partition."""
    from aiokafka import TopicPartition

    from somnus.streams.topics import partitions_of

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


async def kafka_positions(settings: Settings, bootstrap: str) -> Positions:
    """``_ask`` with clients of its own, closed after (the CLI when no projector runs)."""
    consumer, admin = await _open(settings, bootstrap)
    try:
        return await _ask(settings, consumer, admin)
    finally:
        await _close(consumer, admin)


class KafkaPositions:
    """``kafka_positions`` with one consumer and admin client kept open between calls, on one event loop
    (the projector's). A call that fails (a broker restarted under the clients) closes them and asks
    once more with new ones; ``close`` when the loop's owner stops."""

    def __init__(self, settings: Settings, bootstrap: str) -> None:
        self.settings, self.bootstrap = settings, bootstrap
        self._clients: tuple[Any, Any] | None = None
        self._lock: asyncio.Lock | None = None  # made on the loop that uses it

    async def __call__(self) -> Positions:
        import asyncio

        self._lock = self._lock or asyncio.Lock()
        async with self._lock:  # one status at a time on the shared clients
            try:
                return await self._ask()
            except Exception:  # e.g. a broker restarted under the clients: once more, with new ones
                await self.close()
            try:
                return await self._ask()
            except BaseException:
                await self.close()
                raise

    async def _ask(self) -> Positions:
        if self._clients is None:
            self._clients = await _open(self.settings, self.bootstrap)
        return await _ask(self.settings, *self._clients)

    async def close(self) -> None:
        clients, self._clients = self._clients, None
        if clients is not None:
            try:
                await _close(*clients)
            except Exception:  # a client of a dead connection: nothing left to close cleanly
                pass


def on_loop(
    settings: Settings,
    bootstrap: str,
    loop: asyncio.AbstractEventLoop,
    timeout_s: float = 60.0,
    ask: Callable[[], Coroutine[Any, Any, Positions]] | None = None,
) -> Callable[[], dict[str, Any]]:
    """``ask`` (default: ``kafka_positions`` with clients of its own) run on ``loop`` (the projector's)
    from another thread (a read's), as JSON."""

    def positions() -> dict[str, Any]:
        import asyncio

        asked = ask() if ask is not None else kafka_positions(settings, bootstrap)
        ends, committed = asyncio.run_coroutine_threadsafe(asked, loop).result(timeout_s)
        return {"ends": ends, "committed": committed}

    return positions


def from_json(got: dict[str, Any]) -> Positions:
    """``on_loop``'s answer as read back from JSON (partitions are strings there)."""
    return tuple(
        {t: {int(p): int(o) for p, o in parts.items()} for t, parts in got[k].items()}  # type: ignore[return-value]
        for k in ("ends", "committed")
    )
