"""The read API's cursor (``projections/read_cursor.py``): a result read in part holds no transaction."""

from __future__ import annotations

import duckdb
import pytest

from somnus.projections.read_cursor import ReadCursor


def replaced_then_checkpoint(con: duckdb.DuckDBPyConnection, reader: object) -> None:
    reader.execute("SELECT i FROM t").fetchone()  # type: ignore[attr-defined]
    con.execute("CREATE OR REPLACE TABLE t AS SELECT range AS i FROM range(10)")  # what the forget scrub does
    con.execute("CHECKPOINT")


def test_a_result_read_in_part_no_longer_blocks_a_checkpoint(tmp_path):
    con = duckdb.connect(str(tmp_path / "r.duckdb"))
    con.execute("CREATE TABLE t AS SELECT range AS i FROM range(100000)")
    con.execute("CHECKPOINT")
    # DuckDB's own behaviour, the cause (docs/design/forget.md): a raw cursor's unread result keeps
    # its transaction, and CHECKPOINT refuses while it is older than the replaced table.
    with pytest.raises(duckdb.TransactionException, match="Cannot CHECKPOINT"):
        replaced_then_checkpoint(con, con.cursor())
    con.execute("SELECT 1").fetchall()
    replaced_then_checkpoint(con, ReadCursor(con.cursor()))  # no error


def test_it_serves_the_rows_as_a_cursor_does():
    cur = ReadCursor(duckdb.connect().cursor())
    assert cur.execute("SELECT range AS n FROM range(5) WHERE range >= ?", [1]) is cur
    assert [d[0] for d in cur.description] == ["n"]
    assert cur.fetchone() == (1,)
    assert cur.fetchmany(2) == [(2,), (3,)]
    assert cur.fetchall() == [(4,)]
    assert cur.fetchone() is None and cur.fetchall() == [] and cur.fetchmany(3) == []
    assert cur.execute("SELECT 1 WHERE false").fetchone() is None
    assert cur.execute("CREATE TABLE x (a INT)").fetchall() == []
    assert cur.execute("INSERT INTO x VALUES (7)").fetchone() == (1,)
    other = cur.cursor()  # anything else is the wrapped cursor's
    assert other.execute("SELECT a FROM x").fetchall() == [(7,)]
    other.close()
