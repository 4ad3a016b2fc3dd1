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
import threading
from collections.abc import AsyncIterable, Iterable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import msgspec
import orjson
from aiokafka import AIOKafkaProducer

from somnus.config import Settings
from somnus.reads import read
from somnus.schemas.codec import encode
from somnus.streams.connection import LARGE_RECORDS, kafka_options


class _Key(msgspec.Struct):
    session_id: Any = None
    agent: Any = None
    type: Any = None
    payload: msgspec.Raw = msgspec.Raw(b"null")


class _Start(msgspec.Struct):
    user_id: Any = None


_key_only = msgspec.json.Decoder(_Key)
_start = msgspec.json.Decoder(_Start)


def key_of(raw: bytes) -> bytes | None:
    return _subject(raw)[0]


def _subject(raw: bytes) -> tuple[bytes | None, tuple[str, str] | None, str | None]:
    """The record key (session id), the session ``(agent, session_id)`` and the user id (a session
    start's) of one encoded event, each None when it cannot be read."""
    try:
        ev = _key_only.decode(raw)
    except msgspec.DecodeError:
        return None, None, None
    sid, agent = ev.session_id, ev.agent
    key = str(sid).encode() if sid is not None else None
    session = (agent, sid) if isinstance(agent, str) and isinstance(sid, str) else None
    user = None
    if ev.type == "session_start":
        try:
            u = _start.decode(ev.payload).user_id
        except msgspec.DecodeError:
            u = None
        user = u if isinstance(u, str) else None
    return key, session, user


def to_bytes(event: Any) -> bytes:
    if isinstance(event, (bytes, bytearray)):
        return bytes(event)
    if isinstance(event, dict):
        return orjson.dumps(event)
    return encode(event)


def make_producer(bootstrap: str, **overrides: Any) -> AIOKafkaProducer:
    options: dict[str, Any] = dict(
        bootstrap_servers=bootstrap,
        acks="all",
        enable_idempotence=True,
        linger_ms=10,
        max_batch_size=1 << 20,
        max_request_size=8 << 20,
        compression_type=None,
        request_timeout_ms=60000,
    )
    return AIOKafkaProducer(**(options | kafka_options() | overrides))  # a secured cluster: KAFKA_SECURITY_*


def bundles(raws: list[bytes], bundle_max: int) -> list[tuple[bytes | None, bytes]]:
    """Group consecutive events of a session into bundles of at most ``bundle_max`` events.

    Returns ``(key, value)`` records; each session's events keep their order, and a bundle of one
    event is the plain event object. Events whose session id cannot be read travel alone.

    >>> [v for _, v in bundles([b'{"session_id":"a"}', b'{"session_id":"b"}', b'{"session_id":"a"}'], 8)]
    [b'[{"session_id":"a"},{"session_id":"a"}]', b'{"session_id":"b"}']
    """
    return [(key, value) for key, _, _, value in session_bundles(raws, bundle_max)]


Session = tuple[str, str]  # (agent, session_id)


BUNDLE_MAX_BYTES = 1 << 20  # of a bundle's events (the producer's batch size); one larger event travels alone


def session_bundles(
    raws: list[bytes],
    bundle_max: int,
    max_bytes: int = BUNDLE_MAX_BYTES,
) -> list[tuple[bytes | None, Session | None, str | None, bytes]]:
    """``bundles`` with each record's session and its user (when one of the session's events here names
    it): ``(key, session, user, value)``; a bundle holds one session's events (agent and session id),
    at most ``bundle_max`` of them and, unless it is one event, at most ``max_bytes`` of them: 64
    events of 200 KB made a 13 MB record, which the producer refused (its limit is 8 MiB), failing
    the whole publish."""
    out: list[tuple[bytes | None, Session | None, str | None, bytes]] = []
    groups: dict[tuple[bytes, Session | None], list[bytes]] = {}
    users: dict[Session, str] = {}
    for raw in raws:
        key, session, user = _subject(raw)
        if session is not None and user is not None:
            users[session] = user
        if key is None or bundle_max <= 1:
            out.append((key, session, None, raw))
        else:
            groups.setdefault((key, session), []).append(raw)
    for (key, session), items in groups.items():
        for part in _parts(items, bundle_max, max_bytes):
            out.append((key, session, None, part[0] if len(part) == 1 else b"[" + b",".join(part) + b"]"))
    return [(k, s, users.get(s) if s is not None else None, v) for k, s, _, v in out]


