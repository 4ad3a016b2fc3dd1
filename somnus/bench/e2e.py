"""End-to-end benchmark: publish N synthetic events through the real broker, worker and projector.

``events_per_s`` runs from the start of publishing until the projection has committed every event,
every episode, the facts extracted from every episode (``facts_per_s``: facts extracted and
folded into the triple log over the same span) and every causal-link update (``link_updates_per_s``:
the NAc agent has consumed every observation and the projector every update; the pipeline is idle); ``raw_consume_per_s`` is a plain aiokafka consume + orjson decode of the same
topic in the same run, the ceiling the pipeline is compared to (``ratio``).

With ``workers`` > 1 the workers are ``worker``, ``worker-2``, ... (as ``somnus up --workers`` names
them); ``fold_cpu_share`` is each worker's and the projector's share of the CPU those processes used
together (the broker and the publisher left out), and ``fold_cpu_max_share`` the largest.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import orjson

from somnus import broker as broker_mod
from somnus import procs
from somnus.bench.pipeline import isolated_pipeline, python_loop_s, raw_consume
from somnus.config import Settings


def run_e2e(
    events: int,
    seed: int = 7,
    partitions: int = 4,
    bundle: int = 64,
    home: Path | None = None,
    log: Any = None,
    timeout_s: float = 1800.0,
    workers: int = 1,
) -> dict[str, Any]:
    from somnus.client import publish_async
    from somnus.reads import sql, status
    from somnus.sample import generate
    from somnus.supervisor import worker_names

    loop_s = python_loop_s()  # before anything of the run is started: the machine alone
    # Copied to their own size: orjson's output keeps a 4 KB allocation for a ~300-byte event, and the
    # publisher held 1M of them (4.1 GB peak; issue #30). The bytes are the same.
    payloads = [bytes(memoryview(orjson.dumps(e))) for e in generate(events=events, seed=seed)]
    sessions = sum(1 for p in payloads if b'"type":"session_end"' in p)
    names = worker_names(workers)
    with isolated_pipeline(home, partitions, workers=workers) as (s, boot):
        if log:
            log.print(
                f"bench: {len(payloads)} events of {sessions} sessions, {partitions} partitions, {workers} worker(s)"
            )
        found = {
            **{name: procs.running(s, name) for name in names},
            "projector": procs.running(s, "projector"),
            "broker": getattr(broker_mod.status(Settings.resolve(home=home)), "pid", None),
        }
        pids = {role: pid for role, pid in found.items() if pid}
        cpu0 = {role: procs.cpu_seconds(pid) for role, pid in pids.items()}
        t0, own0 = time.perf_counter(), time.process_time()
        asyncio.run(publish_async(payloads, boot, s.traces_topic, bundle_max=bundle))
        t_pub, own_pub = time.perf_counter() - t0, time.process_time() - own0
        db = s.db_path
        assert db is not None  # isolated_pipeline gives the pipeline its own DuckDB file
        deadline = time.monotonic() + timeout_s
        spine_s = None  # until events and episodes are committed (what the figure meant before facts)
        # Progress is read with one light query: the projector answers it, and `summary` (a count of
        # every table) four times a second took a fifth of its event loop thread's time (py-spy).
        progress = (
            "SELECT (SELECT count(*) FROM events), (SELECT count(*) FROM episodes), "
            "(SELECT count(*) FROM knowledge_inputs)"
        )
        while True:
            n_events, n_episodes, n_inputs = sql(db, progress)["rows"][0]
            if spine_s is None and n_events >= len(payloads) and n_episodes >= sessions:
                spine_s = time.perf_counter() - t0
            if spine_s is not None and n_inputs >= sessions and status(s, boot)["idle"]:
                break  # every topic projected, the NAc caught up too
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"projection incomplete after {timeout_s}s: {n_events} events, "
                    f"{n_episodes} episodes, {n_inputs} knowledge inputs"
                )
            time.sleep(0.25)
        elapsed = time.perf_counter() - t0
        # CPU each process used from the start of publishing to idle: where the 2 cores went.
        cpu = {role: round(procs.cpu_seconds(pid) - cpu0[role], 2) for role, pid in pids.items()}
        cpu["publisher"] = round(own_pub, 2)
        # Peak resident set of every process (VmHWM): the broker's JVM, and this process, which
        # published (it holds the encoded input), as well as the worker and the projector.
        rss = {role: procs.peak_rss_mb(pid) for role, pid in pids.items()}
        folds = {role: cpu[role] for role in (*names, "projector") if role in cpu}
        share = {role: round(v / (sum(folds.values()) or 1.0), 3) for role, v in folds.items()}
        rss["publisher"] = procs.peak_rss_mb(os.getpid())
        facts, triples, links, link_updates, memories = sql(
            db,
            (
                "SELECT (SELECT sum(facts) FROM knowledge_inputs), (SELECT count(*) FROM triples), "
                "(SELECT count(*) FROM causal_links), (SELECT count(*) FROM causal_link_updates), "
                "(SELECT count(*) FROM memories)"
            ),
        )["rows"][0]
        records, raw_events, raw_s = asyncio.run(raw_consume(boot, s.traces_topic))
        raw = raw_events / raw_s
        eps = len(payloads) / elapsed
        return {
            "events": len(payloads),
            "records": records,
            "bundle_max": bundle,
            "sessions": sessions,
            "partitions": partitions,
            "workers": workers,
            "publish_s": round(t_pub, 3),
            "elapsed_s": round(elapsed, 3),
            "events_per_s": round(eps, 1),
            "raw_consume_per_s": round(raw, 1),
            "ratio": round(eps / raw, 3),
            "facts": int(facts or 0),
            "triples": int(triples),
            "facts_per_s": round((facts or 0) / elapsed, 1),
            "causal_links": int(links),
            "link_updates": int(link_updates),
            "link_updates_per_s": round(link_updates / elapsed, 1),
            "memories": int(memories),
            "spine_elapsed_s": round(spine_s, 3),
            "spine_events_per_s": round(len(payloads) / spine_s, 1),
            "cpu_s": cpu,
            "cpu_us_per_event": {k: round(v / len(payloads) * 1e6, 1) for k, v in cpu.items()},
            "cpu_us_per_event_all": round(sum(cpu.values()) / len(payloads) * 1e6, 1),
            "fold_cpu_share": share,
            "fold_cpu_max_share": max(share.values(), default=None),
            "python_loop_10m_s": loop_s,
            "peak_rss_mb": rss,
        }
