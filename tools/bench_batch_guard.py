"""Reading 100,000 fetched records through aiokafka's PartitionRecords, without and with
somnus.streams.kafka_compat.decompression's guard: microseconds per record, median of 5.
Usage (from the repository root): PYTHONPATH=. .venv/bin/python tools/bench_batch_guard.py"""

import time
import statistics
from aiokafka.record.memory_records import MemoryRecords
from aiokafka.structs import TopicPartition
from aiokafka.consumer.fetcher import PartitionRecords
from somnus.streams.kafka_compat import decompression as dc
from tests.factories import record_batch


def batch(codec, n, base):
    return record_batch(codec, [b'{"agent":"a","seq":%d,"payload":{"text":"hello world"}}' % i for i in range(n)], base)


for codec, per in ((0, 1), (0, 100), (4, 100)):
    raw = b"".join(batch(codec, per, i * per) for i in range(100_000 // per))

    def run(raw: bytes = raw) -> float:
        t = time.perf_counter()
        pr = PartitionRecords(TopicPartition("t", 0), MemoryRecords(raw), [], 0, None, None, True, 0)
        n = sum(1 for _ in pr)
        return (time.perf_counter() - t) / n * 1e6

    base = [run() for _ in range(5)]
    dc.bound_decompression()
    pat = [run() for _ in range(5)]
    PartitionRecords.__init__ = PartitionRecords.__init__._somnus_original
    print(
        f"codec {codec} records/batch {per}: unpatched {statistics.median(base):.3f} us/record, patched {statistics.median(pat):.3f}"
    )
