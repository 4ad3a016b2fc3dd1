"""Forget (issue 25, item 6): remove every projected row derived from a user, an agent or a session,
keep it removed whatever arrives later, and leave none of its bytes in the DuckDB file (checked by
scanning the file: tests/projections/test_forget.py).

How it runs, inside the projector (the only writer):

1. A ``ForgetRequested`` (``schemas/forget.py``, the facts topic) names a subject. In the batch's
   transaction, ``Forgetting.purge`` records it in ``forgotten``, works out what derives from it
   (its *closure*: sessions ``(agent, session_id)``, episode ids, memory ids; kept in
   ``forgotten_keys``, because once the rows are gone they cannot be found again) and deletes those
   rows from every table below.
2. Every later batch is checked first (``mentions``): a record whose key is (or hashes to) one of the
   forgotten ids, or whose JSON holds one as a string (user, agent, session; episode and memory ids
   found as UUIDs), makes the batch purge again after its rows were inserted and before it commits;
   memory units of a forgotten subject are dropped before the capture fold (``kept_units``). So a
   forgotten subject's rows are never committed again, whichever topic brings them first: in a replay
   the topics are read in parallel and a request may come before or after its data (facts of an
   episode may come before the episode that names its user: the episode triggers the purge, which
   removes those facts by episode id).
3. After the commit (``after_commit``), the folds whose tables lost rows are reloaded. When committed
   rows were removed (``Purged.committed``), every briefing is rendered again and ``scrub`` makes every
   table again from its DDL with its kept rows, checkpoints (which also empties the WAL), then fills
   the file's free blocks and free metadata parts with random bytes and frees them again: DuckDB does
   not zero what it frees, and its metadata keeps 8-byte prefixes of min/max strings. A crash before
   the scrub ends leaves a mark in ``projection_meta``; the scrub runs at the next start.

Semantic memory: topic concepts derived from a forgotten memory go, with what names them
(``_semantic_closure``). What is not removed here is in SECURITY.md ("Forget"): the raw records in
Kafka (sealed: their keys are deleted), concepts and patterns kept episodes also support (they name
tools and episode ids, not text), predicates (vocabulary), numbers aggregated over many sessions
(causal link strengths, bins), and anything copied outside Somnus.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import duckdb
import msgspec
import pyarrow as pa

from somnus.schemas.forget import ForgetRequested
from pathlib import Path
from somnus.schemas.memory import KIND_ACCESS
from somnus.schemas.lifecycle import KIND_SLEEP
from somnus.schemas.goals import KIND_GOAL_CLOSED, KIND_GOAL_SET
from somnus.projections.briefings import RecentInputs
from somnus.projections.causal import CausalProjection
from somnus.projections.knowledge import KnowledgeProjection
from somnus.projections.frames import registered
from somnus.projections.sql_sandbox import one_row

log = logging.getLogger("somnus.projector")
_decoder = msgspec.json.Decoder(ForgetRequested)
OPTIMISTIC_ROWS = 100_000  # below DuckDB's row group size (122,880 rows): a purge this large scrubs anyway
SCRUB_PENDING = "forget_scrub_pending"  # projection_meta key: a purge committed, its scrub not finished

DDL = """
CREATE TABLE IF NOT EXISTS forgotten (
    request_id VARCHAR NOT NULL PRIMARY KEY, subject VARCHAR NOT NULL, value VARCHAR NOT NULL, reason VARCHAR,
    requested_at TIMESTAMPTZ NOT NULL, src_offset BIGINT);
