"""KnowledgeStore: the typed read interface over the knowledge projections, scoped to a reading agent.

Every read takes the reading agent and returns only facts in its scope chain (own agent scope,
its team, extra ``knowledgeScopes``, global; ``somnus.schemas.agents.scope_chain``). Entities are visible
to an agent when a fact in its chain mentions them. Writes do not happen here: facts are published
to the ``facts`` topic (``KnowledgeStore.assert_facts``) and the projector, the only writer, folds
them into the log. ``sql`` is the read-only escape hatch for analysts; it is not scoped.

The store runs its SQL through a backend: a DuckDB connection (the projector, tests, benchmarks)
or ``somnus.reads`` (the running projector over HTTP, else the file read-only).

>>> import duckdb
>>> from projections import schema
>>> con = duckdb.connect(); schema.init(con)
>>> store = KnowledgeStore(DuckDBBackend(con), agents={})
>>> store.facts("support")
[]
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, Protocol

import duckdb
import msgspec

from somnus.processors.knowledge.triples import Triple
from somnus.projections.schema import FACTS_TOP_K
from somnus.schemas.agents import AgentSpec, scope_chain
import heapq
from somnus.projections.queries import check_read_only


class Backend(Protocol):
    def query(self, sql: str, params: Sequence[Any]) -> tuple[list[str], list[list[Any]]]: ...


class DuckDBBackend:
    def __init__(self, con: duckdb.DuckDBPyConnection) -> None:
        self.con = con

    def query(self, sql: str, params: Sequence[Any]) -> tuple[list[str], list[list[Any]]]:
        cur = self.con.cursor()
        try:
            rel = cur.execute(sql, list(params))
            cols = [d[0] for d in rel.description] if rel.description else []
            return cols, [list(r) for r in rel.fetchall()]
        finally:
            cur.close()


Fact = Triple  # a fact as read: one row of the triple log

# A fact ``f`` some episode of the reader's user (the one parameter; NULL: no user), or of no user,
# asserted or reinforced: the same statement in any scope (a promoted copy's own history names the
# promotion, not an episode).
# (A semi-join: twice as fast as the correlated EXISTS it equals.)
USER_PROVENANCE = (
    "(f.source, f.predicate, f.target) IN (SELECT s.source, s.predicate, s.target FROM triples s "
    "WHERE s.triple_id IN (SELECT h.triple_id FROM triple_history h WHERE h.episode_id IN "
    "(SELECT episode_id FROM episodes WHERE user_id IS NULL OR user_id = ?)))"
)


class Entity(msgspec.Struct, frozen=True):
    entity_id: str
    name: str
    type: str
    attributes: dict[str, Any]
    first_seen: datetime
    facts: int  # facts in the reader's chain that mention it


class FactChange(msgspec.Struct, frozen=True):
    """One belief change: a fact asserted, reinforced or superseded, and the episode that caused it."""

    ordinal: int
    triple_id: str
    change: str
    episode_id: str
    at: datetime
    count: int
    confidence: float
    source: str
    predicate: str
    target: str
    scope: str


_FACT_COLS = (
    "triple_id, source, predicate, target, scope, confidence, count, evidence, last_evidence, "
    "valid_from, valid_to, superseded_by, created_by, extractor"
)


def _ts(v: Any) -> datetime | None:
    if v is None or isinstance(v, datetime):
        return v
    return datetime.fromisoformat(str(v))


def _s(v: Any) -> str | None:
    return None if v is None else str(v)


class TopFacts:
    """``facts_top`` held in memory, per scope, best first: the projector keeps it in step (``refresh``
    after each batch, for the scopes it changed), so the plain "best facts of my scope chain" read
    merges a few short lists instead of running a query (a DuckDB query costs milliseconds)."""

    def __init__(self) -> None:
        self.by_scope: dict[str, list[Fact]] = {}

    def refresh(self, con: duckdb.DuckDBPyConnection, scopes: Sequence[str] | None = None) -> None:
        where, params = ("", []) if scopes is None else ("WHERE scope IN (SELECT unnest(?::VARCHAR[]))", [list(scopes)])
        cur = con.execute(
            f"SELECT {_FACT_COLS} FROM facts_top {where} ORDER BY scope, confidence DESC, count DESC, triple_id", params
        )
        cols = [d[0] for d in cur.description]
        fresh: dict[str, list[Fact]] = {s: [] for s in (scopes or [])}
        for row in cur.fetchall():
            f = _fact(dict(zip(cols, row)))
            fresh.setdefault(f.scope, []).append(f)
        if scopes is None:
            self.by_scope = fresh
        else:
            self.by_scope.update(fresh)

    def best(self, chain: Sequence[str], limit: int, min_confidence: float) -> list[Fact]:
        lists = [self.by_scope.get(s, []) for s in chain]
        merged = heapq.merge(*lists, key=lambda f: (-f.confidence, -f.count, f.triple_id))
        out: list[Fact] = []
        for f in merged:
            if f.confidence < min_confidence or len(out) == limit:
                break
            out.append(f)
        return out


class KnowledgeStore:
    def __init__(
        self, backend: Backend, agents: dict[str, AgentSpec], use_top: bool = True, top: TopFacts | None = None
    ) -> None:
        self.backend = backend
        self.agents = agents
        self.use_top = use_top  # False only to measure what facts_top saves (somnus bench facts-query)
        self.top = top  # the projector's in-memory facts_top

    def scope_chain(self, agent: str) -> list[str]:
        return scope_chain(self.agents, agent)

    def _rows(self, sql: str, params: Sequence[Any]) -> list[dict[str, Any]]:
        cols, rows = self.backend.query(sql, params)
        return [dict(zip(cols, r)) for r in rows]

    def facts(
        self,
        agent: str,
        *,
        as_of: datetime | None = None,
        limit: int = 50,
        min_confidence: float = 0.0,
        predicate: str | None = None,
        entity: str | None = None,
        for_user: bool = False,
        user_id: str | None = None,
    ) -> list[Fact]:
        """Facts in ``agent``'s scope chain, highest confidence first: active now, or active at ``as_of``.

        ``for_user``: a reader acting for ``user_id`` (None: for no user) reads only the facts whose
        statement (source, predicate, target, in any scope) some episode of that user, or of no
        user, asserted (``USER_PROVENANCE``): a statement only another user's sessions gave is
        that user's text (an error message, a host) and is left out before ranking."""
        chain = self.scope_chain(agent)
        where = [f"scope IN ({', '.join('?' * len(chain))})", "confidence >= ?"]
        params: list[Any] = [*chain, min_confidence]
        if for_user:
            where.append(USER_PROVENANCE)
            params.append(user_id)
        if as_of is None:
            where.append("valid_to IS NULL")
        else:
            where.append("valid_from <= ? AND (valid_to IS NULL OR valid_to > ?)")
            params += [as_of, as_of]
        if predicate is not None:
            where.append("predicate = ?")
            params.append(predicate)
        if entity is not None:
            where.append("(source = ? OR target = ?)")
            params += [entity, entity]
        if (
            self.top is not None
            and self.use_top
            and as_of is None
            and predicate is None
            and entity is None
            and not for_user
            and limit <= FACTS_TOP_K
        ):
            return self.top.best(chain, limit, min_confidence)
        params.append(limit)
        # The plain "best facts now" query reads facts_top (the best FACTS_TOP_K active facts of each
        # scope): the best `limit` of the chain are among the best `limit` of each of its scopes. Not
        # for a user: that scope's best may all be other users', and the filter comes before the cut.
        table = (
            "facts_top"
            if (
                self.use_top
                and as_of is None
                and predicate is None
                and entity is None
                and not for_user
                and limit <= FACTS_TOP_K
            )
            else "triples"
        )
        rows = self._rows(
            f"SELECT {_FACT_COLS} FROM {table} AS f WHERE {' AND '.join(where)} "
            "ORDER BY confidence DESC, count DESC, triple_id LIMIT ?",
            params,
        )
        return [_fact(r) for r in rows]

    def as_of(self, agent: str, when: datetime, **kw: Any) -> list[Fact]:
        return self.facts(agent, as_of=when, **kw)

    def entities(
        self,
        agent: str,
        *,
        type: str | None = None,
        limit: int = 100,
        for_user: bool = False,
        user_id: str | None = None,
    ) -> list[Entity]:
        """Entities mentioned by any fact (active or not) in ``agent``'s chain, most mentioned first.

        An entity's attributes (an error's first example text, its HTTP status) are shown only when
        every episode that set any of them was an agent's whose own scope is in the chain: they are
        the first example seen fleet-wide, so another agent's would show its text (``{}`` instead).

        ``for_user``: a reader acting for ``user_id`` (None: for no user) reads only entities that a
        fact it may read (``USER_PROVENANCE``) mentions, with attributes only when every episode that
        set them was of that user or of no user."""
        chain = self.scope_chain(agent)
        marks = ", ".join("?" * len(chain))
        mine = f"AND {USER_PROVENANCE}" if for_user else ""
        other_user = "OR ep.user_id IS DISTINCT FROM ? AND ep.user_id IS NOT NULL" if for_user else ""
        users = [user_id] if for_user else []
        params: list[Any] = [*chain, *users, *chain, *users, *chain, *users]
        type_filter = ""
        if type is not None:
            type_filter = "AND e.type = ?"
            params.append(type)
        params.append(limit)
        rows = self._rows(
            f"WITH m AS (SELECT source AS id FROM triples f WHERE scope IN ({marks}) {mine} "
            f"            UNION ALL SELECT target FROM triples f WHERE scope IN ({marks}) {mine}), "
            f"v AS (SELECT entity_id, episode_id, attributes::VARCHAR AS now_, "
            f"             lag(attributes::VARCHAR) OVER (PARTITION BY entity_id ORDER BY version) AS before "
            f"      FROM entity_versions WHERE entity_id IN (SELECT id FROM m)), "
            f"foreign_ AS (SELECT DISTINCT v.entity_id FROM v LEFT JOIN knowledge_inputs k USING (episode_id) "
            f"             LEFT JOIN (SELECT DISTINCT episode_id, user_id FROM episodes) ep USING (episode_id) "
            f"             WHERE v.now_ <> coalesce(v.before, '{{}}') "
            f"               AND (k.agent IS NULL OR 'agent:' || k.agent NOT IN ({marks}) {other_user})) "
            f"SELECT e.entity_id, e.name, e.type, CASE WHEN e.entity_id IN (SELECT entity_id FROM foreign_) "
            f"       THEN '{{}}'::JSON ELSE e.attributes END AS attributes, e.first_seen, count(*) AS facts "
            f"FROM m JOIN entities e ON e.entity_id = m.id WHERE true {type_filter} "
            f"GROUP BY ALL ORDER BY facts DESC, e.entity_id LIMIT ?",
            params,
        )
        return [
            Entity(
                entity_id=r["entity_id"],
                name=r["name"],
                type=r["type"],
                attributes=msgspec.json.decode(r["attributes"])
                if isinstance(r["attributes"], str)
                else (r["attributes"] or {}),
                first_seen=_ts(r["first_seen"]),  # type: ignore[arg-type]
                facts=int(r["facts"]),
            )
            for r in rows
        ]

    def triples(self, agent: str, *, include_closed: bool = True, limit: int = 1000) -> list[Fact]:
        """Every fact in the chain, closed ones too (the log), in order of validity."""
        chain = self.scope_chain(agent)
        closed = "" if include_closed else "AND valid_to IS NULL"
        rows = self._rows(
            f"SELECT {_FACT_COLS} FROM triples WHERE scope IN ({', '.join('?' * len(chain))}) "
            f"{closed} ORDER BY valid_from, triple_id LIMIT ?",
            [*chain, limit],
        )
        return [_fact(r) for r in rows]

    def history(
        self, agent: str, entity: str, *, for_user: bool = False, user_id: str | None = None
    ) -> list[FactChange]:
        """Every change to facts about ``entity`` (an entity id) in the chain, oldest first.

        ``for_user``: a reader acting for ``user_id`` (None: for no user) reads the changes of facts it
        may read (``USER_PROVENANCE``) made by an episode of that user or of no user, or by no episode
        (a promotion's change names the promotion)."""
        chain = self.scope_chain(agent)
        mine, users = "", []
        if for_user:
            mine = (
                f"AND {USER_PROVENANCE} AND h.episode_id NOT IN (SELECT episode_id FROM episodes "
                "WHERE user_id IS NOT NULL AND user_id IS DISTINCT FROM ?)"
            )
            users = [user_id, user_id]
        rows = self._rows(
            "SELECT h.ordinal, h.triple_id, h.change, h.episode_id, h.changed_at AS at, h.count, h.confidence, "
            "f.source, f.predicate, f.target, f.scope FROM triple_history h JOIN triples f USING (triple_id) "
            f"WHERE f.scope IN ({', '.join('?' * len(chain))}) AND (f.source = ? OR f.target = ?) {mine} "
            "ORDER BY h.ordinal",
            [*chain, entity, entity, *users],
        )
        return [
            FactChange(
                ordinal=int(r["ordinal"]),
                triple_id=str(r["triple_id"]),
                change=r["change"],
                episode_id=str(r["episode_id"]),
                at=_ts(r["at"]),  # type: ignore[arg-type]
                count=int(r["count"]),
                confidence=float(r["confidence"]),
                source=r["source"],
                predicate=r["predicate"],
                target=r["target"],
                scope=r["scope"],
            )
            for r in rows
        ]

    def sql(self, query: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
        """Read-only raw SQL over every projection (not scoped: an analyst's tool, not an agent's)."""
        check_read_only(query)
        return self._rows(query, params)


def _fact(r: dict[str, Any]) -> Fact:
    return Fact(
        triple_id=str(r["triple_id"]),
        source=r["source"],
        predicate=r["predicate"],
        target=r["target"],
        scope=r["scope"],
        confidence=float(r["confidence"]),
        count=int(r["count"]),
        evidence=str(r["evidence"]),
        last_evidence=_s(r["last_evidence"]),
        valid_from=_ts(r["valid_from"]),  # type: ignore[arg-type]
        valid_to=_ts(r["valid_to"]),
        superseded_by=_s(r["superseded_by"]),
        created_by=r["created_by"],
        extractor=r["extractor"],
    )
