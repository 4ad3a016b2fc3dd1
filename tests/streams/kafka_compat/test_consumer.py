"""somnus.streams.kafka_compat.consumer: the worker's app gets the rewinding consumer, and what each
override relies on in Faust and aiokafka is still there."""

from __future__ import annotations

import asyncio
import inspect
from types import SimpleNamespace
from typing import Any

import faust
from aiokafka import AIOKafkaConsumer
from aiokafka.consumer.fetcher import Fetcher
from aiokafka.consumer.subscription_state import Assignment, Subscription, SubscriptionState, TopicPartitionState
from faust.transport import consumer as faust_consumer
from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.types import TP

from somnus.streams.kafka_compat.consumer import (
    RewindingConsumer,
    RewindingConsumerThread,
    RewindingTransport,
    SomnusApp,
)

TRACES = TP("traces", 0)


def test_the_app_makes_the_rewinding_transport_consumer_and_thread(app: SomnusApp) -> None:
    # App._new_transport, Transport.Consumer and Consumer._new_consumer_thread are what put them in place
    assert type(app.transport) is RewindingTransport and app.transport.Consumer is RewindingConsumer

    async def run() -> None:
        assert type(app.consumer) is RewindingConsumer
        assert type(app.consumer._thread) is RewindingConsumerThread

    asyncio.run(run())


def test_commits_go_through_the_cap(app: SomnusApp) -> None:
    # RewindingConsumer._filter_committable_offsets overrides Faust's, over its _acked bookkeeping
    async def run() -> None:
        consumer: Any = app.consumer
        uncapped = TP("traces", 1)
        for tp in (TRACES, uncapped):
            for offset in range(5):
                consumer._acked[tp].append(offset)
                consumer._acked_index[tp].add(offset)
        app.somnus_commit_cap = lambda tp: 2 if tp == TRACES else None  # type: ignore[attr-defined]
        assert consumer._filter_committable_offsets({TRACES, uncapped}) == {TRACES: 2, uncapped: 5}

    asyncio.run(run())


def _rebalancing_commit(app: SomnusApp, committed_by_the_group: int | None, did_commit: bool) -> Any:
    """The consumer, with a commit in flight during which a rebalance seeks ``TRACES`` back to the
    group's committed offset (as Faust's ``perform_seek`` does) and that then fails or succeeds."""
    consumer: Any = app.consumer

    async def commit(offsets: Any) -> bool:
        consumer._committed_offset.pop(TRACES, None)  # revoked ...
        if committed_by_the_group is not None:  # ... and assigned again: what the group committed
            consumer._committed_offset[TRACES] = committed_by_the_group
        await asyncio.sleep(0)
        return did_commit

    async def flush() -> None:
        return None

    consumer._thread.commit = commit
    consumer.assignment = lambda: {TRACES}
    app.producer.flush = flush  # type: ignore[method-assign]
    return consumer


def test_a_commit_that_failed_is_not_counted_as_committed(app: SomnusApp) -> None:
    # The broker restarted while the commit of offset 10 was in flight: the group rebalanced, the
    # partition was sought back to 4 (the group's committed offset), and the commit failed
    # (UnknownMemberIdError). Faust recorded 10 as committed, so the records 4-9 read again were
    # never committed and the group's lag stayed up.
    async def run() -> None:
        consumer = _rebalancing_commit(app, committed_by_the_group=4, did_commit=False)
        consumer._committed_offset[TRACES] = 4
        assert await consumer._commit_offsets({TRACES: 10}) is False
        assert consumer._committed_offset[TRACES] == 4
        for offset in range(4, 10):  # read again and acknowledged: now committable
            consumer._acked[TRACES].append(offset)
            consumer._acked_index[TRACES].add(offset)
        assert consumer._filter_committable_offsets({TRACES}) == {TRACES: 10}

    asyncio.run(run())


def test_a_failed_commit_of_a_partition_with_nothing_committed_leaves_nothing_committed(app: SomnusApp) -> None:
    async def run() -> None:
        consumer = _rebalancing_commit(app, committed_by_the_group=None, did_commit=False)
        assert await consumer._commit_offsets({TRACES: 10}) is False
        assert TRACES not in consumer._committed_offset

    asyncio.run(run())


def test_a_commit_that_succeeded_is_counted_as_committed(app: SomnusApp) -> None:
    async def run() -> None:
        consumer = _rebalancing_commit(app, committed_by_the_group=4, did_commit=True)
        assert await consumer._commit_offsets({TRACES: 10}) is True
        assert consumer._committed_offset[TRACES] == 10

    asyncio.run(run())


def test_partitions_with_nothing_committed_are_rewound_to_their_beginning() -> None:
    changelog = TP("sessions-changelog", 0)
    rewound: list[Any] = []

    async def seek_to_committed() -> dict[TP, int | None]:
        return {TRACES: 0, TP("traces", 1): None, TP("traces", 2): 7, changelog: None}

    async def seek_to_beginning(*tps: Any) -> None:
        rewound.extend(tps)

    aiokafka_consumer = SimpleNamespace(seek_to_committed=seek_to_committed, seek_to_beginning=seek_to_beginning)
    thread = SimpleNamespace(
        _ensure_consumer=lambda: aiokafka_consumer,
        app=SimpleNamespace(tables=SimpleNamespace(changelog_topics={changelog.topic})),
    )
    committed = asyncio.run(RewindingConsumerThread._seek_to_committed_or_beginning(thread))  # type: ignore[arg-type]
    assert rewound == [TRACES, TP("traces", 1)] and committed[TP("traces", 2)] == 7


