"""somnus.streams.kafka_compat.offsets, on a real Faust consumer's bookkeeping (made, never started)."""

from __future__ import annotations

import asyncio
import inspect
from types import SimpleNamespace
from typing import Any

from aiokafka import TopicPartition
from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.types import TP

from somnus.streams.kafka_compat import offsets
from somnus.streams.kafka_compat.consumer import SomnusApp

TRACES = TP("traces", 0)


def test_a_rewind_resets_fausts_bookkeeping_of_that_partition_only(app: SomnusApp) -> None:
    other = TP("traces", 1)

    async def run() -> None:
        consumer: Any = app.consumer
        for tp in (TRACES, other):
            consumer._acked[tp].extend([3, 4])
            consumer._acked_index[tp].update({3, 4})
            consumer._gap[tp].addi(10, 20)
            consumer._read_offset[tp] = 7
        consumer._committed_offset[TRACES] = 3
        assert offsets.read_and_committed(consumer, TRACES) == (7, 3)
        assert offsets.committed_offsets(consumer)[TRACES] == 3

        offsets.chop_gaps_from(consumer, TRACES, 15)
        assert sorted((i.begin, i.end) for i in consumer._gap[TRACES]) == [(10, 15)]
        offsets.clear_read_offset(consumer, TRACES)
        assert offsets.read_and_committed(consumer, TRACES) == (None, 3)
        offsets.forget_acks(consumer, TRACES)
        assert TRACES not in consumer._acked and TRACES not in consumer._acked_index and TRACES not in consumer._gap
        assert consumer._acked[other] == [3, 4] and consumer._read_offset[other] == 7  # the others untouched
        assert offsets.consumer_thread(consumer) is consumer._thread

    asyncio.run(run())


def test_seek_to_beginning_hands_aiokafka_its_own_topic_partition() -> None:
    got: list[Any] = []

    async def seek_to_beginning(*tps: Any) -> None:
        got.extend(tps)

    asyncio.run(
        offsets.seek_to_beginning(SimpleNamespace(_thread=SimpleNamespace(seek_to_beginning=seek_to_beginning)), TRACES)
    )
    assert got == [TopicPartition("traces", 0)] and type(got[0]) is TopicPartition
    assert "seek_to_beginning" in faust_aiokafka.AIOKafkaConsumerThread.__dict__


def test_fausts_seek_still_leaves_acks_and_gaps_as_they_were() -> None:
    # When Faust's seek resets the acks and gaps itself, the helpers here can go (module docstring).
    seek = inspect.getsource(faust_aiokafka.AIOKafkaConsumerThread._seek_wait)
    assert "_read_offset" in seek and "_acked" not in seek and "_gap" not in seek
