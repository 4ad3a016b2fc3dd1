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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import faust
from faust.tables.table import Table
from faust.types import EventT
import msgspec

from somnus.processors.sessions.distiller import SessionState, decode_state, distill, encode_state, session_key
from somnus.processors.sessions.batch import distill_rounds
from somnus.processors.sessions.session_retention import MarkerHeap, micros, record_cap, sift, stream_times
from somnus.processors.working.session_buffer import WorkingMemorySettings
from somnus.processors.working.session_buffer import compact as compact_wm
from somnus.processors.working.session_buffer import decode_state as decode_wm
from somnus.processors.working.session_buffer import encode_state as encode_wm
from somnus.processors.prediction.causal_links import decode_link_state, encode_link_state, learn, observations_from_episode
from somnus.schemas.memory import KIND_UNITS
from somnus.schemas.causal import OutcomeObserved
from somnus.schemas.episodes import EpisodeDistilled
from somnus.schemas.codec import (Rejection, dead_letter_original, decode_bounded, decode_record, encode, poison_reason,
                          record_rejection, truncated_note)
from somnus.schemas.sealed import FORGOTTEN
from somnus.streams.kafka_compat import track_topics_sent_to
from somnus.streams.keys import KeyFollower
from somnus.streams.sealing import (TableSealing, dead_letter_value, key_of_record, opened_values, sealed,
                                    unit_records)
from somnus.config import Settings, kafka_options
from somnus.streams.liveness import PartitionWatchdog, RecoveryWatchdog, SomnusApp, install_diagnostics, watch
from somnus.streams.metrics import WorkerCounters
from somnus.streams.ordering import (Admitted, OffsetGuard, decode_clock, decode_position, position_key,
                              positions_writer)
from somnus.streams.topics import signature_partition

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

    def _to_value(self, v: Any) -> Any:  # a value restored from the changelog, opened
        return self.sealing.open(v) if self.sealing is not None else v

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

    async def write(self, producer: Any, items: Any, positions: Mapping[Any, int] | None = None,
                    clocks: Mapping[int, int] | None = None) -> None:
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
        futures = [await producer.send(topic, key=key, value=value, partition=partition, timestamp=None,
                                       headers=headers)
                   for partition, key, raw in self.pending_changelog for value, headers in [seal(key, raw)]]
        self.pending_changelog.clear()
        self.key_partitions.clear()
        if futures:
            await asyncio.gather(*futures)


class Batcher:
    """Batches of at most ``max_events`` events, flushed at the latest ``within_s`` after the first.

    This does what ``stream.take_events(n, within=...)`` does, without its buffering processor.
    With faust-streaming 0.15.3, after a rebalance, a task dump once showed that processor blocked,
    waiting for a "buffer consumed" signal while the buffer was empty; the stream stopped with it.
    Replacing it did not remove every post-rebalance stall (see the failover test), so that
    processor was not the whole cause. Events are acked only after their batch was handled, one
    batch at a time.

    Every event is tagged with the consumer generation it arrived in. Events of an older
    generation (a rebalance happened since) are neither handled nor acked: after a rebalance Faust
    seeks every partition back to its committed offset, so they come again, to whichever worker
    owns them now; acking them here would corrupt Faust's offset bookkeeping for the new owner.

    ``handle`` returns the events to acknowledge, or None for all of them: a guarded agent
    (``somnus.streams.ordering``) acknowledges neither a hole nor what follows it.
    """

    def __init__(self, app: faust.App, stream: faust.StreamT, max_events: int, within_s: float,
                 handle: Any) -> None:
        self.app, self.stream = app, stream
        self.max_events, self.within_s, self.handle = max_events, within_s, handle
        self.events: list[tuple[int, EventT]] = []
        self.first_at = 0.0
        self.lock = asyncio.Lock()
        self.dropped_stale = 0

    @property
    def idle(self) -> bool:
        """Nothing buffered and no batch being handled."""
        return not self.events and not self.lock.locked()

    async def add(self, event: EventT) -> None:
        if not self.events:
            self.first_at = asyncio.get_running_loop().time()
        self.events.append((self.app.consumer_generation_id, event))
        if len(self.events) >= self.max_events:
            await self.flush()

    async def tick(self) -> None:
        while True:
            await asyncio.sleep(self.within_s / 2)
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
            for event in (batch if acks is None else acks):
                await self.stream.ack(event)


