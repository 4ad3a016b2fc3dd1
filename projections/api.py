"""The read API: one table of routes, served over HTTP by the projector and called in-process otherwise.

DuckDB lets one process hold the file, so while the projector runs every read goes through it
(``projections/projector.py`` mounts ``ROUTES`` on 127.0.0.1 and describes them at
``GET /openapi.json``); when nothing runs, ``somnus.reads`` opens the file read-only and calls the
same ``ReadService`` method. Either way the answer is the same JSON.

Every agent-facing read takes the reading agent and returns only its scope chain
(``projections/knowledge_store.py``), and takes ``user_id``: a reader acting for one user (a
user-bound token has it forced) gets only what that user's sessions, or user-less ones, gave, and
nothing of what is derived from several users' sessions without saying whose (``WITHHELD``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, cast

import duckdb
import msgspec

from somnus.processors.briefing.injection import briefing_text, inject, neutral_json
from somnus.projections import queries
from somnus.projections.routes import EXTRA_ROUTES, ROUTES, Route
from somnus.projections.knowledge_store import DuckDBBackend, KnowledgeStore
from somnus.schemas.briefing import BriefingGenerated, BriefingServed
from somnus.schemas.agents import AgentSpec
from somnus.processors.working.synopsis import SynopsisCache
from somnus.projections.briefings import _from_row
import json
from somnus.processors.episodic.recall import DEFAULT_WEIGHTS, SIGNALS, RecallConfig, recall
from somnus.processors.episodic.goals import goal_adjacency, goal_recall, wander
from somnus.projections.goals import goals_of, wander_pool
from somnus.processors.episodic.recall import MIN_RELEVANCE, build_episodic_context
from somnus.processors.briefing.generator import covers
from somnus.processors.semantic.concepts import knowledge_context, record_agents
from somnus.schemas.agents import scope_chain
from somnus.projections.semantic import promotion_inputs, sealed_request
from somnus.processors.briefing.context import Tier, get_context
from somnus.processors.working.session_buffer import decode_state
from somnus.processors.working.synopsis import stored_kind
from somnus.schemas.working_memory import ContextCandidate, UserMemory
from somnus.projections.causal import predict_from
from somnus.processors.prediction.rhythms import WEEKDAYS, WEEKEND, TemporalIndex
from somnus.schemas.causal import TemporalBinCounted
from datetime import timedelta
from somnus.processors.prediction.oscillators import (
    NAMES,
    OscillatorConfig,
    OscillatorState,
    coherence,
    coupling_analysis,
    locked_rhythms,
    next_recurrence,
)
from somnus.processors.knowledge.swarm_metrics import failing_pairs, tally_delegations, utilisation
from somnus.projections.writer import decode_served
from somnus.schemas.briefing import FactUsed
from somnus.projections.sql_sandbox import SqlRefused, SqlSandbox, SqlTimeout, one_row
from somnus.projections.memory import MemoryProjection
from somnus.projections.semantic import SemanticProjection
from somnus.projections.read_cursor import ReadCursor


class NotFound(LookupError):
    """The thing asked for does not exist (HTTP 404)."""


class BadRequest(ValueError):
    """A parameter is missing or malformed (HTTP 400); the message names it."""


def _time(value: Any, name: str) -> datetime | None:
    if value in (None, ""):
        return None
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        raise BadRequest(f"parameter `{name}`: not an ISO 8601 time: {value!r}") from None


def _int(value: Any, name: str, default: int, lo: int = 1, hi: int = 100_000) -> int:
    if value in (None, ""):
        return default
    try:
        n = int(value)
    except (TypeError, ValueError):
        raise BadRequest(f"parameter `{name}`: not an integer: {value!r}") from None
    if not lo <= n <= hi:
        raise BadRequest(f"parameter `{name}`: {n} is outside [{lo}, {hi}]")
    return n


def _float(value: Any, name: str, default: float, lo: float = 0.0, hi: float = 1.0) -> float:
    if value in (None, ""):
        return default
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise BadRequest(f"parameter `{name}`: not a number: {value!r}") from None
    if not lo <= x <= hi:
        raise BadRequest(f"parameter `{name}`: {x} is outside [{lo}, {hi}]")
    return x


def _bool(value: Any, name: str) -> bool:
    if value in (None, "") or value is False or value is True:
        return bool(value)
    text = str(value).lower()
    if text not in ("1", "true", "yes", "0", "false", "no"):
        raise BadRequest(f"parameter `{name}`: true or false, not {value!r}")
    return text in ("1", "true", "yes")


# of a session id an injection names: its BriefingServed goes on the facts topic and into briefings_served
# (a longer one could not be named by a forget request either: schemas/forget.py)
MAX_SESSION_ID = 500


def _json_param(value: Any, name: str) -> Any:
    """A JSON query parameter (``filters``, ``args``) as Python values, else ``BadRequest`` naming it:
    text that is not JSON, or whose strings are not Unicode text (``"\\ud800"`` is valid JSON for a lone
    surrogate, which failed later as a 500 when the value was encoded)."""
    if not isinstance(value, str):
        return value
    try:
        parsed = json.loads(value)
    except ValueError:
        raise BadRequest(f"parameter `{name}`: not JSON: {value[:80]!r}") from None
    except RecursionError:  # "[[[[..." thousands deep: Python's decoder recurses (a 500 before)
        raise BadRequest(f"parameter `{name}`: JSON nested too deeply") from None
    try:
        json.dumps(parsed, ensure_ascii=False).encode()
    except UnicodeEncodeError:
        raise BadRequest(f"parameter `{name}`: a string in it is not valid Unicode (a lone surrogate)") from None
    return parsed


def _is_text(value: str) -> bool:
    try:
        value.encode()
    except UnicodeEncodeError:
        return False
    return True


def _synopsis_cache() -> Any:
    return SynopsisCache()


def _memory_text(unit: Any) -> str:
    """A memory unit as one context line: what happened, and how it ended."""
    text = unit.summary or unit.perception
    if unit.kind.value == "message" and unit.speaker:
        text = f"{unit.speaker}: {text}"
    return f"{text} ({unit.outcome})" if unit.outcome else text


def _rows(cur: duckdb.DuckDBPyConnection) -> list[dict[str, Any]]:
    cols = [d[0] for d in cur.description]
    return [dict(zip(cols, r)) for r in cur.fetchall()]


def _jsonable(obj: Any) -> Any:
    return msgspec.to_builtins(obj)


# What a reader acting for one user (``user_id``; a user-bound token has it forced) is told in place of
# an answer derived from several users' sessions whose parts carry no user (SECURITY.md, "Reads for one user").
WITHHELD = (
    "derived from several users' sessions and not attributable to one: not served to a reader "
    "acting for one user (SECURITY.md)"
)


def _user(value: Any) -> str | None:
    """The ``user_id`` parameter: the user the reader acts for (None: no user)."""
    if value in (None, ""):
        return None
    if not isinstance(value, str):
        raise BadRequest(f"parameter `user_id`: a string, not {type(value).__name__}")
    return value


@dataclass
class ReadService:
    """The reads, over one connection; ``briefings`` is the projector's in-memory cache when it has one."""

    con: duckdb.DuckDBPyConnection
    agents: Mapping[str, AgentSpec]
    briefings: Mapping[str, BriefingGenerated] | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    # Called with a BriefingServed when a briefing is injected for a named session (the projector
    # publishes it on the facts topic, so utilisation is counted from the log).
    on_served: Callable[[BriefingServed], None] | None = None
    episodic: Any = None  # the projector's MemoryProjection (its state's index answers recall)
    on_accessed: Callable[[list[Any]], None] | None = (
        None  # publishes MemoryAccessed (recall changes state via the log)
    )
    synopses: Any = field(default_factory=lambda: _synopsis_cache())  # user synopses, refreshed when stale
    semantic: Any = None  # the projector's SemanticProjection (per-owner memory layers)
    keys: Any = None  # the projector's KeyRing: promotion inputs' topics are sealed with it

    top_facts: Any = None  # the projector's in-memory facts_top (somnus.projections.knowledge_store.TopFacts)
    sandbox: Any = None  # analysts' SQL (somnus.projections.sql_sandbox.SqlSandbox), made on first use if absent

    def __post_init__(self) -> None:
        # Every read runs to its end: an unread result holds its transaction, which kept a forget's
        # scrub from checkpointing (projections/read_cursor.py). Duck-typed as the connection it wraps.
        if self.con is not None and not isinstance(self.con, ReadCursor):
            self.con = cast(duckdb.DuckDBPyConnection, ReadCursor(self.con))

    @property
    def store(self) -> KnowledgeStore:
        return KnowledgeStore(DuckDBBackend(self.con), dict(self.agents), top=self.top_facts)

    # ---- briefings ----
    def _briefing(self, agent: str) -> BriefingGenerated | None:
        if self.briefings is not None:
            return self.briefings.get(agent)

        cur = self.con.execute("SELECT * FROM briefings WHERE agent = ?", [agent])
        cols = [d[0] for d in cur.description]
        row = cur.fetchone()
        return _from_row(dict(zip(cols, row))) if row else None

    def briefing(self, agent: str, user_id: Any = None) -> dict[str, Any]:
        """The cached briefing, neutralised as every prompt-facing read is (``somnus.processors.briefing.injection``):
        no marker brackets or invisible characters in any field, and a Markdown line that is not a
        title or an item quoted. For a reader acting for a user, none (``WITHHELD``): its lines are
        rendered from every user's sessions and no longer say whose they are."""
        if _user(user_id) is not None:
            return {"agent": agent, "briefing": None, "withheld": WITHHELD}
        b = self._briefing(agent)
        if b is None:
            return {"agent": agent, "briefing": None}
        return {"agent": agent, "briefing": {**neutral_json(_jsonable(b)), "markdown": briefing_text(b.markdown)}}

    def inject(self, agent: str, prompt: Any = None, session_id: Any = None, user_id: Any = None) -> dict[str, Any]:
        """``prompt`` with the agent's briefing before it; for a reader acting for a user, unchanged
        (the briefing is ``WITHHELD``; ``context`` serves that user's own lessons)."""
        if not isinstance(prompt, str):
            raise BadRequest("body field `prompt`: a string (the system prompt) is required")
        if session_id is not None and not isinstance(session_id, str):
            raise BadRequest("body field `session_id`: a string (the session about to start) or absent")
        if session_id is not None and len(session_id) > MAX_SESSION_ID:
            raise BadRequest(f"body field `session_id`: {len(session_id)} characters, at most {MAX_SESSION_ID}")
        if _user(user_id) is not None:
            return {"agent": agent, "briefing_id": None, "prompt": inject(None, prompt), "withheld": WITHHELD}
        b = self._briefing(agent)
        markdown = b.markdown if b is not None and b.markdown else None
        if markdown and session_id and self.on_served is not None:
            assert b is not None
            self.on_served(
                BriefingServed(
                    schema_version=1,
                    briefing_id=b.briefing_id,
                    agent=agent,
                    session_id=session_id,
                    served_at=datetime.now(timezone.utc),
                    facts=b.facts,
                )
            )
        return {
            "agent": agent,
            "briefing_id": b.briefing_id if markdown and b is not None else None,
            "prompt": inject(markdown, prompt),
        }

    # ---- knowledge ----
    # With ``user_id``, only what that user's sessions (or user-less ones) gave: a fact whose statement
    # one of them asserted, an entity such a fact mentions, a change such an episode made.
    def facts(
        self,
        agent: str,
        as_of: Any = None,
        limit: Any = None,
        predicate: Any = None,
        entity: Any = None,
        user_id: Any = None,
    ) -> list[Any]:
        user = _user(user_id)
        return _jsonable(
            self.store.facts(
                agent,
                as_of=_time(as_of, "as_of"),
                limit=_int(limit, "limit", 50),
                predicate=predicate or None,
                entity=entity or None,
                for_user=user is not None,
                user_id=user,
            )
        )

    def entities(self, agent: str, type: Any = None, limit: Any = None, user_id: Any = None) -> list[Any]:
        user = _user(user_id)
        return _jsonable(
            self.store.entities(
                agent, type=type or None, limit=_int(limit, "limit", 100), for_user=user is not None, user_id=user
            )
        )

    def history(self, agent: str, entity: Any = None, user_id: Any = None) -> list[Any]:
        if not entity:
            raise BadRequest("parameter `entity`: an entity id such as `tool:book_reservation` is required")
        user = _user(user_id)
        return _jsonable(self.store.history(agent, str(entity), for_user=user is not None, user_id=user))

    # ---- episodic memory (recall) ----
    def _memory(self) -> Any:
        if self.episodic is None:  # no projector: replay the log from the file (read-only)
            self.episodic = MemoryProjection(self.con)
        return self.episodic.state

    def _goals(self) -> Any:
        self._memory()
        return self.episodic.goals

    def goals(self, agent: str, all: Any = None, user_id: Any = None) -> dict[str, Any]:
        """The agent's goals (``projections/goals.py``): text neutralised, as every prompt-facing read."""
        rows = goals_of(self.con, agent, _user(user_id), _bool(all, "all") if all is not None else False)
        return {"agent": agent, "goals": neutral_json(_jsonable(rows))}

    def wander(
        self, agent: str, steps: Any = None, seed: Any = None, start: Any = None, user_id: Any = None
    ) -> dict[str, Any]:
        """A walk over the agent's readable memories by information gain (``processors/episodic/goals.py``).
        A read: the memories visited are not recorded as accesses."""
        state, user, now = self._memory(), _user(user_id), datetime.now(timezone.utc)
        open_goals, _ = self._goals().pull(agent, user)
        adjacency = goal_adjacency(state.index, open_goals, now=now, agents=self.agents)
        first = str(start) if start else None  # empty: the default start, as an absent parameter
        nodes, graph = wander_pool(state, agent, scope_chain(dict(self.agents), agent), user, adjacency, now, first)
        if first is not None and first not in nodes:
            raise BadRequest(f"parameter `start`: memory {first[:80]!r} is not one the agent may read")
        walk = wander(
            graph,
            nodes,
            adjacency,
            now,
            _int(seed, "seed", 0, lo=0, hi=2**31),
            steps=_int(steps, "steps", 10, hi=100),
            start=first,
        )
        out = []
        for st in walk:
            u = state.index.units[state.index.pos[st.memory_id]]
            out.append(
                {
                    **_jsonable(st),
                    "kind": u.kind.value,
                    "occurred_at": u.occurred_at.isoformat(),
                    "text": _memory_text(u)[:500],
                }
            )
        return neutral_json({"agent": agent, "goals": [g.goal_id for g in open_goals], "steps": out})

    def _accessed(self, events: list[Any]) -> None:
        if events and self.on_accessed is not None:
            self.on_accessed(events)

    def recall(
        self,
        agent: str,
        query: Any = None,
        k: Any = None,
        explain: Any = None,
        filters: Any = None,
        record: Any = None,
        goals: Any = None,
        user_id: Any = None,
        without: Any = None,
    ) -> dict[str, Any]:
        """The memories of the agent's scope chain that best answer ``query`` (fused retrieval): those of
        ``user_id`` and of no user (without ``user_id``: of no user), filtered before ranking. With an
        open goal of the agent (and ``goals`` not false), re-ranked towards it (``goal_recall``).

        Each hit is recorded as an access (published on the memory topic) unless ``record`` is false
        (evaluations and analysts' looks, which should not change what they measure). ``without``:
        signals left out of the fusion, comma-separated (an ablation: ``somnus eval locomo --without
        graph``)."""
        if not query:
            raise BadRequest("parameter `query`: the text to recall memories for is required")
        left_out = [x.strip() for x in str(without).split(",") if x.strip()] if without else []
        unknown = sorted(set(left_out) - set(SIGNALS))
        if unknown:
            raise BadRequest(
                f"parameter `without`: not a signal: {', '.join(unknown)[:80]} (signals: {', '.join(SIGNALS)})"
            )
        config = (
            RecallConfig(weights={n: (0.0 if n in left_out else w) for n, w in DEFAULT_WEIGHTS.items()})
            if left_out
            else None
        )
        wanted = _json_param(filters, "filters") if filters else None
        if wanted is not None and not isinstance(wanted, dict):
            raise BadRequest('parameter `filters`: a JSON object such as {"tool": "book_reservation"}')
        user = _user(user_id)
        open_goals, pull = self._goals().pull(agent, user) if goals is None or _bool(goals, "goals") else ([], 0.0)
        got = goal_recall(
            self._memory().index,
            str(query),
            agent,
            _int(k, "k", 10, hi=1000),
            open_goals,
            pull,
            filters=wanted,
            now=datetime.now(timezone.utc),
            agents=self.agents,
            user_id=user,
            config=config,
        )
        if str(record).lower() not in ("0", "false", "no"):
            self._accessed(got.accessed)
        show = str(explain).lower() in ("1", "true", "yes") if explain is not None else False
        hits = []
        for h in got.hits:
            u = h.unit
            hit = {
                "memory_id": h.memory_id,
                "rank": h.rank,
                "score": round(h.score, 6),
                "kind": u.kind.value,
                "agent": u.agent,
                "run_id": u.run_id,
                "occurred_at": u.occurred_at.isoformat(),
                "refs": h.refs,
                "speaker": u.speaker,
                "text": u.perception[:500],
                "outcome": u.outcome or None,
                "source_event_ids": [str(x) for x in u.source_event_ids],
            }
            if show:
                hit["signals"] = {n: round(v, 6) for n, v in h.signals.items()}
                hit["ranks"] = h.ranks
            hits.append(hit)
        return {"agent": agent, "query": query, "people": got.people, "hits": hits}

    def episodic_context(
        self,
        agent: str,
        query: Any = None,
        top_k: Any = None,
        token_budget: Any = None,
        success_only: Any = None,
        domain_hint: Any = None,
        min_relevance: Any = None,
        user_id: Any = None,
    ) -> dict[str, Any]:
        """The token-budgeted text of relevant past work (task, relevance, result, lessons, tools), from
        the memories of ``user_id`` and of no user, as ``recall``."""

        if not query:
            raise BadRequest("parameter `query`: the text to build the context for is required")
        ctx = build_episodic_context(
            self._memory().index,
            str(query),
            agent,
            now=datetime.now(timezone.utc),
            top_k=_int(top_k, "top_k", 5, hi=100),
            token_budget=_int(token_budget, "token_budget", 2000, hi=1_000_000),
            success_only=_bool(success_only, "success_only"),
            domain_hint=str(domain_hint) if domain_hint else None,
            min_relevance=_float(min_relevance, "min_relevance", MIN_RELEVANCE),
            agents=self.agents,
            user_id=_user(user_id),
        )
        self._accessed(ctx.accessed)
        # the text is neutralised line by line as it is rendered; every other string here too (the echo)
        return {**neutral_json({"agent": agent, "query": query, "entries": len(ctx.entries)}), "text": ctx.text}

    # ---- semantic memory (concepts, patterns) ----
    def _semantic(self) -> Any:
        if self.semantic is None:  # no projector: replay the log from the file (read-only)
            self.semantic = SemanticProjection(self.con)
        return self.semantic

    def knowledge_context(
        self, agent: str, query: Any = None, limit: Any = None, user_id: Any = None
    ) -> list[dict[str, Any]]:
        """What the agent knows, as one ranked list (concepts with relationships, confirmed patterns)
        over the owners of its scope chain (its own, its team's, global).

        A record derived from agents' data (``somnus.processors.semantic.concepts.record_agents``: the callers of the
        tools it is about, a pattern's ``source_agents``) is served only when the reader's chain covers
        every one of those agents (``somnus.processors.briefing.generator.covers``: the reader itself, or an agent it
        shares a team scope with), and one of unknown provenance not at all: a pattern about another
        team's private tool would name it. Every owner's memory is checked, the agent's own too
        (a memory promoted before promotion read only its owner's scope may hold others' data).
        For a reader acting for a user, nothing (``WITHHELD``): concepts and patterns are counted
        over every user's sessions and carry no user."""
        from somnus.schemas.agents import scope_chain

        n = _int(limit, "limit", 8, hi=100)
        if _user(user_id) is not None:
            return []
        layers = self._semantic().layers
        chain = scope_chain(dict(self.agents), agent)
        owners = [o for o in chain if o in layers]
        tools = sorted(
            {str(c.properties["tool"]) for o in owners for c in layers[o].atl if "tool" in c.properties}
            | {t for o in owners for r in layers[o].ag for t in r.subjects}
        )
        callers: dict[str, set[str]] = {}
        if tools:
            for tool, who in self.con.execute(
                "SELECT DISTINCT t.tool, e.agent FROM episodes e, unnest(e.tools) AS t(tool) "
                "WHERE t.tool IN (SELECT unnest(?::VARCHAR[]))",
                [tools],
            ).fetchall():
                callers.setdefault(tool, set()).add(who)

        def readable_in(owner: str) -> Callable[[Any, str], bool]:
            def readable(layer: Any, record_id: str) -> bool:
                got = record_agents(layers[owner], layer, record_id, callers)
                return got is not None and all(covers(self.agents, agent, a) for a in got)

            return readable

        entries = [
            (e, owner)
            for owner in owners
            for e in knowledge_context(
                layers[owner], query=str(query) if query else None, limit=n, readable=readable_in(owner)
            )
        ]
        entries.sort(key=lambda x: (-x[0].score, x[0].name, x[0].record_id))
        return [{**neutral_json(_jsonable(e)), "owner": owner} for e, owner in entries[:n]]

    def stream_time(self, scope: Any = None) -> dict[str, Any]:
        """The newest event time of a scope's agents (what a person's command is stamped with)."""
        try:
            return queries.stream_time(self.con, self.agents, str(scope or "global"))
        except ValueError as exc:
            raise BadRequest(f"parameter `scope`: {exc}") from None

    def promotion_inputs(self, owner: Any = None) -> Any:
        """A snapshot of what promotion reads now (NAc candidate links, call outcomes): ``somnus consolidate``."""

        try:
            # published by `somnus consolidate` / `somnus sleep`: its topics sealed as the projector's own
            return _jsonable(
                sealed_request(
                    self.con, promotion_inputs(self.con, owner=str(owner or "global"), agents=self.agents), self.keys
                )
            )
        except ValueError as exc:  # an owner that is not global, team:<lead> or agent:<name>
            raise BadRequest(f"parameter `owner`: {exc}") from None

    # ---- context assembly (working memory + every tier) ----
    def context(
        self, agent: str, query: Any = None, user_id: Any = None, session_id: Any = None, max_tokens: Any = None
    ) -> dict[str, Any]:
        """One fitted context for a model: the user's synopsis, the session's recent conversation, and
        the fused best of episodic recall, the knowledge graph and the briefing (processors/briefing/context.py).

        Isolation by construction: every source is read for the reader's scope chain and user before
        anything is ranked. The synopsis is built from the user's memories in the agent's scope chain
        only (cached per user and agent); recall reads the chain's memories of the user (or of no
        user); a fact is read when it is in the chain and some episode of the user (or of no user)
        asserted its statement (``KnowledgeStore.facts(for_user=True)``); the briefing's lessons are
        read from the ``lessons`` rows of the agent's episodes of the user (or of no user), not from
        the rendered briefing, whose lines no longer say whose they are."""
        if not query:
            raise BadRequest("parameter `query`: the text to assemble a context for is required")
        user = str(user_id) if user_id else None
        now = datetime.now(timezone.utc)

        def episodic(q: str, a: str, u: str | None, k: int) -> list[ContextCandidate]:
            got = recall(self._memory().index, q, a, k=k, now=now, agents=self.agents, user_id=u)
            self._accessed(got.accessed)
            return [
                ContextCandidate(
                    text=_memory_text(h.unit),
                    score=h.score,
                    source_id=h.memory_id,
                    user_id=h.unit.user_id,
                    observed_at=h.unit.occurred_at,
                )
                for h in got.hits
            ]

        def knowledge(q: str, a: str, u: str | None, k: int) -> list[ContextCandidate]:
            return [
                ContextCandidate(
                    text=f"{f.source} {f.predicate} {f.target} (confidence {f.confidence:.2f})",
                    score=f.confidence,
                    source_id=f.triple_id,
                )
                for f in self.store.facts(a, limit=k, for_user=True, user_id=u)
            ]

        def briefing(q: str, a: str, u: str | None, k: int) -> list[ContextCandidate]:
            rows = self.con.execute(
                "SELECT l.kind, l.text, l.episode_id::VARCHAR, l.idx, e.user_id FROM lessons l "
                "JOIN episodes e USING (episode_id) WHERE l.agent = ? AND (e.user_id IS NULL OR e.user_id = ?) "
                "ORDER BY l.learned_at DESC, l.episode_id, l.idx LIMIT ?",
                [a, u, 4 * k],
            ).fetchall()
            lines = {f"[{kind}] {text}": (f"lesson:{ep}#{idx}", who) for kind, text, ep, idx, who in rows}
            return [
                ContextCandidate(text=ln, score=1.0 / (i + 1), source_id=sid, user_id=who)
                for i, (ln, (sid, who)) in enumerate(list(lines.items())[:k])
            ]

        where, params = "agent = ? AND NOT closed AND user_id IS NOT DISTINCT FROM ?", [agent, user]
        if session_id:  # the reader's user's session or a session of no user (not another user's: even its id)
            where, params = "agent = ? AND session_id = ?", [agent, str(session_id)]
            if user is not None:
                where, params = where + " AND (user_id IS NULL OR user_id = ?)", [*params, user]
        row = self.con.execute(
            f"SELECT state FROM working_memory WHERE {where} ORDER BY last_seq DESC LIMIT 1", params
        ).fetchone()
        buffer = decode_state(row[0].encode() if isinstance(row[0], str) else row[0]) if row else None
        synopsis = None
        if user is not None:
            chain = scope_chain(dict(self.agents), agent)

            def load(u: str) -> list[UserMemory]:
                rows = self.con.execute(
                    "SELECT memory_id, kind, perception, occurred_at, user_interaction FROM memories WHERE user_id = ? "
                    "AND scope IN (SELECT unnest(?::VARCHAR[])) ORDER BY occurred_at DESC LIMIT 500",
                    [u, chain],
                ).fetchall()
                return [
                    UserMemory(user_id=u, kind=stored_kind(k, said), text=t or "", observed_at=at, source_id=m)
                    for m, k, t, at, said in rows
                ]

            synopsis = self.synopses.get(user, now, load, view=agent)
        got = get_context(
            str(query),
            agent,
            user,
            _int(max_tokens, "max_tokens", 4000, hi=1_000_000),
            tiers=[
                Tier("episodic", episodic),
                Tier("knowledge", knowledge, weight=0.5),
                Tier("briefing", briefing, weight=0.5),
            ],
            buffer=buffer,
            synopsis=synopsis,
        )
        out = _jsonable(got)
        # the text is neutralised line by line as it is assembled; every other string here too (ids, echo)
        return {**neutral_json({**out, "session_id": buffer.session_id if buffer else None}), "text": out["text"]}

    # ---- outcomes and rhythms (NAc, SCN) ----
    def predict(self, tool: Any = None, args: Any = None, agent: Any = None, hour: Any = None) -> dict[str, Any]:
        """Likely outcomes of calling ``tool`` with ``args`` (JSON object; absent: the tool as a whole)."""
        if not tool:
            raise BadRequest("parameter `tool`: the tool about to be called is required")
        params = None
        if args not in (None, ""):
            params = _json_param(args, "args")
            if not isinstance(params, dict):
                raise BadRequest("parameter `args`: a JSON object of the call's arguments")
        context = {k: str(v) for k, v in (("agent", agent), ("hour", hour)) if v not in (None, "")}
        return neutral_json(_jsonable(predict_from(self.con, str(tool), params, context or None)))

    def advise(self, agent: str, task: Any = None, user_id: Any = None) -> dict[str, Any]:
        """The Maxim bridges for a task about to start (``somnus.processors.prediction.advise``). For a
        reader acting for a user, nothing (``WITHHELD``: risks and strategies count every user's sessions)."""
        from somnus.processors.prediction.advise import advise
        from somnus.projections.advice import AdviceCache

        if not task or not str(task).strip():
            raise BadRequest("parameter `task`: the text of the task about to start is required")
        if _user(user_id) is not None:
            return {
                "agent": agent,
                "task": str(task),
                "related": 0,
                "planning": [],
                "risks": [],
                "escalation": None,
                "salience": [],
                "withheld": WITHHELD,
            }
        cache = self.extra.setdefault("advice", AdviceCache())
        version = self.extra.get("store_version")  # the projector's offsets (else read from the table)
        return neutral_json(
            _jsonable(advise(agent, str(task), cache.inputs_for(self.con, agent, version() if version else None)))
        )

    def tools(self) -> list[dict[str, Any]]:
        """Exact calls and errors per tool (counts behind the tool-level links)."""
        return _rows(
            self.con.execute(
                "SELECT tool, calls, errors, round(error_rate, 4) AS error_rate "
                "FROM tool_outcomes ORDER BY error_rate DESC, tool"
            )
        )

    def rhythms(
        self, agent: str, hours: Any = None, days: Any = None, top: Any = None, user_id: Any = None
    ) -> list[dict[str, Any]]:
        """What usually happens at these local hours (``hours`` "9" or "8,9,10"; ``days`` "weekdays",
        "weekend" or "0,1": Monday is 0). For a reader acting for a user, nothing (``WITHHELD``: the
        bins count every user's sessions)."""

        try:
            hs = [int(h) for h in str(hours).split(",")] if hours not in (None, "") else list(range(24))
            ds = (
                None
                if days in (None, "")
                else list(WEEKDAYS)
                if days == "weekdays"
                else list(WEEKEND)
                if days == "weekend"
                else [int(d) for d in str(days).split(",")]
            )
        except ValueError:
            raise BadRequest(
                "parameters `hours` / `days`: comma-separated integers (days also weekdays|weekend)"
            ) from None
        top_n = _int(top, "top", 5)
        if _user(user_id) is not None:
            return []
        cells = self.con.execute(
            "SELECT agent, kind, bin_kind, bin, count, successes, failures FROM temporal_bins "
            "WHERE agent = ? AND bin_kind IN ('hour', 'weekhour')",
            [agent],
        ).fetchall()
        index = TemporalIndex.from_deltas(TemporalBinCounted(*c) for c in cells)
        return [
            {**neutral_json(_jsonable(k)), "success_rate": k.success_rate}  # kinds name tools and outcomes
            for k in index.usual_at(agent, hs, ds, top=top_n)
        ]

    def oscillators(
        self, agent: str, anomaly_min: Any = None, limit: Any = None, user_id: Any = None
    ) -> list[dict[str, Any]]:
        """The agent's coupled oscillators (when enabled): per pattern, events, locked rhythms, coherence
        r, coupling eigenvalues, the next predicted recurrence after its last event, and its stored
        anomalies (readings at or above ``anomaly_min``, newest first). For a reader acting for a user,
        nothing (``WITHHELD``: each oscillator folds every user's sessions)."""
        if _user(user_id) is not None:
            return []
        cfg = OscillatorConfig(enabled=True)
        floor, top = _float(anomaly_min, "anomaly_min", 0.25), _int(limit, "limit", 10)
        anomalies: dict[str, list[dict[str, Any]]] = {}
        for kind, at, memory_id, anomaly, r in self.con.execute(
            "SELECT kind, occurred_at, memory_id, anomaly, coherence FROM ("
            "  SELECT *, row_number() OVER (PARTITION BY kind ORDER BY occurred_at DESC, memory_id) AS n "
            "  FROM oscillator_readings WHERE agent = ? AND anomaly >= ?) WHERE n <= ? ORDER BY kind, n",
            [agent, floor, top],
        ).fetchall():
            # a memory id is stored text too (a record on the memory topic chooses it)
            anomalies.setdefault(kind, []).append(
                {"at": at.isoformat(), "memory_id": neutral_json(memory_id), "anomaly": anomaly, "r": r}
            )
        out = []
        for kind, raw in self.con.execute(
            "SELECT kind, state FROM oscillators WHERE agent = ? ORDER BY kind", [agent]
        ).fetchall():
            st = msgspec.json.decode(raw, type=OscillatorState)
            last = datetime(1970, 1, 1, tzinfo=timezone.utc) + timedelta(hours=st.at_hours)
            nxt = next_recurrence(st, last, cfg)
            out.append(
                {
                    "kind": neutral_json(kind),
                    "events": st.events,
                    "locked": locked_rhythms(st, cfg),
                    "phases": dict(zip(NAMES, st.theta)),
                    "coherence": coherence(st.theta),
                    "coupling": _jsonable(coupling_analysis(st.weights)),
                    "next_recurrence": nxt.isoformat() if nxt else None,
                    "anomalies": anomalies.get(kind, []),
                }
            )
        return out

    # ---- operators ----
    def memory(self, top: Any = None) -> dict[str, Any]:
        """Memory status: graph size, briefing cache, knowledge utilisation, delegation success."""
        n = _int(top, "top", 5, hi=1000)

        def one(sql: str) -> tuple[Any, ...]:  # an aggregate's one row
            return one_row(self.con, sql)

        cache = one("SELECT count(*), count(*) FILTER (markdown <> ''), max(generated_at) FROM briefings")
        graph = one("SELECT (SELECT count(*) FROM entities), count(*) FILTER (valid_to IS NULL), count(*) FROM triples")
        results = self.con.execute(
            "SELECT agent, payload->>'to_agent', payload->>'outcome' FROM events WHERE type = 'delegation_result' "
            "ORDER BY ts, event_id"
        ).fetchall()
        tallies = tally_delegations({}, [(a, b, o) for a, b, o in results])
        pairs = sorted(tallies.values(), key=lambda t: (t.success_rate, -t.results, t.delegator, t.delegatee))
        # Utilisation: the served records and the uses the projector folded from the facts topic.
        served_rows = _rows(
            self.con.execute(
                "SELECT briefing_id, agent, session_id, served_at, facts FROM briefings_served "
                "ORDER BY served_at DESC LIMIT 5000"
            )
        )
        served = [
            decode_served(msgspec.json.encode({**r, "schema_version": 1, "facts": msgspec.json.decode(r["facts"])}))
            for r in served_rows
        ]
        used = [
            msgspec.convert({**r, "schema_version": 1, "seq": 0}, FactUsed)
            for r in _rows(
                self.con.execute(
                    "SELECT agent, session_id, briefing_id, triple_id, source, predicate, target, scope, confidence, entity, "
                    "used_at FROM fact_uses"
                )
            )
        ]
        util = sorted(utilisation(served, used).values(), key=lambda u: (-u.rate, -u.facts_used, u.agent))
        return {
            "episodes": one("SELECT count(*) FROM episodes")[0],
            "graph": {"entities": graph[0], "active_triples": graph[1], "triples": graph[2]},
            "briefings": {"agents": cache[0], "non_empty": cache[1], "newest": cache[2]},
            "last_consolidation": one("SELECT max(run_at) FROM sleep_runs")[0],
            "utilisation": [msgspec.to_builtins(u) for u in util[:n]],
            "delegations": [
                {
                    "delegator": t.delegator,
                    "delegatee": t.delegatee,
                    "results": t.results,
                    "success_rate": round(t.success_rate, 3),
                    "failing": t.failing,
                }
                for t in pairs[:n]
            ],
            "failing_delegations": [f"{t.delegator}->{t.delegatee}" for t in failing_pairs(tallies)],
        }

    # ---- analysts ----
    def sql(self, sql: Any = None, params: Any = None) -> dict[str, Any]:
        """One SELECT in the SQL sandbox (projections/sql_sandbox.py): its own cursor, parser-checked,
        interrupted after SOMNUS_SQL_TIMEOUT_S."""
        if not isinstance(sql, str):
            raise BadRequest("body field `sql`: a SELECT statement is required")
        if params is not None and not isinstance(params, (list, tuple)):
            raise BadRequest("body field `params`: an array of the placeholders' values")
        if self.sandbox is None:  # no projector made one: a file opened for this read
            self.sandbox = SqlSandbox.from_settings(self.con)
        try:
            return self.sandbox.run(sql, params or None)
        except (SqlRefused, SqlTimeout) as exc:
            raise BadRequest(str(exc)) from None

    def kafka_positions(self) -> dict[str, Any]:
        """End offsets and the worker's committed offsets, asked of Kafka by the running projector
        (projections/positions.py)."""
        ask = self.extra.get("kafka_positions")
        if ask is None:
            raise NotFound("Kafka positions are answered by a running projector only")
        return ask()

    def export_parquet(self, dir: Any = None, tables: Any = None, since: Any = None) -> dict[str, Any]:
        """Every projection as hive-partitioned Parquet from one committed snapshot (projections/export.py)."""
        from somnus.projections.export import ExportError, export_parquet

        if tables is not None and not (isinstance(tables, list) and all(isinstance(t, str) for t in tables)):
            raise BadRequest("body field `tables`: an array of table names")
        try:
            return export_parquet(self.con, dir, tables, since)
        except ExportError as exc:
            raise BadRequest(str(exc)) from None

    def summary(self) -> dict[str, Any]:
        return queries.summary(self.con)

    def checksum(self) -> dict[str, Any]:
        return {"checksum": queries.checksum(self.con), "tables": queries.table_checksums(self.con)}