CREATE TABLE IF NOT EXISTS forgotten_keys (kind VARCHAR NOT NULL, id VARCHAR NOT NULL);
"""


_UUID = re.compile(rb"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def decode_forget(raw: bytes) -> ForgetRequested:
    return _decoder.decode(raw)


@dataclass
class Purged:
    """What one purge removed: rows per table, the agents whose briefings it made stale."""

    rows: dict[str, int] = field(default_factory=dict)
    agents: set[str] = field(default_factory=set)
    episodes: set[str] = field(default_factory=set)  # the episode ids of the closure
    # Whether committed rows (or a new request) were involved: then briefings are rendered again and the
    # file is scrubbed. A later batch whose forgotten rows never committed (inserted and deleted in its
    # own transaction: DuckDB writes neither them nor their WAL records) needs neither.
    committed: bool = False

    @property
    def total(self) -> int:
        return sum(self.rows.values())


class Forgetting:
    """The forgotten subjects and their closures (loaded from the tables), and the purge."""

    def __init__(self, con: duckdb.DuckDBPyConnection) -> None:
        con.execute(DDL)
        self.requests: set[str] = set()
        self.users: set[str] = set()
        self.agents: set[str] = set()
        self.sessions: set[str] = set()  # session ids named by a request (any agent)
        # (kind, id) of the closures: episode and memory ids (UUIDs), and sessions as sha256 digests of
        # ``agent\x1fsession_id`` (kind session) and of ``session_id`` (kind session_id): a session id
        # may be any text, so the file keeps only its digest.
        self.keys: set[tuple[str, str]] = set()
        self.on_purged: list[Any] = []  # called after a purge committed (the read API drops its caches)
        self.reload(con)
        self.pending = bool(one_row(con, "SELECT count(*) FROM projection_meta WHERE key = ?", [SCRUB_PENDING])[0])
        if self.pending:
            self.pending = not scrub(con)

    def reload(self, con: duckdb.DuckDBPyConnection) -> None:
        self.requests, self.users, self.agents, self.sessions = set(), set(), set(), set()
        for rid, subject, value in con.execute("SELECT request_id, subject, value FROM forgotten").fetchall():
            self._add(rid, subject, value)
        self.keys = set(con.execute("SELECT kind, id FROM forgotten_keys").fetchall())
        self._tokens()

    def _add(self, rid: str, subject: str, value: str) -> None:
        self.requests.add(rid)
        {"user": self.users, "agent": self.agents, "session": self.sessions}[subject].add(value)

    def _tokens(self) -> None:
        # Episode and memory ids are UUIDs, thousands for a large subject: found by one regular expression
        # and a set lookup; the subjects' own ids (and any id that is not a UUID) by substring.
        closure = {i for k, i in self.keys if k in ("episode", "memory")}
        self.uuids = {i.encode() for i in closure if _UUID.fullmatch(i.encode())}
        ids = self.users | self.agents | self.sessions | {i for i in closure if i.encode() not in self.uuids}
        self.raw = {i.encode() for i in ids} | self.uuids
        self.digests = {i for k, i in self.keys if k in ("session", "session_id")}
        self.quoted = [b'"' + msgspec.json.encode(i)[1:-1] + b'"' for i in ids]

    @property
    def active(self) -> bool:
        return bool(self.requests)

    def mentions(self, rec: Any) -> bool:
        """Whether a record may carry a forgotten subject's data: its key is one of their ids, or its
        value holds one as a JSON string (a false positive costs one more purge, nothing else)."""
        if not self.requests:
            return False
        if rec.key is not None and (rec.key in self.raw or hashlib.sha256(rec.key).hexdigest() in self.digests):
            return True
        value = rec.value or b""
        if self.uuids and any(m in self.uuids for m in _UUID.findall(value)):
            return True
        return any(q in value for q in self.quoted)

    def kept_units(self, rec: Any, kind: bytes | None) -> Any:
        """A memory-topic record of units without those of forgotten subjects (a copy of ``rec``), so the
        capture fold never takes them: purging them afterwards would mean replaying the whole memory log
        into the fold again. Other records, and units that cannot be read here, are left to the fold."""
        if kind in (KIND_ACCESS, KIND_SLEEP) or not rec.value:
            return rec
        try:
            units = msgspec.json.decode(rec.value)
        except (msgspec.DecodeError, RecursionError):
            return rec
        if kind in (KIND_GOAL_SET, KIND_GOAL_CLOSED):  # a forgotten agent's or user's goal: an empty record
            forgotten = isinstance(units, dict) and (
                units.get("agent") in self.agents or units.get("user_id") in self.users
            )
            return _Filtered(rec, b"") if forgotten else rec
        if not isinstance(units, list):
            return rec
        kept = [u for u in units if not (isinstance(u, dict) and self._forgotten_unit(u))]
        if len(kept) == len(units):
            return rec
        return _Filtered(rec, msgspec.json.encode(kept))

    def _forgotten_unit(self, u: dict[str, Any]) -> bool:
        agent, run = u.get("agent"), u.get("run_id")
        if u.get("user_id") in self.users or agent in self.agents or run in self.sessions:
            return True
        if isinstance(agent, str) and isinstance(run, str):
            return hashlib.sha256(f"{agent}\x1f{run}".encode()).hexdigest() in self.digests
        return False

    def purge(self, con: duckdb.DuckDBPyConnection, requests: Sequence[tuple[int, ForgetRequested]]) -> Purged:
        """Record ``requests`` and delete every row of every forgotten subject's closure (caller's
        transaction). Returns what was deleted."""
        new = []
        for offset, r in requests:
            if r.request_id in self.requests:
                continue
            self._add(r.request_id, r.subject.value, r.value)
            new.append(
                {
                    "request_id": r.request_id,
                    "subject": r.subject.value,
                    "value": r.value,
                    "reason": r.reason,
                    "requested_at": r.at,
                    "src_offset": offset,
                }
            )
        if new:
            with registered(con, frame=pa.Table.from_pylist(new)):
                con.execute(
                    "INSERT INTO forgotten SELECT request_id, subject, value, reason, requested_at, "
                    "src_offset FROM frame"
                )
        out = Purged()
        if not self.requests:
            return out
        _closure(con, self.users, self.agents, self.sessions)
        out.committed = bool(new) or _committed_hits(con)
        out.episodes = {e for (e,) in con.execute("SELECT episode_id::VARCHAR FROM _fg_e").fetchall()}
        _semantic_closure(con)  # before the deletes: it reads the abstracted patterns' sources
        for table, where in [*_SEMANTIC_DELETES, *_DELETES]:
            n = one_row(con, f"DELETE FROM {table} WHERE {where}")[0]
            if n:
                out.rows[table] = out.rows.get(table, 0) + n
        n = _purge_dead_letters(con, self.quoted, self.raw)
        if n:
            out.rows["dead_letters"] = n
        if out.rows.get("memory_log"):  # the fold numbers the log 0..n-1 (projections/memory.py)
            con.execute(
                "CREATE OR REPLACE TEMP TABLE _fg_log AS SELECT * EXCLUDE (ord), "
                "row_number() OVER (ORDER BY ord) - 1 AS ord FROM memory_log"
            )
            con.execute("DELETE FROM memory_log")
            con.execute("INSERT INTO memory_log SELECT ord, kind, body, src_offset FROM _fg_log")
            con.execute("DROP TABLE _fg_log")
        if out.rows.get("causal_link_updates"):  # links no kept update supports
            n = one_row(
                con,
                "DELETE FROM causal_links WHERE (event_signature, outcome_signature) NOT IN "
                "(SELECT (event_signature, outcome_signature) FROM causal_link_updates)",
            )[0]
            if n:
                out.rows["causal_links"] = n
        # DuckDB writes a transaction's rows to the file before its commit once a table gets a row group's
        # worth (122,880): deleted before the commit, they may still have left bytes there.
        out.committed |= max(out.rows.values(), default=0) >= OPTIMISTIC_ROWS
        out.agents = {a for (a,) in con.execute("SELECT DISTINCT agent FROM _fg_s").fetchall()} | self.agents
        if out.committed and (out.total or new):
            # Every briefing is rendered again (a lead's may quote a member's lesson): the rows go now,
            # the cache after the commit; the forgotten text is then in no briefing.
            n = one_row(con, "DELETE FROM briefings")[0]
            if n:
                out.rows["briefings"] = n
            con.execute(
                "INSERT OR IGNORE INTO briefings_dirty SELECT agent FROM "
                "(SELECT DISTINCT agent FROM episodes UNION SELECT unnest(?::VARCHAR[]))",
                [sorted(out.agents)],
            )
        keys = con.execute(
            "SELECT 'session', sha256(agent || chr(31) || session_id) FROM _fg_s "
            "UNION SELECT 'session_id', sha256(session_id) FROM _fg_s "
            "UNION SELECT 'episode', episode_id::VARCHAR FROM _fg_e "
            "UNION SELECT 'memory', memory_id FROM _fg_m EXCEPT SELECT kind, id FROM forgotten_keys"
        ).fetchall()
        if keys:
            with registered(con, frame=pa.table({"kind": [k[0] for k in keys], "id": [k[1] for k in keys]})):
                con.execute("INSERT INTO forgotten_keys SELECT * FROM frame")
            self.keys |= set(keys)
        if out.committed and (out.total or new):
            con.execute("INSERT OR REPLACE INTO projection_meta VALUES (?, '1')", [SCRUB_PENDING])
        for t in ("_fg_s", "_fg_e", "_fg_m", "_fg_u", "_fg_c", "_fg_p", "_fg_f"):
            con.execute(f"DROP TABLE IF EXISTS {t}")
        self._tokens()
        return out

    def rolled_back(self, con: duckdb.DuckDBPyConnection) -> None:
        self.reload(con)

    def after_commit(self, con: duckdb.DuckDBPyConnection, seen: Any, purged: Purged) -> None:
        """Reload the in-memory state of the folds whose tables lost rows; then, when committed rows were
        removed, drop the cached briefings and scrub the file."""
        if not purged.total:
            if self.pending or one_row(con, "SELECT count(*) FROM projection_meta WHERE key = ?", [SCRUB_PENDING])[0]:
                self.pending = not scrub(con)
            return
        rows = purged.rows
        seen.episodes -= purged.episodes
        if "dead_letters" in rows:
            seen.dead_letters = set(
                con.execute("SELECT src_topic, src_partition, src_offset, src_index, kind FROM dead_letters").fetchall()
            )
        if rows.keys() & {"memory_log", "oscillators", "goals"}:
            seen.memory.reload(con)
        if rows.keys() & {"triples", "triple_history", "entity_versions", "entity_aliases", "knowledge_inputs"}:
            seen.knowledge = KnowledgeProjection(con)
        if "causal_link_updates" in rows:
            seen.causal = CausalProjection(con)
        if rows.keys() & {name for name, _ in _SEMANTIC_DELETES}:
            seen.semantic.reload(con)
        if rows.keys() & {"fact_uses", "briefings_served"}:
            seen.utilisation.reload(con)
        if "facts_top" in rows:
            seen.top_facts.refresh(con)
        if rows.keys() & {"episodes", "lessons"}:
            seen.briefings.recent = RecentInputs(con, seen.agents)
        if not purged.committed:
            if self.pending:  # an earlier scrub found the file busy
                self.pending = not scrub(con)
            return
        seen.briefings.current.clear()  # re-rendered by the next refresh (briefings_dirty)
        seen.briefings.urgent |= purged.agents
        for callback in self.on_purged:
            callback()
        self.pending = not scrub(con)


def _closure(con: duckdb.DuckDBPyConnection, users: set[str], agents: set[str], sessions: set[str]) -> None:
    """Temp tables ``_fg_s`` (agent, session_id), ``_fg_e`` (episode_id), ``_fg_m`` (memory_id): what
    derives from the forgotten subjects, with the closures recorded before."""
    con.execute("CREATE OR REPLACE TEMP TABLE _fg_u (kind VARCHAR, id VARCHAR)")
    rows = [("user", u) for u in users] + [("agent", a) for a in agents] + [("session", s) for s in sessions]
    with registered(con, frame=pa.table({"kind": [k for k, _ in rows], "id": [i for _, i in rows]})):
        con.execute("INSERT INTO _fg_u SELECT kind, id FROM frame")
    u = "(SELECT id FROM _fg_u WHERE kind = 'user')"
    d = "sha256(({}) || chr(31) || ({})) IN (SELECT id FROM forgotten_keys WHERE kind = 'session')"
    a = "(SELECT id FROM _fg_u WHERE kind = 'agent')"
    s = "(SELECT id FROM _fg_u WHERE kind = 'session')"
    con.execute(f"""
        CREATE OR REPLACE TEMP TABLE _fg_s AS SELECT DISTINCT agent, session_id FROM (
            SELECT agent, session_id FROM events WHERE agent IN {a} OR session_id IN {s}
                OR (type = 'session_start' AND payload->>'user_id' IN {u}) OR {d.format("agent", "session_id")}
            UNION ALL SELECT agent, session_id FROM episodes
                WHERE user_id IN {u} OR agent IN {a} OR session_id IN {s} OR {d.format("agent", "session_id")}
            UNION ALL SELECT agent, session_id FROM working_memory
                WHERE user_id IN {u} OR agent IN {a} OR session_id IN {s} OR {d.format("agent", "session_id")}
            UNION ALL SELECT agent, run_id FROM memories
                WHERE user_id IN {u} OR agent IN {a} OR run_id IN {s} OR {d.format("agent", "run_id")}
            UNION ALL SELECT body->>'$.unit.agent', body->>'$.unit.run_id' FROM memory_log
                WHERE kind = 'CaptureDecided' AND (body->>'$.unit.user_id' IN {u} OR body->>'$.unit.agent' IN {a}
                    OR body->>'$.unit.run_id' IN {s} OR {d.format("body->>'$.unit.agent'", "body->>'$.unit.run_id'")}))""")
    con.execute("""
        CREATE OR REPLACE TEMP TABLE _fg_e AS SELECT DISTINCT episode_id FROM (
            SELECT episode_id FROM episodes WHERE (agent, session_id) IN (SELECT (agent, session_id) FROM _fg_s)
            UNION ALL SELECT id::UUID FROM forgotten_keys WHERE kind = 'episode')""")
    con.execute("""
        CREATE OR REPLACE TEMP TABLE _fg_m AS SELECT DISTINCT memory_id FROM (
            SELECT memory_id FROM memories WHERE (agent, run_id) IN (SELECT (agent, session_id) FROM _fg_s)
            UNION ALL SELECT body->>'$.unit.memory_id' FROM memory_log WHERE kind = 'CaptureDecided'
                AND (body->>'$.unit.agent', body->>'$.unit.run_id') IN (SELECT (agent, session_id) FROM _fg_s)
            UNION ALL SELECT id FROM forgotten_keys WHERE kind = 'memory')""")


def _semantic_closure(con: duckdb.DuckDBPyConnection) -> None:
    """Temp tables of the semantic records derived from forgotten memories and episodes: ``_fg_c``
    (owner, concept_id): ATL concepts derived from any forgotten memory (a topic: its name is a word of
    those sessions' text, and its sealed topic opens as nothing in a replay once one source session is
    forgotten, ``seal_shared``), or whose every DERIVED_FROM source is forgotten (a causal pattern's
    episodes: its links stay readable, so one kept episode keeps it); ``_fg_p`` (owner, math_id): Angular Gyrus patterns
    computed only from forgotten episodes, or informing a doomed concept (a co-occurrence names both
    keys); ``_fg_f`` (owner, id): the strings that name them in ``semantic_log`` bodies and in the
    promotion audit: their ids, a doomed topic's key, and the names of abstracted topics whose every
    source is forgotten (a candidate the gate rejected made no concept, but its audit row names the
    key). Other concepts' names are tool and error vocabulary that kept records share: not matched."""
    gone = "(SELECT memory_id FROM _fg_m UNION ALL SELECT episode_id::VARCHAR FROM _fg_e)"
    con.execute(f"""
        CREATE OR REPLACE TEMP TABLE _fg_c AS SELECT owner, source_id AS concept_id FROM cross_layer_edges
        WHERE source_layer = 'atl' AND edge_type = 'DERIVED_FROM' GROUP BY ALL
        HAVING bool_or(target_id IN (SELECT memory_id FROM _fg_m)) OR bool_and(target_id IN {gone})""")
    con.execute(f"""
        CREATE OR REPLACE TEMP TABLE _fg_p AS SELECT DISTINCT owner, math_id FROM (
            SELECT owner, source_id AS math_id FROM cross_layer_edges
                WHERE source_layer = 'angular_gyrus' AND edge_type = 'COMPUTED_FROM' GROUP BY ALL
                HAVING bool_and(target_id IN {gone})
            UNION ALL SELECT owner, source_id FROM cross_layer_edges
                WHERE source_layer = 'angular_gyrus' AND target_layer = 'atl'
                AND (owner, target_id) IN (SELECT (owner, concept_id) FROM _fg_c))""")
    con.execute("""
        CREATE OR REPLACE TEMP TABLE _fg_f AS SELECT DISTINCT owner, id FROM (
            SELECT owner, concept_id AS id FROM _fg_c
            UNION ALL SELECT c.owner, unnest([c.name, 'topic:' || c.name]) FROM concepts c
                JOIN _fg_c USING (owner, concept_id) WHERE c.category = 'topic'
            UNION ALL SELECT owner, math_id FROM _fg_p
            UNION ALL SELECT DISTINCT s.owner, t.name FROM (
                SELECT 'topic:' || (body->>'$.key') AS name FROM lifecycle_log WHERE kind = 'PatternAbstracted'
                GROUP BY 1 HAVING bool_and(list_has_all(
                    (SELECT coalesce(list(memory_id), []) FROM _fg_m),
                    json_extract_string(body, '$.sources[*].memory_id')))) t
            JOIN promotion_audit s ON s.pattern_name = t.name)""")


