"""Keeping every assigned partition flowing after rebalances (faust-streaming 0.15 + aiokafka 0.14).

Four defects of those versions stalled or crashed a worker after a rebalance or a failover; each was
found by dumping a stalled worker's consumer state (SIGUSR2, below). What this module does about them:

1. ``RewindingConsumerThread`` seeks a source partition with nothing committed to its beginning
   (aiokafka's ``seek_to_committed`` skips it, so records Faust had fetched and abandoned were never
   delivered).
2. ``PartitionWatchdog`` rewinds a partition with lag whose read offset has not moved for ``stall_s``
   while the batchers stayed idle (Faust's fetch loop can mark an undelivered message as read, a hole
   that stops commits for good). A rewind to 0 also clears Faust's read offset and hands aiokafka its
   own ``TopicPartition``.
3. ``RewindingConsumerThread`` skips Faust's livelock check for a partition with no position yet
   (aiokafka asserts there, which killed a survivor taking over).
4. ``RecoveryWatchdog`` seeks back an active changelog partition whose restore stalled with its
   records fetched but never handed to recovery.

The watchdog stays quiet while Faust restores tables (``app.in_recovery``). Records lost outright
are the ordering guard's business (``somnus.streams.ordering``); commits are capped at what the
guarded state applied, so such a loss at the end of a partition shows as lag the watchdog rewinds.
Redelivered events are harmless: the folds are idempotent. The defects, how each was seen, and the
tests: docs/design/kafka-workarounds.md.
"""

from __future__ import annotations

import asyncio
import faulthandler
import gc
import logging
import sys
import time
import signal
from collections.abc import Callable
from typing import Any

import faust
from aiokafka import TopicPartition
from faust.types import TP

from somnus.streams.kafka_compat import offsets
from somnus.streams.kafka_compat.consumer import fetch_position

log = logging.getLogger("somnus.liveness")


class PartitionWatchdog:
    """Rewinds an assigned source partition that has lag but has not moved for ``stall_s``.

    ``idle`` says whether the agent has nothing buffered or in flight; ``topics`` are the source
    topics whose partitions are watched. ``rewinds`` counts what it did.
    """

    def __init__(self, app: faust.App, topics: set[str], idle: Callable[[], bool], stall_s: float = 15.0) -> None:
        self.app, self.topics, self.idle, self.stall_s = app, topics, idle, stall_s
        self.rewinds = 0
        self._last: dict[TP, tuple[Any, Any, float]] = {}

    async def check(self) -> None:
        consumer: Any = self.app.consumer
        now = asyncio.get_running_loop().time()
        if (
            self.app.rebalancing
            or getattr(self.app, "in_recovery", False)
            or not consumer.flow_active
            or not self.idle()
        ):
            self._last.clear()  # only a quiet, steady worker can be stalled
            return
        assigned = {tp for tp in consumer.assignment() if tp.topic in self.topics}
        for tp in list(self._last):
            if tp not in assigned:
                del self._last[tp]
        for tp in assigned:
            read, committed = offsets.read_and_committed(consumer, tp)
            highwater = consumer.highwater(tp)
            behind = committed if committed is not None else 0
            if highwater is None or highwater <= behind:
                self._last.pop(tp, None)  # nothing to do on this partition
                continue
            # Lag, an idle agent, and nothing new read: the records are not coming (or were read and
            # never acked: commits then crawl or stop). A healthy idle partition commits its lag away
            # within a commit interval or two.
            prev = self._last.get(tp)
            if prev is None or prev[0] != read:
                self._last[tp] = (read, committed, now)
                continue
            if now - prev[2] >= self.stall_s:
                await self.rewind(tp, behind, read, highwater)
                self._last.pop(tp, None)

    async def rewind(self, tp: TP, offset: int, read: Any, highwater: int) -> None:
        consumer: Any = self.app.consumer
        log.warning(
            "partition %s stalled (committed %s, read offset %s, end %s): rewinding to %s",
            tp,
            offset,
            read,
            highwater,
            offset,
        )
        offsets.forget_acks(consumer, tp)
        if offset > 0:
            await consumer.seek_wait({tp: offset})
        else:
            # aiokafka's seek_to_beginning takes only its own TopicPartition (a Faust TP raised
            # TypeError here, every second, and the partition stayed stalled for good)
            await offsets.seek_to_beginning(consumer, tp)
            offsets.clear_read_offset(consumer, tp)
        self.rewinds += 1


