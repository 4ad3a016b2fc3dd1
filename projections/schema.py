"""DuckDB schema of the projections. Tables are append-only; "current" state is a view.

Exceptions, each documented where it is written: ``triples`` rows are updated in place when
a fact is reinforced or superseded (nothing is deleted; ``triple_history`` logs every change);
``briefings`` holds the current briefing of each agent (every version is on the compacted
``briefings`` topic); and ``facts_top`` is a derived read model: the ``FACTS_TOP_K`` best active facts of each scope,
refreshed for the scopes a batch touched, so the scope-chain query reads a few hundred rows
instead of scanning every triple.

``src_partition`` / ``src_offset`` / ``src_index`` (position in a bundle) say where in Kafka a row came from (traceability); they are
transport details, left out of the content checksum.
"""

from __future__ import annotations

import duckdb

SCHEMA_VERSION = 1
FACTS_TOP_K = 200  # per scope; scope-chain queries with a larger limit read ``triples`` itself

# The logs (memory_log, semantic_log) have no PRIMARY KEY on ``ord``: the projector numbers them itself,
# in the transaction that stores its offsets, so an ord is never written twice. With the key, DuckDB
# took ~10x as long to append their large JSON rows (1.59 s vs 0.16 s for the 156k rows, 73 MB, of a
# 300k-event run, in batches of 1,500; the key alone on small rows costs little). Files made with the
# key keep it (CREATE TABLE IF NOT EXISTS); their contents and checksums are the same.
DDL = """
CREATE TABLE IF NOT EXISTS projection_meta (key VARCHAR PRIMARY KEY, value VARCHAR);
CREATE TABLE IF NOT EXISTS projection_offsets (
    topic VARCHAR NOT NULL, kafka_partition INTEGER NOT NULL, next_offset BIGINT NOT NULL,
    PRIMARY KEY (topic, kafka_partition));
CREATE TABLE IF NOT EXISTS events (
    event_id UUID NOT NULL, schema_version INTEGER NOT NULL, ts TIMESTAMPTZ NOT NULL,
    agent VARCHAR NOT NULL, session_id VARCHAR NOT NULL, seq BIGINT NOT NULL, type VARCHAR NOT NULL,
    payload JSON NOT NULL, src_partition INTEGER NOT NULL, src_offset BIGINT NOT NULL,
    src_index INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS episodes (
    episode_id UUID NOT NULL, agent VARCHAR NOT NULL, session_id VARCHAR NOT NULL, task VARCHAR,
    goal VARCHAR, user_id VARCHAR, summary VARCHAR, outcome VARCHAR NOT NULL,
    started_at TIMESTAMPTZ, ended_at TIMESTAMPTZ, duration_s DOUBLE, event_count INTEGER,
    tool_calls INTEGER, tools VARCHAR[], errors JSON, delegations JSON,
    first_event_id UUID, last_event_id UUID, src_partition INTEGER, src_offset BIGINT,
    calls JSON, calls_dropped INTEGER, metadata JSON);
CREATE TABLE IF NOT EXISTS lessons (
    episode_id UUID NOT NULL, agent VARCHAR NOT NULL, session_id VARCHAR NOT NULL, idx INTEGER NOT NULL,
    kind VARCHAR NOT NULL, text VARCHAR NOT NULL, tool VARCHAR, error VARCHAR, learned_at TIMESTAMPTZ);
CREATE TABLE IF NOT EXISTS dead_letters (
    src_topic VARCHAR NOT NULL, src_partition INTEGER NOT NULL, src_offset BIGINT NOT NULL,
    src_index INTEGER NOT NULL, kind VARCHAR NOT NULL, reason VARCHAR NOT NULL, msg_key BLOB, original BLOB,
    dlq_partition INTEGER, dlq_offset BIGINT);
CREATE TABLE IF NOT EXISTS duplicate_events (
    event_id UUID NOT NULL, agent VARCHAR NOT NULL, session_id VARCHAR NOT NULL, seq BIGINT NOT NULL,
    src_partition INTEGER NOT NULL, src_offset BIGINT NOT NULL, src_index INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS knowledge_inputs (
    episode_id UUID NOT NULL, extractor VARCHAR NOT NULL, agent VARCHAR NOT NULL, observed_at TIMESTAMPTZ NOT NULL,
    entities INTEGER NOT NULL, facts INTEGER NOT NULL, src_offset BIGINT);
CREATE TABLE IF NOT EXISTS entity_versions (
    entity_id VARCHAR NOT NULL, version INTEGER NOT NULL, name VARCHAR NOT NULL, type VARCHAR NOT NULL,
    attributes JSON NOT NULL, first_seen TIMESTAMPTZ NOT NULL, updated_at TIMESTAMPTZ NOT NULL, episode_id UUID);
CREATE TABLE IF NOT EXISTS entity_aliases (
    alias VARCHAR NOT NULL, type VARCHAR NOT NULL, entity_id VARCHAR NOT NULL, jaccard DOUBLE,
    first_seen TIMESTAMPTZ NOT NULL, episode_id UUID);
CREATE TABLE IF NOT EXISTS predicates (
    predicate VARCHAR NOT NULL, functional BOOLEAN NOT NULL, added_at TIMESTAMPTZ, episode_id UUID);
CREATE TABLE IF NOT EXISTS triples (
    triple_id UUID NOT NULL, source VARCHAR NOT NULL, predicate VARCHAR NOT NULL, target VARCHAR NOT NULL,
    scope VARCHAR NOT NULL, confidence DOUBLE NOT NULL, count BIGINT NOT NULL, evidence UUID NOT NULL,
    last_evidence UUID, valid_from TIMESTAMPTZ NOT NULL, valid_to TIMESTAMPTZ, superseded_by UUID,
    created_by VARCHAR NOT NULL, extractor VARCHAR NOT NULL);
CREATE TABLE IF NOT EXISTS triple_history (
    ordinal BIGINT NOT NULL, triple_id UUID NOT NULL, change VARCHAR NOT NULL, episode_id UUID NOT NULL,
    changed_at TIMESTAMPTZ NOT NULL, count BIGINT NOT NULL, confidence DOUBLE NOT NULL);
CREATE TABLE IF NOT EXISTS facts_top AS SELECT * FROM triples LIMIT 0;
CREATE TABLE IF NOT EXISTS briefings (
    agent VARCHAR NOT NULL PRIMARY KEY, briefing_id VARCHAR NOT NULL, generated_at TIMESTAMPTZ NOT NULL,
    budget INTEGER NOT NULL, markdown VARCHAR NOT NULL, chars INTEGER NOT NULL, lessons INTEGER NOT NULL,
    facts JSON NOT NULL, strategies INTEGER NOT NULL, dropped_lessons INTEGER NOT NULL,
    dropped_facts INTEGER NOT NULL, dropped_strategies INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS memory_log (
    ord BIGINT NOT NULL, kind VARCHAR NOT NULL, body JSON NOT NULL, src_offset BIGINT NOT NULL);
CREATE TABLE IF NOT EXISTS memories (
    memory_id VARCHAR NOT NULL, kind VARCHAR NOT NULL, agent VARCHAR NOT NULL, scope VARCHAR NOT NULL,
    run_id VARCHAR NOT NULL, position BIGINT NOT NULL, occurred_at TIMESTAMPTZ NOT NULL, perception VARCHAR,
    summary VARCHAR, outcome VARCHAR, speaker VARCHAR, refs VARCHAR[], source_event_ids VARCHAR[],
    reasons VARCHAR[], prediction_error DOUBLE, user_interaction BOOLEAN, decided_at TIMESTAMPTZ NOT NULL,
    user_id VARCHAR);
CREATE TABLE IF NOT EXISTS memory_merges (
    unit_id VARCHAR NOT NULL, memory_id VARCHAR NOT NULL, agent VARCHAR NOT NULL, prediction_error DOUBLE,
    decided_at TIMESTAMPTZ NOT NULL);
CREATE TABLE IF NOT EXISTS memory_edges (
    a VARCHAR NOT NULL, b VARCHAR NOT NULL, weight DOUBLE NOT NULL, shared DOUBLE, goal DOUBLE, temporal DOUBLE,
    formed_at TIMESTAMPTZ NOT NULL);
CREATE TABLE IF NOT EXISTS memory_access (
    memory_id VARCHAR NOT NULL, agent VARCHAR NOT NULL, query VARCHAR, rank INTEGER, score DOUBLE,
    accessed_at TIMESTAMPTZ NOT NULL);
CREATE TABLE IF NOT EXISTS goals (
    ord BIGINT NOT NULL, goal_id VARCHAR NOT NULL, agent VARCHAR NOT NULL, text VARCHAR NOT NULL, user_id VARCHAR,
    status VARCHAR NOT NULL, forward_pe DOUBLE NOT NULL, nearest_id VARCHAR, changed_at TIMESTAMPTZ NOT NULL,
    set_by VARCHAR NOT NULL, src_offset BIGINT);
CREATE TABLE IF NOT EXISTS working_memory (
    session_key VARCHAR NOT NULL PRIMARY KEY, agent VARCHAR NOT NULL, session_id VARCHAR NOT NULL, user_id VARCHAR,
    closed BOOLEAN NOT NULL, last_seq BIGINT NOT NULL, tokens BIGINT NOT NULL, state JSON NOT NULL);
CREATE TABLE IF NOT EXISTS semantic_log (
    ord BIGINT NOT NULL, owner VARCHAR NOT NULL, kind VARCHAR NOT NULL, body JSON NOT NULL,
    src_offset BIGINT NOT NULL);
CREATE TABLE IF NOT EXISTS semantic_requests (
    request_id VARCHAR NOT NULL PRIMARY KEY, owner VARCHAR NOT NULL, requested_at TIMESTAMPTZ NOT NULL,
    src_offset BIGINT NOT NULL);
CREATE TABLE IF NOT EXISTS concepts (
    owner VARCHAR NOT NULL, concept_id VARCHAR NOT NULL, name VARCHAR NOT NULL, category VARCHAR NOT NULL,
    definition VARCHAR, provenance VARCHAR NOT NULL, reinforcement_count BIGINT NOT NULL, confidence DOUBLE NOT NULL,
    properties JSON, source_episode_ids VARCHAR[], updated_at TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (owner, concept_id));
CREATE TABLE IF NOT EXISTS concept_relationships (
    owner VARCHAR NOT NULL, source_id VARCHAR NOT NULL, relation VARCHAR NOT NULL, target_id VARCHAR NOT NULL,
    weight DOUBLE NOT NULL, metadata JSON, formed_at TIMESTAMPTZ NOT NULL);
CREATE TABLE IF NOT EXISTS math_patterns (
    owner VARCHAR NOT NULL, math_id VARCHAR NOT NULL, name VARCHAR NOT NULL, category VARCHAR NOT NULL,
    domain VARCHAR, summary VARCHAR, query VARCHAR, confidence DOUBLE NOT NULL, observations BIGINT,
    confirmed_at TIMESTAMPTZ NOT NULL, source_agents VARCHAR[]);
CREATE TABLE IF NOT EXISTS cross_layer_edges (
    owner VARCHAR NOT NULL, source_layer VARCHAR NOT NULL, source_id VARCHAR NOT NULL, edge_type VARCHAR NOT NULL,
    target_layer VARCHAR NOT NULL, target_id VARCHAR NOT NULL, weight DOUBLE NOT NULL, formed_at TIMESTAMPTZ NOT NULL);
CREATE TABLE IF NOT EXISTS promotion_audit (
    owner VARCHAR NOT NULL, pattern_name VARCHAR NOT NULL, origin VARCHAR NOT NULL, candidate_confidence DOUBLE,
    promoted BOOLEAN NOT NULL, concept_id VARCHAR, reason VARCHAR, decided_at TIMESTAMPTZ NOT NULL);
CREATE TABLE IF NOT EXISTS lifecycle_log (
    run_id VARCHAR NOT NULL, seq BIGINT NOT NULL, kind VARCHAR NOT NULL, memory_id VARCHAR, decided_at TIMESTAMPTZ NOT NULL,
    body JSON NOT NULL);
CREATE TABLE IF NOT EXISTS sleep_runs (
    run_id VARCHAR NOT NULL, run_at TIMESTAMPTZ NOT NULL, trigger VARCHAR NOT NULL, memories_before BIGINT,
    memories_after BIGINT, kept BIGINT, compressed BIGINT, pruned BIGINT, protected BIGINT, rescored BIGINT,
    bytes_before BIGINT, bytes_after BIGINT, fiedler DOUBLE, report JSON);
CREATE TABLE IF NOT EXISTS sleep_layer_reports (
    run_id VARCHAR NOT NULL, layer VARCHAR NOT NULL, before BIGINT NOT NULL, after BIGINT NOT NULL,
    removed BIGINT NOT NULL, added BIGINT NOT NULL DEFAULT 0, reinforced BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (run_id, layer));
CREATE TABLE IF NOT EXISTS oscillators (
    agent VARCHAR NOT NULL, kind VARCHAR NOT NULL, events BIGINT NOT NULL, state JSON NOT NULL,
    PRIMARY KEY (agent, kind));
CREATE TABLE IF NOT EXISTS oscillator_readings (
    agent VARCHAR NOT NULL, kind VARCHAR NOT NULL, occurred_at TIMESTAMPTZ NOT NULL, memory_id VARCHAR NOT NULL,
    anomaly DOUBLE NOT NULL, coherence DOUBLE NOT NULL, distances DOUBLE[] NOT NULL, src_offset BIGINT);
CREATE TABLE IF NOT EXISTS sleep_state (id INTEGER PRIMARY KEY, state JSON NOT NULL);
CREATE TABLE IF NOT EXISTS briefings_dirty (agent VARCHAR NOT NULL PRIMARY KEY);
CREATE TABLE IF NOT EXISTS promotions (
    promotion_id UUID NOT NULL, source VARCHAR NOT NULL, predicate VARCHAR NOT NULL, target VARCHAR NOT NULL,
    from_scope VARCHAR NOT NULL, to_scope VARCHAR NOT NULL, reason VARCHAR NOT NULL, promoted_at TIMESTAMPTZ NOT NULL,
    confidence DOUBLE NOT NULL, learning_rate VARCHAR, threshold INTEGER, users VARCHAR[], teams VARCHAR[],
    src_offset BIGINT);
CREATE TABLE IF NOT EXISTS fact_uses (
    agent VARCHAR NOT NULL, session_id VARCHAR NOT NULL, briefing_id VARCHAR NOT NULL, triple_id VARCHAR NOT NULL,
    source VARCHAR NOT NULL, predicate VARCHAR NOT NULL, target VARCHAR NOT NULL, scope VARCHAR NOT NULL,
    confidence DOUBLE, entity VARCHAR, used_at TIMESTAMPTZ NOT NULL, src_offset BIGINT);
CREATE TABLE IF NOT EXISTS promotion_state (statement VARCHAR NOT NULL PRIMARY KEY, state JSON NOT NULL);
CREATE TABLE IF NOT EXISTS briefings_served (
    briefing_id VARCHAR NOT NULL, agent VARCHAR NOT NULL, session_id VARCHAR NOT NULL, served_at TIMESTAMPTZ NOT NULL,
    facts JSON NOT NULL, src_offset BIGINT);
CREATE TABLE IF NOT EXISTS causal_link_updates (
    event_signature VARCHAR NOT NULL, outcome_signature VARCHAR NOT NULL, level VARCHAR NOT NULL, tool VARCHAR NOT NULL,
    outcome VARCHAR NOT NULL, valence VARCHAR NOT NULL, agent VARCHAR NOT NULL, episode_id UUID NOT NULL,
    observed_at TIMESTAMPTZ NOT NULL, src_partition INTEGER NOT NULL, src_offset BIGINT NOT NULL, idx INTEGER NOT NULL,
    target DOUBLE NOT NULL, alpha DOUBLE NOT NULL, strength_before DOUBLE NOT NULL, strength DOUBLE NOT NULL,
    observations BIGINT NOT NULL, event_observations BIGINT NOT NULL, confidence DOUBLE NOT NULL,
    strengths JSON NOT NULL);
CREATE TABLE IF NOT EXISTS causal_links (
    event_signature VARCHAR NOT NULL, outcome_signature VARCHAR NOT NULL, level VARCHAR NOT NULL, tool VARCHAR NOT NULL,
    outcome VARCHAR NOT NULL, valence VARCHAR NOT NULL, strength DOUBLE NOT NULL, observations BIGINT NOT NULL,
    event_observations BIGINT NOT NULL, confidence DOUBLE NOT NULL, updated_at TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (event_signature, outcome_signature));
CREATE INDEX IF NOT EXISTS causal_links_by_event ON causal_links (event_signature);
CREATE TABLE IF NOT EXISTS temporal_bins (
    agent VARCHAR NOT NULL, kind VARCHAR NOT NULL, bin_kind VARCHAR NOT NULL, bin INTEGER NOT NULL,
    count BIGINT NOT NULL, successes BIGINT NOT NULL, failures BIGINT NOT NULL,
    PRIMARY KEY (agent, kind, bin_kind, bin));
CREATE OR REPLACE VIEW tool_outcomes AS
    SELECT tool, max(event_observations) AS calls,
           coalesce(sum(observations) FILTER (outcome <> 'ok'), 0) AS errors,
           coalesce(sum(observations) FILTER (outcome <> 'ok'), 0) / max(event_observations) AS error_rate
    FROM causal_links WHERE level = 'tool' GROUP BY tool;
CREATE OR REPLACE VIEW entities AS
    SELECT * EXCLUDE (rn) FROM (
        SELECT *, row_number() OVER (PARTITION BY entity_id ORDER BY version DESC) AS rn FROM entity_versions)
    WHERE rn = 1;
CREATE OR REPLACE VIEW facts_active AS SELECT * FROM triples WHERE valid_to IS NULL;
CREATE OR REPLACE VIEW sessions_current AS
    SELECT agent, session_id, min(ts) AS started_at, max(ts) AS last_ts, count(*) AS events,
           bool_or(type = 'session_end') AS ended
    FROM events GROUP BY agent, session_id;
CREATE OR REPLACE VIEW agent_outcomes AS
    SELECT agent, outcome, count(*) AS episodes, avg(duration_s) AS avg_duration_s
    FROM episodes GROUP BY agent, outcome;
"""