def test_the_methods_it_overrides_are_still_there_and_still_called() -> None:
    thread = faust_aiokafka.AIOKafkaConsumerThread
    assert list(inspect.signature(thread.verify_event_path).parameters) == ["self", "now", "tp"]
    assert list(inspect.signature(thread.seek_to_committed).parameters) == ["self"]
    assert callable(thread.call_thread) and callable(thread._ensure_consumer)
    assert list(inspect.signature(faust_aiokafka.Consumer._filter_committable_offsets).parameters) == ["self", "tps"]
    assert "self._filter_committable_offsets(" in inspect.getsource(faust_consumer.Consumer)
    # _commit_offsets: Faust's calls self._commit, then updates _committed_offset with no await between
    commit_offsets = inspect.getsource(faust_consumer.Consumer._commit_offsets)
    after_commit = commit_offsets.split("await self._commit(", 1)[1]
    assert "self._committed_offset.update(" in after_commit
    assert "await" not in after_commit.split("self._committed_offset.update(", 1)[0]
    assert "self._committed_offset" in inspect.getsource(faust_consumer.Consumer.__init__)
    assert "self.seek_to_committed()" in inspect.getsource(faust_consumer.Consumer.perform_seek)
    assert "self._new_consumer_thread()" in inspect.getsource(faust_consumer.ThreadDelegateConsumer)
    assert "self._new_transport()" in inspect.getsource(faust.App)


def test_the_aiokafka_state_position_known_reads_is_still_there() -> None:
    # position_known: thread._ensure_consumer()._fetcher._subscriptions.subscription.assignment
    #                 .state_value(tp).has_valid_position (and .position for fetch_position)
    assert "self._fetcher = Fetcher(" in inspect.getsource(AIOKafkaConsumer)
    assert "self._subscriptions = subscriptions" in inspect.getsource(Fetcher.__init__)
    assert isinstance(inspect.getattr_static(SubscriptionState, "subscription"), property)
    assert isinstance(inspect.getattr_static(Subscription, "assignment"), property)
    assert callable(Assignment.state_value)
    for name in ("has_valid_position", "position"):
        assert isinstance(inspect.getattr_static(TopicPartitionState, name), property)


def test_the_aiokafka_defect_it_works_around_is_still_there() -> None:
    # aio-libs/aiokafka#1003: seek_to_committed skips a partition committed at 0 (or not at all).
    # When this fails, check whether RewindingConsumerThread.seek_to_committed can go.
    assert "if offset and offset > 0" in inspect.getsource(AIOKafkaConsumer.seek_to_committed)
    # ...and the livelock check reads the position, which asserts for a partition awaiting its reset
    assert "assert" in inspect.getsource(TopicPartitionState.position.fget)  # type: ignore[attr-defined]


def test_the_assignment_is_fausts_built_once_per_aiokafka_assignment(monkeypatch: Any) -> None:
    from aiokafka import TopicPartition

    built: list[Any] = []
    original = faust_consumer.ensure_TPset
    monkeypatch.setattr(faust_consumer, "ensure_TPset", lambda tps: built.append(tps) or original(tps))
    current: list[Any] = [frozenset({TopicPartition("traces", 0), TopicPartition("traces", 1)})]
    thread: Any = SimpleNamespace(
        _assigned=None, _ensure_consumer=lambda: SimpleNamespace(assignment=lambda: current[0])
    )

    def assignment() -> set[TP]:
        return RewindingConsumerThread.assignment(thread)

    first = assignment()
    assert first == {TRACES, TP("traces", 1)} and all(type(tp) is TP for tp in first)
    first.add(TP("mutated", 0))  # each caller's own set
    assert assignment() == {TRACES, TP("traces", 1)} and len(built) == 1
    current[0] = frozenset({TopicPartition("traces", 2)})  # a rebalance: a new Assignment
    assert assignment() == {TP("traces", 2)} and len(built) == 2
    current[0] = {TopicPartition("traces", 3)}  # a mutable set is never kept
    assert assignment() == {TP("traces", 3)} and assignment() == {TP("traces", 3)} and len(built) == 4


def test_aiokafka_hands_out_its_assignment_as_one_frozenset() -> None:
    # RewindingConsumerThread.assignment keeps its TPs with this object
    from aiokafka import TopicPartition

    async def made() -> Any:  # an Assignment makes futures: in a loop
        return Assignment([TopicPartition("traces", 0)])

    assignment = asyncio.run(made())
    assert type(assignment.tps) is frozenset and assignment.tps is assignment.tps
    assert "return self._subscription.assignment.tps" in inspect.getsource(SubscriptionState.assigned_partitions)
    assert "return self._subscription.assigned_partitions()" in inspect.getsource(AIOKafkaConsumer.assignment)
    assert "ensure_TPset(self._ensure_consumer().assignment())" in inspect.getsource(
        faust_aiokafka.AIOKafkaConsumerThread.assignment
    )