class RecoveryWatchdog:
    """Re-seeks an active changelog partition whose records were fetched but never restored (the
    fourth defect in the module docstring). ``reseeks`` counts what it did."""

    def __init__(self, app: faust.App, stall_s: float = 10.0) -> None:
        self.app, self.stall_s = app, stall_s
        self.reseeks = 0
        self._last: dict[TP, tuple[int, float]] = {}  # tp -> (restored offset, since when)

    async def check(self) -> None:
        app: Any = self.app
        consumer: Any = app.consumer
        now = asyncio.get_running_loop().time()
        recovery: Any = app.tables.recovery
        if (
            not getattr(app, "in_recovery", False)
            or recovery.signal_recovery_start.is_set()
            or not consumer.flow_active
            or app.tables.changelog_queue.qsize()
        ):
            self._last.clear()  # no recovery, another one about to start, or records on their way
            return
        active = set(recovery.active_tps)
        for tp in list(self._last):
            if tp not in active:
                del self._last[tp]
        for tp in active:
            offset, highwater = recovery.active_offsets.get(tp), recovery.active_highwaters.get(tp)
            position = fetch_position(offsets.consumer_thread(consumer), tp)
            if offset is None or highwater is None or offset >= highwater or position is None or position <= offset + 1:
                self._last.pop(tp, None)  # restored, or its next records not fetched yet
                continue
            prev = self._last.get(tp)
            if prev is None or prev[0] != offset:
                self._last[tp] = (offset, now)
                continue
            if now - prev[1] >= self.stall_s:
                await self.reseek(tp, offset, position, highwater)
                self._last.pop(tp, None)

    async def reseek(self, tp: TP, offset: int, position: int, highwater: int) -> None:
        log.warning(
            "recovery of %s stalled (restored up to offset %s of %s, fetched up to %s): seeking back to %s",
            tp,
            offset,
            highwater,
            position - 1,
            max(offset, 0),
        )
        # recovery's own seek (Recovery._seek_offsets): the last restored offset, re-read and skipped;
        # -1 (nothing restored) is 0, where seek_wait also clears Faust's read offset
        await self.app.consumer.seek_wait({tp: max(offset, 0)})
        self.reseeks += 1


async def watch(dogs: list[Any], every_s: float = 1.0) -> None:
    """Run each watchdog's ``check`` every ``every_s``; a failed check is logged and never takes the
    worker down."""
    while True:
        await asyncio.sleep(every_s)
        for dog in dogs:
            try:
                await dog.check()
            except Exception as exc:
                log.warning("%s check failed: %r", type(dog).__name__, exc)


def install_diagnostics(app: faust.App) -> None:
    """SIGUSR1 writes the stack of every asyncio task (the main loop's and the consumer thread's) and of
    every thread to the log; SIGUSR2 the consumer's offsets state, including a commit in progress.

    mode's worker installs its own SIGUSR1 (a stack dump) and SIGUSR2 (pdb, useless without a
    terminal) when it starts, which can be after this: ``somnus.streams.worker.make_worker`` points those
    at these dumps too, so whichever is installed last, these run."""
    dump_tasks, dump_consumer = diagnostics(app)
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGUSR1, dump_tasks)
    loop.add_signal_handler(signal.SIGUSR2, dump_consumer)


