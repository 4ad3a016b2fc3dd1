"""Knowledge utilisation and scope promotion, folded in the order of the one-partition facts topic.

The facts topic carries, in one total order, what the projector needs to judge utilisation:
``BriefingServed`` records (published when a briefing is injected for a named session) and each
episode's ``FactsExtracted`` (the entities its session acted on). When the extraction of a session
that was served a briefing arrives, the served facts about entities it acted on become ``FactUsed``
(``somnus.processors.knowledge.swarm_metrics.facts_used_in_episode``), and ``somnus.processors.knowledge.swarm_metrics.PromotionFold`` counts them per
statement: a statement used by enough teammates (``learningRate``) is promoted to their team, one
used across enough teams to global. Promotions by hand (``somnus promote``) are on the same topic
and reset the counters the same way. Every promotion enters the triple log as the statement
asserted in the wider scope (``somnus.processors.knowledge.swarm_metrics.promoted_facts``), right after what caused it.

Tables: ``briefings_served``, ``fact_uses``, ``promotions`` (append-only), and ``promotion_state``
(the fold's state per statement, so a restart continues where the committed batch left it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import duckdb
import msgspec
import pyarrow as pa

from somnus.processors.knowledge.triples import entity_id
from somnus.processors.knowledge.swarm_metrics import (
    PromotionFold,
    StatementState,
    facts_used_in_episode,
    promoted_facts,
    statement_key,
)
from somnus.schemas.briefing import BriefingServed, FactPromoted, FactUsed
from somnus.schemas.episodes import episode_id_for
from somnus.schemas.facts import FactsExtracted
from somnus.projections.frames import registered


class UtilisationFold:
    def __init__(self, con: duckdb.DuckDBPyConnection) -> None:
        self.reload(con)

    def reload(self, con: duckdb.DuckDBPyConnection) -> None:
        self.served: dict[str, BriefingServed] = {}
        for bid, agent, sid, at, facts in con.execute(
            "SELECT briefing_id, agent, session_id, served_at, facts FROM briefings_served ORDER BY src_offset"
        ).fetchall():
            served = msgspec.convert(
                {
                    "schema_version": 1,
                    "briefing_id": bid,
                    "agent": agent,
                    "session_id": sid,
                    "served_at": at,
                    "facts": msgspec.json.decode(facts),
                },
                BriefingServed,
            )
            self.served[str(episode_id_for(agent, sid))] = served
        self.used: set[tuple[str, str]] = set(con.execute("SELECT session_id, triple_id FROM fact_uses").fetchall())
        self.promotions: set[str] = {str(r[0]) for r in con.execute("SELECT promotion_id FROM promotions").fetchall()}
        self.served_keys: set[tuple[str, str, str]] = set(
            con.execute("SELECT agent, session_id, briefing_id FROM briefings_served").fetchall()
        )
        self.promotion = PromotionFold(
            {
                k: msgspec.json.decode(v, type=StatementState)
                for k, v in con.execute("SELECT statement, state FROM promotion_state").fetchall()
            }
        )

    def fold(
        self, con: duckdb.DuckDBPyConnection, agents: Mapping[str, Any], items: Sequence[tuple[str, int, Any]]
    ) -> list[tuple[int, FactsExtracted]]:
        """Fold facts-topic items (``("facts"|"served"|"promotion", offset, record)``) in order; returns
        what the knowledge fold takes, in order (promotions as facts in their new scope)."""
        out: list[tuple[int, FactsExtracted]] = []
        served_rows, use_rows, promo_rows = [], [], []
        touched: set[str] = set()

        def promoted(p: FactPromoted, offset: int) -> None:
            self.promotions.add(str(p.promotion_id))
            promo_rows.append(_promotion_row(p, offset))
            touched.add(statement_key(p.source, p.predicate, p.target))
            out.append((offset, promoted_facts(p)))

        for kind, offset, obj in items:
            if kind == "served":
                key = (obj.agent, obj.session_id, obj.briefing_id)
                if key in self.served_keys:
                    continue  # re-published: once
                self.served_keys.add(key)
                served_rows.append(
                    {
                        "briefing_id": obj.briefing_id,
                        "agent": obj.agent,
                        "session_id": obj.session_id,
                        "served_at": obj.served_at,
                        "facts": msgspec.json.encode(obj.facts).decode(),
                        "src_offset": offset,
                    }
                )
                self.served[str(episode_id_for(obj.agent, obj.session_id))] = obj
            elif kind == "promotion":
                if str(obj.promotion_id) in self.promotions:
                    continue
                self.promotion.apply(agents, [obj])
                promoted(obj, offset)
            else:
                out.append((offset, obj))
                served = self.served.get(str(obj.episode_id))
                if served is None:
                    continue
                acted = [entity_id(e.type, e.name) for e in obj.entities]
                acted += [entity_id(f.source_type, f.source) for f in obj.facts]
                acted += [entity_id(f.target_type, f.target) for f in obj.facts]
                used = [
                    u
                    for u in facts_used_in_episode(served, acted, obj.observed_at)
                    if (u.session_id, u.triple_id) not in self.used
                ]
                for u in used:
                    self.used.add((u.session_id, u.triple_id))
                    use_rows.append(_use_row(u, offset))
                    touched.add(statement_key(u.source, u.predicate, u.target))
                for p in self.promotion.apply(agents, used):
                    promoted(p, offset)
        _insert(con, "briefings_served", served_rows)
        _insert(con, "fact_uses", use_rows)
        _insert(con, "promotions", promo_rows)
        if touched:
            frame = pa.Table.from_pylist(
                [
                    {"statement": k, "state": msgspec.json.encode(self.promotion.states[k]).decode()}
                    for k in sorted(touched)
                    if k in self.promotion.states
                ]
            )
            with registered(con, frame=frame):
                con.execute("INSERT OR REPLACE INTO promotion_state SELECT statement, state::JSON FROM frame")
        return out


def _insert(con: duckdb.DuckDBPyConnection, table: str, rows: list[dict[str, Any]], select: str = "*") -> None:
    if rows:
        with registered(con, frame=pa.Table.from_pylist(rows)):
            con.execute(f"INSERT INTO {table} SELECT {select} FROM frame")


def _use_row(u: FactUsed, offset: int) -> dict[str, Any]:
    return {
        "agent": u.agent,
        "session_id": u.session_id,
        "briefing_id": u.briefing_id,
        "triple_id": u.triple_id,
        "source": u.source,
        "predicate": u.predicate,
        "target": u.target,
        "scope": u.scope,
        "confidence": u.confidence,
        "entity": u.entity,
        "used_at": u.used_at,
        "src_offset": offset,
    }


def _promotion_row(p: FactPromoted, offset: int) -> dict[str, Any]:
    return {
        "promotion_id": str(p.promotion_id),
        "source": p.source,
        "predicate": p.predicate,
        "target": p.target,
        "from_scope": p.from_scope,
        "to_scope": p.to_scope,
        "reason": p.reason.value,
        "promoted_at": p.promoted_at,
        "confidence": p.confidence,
        "learning_rate": p.learning_rate,
        "threshold": p.threshold,
        "users": list(p.users),
        "teams": list(p.teams),
        "src_offset": offset,
    }
