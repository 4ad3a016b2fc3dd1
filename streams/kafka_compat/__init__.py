"""Every workaround Somnus carries for a defect of faust-streaming or aiokafka, in one place.

Nothing here is applied on import: ``somnus.client``, which agent runtimes import to publish,
leaves aiokafka as it is. The worker (``somnus.streams.worker`` and ``create_app``) and the projector
(``somnus.projections.projector``) call ``apply()`` for what is process-wide, and the worker's app is
a ``SomnusApp``, whose consumer carries the rest.

- ``metadata.track_topics_sent_to``: a producer's metadata refresh forgets topics it sends to
  (process-wide: patches ``AIOKafkaClient._wait_on_metadata``).
- ``decompression.bound_decompression``: a fetched record batch is decompressed whole, with no
  bound (process-wide: bounded codecs in aiokafka's record readers, and ``PartitionRecords`` reads a
  batch over the bound as one unreadable record, which becomes a dead letter).
- ``consumer``: ``SomnusApp``, ``RewindingTransport``, ``RewindingConsumer`` and
  ``RewindingConsumerThread``: partitions committed at 0 never rewound (aio-libs/aiokafka#1003), the
  livelock check asserting on a partition with no position, commits capped at what the state
  applied.
- ``signals``: mode's worker SIGUSR1/SIGUSR2 handlers pointed at the diagnostics dumps.
- ``offsets``: resetting Faust's consumer bookkeeping (``_acked``, ``_gap``, ``_read_offset``) where
  Somnus rewinds a partition (the watchdogs of ``somnus.streams.liveness``, the ordering guard).

Each module's docstring names the defect, the upstream issue when there is one, and how to tell
when the workaround can go. ``tests/streams/kafka_compat/`` fails when a private attribute one of
them relies on disappears; ``pyproject.toml`` pins faust-streaming and aiokafka to the minor
versions those tests ran on. Design notes: ``docs/kafka-workarounds.md``.
"""

from __future__ import annotations

from somnus.streams.kafka_compat.decompression import DEFAULT_LIMIT, bound_decompression
from somnus.streams.kafka_compat.metadata import track_topics_sent_to


def apply(max_batch_bytes: int = DEFAULT_LIMIT) -> None:
    """Apply the process-wide workarounds (``track_topics_sent_to``, ``bound_decompression``).
    Idempotent; called by the worker's and the projector's entry points before they make any Kafka
    client."""
    track_topics_sent_to()
    bound_decompression(max_batch_bytes)


__all__ = ["apply", "bound_decompression", "track_topics_sent_to"]
