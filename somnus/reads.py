"""Reads for analysts and operators: through the running projector when it holds the file, else directly.

DuckDB lets only one process open a file read-write, and while it does no other process can open
it at all; so when a projector is running for the database, reads are sent to it over HTTP, with a
bearer token (``projections/auth.py``): the ``token`` argument, else ``SOMNUS_TOKEN``, else the
operator's token file of the projector's ``SOMNUS_HOME`` (named in its endpoint file), else of this
one. A file opened directly is guarded by its permissions, not by tokens.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from somnus.config import Settings
from somnus.procs import pid_alive
from somnus.projections.endpoint import endpoint_file, token_file
from somnus.projections.routes import BRIEFING_SERVER_HANDLERS, EXTRA_ROUTES, ROUTES

# Only the standard library on the way to a running projector: DuckDB, the read handlers and the
# folds are imported when a file is opened here (no projector), so a read command starts at once.


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
    info = _projector(db)
    if info is None:
        return None
    port = info.get("briefing_port") if handler in BRIEFING_SERVER_HANDLERS else None
    return f"http://127.0.0.1:{port or info['port']}"


def token_for(db: Path, token: str | None = None) -> str | None:
    """The bearer token for reads of ``db``'s projector: ``token``, ``SOMNUS_TOKEN``, the projector's
    operator token file (its ``SOMNUS_HOME``), or this environment's ``SOMNUS_HOME/token``."""
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
        answer = exc.read()
        try:
            message = json.loads(answer).get("error", str(exc))
        except ValueError:
            message = f"{exc} (the projector's log has the details)"
        if exc.code in (401, 403):
            message = f"{message} [HTTP {exc.code}: set SOMNUS_TOKEN to a token that may read this; see SECURITY.md]"
        raise ReadError(message) from None


def _open(db: Path) -> Any:
    import duckdb

    if not db.exists():
        raise ReadError(f"no database at {db} (run `somnus up` or `somnus replay --to {db}`)")
    try:
        return duckdb.connect(str(db), read_only=True)
    except duckdb.IOException as exc:
        # Held by a projector that has not published its endpoint yet (or by another writer).
        raise ReadError(f"{db} is held by another process: {exc}") from None


def read(
    db: Path,
    handler: str,
    agent: str | None = None,
    agents_dir: Path | None = None,
    *,
    token: str | None = None,
    remote_only: bool = False,
    **params: Any,
) -> Any:
    """Run the read ``handler`` (a route of ``somnus.projections.api``): through the running projector when it
    holds ``db`` (with ``token_for(db, token)``), else on the file opened read-only (unless ``remote_only``:
    a caller that must be held to a token's scope, such as the MCP server, gets a ReadError). Parameters
    that are None are left out."""
    route = next((r for r in (*ROUTES, *EXTRA_ROUTES) if r.handler == handler), None)
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
    return _read_file(db, route, agent, agents_dir, params)


def _read_file(db: Path, route: Any, agent: str | None, agents_dir: Path | None, params: dict[str, Any]) -> Any:
    """``route`` answered on ``db`` opened read-only here (no projector holds it)."""
    if not db.exists():
        raise ReadError(f"no database at {db} (run `somnus up` or `somnus replay --to {db}`)")
    import duckdb

    from somnus.projections import api, queries
    from somnus.schemas.agents import load_agents

    if route.handler == "sql":
        try:
            queries.check_read_only(params.get("sql", ""))
        except (queries.NotReadOnly, duckdb.Error) as exc:  # not read-only, or not SQL at all
            raise ReadError(str(exc)) from None
    con = _open(db)
    try:
        service = api.ReadService(con, load_agents(agents_dir))
        return json.loads(json.dumps(api.call(service, route, agent, params), default=str))
    except (api.BadRequest, api.NotFound, queries.NotReadOnly, duckdb.Error) as exc:
        raise ReadError(str(exc)) from None
    finally:
        con.close()


def sql(db: Path, query: str, params: list[Any] | None = None) -> dict[str, Any]:
    """One read-only SELECT: checked by the projector's SQL sandbox, or here when the file is opened here."""
    return read(db, "sql", sql=query, params=json.loads(json.dumps(params or [], default=str)))


def checksum(db: Path) -> dict[str, Any]:
    return read(db, "checksum")


def summary(db: Path) -> dict[str, Any]:
    return read(db, "summary")


