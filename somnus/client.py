"""The publishing client for agent runtimes: ``publish(events)``; key = session_id.

Events may be dicts, typed events (``somnus.schemas.events``) or raw JSON bytes. Raw bytes are sent as
they are (the pipeline validates them; bad ones reach the dead-letter topic), keyed by their
``session_id`` when it can be read.

>>> key_of(b'{"session_id": "s-1", "seq": 0}')
b's-1'
>>> key_of(b'not json') is None
True
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterable, Iterable
from typing import Any

import msgspec
import orjson
from aiokafka import AIOKafkaProducer

from somnus.schemas.codec import encode
from somnus.streams.connection import LARGE_RECORDS, kafka_options
from pathlib import Path
from somnus.config import Settings
from somnus.reads import read
import threading


class _Key(msgspec.Struct):
    session_id: Any = None


_key_only = msgspec.json.Decoder(_Key)


def key_of(raw: bytes) -> bytes | None:
    try:
        sid = _key_only.decode(raw).session_id
    except msgspec.DecodeError:
        return None
    return str(sid).encode() if sid is not None else None


def to_bytes(event: Any) -> bytes:
    if isinstance(event, (bytes, bytearray)):
        return bytes(event)
    if isinstance(event, dict):
        return orjson.dumps(event)
    return encode(event)


def make_producer(bootstrap: str, **overrides: Any) -> AIOKafkaProducer:
    options: dict[str, Any] = dict(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True, linger_ms=10,
                                   max_batch_size=1 << 20, max_request_size=8 << 20, compression_type=None,
                                   request_timeout_ms=60000)
    return AIOKafkaProducer(**(options | kafka_options() | overrides))  # a secured cluster: KAFKA_SECURITY_*


def bundles(raws: list[bytes], bundle_max: int) -> list[tuple[bytes | None, bytes]]:
    """Group consecutive events of a session into bundles of at most ``bundle_max`` events.

    Returns ``(key, value)`` records; each session's events keep their order, and a bundle of one
    event is the plain event object. Events whose session id cannot be read travel alone.

    >>> [v for _, v in bundles([b'{"session_id":"a"}', b'{"session_id":"b"}', b'{"session_id":"a"}'], 8)]
    [b'[{"session_id":"a"},{"session_id":"a"}]', b'{"session_id":"b"}']
    """
    if bundle_max <= 1:
        return [(key_of(r), r) for r in raws]
    groups: dict[bytes | None, list[bytes]] = {}
    out: list[tuple[bytes | None, bytes]] = []
    for raw in raws:
        key = key_of(raw)
        if key is None:
            out.append((None, raw))
        else:
            groups.setdefault(key, []).append(raw)
    for key, items in groups.items():
        for i in range(0, len(items), bundle_max):
            part = items[i:i + bundle_max]
            out.append((key, part[0] if len(part) == 1 else b"[" + b",".join(part) + b"]"))
    return out


async def publish_async(events: Iterable[Any] | AsyncIterable[Any], bootstrap: str, topic: str,
                        chunk: int = 20000, bundle_max: int = 64) -> int:
    """Publish events, keyed by session id, in order per session; returns how many events were acknowledged.

    Consecutive events of one session within a chunk travel as one bundle record (see
    ``somnus.schemas.codec.decode_record``); ``bundle_max=1`` sends one record per event.
    """
    producer = make_producer(bootstrap)
    await producer.start()
    sent = 0
    try:
        buffer: list[bytes] = []

        async def drain() -> None:
            nonlocal sent
            sent += await _send_bundles(producer, topic, buffer, bundle_max)
            buffer.clear()

        if isinstance(events, AsyncIterable):
            async for event in events:
                buffer.append(to_bytes(event))
                if len(buffer) >= chunk:
                    await drain()
        else:
            for event in events:
                buffer.append(to_bytes(event))
                if len(buffer) >= chunk:
                    await drain()
        await drain()
        await producer.flush()
    finally:
        await producer.stop()
    return sent


async def _send_bundles(producer: AIOKafkaProducer, topic: str, raws: list[bytes], bundle_max: int) -> int:
    """Send encoded events as session bundles and wait for every acknowledgement; how many events."""
    futures = [await producer.send(topic, value, key=key) for key, value in bundles(raws, bundle_max)]
    await asyncio.gather(*futures)
    return len(raws)


def publish(events: Iterable[Any], bootstrap: str, topic: str, bundle_max: int = 64) -> int:
    """Synchronous wrapper of ``publish_async`` for scripts (one producer per call: a runtime that
    publishes often keeps a ``Publisher``)."""
    return asyncio.run(publish_async(events, bootstrap, topic, bundle_max=bundle_max))


class Publisher:
    """A long-lived publisher for runtimes: one idempotent producer on a background event loop, so a
    call costs a round trip, not a connection. ``send`` blocks until the broker acknowledged every
    event; it may be called from several threads. Use as a context manager, or ``close()``."""

    def __init__(self, bootstrap: str, topic: str, bundle_max: int = 64, timeout_s: float = 120.0) -> None:
        self.topic, self.bundle_max, self.timeout_s = topic, bundle_max, timeout_s
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="somnus-publisher", daemon=True)
        self._thread.start()
        try:
            self._producer = self._call(self._start(bootstrap))
        except BaseException:
            self._loop.call_soon_threadsafe(self._loop.stop)
            raise

    async def _start(self, bootstrap: str) -> AIOKafkaProducer:
        producer = make_producer(bootstrap)
        await producer.start()
        return producer

    def _call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(self.timeout_s)

    def send(self, events: Iterable[Any]) -> int:
        """Publish events (dicts, bytes or event structs) keyed by session; how many were acknowledged."""
        return self._call(_send_bundles(self._producer, self.topic, [to_bytes(e) for e in events], self.bundle_max))

    def close(self) -> None:
        try:
            self._call(self._producer.stop())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)

    def __enter__(self) -> Publisher:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


# ---- reads for runtimes: briefings and prompt injection ----------------------------------

def briefing(agent: str, settings: Any = None, token: str | None = None) -> str | None:
    """The agent's cached briefing (Markdown), or None when it has none.

    Served by the running projector, or read from the DuckDB file when nothing runs. The projector
    is sent ``token``, else ``SOMNUS_TOKEN``, else the operator's token of its home (SECURITY.md)."""
    s = settings or Settings.resolve()
    got = read(Path(s.db_path), "briefing", agent, agents_dir=s.agents_dir, token=token)["briefing"]
    return got["markdown"] or None if got else None


