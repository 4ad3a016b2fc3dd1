"""Faust's aiokafka consumer and app, subclassed where Faust 0.15 and aiokafka 0.14 lose partitions.

``SomnusApp`` (the worker's app, ``somnus.streams.app.create_app``) uses ``RewindingTransport``,
whose consumer and consumer thread carry four workarounds, each overriding a private method
(and ``RewindingConsumerThread.assignment``, which only makes Faust's cheaper):

- ``RewindingConsumerThread.seek_to_committed``: aiokafka's ``seek_to_committed`` skips a partition
  whose committed offset is missing or 0 (``if offset and offset > 0``), so a partition taken over
  from a worker that died before its first commit kept its position at the end and its records
  were never delivered. Upstream: aio-libs/aiokafka#1003 ("seek_to_committed does not work when
  committed offset is 0", open). Relies on ``AIOKafkaConsumerThread.call_thread`` and
  ``_ensure_consumer``. It can go when aiokafka seeks a partition committed at 0 (or not at all) to
  its beginning under ``auto_offset_reset=earliest`` (``test_consumer.py`` pins the condition).
- ``RewindingConsumerThread.verify_event_path``: Faust's livelock check reads aiokafka's
  ``position`` of every assigned partition, which *asserts* while a just-assigned partition awaits
  its offset reset; a survivor died with a bare ``AssertionError`` while taking over from a
  SIGKILLed worker. No upstream issue found. Relies on aiokafka's
  ``consumer._fetcher._subscriptions.subscription.assignment.state_value(tp).has_valid_position``.
  It can go when ``AIOKafkaConsumer.position`` waits instead of asserting, or Faust skips such a
  partition.
- ``RewindingConsumer._filter_committable_offsets``: commits never pass the app's commit cap (the
  offset the agent's guarded state has applied, ``somnus.streams.ordering``): Faust's bookkeeping can
  count offsets as acknowledged that were never delivered, and a commit past them would make the
  group's lag lie. Not an upstream defect we can point at (Faust's ``_gap`` ranges are by design);
  it stays while Somnus keeps its own positions. Relies on ``Consumer._filter_committable_offsets``,
  ``_committed_offset`` and ``_new_consumer_thread``, and ``App._new_transport``.
- ``RewindingConsumer._commit_offsets``: Faust records the offsets of a commit as committed even when
  the commit failed (``_committed_offset.update`` after ``did_commit`` is False). A commit fails when
  the group rebalanced while it was in flight (a broker restart: ``UnknownMemberIdError``); the
  rebalance has meanwhile sought the partitions back to the group's committed offsets, and Faust's
  update then hides them: the records read again are never committed, and the group's lag stays
  up until new records arrive (``test_broker_crash``, 1 CI run in 4). The override puts back what
  the rebalance left. No upstream issue found; relies on ``Consumer._commit_offsets`` calling
  ``self._commit`` and then updating ``_committed_offset`` with no ``await`` between. It can go when
  Faust updates ``_committed_offset`` only after a commit that succeeded.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import faust
from aiokafka import TopicPartition
from faust.transport import consumer as faust_consumer
from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.types import TP

log = logging.getLogger("somnus.liveness")


class RewindingConsumerThread(faust_aiokafka.AIOKafkaConsumerThread):
    """``seek_to_committed`` that also rewinds source partitions with nothing committed, and a
    livelock check that tolerates partitions with no position yet."""

    _assigned: tuple[Any, frozenset[TP]] | None = None

    def assignment(self) -> set[TP]:
        """Faust's ``assignment``, its ``TP``s built once per assignment rather than on every call.

        The worker's sequencer asks which partitions it owns for every trace record it hands on;
        Faust builds a ``TP`` of every assigned partition each time (py-spy: 1.6% of the worker).
        aiokafka's ``assignment()`` is the ``frozenset`` of its current ``Assignment``, the same object
        until the next assignment: the ``TP``s are kept with that object and built again when it
        changes (a value that is not a frozenset is never kept). Relies on aiokafka 0.14's
        ``SubscriptionState.assigned_partitions`` returning ``Assignment.tps``
        (``tests/streams/kafka_compat/test_consumer.py``); without that it is Faust's own, only no faster.
        """
        tps = self._ensure_consumer().assignment()
        kept = self._assigned
        if kept is None or kept[0] is not tps:
            converted = frozenset(faust_consumer.ensure_TPset(tps))
            if type(tps) is not frozenset:
                return set(converted)
            kept = self._assigned = (tps, converted)
        return set(kept[1])  # a set of its own for each caller, as Faust's

    def verify_event_path(self, now: float, tp: TP) -> None:
        if not position_known(self, tp):
            return None
        return super().verify_event_path(now, tp)

    async def seek_to_committed(self) -> Mapping[TP, int]:
        return await self.call_thread(self._seek_to_committed_or_beginning)

    async def _seek_to_committed_or_beginning(self) -> Mapping[TP, int]:
        consumer = self._ensure_consumer()
        committed = await consumer.seek_to_committed()
        changelogs = self.app.tables.changelog_topics
        never = [tp for tp, offset in committed.items() if not offset and tp.topic not in changelogs]
        if never:
            log.info("rewinding partitions with nothing committed to their beginning: %s", never)
            await consumer.seek_to_beginning(*never)
        return committed


def cap_offsets(
    offsets: Mapping[TP, int], cap: Callable[[TP], int | None] | None, committed: Mapping[TP, int | None]
) -> dict[TP, int]:
    """``offsets`` to commit, each lowered to its partition's cap; dropped when that is not past
    what is committed already."""
    out: dict[TP, int] = {}
    for tp, offset in offsets.items():
        limit = cap(tp) if cap is not None else None
        if limit is not None and offset > limit:
            offset = limit
        done = committed.get(tp)
        if done is None or offset > done:
            out[tp] = offset
    return out


def position_known(thread: Any, tp: TP) -> bool:
    """Does aiokafka know the fetch position of ``tp``? False for a partition just assigned and still
    awaiting its offset reset (aiokafka's ``position`` asserts then), and False when there is no
    subscription or state for it (mid-rebalance: Faust's check would fail on ``None`` too)."""
    try:
        subscription = thread._ensure_consumer()._fetcher._subscriptions.subscription
        state = subscription.assignment.state_value(TopicPartition(tp.topic, tp.partition))
    except AttributeError:
        return False
    return state is not None and bool(state.has_valid_position)


class RewindingConsumer(faust_aiokafka.Consumer):
    """The consumer of ``RewindingConsumerThread``, whose commits never pass the app's commit cap, and
    whose failed commits are not counted as committed.

    ``app.somnus_commit_cap(tp)`` is the next offset the agent's state has to apply (see
    ``somnus.streams.ordering``), or None for a partition without one. Faust's own bookkeeping can count
    offsets as acknowledged that were never delivered; a commit past them would make the lag of
    the group lie (0 with a record not applied).
    """

    # the committed offsets as they stood when the commit in flight failed (Faust overwrites them next)
    _before_failed_commit: dict[TP, int | None] | None = None

    async def _commit(self, offsets: Mapping[TP, int]) -> bool:
        did_commit = bool(await super()._commit(offsets))
        if not did_commit:
            self._before_failed_commit = {tp: self._committed_offset.get(tp) for tp in offsets}
        return did_commit

    async def _commit_offsets(self, offsets: Mapping[TP, int], start_new_transaction: bool = True) -> bool:
        self._before_failed_commit = None
        did_commit = bool(await super()._commit_offsets(offsets, start_new_transaction=start_new_transaction))
        before: dict[TP, int | None] = self._before_failed_commit or {}
        self._before_failed_commit = None
        for tp, offset in before.items():
            if offset is None:
                self._committed_offset.pop(tp, None)
            else:
                self._committed_offset[tp] = offset
        return did_commit

    def _new_consumer_thread(self) -> RewindingConsumerThread:
        return RewindingConsumerThread(self, loop=self.loop, beacon=self.beacon)

    def _filter_committable_offsets(self, tps: Any) -> dict[TP, int]:
        return cap_offsets(
            super()._filter_committable_offsets(tps),
            getattr(self.app, "somnus_commit_cap", None),
            self._committed_offset,
        )


class RewindingTransport(faust_aiokafka.Transport):
    Consumer = RewindingConsumer


class SomnusApp(faust.App):
    """A Faust app whose consumer rewinds partitions with nothing committed (see module docstring),
    and that runs its ``early_task``s from its start on."""

    _early_tasks: list[Callable[[], Awaitable[None]]]

    def _new_transport(self) -> Any:
        return RewindingTransport(self.conf.broker_consumer, self)

    def early_task(self, fun: Callable[[], Awaitable[None]]) -> Callable[[], Awaitable[None]]:
        """Like ``@app.task``, but started with the app, not after its tables are first restored: Faust
        starts its tasks only then, so a watchdog of that first recovery has to start earlier."""
        self.__dict__.setdefault("_early_tasks", []).append(fun)
        return fun

    async def on_start(self) -> None:
        await super().on_start()
        for fun in self.__dict__.get("_early_tasks", ()):
            self.add_future(fun())


def fetch_position(thread: Any, tp: TP) -> int | None:
    """aiokafka's fetch position of ``tp`` (the next offset it will hand out), or None when unknown
    (see ``position_known``)."""
    if not position_known(thread, tp):
        return None
    subscription = thread._ensure_consumer()._fetcher._subscriptions.subscription
    return subscription.assignment.state_value(TopicPartition(tp.topic, tp.partition)).position
