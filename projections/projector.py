"""The projector: the only process that writes the DuckDB file.

It assigns itself every partition of the projected topics, seeks each to the offset stored in the
database, and applies what it consumes in batches (rows + offsets in one transaction). Because
DuckDB lets no other process open the file while it is held, live reads (``somnus sql``,
``checksum``, ``status``) are served by this process over HTTP on 127.0.0.1; the port is written
to ``<db>.projector.json``. Every route needs a bearer token (``projections/auth.py``, SECURITY.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import duckdb
from aiohttp import web
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from somnus.projections import api, auth, positions, schema
from somnus.projections.endpoint import endpoint_file
from somnus.projections.forget import scrub
from somnus.projections.http import make_app
from somnus.projections.http import serve as serve_bounded
from somnus.projections.metrics import CONTENT_TYPE, ProjectorMetrics, ScrapeCollector, exposition, supervisor_restarts
from somnus.projections.briefings import BRIEFING_INTERVAL_S, REFRESH_BUDGET_S
from somnus.projections.sql_sandbox import SqlSandbox, harden, one_row
from somnus.schemas.codec import encode
from somnus.schemas.memory import KIND_ACCESS
from somnus.projections.writer import BatchResult, ReadModels, Topics, apply_guarded, load_offsets
from somnus.schemas.briefing import KIND_SERVED
from somnus.streams.connection import LARGE_RECORDS
from somnus.streams import kafka_compat
from somnus.streams.kafka_compat import bound_decompression, track_topics_sent_to
from somnus.config import SUPERVISOR_STATE_FILE, Settings
from somnus.streams.connection import kafka_options
from somnus.streams.keys import KeyFollower
from somnus.streams.topics import partitions_of
from somnus.broker import BrokerError, await_broker, bootstrap_for
import sys
from somnus.procs import private_files, tune_gc
from somnus.schemas.agents import load_agents
import msgspec
from somnus.projections.queries import unrequested_runs
from somnus.projections.semantic import promotion_inputs, sealed_request
from somnus.schemas.semantic import KIND_PROMOTE, sealed_topics_of
from somnus.projections.briefing_server import BriefingServer

SCRUB_RETRY_S = 2.0  # while idle, how often a forget's pending scrub is tried again
# A sleep's promotion request waits until the whole pipeline has caught up (its snapshot as of the
# sleep's time is then complete: docs/design/scale-out.md, cause 3), asked at most this often, and
# at most PROMOTION_MAX_WAIT_S: under a load that never lets it catch up it goes then, said and counted.
PROMOTION_CHECK_S = 0.5
PROMOTION_MAX_WAIT_S = float(os.environ.get("SOMNUS_PROMOTION_MAX_WAIT_S", "120"))
log = logging.getLogger("somnus.projector")
# A batch or a briefing refresh longer than this is logged, with where its time went.
SLOW_S = float(os.environ.get("SOMNUS_SLOW_BATCH_S", "1.0"))
LOCK_WAIT_S = 60.0  # how long a starting projector waits for readers to let go of the file


async def connect_when_free(path: Path, timeout_s: float = LOCK_WAIT_S) -> duckdb.DuckDBPyConnection:
    """Open ``path`` read-write, waiting while another process holds it.

    Until the projector publishes its endpoint, reads (``somnus status``, ``sql``...) open the file
    read-only themselves, and DuckDB refuses a writer while any reader holds it: a projector
    restarted while someone polled its status died on the lock (seen in the SIGKILL test). Such
    a hold lasts one query; a writer that keeps the file is still an error after ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    warned = False
    while True:
        try:
            return duckdb.connect(str(path))
        except duckdb.IOException as exc:
            if "lock" not in str(exc).lower() or time.monotonic() >= deadline:
                raise
            if not warned:
                log.warning("%s is held by another process; waiting up to %.0f s: %s", path, timeout_s, exc)
                warned = True
            await asyncio.sleep(0.1)


async def open_projections(
    path: Path, timeout_s: float = LOCK_WAIT_S, memory_limit: str | None = None
) -> duckdb.DuckDBPyConnection:
    """The projector's database, read-write (``connect_when_free``), held to ``memory_limit`` (when given:
    ``Settings.db_memory_limit``), its tables made, and closed to files, the network and extensions,
    locked (``sql_sandbox.harden``): the same database runs analysts' SQL, so a query the sandbox's
    parser check let through still reads no file (issue #25)."""
    con = await connect_when_free(path, timeout_s)
    if memory_limit is not None:  # before harden locks the configuration
        con.execute("SET memory_limit = ?", [memory_limit])
    schema.init(con)
    harden(con)
    return con


