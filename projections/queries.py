"""Read queries over the projections: read-only SQL, content checksum, counts."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import duckdb

from somnus.projections.schema import CONTENT_COLUMNS
from somnus.projections.sql_sandbox import SqlRefused, one_row, statement
from somnus.schemas.facts import GLOBAL_SCOPE
from somnus.schemas.semantic import SLEEP_REQUEST_PREFIX


class NotReadOnly(ValueError):
    """The SQL holds a statement that could change the projections."""


def check_read_only(sql: str) -> None:
    """One SELECT, or EXPLAIN [ANALYZE] of one, by DuckDB's parser (``sql_sandbox.statement``);
    what it may read is checked when it runs in the sandbox (``projections/sql_sandbox.py``)."""
    try:
        statement(sql)
    except SqlRefused as exc:
        raise NotReadOnly(str(exc)) from None


def run_sql(con: duckdb.DuckDBPyConnection, sql: str, params: list[Any] | None = None) -> dict[str, Any]:
    """Run a read-only query (``?`` placeholders take ``params``); returns ``{"columns": [...], "rows": [[...], ...]}``."""
    check_read_only(sql)
    cur = con.cursor()
    try:
        rel = cur.execute(sql, params) if params else cur.execute(sql)
        columns = [d[0] for d in rel.description] if rel.description else []
        rows = rel.fetchall()
    finally:
        cur.close()
    return {"columns": columns, "rows": [list(r) for r in rows]}


def table_checksums(con: duckdb.DuckDBPyConnection) -> dict[str, str]:
    """Per table: row count and an order-independent sum of row hashes over the content columns.

    The sum (not xor) of row hashes counts duplicates, so a doubled row changes the checksum.
    """
    out = {}
    for table, cols in CONTENT_COLUMNS.items():
        expr = ", ".join(f'"{c}"' for c in cols)
        n, total = one_row(con, f"SELECT count(*), coalesce(sum(hash({expr})::HUGEINT), 0) FROM {table}")
        out[table] = f"{n}:{total}"
    return out


def checksum(con: duckdb.DuckDBPyConnection) -> str:
    parts = table_checksums(con)
    blob = "\n".join(f"{t}={v}" for t, v in sorted(parts.items()))
    return hashlib.sha256(blob.encode()).hexdigest()


def counts(con: duckdb.DuckDBPyConnection) -> dict[str, int]:
    """Rows of every projection, in one query (one a table took ~70 of ``somnus status``'s ms)."""
    got = dict(con.execute(" UNION ALL ".join(f"SELECT '{t}', count(*) FROM {t}" for t in CONTENT_COLUMNS)).fetchall())
    return {t: got[t] for t in CONTENT_COLUMNS}


def offsets(con: duckdb.DuckDBPyConnection) -> dict[str, dict[int, int]]:
    out: dict[str, dict[int, int]] = {}
    for topic, part, off in con.execute(
        "SELECT topic, kafka_partition, next_offset FROM projection_offsets ORDER BY 1, 2"
    ).fetchall():
        out.setdefault(topic, {})[part] = off
    return out


def summary(con: duckdb.DuckDBPyConnection) -> dict[str, Any]:
    return {
        "counts": counts(con),
        "offsets": offsets(con),
        "memories": memory_counts(con),
        "stale_briefings": one_row(con, "SELECT count(*) FROM briefings_dirty")[0],
        # sleep runs whose promotion request is not folded yet (docs/design/scale-out.md, cause 3)
        "pending_promotions": len(unrequested_runs(con)),
        "dead_letter_kinds": dict(
            con.execute("SELECT kind, count(*) FROM dead_letters GROUP BY 1 ORDER BY 1").fetchall()
        ),
        # records the projector itself could not decode or fold, by their own topic (never retried)
        "quarantined": dict(
            con.execute(
                "SELECT src_topic, count(*) FROM dead_letters WHERE dlq_offset IS NULL AND kind <> 'duplicate' "
                "GROUP BY 1 ORDER BY 1"
            ).fetchall()
        ),
        # trace events whose event_id their session had already projected (applied once)
        "duplicate_events": _count_or_zero(con, "duplicate_events"),
    }


def _count_or_zero(con: duckdb.DuckDBPyConnection, table: str) -> int:
    """Rows of ``table``; 0 in a file older than it (opened read-only before a projector created it)."""
    try:
        return one_row(con, f"SELECT count(*) FROM {table}")[0]
    except duckdb.CatalogException:
        return 0


def stream_time(con: duckdb.DuckDBPyConnection, agents: Mapping[str, Any], scope: str = "global") -> dict[str, Any]:
    """The stream time of a scope: the newest event time of the agents writing in it (``agent:<name>``:
    that agent; ``team:<lead>``: the agents reporting to ``lead``; ``global``: every agent), None
    when none has an event yet. What a person's command (promote, sleep, consolidate, ingest) is
    stamped with, so a historical import behaves as it did live."""
    if scope == GLOBAL_SCOPE:
        members = None
    elif scope.startswith("agent:") and len(scope) > len("agent:"):
        members = [scope.removeprefix("agent:")]
    elif scope.startswith("team:") and len(scope) > len("team:"):
        lead = scope.removeprefix("team:")
        members = sorted(n for n, spec in agents.items() if getattr(spec, "reports_to", None) == lead)
    else:
        raise ValueError(f"scope {scope!r}: global, team:<lead> or agent:<name>")
    if members is None:
        at = one_row(con, "SELECT max(ts) FROM events")[0]
    elif members:
        at = one_row(con, "SELECT max(ts) FROM events WHERE agent IN (SELECT unnest(?::VARCHAR[]))", [members])[0]
    else:
        at = None
    return {"scope": scope, "agents": members, "at": at.isoformat() if at is not None else None}


def memory_counts(con: duckdb.DuckDBPyConnection) -> dict[str, int]:
    """Stored memories by state: ``live`` (recallable, compressed ones included), ``compressed`` and
    ``pruned`` (removed by sleep or a forget: still rows of ``memories``, an append-only projection)."""
    stored, pruned, compressed = one_row(
        con,
        """
        WITH forgotten AS (
            SELECT body->>'memory_id' AS memory_id, bool_or(body->>'reason' = 'removed') AS removed
            FROM memory_log WHERE kind = 'MemoryForgotten' GROUP BY 1)
        SELECT count(*), count(*) FILTER (WHERE f.removed), count(*) FILTER (WHERE NOT f.removed)
        FROM memories m LEFT JOIN forgotten f USING (memory_id)""",
    )
    return {"stored": stored, "live": stored - pruned, "compressed": compressed, "pruned": pruned}


def unrequested_runs(con: duckdb.DuckDBPyConnection) -> list[tuple[str, datetime]]:
    """The sleep runs (run_id, run_at) whose promotion request the semantic fold has not run yet:
    waiting for the pipeline to catch up, lost in a crash, or published and not yet folded."""
    return con.execute(
        "SELECT run_id, run_at FROM sleep_runs WHERE ? || run_id "
        "NOT IN (SELECT request_id FROM semantic_requests) ORDER BY run_at, run_id",
        [SLEEP_REQUEST_PREFIX],
    ).fetchall()
