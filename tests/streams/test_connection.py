"""The record limits every Kafka client shares (``somnus.streams.connection``)."""

from __future__ import annotations

import random

import orjson
from aiokafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder
from aiokafka.record.memory_records import MemoryRecords

from somnus.streams.connection import LARGE_RECORDS

BROKER_MESSAGE_MAX_BYTES = 10 << 20  # somnus/broker.py: message.max.bytes


def _promotion_like(n: int, seed: int) -> bytes:
    """JSON shaped like a promotion request's calls: ids, numbers and repeated tool text."""
    rng = random.Random(seed)
    tools = ["search_flights", "book_reservation", "get_user_details", "cancel_reservation"]
    return orjson.dumps(
        [
            {
                "call_id": f"c-{rng.getrandbits(64):016x}",
                "agent": f"agent-{rng.randrange(40)}",
                "tool": rng.choice(tools),
                "args_sig": f"{rng.getrandbits(32):08x}",
                "ok": rng.random() < 0.8,
                "at": 1.7e9 + rng.random() * 1e7,
            }
            for _ in range(n)
        ]
    )


def test_large_records_round_trip_under_the_broker_limit() -> None:
    """A ~7 MB record, compressed with LARGE_RECORDS' codec by aiokafka's own batch builder, fits the
    broker's message limit and reads back byte for byte (the codec's library is installed)."""
    codec = {"gzip": DefaultRecordBatch.CODEC_GZIP, "zstd": DefaultRecordBatch.CODEC_ZSTD}[
        LARGE_RECORDS["compression_type"]
    ]
    value = _promotion_like(55_000, seed=5)
    assert 6 << 20 < len(value) < LARGE_RECORDS["max_request_size"]
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=codec,
        is_transactional=False,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=LARGE_RECORDS["max_request_size"],
    )
    assert builder.append(0, timestamp=None, key=b"global", value=value, headers=[]) is not None
    wire = bytes(builder.build())
    assert len(wire) < BROKER_MESSAGE_MAX_BYTES // 3
    batch = MemoryRecords(wire).next_batch()
    assert batch is not None and batch.compression_type == codec
    assert [r.value for r in batch] == [value]