def inject(agent: str, prompt: str, session_id: str | None = None, settings: Any = None,
           token: str | None = None) -> str:
    """``prompt`` with the agent's briefing prepended between delimiters (unchanged when it has none).

    Pass the ``session_id`` about to start so the projector records which facts it was shown
    (knowledge utilisation is counted from that record). ``token``: as for ``briefing``; a runtime
    holds the agent's own (``somnus token create --agent A``)."""
    s = settings or Settings.resolve()
    return read(Path(s.db_path), "inject", agent, agents_dir=s.agents_dir, token=token, prompt=prompt,
                session_id=session_id)["prompt"]


def publish_records(records: list[tuple[bytes | None, bytes, list[tuple[str, bytes]]]], bootstrap: str, topic: str,
                    partition: int | None = None) -> int:
    """Publish ``(key, value, headers)`` records as they are (operators' events: promotions, ...)."""
    async def run() -> int:
        producer = make_producer(bootstrap, **LARGE_RECORDS)  # operators' records: promotions, ...
        await producer.start()
        try:
            futures = [await producer.send(topic, value, key=key, headers=headers, partition=partition)
                       for key, value, headers in records]
            await asyncio.gather(*futures)
        finally:
            await producer.stop()
        return len(records)

    return asyncio.run(run())
