"""The knowledge projection: the triple-log fold's output written to DuckDB by the projector.

The projector reads the one-partition ``facts`` topic in offset order and hands each batch here,
inside the transaction that also stores the batch's offsets. A ``FactsExtracted`` for an
(episode, extractor) already folded (re-emitted after a worker restart) is skipped, so the log is
exactly-once; the fold's state is loaded from the tables at start, so a restarted projector
continues where the committed transaction left it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import duckdb
import msgspec
import pyarrow as pa

from somnus.processors.knowledge.triples import (
    EntityAlias,
    EntityVersion,
    KnowledgeChanges,
    KnowledgeFold,
    KnowledgeState,
    PredicateAdded,
    Triple,
)
from somnus.projections import schema
from somnus.schemas.facts import FactsExtracted
from somnus.projections.frames import registered

log = logging.getLogger("somnus.projector")

_facts_decoder = msgspec.json.Decoder(FactsExtracted)


def decode_facts(raw: bytes) -> FactsExtracted:
    return _facts_decoder.decode(raw)


def _rows(items: Sequence[Any]) -> list[dict[str, Any]]:
    out = []
    for item in items:
        row = msgspec.structs.asdict(item)
        if "attributes" in row:
            row["attributes"] = msgspec.json.encode(row["attributes"]).decode()
        out.append(row)
    return out


class KnowledgeProjection:
    def __init__(self, con: duckdb.DuckDBPyConnection) -> None:
        self.inputs: set[tuple[str, str]] = {
            (str(e), x) for e, x in con.execute("SELECT episode_id, extractor FROM knowledge_inputs").fetchall()
        }
        self.fold = KnowledgeFold(load_state(con))

    def write(
        self, con: duckdb.DuckDBPyConnection, batch: Sequence[tuple[int, FactsExtracted]]
    ) -> tuple[int, set[str]]:
        """Fold ``(offset, facts)`` pairs and write the changes; the caller holds the transaction.

        Returns the number of facts folded and the scopes whose triples changed."""
        fresh: list[FactsExtracted] = []
        input_rows = []
        new_inputs: set[tuple[str, str]] = set()
        for offset, fx in batch:
            key = (str(fx.episode_id), fx.extractor)
            if key in self.inputs or key in new_inputs:
                continue
            new_inputs.add(key)
            fresh.append(fx)
            input_rows.append(
                {
                    "episode_id": key[0],
                    "extractor": fx.extractor,
                    "agent": fx.agent,
                    "observed_at": fx.observed_at,
                    "entities": len(fx.entities),
                    "facts": len(fx.facts),
                    "src_offset": offset,
                }
            )
        if not fresh:
            return 0, set()
        changes = self.fold.apply(fresh)
        _insert(
            con,
            "knowledge_inputs",
            input_rows,
            "episode_id::UUID, extractor, agent, observed_at, entities, facts, src_offset",
        )
        scopes = write_changes(con, changes)
        self.inputs |= new_inputs
        return sum(len(f.facts) for f in fresh), scopes


def _insert(con: duckdb.DuckDBPyConnection, table: str, rows: list[dict[str, Any]], select: str) -> None:
    if not rows:
        return
    with registered(con, frame=pa.Table.from_pylist(rows)):
        con.execute(f"INSERT INTO {table} SELECT {select} FROM frame")


def write_changes(con: duckdb.DuckDBPyConnection, changes: KnowledgeChanges) -> set[str]:
    """Insert new rows, update the triples that were reinforced or closed (nothing is deleted).

    Returns the scopes whose triples were asserted, reinforced or closed."""
    _insert(
        con,
        "entity_versions",
        _rows(changes.entities),
        "entity_id, version, name, type, attributes::JSON, first_seen, updated_at, episode_id::UUID",
    )
    _insert(
        con, "entity_aliases", _rows(changes.aliases), "alias, type, entity_id, jaccard, first_seen, episode_id::UUID"
    )
    _insert(con, "predicates", _rows(changes.predicates), "predicate, functional, added_at, episode_id::UUID")
    _insert(con, "triples", _rows(changes.triples_inserted), _TRIPLE_SELECT)
    # Reinforcements of a triple inserted in this same batch: the insert above already has the
    # first values; the update below brings it to the last (rows are applied in order, last wins).
    last_reinforced = {r.triple_id: r for r in changes.triples_reinforced}
    if last_reinforced:
        with registered(con, frame=pa.Table.from_pylist(_rows(list(last_reinforced.values())))):
            con.execute(
                "UPDATE triples SET count = f.count, confidence = f.confidence, last_evidence = "
                "f.last_evidence::UUID FROM frame f WHERE triples.triple_id = f.triple_id::UUID"
            )
    # A stretch can be closed twice in a batch (by a newer belief, then by a late one that takes over
    # the rest of it): the last closing is the state. An UPDATE with two rows for one triple applies
    # either, so a replay in other batches disagreed with the live projection.
    last_closed = {c.triple_id: c for c in changes.triples_closed}
    if last_closed:
        with registered(con, frame=pa.Table.from_pylist(_rows(list(last_closed.values())))):
            con.execute(
                "UPDATE triples SET valid_to = f.valid_to, superseded_by = f.superseded_by::UUID "
                "FROM frame f WHERE triples.triple_id = f.triple_id::UUID"
            )
    _insert(
        con,
        "triple_history",
        _rows(changes.history),
        "ordinal, triple_id::UUID, change, episode_id::UUID, changed_at, count, confidence",
    )
    closed_scopes = set()
    if last_closed or last_reinforced:
        ids = list(last_closed) + list(last_reinforced)
        closed_scopes = {
            r[0]
            for r in con.execute(
                "SELECT DISTINCT scope FROM triples WHERE triple_id IN (SELECT unnest(?::UUID[]))", [ids]
            ).fetchall()
        }
    scopes = set(changes.scopes) | closed_scopes
    schema.refresh_facts_top(con, sorted(scopes))
    return scopes


_TRIPLE_SELECT = (
    "triple_id::UUID, source, predicate, target, scope, confidence, count, evidence::UUID, "
    "last_evidence::UUID, valid_from, valid_to, superseded_by::UUID, created_by, extractor"
)


def load_state(con: duckdb.DuckDBPyConnection) -> KnowledgeState:
    """The fold's state from the committed tables."""

    def structs(sql: str, kind: type) -> list[Any]:
        cur = con.execute(sql)
        cols = [d[0] for d in cur.description]
        rows = [dict(zip(cols, r)) for r in cur.fetchall()]
        for r in rows:
            for k, v in r.items():
                if k == "attributes":
                    r[k] = msgspec.json.decode(v) if isinstance(v, str) else (v or {})
                elif v is not None and k in _UUID_COLS:
                    r[k] = str(v)
        return [msgspec.convert(r, kind, from_attributes=False, strict=False) for r in rows]

    entities = structs(
        "SELECT entity_id, version, name, type, attributes, first_seen, updated_at, episode_id FROM entities",
        EntityVersion,
    )
    # An alias is its episode's agent's (processors/knowledge/triples.py): the agent comes from knowledge_inputs.
    aliases = structs(
        "SELECT a.alias, a.type, a.entity_id, a.jaccard, a.first_seen, a.episode_id, "
        "(SELECT min(k.agent) FROM knowledge_inputs k WHERE k.episode_id = a.episode_id) AS agent "
        "FROM entity_aliases a",
        EntityAlias,
    )
    predicates = structs("SELECT * FROM predicates", PredicateAdded)
    # Active triples, and closed ones (only functional predicates close: their timelines).
    active = structs("SELECT * FROM triples", Triple)
    row = con.execute("SELECT coalesce(max(ordinal) + 1, 0) FROM triple_history").fetchone()
    assert row is not None  # an aggregate's one row
    next_ordinal = row[0]
    return KnowledgeState.from_rows(entities, aliases, predicates, active, next_ordinal)


_UUID_COLS = {"episode_id", "triple_id", "evidence", "last_evidence", "superseded_by"}
