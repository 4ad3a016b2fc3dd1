"""Reads for analysts and operators: through the running projector when it holds the file, else directly.

DuckDB lets only one process open a file read-write, and while it does no other process can open
it at all; so when a projector is running for the database, reads are sent to it over HTTP, with a
bearer token (``projections/auth.py``): the ``token`` argument, else ``SOMNUS_TOKEN``, else the
operator's token file of the projector's ``SOMNUS_HOME`` (named in its endpoint file), else of this
one. A file opened directly is guarded by its permissions, not by tokens.
"""

from __future__ import annotations

import asyncio
import json
import os
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import duckdb

from somnus.projections import queries
from somnus.projections.projector import endpoint_file
from somnus.config import Settings
from somnus.procs import pid_alive


class ReadError(RuntimeError):
    """The query could not be run (bad SQL, no database, projector unreachable)."""


def _projector(db: Path) -> dict[str, Any] | None:
    """The running projector's endpoint file for ``db`` (pid, ports, where its operator token is), or None."""
    path = endpoint_file(db)
    try:
        info = json.loads(path.read_text())
    except (FileNotFoundError, ValueError):  # absent, or being written
        return None
    return info if pid_alive(info["pid"]) else None


def _endpoint(db: Path, handler: str | None = None) -> str | None:
    """The running projector's URL for ``db``: its briefing server's for the reads that one answers."""
    from somnus.projections.briefing_server import ROUTES

    info = _projector(db)
    if info is None:
        return None
    port = info.get("briefing_port") if handler in ROUTES else None
    return f"http://127.0.0.1:{port or info['port']}"


def token_for(db: Path, token: str | None = None) -> str | None:
    """The bearer token for reads of ``db``'s projector: ``token``, ``SOMNUS_TOKEN``, the projector's
    operator token file (its ``SOMNUS_HOME``), or this environment's ``SOMNUS_HOME/token``."""
    from somnus.projections.auth import token_file

    if token:
        return token
    if os.environ.get("SOMNUS_TOKEN", "").strip():
        return os.environ["SOMNUS_TOKEN"].strip()
    info = _projector(db) or {}
    for path in ([Path(info["token_file"])] if info.get("token_file") else []) + [token_file(Settings.resolve().home)]:
        try:
            got = path.read_text().strip()
        except OSError:  # absent, or not ours to read
            continue
        if got:
            return got
    return None


def auth_headers(db: Path, token: str | None = None) -> dict[str, str]:
    """``{"Authorization": "Bearer ..."}`` for ``db``'s projector (empty when no token is found)."""
    found = token_for(db, token)
    return {"Authorization": f"Bearer {found}"} if found else {}


def _http(url: str, body: dict[str, Any] | None = None, headers: dict[str, str] | None = None) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        body = exc.read()
        try:
            message = json.loads(body).get("error", str(exc))
        except ValueError:
            message = f"{exc} (the projector's log has the details)"
        if exc.code in (401, 403):
            message = f"{message} [HTTP {exc.code}: set SOMNUS_TOKEN to a token that may read this; see SECURITY.md]"
        raise ReadError(message) from None


def _open(db: Path) -> duckdb.DuckDBPyConnection:
    if not db.exists():
        raise ReadError(f"no database at {db} (run `somnus up` or `somnus replay --to {db}`)")
    try:
        return duckdb.connect(str(db), read_only=True)
    except duckdb.IOException as exc:
        # Held by a projector that has not published its endpoint yet (or by another writer).
        raise ReadError(f"{db} is held by another process: {exc}") from None


def read(db: Path, handler: str, agent: str | None = None, agents_dir: Path | None = None, *,
         token: str | None = None, remote_only: bool = False, **params: Any) -> Any:
    """Run the read ``handler`` (a route of ``somnus.projections.api``): through the running projector when it
    holds ``db`` (with ``token_for(db, token)``), else on the file opened read-only (unless ``remote_only``:
    a caller that must be held to a token's scope, such as the MCP server, gets a ReadError). Parameters
    that are None are left out."""
    from somnus.projections import api
    from somnus.agents import load_agents

    route = next((r for r in api.all_routes() if r.handler == handler), None)
    if route is None:
        raise ReadError(f"no read named {handler!r}")
    params = {k: v for k, v in params.items() if v is not None}
    url = _endpoint(db, handler)
    if url:
        path = route.path.replace("{agent}", urllib.parse.quote(agent or "", safe=""))
        headers = auth_headers(db, token)
        if route.method == "GET":
            query = urllib.parse.urlencode({k: str(v) for k, v in params.items()})
            return _http(f"{url}{path}" + (f"?{query}" if query else ""), headers=headers)
        return _http(f"{url}{path}", json.loads(json.dumps(params, default=str)), headers)
    if remote_only:
        raise ReadError(f"no projector is running for {db} (start the stack with `somnus up`)")
    con = _open(db)
    try:
        service = api.ReadService(con, load_agents(agents_dir))
        return json.loads(json.dumps(api.call(service, route, agent, params), default=str))
    except (api.BadRequest, api.NotFound, queries.NotReadOnly, duckdb.Error) as exc:
        raise ReadError(str(exc)) from None
    finally:
        con.close()


