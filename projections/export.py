"""Parquet for analysts: every projection as hive-partitioned Parquet, from one committed snapshot.

While the stack runs, the projector holds DuckDB's only read-write lock, so the export runs in the
projector's process (``POST /export/parquet``, operator token; ``somnus export parquet DIR``), or on
the file opened read-only when no projector runs. It reads every table in one DuckDB transaction on
its own cursor: the projector commits each batch's rows and its source offsets in one transaction,
so the snapshot is one committed batch, and ``projection_offsets`` read in the same transaction are
the offsets that snapshot is at. Ingest goes on meanwhile (MVCC: the writer is not blocked).

The files are written from Arrow by pyarrow, not by DuckDB's ``COPY ... TO``: writing files from SQL
needs ``enable_external_access``, which the projector's database may turn off; the Arrow path works
either way and writes only under the folder asked for.

Layout: ``DIR/<table>/[agent=<agent>/][day=<YYYY-MM-DD>/]part-*.parquet`` (``agent`` where the table has
that column, ``day`` from its time column, UTC), and ``DIR/manifest.json``, written last: the offsets,
each table's rows, partition columns and time column. A folder without a manifest is an unfinished
export.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

MANIFEST = "manifest.json"
FORMAT_VERSION = 1
# A table's day comes from the first of these columns it has, else from its first time column.
DAY_COLUMNS = (
    "ended_at",
    "ts",
    "occurred_at",
    "at",
    "learned_at",
    "observed_at",
    "run_at",
    "created_at",
    "updated_at",
    "valid_from",
    "started_at",
    "served_at",
)
TIME_TYPES = ("TIMESTAMP WITH TIME ZONE", "TIMESTAMP", "DATE")
BATCH_ROWS = 65_536


class ExportError(ValueError):
    """The export cannot be made as asked (a bad folder, table or time)."""


def tables_of(cur: Any) -> dict[str, list[tuple[str, str]]]:
    """The projections: every base table of the database (not the internal ``_...`` ones), with its columns."""
    rows = cur.execute(
        "SELECT table_name, column_name, data_type FROM duckdb_columns() WHERE database_name = current_database() "
        "AND schema_name = 'main' AND table_name IN (SELECT table_name FROM duckdb_tables() WHERE NOT temporary "
        "AND database_name = current_database() AND schema_name = 'main') AND NOT starts_with(table_name, '_') "
        "ORDER BY table_name, column_index"
    ).fetchall()
    out: dict[str, list[tuple[str, str]]] = {}
    for table, column, dtype in rows:
        out.setdefault(table, []).append((column, dtype))
    return out


def day_column(columns: Sequence[tuple[str, str]]) -> str | None:
    """The column a table's ``day`` partition comes from, or None (no time column)."""
    timed = [c for c, t in columns if t in TIME_TYPES]
    return next((c for c in DAY_COLUMNS if c in timed), timed[0] if timed else None)


def _since(value: Any) -> datetime | None:
    if value in (None, ""):
        return None
    try:
        when = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        raise ExportError(f"since {value!r}: not an ISO 8601 time") from None
    return when if when.tzinfo is not None else when.replace(tzinfo=timezone.utc)


def _folder(value: Any) -> Path:
    if not isinstance(value, str) or not value:
        raise ExportError("dir: the folder to write is required")
    path = Path(value)
    if not path.is_absolute():
        raise ExportError(f"dir {value!r}: give an absolute path (the projector writes it)")
    if path.is_symlink():  # it would write wherever the link points, chosen by whoever made the link
        raise ExportError(f"dir {value}: is a symbolic link; give the folder itself")
    if path.exists():
        if not path.is_dir() or any(path.iterdir()):
            raise ExportError(f"dir {value}: exists and is not an empty folder")
        # a folder someone else owns or may write to: they could put a symbolic link in it, after this
        # check, where a part file is about to be written (and have one of our files overwritten)
        st = path.stat()
        if st.st_uid != os.getuid() or st.st_mode & 0o022:
            raise ExportError(
                f"dir {value}: is another user's folder, or writable by others; give a folder of "
                "this user's, or one that does not exist yet"
            )
    return path