async def run_batched(app: faust.App, settings: Settings, stream: faust.StreamT, handle: Any,
                      batchers: list[Batcher] | None = None) -> None:
    """An agent body: events in batches (``Batcher``), acked only after ``handle`` returned."""
    manual = stream.noack()
    batcher = Batcher(app, manual, settings.batch_size, settings.batch_within_s, handle)
    if batchers is not None:
        batchers.append(batcher)
    ticker = asyncio.ensure_future(batcher.tick())
    try:
        async for event in manual.events():
            await batcher.add(event)
    finally:
        ticker.cancel()


METADATA_MAX_AGE_MS = 10_000  # how often the worker's consumer refreshes its metadata at least


def broker_credentials(options: dict[str, Any]) -> Any:
    """Faust's ``broker_credentials`` for ``somnus.config.kafka_options`` (None: PLAINTEXT); Faust hands
    them to every consumer, producer and admin client it makes (``credentials_to_aiokafka_auth``)."""
    if not options:
        return None
    if "sasl_mechanism" in options:
        return faust.SASLCredentials(username=options["sasl_plain_username"], password=options["sasl_plain_password"],
                                     ssl_context=options.get("ssl_context"), mechanism=options["sasl_mechanism"])
    return faust.SSLCredentials(options["ssl_context"])