def sql(db: Path, query: str, params: list[Any] | None = None) -> dict[str, Any]:
    try:
        queries.check_read_only(query)
    except (queries.NotReadOnly, duckdb.Error) as exc:  # not read-only, or not SQL at all
        raise ReadError(str(exc)) from None
    return read(db, "sql", sql=query, params=json.loads(json.dumps(params or [], default=str)))


def checksum(db: Path) -> dict[str, Any]:
    return read(db, "checksum")


def summary(db: Path) -> dict[str, Any]:
    return read(db, "summary")


async def _kafka_positions(settings: Settings, bootstrap: str) -> tuple[dict[str, dict[int, int]], dict[str, dict[int, int]]]:
    from aiokafka import AIOKafkaConsumer, TopicPartition
    from aiokafka.admin import AIOKafkaAdminClient

    from somnus.streams.topics import partitions_of

    from somnus.config import kafka_options

    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                                **kafka_options(settings))
    await consumer.start()
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, **kafka_options(settings))
    await admin.start()
    try:
        tps = []
        for topic in (*settings.projected_topics, settings.observations_topic):
            tps.extend(TopicPartition(topic, p) for p in await partitions_of(consumer, topic))
        ends: dict[str, dict[int, int]] = {}
        for tp, off in (await consumer.end_offsets(tps)).items() if tps else []:
            ends.setdefault(tp.topic, {})[tp.partition] = off
        committed: dict[str, dict[int, int]] = {}
        try:
            group = await admin.list_consumer_group_offsets(settings.app_id)
        except Exception:
            group = {}
        for tp, meta in group.items():
            if tp.topic in (settings.traces_topic, settings.episodes_topic, settings.observations_topic):
                committed.setdefault(tp.topic, {})[tp.partition] = meta.offset
        return ends, committed
    finally:
        await admin.close()
        await consumer.stop()


def status(settings: Settings, bootstrap: str) -> dict[str, Any]:
    """Per-topic projection lag, worker lag, counts and dead letters; ``idle`` when all are caught up."""
    ends, worker_committed = asyncio.run(_kafka_positions(settings, bootstrap))
    db = Path(settings.db_path)  # type: ignore[arg-type]
    try:
        s = summary(db)
    except ReadError:
        s = {"counts": {}, "offsets": {}, "dead_letter_kinds": {}}
    lag = {}
    for topic, parts in ends.items():
        if topic not in settings.projected_topics:
            continue
        done = s["offsets"].get(topic, {})
        lag[topic] = sum(max(0, end - int(done.get(str(p), done.get(p, 0)))) for p, end in parts.items())
    # The worker consumes traces (distiller), observations (NAc), and episodes too when the LLM
    # extractor is on.
    worker_lag = {}
    for topic in ((settings.traces_topic, settings.observations_topic)
                  + ((settings.episodes_topic,) if settings.llm_extractor else ())):
        committed = worker_committed.get(topic, {})
        worker_lag[topic] = sum(max(0, end - committed.get(p, 0)) for p, end in ends.get(topic, {}).items())
    try:
        memory = read(db, "memory", agents_dir=settings.agents_dir)
    except ReadError:
        memory = None
    from somnus.supervisor import processes

    return {
        "processes": processes(settings),
        "memory": memory,
        "lag": lag,
        "worker_lag": worker_lag,
        "idle": (all(v == 0 for v in lag.values()) and all(v == 0 for v in worker_lag.values())
                 and not s.get("stale_briefings")),
        "stale_briefings": s.get("stale_briefings", 0),
        "counts": s["counts"],
        "memories": s.get("memories"),  # stored memories: live, compressed, pruned (``counts`` has the table rows)
        "dead_letters": s["counts"].get("dead_letters", 0),
        "dead_letter_kinds": s["dead_letter_kinds"],
        "quarantined": s.get("quarantined", {}),  # by topic: records the projector could not decode or fold
        "duplicate_events": s.get("duplicate_events", 0),  # repeated event_ids of one session, applied once
        "projector": _endpoint(db) is not None,
        "db": str(db),
    }


def wait_idle(settings: Settings, bootstrap: str, timeout_s: float = 600.0, poll_s: float = 0.5,
              stable_polls: int = 2) -> dict[str, Any]:
    """Wait until every topic is projected and the worker has committed everything it consumed."""
    import time

    deadline = time.monotonic() + timeout_s
    res: dict[str, Any] = {}
    streak = 0
    while time.monotonic() < deadline:
        res = status(settings, bootstrap)
        streak = streak + 1 if res["idle"] else 0
        if streak >= stable_polls:
            return res
        time.sleep(poll_s)
    raise TimeoutError(f"not idle after {timeout_s}s: {res}")
