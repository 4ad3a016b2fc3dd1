"""The projector's drain against the real broker: records keep arriving while a batch is being applied,
in each partition's order, never more held than its limit."""

from __future__ import annotations

import asyncio

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from somnus.projections.projector import Drain
from somnus.streams.topics import ensure_topics

pytestmark = pytest.mark.integration


async def _run(bootstrap: str, topic: str) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=0)
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        group_id=None,
        auto_offset_reset="earliest",
        fetch_max_wait_ms=100,
    )
    await producer.start()
    await consumer.start()
    drain = Drain(consumer, limit=50)
    try:
        tps = [TopicPartition(topic, p) for p in range(2)]
        consumer.assign(tps)
        for tp in tps:
            consumer.seek(tp, 0)
        drain.start()
        assert await drain.take(0.3) == []  # nothing yet: it waits, then returns empty
        # Produced in waves while nobody takes (a batch being applied): each wave is fetched as
        # it comes, not when the next take drains a buffer.
        for wave in range(3):
            for i in range(10):
                await producer.send_and_wait(topic, f"{wave}:{i}".encode(), partition=i % 2)
            for _ in range(100):
                if len(drain.records) == 10 * (wave + 1):
                    break
                await asyncio.sleep(0.05)
            assert len(drain.records) == 10 * (wave + 1), f"wave {wave} not taken off the consumer"
        got = await drain.take(0.3)
        assert len(got) == 30
        # Back-pressure: more than the limit is produced; the drain holds the limit and no more.
        for i in range(120):
            await producer.send(topic, f"b:{i}".encode(), partition=i % 2)
        await producer.flush()
        await asyncio.sleep(1.0)
        assert len(drain.records) == 50
        while len(got) < 150:
            batch = await drain.take(5.0)
            assert 0 < len(batch) <= 50
            got += batch
        for p in range(2):  # every record once, each partition in order
            offsets = [r.offset for r in got if r.partition == p]
            assert offsets == list(range(75))
    finally:
        await drain.stop()
        await consumer.stop()
        await producer.stop()


def test_the_drain_keeps_fetching_during_a_batch_and_stops_at_its_limit(pipeline_settings):
    s = pipeline_settings
    ensure_topics(s, s.bootstrap)
    asyncio.run(_run(s.bootstrap, s.traces_topic))


class _Failing:
    async def getmany(self, **kw):
        raise RuntimeError("broker gone")


def test_a_consumer_failure_is_raised_by_take():
    async def run() -> None:
        drain = Drain(_Failing(), limit=10)  # type: ignore[arg-type]
        drain.start()
        with pytest.raises(RuntimeError, match="broker gone"):
            await drain.take(0.2)
        await drain.stop()

    asyncio.run(run())
