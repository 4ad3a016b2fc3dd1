"""DuckDB schema of the projections. Tables are append-only; "current" state is a view.

``src_partition`` / ``src_offset`` / ``src_index`` (position in a bundle) say where in Kafka a row came from (traceability); they are
transport details, left out of the content checksum.
"""

from __future__ import annotations

import duckdb

SCHEMA_VERSION = 1

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
    first_event_id UUID, last_event_id UUID, src_partition INTEGER, src_offset BIGINT);
CREATE TABLE IF NOT EXISTS lessons (
    episode_id UUID NOT NULL, agent VARCHAR NOT NULL, session_id VARCHAR NOT NULL, idx INTEGER NOT NULL,
    kind VARCHAR NOT NULL, text VARCHAR NOT NULL, tool VARCHAR, error VARCHAR, learned_at TIMESTAMPTZ);
CREATE TABLE IF NOT EXISTS dead_letters (
    src_topic VARCHAR NOT NULL, src_partition INTEGER NOT NULL, src_offset BIGINT NOT NULL,
    src_index INTEGER NOT NULL, kind VARCHAR NOT NULL, reason VARCHAR NOT NULL, msg_key BLOB, original BLOB,
    dlq_partition INTEGER, dlq_offset BIGINT);
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
    "episodes": ["episode_id", "agent", "session_id", "task", "goal", "user_id", "summary", "outcome",
                 "started_at", "ended_at", "duration_s", "event_count", "tool_calls", "tools", "errors",
                 "delegations", "first_event_id", "last_event_id"],
    "lessons": ["episode_id", "agent", "session_id", "idx", "kind", "text", "tool", "error", "learned_at"],
    "dead_letters": ["src_topic", "src_partition", "src_offset", "src_index", "kind", "reason", "msg_key", "original"],
}


def init(con: duckdb.DuckDBPyConnection) -> None:
    con.execute(DDL)
    con.execute("INSERT OR IGNORE INTO projection_meta VALUES ('schema_version', ?)", [str(SCHEMA_VERSION)])
