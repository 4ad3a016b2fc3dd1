"""somnus.streams.kafka_compat.decompression: bounded codecs that agree with aiokafka's below the bound,
a compression bomb read as one unreadable record, and what the patch relies on still exists."""

from __future__ import annotations

import importlib
import subprocess
import sys
from collections.abc import Iterator

import cramjam
import pytest
from aiokafka import codec as aiokafka_codec
from aiokafka.consumer.fetcher import PartitionRecords
from aiokafka.record.memory_records import MemoryRecords
from aiokafka.structs import TopicPartition
from hypothesis import given, settings
from hypothesis import strategies as st

from somnus.schemas.codec import UNREADABLE_MAGIC, check_json
from somnus.streams.kafka_compat import decompression as dc
from tests.factories import record_batch

MIB = 1 << 20
GZIP, SNAPPY, LZ4, ZSTD = 1, 2, 3, 4
ENCODERS = {
    "gzip": aiokafka_codec.gzip_encode,
    "snappy": aiokafka_codec.snappy_encode,
    "snappy-xerial": lambda b: aiokafka_codec.snappy_encode(b, xerial_compatible=True, xerial_blocksize=4096),
    "lz4": aiokafka_codec.lz4_encode,
    "zstd": aiokafka_codec.zstd_encode,
}
DECODERS = {
    "gzip": (dc.gzip_decode, aiokafka_codec.gzip_decode),
    "snappy": (dc.snappy_decode, aiokafka_codec.snappy_decode),
    "snappy-xerial": (dc.snappy_decode, aiokafka_codec.snappy_decode),
    "lz4": (dc.lz4_decode, aiokafka_codec.lz4_decode),
    "zstd": (dc.zstd_decode, aiokafka_codec.zstd_decode),
}


@pytest.fixture
def bounded() -> Iterator[None]:
    """The patch applied with a 1 MiB bound, and aiokafka as it was afterwards (it is process-wide)."""
    saved = {
        (name, c): getattr(importlib.import_module(name), c)
        for name in dc.READERS
        for c in dc.CODECS
        if hasattr(importlib.import_module(name), c)
    }
    init, limit = PartitionRecords.__init__, dc._Bound.limit
    dc.bound_decompression(MIB)
    try:
        yield
    finally:
        for (name, c), fn in saved.items():
            setattr(importlib.import_module(name), c, fn)
        PartitionRecords.__init__ = init  # type: ignore[method-assign]
        dc._Bound.limit = limit


@settings(max_examples=40, deadline=None)
@given(codec=st.sampled_from(sorted(ENCODERS)), payload=st.binary(max_size=20_000), repeat=st.integers(1, 40))
def test_below_the_bound_each_codec_decodes_as_aiokafkas_does(codec, payload, repeat):
    data = ENCODERS[codec](payload * repeat)
    ours, theirs = DECODERS[codec]
    try:
        expected = theirs(data)
    except Exception:  # aiokafka cannot read it either (snappy's empty xerial stream)
        with pytest.raises((dc.BatchTooLarge, cramjam.DecompressionError)):
            ours(data)
        return
    assert ours(data) == expected == payload * repeat


@pytest.mark.parametrize("codec", sorted(ENCODERS))
def test_past_the_bound_each_codec_raises_batch_too_large(bounded, codec):
    ours, _ = DECODERS[codec]
    assert len(ours(ENCODERS[codec](b"a" * (MIB - 10)))) == MIB - 10
    with pytest.raises(dc.BatchTooLarge, match="more than 1048576 bytes"):
        ours(ENCODERS[codec](b"a" * (3 * MIB)))