# strings of a JSON body (as forget's lifecycle_log rule reads them)
_STRINGS = 'regexp_extract_all({}::VARCHAR, \'"([^"\\\\]{{1,200}})"\', 1)'
_IN_C = "(owner, {}) IN (SELECT (owner, concept_id) FROM _fg_c)"
_IN_P = "(owner, {}) IN (SELECT (owner, math_id) FROM _fg_p)"
_SEMANTIC_DELETES: list[tuple[str, str]] = [
    ("concepts", _IN_C.format("concept_id")),
    ("concept_relationships", f"{_IN_C.format('source_id')} OR {_IN_C.format('target_id')}"),
    ("math_patterns", _IN_P.format("math_id")),
    (
        "cross_layer_edges",
        " OR ".join(
            f"({layer}_layer = '{name}' AND {rule.format(layer + '_id')})"
            for layer in ("source", "target")
            for name, rule in (("atl", _IN_C), ("angular_gyrus", _IN_P))
        ),
    ),
    ("promotion_audit", f"{_IN_C.format('concept_id')} OR (owner, pattern_name) IN (SELECT (owner, id) FROM _fg_f)"),
    (
        "semantic_log",
        f"list_has_any({_STRINGS.format('body')}, "
        "(SELECT coalesce(list(f.id), []) FROM _fg_f f WHERE f.owner = semantic_log.owner))",
    ),
]


