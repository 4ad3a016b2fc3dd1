"""Faust's consumer bookkeeping, reset where Somnus rewinds a partition itself.

Faust counts a partition's progress in private maps of its ``Consumer``: ``_acked`` and
``_acked_index`` (offsets acknowledged, not committed yet), ``_gap`` (offsets never delivered and
counted as acknowledged), ``_read_offset`` (the last offset handed to a stream; a re-fetched record
at or below it is dropped as already read) and ``_committed_offset``. A rewind that leaves them as
they were makes Faust drop or skip what it re-reads (the defects in ``somnus.streams.liveness`` and
``somnus.streams.ordering``). Upstream offers no public way to rewind a partition with its
bookkeeping (no faust-streaming issue found); these helpers are the only places Somnus writes those
maps, and ``tests/streams/kafka_compat/test_offsets.py`` fails when one of them is renamed.

They can go when Faust's ``seek_wait`` resets that bookkeeping itself: in faust-streaming 0.15.3,
``AIOKafkaConsumerThread._seek_wait`` sets ``_read_offset`` (removes it for offset 0) but leaves
``_acked``, ``_acked_index`` and ``_gap`` as they were.
"""

from __future__ import annotations

from typing import Any

from aiokafka import TopicPartition
from faust.types import TP


def read_and_committed(consumer: Any, tp: TP) -> tuple[int | None, int | None]:
    """Faust's read offset and committed offset of ``tp`` (either None when it has none)."""
    return consumer._read_offset.get(tp), consumer._committed_offset.get(tp)


def committed_offsets(consumer: Any) -> Any:
    """Faust's committed offset of each partition (a mapping it keeps up to date)."""
    return consumer._committed_offset


def forget_acks(consumer: Any, tp: TP) -> None:
    """Drop Faust's acknowledgements and "never delivered" ranges of ``tp``: after a rewind they
    describe records about to be read again."""
    consumer._acked.pop(tp, None)
    consumer._acked_index.pop(tp, None)
    consumer._gap.pop(tp, None)


def chop_gaps_from(consumer: Any, tp: TP, offset: int) -> None:
    """Drop Faust's "never delivered, count as acked" ranges of ``tp`` from ``offset`` on."""
    gap = consumer._gap.get(tp)
    if gap:
        gap.chop(offset, 1 << 62)


def clear_read_offset(consumer: Any, tp: TP) -> None:
    """Forget the last offset read from ``tp``, so that nothing re-fetched is dropped as already read.
    Needed after a seek to offset 0: Faust's seek moves the read offset only to an offset > 0."""
    consumer._read_offset[tp] = None


async def seek_to_beginning(consumer: Any, tp: TP) -> None:
    """Seek ``tp`` to its beginning through Faust's consumer thread; aiokafka's ``seek_to_beginning``
    takes only its own ``TopicPartition`` (a Faust ``TP`` raised TypeError)."""
    await consumer._thread.seek_to_beginning(TopicPartition(tp.topic, tp.partition))


def consumer_thread(consumer: Any) -> Any:
    """The ``AIOKafkaConsumerThread`` of Faust's consumer, where aiokafka's consumer lives."""
    return consumer._thread