class Drain:
    """Takes records off the consumer while a batch is being applied, so it keeps fetching.

    aiokafka fetches a partition again only once its held records were taken: taken only between
    batches, a record waited a batch or two. This task takes records as they arrive, up to ``limit``
    held (back-pressure), and the projector takes them all at the start of each batch (``take``), in
    their partitions' order. The story: docs/design/kafka-workarounds.md, "The projector's consumer
    drained during batches"."""

    def __init__(self, consumer: AIOKafkaConsumer, limit: int) -> None:
        self.consumer, self.limit = consumer, limit
        self.records: list[Any] = []
        self._arrived = asyncio.Event()
        self._room = asyncio.Event()
        self._room.set()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):  # a failure was raised by take
                await self._task

    async def _run(self) -> None:
        while True:
            await self._room.wait()
            batch = await self.consumer.getmany(timeout_ms=200, max_records=self.limit - len(self.records))
            for rs in batch.values():
                self.records.extend(rs)
            if self.records:
                self._arrived.set()
            if len(self.records) >= self.limit:
                self._room.clear()

    async def take(self, timeout_s: float) -> list[Any]:
        """What arrived since the last call, waiting up to ``timeout_s`` when nothing did; a failure
        of the consumer is raised here."""
        if not self.records:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._arrived.wait(), timeout_s)
        if self._task is not None and self._task.done():
            self._task.result()  # raises what stopped it
            raise RuntimeError("the consumer's drain stopped")
        out, self.records = self.records, []
        self._arrived.clear()
        self._room.set()
        return out


