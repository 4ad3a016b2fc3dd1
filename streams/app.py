"""The Faust application: topics, the session table and the distiller agent (the I/O shell).

The agent body is short: take a batch, decode, call the pure processor, send outputs, update the
table by reassignment. Outputs and table writes are on the broker before the batch is acked, so
the offsets Faust commits never run ahead of the state they produced (at-least-once delivery +
idempotent processing = exactly-once results).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import faust
from faust.tables.table import Table
from faust.types import EventT

from processors.distiller import SessionState, decode_state, distill, encode_state, session_key
from schemas.codec import Rejection, decode_record, encode
from somnus.config import Settings
from streams.metrics import WorkerCounters


class SessionTable(Table):
    """A Faust table whose changelog records the agent sends itself, to the partition it names.

    Faust would take the changelog partition from the stream's *current* event; inside a
    ``take_events`` batch that is the last event of the batch, which may belong to another
    partition. Faust's per-message send path is also far slower than the producer's own
    (about 0.4 ms a record here), so writes are queued by ``on_key_set`` and sent in one go by
    ``send_changelog_batch``, which waits for the broker's acknowledgements.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.key_partitions: dict[Any, int] = {}
        self.pending_changelog: list[tuple[int, bytes, bytes | None]] = []

    def partition_for_key(self, key: Any) -> int | None:
        partition = self.key_partitions.get(key)
        return partition if partition is not None else super().partition_for_key(key)

    def on_key_set(self, key: Any, value: Any) -> None:
        partition = self.partition_for_key(key)
        assert partition is not None
        self.pending_changelog.append((partition, key, value))

    def on_key_del(self, key: Any) -> None:
        partition = self.partition_for_key(key)
        assert partition is not None
        self.pending_changelog.append((partition, key, None))

    async def send_changelog_batch(self, producer: Any) -> None:
        topic = self.changelog_topic.get_topic_name()
        futures = [await producer.send(topic, key=key, value=value, partition=partition, timestamp=None, headers=None)
                   for partition, key, value in self.pending_changelog]
        self.pending_changelog.clear()
        self.key_partitions.clear()
        if futures:
            await asyncio.gather(*futures)


def create_app(settings: Settings, bootstrap: str, worker_name: str = "worker") -> faust.App:
    datadir = Path(settings.home) / "faust" / worker_name
    datadir.mkdir(parents=True, exist_ok=True)
    app = faust.App(
        settings.app_id,
        broker=f"kafka://{bootstrap}",
        store="memory://",
        datadir=str(datadir),
        key_serializer="raw",
        value_serializer="raw",
        topic_partitions=settings.partitions,
        topic_replication_factor=1,
        topic_allow_declare=True,
        stream_wait_empty=False,
        processing_guarantee="at_least_once",
        consumer_auto_offset_reset="earliest",
        producer_acks=-1,
        producer_linger_ms=5,
        producer_max_batch_size=1 << 20,
        producer_max_request_size=8 << 20,
        broker_commit_every=5000,
        broker_commit_interval=5.0,
        web_enabled=False,
        stream_buffer_maxsize=16384,
        broker_max_poll_records=1000,
        consumer_max_fetch_size=16 << 20,
    )
    traces = app.topic(settings.traces_topic, partitions=settings.partitions, key_type=bytes, value_type=bytes,
                       internal=False)
    episodes = app.topic(settings.episodes_topic, partitions=settings.partitions, key_type=bytes,
                         value_type=bytes, internal=False)
    dead_letters = app.topic(settings.dead_letter_topic, partitions=settings.partitions, key_type=bytes,
                             value_type=bytes, internal=False)
    sessions = app.tables.add(SessionTable(
        app, name="sessions", partitions=settings.partitions, key_type=bytes, value_type=bytes,
        beacon=app.tables.beacon, help="per-session distiller state (msgspec JSON)"))
    counters = WorkerCounters()
    app.somnus_counters = counters  # type: ignore[attr-defined]

    @app.agent(traces, concurrency=1)
    async def distill_sessions(stream: faust.StreamT) -> None:
        async for batch in stream.take_events(settings.batch_size, within=settings.batch_within_s):
            await _handle_batch(app, settings, batch, sessions, episodes, dead_letters, counters)

    return app


async def _handle_batch(app: faust.App, settings: Settings, batch: Sequence[EventT], sessions: SessionTable,
                        episodes: faust.TopicT, dead_letters: faust.TopicT, counters: WorkerCounters) -> None:
    pending: list[Any] = []
    valid = []
    partition_of: dict[str, int] = {}  # session key -> source partition
    for event in batch:
        msg = event.message
        for index, item in enumerate(decode_record(msg.value, settings.max_event_bytes)):
            if isinstance(item, Rejection):
                counters.dead_letters += 1
                pending.append(await app.producer.send(
                    dead_letters.get_topic_name(), key=msg.key,
                    value=item.original if item.original is not None else (msg.value or b""),
                    partition=None, timestamp=None,
                    headers=dead_letter_headers(item, msg.topic, msg.partition, msg.offset, index)))
                continue
            valid.append(item)
            partition_of[session_key(item.agent, item.session_id)] = msg.partition
    counters.events += len(valid)
    prior: dict[str, SessionState] = {}
    for key in partition_of:
        raw = sessions.get(key.encode())
        if raw is not None:
            prior[key] = decode_state(raw)
    out = distill(prior, valid)
    counters.duplicates += out.duplicates
    counters.late += out.late
    for ep in out.episodes:
        counters.episodes += 1
        pending.append(await app.producer.send(episodes.get_topic_name(), key=ep.session_id.encode(), value=encode(ep),
                                               partition=None, timestamp=None, headers=None))
    # Episodes and dead letters must be on the broker before the state that says "done" is.
    if pending:
        await asyncio.gather(*pending)
    for key, state in out.states.items():
        bkey = key.encode()
        sessions.key_partitions[bkey] = partition_of[key]
        sessions[bkey] = encode_state(state)
    await sessions.send_changelog_batch(app.producer)


def dead_letter_headers(rejection: Rejection, topic: str, partition: int, offset: int,
                        index: int) -> list[tuple[str, bytes]]:
    """Where a dead letter came from and why; the value is the original bytes of the rejected event."""
    return [
        ("somnus-reason", rejection.reason.encode()[:4000]),
        ("somnus-source-topic", topic.encode()),
        ("somnus-source-partition", str(partition).encode()),
        ("somnus-source-offset", str(offset).encode()),
        ("somnus-source-index", str(index).encode()),
    ]
