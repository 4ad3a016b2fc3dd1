"""aiokafka decompresses a fetched record batch whole, with no bound: ``bound_decompression`` caps it,
and reads a batch over the cap as one unreadable record that the decode boundaries dead-letter.

Why: zstd turns 50 MiB of zeros into 1.6 KB, so one batch the broker accepts (``message.max.bytes``,
10 MiB compressed) can expand to hundreds of GB in the consumer. The broker validates such a batch by
streaming through it, and stores it. The worker or the projector that fetches it is killed for memory,
restarts at the same offset and is killed again: ingest stops.

What it does, once per process (idempotent):

- The codec functions aiokafka's record readers call (``gzip_decode``, ``snappy_decode``,
  ``lz4_decode``, ``zstd_decode`` in the Cython and the pure-Python readers) are replaced by bounded
  ones that raise ``BatchTooLarge`` past ``limit`` bytes of output, without allocating more than that.
- Every compressed batch a ``PartitionRecords`` reads is wrapped: a batch that fails to decompress
  is read as one record at the batch's last offset, with ``UNREADABLE_MAGIC`` and the reason as its
  value. ``check_json`` rejects that value with the reason, so the batch becomes one dead letter
  naming its offsets, and the consumer goes on after it. The batch itself stays in its topic.

Relies on ``aiokafka.consumer.fetcher.PartitionRecords.__init__`` setting ``_records`` before its
lazy ``_unpack_records`` generator starts, on the batch attributes that generator reads, and on the
codec names of the record modules (``tests/streams/kafka_compat/test_decompression.py``). No upstream
issue found; it can go when aiokafka bounds decompression itself.
"""

from __future__ import annotations

import importlib
import io
import zlib
from collections.abc import Iterator
from typing import Any

import cramjam
import numpy as np
from aiokafka.codec import _detect_xerial_stream
from aiokafka.consumer.fetcher import PartitionRecords

from somnus.schemas.codec import UNREADABLE_MAGIC

DEFAULT_LIMIT = 64 << 20  # twice the largest batch Somnus's own producers make (32 MiB records)

# The modules whose module-level codec names aiokafka's record readers call.
READERS = (
    "aiokafka.record.default_records",
    "aiokafka.record.legacy_records",
    "aiokafka.record._crecords.default_records",
    "aiokafka.record._crecords.legacy_records",
)
CODECS = ("gzip_decode", "snappy_decode", "lz4_decode", "zstd_decode")


class BatchTooLarge(ValueError):
    """A record batch decompresses to more than the limit, or its compressed stream is corrupt."""


class _Bound:
    limit = DEFAULT_LIMIT


def _over(limit: int) -> BatchTooLarge:
    return BatchTooLarge(f"decompresses to more than {limit} bytes (SOMNUS_MAX_BATCH_BYTES)")


def gzip_decode(payload: Any) -> bytes:
    """gzip, every member, at most the limit."""
    limit = _Bound.limit
    data, out, size = bytes(payload), [], 0
    while data:
        d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        try:
            chunk = d.decompress(data, limit - size + 1)
        except zlib.error as exc:
            raise BatchTooLarge(f"gzip stream is corrupt: {exc}") from None
        size += len(chunk)
        if size > limit or d.unconsumed_tail:
            raise _over(limit)
        if not d.eof:
            raise BatchTooLarge("gzip stream is truncated")
        out.append(chunk)
        data = d.unused_data
    return b"".join(out)


def _into(module: Any, data: bytes, limit: int) -> bytes:
    """``module.decompress_into`` with a buffer that grows fourfold until the output fits, up to
    ``limit``: cramjam fails rather than write past the buffer it is given."""
    size = min(limit, max(1 << 20, 16 * len(data)))
    while True:
        buf = np.empty(size, dtype=np.uint8)
        try:
            n = module.decompress_into(data, buf)
        except cramjam.DecompressionError as exc:
            if "whole buffer" not in str(exc):
                raise BatchTooLarge(f"{module.__name__.rpartition('.')[2]} stream is corrupt: {exc}") from None
            if size >= limit:
                raise _over(limit) from None
            size = min(limit, size * 4)
            continue
        if n < size:
            return buf[:n].tobytes()
        if size >= limit:  # filled exactly: more may follow
            raise _over(limit)
        size = min(limit, size * 4)


def zstd_decode(payload: Any) -> bytes:
    return _into(cramjam.zstd, bytes(payload), _Bound.limit)


def lz4_decode(payload: Any) -> bytes:
    return _into(cramjam.lz4, bytes(payload), _Bound.limit)


def _snappy_length(block: bytes) -> int:
    """The uncompressed length a raw snappy block declares (its leading varint)."""
    n = shift = 0
    for i, b in enumerate(block[:5]):
        n |= (b & 0x7F) << shift
        if not b & 0x80:
            return n
        shift += 7
        if i == 4:
            break
    raise BatchTooLarge("snappy block has no valid length")