def create_app(settings: Settings, bootstrap: str, worker_name: str = "worker") -> faust.App:
    track_topics_sent_to()  # before Faust's producer sends anything (see its docstring)
    datadir = Path(settings.home) / "faust" / worker_name
    datadir.mkdir(parents=True, exist_ok=True)
    app = SomnusApp(
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
    traces = app.topic(settings.traces_topic, partitions=settings.partitions, key_type=bytes, value_type=bytes,
                       internal=False)
    sessions = app.tables.add(BatchedTable(
        app, name="sessions", partitions=settings.partitions, key_type=bytes, value_type=bytes,
        beacon=app.tables.beacon, help="per-session distiller state (msgspec JSON)"))
    links = app.tables.add(BatchedTable(
        app, name="links", partitions=settings.partitions, key_type=bytes, value_type=bytes,
        beacon=app.tables.beacon, help="NAc causal link state per event signature (msgspec JSON)"))
    working = app.tables.add(BatchedTable(
        app, name="working_memory", partitions=settings.partitions, key_type=bytes, value_type=bytes,
        beacon=app.tables.beacon, help="per-session working memory: recent messages and summaries"))
    keys = KeyFollower(bootstrap, settings.keys_topic, settings)  # opens traces, seals outputs (streams/sealing.py)
    app.somnus_keys = keys  # type: ignore[attr-defined]
    sessions.sealing = working.sealing = TableSealing(keys)
    observations = app.topic(settings.observations_topic, partitions=settings.partitions, key_type=bytes,
                             value_type=bytes, internal=False)
    from somnus.agents import load_agents
    from somnus.processors.prediction.causal_links import alphas_for

    fleet = load_agents(settings.agents_dir)
    alpha_by_agent = alphas_for(fleet)
    not_episodic = frozenset(name for name, spec in fleet.items() if not spec.episodic)
    wm_settings = WorkingMemorySettings(max_tokens=settings.working_memory_max_tokens,
                                        model_context_tokens=settings.model_context_tokens)
    counters = WorkerCounters()
    app.somnus_counters = counters  # type: ignore[attr-defined]
    batchers: list[Batcher] = []
    watched = ({settings.traces_topic, settings.observations_topic}
               | ({settings.episodes_topic} if settings.llm_extractor else set()))
    watchdog = PartitionWatchdog(app, watched, idle=lambda: all(b.idle for b in batchers))
    sessions_guard = make_guard(app, bootstrap, sessions)
    links_guard = make_guard(app, bootstrap, links)
    guards = {settings.traces_topic: sessions_guard, settings.observations_topic: links_guard}
    # Commits never pass what the state has applied (see somnus.streams.ordering).
    app.somnus_commit_cap = lambda tp: (  # type: ignore[attr-defined]
        guards[tp.topic].position(tp) if tp.topic in guards else None)

    assignment_file = Path(settings.home) / "run" / f"{worker_name}.assignment.json"

    @app.on_rebalance_complete.connect
    async def record_assignment(sender: Any, **kwargs: Any) -> None:
        """Re-activate partitions paused for back-pressure; write which trace partitions we own now.

        Faust pauses fetching from a partition whose stream queue is under high pressure and
        resumes it when the queue drains; a rebalance clears the queue without that signal, so
        such a partition would never be fetched again (seen as a worker stalled for good).
        """
        changelogs = app.tables.changelog_topics
        for tp in app.consumer.assignment():
            if tp.topic not in changelogs:  # an active changelog stays paused once recovered
                app.consumer.on_buffer_drop(tp)
        for guard in guards.values():
            guard.forget()
        owned = sorted(tp.partition for tp in app.consumer.assignment() if tp.topic == settings.traces_topic)
        assignment_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = assignment_file.with_suffix(".tmp")
        tmp.write_text(json.dumps({"worker": worker_name, "pid": os.getpid(), "partitions": owned}))
        tmp.replace(assignment_file)

    extractor = make_extractor(settings)
    # The deterministic extractor is a pure function of each episode: it runs in the distiller's
    # batch, on the episodes just made, and its facts are sent with them (before the batch is acked).
    # Consuming the episodes topic back through a second Faust stream cost about a third of the
    # worker's throughput (Faust's per-record cost). The LLM extractor waits on the network, so it
    # gets its own agent over the episodes topic and never holds up the distiller.
    inline_extractor = None if settings.llm_extractor else extractor
    if settings.llm_extractor:
        episodes = app.topic(settings.episodes_topic, partitions=settings.partitions, key_type=bytes,
                             value_type=bytes, internal=False)

        @app.agent(episodes, concurrency=1)
        async def extract_facts(stream: faust.StreamT) -> None:
            """Episodes -> facts: one FactsExtracted per episode on the single-partition facts topic."""
            async def handle(batch: Sequence[EventT], generation: int) -> None:
                await _handle_episodes(app, settings, batch, extractor, counters)  # stateless: ack all

            await run_batched(app, settings, stream, handle, batchers)

    @app.early_task
    async def keep_partitions_flowing() -> None:
        """Diagnostics on SIGUSR1/SIGUSR2, and the watchdogs that rewind a stalled partition and a
        stalled table recovery (from the start: the first recovery can stall too)."""
        install_diagnostics(app)
        await watch([watchdog, RecoveryWatchdog(app)])

    markers = MarkerRetention(int(settings.session_retention_s * 1_000_000))
    idle = IdleSessions(int(settings.session_idle_s * 1_000_000)) if settings.session_idle_s > 0 else None

    @app.agent(traces, concurrency=1)
    async def distill_sessions(stream: faust.StreamT) -> None:
        async def handle(batch: Sequence[EventT], generation: int) -> list[EventT]:
            return await _handle_batch(app, settings, batch, sessions, counters, generation, inline_extractor,
                                       not_episodic, working, wm_settings, sessions_guard, markers, idle)

        await run_batched(app, settings, stream, handle, batchers)

    @app.agent(observations, concurrency=1)
    async def learn_links(stream: faust.StreamT) -> None:
        """Call outcomes -> Rescorla-Wagner updates of the causal links (state: the links table)."""
        async def handle(batch: Sequence[EventT], generation: int) -> list[EventT]:
            return await _handle_observations(app, settings, batch, links, counters, generation, alpha_by_agent,
                                              links_guard)

        await run_batched(app, settings, stream, handle, batchers)

    return app


_CLOCK_WARNED = [float("-inf")]  # when the last warning about clocks ahead was logged (monotonic s)


def _warn_future(settings: Settings, n: int, example: str) -> None:
    """A warning (at most one a minute) naming a runtime whose events are stamped ahead of their records."""
    now = time.monotonic()
    if now - _CLOCK_WARNED[0] < 60.0:
        return
    _CLOCK_WARNED[0] = now
    log.warning("%d event(s) stamped more than %g s ahead of their records' broker time were dead-lettered "
                "(kind future; check the runtime's clock and time zone, SOMNUS_MAX_CLOCK_SKEW_S), e.g. %s",
                n, settings.max_clock_skew_s, example)


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


def _plan_batch(app: faust.App, settings: Settings, batch: Sequence[EventT], sessions: BatchedTable,
                generation: int, extractor: Any, not_episodic: frozenset[str], working: BatchedTable | None,
                wm_settings: Any, idle: IdleSessions | None) -> BatchPlan:
    """Decode, judge and distill ``batch`` (records admitted by the guard) from the tables' states: every
    output of the batch, nothing sent. It raises only for a record nothing foresaw (``_handle_batch``)."""
    plan = BatchPlan()
    valid = []
    coords: list[tuple[Any, int]] = []  # (record, index in it) of each valid event
    parts: list[int] = []  # source partition of each valid event
    caps: list[int | None] = []  # the latest time each valid event may have (somnus.processors.sessions.session_retention)
    skew_us = int(settings.max_clock_skew_s * 1_000_000)
    partition_of = plan.partition_of
    offset_of: dict[str, int] = {}  # session key -> offset of its last record in the batch (its end)
    ring = _keys(app).ring
    for event in batch:
        msg = event.message
        value = ring.open(msg.value)  # a sealed record's plaintext (somnus.schemas.sealed)
        if value is FORGOTTEN or isinstance(value, Rejection):  # its key deleted by a forget: skipped
            plan.shredded += value is FORGOTTEN
            if isinstance(value, Rejection):
                plan.dead.append((msg, 0, value))
            continue
        items = decode_record(value, settings.max_event_bytes, settings.max_json_depth)
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
            for key in idle.due(p, clock):
                k = key.decode()
                raw = sessions.get(key) if k not in prior else None
                st = decode_state(raw) if raw is not None else None
                if st is not None and not st.closed and st.partition == p:
                    prior[k], partition_of[k] = st, p
        open_partitions = {k: partition_of[k] for k, st in prior.items() if not st.closed}
    sifted = sift(valid, parts, clocks, prior, retention_us, idle.idle_us if idle is not None else 0,
                  open_partitions, caps)
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
    out = distill_rounds(prior, wm_prior if working is not None else None, sifted, partition_of, not_episodic,
                         wm_settings)
    plan.duplicates = sifted.duplicates + out.duplicates
    late = list(sifted.late)
    if out.late_events:  # after an end the distiller met, or out of order (somnus.processors.sessions.distiller.seq_verdict)
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
    plan.observations = [o for ep in out.episodes for o in observations_from_episode(
        ep, partition_of[session_key(ep.agent, ep.session_id)], offset_of[session_key(ep.agent, ep.session_id)])]
    plan.units, plan.states, plan.wm_states = out.units, out.states, out.wm_states
    # encoded here, inside the boundary: a state that cannot be encoded is its record's poison
    plan.encoded = {key: encode_state(state) for key, state in plan.states.items()}
    return plan


def _poison_plan(settings: Settings, sessions: BatchedTable, record: EventT, exc: Exception) -> BatchPlan:
    """A record whose distillation raised: one dead letter (kind ``poison``, the exception), its position
    passed, its partition's stream time kept; nothing else."""
    msg = record.message
    log.error("record %s/%d@%d could not be distilled and is dead-lettered as poison: %r", msg.topic, msg.partition,
              msg.offset, exc)
    reason = poison_reason(exc, "while distilling the record") + truncated_note(msg.value)
    return BatchPlan(clocks=_stored_clocks(sessions, settings.traces_topic, {msg.partition}),
                     dead=[(msg, 0, Rejection(reason))])


async def _handle_batch(app: faust.App, settings: Settings, batch: Sequence[EventT], sessions: BatchedTable,
                        counters: WorkerCounters, generation: int, extractor: Any = None,
                        not_episodic: frozenset[str] = frozenset(), working: BatchedTable | None = None,
                        wm_settings: Any = None, guard: OffsetGuard | None = None,
                        markers: MarkerRetention | None = None, idle: IdleSessions | None = None) -> list[EventT]:
    """One batch of trace records; returns the records to acknowledge (see ``somnus.streams.ordering``).

    No record stops the distiller: decoding never raises (``somnus.schemas.codec``), and should the rest of
    the batch's work raise, the batch is handled again one record at a time (where a batch ends never
    changes a result: ``tests/processors/sessions/test_batch.py``), so that only the record that raises on its
    own is dead-lettered, as ``poison``, and passed. Errors of the broker are not the records' and are
    raised as before."""
    if app.in_recovery:
        return []  # the tables are being restored: Faust seeks back to the committed offsets after
    admitted = await guard.admit(batch) if guard is not None else Admitted(handle=list(batch))
    records = admitted.handle
    await _keys(app).ensure(opened_values(records))  # the data keys of its sealed records (or gone)
    try:
        plan = _plan_batch(app, settings, records, sessions, generation, extractor, not_episodic, working,
                           wm_settings, idle)
    except Exception as exc:  # noqa: BLE001 - the poison boundary
        if idle is not None:
            idle.generation = None  # its heap may have lost entries to the failed attempt: rebuilt from the table
        if len(records) > 1:
            acks = list(admitted.done)
            for record in records:  # one by one, each a batch of its own: its position is written before the next
                done = await _handle_batch(app, settings, [record], sessions, counters, generation, extractor,
                                           not_episodic, working, wm_settings, guard, markers, idle)
                if app.consumer_generation_id != generation:
                    return []
                acks += done
            return acks
        if not records:
            raise
        counters.poison += 1
        plan = _poison_plan(settings, sessions, records[0], exc)
    plan.positions = dict(admitted.positions)
    if not await _send_plan(app, settings, plan, sessions, working, counters, generation):
        return []
    if idle is not None:  # open sessions, touched or looked at, by their latest event (again)
        for key, st in {**plan.prior, **plan.states}.items():
            if not st.closed and st.ended_at is not None:
                idle.push(plan.partition_of[key], micros(st.ended_at), key.encode())
    retention_us = int(settings.session_retention_s * 1_000_000)
    if markers is not None and retention_us > 0:
        # After the positions: a marker removed is one whose session's records are all below a
        # position already on the broker, so no redelivery can meet its absence.
        closed = {key: st for key, st in plan.states.items() if st.closed}
        await markers.prune(app, settings.traces_topic, sessions, working, generation, closed, plan.clocks,
                            counters)
    return admitted.handle + admitted.done


async def _send_plan(app: faust.App, settings: Settings, plan: BatchPlan, sessions: BatchedTable,
                     working: BatchedTable | None, counters: WorkerCounters, generation: int) -> bool:
    """Send a batch's outputs, then its states and positions (False: a rebalance came first, nothing of
    the state was written)."""
    pending: list[Any] = []
    ring = _keys(app).ring
    for msg, index, rejection in plan.dead:
        counters.dead_letters += 1
        value, headers = dead_letter_value(ring, msg.value, rejection.original,
                                           dead_letter_headers(rejection, msg.topic, msg.partition, msg.offset, index))
        pending.append(await app.producer.send(settings.dead_letter_topic, key=msg.key, value=value, partition=None,
                                               timestamp=None, headers=headers))
    counters.shredded += plan.shredded
    counters.events += plan.events
    counters.duplicates += plan.duplicates
    counters.late += plan.late
    counters.abandoned += plan.abandoned
    if plan.future:
        counters.future += plan.future
        _warn_future(settings, plan.future, next(r.reason for _, _, r in plan.dead if r.kind == "future"))
    for ep in plan.episodes:
        counters.episodes += 1
        value, headers = sealed(ring.key_for(ep.agent, ep.session_id), encode(ep))
        pending.append(await app.producer.send(settings.episodes_topic, key=ep.session_id.encode(), value=value,
                                               partition=None, timestamp=None, headers=headers))
    if plan.facts:
        pending.extend(await _send_facts(app, settings, plan.facts, counters, plan.episodes))
    if plan.observations:
        counters.observations += len(plan.observations)
        keys = {ep.episode_id: ring.key_for(ep.agent, ep.session_id) for ep in plan.episodes}
        pending.extend(await _send_bundles(app, settings.observations_topic, settings.partitions, plan.observations,
                                           lambda o: o.event_signature, lambda o: keys.get(o.episode_id)))
    units = plan.units
    if units:
        counters.memory_units += len(units)
        pending.extend([await app.producer.send(
            settings.memory_topic, key=None, value=value, partition=0, timestamp=None,
            headers=[("somnus-kind", KIND_UNITS), *(headers or [])])
            for value, headers in unit_records(ring, units, BUNDLE_ITEMS)])
    # Episodes and dead letters must be on the broker before the state that says "done" is.
    if pending:
        await asyncio.gather(*pending)
    # After a rebalance during this batch, its partitions may belong to another worker, which
    # reprocesses these events from the committed offset: its state must not be overwritten here.
    if app.consumer_generation_id != generation:
        for table in (sessions, working):
            if table is not None:
                table.pending_changelog.clear()
                table.key_partitions.clear()
        return False
    # Working memory first, then the sessions, then the positions: a recovered position is never
    # ahead of any state the records below it made. A closed session keeps only its marker (compact):
    # the buffer is the in-session tier.
    partition_of = plan.partition_of
    if working is not None and plan.wm_states:
        await working.write(app.producer, (
            (key.encode(), partition_of[key], encode_wm(compact_wm(wm) if wm.closed else wm))
            for key, wm in plan.wm_states.items()))
    await sessions.write(app.producer, ((key.encode(), partition_of[key], raw) for key, raw in plan.encoded.items()),
                         plan.positions, plan.clocks)
    return True


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

    async def prune(self, app: faust.App, topic: str, sessions: BatchedTable, working: BatchedTable | None,
                    generation: int, closed: Mapping[str, SessionState], clocks: Mapping[int, int],
                    counters: WorkerCounters) -> int:
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
            for closed_clock, key in self.heap.due(p, clock, self.retention_us):
                raw = sessions.get(key)
                st = decode_state(raw) if raw is not None else None
                if st is not None and st.closed and st.closed_clock == closed_clock:
                    due.append((key, p))  # else: the key is a newer session now (its own entry is pushed)
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


async def _send_bundles(app: faust.App, topic: str, partitions: int, items: Sequence[Any],
                        signature_of: Any, key_of: Any = lambda item: None) -> list[Any]:
    """Send ``items`` as JSON-array records, grouped by the partition of their signature and by their
    session's data key (``key_of``: sealed with it; order kept, at most ``BUNDLE_ITEMS`` a record);
    returns the send futures. Faust's cost is per record, so a batch's outcomes travel together."""
    groups: dict[tuple[int, Any], list[Any]] = {}
    for item in items:
        groups.setdefault((signature_partition(signature_of(item), partitions), key_of(item)), []).append(item)
    return [await app.producer.send(topic, key=None, value=value, partition=partition, timestamp=None, headers=headers)
            for (partition, key), group in sorted(groups.items(), key=lambda g: g[0][0])
            for i in range(0, len(group), BUNDLE_ITEMS)
            for value, headers in [sealed(key, encode(group[i:i + BUNDLE_ITEMS]))]]


_observations_decoder = msgspec.json.Decoder(list[OutcomeObserved])
_episode_decoder = msgspec.json.Decoder(EpisodeDistilled)


async def _handle_observations(app: faust.App, settings: Settings, batch: Sequence[EventT], links: BatchedTable,
                               counters: WorkerCounters, generation: int, alpha_by_agent: dict[str, float],
                               guard: OffsetGuard | None = None) -> list[EventT]:
    """One batch of observation bundles: learn, send every update, then the new link states and the
    positions; returns the records to acknowledge."""
    if app.in_recovery:
        return []
    admitted = await guard.admit(batch) if guard is not None else Admitted(handle=list(batch))
    batch = admitted.handle
    observed: list[OutcomeObserved] = []
    partition_of: dict[str, int] = {}
    keys = _keys(app)
    await keys.ensure(opened_values(batch))
    key_of_episode: dict[Any, Any] = {}  # the data key of each observation's episode (its record's)
    for event in batch:
        msg = event.message
        value = keys.ring.open(msg.value)
        if value is FORGOTTEN:
            counters.shredded += 1
            continue
        items = value if isinstance(value, Rejection) else decode_bounded(_observations_decoder, value,
                                                                            settings.max_json_depth)
        if isinstance(items, Rejection):  # our own output, or not: it must not stop the stream
            await _dead_letter_now(app, settings, counters, msg, _named(items, "observations", msg.value))
            continue
        record_key = key_of_record(keys.ring, msg.value)
        for item in items:
            partition_of[item.event_signature] = msg.partition
            key_of_episode[item.episode_id] = record_key
        observed.extend(items)
    try:
        states, updates = _learn(links, partition_of, observed, alpha_by_agent)
    except Exception as exc:  # noqa: BLE001 - the poison boundary: one record at a time, then the one that raises
        if len(batch) > 1:
            acks = list(admitted.done)
            for record in batch:
                acks += await _handle_observations(app, settings, [record], links, counters, generation,
                                                   alpha_by_agent, guard)
                if app.consumer_generation_id != generation:
                    return []
            return acks
        if not batch:
            raise
        counters.poison += 1
        msg = batch[0].message
        await _dead_letter_now(app, settings, counters, msg, Rejection(
            poison_reason(exc, "while learning causal links") + truncated_note(msg.value)))
        states, updates = {}, []
    counters.link_updates += len(updates)
    pending = await _send_bundles(app, settings.link_updates_topic, settings.partitions, updates,
                                  lambda u: u.event_signature, lambda u: key_of_episode.get(u.episode_id))
    if pending:
        await asyncio.gather(*pending)
    if app.consumer_generation_id != generation:
        links.pending_changelog.clear()
        links.key_partitions.clear()
        return []
    await links.write(app.producer, ((sig.encode(), partition_of[sig], raw) for sig, raw in states.items()),
                      admitted.positions)
    return admitted.handle + admitted.done


def _learn(links: BatchedTable, partition_of: Mapping[str, int], observed: list[OutcomeObserved],
           alpha_by_agent: dict[str, float]) -> tuple[dict[str, bytes], list[Any]]:
    """Rescorla-Wagner over ``observed`` from the links' states in the table (``somnus.processors.prediction.causal_links.learn``):
    the new states, encoded as the table will hold them, and the updates."""
    prior = {}
    for sig in partition_of:
        raw = links.get(sig.encode())
        if raw is not None:
            prior[sig] = decode_link_state(raw)
    states, updates = learn(prior, observed, alpha_by_agent=alpha_by_agent, per_link_rows=False)
    return {sig: encode_link_state(state) for sig, state in states.items()}, updates


def _named(rejection: Rejection, what: str, value: bytes | None) -> Rejection:
    """``rejection`` of a record of one of our own topics, saying which (``schema: invalid episode: ...``)."""
    kind, _, rest = rejection.reason.partition(": ")
    return Rejection(f"{kind}: invalid {what}: {rest}{truncated_note(value)}")


async def _dead_letter_now(app: faust.App, settings: Settings, counters: WorkerCounters, msg: Any,
                           rejection: Rejection) -> None:
    """A whole record to the dead-letter topic (its bytes, at most ``MAX_ORIGINAL`` of them), acknowledged."""
    counters.dead_letters += 1
    await (await app.producer.send(
        settings.dead_letter_topic, key=msg.key, value=dead_letter_original(msg.value), partition=None,
        timestamp=None, headers=dead_letter_headers(rejection, msg.topic, msg.partition, msg.offset, 0)))


def make_guard(app: faust.App, bootstrap: str, table: BatchedTable) -> OffsetGuard:
    """The ordering guard of an agent whose state (and positions) live in ``table``."""
    async def earliest(tp: Any) -> int:
        found = await app.consumer.earliest_offsets(tp)
        return int(found.get(tp) or 0)

    async def rewind(tp: Any, offset: int) -> None:
        consumer: Any = app.consumer
        gap = consumer._gap.get(tp)
        if gap:  # Faust's own "never delivered, count as acked" ranges from here on are wrong
            gap.chop(offset, 1 << 62)
        await consumer.seek_wait({tp: offset})
        if not offset:
            # Faust's seek_wait moves the read offset only to an offset > 0, as if 0 meant "none".
            # Left where it was, the fetch loop drops every re-fetched record below it as already
            # read: a hole at offset 0 was never filled (seen: committed 0, read offset 1206).
            consumer._read_offset[tp] = None

    return OffsetGuard(
        position=lambda tp: decode_position(table.get(position_key(tp.topic, tp.partition))),
        earliest=earliest, rewind=rewind,
        first_record_at=lambda tp, offset: first_record_at(bootstrap, tp, offset),
        clock=time.monotonic)


async def first_record_at(bootstrap: str, tp: Any, offset: int) -> int | None:
    """The offset of the first record at or after ``offset`` in ``tp`` (None when none comes within 3 s)."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                                auto_offset_reset="earliest", **kafka_options())
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
    from somnus.processors.knowledge.extraction import TraceExtractor

    trace = TraceExtractor()
    if not settings.llm_extractor:
        return trace
    from somnus.streams.llm_extractor import AnthropicExtractor, LLMExtractorConfig

    config = LLMExtractorConfig.from_env(os.environ)
    if not config.enabled:
        raise ValueError("SOMNUS_LLM_EXTRACTOR is on but no API key is set "
                         "(SOMNUS_LLM_API_KEY or ANTHROPIC_API_KEY)")
    return AnthropicExtractor(config, fallback=trace)


async def _handle_episodes(app: faust.App, settings: Settings, batch: Sequence[EventT], extractor: Any,
                           counters: WorkerCounters) -> None:
    episodes = []
    await _keys(app).ensure(opened_values(batch))
    for event in batch:
        msg = event.message
        value = _keys(app).ring.open(msg.value)
        if value is FORGOTTEN:
            counters.shredded += 1
            continue
        ep = value if isinstance(value, Rejection) else decode_bounded(_episode_decoder, value, settings.max_json_depth)
        if isinstance(ep, Rejection):  # our own output; a bad one is a bug, but it must not stop the stream
            await _dead_letter_now(app, settings, counters, msg, _named(ep, "episode", msg.value))
            continue
        episodes.append(ep)
    out = extractor.extract(episodes)
    if inspect.isawaitable(out):
        out = await out
    pending = await _send_facts(app, settings, out, counters, episodes)
    if pending:
        await asyncio.gather(*pending)


async def _send_facts(app: faust.App, settings: Settings, extracted: Sequence[Any], counters: WorkerCounters,
                      episodes: Sequence[Any] = ()) -> list[Any]:
    """Queue each episode's FactsExtracted on the one-partition facts topic (sealed with the key of the
    episode's session); returns the send futures."""
    counters.facts += sum(len(f.facts) for f in extracted)
    ring = _keys(app).ring
    keys = {ep.episode_id: ring.key_for(ep.agent, ep.session_id) for ep in episodes}
    return [await app.producer.send(settings.facts_topic, key=str(f.episode_id).encode(), value=value,
                                    partition=0, timestamp=None, headers=headers)
            for f in extracted for value, headers in [sealed(keys.get(f.episode_id), encode(f))]]


def _keys(app: faust.App) -> KeyFollower:
    """The worker's data keys (``somnus.streams.keys``); an app made without them has an empty ring."""
    keys = getattr(app, "somnus_keys", None)
    if keys is None:
        keys = app.somnus_keys = KeyFollower("", "")  # type: ignore[attr-defined]  # offline: follows nothing
    return keys


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