def diagnostics(app: faust.App) -> tuple[Callable[[], None], Callable[[], None]]:
    """(dump the tasks and threads, dump the consumer's state): see ``install_diagnostics``."""

    def dump_tasks() -> None:
        # The main loop's tasks, then the consumer thread's (aiokafka's fetches and commits run
        # there), then every thread's Python stack.
        loops = {"main": asyncio.get_running_loop()}
        thread_loop = getattr(getattr(app.consumer, "_thread", None), "thread_loop", None)
        if thread_loop is not None:
            loops["consumer thread"] = thread_loop
        for where, loop in loops.items():
            print(f"=== asyncio tasks: {where} loop", file=sys.stderr)
            _dump_tasks(loop)
        print("=== agents", file=sys.stderr)
        _dump_agents()
        print("=== threads", file=sys.stderr)
        sys.stderr.flush()
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)

    def _dump_tasks(loop: asyncio.AbstractEventLoop) -> None:
        for task in list(asyncio.all_tasks(loop)):
            print(f"--- {task.get_name()}", file=sys.stderr)
            _walk(task.get_coro())

    def _walk(coro: Any) -> None:
        """Each frame of a coroutine's await chain, down to what it waits on."""
        while coro is not None:
            frame = getattr(coro, "cr_frame", None) or getattr(coro, "ag_frame", None)
            if frame is not None:
                print(f"    {frame.f_code.co_filename}:{frame.f_lineno} {frame.f_code.co_name}", file=sys.stderr)
            coro = _awaited(coro)

    def _awaited(coro: Any) -> Any:
        """What ``coro`` awaits when that is a coroutine; a future it awaits is printed."""
        nxt = getattr(coro, "cr_await", None) or getattr(coro, "ag_await", None)
        if nxt is None or hasattr(nxt, "cr_frame") or hasattr(nxt, "ag_frame"):
            return nxt
        # `await future` leaves a C-level iterator here: the future is what it refers to
        futures = [f for f in ([nxt] + gc.get_referents(nxt)) if isinstance(f, asyncio.Future)]
        print(f"    awaiting {(futures[0] if futures else nxt)!r}"[:600], file=sys.stderr)
        return None

    def _dump_agents() -> None:
        # A Faust task shows only `_execute_actor`: the chain stops where it awaits the actor
        # object, so each actor's own coroutine (the agent's body) is walked here.
        for name, agent in list(getattr(app, "agents", {}).items()):
            for actor in list(getattr(agent, "_actors", ())):
                print(f"--- agent {name}", file=sys.stderr)
                _walk(getattr(actor, "it", None))

    def dump_consumer() -> None:
        c: Any = app.consumer
        print(f"--- consumer state (generation {app.consumer_generation_id})", file=sys.stderr)
        for name in (
            "_active_partitions",
            "_paused_partitions",
            "_buffered_partitions",
            "_read_offset",
            "_committed_offset",
            "_acked",
            "_gap",
            "flow_active",
            "_commit_fut",
        ):
            print(f"    {name} = {getattr(c, name, None)!r}", file=sys.stderr)
        try:
            assignment = c._thread._ensure_consumer()._subscription.subscription.assignment
            for tp, st in assignment._tp_state.items():
                print(
                    f"    aiokafka {tp}: position={st._position} paused={st.paused} status={st._status}",
                    file=sys.stderr,
                )
            client = c._thread._ensure_consumer()._client
            dump_client("consumer", client, time.monotonic())
            for topic in sorted({tp.topic for tp in assignment._tp_state}):  # the consumer's metadata
                parts = client.cluster.partitions_for_topic(topic)
                leaders = {
                    p: client.cluster.leader_for_partition(TopicPartition(topic, p)) for p in sorted(parts or ())
                }
                print(f"    metadata of {topic}: leaders {leaders!r}", file=sys.stderr)
        except Exception as exc:  # diagnostics only
            print(f"    aiokafka state unavailable: {exc!r}", file=sys.stderr)
        try:  # a rebalance's table recovery: what it reads, and how far it got
            tables: Any = app.tables
            rec: Any = tables.recovery
            print(
                f"--- recovery: in_recovery {getattr(app, 'in_recovery', None)!r}, completed "
                f"{rec.completed.is_set()!r}, active highwaters {dict(rec.active_highwaters)!r}, active offsets "
                f"{dict(rec.active_offsets)!r}, standby highwaters {dict(rec.standby_highwaters)!r}, "
                f"buffered {sum(len(b) for b in rec.buffers.values())}",
                file=sys.stderr,
            )
        except Exception as exc:  # diagnostics only
            print(f"    recovery state unavailable: {exc!r}", file=sys.stderr)
        dump_producer()
        sys.stderr.flush()

    def dump_producer() -> None:
        # A commit once hung in Faust's producer.flush(), waiting on a batch that never completed
        # (Faust's producer request timeout, which is also aiokafka's batch expiry, is 1,200 s).
        try:
            faust_producer: Any = app.producer
            producer: Any = faust_producer._ensure_producer()
            acc, sender = producer._message_accumulator, producer._sender
            now = time.monotonic()
            print(
                f"--- producer: in flight to nodes {sorted(sender._in_flight)!r}, muted "
                f"{sorted(map(tuple, sender._muted_partitions))!r}",
                file=sys.stderr,
            )
            cluster = producer.client.cluster
            for tp, batches in list(acc._batches.items()):
                for b in batches:
                    print(
                        f"    queued {tp}: {b.record_count} records, {now - b._ctime:.1f} s old, retries "
                        f"{b._retry_count}, leader {cluster.leader_for_partition(tp)!r}",
                        file=sys.stderr,
                    )
            for b in list(acc._pending_batches):
                print(
                    f"    pending {b.tp}: {b.record_count} records, {now - b._ctime:.1f} s old, retries "
                    f"{b._retry_count}, done {b.future.done()}",
                    file=sys.stderr,
                )
            for tp in {tp for tp, batches in acc._batches.items() if batches}:
                print(
                    f"    metadata of {tp.topic}: partitions {cluster.partitions_for_topic(tp.topic)!r}, "
                    f"available {cluster.available_partitions_for_topic(tp.topic)!r}, "
                    f"unauthorized/invalid {cluster.unauthorized_topics!r}",
                    file=sys.stderr,
                )
            dump_client("producer", producer.client, now)
        except Exception as exc:  # diagnostics only
            print(f"    producer state unavailable: {exc!r}", file=sys.stderr)

    def dump_client(name: str, client: Any, now: float) -> None:
        """A Kafka client's metadata update and connections: each one's local port (to match with
        ``ss``), and the requests waiting for a response on it."""
        print(
            f"--- {name} client: metadata update {client._md_update_fut!r}, waiter "
            f"{client._md_update_waiter!r}, topics {sorted(client._topics)!r}",
            file=sys.stderr,
        )
        for conn_id, conn in list(client._conns.items()):
            writer = getattr(conn, "_writer", None)
            sock = writer.transport.get_extra_info("sockname") if writer is not None else None
            requests = [(corr, type(req).__name__) for corr, req, _ in list(conn._requests)]
            print(
                f"    conn {conn_id!r}: local {sock!r}, connected {conn.connected()}, idle "
                f"{now - conn._last_action:.1f} s, awaiting {requests!r}",
                file=sys.stderr,
            )

    return dump_tasks, dump_consumer