def snappy_decode(payload: Any) -> bytes:
    """Raw snappy, or xerial-framed blocks as aiokafka reads them; each block's declared length is
    checked before it is decompressed (raw snappy states it)."""
    limit, data = _Bound.limit, bytes(payload)
    if _detect_xerial_stream(data):
        blocks, cursor = [], 16
        while cursor < len(data):
            size = int.from_bytes(data[cursor : cursor + 4], "big", signed=True)
            if size < 0 or cursor + 4 + size > len(data):
                raise BatchTooLarge("snappy stream is truncated")
            blocks.append(data[cursor + 4 : cursor + 4 + size])
            cursor += 4 + size
    else:
        blocks = [data]
    out, total = io.BytesIO(), 0
    for block in blocks:
        total += _snappy_length(block)
        if total > limit:
            raise _over(limit)
        try:
            out.write(bytes(cramjam.snappy.decompress_raw(block)))
        except cramjam.DecompressionError as exc:
            raise BatchTooLarge(f"snappy stream is corrupt: {exc}") from None
    return out.getvalue()


BOUNDED = {
    "gzip_decode": gzip_decode,
    "snappy_decode": snappy_decode,
    "lz4_decode": lz4_decode,
    "zstd_decode": zstd_decode,
}


class UnreadableRecord:
    """What a batch that fails to decompress is read as: one record at its last offset."""

    __slots__ = ("offset", "timestamp", "timestamp_type", "key", "value", "headers", "checksum")

    def __init__(self, batch: Any, reason: str) -> None:
        first, last = batch.base_offset, batch.next_offset - 1
        self.offset = last
        self.timestamp = getattr(batch, "max_timestamp", None) or getattr(batch, "first_timestamp", None) or -1
        self.timestamp_type = getattr(batch, "timestamp_type", 0) or 0
        self.key = None
        self.value = UNREADABLE_MAGIC + f"record batch at offsets {first}-{last}: {reason}".encode()
        self.headers: list[tuple[str, bytes]] = []
        self.checksum = None


class GuardedBatch:
    """A fetched batch whose records are those of ``batch``, or one ``UnreadableRecord`` when
    decompressing it fails. Everything else (CRC check, offsets, producer id) is ``batch``'s."""

    __slots__ = ("_batch",)

    def __init__(self, batch: Any) -> None:
        self._batch = batch

    def __getattr__(self, name: str) -> Any:
        return getattr(self._batch, name)

    def __iter__(self) -> Iterator[Any]:
        try:
            records = iter(self._batch)
            first = next(records)
        except StopIteration:
            return
        except Exception as exc:  # a boundary: whatever makes the batch unreadable is its dead letter
            reason = str(exc) if isinstance(exc, BatchTooLarge) else f"{type(exc).__name__}: {exc}"
            yield UnreadableRecord(self._batch, reason)
            return
        yield first
        # the batch is its own iterator, and iter() on it again asserts it has not started
        yield from iter(records.__next__, None)


class GuardedRecords:
    """``MemoryRecords`` whose compressed, non-control batches come out as ``GuardedBatch``es."""

    __slots__ = ("_records",)

    def __init__(self, records: Any) -> None:
        self._records = records

    def __getattr__(self, name: str) -> Any:
        return getattr(self._records, name)

    def has_next(self) -> bool:
        return bool(self._records.has_next())

    def next_batch(self) -> Any:
        batch = self._records.next_batch()
        if batch is None or batch.is_control_batch or not batch.compression_type:
            return batch
        return GuardedBatch(batch)


def bound_decompression(limit: int = DEFAULT_LIMIT) -> None:
    """Cap what one fetched record batch may decompress to at ``limit`` bytes, in every aiokafka
    consumer of this process (see the module's docstring). Idempotent; a later call sets the limit."""
    if limit < 1 << 20:
        raise ValueError(f"SOMNUS_MAX_BATCH_BYTES must be at least 1 MiB, not {limit}")
    _Bound.limit = limit
    for name in READERS:
        try:
            module = importlib.import_module(name)
        except ImportError:  # the Cython readers are optional in aiokafka
            continue
        for codec in CODECS:
            if hasattr(module, codec):
                setattr(module, codec, BOUNDED[codec])
    init = PartitionRecords.__init__
    if getattr(init, "_somnus_guarded", False):
        return

    def __init__(self: PartitionRecords, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        self._records = GuardedRecords(self._records)  # read by _unpack_records when first advanced

    __init__._somnus_guarded = True  # type: ignore[attr-defined]
    __init__._somnus_original = init  # type: ignore[attr-defined]
    PartitionRecords.__init__ = __init__