@pytest.mark.parametrize("codec", ["gzip", "lz4", "zstd", "snappy", "snappy-xerial"])
def test_a_corrupt_stream_is_batch_too_large_with_its_reason(bounded, codec):
    data = bytearray(ENCODERS[codec](b"hello world " * 1000))
    data[len(data) // 2 :] = b"\xff" * (len(data) - len(data) // 2)
    with pytest.raises(dc.BatchTooLarge):
        DECODERS[codec][0](bytes(data))


def test_a_bomb_is_refused_without_allocating_it():
    """512 MiB of zeros (16 KB of zstd) against a 8 MiB bound: the process never holds the output."""
    code = (
        "import resource, cramjam\n"
        "from somnus.streams.kafka_compat import decompression as dc\n"
        "c = cramjam.zstd.Compressor()\n"
        "for _ in range(512): c.compress(bytes(1 << 20))\n"
        "bomb = bytes(c.finish())\n"
        "dc.bound_decompression(8 << 20)\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "try:\n"
        "    dc.zstd_decode(bomb)\n"
        "except dc.BatchTooLarge as exc:\n"
        "    print(len(bomb), (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024, exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    size, grew_mb, *reason = out.stdout.split()
    assert int(size) < 64 * 1024 and int(grew_mb) < 64, out.stdout
    assert " ".join(reason).startswith("decompresses to more than 8388608 bytes")


def _read(raw: bytes) -> tuple[list, int]:
    pr = PartitionRecords(TopicPartition("traces", 0), MemoryRecords(raw), [], 0, None, None, True, 0)
    records = list(pr)
    return records, pr.next_fetch_offset


@pytest.mark.parametrize("codec", [GZIP, SNAPPY, LZ4, ZSTD], ids=["gzip", "snappy", "lz4", "zstd"])
def test_a_batch_over_the_bound_is_one_unreadable_record_at_its_last_offset(bounded, codec):
    raw = (
        record_batch(codec, [b'{"a":1}', b'{"b":2}'], 0)
        + record_batch(codec, [b"x", b"\0" * (2 * MIB), b"y"], 2)
        + record_batch(0, [b'{"c":3}'], 5)
        + record_batch(codec, [b'{"d":4}'], 6)
    )
    records, next_offset = _read(raw)
    assert [r.offset for r in records] == [0, 1, 4, 5, 6]
    assert [r.value for r in records if r.offset != 4] == [b'{"a":1}', b'{"b":2}', b'{"c":3}', b'{"d":4}']
    bomb = records[2]
    assert bomb.value.startswith(UNREADABLE_MAGIC) and bomb.key is None and bomb.headers == ()
    assert check_json(bomb.value) == (
        "undecodable: record batch at offsets 2-4: decompresses to more than 1048576 bytes (SOMNUS_MAX_BATCH_BYTES)"
    )
    assert next_offset == 7


def test_without_the_patch_the_same_batch_is_decompressed_whole():
    """What the patch guards against: aiokafka alone decompresses the 2 MiB batch (the bound is ours).
    In a fresh process: a worker app made by another test applies the patch to this one."""
    code = (
        "from aiokafka.consumer.fetcher import PartitionRecords\n"
        "from aiokafka.record.memory_records import MemoryRecords\n"
        "from aiokafka.structs import TopicPartition\n"
        "from tests.factories import record_batch\n"
        "raw = record_batch(4, [bytes(2 << 20)], 0)\n"
        "pr = PartitionRecords(TopicPartition('t', 0), MemoryRecords(raw), [], 0, None, None, True, 0)\n"
        "print(getattr(PartitionRecords.__init__, '_somnus_guarded', False), [len(r.value) for r in pr])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", f"[{2 * MIB}]"]


def test_readers_are_batches_whose_attributes_the_patch_reads():
    """What ``GuardedRecords`` and ``UnreadableRecord`` read of aiokafka's batches and readers."""
    batch = MemoryRecords(record_batch(ZSTD, [b"v"], 3)).next_batch()
    for attr in (
        "compression_type",
        "is_control_batch",
        "base_offset",
        "next_offset",
        "max_timestamp",
        "timestamp_type",
    ):
        assert hasattr(batch, attr), attr
    assert (batch.base_offset, batch.next_offset) == (3, 4)
    for name in dc.READERS[:2]:
        module = importlib.import_module(name)
        assert any(hasattr(module, c) for c in dc.CODECS), name
    assert hasattr(PartitionRecords, "_unpack_records")


def test_the_bound_must_be_at_least_a_mebibyte():
    with pytest.raises(ValueError, match="at least 1 MiB"):
        dc.bound_decompression(1000)


def test_importing_the_publishing_client_leaves_decompression_unbounded():
    code = (
        "import somnus.client\n"
        "from aiokafka.consumer.fetcher import PartitionRecords\n"
        "import aiokafka.record.default_records as d\n"
        "print(getattr(PartitionRecords.__init__, '_somnus_guarded', False), d.zstd_decode.__module__)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "aiokafka.codec"]


def test_apply_bounds_decompression_once():
    code = (
        "import somnus.streams.kafka_compat as k\n"
        "from aiokafka.consumer.fetcher import PartitionRecords\n"
        "import aiokafka.record._crecords.default_records as c\n"
        "k.apply(); k.apply(2 << 20)\n"
        "init = PartitionRecords.__init__\n"
        "print(init._somnus_guarded, getattr(init._somnus_original, '_somnus_guarded', False),"
        " c.zstd_decode.__module__, k.decompression._Bound.limit)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "False", "somnus.streams.kafka_compat.decompression", str(2 << 20)]


def test_cramjam_refuses_to_write_past_the_buffer_it_is_given():
    """The bound relies on ``decompress_into`` failing, not growing, when the output does not fit."""
    buf = bytearray(1024)
    with pytest.raises(cramjam.DecompressionError, match="whole buffer"):
        cramjam.zstd.decompress_into(cramjam.zstd.compress(b"\0" * 4096), buf)