def _parts(items: list[bytes], most: int, max_bytes: int) -> Iterable[list[bytes]]:
    """``items`` in order, cut into lists of at most ``most`` items and ``max_bytes`` bytes (an item
    larger than that alone).

    >>> [len(p) for p in _parts([b"x" * 4] * 5, 8, 10)], [len(p) for p in _parts([b"x" * 40, b"x"], 8, 10)]
    ([2, 2, 1], [1, 1])
    """
    part: list[bytes] = []
    size = 0
    for item in items:
        if part and (len(part) >= most or size + len(item) + 1 > max_bytes):
            yield part
            part, size = [], 0
        part.append(item)
        size += len(item) + 1
    if part:
        yield part


def sealing_default() -> bool:
    """Whether publishers seal trace records (``SOMNUS_ENCRYPT``, default on; ``0`` publishes plaintext)."""
    import os

    return os.environ.get("SOMNUS_ENCRYPT", "1").strip().lower() not in ("0", "false", "no", "off")


def session_keys(topic: str, seal: bool | None, keys_topic: str | None) -> Any:
    """The publisher's ``SessionKeys`` (None: it publishes plaintext)."""
    from somnus.streams.keys import SessionKeys, keys_topic_for

    if not (sealing_default() if seal is None else seal):
        return None
    return SessionKeys(keys_topic or keys_topic_for(topic))


async def publish_async(
    events: Iterable[Any] | AsyncIterable[Any],
    bootstrap: str,
    topic: str,
    chunk: int = 20000,
    bundle_max: int = 64,
    seal: bool | None = None,
    keys_topic: str | None = None,
) -> int:
    """Publish events, keyed by session id, in order per session; returns how many events were acknowledged.

    Consecutive events of one session within a chunk travel as one bundle record (see
    ``somnus.schemas.codec.decode_record``); ``bundle_max=1`` sends one record per event. Each record is
    sealed with its session's data key (``somnus.schemas.sealed``; the keys go to ``keys_topic``, by
    default the one beside ``topic``, first) unless ``seal`` is False (default: ``SOMNUS_ENCRYPT``).
    """
    producer = make_producer(bootstrap)
    await producer.start()
    sent = 0
    keys = session_keys(topic, seal, keys_topic)
    try:
        buffer: list[bytes] = []

        async def drain() -> None:
            nonlocal sent
            sent += await _send_bundles(producer, topic, buffer, bundle_max, keys)
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


async def _send_bundles(
    producer: AIOKafkaProducer, topic: str, raws: list[bytes], bundle_max: int, keys: Any = None
) -> int:
    """Send encoded events as session bundles and wait for every acknowledgement; how many events. With
    ``keys`` (``somnus.streams.keys.SessionKeys``) each bundle is sealed with its session's key, sent and
    acknowledged on the key topic first; a record whose session cannot be read goes as it is."""
    from somnus.schemas.sealed import seal, sealed_headers

    records = session_bundles(raws, bundle_max)
    sealing: dict[Any, Any] = {}
    if keys is not None:
        users: dict[Any, str | None] = {}
        for _, session, user, _ in records:
            if session is not None:
                users[session] = users.get(session) or user
        sealing = await keys.for_sessions(producer, users)
    futures = []
    for key, session, _, value in records:
        dk = sealing.get(session) if session is not None else None
        futures.append(
            await producer.send(
                topic, seal(dk, value) if dk is not None else value, key=key, headers=sealed_headers(None, dk)
            )
        )
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

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        bundle_max: int = 64,
        timeout_s: float = 120.0,
        seal: bool | None = None,
        keys_topic: str | None = None,
    ) -> None:
        self.topic, self.bundle_max, self.timeout_s = topic, bundle_max, timeout_s
        self.keys = session_keys(topic, seal, keys_topic)  # sealing (publish_async), one key per session
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
        return self._call(
            _send_bundles(self._producer, self.topic, [to_bytes(e) for e in events], self.bundle_max, self.keys)
        )

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
    got = read(Path(s.db_path or s.home / "somnus.duckdb"), "briefing", agent, agents_dir=s.agents_dir, token=token)[
        "briefing"
    ]
    return got["markdown"] or None if got else None