def _select(
    table: str, columns: Sequence[tuple[str, str]], day: str | None, since: datetime | None
) -> tuple[str, list[Any]]:
    """The SELECT of one table: its columns, ``day`` (UTC date of the time column), rows since ``since``."""
    cols = ", ".join(f'"{c}"' for c, _ in columns)
    types = dict(columns)
    if day is None:
        return f'SELECT {cols} FROM "{table}"', []
    utc = f"timezone('UTC', \"{day}\")" if types[day] == "TIMESTAMP WITH TIME ZONE" else f'"{day}"'
    sql = f'SELECT {cols}, CAST({utc} AS DATE) AS day FROM "{table}"'
    if since is None:
        return sql, []
    return sql + f" WHERE {utc} >= ?", [since.astimezone(timezone.utc).replace(tzinfo=None)]


def export_parquet(con: Any, dir: Any, tables: Any = None, since: Any = None) -> dict[str, Any]:
    """Write the projections under ``dir`` (see the module's docstring); returns the manifest.

    ``con``: a DuckDB connection of the database (a cursor of it is used, in one transaction);
    ``tables``: only these (default: all); ``since``: only rows whose day is on or after this time's."""
    import pyarrow as pa
    import pyarrow.dataset as ds
    import pyarrow.parquet as pq

    folder = _folder(dir)
    after = _since(since)
    started = time.monotonic()
    cur = con.cursor()
    try:
        cur.execute("BEGIN TRANSACTION")
        offsets = cur.execute(
            "SELECT topic, kafka_partition, next_offset FROM projection_offsets ORDER BY topic, kafka_partition"
        ).fetchall()  # first: this pins the snapshot
        known = tables_of(cur)
        wanted = sorted(known) if not tables else list(tables)
        unknown = [t for t in wanted if t not in known]
        if unknown:
            raise ExportError(
                f"no projection named {', '.join(map(repr, unknown))} (there are: {', '.join(sorted(known))})"
            )
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        listed: dict[str, Any] = {}
        for table in wanted:
            columns = known[table]
            day = day_column(columns)
            parts = (["agent"] if "agent" in dict(columns) else []) + (["day"] if day else [])
            if not [c for c in dict(columns) if c not in parts]:  # (briefings_dirty: agent alone) a file
                parts = []  # must keep one column: partitioned, it would have none and no reader opens it
            sql, params = _select(table, columns, day, after)
            reader = _arrow_reader(cur.sql(sql, params=params or None))
            rows = _write(reader, folder / table, parts, pa, ds, pq)
            listed[table] = {
                "rows": rows,
                "partition_by": parts,
                "day_from": day,
                "since_applied": after is not None and day is not None,
            }
        cur.execute("COMMIT")
    except BaseException:
        cur.execute("ROLLBACK")
        raise
    finally:
        cur.close()
    manifest = {
        "format": FORMAT_VERSION,
        "exported_at": datetime.now(timezone.utc).isoformat(),
        "since": after.isoformat() if after else None,
        "offsets": [{"topic": t, "partition": p, "next_offset": o} for t, p, o in offsets],
        "tables": listed,
        "seconds": round(time.monotonic() - started, 3),
    }
    tmp = folder / f".{MANIFEST}.tmp"
    tmp.write_text(json.dumps(manifest, indent=2))
    os.replace(tmp, folder / MANIFEST)  # last: a folder with a manifest is a finished export
    return manifest


def _arrow_reader(rel: Any) -> Any:
    """The relation's rows as an Arrow record batch reader, streamed (DuckDB 2's name, or 1.x's)."""
    if hasattr(rel, "to_arrow_reader"):
        return rel.to_arrow_reader(BATCH_ROWS)
    return rel.fetch_arrow_reader(BATCH_ROWS)


def _write(reader: Any, where: Path, parts: list[str], pa: Any, ds: Any, pq: Any) -> int:
    """Write the reader's batches under ``where``, hive-partitioned by ``parts``; the rows written."""
    counted = [0]

    def batches() -> Any:
        for batch in reader:
            counted[0] += batch.num_rows
            yield batch

    schema = reader.schema
    if parts:
        ds.write_dataset(
            batches(),
            where,
            schema=schema,
            format="parquet",
            partitioning=ds.partitioning(pa.schema([schema.field(p) for p in parts]), flavor="hive"),
            basename_template="part-{i}.parquet",
            existing_data_behavior="overwrite_or_ignore",
        )
    else:
        where.mkdir(parents=True, exist_ok=True)
        with pq.ParquetWriter(where / "part-0.parquet", schema) as writer:
            for batch in batches():
                writer.write_batch(batch)
    if counted[0] == 0 and parts:  # no partition folder was made: an empty file keeps the table and its schema
        where.mkdir(parents=True, exist_ok=True)
        pq.write_table(schema.empty_table(), where / "part-0.parquet")
    return counted[0]
