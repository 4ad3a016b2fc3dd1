"""End-to-end benchmark: publish N synthetic events through the real broker, worker and projector.

``events_per_s`` runs from the start of publishing until the projection has committed every event,
every episode, the facts extracted from every episode (``facts_per_s``: facts extracted and
folded into the triple log over the same span) and every causal-link update (``link_updates_per_s``:
the NAc agent has consumed every observation and the projector every update; the pipeline is idle); ``raw_consume_per_s`` is a plain aiokafka consume + orjson decode of the same
topic in the same run, the ceiling the pipeline is compared to (``ratio``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import shutil
import tempfile
import time
import uuid
from pathlib import Path
from collections.abc import Iterator
from typing import Any

import orjson

from somnus import broker as broker_mod
from somnus import procs
from somnus.config import Settings, kafka_options


async def _wait_group_stable(bootstrap: str, group: str, timeout_s: float) -> None:
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
                members = g[5] if isinstance(g, tuple) else getattr(g, "members", [])
                if state == "Stable" and members:
                    return
            except Exception:
                pass
            await asyncio.sleep(0.3)
        raise TimeoutError(f"consumer group {group} not stable after {timeout_s}s")
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

    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, auto_offset_reset="earliest",
                                enable_auto_commit=False, fetch_max_bytes=64 << 20,
                                max_partition_fetch_bytes=16 << 20, **kafka_options())
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
                    value = orjson.loads(open_value(r.value, keys))
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
def isolated_pipeline(home: Path | None = None, partitions: int = 4, label: str = "bench",
                      log: Any = None, bootstrap: str | None = None, **overrides: Any
                      ) -> Iterator[tuple[Settings, str]]:
    """A fresh pipeline on the local broker (started if needed, and then stopped afterwards unless
    ``SOMNUS_KEEP_BROKER=1``): its own topics, consumer group, state folder and DuckDB file, with a
    worker and a projector running; removed afterwards (``SOMNUS_BENCH_KEEP=1`` keeps the folder and
    the topics). ``overrides`` replace settings (e.g. ``sleep_schedule``)."""
    from somnus.streams.topics import ensure_topics

    base = Settings.resolve(home=home, bootstrap=bootstrap)
    started_broker = base.bootstrap is None and broker_mod.status(base) is None
    boot = broker_mod.bootstrap_for(base, start_if_missing=True)
    run_id = uuid.uuid4().hex[:8]
    work = Path(tempfile.mkdtemp(prefix=f"somnus-{label}-{run_id}-"))
    s = dataclasses.replace(base, home=work, db_path=work / f"{label}.duckdb", bootstrap=boot, partitions=partitions,
                            topic_prefix=f"{label}-{run_id}.", app_id=f"somnus-{label}-{run_id}", **overrides)
    ensure_topics(s, boot)
    try:
        procs.spawn(s, boot, "projector")
        procs.spawn(s, boot, "worker")
        asyncio.run(_wait_group_stable(boot, s.app_id, 120))
        deadline = time.monotonic() + 60
        while not (Path(f"{s.db_path}.projector.json")).exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        yield s, boot
    finally:
        for role in ("worker", "projector"):
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


def run_e2e(events: int, seed: int = 7, partitions: int = 4, bundle: int = 64, home: Path | None = None, log: Any = None,
            timeout_s: float = 1800.0) -> dict[str, Any]:
    from somnus.client import publish_async
    from somnus.reads import sql, status
    from somnus.sample import generate

    loop_s = python_loop_s()  # before anything of the run is started: the machine alone
    payloads = [orjson.dumps(e) for e in generate(events=events, seed=seed)]
    sessions = sum(1 for p in payloads if b'"type":"session_end"' in p)
    with isolated_pipeline(home, partitions) as (s, boot):
        if log:
            log.print(f"bench: {len(payloads)} events of {sessions} sessions, {partitions} partitions")
        pids = {"worker": procs.running(s, "worker"), "projector": procs.running(s, "projector"),
                "broker": getattr(broker_mod.status(Settings.resolve(home=home)), "pid", None)}
        pids = {role: pid for role, pid in pids.items() if pid}
        cpu0 = {role: procs.cpu_seconds(pid) for role, pid in pids.items()}
        t0, own0 = time.perf_counter(), time.process_time()
        asyncio.run(publish_async(payloads, boot, s.traces_topic, bundle_max=bundle))
        t_pub, own_pub = time.perf_counter() - t0, time.process_time() - own0
        deadline = time.monotonic() + timeout_s
        spine_s = None  # until events and episodes are committed (what the figure meant before facts)
        # Progress is read with one light query: the projector answers it, and `summary` (a count of
        # every table) four times a second took a fifth of its event loop thread's time (py-spy).
        progress = ("SELECT (SELECT count(*) FROM events), (SELECT count(*) FROM episodes), "
                    "(SELECT count(*) FROM knowledge_inputs)")
        while True:
            n_events, n_episodes, n_inputs = sql(Path(s.db_path), progress)["rows"][0]
            if spine_s is None and n_events >= len(payloads) and n_episodes >= sessions:
                spine_s = time.perf_counter() - t0
            if spine_s is not None and n_inputs >= sessions and status(s, boot)["idle"]:
                break  # every topic projected, the NAc caught up too
            if time.monotonic() > deadline:
                raise TimeoutError(f"projection incomplete after {timeout_s}s: {n_events} events, "
                                   f"{n_episodes} episodes, {n_inputs} knowledge inputs")
            time.sleep(0.25)
        elapsed = time.perf_counter() - t0
        # CPU each process used from the start of publishing to idle: where the 2 cores went.
        cpu = {role: round(procs.cpu_seconds(pid) - cpu0[role], 2) for role, pid in pids.items()}
        cpu["publisher"] = round(own_pub, 2)
        rss = {role: procs.peak_rss_mb(pid) for role, pid in pids.items() if role != "broker"}
        facts, triples, links, link_updates, memories = sql(Path(s.db_path), (
            "SELECT (SELECT sum(facts) FROM knowledge_inputs), (SELECT count(*) FROM triples), "
            "(SELECT count(*) FROM causal_links), (SELECT count(*) FROM causal_link_updates), "
            "(SELECT count(*) FROM memories)"))["rows"][0]
        records, raw_events, raw_s = asyncio.run(raw_consume(boot, s.traces_topic))
        raw = raw_events / raw_s
        eps = len(payloads) / elapsed
        return {"events": len(payloads), "records": records, "bundle_max": bundle, "sessions": sessions,
                "partitions": partitions,
                "publish_s": round(t_pub, 3), "elapsed_s": round(elapsed, 3),
                "events_per_s": round(eps, 1), "raw_consume_per_s": round(raw, 1), "ratio": round(eps / raw, 3),
                "facts": int(facts or 0), "triples": int(triples), "facts_per_s": round((facts or 0) / elapsed, 1),
                "causal_links": int(links), "link_updates": int(link_updates),
                "link_updates_per_s": round(link_updates / elapsed, 1), "memories": int(memories),
                "spine_elapsed_s": round(spine_s, 3), "spine_events_per_s": round(len(payloads) / spine_s, 1),
                "cpu_s": cpu, "cpu_us_per_event": {k: round(v / len(payloads) * 1e6, 1) for k, v in cpu.items()},
                "python_loop_10m_s": loop_s,
                "peak_rss_mb": rss}


def synthetic_triples(n: int, agents: int, teams: int, seed: int = 11) -> Any:
    """``n`` triples spread over ``agents`` agents in ``teams`` teams, as the projector stores them.

    Scopes: 70% an agent's own, 20% a team's, 10% global; a third are closed (superseded)."""
    import numpy as np
    import pyarrow as pa

    rng = np.random.default_rng(seed)
    kind = rng.random(n)
    owner = rng.integers(0, agents, n)
    scope = np.where(kind < 0.7, np.char.add("agent:a", owner.astype(str)),
                     np.where(kind < 0.9, np.char.add("team:t", (owner % teams).astype(str)), "global"))
    t0 = np.datetime64("2024-01-01T00:00:00", "us")
    valid_from = t0 + rng.integers(0, 365 * 86400, n).astype("timedelta64[s]")
    closed = rng.random(n) < 1 / 3
    valid_to = np.where(closed, valid_from + rng.integers(1, 86400 * 30, n).astype("timedelta64[s]"),
                        np.datetime64("NaT"))
    ids = [uuid.UUID(int=i + 1) for i in range(n)]
    return pa.table({
        "triple_id": pa.array([str(u) for u in ids]),
        "source": np.char.add("tool:t", rng.integers(0, 5000, n).astype(str)),
        "predicate": rng.choice(["uses", "failed_with", "depends_on", "rate_limit"], n),
        "target": np.char.add("error:e", rng.integers(0, 20000, n).astype(str)),
        "scope": scope,
        "confidence": rng.uniform(0.6, 1.0, n).round(4),
        "count": rng.integers(1, 50, n),
        "evidence": pa.array([str(u) for u in ids]),
        "valid_from": pa.array(valid_from, pa.timestamp("us", tz="UTC")),
        "valid_to": pa.array(valid_to, pa.timestamp("us", tz="UTC"), mask=~closed),
        "created_by": np.char.add("a", owner.astype(str)),
    })


def run_fact_query(triples: int = 1_000_000, agents: int = 200, teams: int = 20, queries: int = 1000,
                   limit: int = 50, seed: int = 11) -> dict[str, Any]:
    """p50/p95/p99 latency of the scope-chain fact query (KnowledgeStore.facts) over ``triples`` rows, as
    the projector serves it (the in-memory ``facts_top``), next to the same query in SQL over
    ``facts_top`` and over every triple (same answers, checked)."""
    import statistics

    import duckdb

    from somnus.projections import schema
    from somnus.projections.knowledge_store import DuckDBBackend, KnowledgeStore, TopFacts
    from somnus.agents import AgentSpec

    work = Path(tempfile.mkdtemp(prefix="somnus-bench-facts-"))
    try:
        con = duckdb.connect(str(work / "facts.duckdb"))
        schema.init(con)
        frame = synthetic_triples(triples, agents, teams, seed)  # noqa: F841
        t0 = time.perf_counter()
        con.execute("INSERT INTO triples SELECT triple_id::UUID, source, predicate, target, scope, confidence, count, "
                    "evidence::UUID, NULL, valid_from, valid_to, NULL, created_by, 'bench' FROM frame")
        schema.refresh_facts_top(con)  # what the projector keeps up to date batch by batch
        load_s = time.perf_counter() - t0
        specs = {f"a{i}": AgentSpec(name=f"a{i}", reports_to=f"t{i % teams}") for i in range(agents)}
        import random

        top = TopFacts()
        top.refresh(con)  # what the projector holds in memory and serves the plain query from

        def measure(use_top: bool, cached: bool) -> tuple[list[float], list[list[str]]]:
            store = KnowledgeStore(DuckDBBackend(con), specs, use_top=use_top, top=top if cached else None)
            rnd = random.Random(seed)
            store.facts("a0", limit=limit)  # warm up
            lat, answers = [], []
            for _ in range(queries):
                agent = f"a{rnd.randrange(agents)}"
                t = time.perf_counter()
                got = store.facts(agent, limit=limit)
                lat.append((time.perf_counter() - t) * 1000)
                answers.append([f.triple_id for f in got])
            return sorted(lat), answers

        lat, answers = measure(True, cached=True)
        sql, sql_answers = measure(True, cached=False)  # the same query as SQL over facts_top
        scan, scan_answers = measure(False, cached=False)  # ... and over every triple
        assert answers == sql_answers == scan_answers and all(len(a) == limit for a in answers)
        q, qq, qs = (statistics.quantiles(x, n=100) for x in (lat, sql, scan))
        con.close()
        return {"triples": triples, "agents": agents, "teams": teams, "queries": queries, "limit": limit,
                "load_s": round(load_s, 3), "p50_ms": round(q[49], 3), "p95_ms": round(q[94], 3),
                "p99_ms": round(q[98], 3), "max_ms": round(lat[-1], 3),
                "sql_p50_ms": round(qq[49], 3), "sql_p95_ms": round(qq[94], 3),
                "scan_p95_ms": round(qs[94], 3), "scan_over_top_p95": round(qs[94] / qq[94], 2)}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run_predict(links: int = 1_000_000, outcomes: int = 2, queries: int = 2000, seed: int = 5) -> dict[str, Any]:
    """p50/p95/p99 latency of ``predict`` (somnus.projections.causal.predict_from) with ``links`` causal links.

    The table holds ``links`` rows: ``links / outcomes`` event signatures with ``outcomes`` outcomes
    each, plus their tools' rows. Queries ask for calls that exist (a random signature's tool and
    arguments are not kept, so the query goes by signature through the same lookup as predict)."""
    import random
    import statistics

    import duckdb
    import numpy as np
    import pyarrow as pa

    from somnus.projections import schema
    from somnus.projections.causal import link_states
    from somnus.processors.prediction.causal_links import predict

    work = Path(tempfile.mkdtemp(prefix="somnus-bench-predict-"))
    try:
        con = duckdb.connect(str(work / "links.duckdb"))
        schema.init(con)
        rng = np.random.default_rng(seed)
        n_events = links // outcomes
        sigs = np.char.mod("%016x", rng.integers(0, 2**62, n_events, dtype=np.int64))
        tools = np.char.add("tool_", rng.integers(0, 2000, n_events).astype(str))
        frame = pa.table({  # noqa: F841
            "event_signature": np.repeat(sigs, outcomes), "outcome_signature": np.tile(
                np.char.mod("%016x", np.arange(outcomes)), n_events),
            "level": np.full(n_events * outcomes, "call"), "tool": np.repeat(tools, outcomes),
            "outcome": np.tile(np.array(["ok"] + [f"error:e{i}" for i in range(1, outcomes)]), n_events),
            "valence": np.tile(np.array(["positive"] + ["negative"] * (outcomes - 1)), n_events),
            "strength": rng.random(n_events * outcomes), "observations": rng.integers(1, 50, n_events * outcomes),
            "event_observations": np.repeat(rng.integers(50, 100, n_events), outcomes),
            "confidence": rng.random(n_events * outcomes),
            "updated_at": pa.array(np.full(n_events * outcomes, np.datetime64("2024-05-01T00:00:00", "us")),
                                   pa.timestamp("us", tz="UTC"))})
        t0 = time.perf_counter()
        con.execute("INSERT INTO causal_links SELECT * FROM frame")
        load_s = time.perf_counter() - t0
        rnd = random.Random(seed)
        lat = []
        for i in range(queries + 50):
            j = rnd.randrange(n_events)
            sig = str(sigs[j])
            t = time.perf_counter()
            states = link_states(con, [sig, "0" * 16])  # the call and its tool, as predict_from asks
            got = predict({str(sig): states[sig]} if sig in states else {}, str(tools[j]), None)
            if i >= 50:  # after a warm-up
                lat.append((time.perf_counter() - t) * 1000)
            assert states[sig].observations > 0 and got is not None
        q = statistics.quantiles(lat, n=100)
        con.close()
        return {"links": links, "event_signatures": n_events, "queries": queries, "load_s": round(load_s, 3),
                "p50_ms": round(q[49], 3), "p95_ms": round(q[94], 3), "p99_ms": round(q[98], 3)}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run_scn_footprint(memories: int = 10_000, seed: int = 42) -> dict[str, Any]:
    """Bytes the SCN index takes for ``memories`` episodes of the sample fleet (the projector's table).

    Measured as the growth of a DuckDB file holding only ``temporal_bins`` after a checkpoint, next
    to the same cells encoded as msgpack (the densest plain encoding)."""
    import duckdb
    import msgspec
    import pyarrow as pa

    from somnus.processors.sessions.distiller import distill
    from somnus.processors.prediction.rhythms import index_of, marks_of_episode
    from somnus.projections import schema
    from somnus.schemas.codec import decode_trace
    from somnus.sample import generate

    events = [decode_trace(orjson.dumps(e), 1 << 20) for e in generate(sessions=memories, seed=seed)]
    episodes = distill({}, events).episodes
    marks = [m for ep in episodes for m in marks_of_episode(ep)]
    t0 = time.perf_counter()
    deltas = index_of(marks).deltas()
    index_s = time.perf_counter() - t0
    work = Path(tempfile.mkdtemp(prefix="somnus-bench-scn-"))
    try:
        sizes = []
        for fill in (False, True):
            path = work / f"scn-{fill}.duckdb"
            con = duckdb.connect(str(path))
            schema.init(con)
            if fill:
                frame = pa.Table.from_pylist([msgspec.structs.asdict(d) for d in deltas])  # noqa: F841
                con.execute("INSERT INTO temporal_bins SELECT agent, kind, bin_kind, bin, count, successes, failures "
                            "FROM frame")
            con.execute("CHECKPOINT")
            con.close()
            sizes.append(path.stat().st_size)
        packed = len(msgspec.msgpack.encode([msgspec.structs.astuple(d) for d in deltas]))
        return {"memories": len(episodes), "marks": len(marks), "cells": len(deltas),
                "duckdb_bytes": sizes[1] - sizes[0], "msgpack_bytes": packed,
                "marks_per_s": round(len(marks) / index_s, 1)}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / (1 << 20)


def _synthetic_index(units: int, agents: int, seed: int) -> tuple[Any, Any, list[str], list[str], float, float]:
    """``units`` synthetic memory units: 10-25 words from a Zipf vocabulary of 30,000, one person and one
    tool each, runs of 20, spread over ``agents`` agents. Returns (index, rng, vocab, people, build s, MiB)."""
    from datetime import datetime, timedelta, timezone

    import numpy as np

    from somnus.processors.episodic.index import IndexConfig, MemoryIndex
    from somnus.projections.memory import stemmer
    from somnus.schemas.memory import MemoryKind, MemoryUnit

    rng = np.random.default_rng(seed)
    vocab = [f"word{i}" for i in range(30_000)]
    people = [f"person{i}" for i in range(300)]
    t0 = datetime(2024, 1, 1, tzinfo=timezone.utc)
    words = rng.choice(len(vocab), size=(units, 24), p=_zipf(len(vocab)))
    lens = rng.integers(10, 25, units)
    rss0 = _rss_mib()
    index = MemoryIndex(IndexConfig(stem=stemmer()))
    start = time.perf_counter()
    for i in range(units):
        agent = f"agent{i % agents}"
        index.add(MemoryUnit(
            memory_id=f"m{i}", kind=MemoryKind.MESSAGE, agent=agent, scope=f"agent:{agent}", run_id=f"r{i // 20}",
            position=i % 20, occurred_at=t0 + timedelta(minutes=i),
            perception=" ".join(vocab[w] for w in words[i, :lens[i]]), people=[people[i % 300]],
            tools=[f"tool_{i % 60}"]))
    return index, rng, vocab, people, time.perf_counter() - start, _rss_mib() - rss0


def _zipf(n: int) -> Any:
    import numpy as np

    p = 1.0 / np.arange(1, n + 1) ** 1.05
    return p / p.sum()


def _queries(rng: Any, vocab: list[str], people: list[str], n: int) -> list[str]:
    qw = rng.choice(len(vocab), size=(n, 6), p=_zipf(len(vocab)))
    return [" ".join(vocab[w] for w in qw[q, : 3 + q % 4]) + (f" {people[q % 300]}" if q % 3 == 0 else "")
            for q in range(n)]


def run_recall(units: int = 100_000, queries: int = 300, agents: int = 50, seed: int = 7) -> dict[str, Any]:
    """Recall latency and memory with ``units`` synthetic memory units in the index (``_synthetic_index``);
    queries: 3-6 words, a third naming a person; ``recall(k=10)`` as the projector serves it (stemmed
    BM25, LSH, graph, importance, fused), for a rotating agent."""
    import statistics
    from datetime import datetime, timedelta, timezone

    from somnus.processors.episodic.recall import recall

    index, rng, vocab, people, build_s, rss = _synthetic_index(units, agents, seed)
    texts = _queries(rng, vocab, people, queries)
    now = datetime(2024, 1, 1, tzinfo=timezone.utc) + timedelta(days=400)
    lat = []
    for q in range(queries + 20):
        t = time.perf_counter()
        recall(index, texts[q % queries], f"agent{(q * 7) % agents}", k=10, now=now)
        if q >= 20:  # after a warm-up
            lat.append((time.perf_counter() - t) * 1000)
    qs = statistics.quantiles(lat, n=100)
    return {"units": units, "agents": agents, "queries": queries, "build_s": round(build_s, 1),
            "build_us_per_unit": round(1e6 * build_s / units, 1), "p50_ms": round(qs[49], 2),
            "p95_ms": round(qs[94], 2), "p99_ms": round(qs[98], 2), "rss_mib": round(rss, 1),
            "mib_per_100k_units": round(rss * 100_000 / units, 1)}


def run_context(units: int = 100_000, queries: int = 200, messages: int = 5000, agents: int = 50,
                seed: int = 7) -> dict[str, Any]:
    """Working-memory buffer add latency (``messages`` adds to one session, default settings: overflow
    summaries and rotation included), and ``get_context`` latency with ``units`` memory units behind the
    recall tier, a full buffer (50 messages, 500 summaries), a synopsis and a knowledge tier of 20 facts."""
    import statistics
    from datetime import datetime, timedelta, timezone

    from somnus.processors.briefing.context import Tier, get_context
    from somnus.processors.episodic.recall import recall
    from somnus.processors.working.synopsis import SynopsisCache
    from somnus.processors.working.session_buffer import DEFAULT_SETTINGS, add, message
    from somnus.schemas.working_memory import ContextCandidate, Role, UserMemory, WorkingMemoryState
    from somnus.schemas.memory import MemoryKind

    index, rng, vocab, people, build_s, _ = _synthetic_index(units, agents, seed)
    t0 = datetime(2024, 1, 1, tzinfo=timezone.utc)
    texts = _queries(rng, vocab, people, max(queries, 50))
    state = WorkingMemoryState(agent="agent0", session_id="s0")
    add_lat = []
    for i in range(messages):
        msg = message(i, t0 + timedelta(seconds=i), Role.USER if i % 2 == 0 else Role.AGENT,
                      " ".join(texts[(i * 13) % len(texts)].split() * 3))
        t = time.perf_counter()
        state, _ = add(state, msg, DEFAULT_SETTINGS)
        add_lat.append((time.perf_counter() - t) * 1000)
    now = t0 + timedelta(days=400)
    synopsis = SynopsisCache().get("u1", now, lambda u: [
        UserMemory(user_id=u, kind=MemoryKind.MESSAGE, text=texts[j], observed_at=t0 + timedelta(hours=j),
                   source_id=f"x{j}") for j in range(50)])
    facts = [ContextCandidate(text=f"tool_{j} failed_with error_{j}", score=1 - j / 40, source_id=f"t{j}")
             for j in range(20)]

    def episodic(q: str, a: str, u: Any, k: int) -> list[ContextCandidate]:
        got = recall(index, q, a, k=k, now=now)
        return [ContextCandidate(text=h.unit.perception, score=h.score, source_id=h.memory_id) for h in got.hits]

    tiers = [Tier("episodic", episodic), Tier("knowledge", lambda q, a, u, k: facts[:k], weight=0.5)]
    ctx_lat = []
    for q in range(queries + 10):
        t = time.perf_counter()
        get_context(texts[q % len(texts)], "agent0", "u1", 4000, tiers=tiers, buffer=state, synopsis=synopsis)
        if q >= 10:
            ctx_lat.append((time.perf_counter() - t) * 1000)
    aq, cq = statistics.quantiles(add_lat, n=100), statistics.quantiles(ctx_lat, n=100)
    return {"units": units, "build_s": round(build_s, 1), "buffer_adds": messages,
            "buffer_summaries": len(state.summaries), "add_p50_ms": round(aq[49], 4), "add_p99_ms": round(aq[98], 3),
            "context_queries": queries, "context_p50_ms": round(cq[49], 2), "context_p95_ms": round(cq[94], 2)}


def _probe_session(agent: str, n: int, marker: str, at: Any) -> list[dict[str, Any]]:
    """A short failing session of ``agent`` whose failure lesson carries ``marker``."""
    from datetime import timedelta

    sid = f"{agent}-probe-{n}"
    base = {"schema_version": 1, "agent": agent, "session_id": sid}
    kinds = [("session_start", {"task": f"probe {n}"}),
             ("tool_call", {"tool": "fetch", "call_id": "c0", "args": {"n": n}}),
             ("tool_result", {"call_id": "c0", "tool": "fetch", "ok": False, "error": f"Error: {marker}"}),
             ("session_end", {"outcome": "failure"})]
    return [{**base, "event_id": str(uuid.uuid5(uuid.NAMESPACE_URL, f"{sid}/{i}")),
             "ts": (at + timedelta(seconds=i)).isoformat(), "seq": i, "type": t, "payload": p}
            for i, (t, p) in enumerate(kinds)]


def _probe_runtime(boot: str, topic: str, t_start: Any, asks: Any, publish_times: Any) -> None:
    """Publishes the probe sessions asked for on ``asks`` (agent, n, marker) until None, and reports
    when each publish call began (the acknowledgement is part of the measured time)."""
    from somnus.client import Publisher

    with Publisher(boot, topic) as runtime:
        while (ask := asks.get()) is not None:
            agent, n, marker = ask
            t0 = time.monotonic()  # CLOCK_MONOTONIC: the same clock in every process
            runtime.send(_probe_session(agent, n, marker, t_start))
            publish_times.put((marker, t0))


def _fleet_load(boot: str, topic: str, rate: float, duration_s: float, stop: Any, ready: Any, sent: Any) -> None:
    """The sample fleet published at ``rate`` events/s in 0.1 s slices until ``stop`` (a process of its own;
    ``ready`` is set once the events are generated and the producer is connected)."""
    from somnus.client import Publisher
    from somnus.sample import generate

    events = generate(events=int(rate * duration_s * 1.5), seed=3)
    per = max(1, int(rate / 10))
    with Publisher(boot, topic) as runtime:
        ready.set()
        while not stop.is_set():
            t = time.monotonic()
            chunk = [e for _, e in zip(range(per), events)]
            if not chunk:
                return
            runtime.send(chunk)
            with sent.get_lock():
                sent.value += len(chunk)
            time.sleep(max(0.0, 0.1 - (time.monotonic() - t)))


def _floor_server(body: bytes, ports: Any) -> None:
    """The least an HTTP server in Python can do (the bench's floor): every request on a connection,
    answered with the same ``body`` by an asyncio protocol, no routing and no parsing beyond the end
    of the headers. In a session of its own, as the briefing server is (a process of its own)."""
    os.setsid()
    head = f"HTTP/1.1 200 OK\r\nContent-Type: application/json; charset=utf-8\r\nContent-Length: {len(body)}\r\n\r\n"
    answer = head.encode() + body

    class Protocol(asyncio.Protocol):
        def connection_made(self, transport: Any) -> None:
            self.transport, self.buffer = transport, b""

        def data_received(self, data: bytes) -> None:
            self.buffer += data
            while b"\r\n\r\n" in self.buffer:
                _, self.buffer = self.buffer.split(b"\r\n\r\n", 1)
                self.transport.write(answer)

    async def serve() -> None:
        server = await asyncio.get_running_loop().create_server(Protocol, "127.0.0.1", 0)
        ports.put(server.sockets[0].getsockname()[1])
        await server.serve_forever()

    asyncio.run(serve())


def run_briefing(agents: int = 10_000, rate: float = 1000.0, duration_s: float = 60.0, probes: int = 60,
                 home: Path | None = None, log: Any = None, sleep_schedule: str = "off",
                 read_rate: float = 0.0) -> dict[str, Any]:
    """Briefing reads under ingest: p99 of ``GET /agents/{agent}/briefing`` with ``agents`` briefings
    cached while the sample fleet is published at ``rate`` events/s, and the publish -> updated
    briefing latency of probe sessions published during that load.

    The load and the probes are published by processes of their own (as runtimes do). Reads rotate between one
    kept-alive connection (``read_*``, as an HTTP client's pool does) and a new connection each
    (``read_new_connection_*``), both to where ``somnus.reads`` sends them (the briefing server), and
    a kept-alive connection to a floor server (``floor_read_*``, ``_floor_server``: a briefing's bytes
    from the least a Python HTTP server can do, in a process of its own, under the same load in the same
    run: what this machine allows); back to back, or ``read_rate`` a second.

    Scheduled sleep is off by default: at 1,000 events/s the sample fleet's stream time passes a day
    in about 20 s, so the nightly sleep and the promotion after it (seconds each, inline in the
    projector's batches) would run every 20 s instead of once a day. ``sleep_schedule`` turns it on."""
    import http.client
    import multiprocessing
    import random
    import statistics
    import urllib.parse
    import urllib.request
    from datetime import datetime, timezone

    from somnus.client import publish
    from somnus.reads import read, status

    t_start = datetime(2025, 1, 6, 9, tzinfo=timezone.utc)
    with isolated_pipeline(home, label="brief", log=log, sleep_schedule=sleep_schedule) as (s, boot):
        db = Path(s.db_path)  # type: ignore[arg-type]
        fill = [e for i in range(agents) for e in _probe_session(f"agent-{i:05d}", 0, f"fill {i}", t_start)]
        publish(fill, boot, s.traces_topic)
        deadline = time.monotonic() + 1800
        while not status(s, boot)["idle"]:
            if time.monotonic() > deadline:
                raise TimeoutError("the cache did not fill in 30 minutes")
            time.sleep(1)
        cached = read(db, "sql", sql="SELECT count(*) FROM briefings WHERE markdown <> ''")["rows"][0][0]
        from somnus.reads import _endpoint, auth_headers

        port = urllib.parse.urlsplit(_endpoint(db, "briefing")).port  # where somnus.reads sends briefing reads
        auth = auth_headers(db)  # the operator's bearer token, as somnus.reads sends it
        # The ingest load comes from another process, as it does from runtimes: in this one it would
        # hold the reader's GIL and time the bench client, not the server.
        ctx = multiprocessing.get_context("spawn")
        stop, ready, sent = ctx.Event(), ctx.Event(), ctx.Value("q", 0)
        loader = ctx.Process(target=_fleet_load, args=(boot, s.traces_topic, rate, duration_s, stop, ready, sent),
                             daemon=True)
        loader.start()
        if not ready.wait(300):
            raise TimeoutError("the load process did not start in 5 minutes")
        # The probes' runtime too (one producer, as a runtime keeps one): its client's background thread
        # would otherwise take the reader's GIL now and then.
        asks, publish_times = ctx.SimpleQueue(), ctx.SimpleQueue()
        prober = ctx.Process(target=_probe_runtime, args=(boot, s.traces_topic, t_start, asks, publish_times),
                             daemon=True)
        prober.start()
        rng = random.Random(1)
        kept = http.client.HTTPConnection("127.0.0.1", port, timeout=10)  # keep-alive, as HTTP clients pool them

        def get(conn: http.client.HTTPConnection, path: str) -> bytes:
            conn.request("GET", path, headers=auth)
            with conn.getresponse() as resp:
                return resp.read()

        sample_body = get(kept, "/agents/agent-00000/briefing")
        floor_ports = ctx.SimpleQueue()
        floor_proc = ctx.Process(target=_floor_server, args=(sample_body, floor_ports), daemon=True)
        floor_proc.start()
        floor = http.client.HTTPConnection("127.0.0.1", floor_ports.get(), timeout=10)
        lat: list[float] = []  # on the kept connection
        lat_new: list[float] = []  # on a connection of its own each (urllib)
        lat_floor: list[float] = []  # on a kept connection to the floor server
        probe_at = time.monotonic() + 2.0
        n_probe = 0
        pending: dict[str, str] = {}  # marker -> agent, until seen in its briefing
        published: dict[str, float] = {}  # marker -> when its publish call began (CLOCK_MONOTONIC)
        seen_at: dict[str, float] = {}
        t_end = time.monotonic() + duration_s
        next_read = time.monotonic()
        while time.monotonic() < t_end or (pending and time.monotonic() < t_end + 30):
            if read_rate > 0:
                next_read += 1.0 / read_rate
                time.sleep(max(0.0, next_read - time.monotonic()))
            agent = f"agent-{rng.randrange(agents):05d}"
            t = time.perf_counter()
            if len(lat_floor) < len(lat):
                get(floor, f"/agents/{agent}/briefing")
                lat_floor.append((time.perf_counter() - t) * 1000)
            elif len(lat) <= len(lat_new):
                get(kept, f"/agents/{agent}/briefing")
                lat.append((time.perf_counter() - t) * 1000)
            else:
                with urllib.request.urlopen(urllib.request.Request(
                        f"http://127.0.0.1:{port}/agents/{agent}/briefing", headers=auth), timeout=10) as resp:
                    resp.read()
                lat_new.append((time.perf_counter() - t) * 1000)
            now = time.monotonic()
            if n_probe < probes and now >= probe_at and time.monotonic() < t_end:
                agent_p = f"agent-{rng.randrange(agents):05d}"
                marker = f"probe marker {uuid.uuid4().hex[:10]}"
                asks.put((agent_p, n_probe + 1, marker))
                pending[marker] = agent_p
                n_probe += 1
                probe_at = now + duration_s / probes
            for marker, agent_p in list(pending.items()):
                with urllib.request.urlopen(urllib.request.Request(
                        f"http://127.0.0.1:{port}/agents/{agent_p}/briefing", headers=auth), timeout=10) as r:
                    if marker.encode() in r.read():
                        seen_at[marker] = time.monotonic()
                        del pending[marker]
        stop.set()
        asks.put(None)
        loader.join(timeout=30)
        deadline = time.monotonic() + 120
        while len(published) < n_probe:  # the publish time of every probe (its process ends after the last)
            if publish_times.empty():
                if not prober.is_alive() or time.monotonic() > deadline:
                    raise RuntimeError(f"the probe publisher stopped after {len(published)} of {n_probe} probes")
                time.sleep(0.05)
                continue
            marker, t0 = publish_times.get()
            published[marker] = t0
        prober.join(timeout=30)
        kept.close()
        floor.close()
        floor_proc.kill()
        fresh = [seen_at[m] - published[m] for m in seen_at]
        q = statistics.quantiles(lat, n=100, method="inclusive")
        qn = statistics.quantiles(lat_new, n=100, method="inclusive")
        qf = statistics.quantiles(lat_floor, n=100, method="inclusive")
        fq = statistics.quantiles(fresh, n=100, method="inclusive") if len(fresh) >= 2 else [float("nan")] * 99
        return {"agents_cached": cached, "sleep_schedule": sleep_schedule, "read_rate": read_rate or "back to back",
                "ingest_events_per_s": round(sent.value / duration_s, 1),
                "reads": len(lat), "read_p50_ms": round(q[49], 3), "read_p99_ms": round(q[98], 3),
                "reads_new_connection": len(lat_new), "read_new_connection_p50_ms": round(qn[49], 3),
                "read_new_connection_p99_ms": round(qn[98], 3),
                "floor_reads": len(lat_floor), "floor_read_p50_ms": round(qf[49], 3),
                "floor_read_p99_ms": round(qf[98], 3), "read_p99_over_floor": round(q[98] / qf[98], 2),
                "probes": n_probe, "probes_seen": len(fresh), "update_p50_s": round(fq[49], 3),
                "update_p99_s": round(fq[98], 3), "update_max_s": round(max(fresh, default=float("nan")), 3)}


def run_capture(sessions: int = 40_000, batch: int = 200, chunks: int = 5, candidates: int | None = 256,
                seed: int = 3) -> dict[str, Any]:
    """Memory capture's cost as the store grows: the episode units of ``sessions`` sample sessions
    (``somnus.sample``, distilled as the worker does), captured in batches of ``batch`` as the projector
    captures them, timed in ``chunks`` equal parts (µs per unit in each), with the capture search
    bounded to ``candidates`` LSH candidates (None: all of them, as before the bound). Also how many
    memories were stored, and a digest of their ids (equal digests: the same decisions)."""
    import hashlib
    from datetime import datetime, timezone

    from somnus.processors.sessions.distiller import distill
    from somnus.processors.episodic.capture import MemoryState, capture, episode_unit
    from somnus.processors.episodic.index import IndexConfig
    from somnus.projections.memory import stemmer
    from somnus.schemas.codec import decode_trace
    from somnus.sample import generate

    events = [decode_trace(orjson.dumps(e), 1 << 20) for e in generate(sessions=sessions, seed=seed)]
    units = [episode_unit(ep) for ep in distill({}, events).episodes]
    del events
    now = datetime(2026, 3, 1, tzinfo=timezone.utc)
    state = MemoryState.empty(IndexConfig(stem=stemmer(), capture_candidates=candidates))
    size = -(-len(units) // chunks)
    per_chunk: list[float] = []
    for c in range(0, len(units), size):
        part = units[c:c + size]
        t = time.perf_counter()
        for k in range(0, len(part), batch):
            capture(state, part[k:k + batch], now)
        per_chunk.append(round(1e6 * (time.perf_counter() - t) / len(part), 1))
    ids = state.index.ids
    return {"sessions": sessions, "units": len(units), "candidates": candidates, "stored": len(ids),
            "us_per_unit_by_chunk": per_chunk, "growth": round(per_chunk[-1] / per_chunk[0], 2),
            "digest": hashlib.sha1("\n".join(ids).encode()).hexdigest()[:12]}


def _sleep_units(units: int, agents: int, seed: int) -> Iterator[Any]:
    """Synthetic episodes for the sleep bench: one a minute-ish over ``units`` minutes spread so the
    store spans weeks; 60% success, 30% failure, 10% partial; one in ten a user interaction; a task of
    6-14 Zipf words, two tools, one person, one object."""
    from datetime import datetime, timedelta, timezone

    import numpy as np

    from somnus.schemas.memory import MemoryKind, MemoryUnit

    rng = np.random.default_rng(seed)
    vocab = [f"word{i}" for i in range(30_000)]
    words = rng.choice(len(vocab), size=(units, 14), p=_zipf(len(vocab)))
    lens = rng.integers(6, 15, units)
    outcome = rng.choice(3, size=units, p=[0.6, 0.3, 0.1])
    user = rng.random(units) < 0.1
    span_min = max(1, 60 * 24 * 60 // max(units, 1))  # about 60 days in all
    t0 = datetime(2024, 1, 1, tzinfo=timezone.utc)
    for i in range(units):
        agent = f"agent{i % agents}"
        out = ("success", "failure", "partial")[outcome[i]]
        yield MemoryUnit(
            memory_id=f"e{i}", kind=MemoryKind.EPISODE, agent=agent, scope=f"agent:{agent}", run_id=f"r{i}",
            occurred_at=t0 + timedelta(minutes=i * span_min + int(rng.integers(0, max(span_min, 1)))),
            perception=" ".join(vocab[w] for w in words[i, :lens[i]]), outcome=out, success=out == "success",
            action=f"tool_{i % 60} -> tool_{(i * 7) % 60}", summary=f"{out} after {2 + i % 9} calls",
            tools=[f"tool_{i % 60}", f"tool_{(i * 7) % 60}"], people=[f"person{i % 300}"], objects=[f"host{i % 40}"],
            user_interaction=bool(user[i]), mode="tool_use")


def run_sleep(units: int = 1_000_000, agents: int = 1000, seed: int = 7, batch: int = 2000,
              accessed: float = 0.05) -> dict[str, Any]:
    """One deep sleep over ``units`` memory units, as the projector's memory fold runs it: the units are
    captured by the fold's own rules (``somnus.processors.episodic.capture.capture``: decisions, merges, association
    edges), ``accessed`` of them recalled in the last day, then ``SleepJob.run`` (plan: protection,
    retention, compression, pruning, maxEpisodes, coverage, dreaming, report; then the prunings and
    compressions applied to the index) and ``SleepJob.write`` (lifecycle_log and sleep_runs rows into
    a DuckDB file with the projection's schema, in one transaction). Default settings (maxEpisodes 50
    per agent, 7 days to prune, 3 to compress)."""
    from datetime import timedelta

    import duckdb
    import numpy as np

    from somnus.processors.episodic.capture import MemoryState, apply, capture
    from somnus.processors.episodic.index import IndexConfig
    from somnus.processors.sleep.job import SleepConfig
    from somnus.projections import schema
    from somnus.projections.memory import stemmer
    from somnus.projections.sleep import SleepJob
    from somnus.schemas.lifecycle import SleepTrigger
    from somnus.schemas.memory import MEMORY_SCHEMA_VERSION, MemoryAccessed

    state = MemoryState.empty(IndexConfig(stem=stemmer()))
    t = time.perf_counter()
    pending: list[Any] = []
    last = None
    for u in _sleep_units(units, agents, seed):
        pending.append(u)
        if len(pending) >= batch:
            capture(state, pending, pending[-1].occurred_at)
            last, pending = pending[-1].occurred_at, []
    if pending:
        capture(state, pending, pending[-1].occurred_at)
        last = pending[-1].occurred_at
    build_s = time.perf_counter() - t
    assert last is not None, "no units"
    at = last + timedelta(hours=1)
    rng = np.random.default_rng(seed + 1)
    ix = state.index
    for i in rng.choice(len(ix.ids), size=int(accessed * len(ix.ids)), replace=False):
        apply(state, MemoryAccessed(schema_version=MEMORY_SCHEMA_VERSION, memory_id=ix.ids[int(i)], agent="bench",
                                    query="bench", rank=1, score=1.0, accessed_at=at - timedelta(hours=int(i) % 24)))
    live_before = int(ix.alive.data[:len(ix.ids)].sum())
    edges_before = sum(len(v) for v in ix.graph.values()) // 2
    work = Path(tempfile.mkdtemp(prefix="somnus-sleep-bench-"))
    try:
        con = duckdb.connect(str(work / "sleep.duckdb"))
        schema.init(con)
        con.execute("CHECKPOINT")
        db_before = (work / "sleep.duckdb").stat().st_size
        job = SleepJob(con, {}, SleepConfig())
        t = time.perf_counter()
        forgotten = job.run(state, at, SleepTrigger.ON_DEMAND, offset=0)
        run_s = time.perf_counter() - t
        t = time.perf_counter()
        con.execute("BEGIN")
        job.write(con)
        con.execute("COMMIT")
        write_s = time.perf_counter() - t
        con.execute("CHECKPOINT")
        row = con.execute("SELECT memories_before, memories_after, kept, compressed, pruned, protected, rescored, "
                          "bytes_before, bytes_after FROM sleep_runs").fetchone()
        decisions = con.execute("SELECT count(*) FROM lifecycle_log").fetchone()[0]
        con.close()
        db_after = (work / "sleep.duckdb").stat().st_size
    finally:
        shutil.rmtree(work, ignore_errors=True)
    assert row is not None, "the sleep run wrote no report"
    keys = ("memories_before", "memories_after", "kept", "compressed", "pruned", "protected", "rescored",
            "bytes_before", "bytes_after")
    report = dict(zip(keys, (int(v) for v in row)))
    return {"units": units, "agents": agents, "live_memories": live_before, "edges": edges_before,
            "build_s": round(build_s, 1), "sleep_s": round(run_s + write_s, 2), "plan_apply_s": round(run_s, 2),
            "write_s": round(write_s, 2), "forgotten_events": len(forgotten), "lifecycle_rows": decisions,
            **report, "store_bytes_ratio": round(report["bytes_after"] / max(report["bytes_before"], 1), 4),
            "lifecycle_db_bytes": db_after - db_before}