class _Filtered:
    """A record with another value (its coordinates, key, headers and time unchanged)."""

    def __init__(self, rec: Any, value: bytes) -> None:
        self.topic, self.partition, self.offset = rec.topic, rec.partition, rec.offset
        self.key, self.headers, self.value = rec.key, rec.headers, value
        self.timestamp = getattr(rec, "timestamp", None)


def _committed_hits(con: duckdb.DuckDBPyConnection) -> bool:
    """Whether any committed row belongs to the closure (read on a second cursor: it sees the last
    commit, not this transaction's own rows)."""
    frames = {
        "s_frame": con.sql("SELECT agent, session_id FROM _fg_s").to_arrow_table(),
        "e_frame": con.sql("SELECT episode_id::VARCHAR AS e FROM _fg_e").to_arrow_table(),
        "m_frame": con.sql("SELECT memory_id AS m FROM _fg_m").to_arrow_table(),
    }
    cur = con.cursor()
    try:
        with registered(cur, **frames):
            return any(one_row(cur, sql)[0] for sql in _COMMITTED_CHECKS)
    finally:
        cur.close()


_IN_S = "IN (SELECT (agent, session_id) FROM s_frame)"
_IN_E = "IN (SELECT e FROM e_frame)"
_IN_M = "IN (SELECT m FROM m_frame)"
_COMMITTED_CHECKS = [
    f"SELECT count(*) FROM events WHERE (agent, session_id) {_IN_S}",
    f"SELECT count(*) FROM working_memory WHERE (agent, session_id) {_IN_S}",
    "SELECT count(*) FROM dead_letters WHERE msg_key IN (SELECT session_id::BLOB FROM s_frame)",
    *(
        f"SELECT count(*) FROM {t} WHERE {c}::VARCHAR {_IN_E}"
        for t, c in (
            ("episodes", "episode_id"),
            ("triples", "evidence"),
            ("entity_versions", "episode_id"),
            ("entity_aliases", "episode_id"),
            ("knowledge_inputs", "episode_id"),
            ("causal_link_updates", "episode_id"),
        )
    ),
    f"SELECT count(*) FROM memories WHERE memory_id {_IN_M}",
    f"SELECT count(*) FROM memory_log WHERE body->>'$.unit.memory_id' {_IN_M} OR body->>'$.memory_id' {_IN_M} "
    f"OR body->>'$.a' {_IN_M} OR body->>'$.b' {_IN_M}",
]