# Columns that make up each table's content (what the checksum covers), in a stable order.
CONTENT_COLUMNS: dict[str, list[str]] = {
    "events": ["event_id", "schema_version", "ts", "agent", "session_id", "seq", "type", "payload"],
    "episodes": [
        "episode_id",
        "agent",
        "session_id",
        "task",
        "goal",
        "user_id",
        "summary",
        "outcome",
        "started_at",
        "ended_at",
        "duration_s",
        "event_count",
        "tool_calls",
        "tools",
        "errors",
        "delegations",
        "first_event_id",
        "last_event_id",
        "calls",
        "calls_dropped",
        "metadata",
    ],
    "lessons": ["episode_id", "agent", "session_id", "idx", "kind", "text", "tool", "error", "learned_at"],
    "dead_letters": ["src_topic", "src_partition", "src_offset", "src_index", "kind", "reason", "msg_key", "original"],
    "duplicate_events": ["event_id", "agent", "session_id", "seq", "src_partition", "src_offset", "src_index"],
    "knowledge_inputs": ["episode_id", "extractor", "agent", "observed_at", "entities", "facts"],
    "entity_versions": ["entity_id", "version", "name", "type", "attributes", "first_seen", "updated_at", "episode_id"],
    "entity_aliases": ["alias", "type", "entity_id", "jaccard", "first_seen", "episode_id"],
    "predicates": ["predicate", "functional", "added_at", "episode_id"],
    "triples": [
        "triple_id",
        "source",
        "predicate",
        "target",
        "scope",
        "confidence",
        "count",
        "evidence",
        "last_evidence",
        "valid_from",
        "valid_to",
        "superseded_by",
        "created_by",
        "extractor",
    ],
    "triple_history": ["ordinal", "triple_id", "change", "episode_id", "changed_at", "count", "confidence"],
    "promotions": [
        "promotion_id",
        "source",
        "predicate",
        "target",
        "from_scope",
        "to_scope",
        "reason",
        "promoted_at",
        "confidence",
        "learning_rate",
        "threshold",
        "users",
        "teams",
    ],
    "briefings_served": ["briefing_id", "agent", "session_id", "served_at", "facts"],
    "fact_uses": [
        "agent",
        "session_id",
        "briefing_id",
        "triple_id",
        "source",
        "predicate",
        "target",
        "scope",
        "confidence",
        "entity",
        "used_at",
    ],
    "promotion_state": ["statement", "state"],
    "causal_link_updates": [
        "event_signature",
        "outcome_signature",
        "level",
        "tool",
        "outcome",
        "valence",
        "agent",
        "episode_id",
        "observed_at",
        "src_partition",
        "src_offset",
        "idx",
        "target",
        "alpha",
        "strength_before",
        "strength",
        "observations",
        "event_observations",
        "confidence",
        "strengths",
    ],
    "causal_links": [
        "event_signature",
        "outcome_signature",
        "level",
        "tool",
        "outcome",
        "valence",
        "strength",
        "observations",
        "event_observations",
        "confidence",
        "updated_at",
    ],
    "temporal_bins": ["agent", "kind", "bin_kind", "bin", "count", "successes", "failures"],
    "memory_log": ["ord", "kind", "body"],
    "memories": [
        "memory_id",
        "kind",
        "agent",
        "scope",
        "run_id",
        "position",
        "occurred_at",
        "perception",
        "summary",
        "outcome",
        "speaker",
        "refs",
        "source_event_ids",
        "reasons",
        "prediction_error",
        "user_interaction",
        "decided_at",
        "user_id",
    ],
    "memory_merges": ["unit_id", "memory_id", "agent", "prediction_error", "decided_at"],
    "memory_edges": ["a", "b", "weight", "shared", "goal", "temporal", "formed_at"],
    "memory_access": ["memory_id", "agent", "query", "rank", "score", "accessed_at"],
    "goals": [
        "ord",
        "goal_id",
        "agent",
        "text",
        "user_id",
        "status",
        "forward_pe",
        "nearest_id",
        "changed_at",
        "set_by",
    ],
    "working_memory": ["session_key", "agent", "session_id", "user_id", "closed", "last_seq", "tokens", "state"],
    "semantic_log": ["ord", "owner", "kind", "body"],
    # not src_offset: a request published again after a crash lands at another offset, and runs once
    "semantic_requests": ["request_id", "owner", "requested_at"],
    "concepts": [
        "owner",
        "concept_id",
        "name",
        "category",
        "definition",
        "provenance",
        "reinforcement_count",
        "confidence",
        "properties",
        "source_episode_ids",
        "updated_at",
    ],
    "concept_relationships": ["owner", "source_id", "relation", "target_id", "weight", "metadata", "formed_at"],
    "math_patterns": [
        "owner",
        "math_id",
        "name",
        "category",
        "domain",
        "summary",
        "query",
        "confidence",
        "observations",
        "confirmed_at",
        "source_agents",
    ],
    "cross_layer_edges": [
        "owner",
        "source_layer",
        "source_id",
        "edge_type",
        "target_layer",
        "target_id",
        "weight",
        "formed_at",
    ],
    "promotion_audit": [
        "owner",
        "pattern_name",
        "origin",
        "candidate_confidence",
        "promoted",
        "concept_id",
        "reason",
        "decided_at",
    ],
    "lifecycle_log": ["run_id", "seq", "kind", "memory_id", "decided_at", "body"],
    "sleep_runs": [
        "run_id",
        "run_at",
        "trigger",
        "memories_before",
        "memories_after",
        "kept",
        "compressed",
        "pruned",
        "protected",
        "rescored",
        "bytes_before",
        "bytes_after",
        "fiedler",
        "report",
    ],
    "sleep_layer_reports": ["run_id", "layer", "before", "after", "removed", "added", "reinforced"],
    "oscillators": ["agent", "kind", "events", "state"],
    "oscillator_readings": ["agent", "kind", "occurred_at", "memory_id", "anomaly", "coherence", "distances"],
    "briefings": [
        "agent",
        "briefing_id",
        "generated_at",
        "budget",
        "markdown",
        "chars",
        "lessons",
        "facts",
        "strategies",
        "dropped_lessons",
        "dropped_facts",
        "dropped_strategies",
    ],
}