def inject(
    agent: str, prompt: str, session_id: str | None = None, settings: Any = None, token: str | None = None
) -> str:
    """``prompt`` with the agent's briefing prepended between delimiters (unchanged when it has none).

    Pass the ``session_id`` about to start so the projector records which facts it was shown
    (knowledge utilisation is counted from that record). ``token``: as for ``briefing``; a runtime
    holds the agent's own (``somnus token create --agent A``)."""
    s = settings or Settings.resolve()
    return read(
        Path(s.db_path or s.home / "somnus.duckdb"),
        "inject",
        agent,
        agents_dir=s.agents_dir,
        token=token,
        prompt=prompt,
        session_id=session_id,
    )["prompt"]


def publish_records(
    records: list[tuple[bytes | None, bytes, list[tuple[str, bytes]]]],
    bootstrap: str,
    topic: str,
    partition: int | None = None,
) -> int:
    """Publish ``(key, value, headers)`` records as they are (operators' events: promotions, ...)."""

    async def run() -> int:
        producer = make_producer(bootstrap, **LARGE_RECORDS)  # operators' records: promotions, ...
        await producer.start()
        try:
            futures = [
                await producer.send(topic, value, key=key, headers=headers, partition=partition)
                for key, value, headers in records
            ]
            await asyncio.gather(*futures)
        finally:
            await producer.stop()
        return len(records)

    return asyncio.run(run())


def publish_sealed(
    key: bytes | None,
    value: bytes,
    headers: list[tuple[str, bytes]],
    bootstrap: str,
    topic: str,
    keys_topic: str,
    subject: tuple[str, str],
    user_id: str | None,
    partition: int | None = None,
) -> None:
    """Publish one record that carries a person's text, sealed (``somnus.schemas.sealed``) under a data key
    of its own ``subject`` (``(agent, id)``, naming ``user_id``), sent and acknowledged on ``keys_topic``
    first, so ``somnus forget`` shreds it as it does a session's records. Plaintext when sealing is off
    (``SOMNUS_ENCRYPT=0``)."""
    from somnus.schemas.sealed import seal, sealed_headers

    keys = session_keys(topic, None, keys_topic)

    async def run() -> None:
        producer = make_producer(bootstrap, **LARGE_RECORDS)
        await producer.start()
        try:
            dk = (await keys.for_sessions(producer, {subject: user_id}))[subject] if keys is not None else None
            sent = await producer.send(
                topic,
                seal(dk, value) if dk is not None else value,
                key=key,
                headers=sealed_headers(headers, dk),
                partition=partition,
            )
            await sent
        finally:
            await producer.stop()

    asyncio.run(run())


# ---- goals (docs/concepts/goals.md) -------------------------------------------------------------


def set_goal(
    bootstrap: str,
    agent: str,
    text: str,
    *,
    user_id: str | None = None,
    goal_id: str | None = None,
    at: datetime | None = None,
    settings: Any = None,
) -> str:
    """Publish a goal for ``agent`` (an event on the memory topic; the projector measures its forward
    prediction error as memories arrive) and return its id. ``at``: its event time, default now."""
    from somnus import memory_requests

    s = settings or Settings.resolve()
    when = at or datetime.now(timezone.utc)
    return str(
        memory_requests.set_goal(s, bootstrap, agent, text, when, user_id, set_by=agent, goal_id=goal_id).goal_id
    )


def close_goal(
    bootstrap: str, agent: str, goal_id: str, *, dropped: bool = False, at: datetime | None = None, settings: Any = None
) -> None:
    """Publish the closing of one of ``agent``'s goals: achieved, or abandoned (``dropped``)."""
    from somnus import memory_requests

    s = settings or Settings.resolve()
    memory_requests.close_goal(
        s, bootstrap, agent, goal_id, at or datetime.now(timezone.utc), "dropped" if dropped else "done"
    )
