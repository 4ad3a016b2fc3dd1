"""Reading 100,000 fetched records through aiokafka's PartitionRecords, without and with
somnus.streams.kafka_compat.decompression (its bounded codecs and its batch guard), alternated 7
times each: microseconds per record, medians.
Usage (from the repository root): PYTHONPATH=. .venv/bin/python tools/bench_batch_guard.py"""

import importlib
import statistics
import time

from aiokafka.consumer.fetcher import PartitionRecords
from aiokafka.record.memory_records import MemoryRecords
from aiokafka.structs import TopicPartition

from somnus.streams.kafka_compat import decompression as dc
from tests.factories import record_batch

ORIGINAL = {
    (name, c): getattr(importlib.import_module(name), c)
    for name in dc.READERS
    for c in dc.CODECS
    if hasattr(importlib.import_module(name), c)
}
INIT = PartitionRecords.__init__


def unpatch() -> None:
    for (name, c), fn in ORIGINAL.items():
        setattr(importlib.import_module(name), c, fn)
    PartitionRecords.__init__ = INIT


def run(raw: bytes) -> float:
    t = time.perf_counter()
    pr = PartitionRecords(TopicPartition("t", 0), MemoryRecords(raw), [], 0, None, None, True, 0)
    n = sum(1 for _ in pr)
    return (time.perf_counter() - t) / n * 1e6


for codec, per in ((0, 1), (0, 100), (4, 100), (1, 100)):
    values = [b'{"agent":"a","seq":%d,"payload":{"text":"hello world"}}' % i for i in range(per)]
    raw = b"".join(record_batch(codec, values, i * per) for i in range(100_000 // per))
    without, with_ = [], []
    for _ in range(7):
        unpatch()
        without.append(run(raw))
        dc.bound_decompression()
        with_.append(run(raw))
    unpatch()
    print(
        f"codec {codec} records/batch {per}: without {statistics.median(without):.3f} us/record, "
        f"with {statistics.median(with_):.3f}"
    )