_S = "(agent, session_id) IN (SELECT (agent, session_id) FROM _fg_s)"
_E = "episode_id IN (SELECT episode_id FROM _fg_e)"
_M = "IN (SELECT memory_id FROM _fg_m)"
_A = "agent IN (SELECT id FROM _fg_u WHERE kind = 'agent')"
# Triples whose every piece of evidence is forgotten (one kept episode keeps a triple, and its numbers).
_DOOMED_TRIPLES = (
    "triple_id IN (SELECT triple_id FROM triples WHERE evidence IN (SELECT episode_id FROM _fg_e) "
    "AND triple_id NOT IN (SELECT triple_id FROM triple_history WHERE episode_id NOT IN (SELECT episode_id FROM _fg_e)))"
)
# Entities all of whose versions came from forgotten episodes.
_DOOMED_ENTITIES = (
    "entity_id IN (SELECT entity_id FROM entity_versions GROUP BY entity_id "
    "HAVING bool_and(episode_id IS NOT NULL AND episode_id IN (SELECT episode_id FROM _fg_e)))"
)
_DELETES: list[tuple[str, str]] = [
    ("events", _S),
    ("duplicate_events", _S),
    ("working_memory", f"{_S} OR user_id IN (SELECT id FROM _fg_u WHERE kind = 'user')"),
    ("lessons", _E),
    ("episodes", f"{_E} OR {_S}"),
    ("knowledge_inputs", _E),
    ("causal_link_updates", _E),
    ("facts_top", _DOOMED_TRIPLES),
    ("triples", _DOOMED_TRIPLES),
    ("triple_history", _E),
    ("entity_aliases", f"{_E} OR {_DOOMED_ENTITIES}"),
    ("entity_versions", _DOOMED_ENTITIES),
    ("briefings_served", f"session_id IN (SELECT session_id FROM _fg_s) AND {_S}"),
    ("fact_uses", _S),
    ("memories", f"memory_id {_M}"),
    ("memory_merges", f"memory_id {_M} OR unit_id {_M}"),
    ("memory_edges", f"a {_M} OR b {_M}"),
    ("memory_access", f"memory_id {_M}"),
    # a decision of a sleep run names its memories in its body too (a pattern's sources, a connection's
    # ends, a created observation's nearest): any string of the body that is a forgotten memory's id
    (
        "lifecycle_log",
        f"memory_id {_M} OR body->>'$.agent' IN (SELECT id FROM _fg_u WHERE kind = 'agent') "
        f"OR list_has_any({_STRINGS.format('body')}, "
        "(SELECT coalesce(list(memory_id), []) FROM _fg_m))",
    ),
    (
        "memory_log",
        f"body->>'$.unit.memory_id' {_M} OR body->>'$.memory_id' {_M} OR body->>'$.a' {_M} OR body->>'$.b' {_M}",
    ),
    ("temporal_bins", _A),
    ("oscillators", _A),
    ("oscillator_readings", f"memory_id {_M}"),
    ("goals", f"{_A} OR user_id IN (SELECT id FROM _fg_u WHERE kind = 'user')"),
]