def refresh_facts_top(con: duckdb.DuckDBPyConnection, scopes: list[str] | None = None) -> None:
    """Recompute the best active facts of ``scopes`` (all scopes when None) into ``facts_top``."""
    cols = (
        "triple_id, source, predicate, target, scope, confidence, count, evidence, last_evidence, "
        "valid_from, valid_to, superseded_by, created_by, extractor"
    )
    rank = (
        f"QUALIFY row_number() OVER (PARTITION BY scope ORDER BY confidence DESC, count DESC, triple_id) "
        f"<= {FACTS_TOP_K}"
    )
    if scopes is None:
        con.execute("DELETE FROM facts_top")
        con.execute(f"INSERT INTO facts_top SELECT {cols} FROM triples WHERE valid_to IS NULL {rank}")
        return
    if not scopes:
        return
    con.execute("DELETE FROM facts_top WHERE scope IN (SELECT unnest(?::VARCHAR[]))", [scopes])
    con.execute(
        f"INSERT INTO facts_top SELECT {cols} FROM triples WHERE valid_to IS NULL "
        f"AND scope IN (SELECT unnest(?::VARCHAR[])) {rank}",
        [scopes],
    )


def init(con: duckdb.DuckDBPyConnection) -> None:
    con.execute(DDL)
    # Files made before math_patterns had ``source_agents`` (a pattern's provenance) get it, last, as
    # the DDL has it: their rows keep NULL (not recorded) until a replay rebuilds them.
    con.execute("ALTER TABLE math_patterns ADD COLUMN IF NOT EXISTS source_agents VARCHAR[]")
    # Files made before a run's layer report counted what it added and reinforced get them (0: not counted).
    for col in ("added", "reinforced"):
        con.execute(f"ALTER TABLE sleep_layer_reports ADD COLUMN IF NOT EXISTS {col} BIGINT DEFAULT 0")
    con.execute("INSERT OR IGNORE INTO projection_meta VALUES ('schema_version', ?)", [str(SCHEMA_VERSION)])
