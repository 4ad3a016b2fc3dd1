"""Read queries over the projections: read-only SQL, content checksum, counts."""

from __future__ import annotations

import hashlib
from typing import Any

import duckdb

from projections.schema import CONTENT_COLUMNS

READ_ONLY_TYPES = {"SELECT", "EXPLAIN"}


class NotReadOnly(ValueError):
    """The SQL holds a statement that could change the projections."""


def check_read_only(sql: str) -> None:
    statements = duckdb.extract_statements(sql)
    if not statements:
        raise NotReadOnly("no SQL statement given")
    for st in statements:
        if st.type.name not in READ_ONLY_TYPES:
            raise NotReadOnly(f"only SELECT queries are allowed here, got a {st.type.name} statement")


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
        n, total = con.execute(
            f"SELECT count(*), coalesce(sum(hash({expr})::HUGEINT), 0) FROM {table}").fetchone()
        out[table] = f"{n}:{total}"
    return out


def checksum(con: duckdb.DuckDBPyConnection) -> str:
    parts = table_checksums(con)
    blob = "\n".join(f"{t}={v}" for t, v in sorted(parts.items()))
    return hashlib.sha256(blob.encode()).hexdigest()


def counts(con: duckdb.DuckDBPyConnection) -> dict[str, int]:
    return {t: con.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in CONTENT_COLUMNS}


def offsets(con: duckdb.DuckDBPyConnection) -> dict[str, dict[int, int]]:
    out: dict[str, dict[int, int]] = {}
    for topic, part, off in con.execute(
            "SELECT topic, kafka_partition, next_offset FROM projection_offsets ORDER BY 1, 2").fetchall():
        out.setdefault(topic, {})[part] = off
    return out


def summary(con: duckdb.DuckDBPyConnection) -> dict[str, Any]:
    return {"counts": counts(con), "offsets": offsets(con),
            "stale_briefings": con.execute("SELECT count(*) FROM briefings_dirty").fetchone()[0],
            "dead_letter_kinds": dict(con.execute(
                "SELECT kind, count(*) FROM dead_letters GROUP BY 1 ORDER BY 1").fetchall())}
