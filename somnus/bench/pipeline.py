"""A fresh, isolated pipeline on the local broker for the benchmarks that run one, and the plain
aiokafka consume they are compared to."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

from somnus import broker as broker_mod
from somnus import procs
from somnus.config import Settings
from somnus.streams.connection import kafka_options


async def _wait_group_stable(bootstrap: str, group: str, timeout_s: float, members: int = 1) -> None:
    """Until ``group`` is stable with at least ``members`` members."""
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, **kafka_options())
    await admin.start()
    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                desc = await admin.describe_consumer_groups([group])
                groups = desc[0].groups if hasattr(desc[0], "groups") else desc
                g = groups[0]
                state = g[2] if isinstance(g, tuple) else getattr(g, "state", None)
                joined = g[5] if isinstance(g, tuple) else getattr(g, "members", [])
                if state == "Stable" and len(joined) >= members:
                    return
            except Exception:
                pass
            await asyncio.sleep(0.3)
        raise TimeoutError(f"consumer group {group} not stable with {members} members after {timeout_s}s")
    finally:
        await admin.close()


async def raw_consume(bootstrap: str, topic: str) -> tuple[int, int, float]:
    """A plain aiokafka consumer reading the whole topic, decoding every value with orjson (a sealed one
    opened first, with the keys of the key topic beside it: ``somnus.schemas.sealed``).

    Returns (records, events, seconds); a bundle record counts as the events it holds.
    """
    from aiokafka import AIOKafkaConsumer, TopicPartition

    from somnus.schemas.sealed import open_value
    from somnus.streams.keys import keys_topic_for, read_keys
    from somnus.streams.topics import partitions_of

    keys = (await read_keys(bootstrap, keys_topic_for(topic))).keys

    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=None,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        fetch_max_bytes=64 << 20,
        max_partition_fetch_bytes=16 << 20,
        **kafka_options(),
    )
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in await partitions_of(consumer, topic)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        end = await consumer.end_offsets(tps)
        records = events = 0
        t0 = time.perf_counter()
        while any([await consumer.position(tp) < end[tp] for tp in tps]):
            batch = await consumer.getmany(timeout_ms=500, max_records=20000)
            for rs in batch.values():
                for r in rs:
                    value = orjson.loads(open_value(r.value, keys))  # type: ignore[arg-type]
                    events += len(value) if isinstance(value, list) else 1
                records += len(rs)
        return records, events, time.perf_counter() - t0
    finally:
        await consumer.stop()


async def _delete_topics(bootstrap: str, topics: list[str]) -> None:
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, **kafka_options())
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        doomed = [t for t in existing if any(t.startswith(p) for p in topics)]
        if doomed:
            await admin.delete_topics(doomed)
    finally:
        await admin.close()


@contextlib.contextmanager
def isolated_pipeline(
    home: Path | None = None,
    partitions: int = 4,
    label: str = "bench",
    log: Any = None,
    bootstrap: str | None = None,
    workers: int = 1,
    **overrides: Any,
) -> Iterator[tuple[Settings, str]]:
    """A fresh pipeline on the local broker (started if needed, and then stopped afterwards unless
    ``SOMNUS_KEEP_BROKER=1``): its own topics, consumer group, state folder and DuckDB file, with
    ``workers`` workers (named as ``somnus up`` names them) and a projector running; removed afterwards
    (``SOMNUS_BENCH_KEEP=1`` keeps the folder and the topics). ``overrides`` replace settings (e.g.
    ``sleep_schedule``)."""
    from somnus.streams.topics import ensure_topics
    from somnus.supervisor import worker_names

    names = worker_names(workers)

    base = Settings.resolve(home=home, bootstrap=bootstrap)
    started_broker = base.bootstrap is None and broker_mod.status(base) is None
    boot = broker_mod.bootstrap_for(base, start_if_missing=True)
    run_id = uuid.uuid4().hex[:8]
    work = Path(tempfile.mkdtemp(prefix=f"somnus-{label}-{run_id}-"))
    s = dataclasses.replace(
        base,
        home=work,
        db_path=work / f"{label}.duckdb",
        bootstrap=boot,
        partitions=partitions,
        workers=workers,
        topic_prefix=f"{label}-{run_id}.",
        app_id=f"somnus-{label}-{run_id}",
        **overrides,
    )
    ensure_topics(s, boot)
    try:
        procs.spawn(s, boot, "projector")
        for name in names:
            procs.spawn(s, boot, "worker", name=name)
        asyncio.run(_wait_group_stable(boot, s.app_id, 120, members=workers))
        deadline = time.monotonic() + 60
        while not (Path(f"{s.db_path}.projector.json")).exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        yield s, boot
    finally:
        for role in (*names, "projector"):
            procs.stop(s, role)
        if not os.environ.get("SOMNUS_BENCH_KEEP"):
            asyncio.run(_delete_topics(boot, [s.topic_prefix, s.app_id]))
            shutil.rmtree(work, ignore_errors=True)
        if started_broker and not os.environ.get("SOMNUS_KEEP_BROKER"):
            broker_mod.stop(base)  # a JVM with a 768 MB heap: nothing of a run is left running


def python_loop_s(n: int = 10_000_000) -> float:
    """Seconds a plain CPython loop of ``n`` additions takes here, right now: the machine's speed for the
    kind of code the folds are, reported with every end-to-end run. The same code's CPU per event
    differed between sessions (worker 67 µs/event in the eighth, 121 in the ninth), and this loop
    varied 0.5-1.7 s within one quiet hour of the ninth: a figure to read the others by, not a
    correction to apply to them."""
    total = 0
    t0 = time.perf_counter()
    for i in range(n):
        total += i
    return round(time.perf_counter() - t0, 3)