def _positions(settings: Settings, bootstrap: str | Callable[[], str], db: Path) -> Any:
    """Kafka's end offsets and the worker's committed offsets: from the running projector (no Kafka
    client here), else asked of Kafka here (``projections/positions.py``); ``bootstrap`` is called
    only then."""
    from somnus.projections import positions  # aiokafka is imported only to ask Kafka (below)

    if _endpoint(db) is not None:
        try:
            return positions.from_json(read(db, "kafka_positions"))
        except ReadError:  # a projector older than the route, or not answering it: ask Kafka here
            pass
    import asyncio

    return asyncio.run(positions.kafka_positions(settings, bootstrap if isinstance(bootstrap, str) else bootstrap()))


def status(settings: Settings, bootstrap: str | Callable[[], str]) -> dict[str, Any]:
    """Per-topic projection lag, worker lag, counts and dead letters; ``idle`` when all are caught up.
    ``bootstrap`` (or a function that gives it) is used only when no projector answers."""
    db = settings.db
    ends, worker_committed = _positions(settings, bootstrap, db)
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
    for topic in (settings.traces_topic, settings.observations_topic) + (
        (settings.episodes_topic,) if settings.llm_extractor else ()
    ):
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
        "idle": (
            all(v == 0 for v in lag.values())
            and all(v == 0 for v in worker_lag.values())
            and not s.get("stale_briefings")
            and not s.get("pending_promotions")
        ),
        "stale_briefings": s.get("stale_briefings", 0),
        "pending_promotions": s.get("pending_promotions", 0),
        "counts": s["counts"],
        "memories": s.get("memories"),  # stored memories: live, compressed, pruned (``counts`` has the table rows)
        "dead_letters": s["counts"].get("dead_letters", 0),
        "dead_letter_kinds": s["dead_letter_kinds"],
        "quarantined": s.get("quarantined", {}),  # by topic: records the projector could not decode or fold
        "duplicate_events": s.get("duplicate_events", 0),  # repeated event_ids of one session, applied once
        "projector": _endpoint(db) is not None,
        "db": str(db),
    }


def wait_idle(
    settings: Settings, bootstrap: str, timeout_s: float = 600.0, poll_s: float = 0.5, stable_polls: int = 2
) -> dict[str, Any]:
    """Wait until every topic is projected and the worker has committed everything it consumed."""
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


def inspect_report(store: Any, agent: str, n_episodes: int, n_facts: int) -> dict[str, Any]:
    """What an agent knows (``somnus inspect``): recent episodes and their lessons, the facts and entities
    of its scope chain, its cached briefing; ``store`` a ``KnowledgeStore``."""
    eps = store.sql(
        "SELECT episode_id, ended_at, outcome, task, summary FROM episodes WHERE agent = ? "
        "ORDER BY ended_at DESC, episode_id LIMIT ?",
        [agent, n_episodes],
    )
    ids = [str(e["episode_id"]) for e in eps]
    lessons = (
        store.sql(
            "SELECT kind, text, learned_at FROM lessons WHERE agent = ? AND episode_id::VARCHAR IN (SELECT unnest(?)) "
            "ORDER BY learned_at DESC, kind, text",
            [agent, ids],
        )
        if ids
        else []
    )
    facts = [
        {
            "source": f.source,
            "predicate": f.predicate,
            "target": f.target,
            "scope": f.scope,
            "confidence": round(f.confidence, 3),
            "count": f.count,
            "since": f.valid_from,
        }
        for f in store.facts(agent, limit=n_facts)
    ]
    entities = [
        {"entity": e.entity_id, "name": e.name, "type": e.type, "facts": e.facts}
        for e in store.entities(agent, limit=n_facts)
    ]
    briefing = store.sql("SELECT markdown FROM briefings WHERE agent = ?", [agent])
    return {
        "agent": agent,
        "scope_chain": store.scope_chain(agent),
        "episodes": [
            {
                "ended_at": e["ended_at"],
                "outcome": e["outcome"],
                "task": (e["task"] or "")[:60],
                "summary": e["summary"],
            }
            for e in eps
        ],
        "lessons": lessons,
        "facts": facts,
        "entities": entities,
        "briefing": (briefing[0]["markdown"] or None) if briefing else None,
    }


class ReadsBackend:
    """A ``KnowledgeStore`` backend: through the running projector when it holds the file, else the
    file opened read-only."""

    def __init__(self, db: Path) -> None:
        self.db = db

    def query(self, sql_text: str, params: Sequence[Any]) -> tuple[list[str], list[list[Any]]]:
        res = sql(self.db, sql_text, list(params))
        return res["columns"], res["rows"]


def knowledge_store(db: Path, agents: dict[str, Any]) -> Any:
    """What ``agents`` know (a ``KnowledgeStore``), read from ``db`` as ``ReadsBackend`` does."""
    from somnus.projections.knowledge_store import KnowledgeStore  # not on the HTTP read path

    return KnowledgeStore(ReadsBackend(db), agents)