def register(route: Route, method: Callable[..., Any]) -> None:
    """Add a read: ``method(service, agent?, **params)`` becomes ``ReadService.<route.handler>``."""
    setattr(ReadService, route.handler, method)
    EXTRA_ROUTES.append(route)


def all_routes() -> list[Route]:
    return [*ROUTES, *EXTRA_ROUTES]


def call(service: ReadService, route: Route, agent: str | None, params: Mapping[str, Any]) -> Any:
    """Run ``route`` on ``service`` with the request's parameters (unknown ones are an error)."""
    allowed = {p[0] for p in route.params}
    unknown = sorted(set(params) - allowed)
    if unknown:
        raise BadRequest(f"unknown parameter(s) for {route.path}: {', '.join(unknown)}")
    # A JSON body (or an MCP call) can carry "\ud800", a lone surrogate, which DuckDB could not take (a 500)
    for name, value in (("agent", agent), *params.items()):
        if isinstance(value, str) and not _is_text(value):
            raise BadRequest(f"parameter `{name}`: not valid Unicode text (a lone surrogate)")
    method = getattr(service, route.handler)
    return method(agent, **params) if "{agent}" in route.path else method(**params)


def openapi() -> dict[str, Any]:
    """An OpenAPI 3.1 description of every route."""
    paths: dict[str, Any] = {}
    for r in all_routes():
        op: dict[str, Any] = {
            "summary": r.summary,
            "operationId": r.handler,
            "responses": {
                "200": {"description": "JSON"},
                "400": {"description": "bad parameter"},
                "404": {"description": "not found"},
            },
        }
        parameters = []
        if "{agent}" in r.path:
            parameters.append({"name": "agent", "in": "path", "required": True, "schema": {"type": "string"}})
        if r.method == "GET":
            parameters += [
                {"name": n, "in": "query", "required": False, "schema": {"type": t}, "description": d}
                for n, t, d in r.params
            ]
        elif r.params:
            op["requestBody"] = {
                "required": True,
                "content": {
                    "application/json": {
                        "schema": {
                            "type": "object",
                            "properties": {n: {"type": t, "description": d} for n, t, d in r.params},
                        }
                    }
                },
            }
        if parameters:
            op["parameters"] = parameters
        paths.setdefault(r.path, {})[r.method.lower()] = op
    return {"openapi": "3.1.0", "info": {"title": "Somnus read API", "version": "1"}, "paths": paths}
