"""Wiring tests of the partition watchdog (a stand-in consumer; the real broker is in tests/integration)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from aiokafka import TopicPartition
from faust.types import TP

from somnus.streams.kafka_compat.consumer import position_known
from somnus.streams.liveness import PartitionWatchdog

TRACES = TP("traces", 0)
OTHER = TP("other", 0)


class FakeConsumer:
    def __init__(self, highwater: int, read: int | None, committed: int | None) -> None:
        self.flow_active = True
        self.highwaters = {TRACES: highwater, OTHER: 99}
        self._read_offset: dict[TP, Any] = {TRACES: read, OTHER: None}
        self._committed_offset: dict[TP, Any] = {TRACES: committed}
        self._acked: dict[TP, list[int]] = {TRACES: [700, 701]}
        self._acked_index: dict[TP, set[int]] = {TRACES: {700, 701}}
        self._gap: dict[TP, Any] = {TRACES: object()}
        self.seeks: list[dict[TP, int]] = []
        self.beginnings: list[TP] = []
        self._thread = SimpleNamespace(seek_to_beginning=self._to_beginning)

    def assignment(self) -> set[TP]:
        return {TRACES, OTHER}

    def highwater(self, tp: TP) -> int:
        return self.highwaters[tp]

    async def seek_wait(self, partitions: dict[TP, int]) -> None:
        self.seeks.append(dict(partitions))
        self._read_offset.update(partitions)

    async def _to_beginning(self, *tps: Any) -> None:
        if not all(isinstance(tp, TopicPartition) for tp in tps):  # as aiokafka's seek_to_beginning
            raise TypeError("partitions must be TopicPartition instances")
        self.beginnings.extend(tps)


def _watchdog(consumer: FakeConsumer, idle: bool = True, stall_s: float = 5.0) -> tuple[PartitionWatchdog, list[float]]:
    clock = [0.0]
    app: Any = SimpleNamespace(consumer=consumer, rebalancing=False)
    dog = PartitionWatchdog(app, {"traces"}, idle=lambda: idle, stall_s=stall_s)
    return dog, clock


def _check(dog: Any, at: float) -> None:
    async def run() -> None:
        loop = asyncio.get_running_loop()
        real_time = loop.time
        loop.time = lambda: at  # type: ignore[method-assign]
        try:
            await dog.check()
        finally:
            loop.time = real_time  # type: ignore[method-assign]

    asyncio.run(run())


def test_a_partition_with_lag_that_does_not_move_is_rewound_to_its_committed_offset():
    consumer = FakeConsumer(highwater=554, read=553, committed=251)  # the stall seen in the failover test
    dog, _ = _watchdog(consumer)
    _check(dog, 0.0)
    _check(dog, 4.9)
    assert consumer.seeks == []  # not yet stalled for stall_s
    _check(dog, 5.0)
    assert consumer.seeks == [{TRACES: 251}]
    assert TRACES not in consumer._acked and TRACES not in consumer._gap  # Faust's ack bookkeeping reset
    assert dog.rewinds == 1


def test_nothing_committed_rewinds_to_the_beginning():
    consumer = FakeConsumer(highwater=526, read=None, committed=None)
    dog, _ = _watchdog(consumer)
    _check(dog, 0.0)
    _check(dog, 10.0)
    assert consumer.beginnings == [TRACES] and consumer.seeks == []


def test_a_read_offset_ahead_of_nothing_committed_rewinds_to_the_beginning_and_forgets_it():
    # Seen in the SIGKILL test: records 0.. were never delivered while Faust had read up to 1206.
    consumer = FakeConsumer(highwater=1207, read=1206, committed=None)
    dog, _ = _watchdog(consumer)
    _check(dog, 0.0)
    _check(dog, 5.0)
    assert consumer.beginnings == [TopicPartition("traces", 0)] and consumer.seeks == []
    assert consumer._read_offset.get(TRACES) is None  # re-fetched records are not dropped as read
    assert dog.rewinds == 1


def test_progress_or_a_busy_agent_or_no_lag_never_rewinds():
    moving = FakeConsumer(highwater=900, read=100, committed=50)
    dog, _ = _watchdog(moving)
    for t in range(0, 30, 2):
        moving._read_offset[TRACES] = 100 + t  # the partition is being read
        _check(dog, float(t))
    assert moving.seeks == []

    busy = FakeConsumer(highwater=900, read=100, committed=50)
    dog, _ = _watchdog(busy, idle=False)
    _check(dog, 0.0)
    _check(dog, 60.0)
    assert busy.seeks == []

    caught_up = FakeConsumer(highwater=554, read=553, committed=554)
    dog, _ = _watchdog(caught_up)
    _check(dog, 0.0)
    _check(dog, 60.0)
    assert caught_up.seeks == [] and caught_up.beginnings == []


def test_a_commit_that_crawls_behind_a_static_read_offset_is_rewound_too():
    consumer = FakeConsumer(highwater=554, read=553, committed=317)  # seen: +1 a second, for minutes
    dog, _ = _watchdog(consumer, stall_s=15.0)
    for t in range(0, 16):
        consumer._committed_offset[TRACES] = 317 + t
        _check(dog, float(t))
    assert consumer.seeks == [{TRACES: 332}]


def _thread_with(states: dict[TopicPartition, Any] | Any | None) -> Any:
    """A consumer thread whose aiokafka assignment has ``states`` (a dict, or a function of the partition)."""
    assignment = None if states is None else SimpleNamespace(state_value=getattr(states, "get", states))
    subscription = SimpleNamespace(assignment=assignment)
    consumer = SimpleNamespace(_fetcher=SimpleNamespace(_subscriptions=SimpleNamespace(subscription=subscription)))
    return SimpleNamespace(_ensure_consumer=lambda: consumer)


def test_the_livelock_check_skips_partitions_without_a_position() -> None:
    # aiokafka's TopicPartitionState.position asserts while a new assignment awaits its reset: the
    # crash seen when a worker took over the partitions of a SIGKILLed one
    from aiokafka.consumer.subscription_state import TopicPartitionState

    async def run() -> None:  # the state makes a future: it needs a running loop
        fresh = TopicPartitionState(assignment=None)
        placed = TopicPartitionState(assignment=None)
        placed.reset_to(42)
        tp, aiotp = TRACES, TopicPartition(TRACES.topic, TRACES.partition)
        assert not position_known(_thread_with({aiotp: fresh}), tp)
        assert position_known(_thread_with({aiotp: placed}), tp)
        assert not position_known(_thread_with({}), tp)
        assert not position_known(_thread_with(None), tp)

    asyncio.run(run())


def test_commits_are_capped_at_what_the_state_applied():
    from faust.types import TP

    from somnus.streams.kafka_compat.consumer import cap_offsets

    a, b, c = TP("traces", 0), TP("traces", 1), TP("episodes", 0)
    caps = {a: 50, b: 10}
    out = cap_offsets({a: 80, b: 10, c: 7}, caps.get, {a: 40, b: 10})
    # a: lowered to its cap; b: the cap is what is committed already, nothing to do; c: no cap
    assert out == {a: 50, c: 7}
    assert cap_offsets({a: 30}, caps.get, {}) == {a: 30}
    assert cap_offsets({a: 80}, None, {}) == {a: 80}


def test_the_task_dump_walks_each_agents_body_and_names_the_future_it_awaits(capfd):
    # A stalled agent showed only Faust's `_execute_actor`: the chain stopped at the actor object.
    import types

    from somnus.streams.liveness import diagnostics

    async def agent_body(gate: asyncio.Future) -> None:
        await asyncio.gather(gate)

    class Actor:  # what Faust's AwaitableActor is to the dump: an awaitable holding the coroutine as `it`
        def __init__(self, it):
            self.it = it

        def __await__(self):
            return self.it.__await__()

    async def main() -> None:
        gate = asyncio.get_running_loop().create_future()
        actor = Actor(agent_body(gate))
        task = asyncio.ensure_future(_run(actor))
        await asyncio.sleep(0.01)
        app = types.SimpleNamespace(consumer=None, agents={"distill": types.SimpleNamespace(_actors={actor})})
        dump_tasks, _ = diagnostics(app)
        dump_tasks()
        gate.set_result(None)
        await task

    async def _run(actor: Actor) -> None:
        await actor

    asyncio.run(main())
    err = capfd.readouterr().err
    agents = err[err.index("=== agents") : err.index("=== threads")]
    assert "--- agent distill" in agents and "agent_body" in agents, err
    assert "awaiting <_GatheringFuture pending" in agents, err


WM = TP("wm-changelog", 0)
SESS = TP("sessions-changelog", 1)


class FakeRecoveryApp:
    """What ``RecoveryWatchdog`` reads of a Faust app in recovery: the recovery's offsets, the
    changelog queue, and aiokafka's fetch positions (through ``fetch_position``'s path)."""

    def __init__(self, offsets: dict[TP, int], highwaters: dict[TP, int], positions: dict[TP, int]) -> None:
        self.in_recovery = True
        self.queued = 0
        self.positions = positions
        self.seeks: list[dict[TP, int]] = []
        self.tables = SimpleNamespace(
            recovery=SimpleNamespace(
                active_tps=set(offsets),
                active_offsets=offsets,
                active_highwaters=highwaters,
                signal_recovery_start=asyncio.Event(),
            ),
            changelog_queue=SimpleNamespace(qsize=lambda: self.queued),
        )
        self.consumer = SimpleNamespace(flow_active=True, seek_wait=self._seek_wait, _thread=_thread_with(self._state))

    def _state(self, tp: TopicPartition) -> Any:
        position = self.positions.get(TP(tp.topic, tp.partition))
        return None if position is None else SimpleNamespace(has_valid_position=True, position=position)

    async def _seek_wait(self, partitions: dict[TP, int]) -> None:
        self.seeks.append(dict(partitions))


def test_a_changelog_fetched_past_but_not_restored_is_sought_back_to_the_restored_offset():
    from somnus.streams.liveness import RecoveryWatchdog

    # the survivor's dump: offsets -1, positions at the end; a second partition restored up to 40
    app = FakeRecoveryApp({WM: -1, SESS: 40}, {WM: 158, SESS: 160}, {WM: 159, SESS: 161})
    dog = RecoveryWatchdog(app, stall_s=10.0)  # type: ignore[arg-type]
    _check(dog, 0.0)
    _check(dog, 9.9)
    assert app.seeks == []  # not stalled for stall_s yet
    _check(dog, 10.0)
    # recovery's own seek: the last restored offset (re-read, skipped), or 0 when nothing was restored
    assert sorted(app.seeks, key=str) == sorted([{WM: 0}, {SESS: 40}], key=str)
    assert dog.reseeks == 2


def test_a_recovery_that_moves_or_has_not_fetched_past_or_has_records_queued_is_left_alone():
    from somnus.streams.liveness import RecoveryWatchdog

    moving = FakeRecoveryApp({WM: 10}, {WM: 158}, {WM: 159})
    dog = RecoveryWatchdog(moving, stall_s=10.0)  # type: ignore[arg-type]
    for t in range(0, 40, 3):
        moving.tables.recovery.active_offsets[WM] = 10 + t  # being restored
        _check(dog, float(t))
    assert moving.seeks == []

    waiting = FakeRecoveryApp({WM: 57}, {WM: 158}, {WM: 58})  # next record not fetched yet
    queued = FakeRecoveryApp({WM: 10}, {WM: 158}, {WM: 159})
    queued.queued = 3  # fetched records on their way to recovery
    done = FakeRecoveryApp({WM: 158}, {WM: 158}, {WM: 159})
    unknown = FakeRecoveryApp({WM: 10}, {WM: 158}, {})  # no position yet
    over = FakeRecoveryApp({WM: 10}, {WM: 158}, {WM: 159})
    over.in_recovery = False
    again = FakeRecoveryApp({WM: 10}, {WM: 158}, {WM: 159})
    again.tables.recovery.signal_recovery_start.set()  # another recovery is about to seek anyway
    for app in (waiting, queued, done, unknown, over, again):
        dog = RecoveryWatchdog(app, stall_s=10.0)  # type: ignore[arg-type]
        _check(dog, 0.0)
        _check(dog, 60.0)
        assert app.seeks == [], vars(app)
