"""The Faust application: topics, the session table and the distiller agent (the I/O shell).

The agent body is short: take a batch, decode, call the pure processor, send outputs, update the
table by reassignment. Outputs and table writes are on the broker before the batch is acked, so
the offsets Faust commits never run ahead of the state they produced (at-least-once delivery +
idempotent processing = exactly-once results).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import faust
from faust.tables.table import Table
from faust.types import EventT
import msgspec

from somnus.processors.sessions.distiller import SessionState, decode_state, encode_state, session_key
from somnus.processors.sessions.batch import distill_rounds
from somnus.processors.sessions.session_retention import MarkerHeap, micros, record_cap, sift, stream_times
from somnus.processors.working.session_buffer import WorkingMemorySettings
from somnus.processors.working.session_buffer import compact as compact_wm
from somnus.processors.working.session_buffer import decode_state as decode_wm
from somnus.processors.working.session_buffer import encode_state as encode_wm
from somnus.processors.prediction.causal_links import decode_link_state, learn, observations_from_episode
from somnus.schemas.memory import KIND_UNITS
from somnus.schemas.causal import OutcomeObserved
from somnus.schemas.episodes import EpisodeDistilled
from somnus.schemas.codec import (
    Rejection,
    decode_bounded,
    decode_record,
    encode,
    poison_reason,
    record_rejection,
    truncated_note,
)
from somnus.schemas.sealed import FORGOTTEN, MAX_PARTS, join_parts, parts_of, sealed_key_id
from somnus.streams.kafka_compat import bound_decompression, track_topics_sent_to
from somnus.streams.keys import KeyFollower
from somnus.streams.sealing import (
    OpenedOnce,
    bundles,
    TableSealing,
    dead_letter_value,
    key_of_record,
    link_state_value,
    opened_values,
    sealed,
    unit_records,
)
from somnus.streams.kafka_compat.offsets import chop_gaps_from, clear_read_offset
from somnus.config import Settings
from somnus.streams.connection import kafka_options
from somnus.streams.liveness import PartitionWatchdog, RecoveryWatchdog, install_diagnostics, watch
from somnus.streams.kafka_compat.consumer import SomnusApp
from somnus.streams.metrics import WorkerCounters
from somnus.streams.ordering import (
    POSITION_PREFIX,
    Admitted,
    OffsetGuard,
    decode_clock,
    decode_position,
    position_key,
    positions_writer,
)
from somnus.streams.topics import signature_partition
from somnus.streams.sequencer import Sequencer, latest_time
from faust.types import TP
from somnus.schemas.agents import load_agents
from somnus.processors.prediction.causal_links import alphas_for
from aiokafka import AIOKafkaConsumer, TopicPartition
from somnus.processors.knowledge.extraction import TraceExtractor
from somnus.streams.llm_extractor import AnthropicExtractor, LLMExtractorConfig

log = logging.getLogger("somnus.worker")


class BatchedTable(Table):
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
        self.sealing: Any = None  # somnus.streams.sealing.TableSealing: changelog values sealed per session
        # raises on a restored value the agent could not read (a key, a value); None: any value
        self.validate: Callable[[Any, Any], object] | None = None
        # changelog records restored as absent because ``validate`` raised: (message, reason), until
        # the agent dead-letters them (``Distiller.dead_letter_unreadable``)
        self.unreadable: list[tuple[Any, str]] = []

    def _to_value(self, v: Any) -> Any:  # a value restored from the changelog, opened
        return self.sealing.open(v) if self.sealing is not None else v

    def apply_changelog_batch(self, batch: Iterable[EventT]) -> None:
        """Restore from the changelog, each value opened and checked once. A value the agent could not
        read (written by another producer, or damaged) is restored as absent and kept for the dead-letter
        topic: left in the table, it would fail every later batch that reads its key, or every batch
        after a rebalance for a value that is scanned (a session's idle entry, a position)."""
        events = list(batch)
        restored: dict[int, Any] = {}  # id(changelog value) -> the value to hold
        for event in events:
            raw = event.value
            if raw is None:
                continue  # a tombstone
            try:
                value = self._to_value(raw)
                if value is not None and self.validate is not None:
                    self.validate(event.key, value)
            except Exception as exc:  # noqa: BLE001 - a boundary: any value that cannot be read is absent
                value = None
                where = f"while restoring the table {self.name!r} (the key is restored as absent)"
                self.unreadable.append((event.message, poison_reason(exc, where)))
            restored[id(raw)] = value
        self.data.apply_changelog_batch(events, to_key=self._to_key, to_value=lambda v: restored.get(id(v), v))

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

    async def write(
        self,
        producer: Any,
        items: Any,
        positions: Mapping[Any, int] | None = None,
        clocks: Mapping[int, int] | None = None,
    ) -> None:
        """Set each ``(key, partition, value)`` of ``items``, then the source positions with their
        partitions' stream times (after the states, on the same changelog partitions: see
        ``somnus.streams.ordering``); send all, wait for acks."""
        for key, partition, value in items:
            self.key_partitions[key] = partition
            self[key] = value
        positions_writer(self)(positions or {}, clocks)
        await self.send_changelog_batch(producer)

    async def delete(self, producer: Any, items: Any) -> int:
        """Remove each ``(key, partition)`` of ``items`` that is present (a tombstone in the
        changelog); send, wait for acks. Returns how many were removed."""
        removed = 0
        for key, partition in items:
            if key in self:
                self.key_partitions[key] = partition
                del self[key]
                removed += 1
        await self.send_changelog_batch(producer)
        return removed

    async def send_changelog_batch(self, producer: Any) -> None:
        topic = self.changelog_topic.get_topic_name()
        seal = self.sealing.seal if self.sealing is not None else lambda k, v: (v, None)
        futures = [
            await producer.send(topic, key=key, value=value, partition=partition, timestamp=None, headers=headers)
            for partition, key, raw in self.pending_changelog
            for value, headers in [seal(key, raw)]
        ]
        self.pending_changelog.clear()
        self.key_partitions.clear()
        if futures:
            await asyncio.gather(*futures)


class Batcher:
    """Batches of at most ``max_events`` events, flushed at the latest ``within_s`` after the first.

    What ``stream.take_events(n, within=...)`` does, without its buffering processor, which was
    once seen blocked after a rebalance. Events are acked only after their batch was handled, one
    batch at a time. Events of an older consumer generation (a rebalance happened since) are
    neither handled nor acked: Faust delivers them again to their new owner. The story:
    docs/design/kafka-workarounds.md, "The worker's own batcher".

    ``handle`` returns the events to acknowledge, or None for all of them: a guarded agent
    (``somnus.streams.ordering``) acknowledges neither a hole nor what follows it.
    """

    def __init__(
        self,
        app: faust.App,
        stream: faust.StreamT,
        max_events: int,
        within_s: float,
        handle: Any,
        sequencer: Ordered | None = None,
    ) -> None:
        self.app, self.stream = app, stream
        self.max_events, self.within_s, self.handle = max_events, within_s, handle
        self.events: list[tuple[int, EventT]] = []
        self.first_at = 0.0
        self.lock = asyncio.Lock()
        self.dropped_stale = 0
        self.ordered = sequencer  # events in one order across partitions first (streams/sequencer.py)

    @property
    def idle(self) -> bool:
        """Nothing buffered or held and no batch being handled."""
        return not self.events and not self.lock.locked() and (self.ordered is None or not self.ordered.held)

    async def add(self, event: EventT) -> None:
        if self.ordered is None:
            await self._add(self.app.consumer_generation_id, event)
            return
        if self.ordered.prepare is not None:
            await self.ordered.prepare(event.message)
        for generation, ev in self.ordered.add(self.app.consumer_generation_id, event):
            await self._add(generation, ev)

    async def _add(self, generation: int, event: EventT) -> None:
        if not self.events:
            self.first_at = asyncio.get_running_loop().time()
        self.events.append((generation, event))
        if len(self.events) >= self.max_events:
            await self.flush()

    async def tick(self) -> None:
        while True:
            await asyncio.sleep(self.within_s / 2)
            if self.ordered is not None:  # held for a partition that stayed silent: handed on now
                await self.ordered.confirm_quiet()
                for generation, ev in self.ordered.ready():
                    await self._add(generation, ev)
            if self.events and asyncio.get_running_loop().time() - self.first_at >= self.within_s:
                await self.flush()

    async def flush(self) -> None:
        async with self.lock:
            tagged, self.events = self.events, []
            generation = self.app.consumer_generation_id
            batch = [event for gen, event in tagged if gen == generation]
            self.dropped_stale += len(tagged) - len(batch)
            if not batch:
                return
            acks = await self.handle(batch, generation)
            if self.app.consumer_generation_id != generation:
                self.dropped_stale += len(batch)
                return  # rebalanced while handling: these will be redelivered; do not ack
            for event in batch if acks is None else acks:
                await self.stream.ack(event)


class Ordered:
    """A trace agent's ``Sequencer`` (streams/sequencer.py) over Faust events: each event held with the
    consumer generation it came in, every held event forgotten when the generation changes (a
    rebalance: Faust delivers them again, to their owner)."""

    QUIET_S = 2.0  # a caught-up partition with nothing new for this long is not waited for
    MAX_HOLD_S = 10.0  # a partition that is not caught up is waited for at most this long

    def __init__(
        self,
        app: Any,
        topic: str,
        sessions: Any,
        time_of: Any,
        counters: WorkerCounters | None = None,
        on_clear: Any = None,
        prepare: Any = None,
    ) -> None:
        self.app, self.topic, self.time_of, self.on_clear = app, topic, time_of, on_clear
        self.prepare = prepare  # awaited with each record before its time is read (its data key fetched)
        self.counters = counters if counters is not None else WorkerCounters()
        self.generation: int | None = None

        def high_water(p: int) -> int | None:
            try:
                return app.consumer.highwater(TP(topic, p))
            except Exception:  # noqa: BLE001 - not fetched yet, or no consumer: unknown
                return None

        def owned() -> frozenset[int]:
            try:
                return _owned(app, topic)
            except Exception:  # noqa: BLE001 - no consumer (an agent's test context): no partition to wait for
                return frozenset()

        self.sequencer = Sequencer(
            owned=owned,
            start_clock=lambda p: decode_clock(sessions.get(position_key(topic, p))),
            high_water=high_water,
            quiet_s=self.QUIET_S,
            max_hold_s=self.MAX_HOLD_S,
            start_offset=lambda p: decode_position(sessions.get(position_key(topic, p))) or 0,
            confirm=True,
        )

    @property
    def held(self) -> int:
        return self.sequencer.held

    def add(self, generation: int, event: EventT) -> list[tuple[int, EventT]]:
        if generation != self.generation:
            self.sequencer.clear()
            if self.on_clear is not None:  # what time_of kept of the records held (OpenedOnce)
                self.on_clear()
            self.generation = generation
        msg = event.message
        self.sequencer.push(msg.partition, msg.offset, self.time_of(msg), (generation, event), time.monotonic())
        return self.ready()

    async def confirm_quiet(self) -> None:
        """Ask the broker the end offsets of the partitions about to be passed over as quiet
        (``Sequencer.unconfirmed``); on any error they stay unconfirmed, so waited for."""
        parts = self.sequencer.unconfirmed(time.monotonic())
        if not parts:
            return
        asked_at = time.monotonic()
        try:
            ends = await self.app.consumer.highwaters(*(TP(self.topic, p) for p in parts))
        except Exception as exc:  # noqa: BLE001 - the broker away: asked again at the next tick
            log.debug("sequencer: end offsets of %s not known: %r", parts, exc)
            return
        for tp, end in ends.items():
            if end is not None:
                self.sequencer.confirmed(tp.partition, int(end), asked_at)

    def ready(self) -> list[tuple[int, EventT]]:
        forced = self.sequencer.forced
        out = list(self.sequencer.ready(time.monotonic()))
        if self.sequencer.forced > forced:  # the one timing-dependent decision: said, so a run that took it shows it
            self.counters.sequencer_forced += self.sequencer.forced - forced
            log.warning(
                "sequencer: %d trace record(s) handed on after waiting %.0f s for a partition that stalled "
                "(%d so far): this run's order of derived records may differ from another's",
                self.sequencer.forced - forced,
                self.MAX_HOLD_S,
                self.sequencer.forced,
            )
        return out


async def run_batched(
    app: faust.App,
    settings: Settings,
    stream: faust.Stream,
    handle: Any,
    batchers: list[Batcher] | None = None,
    ordered: Ordered | None = None,
    on_failure: Callable[[BaseException], object] | None = None,
) -> None:
    """An agent body: events in batches (``Batcher``), acked only after ``handle`` returned; with
    ``ordered``, in one order across partitions (streams/sequencer.py). ``stream``: the ``faust.Stream``
    an agent body is given (``noack`` is not on the ``StreamT`` interface). ``on_failure`` is told of an
    exception out of a batch, whether the stream's next event or the ticker flushed it."""
    manual = stream.noack()
    batcher = Batcher(app, manual, settings.batch_size, settings.batch_within_s, handle, ordered)
    if batchers is not None:
        batchers.append(batcher)
    ticker = asyncio.ensure_future(batcher.tick())
    if on_failure is not None:  # a batch the ticker flushes fails there, where no one would see it
        report = on_failure

        def ticker_done(task: asyncio.Future[None]) -> None:
            exc = None if task.cancelled() else task.exception()
            if exc is not None:
                report(exc)

        ticker.add_done_callback(ticker_done)
    try:
        async for event in manual.events():
            await batcher.add(event)
    except Exception as exc:
        if on_failure is not None:
            on_failure(exc)
        raise
    finally:
        ticker.cancel()


EXIT_AGENT_FAILED = 70  # EX_SOFTWARE


def exit_worker(exc: BaseException) -> None:
    """An agent's batch raised past the poison boundary (a broker's error, or a defect). Faust would
    restart the agent without delivering the batch's records again, a stall with no other sign, so the
    worker exits: the supervisor starts it again and it reads on from the committed offsets, where the
    positions make a batch applied twice count once (``somnus.streams.ordering``)."""
    log.critical("a batch failed; the worker exits so that its records are read again", exc_info=exc)
    logging.shutdown()
    os._exit(EXIT_AGENT_FAILED)


METADATA_MAX_AGE_MS = 10_000  # how often the worker's consumer refreshes its metadata at least


def broker_credentials(options: dict[str, Any]) -> Any:
    """Faust's ``broker_credentials`` for ``somnus.config.kafka_options`` (None: PLAINTEXT); Faust hands
    them to every consumer, producer and admin client it makes (``credentials_to_aiokafka_auth``)."""
    if not options:
        return None
    if "sasl_mechanism" in options:
        return faust.SASLCredentials(
            username=options["sasl_plain_username"],
            password=options["sasl_plain_password"],
            ssl_context=options.get("ssl_context"),
            mechanism=options["sasl_mechanism"],
        )
    return faust.SSLCredentials(options["ssl_context"])


def create_app(settings: Settings, bootstrap: str, worker_name: str = "worker") -> faust.App:
    """The worker's Faust app with the distiller's agents wired (``Distiller``)."""
    return Distiller.create(settings, bootstrap, worker_name).app


def _faust_app(settings: Settings, bootstrap: str, worker_name: str) -> faust.App:
    datadir = Path(settings.home) / "faust" / worker_name
    datadir.mkdir(parents=True, exist_ok=True)
    return SomnusApp(
        settings.app_id,
        broker=f"kafka://{bootstrap}",
        store="memory://",
        datadir=str(datadir),
        key_serializer="raw",
        value_serializer="raw",
        topic_partitions=settings.partitions,
        topic_replication_factor=settings.replication_factor,
        topic_allow_declare=True,
        stream_wait_empty=False,
        processing_guarantee="at_least_once",
        consumer_auto_offset_reset="earliest",
        producer_acks=-1,
        producer_linger_ms=5,
        producer_max_batch_size=1 << 20,
        producer_max_request_size=8 << 20,
        broker_commit_every=5000,
        broker_commit_interval=1.0,
        web_enabled=False,
        broker_session_timeout=settings.session_timeout_s,
        broker_heartbeat_interval=min(3.0, settings.session_timeout_s / 4),
        stream_buffer_maxsize=16384,
        broker_max_poll_records=1000,
        consumer_max_fetch_size=16 << 20,
        # A group's assignment is computed from the leader's metadata. Just after a broker restart that
        # metadata can lack the topics (seen: "Ignoring missing topic" 50 ms after the broker was back,
        # and an empty assignment); aiokafka rejoins when a later refresh shows them, which Faust's
        # default of 5 minutes made a 5-minute outage (tests/integration/test_recovery.py hides a topic).
        consumer_metadata_max_age_ms=METADATA_MAX_AGE_MS,
        broker_credentials=broker_credentials(kafka_options(settings)),  # a secured cluster: KAFKA_SECURITY_*
    )


def _check_position(value: bytes) -> None:
    offset, clock = decode_position(value), decode_clock(value)
    if offset is None or offset < 0 or (clock is not None and clock < 0):
        raise ValueError(f"not a position: {value[:80]!r}")


def state_check(decode: Callable[[bytes], object]) -> Callable[[Any, Any], None]:
    """A table's ``validate``: a key is bytes, and its value a position (``somnus.streams.ordering``) or
    a state ``decode`` reads."""

    def check(key: Any, value: Any) -> None:
        if not isinstance(key, bytes) or not isinstance(value, bytes):
            raise TypeError(f"a key and a value must be bytes, not {type(key).__name__} and {type(value).__name__}")
        if key.startswith(POSITION_PREFIX):
            _check_position(value)
            return
        key.decode()  # session keys and signatures are text
        decode(value)

    return check


def _table(app: faust.App, settings: Settings, name: str, help: str) -> BatchedTable:
    table = BatchedTable(
        app,
        name=name,
        partitions=settings.partitions,
        key_type=bytes,
        value_type=bytes,
        beacon=app.tables.beacon,
        help=help,
    )
    app.tables.add(table)  # returns the table it was given, typed as any collection
    return table


def _topic(app: faust.App, settings: Settings, name: str) -> Any:
    return app.topic(name, partitions=settings.partitions, key_type=bytes, value_type=bytes, internal=False)


@dataclass
class DeadLetterSender:
    """The one way the worker dead-letters: a record, or one event of it (``index``), to the dead-letter
    topic with where it came from and why; its value is the rejected event's bytes, or the record's
    (at most ``MAX_ORIGINAL`` of them)."""

    app: Any
    topic: str
    counters: WorkerCounters
    keys: KeyFollower | None = None  # a sealed record's dead letter stays sealed (somnus.streams.sealing)

    async def queue(self, msg: Any, rejection: Rejection, index: int = 0) -> Any:
        """Queue the dead letter; returns the send future (the caller waits for it before acking)."""
        self.counters.dead_letters += 1
        ring = self.keys.ring if self.keys is not None else KeyFollower("", "").ring
        value, headers = dead_letter_value(
            ring,
            msg.value,
            rejection.original,
            dead_letter_headers(rejection, msg.topic, msg.partition, msg.offset, index),
        )
        return await self.app.producer.send(
            self.topic, key=msg.key, value=value, partition=None, timestamp=None, headers=headers
        )

    async def send(self, msg: Any, rejection: Rejection) -> None:
        """Dead-letter a whole record now (acknowledged by the broker on return)."""
        await (await self.queue(msg, rejection))


class Distiller:
    """The distiller's Faust wiring: the agents over traces, observations (and episodes, with the LLM
    extractor), the tables they keep their state in, their ordering guards and the dead-letter sender.

    ``Distiller.create`` makes the worker's app and wires it; a test builds one around fakes (an app
    with a producer, tables with ``get`` and ``write``) and calls the batch handlers directly.
    """

    def __init__(
        self,
        app: Any,
        settings: Settings,
        sessions: Any,
        counters: WorkerCounters | None = None,
        *,
        links: Any = None,
        working: Any = None,
        extractor: Any = None,
        not_episodic: frozenset[str] = frozenset(),
        wm_settings: Any = None,
        alpha_by_agent: dict[str, float] | None = None,
        sessions_guard: OffsetGuard | None = None,
        links_guard: OffsetGuard | None = None,
        markers: MarkerRetention | None = None,
        idle: IdleSessions | None = None,
        keys: KeyFollower | None = None,
    ) -> None:
        self.app, self.settings = app, settings
        self.sessions, self.links, self.working = sessions, links, working
        self.counters = counters or WorkerCounters()
        self.extractor, self.not_episodic, self.wm_settings = extractor, not_episodic, wm_settings
        self.alpha_by_agent = alpha_by_agent or {}
        self.sessions_guard, self.links_guard = sessions_guard, links_guard
        self.markers, self.idle = markers, idle
        # the data keys: open sealed records, seal outputs (somnus.streams.sealing); none: an offline ring
        self.keys = keys if keys is not None else KeyFollower("", "")
        app.somnus_keys = self.keys  # _plan_batch reads it
        self.dead = DeadLetterSender(app, settings.dead_letter_topic, self.counters, self.keys)
        self.batchers: list[Batcher] = []
        self.opened = OpenedOnce()  # trace records opened by the sequencer, for their batch
        # the traces and observations agents both drain the tables' unreadable values: one at a time
        self.unreadable_lock = asyncio.Lock()
        self.on_failure: Callable[[BaseException], object] = exit_worker  # a batch raised past its boundary

    @classmethod
    def create(cls, settings: Settings, bootstrap: str, worker_name: str = "worker") -> Distiller:
        """The worker's Faust app, its topics and tables, and the distiller's agents on it."""

        track_topics_sent_to()  # before Faust's producer sends anything (see its docstring)
        bound_decompression(settings.max_batch_bytes)  # a compression bomb is a dead letter, not an OOM kill
        app = _faust_app(settings, bootstrap, worker_name)
        sessions = _table(app, settings, "sessions", "per-session distiller state (msgspec JSON)")
        links = _table(app, settings, "links", "NAc causal link state per event signature (msgspec JSON)")
        working = _table(app, settings, "working_memory", "per-session working memory: recent messages and summaries")
        keys = KeyFollower(bootstrap, settings.keys_topic, settings)  # opens traces, seals outputs (streams/sealing.py)
        sessions.sealing = working.sealing = TableSealing(keys)
        sessions.validate, working.validate = state_check(decode_state), state_check(decode_wm)
        links.validate = state_check(decode_link_state)
        fleet = load_agents(settings.agents_dir)
        idle_us = int(settings.session_idle_s * 1_000_000)
        distiller = cls(
            app,
            settings,
            sessions,
            WorkerCounters(),
            links=links,
            working=working,
            extractor=make_extractor(settings),
            not_episodic=frozenset(n for n, s in fleet.items() if not s.episodic),
            wm_settings=WorkingMemorySettings(
                max_tokens=settings.working_memory_max_tokens, model_context_tokens=settings.model_context_tokens
            ),
            alpha_by_agent=alphas_for(fleet),
            sessions_guard=make_guard(app, bootstrap, sessions),
            links_guard=make_guard(app, bootstrap, links),
            markers=MarkerRetention(int(settings.session_retention_s * 1_000_000)),
            idle=IdleSessions(idle_us) if idle_us > 0 else None,
            keys=keys,
        )
        distiller.wire(worker_name)
        return distiller

    @property
    def guards(self) -> dict[str, OffsetGuard]:
        """The ordering guard of each guarded source topic (``somnus.streams.ordering``)."""
        found = {self.settings.traces_topic: self.sessions_guard, self.settings.observations_topic: self.links_guard}
        return {topic: guard for topic, guard in found.items() if guard is not None}

    @property
    def inline_extractor(self) -> Any:
        """The extractor the distiller runs on the episodes it makes, in its own batch (None: the LLM one).

        The deterministic extractor is a pure function of each episode: its facts are sent with the
        episodes, before the batch is acked. Consuming the episodes topic back through a second Faust
        stream cost about a third of the worker's throughput (Faust's per-record cost). The LLM
        extractor waits on the network, so it gets its own agent over the episodes topic."""
        return None if self.settings.llm_extractor else self.extractor

    def wire(self, worker_name: str) -> None:
        """Register the agents, the watchdogs and the rebalance hook on the app."""
        app, settings = self.app, self.settings
        app.somnus_counters = self.counters
        watched = {settings.traces_topic, settings.observations_topic} | (
            {settings.episodes_topic} if settings.llm_extractor else set()
        )
        watchdog = PartitionWatchdog(app, watched, idle=lambda: all(b.idle for b in self.batchers))
        guards = self.guards
        # Commits never pass what the state has applied (see somnus.streams.ordering).
        app.somnus_commit_cap = lambda tp: guards[tp.topic].position(tp) if tp.topic in guards else None
        self.assignment_file = Path(settings.home) / "run" / f"{worker_name}.assignment.json"
        self.worker_name = worker_name
        app.on_rebalance_complete.connect(self.record_assignment)

        @app.early_task
        async def keep_partitions_flowing() -> None:
            """Diagnostics on SIGUSR1/SIGUSR2, and the watchdogs that rewind a stalled partition and a
            stalled table recovery (from the start: the first recovery can stall too)."""
            install_diagnostics(app)
            await watch([watchdog, RecoveryWatchdog(app)])

        self.agent(settings.traces_topic, "distill_sessions", self.handle_traces, self.ordered())
        self.agent(settings.observations_topic, "learn_links", self.handle_observations)
        if settings.llm_extractor:
            self.agent(settings.episodes_topic, "extract_facts", self.handle_episodes)

    def ordered(self) -> Ordered:
        """The traces in one order across partitions, so that the topics the distiller writes get the same
        order in every run (streams/sequencer.py): by the stream time each record brings its partition to."""
        settings = self.settings
        skew_us = int(settings.max_clock_skew_s * 1_000_000)

        opened = self.opened

        def time_of(msg: Any) -> int | None:
            try:  # the record's stream time only: a record that cannot be read is judged (dead-lettered) later
                value = opened.open(_keys(self.app).ring, msg)  # a sealed record whose key is not here yet: None
                return latest_time(value, record_cap(msg.timestamp, skew_us) if skew_us > 0 else None)
            except Exception:
                return None

        absent: set[str] = set()  # key ids still missing after a read of the key topic to its end

        async def fetch_key(msg: Any) -> None:
            """The record's data key read before its stream time is: a sealed record whose key is not
            held gives no time, and ordered by fetch the run was timing again (scale-out.md)."""
            value, keys = msg.value, _keys(self.app)
            if not keys.ring.missing([value]):
                return
            kid = sealed_key_id(value) if isinstance(value, bytes) else None
            if kid is not None and kid in absent:
                return  # its key was not there at the last read: a forgotten session's record
            await keys.ensure([value])
            if kid is not None and keys.ring.missing([value]):
                if len(absent) >= 100_000:
                    absent.clear()
                absent.add(kid)

        return Ordered(self.app, settings.traces_topic, self.sessions, time_of, self.counters, opened.clear, fetch_key)

    def agent(self, topic: str, name: str, handle: Any, ordered: Ordered | None = None) -> Any:
        """An agent over ``topic`` (one at a time) whose body hands ``handle`` batches (``run_batched``)."""

        async def body(stream: faust.Stream) -> None:
            await run_batched(self.app, self.settings, stream, handle, self.batchers, ordered, self.on_failure)

        body.__name__ = body.__qualname__ = name
        return self.app.agent(_topic(self.app, self.settings, topic), name=f"{__name__}.{name}", concurrency=1)(body)

    async def record_assignment(self, sender: Any, **kwargs: Any) -> None:
        """Re-activate partitions paused for back-pressure; write which trace partitions we own now.

        Faust pauses fetching from a partition whose stream queue is under high pressure and
        resumes it when the queue drains; a rebalance clears the queue without that signal, so
        such a partition would never be fetched again (seen as a worker stalled for good).
        """
        app = self.app
        changelogs = app.tables.changelog_topics
        for tp in app.consumer.assignment():
            if tp.topic not in changelogs:  # an active changelog stays paused once recovered
                app.consumer.on_buffer_drop(tp)
        for guard in self.guards.values():
            guard.forget()
        owned = sorted(tp.partition for tp in app.consumer.assignment() if tp.topic == self.settings.traces_topic)
        self.assignment_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.assignment_file.with_suffix(".tmp")
        tmp.write_text(json.dumps({"worker": self.worker_name, "pid": os.getpid(), "partitions": owned}))
        tmp.replace(self.assignment_file)

    async def handle_traces(self, batch: Sequence[EventT], generation: int) -> list[EventT]:
        """One batch of trace records; returns the records to acknowledge (see ``somnus.streams.ordering``).

        No record stops the distiller: decoding never raises (``somnus.schemas.codec``), and should the rest
        of the batch's work raise, the batch is handled again one record at a time (where a batch ends never
        changes a result: ``tests/processors/sessions/test_batch.py``), so that only the record that raises
        on its own is dead-lettered, as ``poison``, and passed. Errors of the broker are not the records'
        and are raised as before."""
        if self.app.in_recovery:
            self.opened.take(self.keys.ring, (ev.message for ev in batch))
            return []  # the tables are being restored: Faust seeks back to the committed offsets after
        await self.dead_letter_unreadable()
        guard = self.sessions_guard
        admitted = await guard.admit(batch) if guard is not None else Admitted(handle=list(batch))
        records = admitted.handle
        await self.keys.ensure(opened_values(records))  # the data keys of its sealed records (or gone)
        # the plaintexts the sequencer opened, still valid with the keys as they are now (every record
        # of the batch leaves the cache, those not handled too)
        opened = self.opened.take(self.keys.ring, (ev.message for ev in batch))
        try:
            plan = _plan_batch(
                self.app,
                self.settings,
                records,
                self.sessions,
                generation,
                self.inline_extractor,
                self.not_episodic,
                self.working,
                self.wm_settings,
                self.idle,
                opened,
            )
        except Exception as exc:  # noqa: BLE001 - the poison boundary
            if self.idle is not None:
                self.idle.generation = None  # its heap may have lost entries to the failed attempt: rebuilt
            if len(records) > 1:
                return await self._one_by_one(self.handle_traces, admitted, generation)
            if not records:
                raise
            self.counters.poison += 1
            plan = _poison_plan(self.settings, self.sessions, records[0], exc)
        plan.positions = dict(admitted.positions)
        if not await self.send_plan(plan, generation):
            return []
        await self._after_plan(plan, generation)
        return admitted.handle + admitted.done

    async def dead_letter_unreadable(self) -> None:
        """Dead-letter the changelog values the tables restored as absent (``BatchedTable.apply_changelog_batch``)."""
        async with self.unreadable_lock:  # else both agents sent the first value, and one popped an empty list
            for table in (self.sessions, self.links, self.working):
                pending = getattr(table, "unreadable", None)
                while pending:
                    msg, reason = pending[0]
                    await self.dead.send(msg, Rejection(reason + truncated_note(msg.value)))
                    pending.pop(0)  # once on the broker
                    self.counters.poison += 1

    async def _one_by_one(self, handle: Any, admitted: Admitted, generation: int) -> list[EventT]:
        """Each admitted record a batch of its own (its position written before the next); [] after a rebalance."""
        acks = list(admitted.done)
        for record in admitted.handle:
            acks += await handle([record], generation)
            if self.app.consumer_generation_id != generation:
                return []
        return acks

    async def _after_plan(self, plan: BatchPlan, generation: int) -> None:
        """Once the states and positions are on the broker: the open sessions' idle entries, the expired markers."""
        if self.idle is not None:  # open sessions, touched or looked at, by their latest event (again)
            for key, st in {**plan.prior, **plan.states}.items():
                if not st.closed and st.ended_at is not None:
                    self.idle.push(plan.partition_of[key], micros(st.ended_at), key.encode())
        if self.markers is not None and int(self.settings.session_retention_s * 1_000_000) > 0:
            # After the positions: a marker removed is one whose session's records are all below a
            # position already on the broker, so no redelivery can meet its absence.
            closed = {key: st for key, st in plan.states.items() if st.closed}
            await self.markers.prune(
                self.app,
                self.settings.traces_topic,
                self.sessions,
                self.working,
                generation,
                closed,
                plan.clocks,
                self.counters,
            )

    async def send_plan(self, plan: BatchPlan, generation: int) -> bool:
        """Send a batch's outputs, then its states and positions (False: a rebalance came first, nothing of
        the state was written)."""
        pending = [await self.dead.queue(msg, rejection, index) for msg, index, rejection in plan.dead]
        self._count(plan)
        pending += await self._send_outputs(plan)
        # Episodes and dead letters must be on the broker before the state that says "done" is.
        if pending:
            await asyncio.gather(*pending)
        # After a rebalance during this batch, its partitions may belong to another worker, which
        # reprocesses these events from the committed offset: its state must not be overwritten here.
        if self.app.consumer_generation_id != generation:
            for table in (self.sessions, self.working):
                if table is not None:
                    table.pending_changelog.clear()
                    table.key_partitions.clear()
            return False
        await self._write_states(plan)
        return True

    def _count(self, plan: BatchPlan) -> None:
        counters = self.counters
        counters.events += plan.events
        counters.duplicates += plan.duplicates
        counters.late += plan.late
        counters.abandoned += plan.abandoned
        counters.shredded += plan.shredded
        if plan.future:
            counters.future += plan.future
            _warn_future(self.settings, plan.future, next(r.reason for _, _, r in plan.dead if r.kind == "future"))

    async def _send_outputs(self, plan: BatchPlan) -> list[Any]:
        """Queue the batch's episodes, facts, observations and memory units; returns the send futures."""
        app, settings, counters = self.app, self.settings, self.counters
        ring = self.keys.ring
        pending = []
        for ep in plan.episodes:
            counters.episodes += 1
            value, headers = sealed(ring.key_for(ep.agent, ep.session_id), encode(ep))
            pending.append(
                await app.producer.send(
                    settings.episodes_topic,
                    key=ep.session_id.encode(),
                    value=value,
                    partition=None,
                    timestamp=None,
                    headers=headers,
                )
            )
        if plan.facts:
            pending.extend(await self._send_facts(plan.facts, plan.episodes))
        if plan.observations:
            counters.observations += len(plan.observations)
            keys = {ep.episode_id: ring.key_for(ep.agent, ep.session_id) for ep in plan.episodes}
            pending.extend(
                await _send_bundles(
                    app,
                    settings.observations_topic,
                    settings.partitions,
                    plan.observations,
                    lambda o: o.event_signature,
                    lambda o: keys.get(o.episode_id),
                    settings.multipart_records,
                )
            )
        units = plan.units
        if units:
            counters.memory_units += len(units)
            pending.extend(
                [
                    await app.producer.send(
                        settings.memory_topic,
                        key=None,
                        value=value,
                        partition=0,
                        timestamp=None,
                        headers=[("somnus-kind", KIND_UNITS), *(headers or [])],
                    )
                    for value, headers in unit_records(ring, units, BUNDLE_ITEMS)
                ]
            )
        return pending

    async def _write_states(self, plan: BatchPlan) -> None:
        """Working memory first, then the sessions, then the positions: a recovered position is never
        ahead of any state the records below it made. A closed session keeps only its marker (compact):
        the buffer is the in-session tier."""
        partition_of = plan.partition_of
        if self.working is not None and plan.wm_states:
            await self.working.write(
                self.app.producer,
                (
                    (key.encode(), partition_of[key], encode_wm(compact_wm(wm) if wm.closed else wm))
                    for key, wm in plan.wm_states.items()
                ),
            )
        await self.sessions.write(
            self.app.producer,
            ((key.encode(), partition_of[key], raw) for key, raw in plan.encoded.items()),
            plan.positions,
            plan.clocks,
        )

    async def handle_observations(self, batch: Sequence[EventT], generation: int) -> list[EventT]:
        """One batch of observation bundles: learn, send every update, then the new link states and the
        positions; returns the records to acknowledge."""
        if self.app.in_recovery:
            return []
        await self.dead_letter_unreadable()
        guard = self.links_guard
        admitted = await guard.admit(batch) if guard is not None else Admitted(handle=list(batch))
        batch = admitted.handle
        observed: list[OutcomeObserved] = []
        partition_of: dict[str, int] = {}
        keys = self.keys
        await keys.ensure(opened_values(batch))
        key_of_episode: dict[Any, Any] = {}  # the data key of each observation's episode (its record's)
        for event in batch:
            msg = event.message
            # A multi-part record's parts are opened one by one: each part's items carry its key.
            parts: list[tuple[Any, list[OutcomeObserved]]] = []
            rejected: Rejection | None = None
            for part in parts_of(msg.value):
                value = keys.ring.open(part)
                if value is FORGOTTEN:
                    self.counters.shredded += 1
                    continue
                items = (
                    value
                    if isinstance(value, Rejection)
                    else decode_bounded(_observations_decoder, value, self.settings.max_json_depth)  # type: ignore[arg-type]
                )
                if isinstance(items, Rejection):
                    rejected = items
                    break
                parts.append((key_of_record(keys.ring, part), items))
            if rejected is not None:  # our own output, or not: it must not stop the stream (the record whole)
                await self.dead.send(msg, _named(rejected, "observations", msg.value))
                continue
            for record_key, items in parts:
                for item in items:
                    partition_of[item.event_signature] = msg.partition
                    key_of_episode[item.episode_id] = record_key
                observed.extend(items)
        try:
            states, updates = _learn(self.links, partition_of, observed, self.alpha_by_agent)
        except Exception as exc:  # noqa: BLE001 - the poison boundary: one record at a time, then the one that raises
            if len(batch) > 1:
                return await self._one_by_one(self.handle_observations, admitted, generation)
            if not batch:
                raise
            self.counters.poison += 1
            msg = batch[0].message
            await self.dead.send(
                msg, Rejection(poison_reason(exc, "while learning causal links") + truncated_note(msg.value))
            )
            states, updates = {}, []
        return await self._send_links(admitted, states, updates, partition_of, generation, key_of_episode)

    async def _send_links(
        self,
        admitted: Admitted,
        states: dict[str, bytes],
        updates: list[Any],
        partition_of: Mapping[str, int],
        generation: int,
        key_of_episode: Mapping[Any, Any] | None = None,
    ) -> list[EventT]:
        """Send the updates (each sealed with its episode's key), then the links' states and positions;
        returns the records to acknowledge."""
        self.counters.link_updates += len(updates)
        key_of = key_of_episode or {}
        pending = await _send_bundles(
            self.app,
            self.settings.link_updates_topic,
            self.settings.partitions,
            updates,
            lambda u: u.event_signature,
            lambda u: key_of.get(u.episode_id),
            self.settings.multipart_records,
        )
        if pending:
            await asyncio.gather(*pending)
        if self.app.consumer_generation_id != generation:
            self.links.pending_changelog.clear()
            self.links.key_partitions.clear()
            return []
        await self.links.write(
            self.app.producer,
            ((sig.encode(), partition_of[sig], raw) for sig, raw in states.items()),
            admitted.positions,
        )
        return admitted.handle + admitted.done

    async def handle_episodes(self, batch: Sequence[EventT], generation: int) -> None:
        """Episodes -> facts (the LLM extractor's agent): one FactsExtracted per episode on the
        single-partition facts topic. Stateless: every record is acknowledged."""
        episodes = []
        await self.keys.ensure(opened_values(batch))
        for event in batch:
            msg = event.message
            value = self.keys.ring.open(msg.value)
            if value is FORGOTTEN:
                self.counters.shredded += 1
                continue
            ep = (
                value
                if isinstance(value, Rejection)
                else decode_bounded(_episode_decoder, value, self.settings.max_json_depth)  # type: ignore[arg-type]
            )
            if isinstance(ep, Rejection):  # our own output; a bad one is a bug, but it must not stop the stream
                await self.dead.send(msg, _named(ep, "episode", msg.value))
                continue
            episodes.append(ep)
        out = self.extractor.extract(episodes)
        if inspect.isawaitable(out):
            out = await out
        pending = await self._send_facts(out, episodes)
        if pending:
            await asyncio.gather(*pending)

    async def _send_facts(self, extracted: Sequence[Any], episodes: Sequence[Any] = ()) -> list[Any]:
        """Queue each episode's FactsExtracted on the one-partition facts topic (sealed with the key of the
        episode's session); returns the send futures."""
        self.counters.facts += sum(len(f.facts) for f in extracted)
        ring = self.keys.ring
        keys = {ep.episode_id: ring.key_for(ep.agent, ep.session_id) for ep in episodes}
        return [
            await self.app.producer.send(
                self.settings.facts_topic,
                key=str(f.episode_id).encode(),
                value=value,
                partition=0,
                timestamp=None,
                headers=headers,
            )
            for f in extracted
            for value, headers in [sealed(keys.get(f.episode_id), encode(f))]
        ]


_CLOCK_WARNED = [float("-inf")]  # when the last warning about clocks ahead was logged (monotonic s)


def _warn_future(settings: Settings, n: int, example: str) -> None:
    """A warning (at most one a minute) naming a runtime whose events are stamped ahead of their records."""
    now = time.monotonic()
    if now - _CLOCK_WARNED[0] < 60.0:
        return
    _CLOCK_WARNED[0] = now
    log.warning(
        "%d event(s) stamped more than %g s ahead of their records' broker time were dead-lettered "
        "(kind future; check the runtime's clock and time zone, SOMNUS_MAX_CLOCK_SKEW_S), e.g. %s",
        n,
        settings.max_clock_skew_s,
        example,
    )


@dataclass
class BatchPlan:
    """What one batch of trace records does, decided before anything is sent (``_plan_batch``)."""

    positions: dict[Any, int] = field(default_factory=dict)  # the guard's new positions
    clocks: dict[int, int] = field(default_factory=dict)  # stream time of every partition of the batch
    dead: list[tuple[Any, int, Rejection]] = field(default_factory=list)  # (record, index, why), in order
    episodes: list[Any] = field(default_factory=list)
    facts: list[Any] = field(default_factory=list)
    observations: list[Any] = field(default_factory=list)
    units: list[Any] = field(default_factory=list)
    states: dict[str, SessionState] = field(default_factory=dict)
    encoded: dict[str, bytes] = field(default_factory=dict)  # each of ``states`` as the table will hold it
    wm_states: dict[str, Any] = field(default_factory=dict)
    prior: dict[str, SessionState] = field(default_factory=dict)
    partition_of: dict[str, int] = field(default_factory=dict)  # session key -> source partition
    events: int = 0
    duplicates: int = 0
    late: int = 0
    future: int = 0
    abandoned: int = 0
    shredded: int = 0  # records whose data key was deleted (forgotten): skipped


def _stored_clocks(sessions: BatchedTable, topic: str, partitions: set[int]) -> dict[int, int]:
    """The stream time stored with each partition's position. Every partition of a batch carries its
    own over the batch, even one whose records decoded to no event: a position written without it
    forgot the partition's stream time, and after a run of undecodable records the late events of
    forgotten sessions were taken for new sessions (75 of 100 reopened)."""
    return {p: c for p in partitions if (c := decode_clock(sessions.get(position_key(topic, p)))) is not None}


def _plan_batch(
    app: faust.App,
    settings: Settings,
    batch: Sequence[EventT],
    sessions: BatchedTable,
    generation: int,
    extractor: Any,
    not_episodic: frozenset[str],
    working: BatchedTable | None,
    wm_settings: Any,
    idle: IdleSessions | None,
    opened: Mapping[int, bytes] | None = None,
) -> BatchPlan:
    """Decode, judge and distill ``batch`` (records admitted by the guard) from the tables' states: every
    output of the batch, nothing sent. It raises only for a record nothing foresaw (``_handle_batch``).
    ``opened``: plaintexts of its records opened already (``OpenedOnce.take``, by ``id`` of the record)."""
    plan = BatchPlan()
    valid = []
    coords: list[tuple[Any, int]] = []  # (record, index in it) of each valid event
    parts: list[int] = []  # source partition of each valid event
    caps: list[
        int | None
    ] = []  # the latest time each valid event may have (somnus.processors.sessions.session_retention)
    skew_us = int(settings.max_clock_skew_s * 1_000_000)
    partition_of = plan.partition_of
    offset_of: dict[str, int] = {}  # session key -> offset of its last record in the batch (its end)
    ring = _keys(app).ring
    opened = opened or {}  # id(record) -> its plaintext, opened already (OpenedOnce)
    for event in batch:
        msg = event.message
        kept = opened.get(id(msg))
        value = kept if kept is not None else ring.open(msg.value)  # its plaintext (somnus.schemas.sealed)
        if value is FORGOTTEN or isinstance(value, Rejection):  # its key deleted by a forget: skipped
            plan.shredded += value is FORGOTTEN
            if isinstance(value, Rejection):
                plan.dead.append((msg, 0, value))
            continue
        items = decode_record(value, settings.max_event_bytes, settings.max_json_depth)  # type: ignore[arg-type]
        rejected = record_rejection(items)
        if rejected is not None:  # one dead letter for the record, whatever number of its elements is bad
            index, why = rejected
            plan.dead.append((msg, index, Rejection(why.reason + truncated_note(msg.value))))
        good = [(index, item) for index, item in enumerate(items) if not isinstance(item, Rejection)]
        if len(good) > 1:  # a record is never split between batches: its own events go in seq order
            good.sort(key=lambda it: it[1].seq)
        cap = record_cap(msg.timestamp, skew_us) if skew_us > 0 else None
        for index, item in good:
            valid.append(item)
            coords.append((msg, index))
            parts.append(msg.partition)
            caps.append(cap)
            key = session_key(item.agent, item.session_id)
            partition_of[key] = msg.partition
            offset_of[key] = msg.offset
    plan.events = len(valid)
    prior = plan.prior
    for key in partition_of:
        raw = sessions.get(key.encode())
        if raw is not None:
            prior[key] = decode_state(raw)
    topic = settings.traces_topic
    clocks = _stored_clocks(sessions, topic, {ev.message.partition for ev in batch})
    retention_us = int(settings.session_retention_s * 1_000_000)
    open_partitions: dict[str, int] | None = None
    if idle is not None:  # the open sessions this batch's stream time can make idle, with their states
        idle.refresh(app, topic, sessions, generation)
        for p, clock in stream_times(valid, parts, clocks, caps).items():
            for idle_key in idle.due(p, clock):
                k = idle_key.decode()
                raw = sessions.get(idle_key) if k not in prior else None
                st = decode_state(raw) if raw is not None else None
                if st is not None and not st.closed and st.partition == p:
                    prior[k], partition_of[k] = st, p
        open_partitions = {k: partition_of[k] for k, st in prior.items() if not st.closed}
    sifted = sift(
        valid, parts, clocks, prior, retention_us, idle.idle_us if idle is not None else 0, open_partitions, caps
    )
    plan.clocks = sifted.clocks
    plan.future = sifted.future
    for rnd in sifted.rounds:
        for k, i in rnd.abandon.items():  # the coordinates of the record that closed it (NAc observations)
            offset_of.setdefault(k, coords[i][0].offset)
            plan.abandoned += 1
    wm_prior: dict[str, Any] = {}
    if working is not None:
        for key in partition_of:
            raw = working.get(key.encode())
            if raw is not None:
                wm_prior[key] = decode_wm(raw)
    out = distill_rounds(
        prior, wm_prior if working is not None else None, sifted, partition_of, not_episodic, wm_settings
    )
    plan.duplicates = sifted.duplicates + out.duplicates
    late = list(sifted.late)
    if (
        out.late_events
    ):  # after an end the distiller met, or out of order (somnus.processors.sessions.distiller.seq_verdict)
        where = {id(ev): i for i, ev in enumerate(valid)}
        late += [(where[id(ev)], reason) for ev, reason in out.late_events]
    plan.late = len(late)
    for i, reason in sorted(late):
        msg, index = coords[i]
        plan.dead.append((msg, index, Rejection(reason, encode(valid[i]))))
    plan.episodes = out.episodes
    if extractor is not None and out.episodes:
        plan.facts = list(extractor.extract(out.episodes))
    # What each call led to, for the NAc; the coordinates of the session's end make a re-distilled
    # episode's observations recognisable as redeliveries (somnus.processors.prediction.causal_links.learn).
    plan.observations = [
        o
        for ep in out.episodes
        for o in observations_from_episode(
            ep, partition_of[session_key(ep.agent, ep.session_id)], offset_of[session_key(ep.agent, ep.session_id)]
        )
    ]
    plan.units, plan.states, plan.wm_states = out.units, out.states, out.wm_states
    # encoded here, inside the boundary: a state that cannot be encoded is its record's poison
    plan.encoded = {key: encode_state(state) for key, state in plan.states.items()}
    return plan


def _poison_plan(settings: Settings, sessions: BatchedTable, record: EventT, exc: Exception) -> BatchPlan:
    """A record whose distillation raised: one dead letter (kind ``poison``, the exception), its position
    passed, its partition's stream time kept; nothing else."""
    msg = record.message
    log.error(
        "record %s/%d@%d could not be distilled and is dead-lettered as poison: %r",
        msg.topic,
        msg.partition,
        msg.offset,
        exc,
    )
    reason = poison_reason(exc, "while distilling the record") + truncated_note(msg.value)
    return BatchPlan(
        clocks=_stored_clocks(sessions, settings.traces_topic, {msg.partition}), dead=[(msg, 0, Rejection(reason))]
    )


def _owned(app: faust.App, topic: str) -> frozenset[int]:
    """The partitions of ``topic`` this worker is assigned."""
    return frozenset(tp.partition for tp in app.consumer.assignment() if tp.topic == topic)


def _session_states(sessions: BatchedTable, closed: bool) -> Any:
    """``(key, state)`` of the table's closed sessions' markers, or of its open sessions (not the
    partitions' positions, whose values are not JSON)."""
    for key, raw in list(sessions.data.items()):
        if raw is not None and raw.startswith(b"{") and (b'"closed":true' in raw) == closed:
            yield key, decode_state(raw)


class MarkerRetention:
    """Removes the markers of closed sessions once they expire (``somnus.processors.sessions.session_retention``).

    It keeps the owned partitions' markers in a heap by expiry, rebuilt from the table after every
    rebalance (Faust restores the table, not this heap)."""

    def __init__(self, retention_us: int) -> None:
        self.retention_us = retention_us
        self.heap = MarkerHeap()
        self.generation: int | None = None
        self.owned: frozenset[int] = frozenset()

    async def prune(
        self,
        app: faust.App,
        topic: str,
        sessions: BatchedTable,
        working: BatchedTable | None,
        generation: int,
        closed: Mapping[str, SessionState],
        clocks: Mapping[int, int],
        counters: WorkerCounters,
    ) -> int:
        owned = _owned(app, topic)
        touched = set(clocks)
        if generation != self.generation or owned != self.owned:
            # holds this batch's markers already: they are in the table
            self.heap = MarkerHeap.of(_session_states(sessions, closed=True), set(owned))
            self.generation, self.owned = generation, owned
            touched = set(owned)
        else:
            for key, st in closed.items():
                if st.partition is not None and st.closed_clock is not None:
                    self.heap.push(st.partition, st.closed_clock, key.encode())
        due: list[tuple[bytes, int]] = []
        for p in touched & owned:
            clock = clocks.get(p, decode_clock(sessions.get(position_key(topic, p))))
            for closed_clock, due_key in self.heap.due(p, clock, self.retention_us):
                raw = sessions.get(due_key)
                due_st = decode_state(raw) if raw is not None else None
                if due_st is not None and due_st.closed and due_st.closed_clock == closed_clock:
                    due.append((due_key, p))  # else: the key is a newer session now (its own entry is pushed)
        if not due:
            return 0
        if working is not None:  # first: a marker outlives its working memory, so a crash leaves it due
            await working.delete(app.producer, due)
        removed = await sessions.delete(app.producer, due)
        counters.forgotten += removed
        return removed


class IdleSessions:
    """The owned partitions' open sessions by the time of their latest event, so that a batch whose
    stream time makes one idle (``somnus.processors.sessions.session_retention.sift``) has its state at hand. Rebuilt from the
    table after every rebalance (Faust restores the table, not this); an entry that is not a session's
    latest any more is skipped by ``sift``."""

    def __init__(self, idle_us: int) -> None:
        self.idle_us = idle_us
        self.heap = MarkerHeap()
        self.generation: int | None = None
        self.owned: frozenset[int] = frozenset()

    def refresh(self, app: faust.App, topic: str, sessions: BatchedTable, generation: int) -> None:
        owned = _owned(app, topic)
        if generation == self.generation and owned == self.owned:
            return
        heap = MarkerHeap()
        for key, st in _session_states(sessions, closed=False):
            if st.partition in owned and st.ended_at is not None:
                heap.push(st.partition, micros(st.ended_at), key)
        self.heap, self.generation, self.owned = heap, generation, owned

    def due(self, partition: int, clock: int) -> list[bytes]:
        """Pop the sessions of ``partition`` whose entry is idle at stream time ``clock``."""
        return [key for _, key in self.heap.due(partition, clock, self.idle_us)]

    def push(self, partition: int, latest: int, key: bytes) -> None:
        self.heap.push(partition, latest, key)


BUNDLE_ITEMS = 1000  # items per bundle record: well under the producer's request size
PARTS_BYTES = 512 << 10  # of the arrays joined in one multi-part record (a lone larger array: its own)


async def _send_bundles(
    app: faust.App,
    topic: str,
    partitions: int,
    items: Sequence[Any],
    signature_of: Any,
    key_of: Any = lambda item: None,
    joined: bool = False,
) -> list[Any]:
    """Send ``items`` as JSON arrays grouped by the partition of their signature, each session's sealed
    with its data key (``key_of``); returns the send futures. Faust's cost is per record, so a batch's
    items of one session and partition travel together; with ``joined`` (``multipart_records``) the
    arrays of several sessions of a partition share a multi-part record (``join_parts``), order kept."""
    groups: dict[int, dict[Any, list[Any]]] = {}
    for item in items:
        groups.setdefault(signature_partition(signature_of(item), partitions), {}).setdefault(key_of(item), []).append(
            item
        )
    pending = []
    for partition in sorted(groups):
        arrays = [sealed(key, raw) for key, group in groups[partition].items() for raw in bundles(group, BUNDLE_ITEMS)]
        for value, headers in _pack_parts(arrays) if joined else arrays:
            pending.append(
                await app.producer.send(
                    topic, key=None, value=value, partition=partition, timestamp=None, headers=headers
                )
            )
    return pending


def _pack_parts(arrays: list[tuple[bytes, Any]]) -> list[tuple[bytes, Any]]:
    """Consecutive ``(value, headers)`` arrays as records: runs of at most ``PARTS_BYTES`` joined into one
    multi-part record (no headers: its parts name their keys), a lone array as it is."""
    out: list[tuple[bytes, Any]] = []
    run: list[tuple[bytes, Any]] = []
    size = 0

    def flush() -> None:
        if len(run) == 1:
            out.append(run[0])
        elif run:
            out.append((join_parts([v for v, _ in run]), None))

    for value, headers in arrays:
        if run and (size + len(value) > PARTS_BYTES or len(run) >= MAX_PARTS):
            flush()
            run, size = [], 0
        run.append((value, headers))
        size += len(value)
    flush()
    return out


def _keys(app: Any) -> KeyFollower:
    """The worker's data keys (``somnus.streams.keys``); an app made without them has an empty ring."""
    keys = getattr(app, "somnus_keys", None)
    if keys is None:
        keys = app.somnus_keys = KeyFollower("", "")  # offline: follows nothing
    return keys


_observations_decoder = msgspec.json.Decoder(list[OutcomeObserved])
_episode_decoder = msgspec.json.Decoder(EpisodeDistilled)


def _learn(
    links: BatchedTable,
    partition_of: Mapping[str, int],
    observed: list[OutcomeObserved],
    alpha_by_agent: dict[str, float],
) -> tuple[dict[str, bytes], list[Any]]:
    """Rescorla-Wagner over ``observed`` from the links' states in the table (``somnus.processors.prediction.causal_links.learn``):
    the new states, encoded as the table will hold them, and the updates."""
    prior = {}
    for sig in partition_of:
        raw = links.get(sig.encode())
        if raw is not None:
            prior[sig] = decode_link_state(raw)
    states, updates = learn(prior, observed, alpha_by_agent=alpha_by_agent, per_link_rows=False)
    return {sig: link_state_value(state) for sig, state in states.items()}, updates  # no session text


def _named(rejection: Rejection, what: str, value: bytes | None) -> Rejection:
    """``rejection`` of a record of one of our own topics, saying which (``schema: invalid episode: ...``)."""
    kind, _, rest = rejection.reason.partition(": ")
    return Rejection(f"{kind}: invalid {what}: {rest}{truncated_note(value)}")


def make_guard(app: faust.App, bootstrap: str, table: BatchedTable) -> OffsetGuard:
    """The ordering guard of an agent whose state (and positions) live in ``table``."""

    async def earliest(tp: Any) -> int:
        found = await app.consumer.earliest_offsets(tp)
        return int(found.get(tp) or 0)

    async def rewind(tp: Any, offset: int) -> None:
        consumer: Any = app.consumer
        # Faust's own "never delivered, count as acked" ranges from here on are wrong
        chop_gaps_from(consumer, tp, offset)
        await consumer.seek_wait({tp: offset})
        if not offset:
            # Faust's seek_wait moves the read offset only to an offset > 0, as if 0 meant "none".
            # Left where it was, the fetch loop drops every re-fetched record below it as already
            # read: a hole at offset 0 was never filled (seen: committed 0, read offset 1206).
            clear_read_offset(consumer, tp)

    return OffsetGuard(
        position=lambda tp: decode_position(table.get(position_key(tp.topic, tp.partition))),
        earliest=earliest,
        rewind=rewind,
        first_record_at=lambda tp, offset: first_record_at(bootstrap, tp, offset),
        clock=time.monotonic,
    )


async def first_record_at(bootstrap: str, tp: Any, offset: int) -> int | None:
    """The offset of the first record at or after ``offset`` in ``tp`` (None when none comes within 3 s)."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, auto_offset_reset="earliest", **kafka_options()
    )
    await consumer.start()
    try:
        part = TopicPartition(tp.topic, tp.partition)
        consumer.assign([part])
        consumer.seek(part, offset)
        got = await consumer.getmany(part, timeout_ms=3000, max_records=1)
        records = got.get(part) or []
        return records[0].offset if records else None
    finally:
        await consumer.stop()


def make_extractor(settings: Settings) -> Any:
    """The deterministic trace extractor; the LLM one only when a key is configured."""
    trace = TraceExtractor()
    if not settings.llm_extractor:
        return trace

    config = LLMExtractorConfig.from_env(os.environ)
    if not config.enabled:
        raise ValueError("SOMNUS_LLM_EXTRACTOR is on but no API key is set (SOMNUS_LLM_API_KEY or ANTHROPIC_API_KEY)")
    return AnthropicExtractor(config, fallback=trace)


def dead_letter_headers(
    rejection: Rejection, topic: str, partition: int, offset: int, index: int
) -> list[tuple[str, bytes]]:
    """Where a dead letter came from and why; the value is the original bytes of the rejected event."""
    return [
        ("somnus-reason", rejection.reason.encode()[:4000]),
        ("somnus-source-topic", topic.encode()),
        ("somnus-source-partition", str(partition).encode()),
        ("somnus-source-offset", str(offset).encode()),
        ("somnus-source-index", str(index).encode()),
    ]
