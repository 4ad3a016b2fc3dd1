"""``somnus bench advise``: latency of the pre-flight read ``advise`` with a fleet's memory loaded.

The fleet (the built-in sample, or any file ``somnus import`` reads) is distilled and learned in
process, as the worker would, and projected by the projector's own ``apply_batch`` (episodes and
NAc link updates), into a fresh DuckDB file: no broker. Each query is a task of the loaded
episodes, reworded (its words shuffled)."""

from __future__ import annotations

import random
import shutil
import statistics
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import msgspec
import orjson

from somnus.schemas.episodes import EpisodeDistilled


@dataclass(frozen=True)
class _Rec:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: Any = ()


def distilled(events: Iterable[dict[str, Any]]) -> list[EpisodeDistilled]:
    """Episodes of v1 trace events, as the worker's distiller makes them (rejections raise)."""
    from somnus.processors.sessions.distiller import distill
    from somnus.schemas.codec import Rejection, decode_trace

    decoded = [decode_trace(orjson.dumps(e), max_bytes=1 << 20) for e in events]
    good = [d for d in decoded if not isinstance(d, Rejection)]
    if len(good) < len(decoded):
        bad = [d for d in decoded if isinstance(d, Rejection)]
        raise ValueError(f"{len(bad)} events rejected, first: {bad[0]}")
    return list(distill({}, good).episodes)


def project(con: duckdb.DuckDBPyConnection, episodes: Sequence[EpisodeDistilled]) -> None:
    """Project ``episodes``, the NAc updates and the facts they teach into ``con`` (schema created if needed)."""
    from somnus.processors.knowledge.extraction import TraceExtractor
    from somnus.processors.prediction.causal_links import learn, observations_from_episode
    from somnus.projections import schema
    from somnus.projections.writer import ReadModels, Topics, apply_batch, load_offsets
    from somnus.schemas.codec import encode

    schema.init(con)
    topics = Topics(
        traces="traces", episodes="episodes", dead_letters="dlq", link_updates="link-updates", facts="facts"
    )
    observed = [o for off, ep in enumerate(episodes) for o in observations_from_episode(ep, 0, off)]
    _, updates = learn({}, observed, per_link_rows=False)
    records = [
        _Rec("episodes", 0, off, ep.session_id.encode(), msgspec.json.encode(ep)) for off, ep in enumerate(episodes)
    ]
    records.append(_Rec("link-updates", 0, 0, None, msgspec.json.encode(updates)))
    # the worker's trace extractor: the facts (and so the entities) each episode teaches
    records += [
        _Rec("facts", 0, off, str(f.episode_id).encode(), encode(f))
        for off, f in enumerate(TraceExtractor().extract(list(episodes)))
    ]
    res = apply_batch(con, topics, records, load_offsets(con), 1 << 20, ReadModels(con))
    if res.dead_letters:
        raise RuntimeError(f"{res.dead_letters} records were dead-lettered while loading")


def sample_episodes(sessions: int, seed: int) -> list[EpisodeDistilled]:
    from somnus.sample import generate

    return distilled(generate(sessions=sessions, seed=seed))


def run_advise(
    sessions: int = 300,
    queries: int = 500,
    seed: int = 42,
    episodes: Sequence[EpisodeDistilled] | None = None,
    keep_db: Path | None = None,
) -> dict[str, Any]:
    """Latency (ms) of the advise route (``ReadService.advise``, as the projector serves it: inputs
    cached while no batch lands) and of a cold read (inputs read from DuckDB, then ``advise``: what
    the first question after each batch pays). ``keep_db`` (a new file) keeps a copy of the store."""
    from somnus.processors.prediction.advise import advise
    from somnus.projections import api
    from somnus.projections.advice import advice_inputs
    from somnus.projections.writer import load_offsets

    eps = list(episodes) if episodes is not None else sample_episodes(sessions, seed)
    tasks = [(ep.agent, ep.task) for ep in eps if ep.task]
    if not tasks:
        raise ValueError("no episode with a task to ask about")
    if keep_db is not None and keep_db.exists():
        raise FileExistsError(f"--keep-db {keep_db}: the file exists; name a new one")
    work = Path(tempfile.mkdtemp(prefix="somnus-bench-advise-"))
    try:
        con = duckdb.connect(str(work / "advise.duckdb"))
        started = time.perf_counter()
        project(con, eps)
        load_s = time.perf_counter() - started
        rng = random.Random(seed)
        asks = []
        for _ in range(queries):
            agent, task = rng.choice(tasks)
            words = task.split()
            rng.shuffle(words)
            asks.append((agent, " ".join(words)))
        service = api.ReadService(con, {})
        offsets = load_offsets(con)  # as the projector gives its service (no batch lands during the bench)
        service.extra["store_version"] = lambda: (len(offsets), sum(offsets.values()))
        route = next(r for r in api.all_routes() if r.handler == "advise")
        warm: list[float] = []
        risks = strategies = escalations = 0
        for agent, task in asks:
            t0 = time.perf_counter()
            got = api.call(service, route, agent, {"task": task})
            warm.append((time.perf_counter() - t0) * 1000)
            risks += bool(got["risks"])
            strategies += bool(got["planning"])
            escalations += got["escalation"]["escalate"]
        cold: list[float] = []
        for agent, task in asks[: max(20, queries // 10)]:
            t0 = time.perf_counter()
            advise(agent, task, advice_inputs(con, agent))
            cold.append((time.perf_counter() - t0) * 1000)
        con.close()
        if keep_db is not None:
            shutil.copyfile(work / "advise.duckdb", keep_db)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {
        "episodes": len(eps),
        "agents": len({a for a, _ in tasks}),
        "queries": queries,
        "load_s": round(load_s, 2),
        **_quantiles("", warm),
        **_quantiles("cold_", cold),
        "with_risk": risks,
        "with_strategy": strategies,
        "escalated": escalations,
    }


def _quantiles(prefix: str, times: list[float]) -> dict[str, float]:
    cuts = statistics.quantiles(times, n=100)
    return {
        f"{prefix}p50_ms": round(statistics.median(times), 2),
        f"{prefix}p95_ms": round(cuts[94], 2),
        f"{prefix}p99_ms": round(cuts[98], 2),
    }