class Projector:
    def __init__(
        self,
        settings: Settings,
        bootstrap: str,
        db_path: Path | None = None,
        serve: bool = True,
        max_records: int = 20000,
    ) -> None:
        self.settings = settings
        self.bootstrap = bootstrap
        self.db_path = Path(db_path) if db_path else settings.db
        self.topics = Topics(
            settings.traces_topic,
            settings.episodes_topic,
            settings.dead_letter_topic,
            settings.facts_topic,
            settings.link_updates_topic,
            settings.memory_topic,
            settings.working_memory_topic,
            settings.semantic_topic,
        )
        self.serve = serve
        self.max_records = max_records
        self.totals = BatchResult()
        self.stage_s: dict[str, float] = {}  # seconds per apply_batch stage (BatchResult.timings), summed

        self.agents = load_agents(settings.agents_dir)
        self._stop = asyncio.Event()
        self._producer: AIOKafkaProducer | None = None
        self._ring: Any = None  # the key ring (somnus.schemas.sealed.KeyRing) once the key topic is followed
        self._kafka_positions: positions.KafkaPositions | None = None  # somnus status (projections/positions.py)
        self.write_lock = asyncio.Lock()
        self._briefing_server: Any = None  # somnus.projections.briefing_server.BriefingServer while serving
        self.metrics = ProjectorMetrics()  # GET /metrics (projections/metrics.py): fed by the loop below
        self._positions: tuple[Any, dict[tuple[str, int], int]] | None = None  # (consumer, stored) for the lag
        self._promotions: list[tuple[str, Any]] = []  # sleep runs (run_id, at) whose request waits (cause 3)
        self._promotions_since = 0.0  # when the oldest of them began to wait (monotonic)
        self._promotions_checked = 0.0

    def stop(self) -> None:
        self._stop.set()

    async def run(self, until_end: bool = False, on_progress: Callable[[int, int], None] | None = None) -> BatchResult:
        """Project until stopped; with ``until_end``, stop once the end offsets seen at start are reached."""
        track_topics_sent_to()  # its producer sends to several topics (somnus.streams.kafka_compat)
        bound_decompression(self.settings.max_batch_bytes)  # a compression bomb is a dead letter (rebuilds too)
        self.db_path.parent.mkdir(parents=True, exist_ok=True)
        con = await open_projections(self.db_path, memory_limit=self.settings.db_memory_limit)
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap,
            enable_auto_commit=False,
            group_id=None,
            auto_offset_reset="earliest",
            fetch_max_bytes=64 << 20,
            max_partition_fetch_bytes=16 << 20,
            fetch_max_wait_ms=100,
            **kafka_options(self.settings),
        )
        await consumer.start()
        runner = None
        drain: Drain | None = None
        keys: KeyFollower | None = None
        try:
            tps = await self._partitions(consumer)
            consumer.assign(tps)
            stored = load_offsets(con)
            from somnus.processors.prediction.oscillators import OscillatorConfig
            from somnus.processors.sleep.config import SleepConfig
            from somnus.processors.sleep.schedule import validate_schedule

            models = ReadModels(
                con,
                self.agents,
                SleepConfig(
                    schedule=validate_schedule(self.settings.sleep_schedule),
                    max_clock_skew_s=self.settings.max_clock_skew_s,
                    fact_retire_days=self.settings.fact_retire_days,
                ),
                OscillatorConfig(enabled=True) if self.settings.oscillators else None,
            )
            keys = await KeyFollower(self.bootstrap, self.settings.keys_topic, self.settings).start()
            models.keys = keys.ring  # sealed records open with the keys that remain (somnus.streams.keys)
            self._ring = keys.ring  # and promotion requests' topics are sealed with them
            for tp in tps:
                consumer.seek(tp, stored.get((tp.topic, tp.partition), 0))
            drain = Drain(consumer, self.max_records)
            drain.start()
            self._positions = (consumer, stored)
            if self.serve:
                runner = await self._start_server(con, models, stored)
                # A crash between a batch's commit and its promotion requests lost them: request again
                # what no request has reached (the semantic fold runs each id once).
                missing = unrequested_runs(con)
                if missing:
                    self._wait_to_promote(missing)
            end = await consumer.end_offsets(tps) if until_end else {}
            total = sum(end.values()) - sum(stored.get((tp.topic, tp.partition), 0) for tp in tps) if until_end else 0
            done = 0
            last_briefings = 0.0
            last_scrub = 0.0
            first = {self.topics.episodes, self.topics.facts, self.topics.semantic}  # briefings' inputs
            # Writes run in a thread so the HTTP server stays responsive during a batch; reads that
            # touch the folds' in-memory state take the same lock (see _start_server).
            lock = self.write_lock
            while not self._stop.is_set():
                if until_end and all(stored.get((tp.topic, tp.partition), 0) >= end[tp] for tp in tps):
                    async with lock:
                        await asyncio.to_thread(models.briefings.refresh, con)
                    if self._promotions:  # a rebuild that serves: its end is where it caught up
                        await self._promote(con, list(self._promotions))
                    break
                records = await drain.take(0.2)
                now = time.monotonic()
                if self._promotions and now - self._promotions_checked >= PROMOTION_CHECK_S:
                    await self._promote_when_caught_up(con, stored, idle=not records, now=now)
                if not records or now - last_briefings >= BRIEFING_INTERVAL_S:
                    async with lock:  # caught up, or busy for a while: render what is stale (a slice)
                        made = await asyncio.to_thread(models.briefings.refresh, con, REFRESH_BUDGET_S)
                    took = time.monotonic() - now
                    self.metrics.briefings_refreshed(took, len(made))
                    if took > SLOW_S:
                        log.warning("slow briefing refresh: %.2f s, %d changed", took, len(made))
                    last_briefings = now
                if not records:
                    if models.forget.pending and now - last_scrub >= SCRUB_RETRY_S:
                        # a forget's scrub found the file busy: try again while nothing else is written
                        last_scrub = now
                        async with lock:
                            models.forget.pending = not await asyncio.to_thread(scrub, con)
                    continue
                # Briefings' inputs first (episodes and lessons, facts, semantic memory), in a
                # transaction of their own, then their briefings, then the rest of the batch: an
                # agent's news does not wait for the folds it does not need. Each part commits its
                # rows with its own topics' offsets, so a crash between them loses and repeats nothing.
                parts = [[r for r in records if r.topic in first], [r for r in records if r.topic not in first]]
                for part in parts:
                    if not part:
                        continue
                    t_batch = time.monotonic()
                    # the keys of its sealed records (and of a promotion request's sealed topics), or gone
                    await keys.ensure(
                        [
                            *(r.value for r in part),
                            *(v for r in part if r.topic == self.topics.semantic for v in sealed_topics_of(r.value)),
                        ]
                    )
                    async with lock:
                        res = await asyncio.to_thread(
                            apply_guarded,
                            con,
                            self.topics,
                            part,
                            stored,
                            self.settings.max_event_bytes,
                            models,
                            self.settings.max_json_depth,
                            self.settings.max_clock_skew_s,
                        )
                        if models.briefings.urgent:  # an agent's own news: its briefing now, not in 0.5 s
                            await asyncio.to_thread(models.briefings.refresh, con, REFRESH_BUDGET_S, True)
                    took = time.monotonic() - t_batch
                    self.metrics.batch_applied(res, took)
                    if took > SLOW_S:
                        log.warning(
                            "slow batch: %.2f s for %d records (%s)",
                            took,
                            len(part),
                            ", ".join(f"{k} {v:.2f}" for k, v in sorted(res.timings.items(), key=lambda kv: -kv[1])),
                        )
                    stored.update(res.offsets)
                    for stage, took_s in res.timings.items():  # where the time went, since start
                        self.stage_s[stage] = self.stage_s.get(stage, 0.0) + took_s
                    self._add(res)
                    if res.scheduled_sleeps:
                        self._wait_to_promote(res.scheduled_sleeps)
                done += len(records)
                if on_progress:
                    on_progress(done, total)
            return self.totals
        finally:
            if drain is not None:
                await drain.stop()
            if keys is not None:
                await keys.stop()
            if self._briefing_server is not None:
                self._briefing_server.stop()
            if runner is not None:
                await runner.cleanup()
                endpoint_file(self.db_path).unlink(missing_ok=True)
            if self._producer is not None:
                await self._producer.stop()
            if self._kafka_positions is not None:
                await self._kafka_positions.close()
            await consumer.stop()
            con.close()

    def _wait_to_promote(self, runs: list[tuple[str, Any]]) -> None:
        """Queue the promotion requests of sleep runs just committed (``_promote`` once caught up)."""
        if not self._promotions:
            self._promotions_since = time.monotonic()
        self._promotions.extend(runs)

    async def _promote_when_caught_up(
        self, con: duckdb.DuckDBPyConnection, stored: dict[tuple[str, int], int], idle: bool, now: float
    ) -> None:
        """Send the waiting promotion requests once the pipeline has caught up (asked only while the
        drain is ``idle``), or after PROMOTION_MAX_WAIT_S whatever it has done, said and counted."""
        self._promotions_checked = now
        forced = now - self._promotions_since >= PROMOTION_MAX_WAIT_S
        if not forced and not (idle and await self._caught_up(stored)):
            return
        if forced:
            log.warning(
                "promotion of %d sleep run(s) requested after waiting %.0f s for the pipeline to catch up: "
                "their snapshots may differ from another run's",
                len(self._promotions),
                PROMOTION_MAX_WAIT_S,
            )
            self.metrics.promotions_forced.inc(len(self._promotions))
        await self._promote(con, list(self._promotions))

    async def _caught_up(self, stored: dict[tuple[str, int], int]) -> bool:
        """Every record on every topic projected, and the worker has committed every trace and
        observation it consumed: every link update of what was published so far is folded."""
        if self._kafka_positions is None:
            return False
        try:
            ends, committed = await self._kafka_positions()
        except Exception as exc:  # noqa: BLE001 - the broker away: asked again later
            log.debug("promotion: positions not known: %r", exc)
            return False
        worker = (self.settings.traces_topic, self.settings.observations_topic)
        for topic, parts in ends.items():
            for p, end in parts.items():
                if topic in worker and committed.get(topic, {}).get(p, 0) < end:
                    return False
                if topic != self.settings.observations_topic and stored.get((topic, p), 0) < end:
                    return False
        return True

    async def _promote(self, con: duckdb.DuckDBPyConnection, runs: list[tuple[str, Any]]) -> None:
        """Phase 2 of a deep sleep (scheduled, or requested by ``somnus sleep``): a promotion request on
        the semantic topic for each run, with the topics it abstracted and the causal links and calls
        as of the run's time (``promotion_inputs``' ``as_of``). Its id ``sleep:<run_id>`` makes the
        semantic fold run it once, however often it is published (a rebuild that serves publishes
        again). Without a producer (a replay that does not serve) nothing is published: the requests on
        the topic are the record. A run whose request could not be sent waits for the next try."""
        if self._producer is None:
            self._promotions = []
            return

        from somnus.projections.semantic import run_topics
        from somnus.schemas.semantic import SLEEP_REQUEST_PREFIX

        def snapshot(run_id: str, at: Any) -> Any:
            with contextlib.closing(con.cursor()) as cur:  # closed: an open cursor may hold a transaction
                # Topics are sealed under their source sessions' keys (``sealed_request``).
                return sealed_request(
                    cur,
                    msgspec.structs.replace(
                        promotion_inputs(cur, "global", as_of=at),
                        at=at,
                        request_id=SLEEP_REQUEST_PREFIX + run_id,
                        topics=run_topics(cur, run_id),
                    ),
                    self._ring,
                )

        failed = []
        for run_id, at in runs:  # one request at a time: a bulk import's many runs are not held at once
            async with self.write_lock:
                req = await asyncio.to_thread(snapshot, run_id, at)
            try:
                await self._producer.send_and_wait(
                    self.topics.semantic,
                    encode(req),
                    key=b"global",
                    partition=0,
                    headers=[("somnus-kind", KIND_PROMOTE)],
                )
            except Exception as exc:  # logged, not fatal: tried again with the next ones, or at the next start
                log.error("could not request promotion after sleep run %s: %r", run_id, exc)
                failed.append((run_id, at))
            else:
                log.info("sleep run %s at %s: promotion requested (%d candidate links)", run_id, at, len(req.links))
        self._promotions = [r for r in self._promotions if r not in runs] + failed
        if failed:
            self._promotions_since = time.monotonic()

    def _add(self, res: BatchResult) -> None:
        t = self.totals
        t.events += res.events
        t.episodes += res.episodes
        t.lessons += res.lessons
        t.dead_letters += res.dead_letters
        t.facts += res.facts
        t.link_updates += res.link_updates
        t.memory_events += res.memory_events
        t.skipped_invalid += res.skipped_invalid
        t.duplicate_events += res.duplicate_events
        t.quarantined += res.quarantined
        t.shredded += res.shredded

    async def _partitions(self, consumer: AIOKafkaConsumer) -> list[TopicPartition]:
        tps: list[TopicPartition] = []
        for topic in (
            self.topics.traces,
            self.topics.episodes,
            self.topics.dead_letters,
            self.topics.facts,
            self.topics.link_updates,
            self.topics.memory,
            self.topics.working_memory,
            self.topics.semantic,
        ):
            tps.extend(TopicPartition(topic, p) for p in await partitions_of(consumer, topic))
        return tps

    async def _start_server(
        self, con: duckdb.DuckDBPyConnection, models: ReadModels, stored: dict[tuple[str, int], int] | None = None
    ) -> web.AppRunner:
        # Reads use their own cursor (a second connection to the same database: it sees committed
        # data while a batch is being written on ``con`` in the writer thread).
        service = api.ReadService(
            con.cursor(),
            models.agents,
            briefings=models.briefings.current,
            episodic=models.memory,
            semantic=models.semantic,
            top_facts=models.top_facts,
            keys=models.keys,
            sandbox=SqlSandbox.from_settings(con, self.settings),
        )  # analysts' SQL
        producer = AIOKafkaProducer(
            bootstrap_servers=self.bootstrap,
            acks="all",
            enable_idempotence=True,
            linger_ms=5,
            **LARGE_RECORDS,
            **kafka_options(self.settings),
        )  # promotion requests
        await producer.start()
        self._producer = producer
        pending: set[asyncio.Future[Any]] = set()

        def settled(message: str) -> Callable[[asyncio.Future[Any]], None]:
            """The done callback of a send: dropped from ``pending``; a failure logged with ``message``."""

            def done(fut: asyncio.Future[Any]) -> None:
                pending.discard(fut)
                if fut.exception():
                    log.error(message, fut.exception())

            return done

        served_done = settled("could not record a served briefing: %r")
        accessed_done = settled("could not record memory accesses: %r")

        def served(record: Any) -> None:
            # Fire and forget, but never lost silently: a failed send is logged.
            fut = asyncio.ensure_future(
                producer.send_and_wait(
                    self.topics.facts,
                    encode(record),
                    key=record.agent.encode(),
                    partition=0,
                    headers=[("somnus-kind", KIND_SERVED)],
                )
            )
            pending.add(fut)
            fut.add_done_callback(served_done)

        service.on_served = served
        if stored is not None:  # updated after each batch's commit: the store's version for read caches
            service.extra["store_version"] = lambda: (len(stored), sum(stored.values()))
        # A forget drops every cached user synopsis (rebuilt from the purged memories on the next read).
        models.forget.on_purged.append(lambda: setattr(service, "synopses", api._synopsis_cache()))

        def accessed(events: list[Any]) -> None:
            fut = asyncio.ensure_future(
                producer.send_and_wait(
                    self.topics.memory, encode(events), partition=0, headers=[("somnus-kind", KIND_ACCESS)]
                )
            )
            pending.add(fut)
            fut.add_done_callback(accessed_done)

        service.on_accessed = accessed
        # somnus status: Kafka positions asked on this loop, so the CLI needs no Kafka client of its own
        self._kafka_positions = positions.KafkaPositions(self.settings, self.bootstrap)  # clients kept open
        service.extra["kafka_positions"] = positions.on_loop(
            self.settings, self.bootstrap, asyncio.get_running_loop(), ask=self._kafka_positions
        )

        # Every route needs a token of this home (projections/auth.py); the operator's is made if missing.
        home = Path(self.settings.home)
        auth.ensure_operator_token(home)
        app = make_app(service, api.all_routes(), self.write_lock, tokens=auth.TokenStore(home))
        app.add_routes([web.get("/metrics", self._metrics_route(service.con))])

        self._briefing_server = BriefingServer(served, home)
        briefing_port = await self._briefing_server.start(models.briefings.current.values())
        models.briefings.listeners.append(self._briefing_server.publish)
        runner, port = await serve_bounded(app, "127.0.0.1", 0)
        # Where the operator's token is (not the token): somnus.reads sends it, whatever SOMNUS_HOME says.
        endpoint_file(self.db_path).write_text(
            json.dumps(
                {
                    "pid": os.getpid(),
                    "port": port,
                    "briefing_port": briefing_port,
                    "token_file": str(auth.token_file(home)),
                }
            )
        )
        return runner

    def lag(self) -> dict[str, int]:
        """Records of each projected topic past the stored offsets, by the consumer's last fetched high water."""
        if self._positions is None:
            return {}
        consumer, stored = self._positions
        out: dict[str, int] = {}
        for tp in consumer.assignment():
            high = consumer.highwater(tp)
            if high is not None:
                out[tp.topic] = out.get(tp.topic, 0) + max(0, high - stored.get((tp.topic, tp.partition), 0))
        return out

    def _metrics_route(self, con: duckdb.DuckDBPyConnection) -> Any:
        """``GET /metrics``: Prometheus text format, for an operator token only (lag and counts describe
        the whole store; docs/integrations/metrics.md)."""
        from prometheus_client import CollectorRegistry

        scrape = CollectorRegistry()
        scrape.register(
            ScrapeCollector(
                self.metrics,
                self.lag,
                stale=lambda: one_row(con, "SELECT count(*) FROM briefings_dirty")[0],
                dead_letters=lambda: dict(con.execute("SELECT kind, count(*) FROM dead_letters GROUP BY 1").fetchall()),
                restarts=lambda: supervisor_restarts(self.settings.run_dir / SUPERVISOR_STATE_FILE),
            )
        )

        async def handle(request: web.Request) -> web.Response:
            principal = request.get(auth.PRINCIPAL)
            if principal is None or not principal.operator:
                return web.json_response({"error": "GET /metrics needs an operator token"}, status=403)
            body = exposition(self.metrics.registry) + exposition(scrape)
            return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})

        return handle


def main() -> None:
    """Entry point: ``python -m somnus.projections.projector`` (settings from the environment)."""
    logging.basicConfig(level=logging.WARNING)
    # The writer thread holds the GIL for long stretches of Python (folds); a shorter switch interval
    # lets the HTTP thread answer reads within a millisecond or two meanwhile.

    sys.setswitchinterval(0.001)

    private_files()  # the DuckDB file, its WAL and the endpoint file: 0600
    tune_gc()
    settings = Settings.resolve()
    bootstrap = bootstrap_for(settings, start_if_missing=False)
    try:
        await_broker(bootstrap, settings.broker_wait_s, log)
    except BrokerError as exc:
        sys.exit(f"somnus projector: {exc}")
    kafka_compat.apply(settings.max_batch_bytes)  # before any Kafka client is made (somnus.streams.kafka_compat)
    projector = Projector(settings, bootstrap)
    loop = asyncio.new_event_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, projector.stop)
    loop.run_until_complete(projector.run())


if __name__ == "__main__":
    main()