def _purge_dead_letters(con: duckdb.DuckDBPyConnection, quoted: Iterable[bytes], raw: set[bytes]) -> int:
    """Dead letters keyed by a forgotten id, or whose original bytes or reason name one (their text may be
    anything: they are matched on bytes, in Python)."""
    quoted = list(quoted)
    sessions = {s.encode() for (s,) in con.execute("SELECT session_id FROM _fg_s").fetchall()}
    doomed = []
    for rowid, key, original, reason in con.execute(
        "SELECT rowid, msg_key, original, reason FROM dead_letters"
    ).fetchall():
        key = bytes(key) if key is not None else None
        body = bytes(original or b"") + (reason or "").encode()
        if (
            (key is not None and (key in raw or key in sessions))
            or any(q in body for q in quoted)
            or any(b'"' + s + b'"' in body for s in sessions)
        ):
            doomed.append(rowid)
    if not doomed:
        return 0
    with registered(con, frame=pa.table({"r": doomed})):
        return one_row(con, "DELETE FROM dead_letters WHERE rowid IN (SELECT r FROM frame)")[0]


def scrub(con: duckdb.DuckDBPyConnection, tables: Sequence[str] | None = None) -> bool:
    """Leave no deleted row's bytes in the file: make ``tables`` (default: every table) again from their
    DDL with their kept rows (the old row groups are freed at the checkpoint), checkpoint (which also
    empties the WAL), then fill every free block with random bytes and free them again.

    Every table, not only those rows left: DuckDB packs metadata (row-group pointers, column statistics
    holding the first 8 bytes of a column's min and max strings) into shared blocks, and a freed piece
    of one keeps its bytes until later metadata reuses it; rewriting only the purged tables left such
    prefixes behind (seen: 7 copies of a forgotten session id's prefix), rewriting every table wrote
    over them all. The cost is a copy of the whole file, once per purge. Returns False when the file
    stayed busy (``CheckpointBusy``): the mark in ``projection_meta`` stays and the scrub runs again."""
    if tables is None:
        tables = [
            t
            for (t,) in con.execute(
                "SELECT table_name FROM duckdb_tables() WHERE schema_name = 'main' AND NOT temporary "
                "AND database_name = current_database() ORDER BY table_name"
            ).fetchall()
        ]
    tables = [t for t in tables if t.isidentifier()]
    con.begin()
    try:
        for t in tables:
            # Made again from its own DDL, not emptied: a table's statistics keep the min and max (the first
            # bytes of a text) of every row it ever held, deleted ones too.
            ddl = con.execute(
                "SELECT sql FROM duckdb_tables() WHERE schema_name = 'main' AND table_name = ? "
                "AND database_name = current_database()",
                [t],
            ).fetchall()
            if not ddl:
                continue
            indexes = [
                r[0]
                for r in con.execute(
                    "SELECT sql FROM duckdb_indexes() WHERE table_name = ? AND schema_name = 'main' "
                    "AND database_name = current_database() AND sql IS NOT NULL",
                    [t],
                ).fetchall()
            ]
            con.execute(f"CREATE OR REPLACE TEMP TABLE _fg_keep AS SELECT * FROM main.{t}")
            con.execute(f"DROP TABLE main.{t}")
            con.execute(ddl[0][0])
            con.execute(f"INSERT INTO main.{t} SELECT * FROM _fg_keep")
            con.execute("DROP TABLE _fg_keep")
            for sql in indexes:
                con.execute(sql)
        con.commit()
    except BaseException:
        con.rollback()
        raise
    try:
        _checkpoint(con)
        _fill_free_blocks(con)
        _fill_free_metadata(con)
    except CheckpointBusy:
        for (t,) in con.execute(
            "SELECT table_name FROM duckdb_tables() WHERE table_name LIKE '\\_forget\\_%' "
            "ESCAPE '\\' AND database_name = current_database()"
        ).fetchall():
            con.execute(f"DROP TABLE main.{t}")
        log.warning("forget: the file stayed busy (other transactions), the scrub runs again after a later batch")
        return False
    con.execute("DELETE FROM projection_meta WHERE key = ?", [SCRUB_PENDING])
    with contextlib.suppress(CheckpointBusy):  # what is left to write is the mark's deletion
        _checkpoint(con)
    log.info("forget: %d tables rewritten and the file's free blocks overwritten", len(tables))
    return True


