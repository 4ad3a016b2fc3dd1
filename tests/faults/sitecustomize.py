"""A fault for integration tests, injected into a real worker process: put this folder first on the
worker's PYTHONPATH and set ``SOMNUS_FAULT_LOSE_RESTORE`` to a comma-separated list of changelog topic
suffixes (``sessions-changelog,working_memory-changelog``).

While a table is being restored, the records aiokafka hands Faust for a partition of such a topic
are dropped: aiokafka's position has moved past them and Faust never sees them. That is what a
survivor's stalled recovery showed (``somnus.streams.liveness``, fourth defect). The partition's records
are dropped until a fetch starts at an offset already dropped once: a seek back re-reads them.
Each drop is printed to the worker's log, so a test can tell that the fault happened.
"""

from __future__ import annotations

import os

_SUFFIXES = tuple(s for s in os.environ.get("SOMNUS_FAULT_LOSE_RESTORE", "").split(",") if s)

if _SUFFIXES:
    from faust.transport.drivers import aiokafka as _driver

    _fetch = _driver.AIOKafkaConsumerThread._fetch_records
    _dropped: dict[tuple[str, int], set[int]] = {}
    _healed: set[tuple[str, int]] = set()

    async def _fetch_records(self, consumer, active_partitions, timeout=None, max_records=None):  # type: ignore[no-untyped-def]
        records = await _fetch(self, consumer, active_partitions, timeout=timeout, max_records=max_records)
        if not getattr(self.app, "in_recovery", False):
            return records
        for tp in list(records):
            key = (tp.topic, tp.partition)
            if not tp.topic.endswith(_SUFFIXES) or key in _healed or not records[tp]:
                continue
            offsets = [r.offset for r in records[tp]]
            seen = _dropped.setdefault(key, set())
            if offsets[0] in seen:  # a seek back: from now on this partition is delivered
                _healed.add(key)
                print(f"FAULT: {tp.topic}[{tp.partition}] re-read from offset {offsets[0]}", flush=True)
                continue
            seen.update(offsets)
            del records[tp]
            print(
                f"FAULT: dropped {tp.topic}[{tp.partition}] offsets {offsets[0]}..{offsets[-1]} during recovery",
                flush=True,
            )
        return records

    _driver.AIOKafkaConsumerThread._fetch_records = _fetch_records  # type: ignore[method-assign]

# ``SOMNUS_FAULT_HIDE_TOPIC=<suffix>:<seconds>``: for its first ``seconds``, the process's Kafka clients
# see no partitions for topics ending with ``suffix``, as in the metadata of a broker just restarted
# (seen: a worker's group assignment computed then ignored the topic: "Ignoring missing topic").
_HIDE = os.environ.get("SOMNUS_FAULT_HIDE_TOPIC", "")
if _HIDE:
    import time as _time

    from aiokafka.cluster import ClusterMetadata as _Cluster

    _suffix, _seconds = _HIDE.rsplit(":", 1)
    _until = _time.monotonic() + float(_seconds)
    _partitions_for_topic = _Cluster.partitions_for_topic
    _announced: list[str] = []

    def partitions_for_topic(self, topic):  # type: ignore[no-untyped-def]
        if topic.endswith(_suffix) and _time.monotonic() < _until:
            if not _announced:
                _announced.append(topic)
                print(f"FAULT: hiding {topic} from the metadata for {_seconds} s", flush=True)
            return None
        return _partitions_for_topic(self, topic)

    _Cluster.partitions_for_topic = partitions_for_topic  # type: ignore[method-assign]