class CheckpointBusy(Exception):
    """The file could not be checkpointed within ``CHECKPOINT_WAIT_S``: other transactions kept it busy."""


CHECKPOINT_WAIT_S = 10.0


def _checkpoint(con: duckdb.DuckDBPyConnection, wait_s: float = CHECKPOINT_WAIT_S) -> None:
    """CHECKPOINT, tried again while another connection's transaction stands in its way. Not FORCE
    CHECKPOINT: it waits for the checkpoint lock while blocking every new transaction, and a read of
    the HTTP API waited behind it for minutes (seen in the integration test)."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            con.execute("CHECKPOINT")
            return
        except duckdb.TransactionException:
            if time.monotonic() >= deadline:
                raise CheckpointBusy() from None
            time.sleep(0.02)


def _free_metadata(con: duckdb.DuckDBPyConnection) -> set[tuple[int, int]]:
    return {(b, i) for b, _, _, free in con.execute("SELECT * FROM pragma_metadata_info()").fetchall() for i in free}


def _fill_free_metadata(con: duckdb.DuckDBPyConnection) -> None:
    """Write over the metadata pieces (4 KiB parts of a shared block) that are free now: they may hold a
    dropped table's statistics, the first 8 bytes of its min and max strings (seen in a test after
    every table had been rewritten). Filler tables of many random-text columns take them (each column's
    pointer and statistics are metadata) until none of them is free, then are dropped."""
    stale = _free_metadata(con)
    made = 0
    cols = ", ".join(f"md5(random()::VARCHAR) AS c{j}" for j in range(100))
    while stale & _free_metadata(con) and made < 200:  # a checkpoint writes the new tables' metadata
        for _ in range(4):
            con.execute(f"CREATE TABLE main._forget_meta{made} AS SELECT {cols}")
            made += 1
        _checkpoint(con)
    if made:
        _checkpoint(con)
        left = len(stale & _free_metadata(con))
        if left:
            log.warning("forget: %d free metadata parts could not be written over", left)
        for i in range(made):
            con.execute(f"DROP TABLE main._forget_meta{i}")
        _checkpoint(con)


def _fill_free_blocks(con: duckdb.DuckDBPyConnection) -> None:
    """Write random bytes over every free block: filler tables of random UUIDs (16 bytes a row that no
    compression shrinks) sized to the free blocks, added until none is free, then dropped."""
    made = 0
    for _ in range(8):
        free, block = one_row(
            con, "SELECT free_blocks, block_size FROM pragma_database_size() WHERE database_name = current_database()"
        )
        if not free:
            break
        con.execute(
            f"CREATE TABLE main._forget_fill{made} AS SELECT gen_random_uuid() AS x FROM range(?)",
            [free * block // 16 + 1024],
        )
        made += 1
        _checkpoint(con)
    for i in range(made):
        con.execute(f"DROP TABLE main._forget_fill{i}")
    if made:
        _checkpoint(con)


# ---- verification (``somnus forget --verify``) -------------------------------------------------------


def file_hits(db_path: Any, needles: Sequence[str]) -> dict[str, int]:
    """How often each needle's UTF-8 bytes occur in the DuckDB file and its WAL (raw bytes)."""
    data = [p.read_bytes() for p in (Path(db_path), Path(f"{db_path}.wal")) if p.exists()]
    return {n: sum(d.count(n.encode()) for d in data) for n in needles}


def rows_with(con: Any, needles: Sequence[str]) -> dict[str, dict[str, int]]:
    """Rows of every table whose text (every column as VARCHAR, blobs escaped) holds a needle."""
    tables = [
        t
        for (t,) in con.execute(
            "SELECT table_name FROM duckdb_tables() WHERE NOT temporary AND database_name = current_database()"
        ).fetchall()
    ]
    out: dict[str, dict[str, int]] = {}
    for n in needles:
        for t in tables:
            c = con.execute(f"SELECT count(*) FROM {t} x WHERE contains(x::VARCHAR, ?)", [n]).fetchone()[0]
            if c:
                out.setdefault(n, {})[t] = c
    return out
