"""somnus.projections.frames.registered: an Arrow table readable by name for a block, then gone, on a
connection with external access off (the projector's), whatever result a fetchone left unread."""

from __future__ import annotations

import duckdb
import pyarrow as pa
import pytest

from somnus.projections.frames import registered


def _closed() -> duckdb.DuckDBPyConnection:
    con = duckdb.connect()
    con.execute("CREATE TABLE t (n INTEGER)")
    con.execute("SET enable_external_access = false")
    return con


def _views(con: duckdb.DuckDBPyConnection) -> int:
    return con.execute("SELECT count(*) FROM duckdb_views() WHERE NOT internal").fetchone()[0]


def test_a_frame_is_readable_by_its_name_inside_the_block_only():
    con = _closed()
    con.execute("SELECT * FROM range(10)").fetchone()  # an unread result: register must still work
    with registered(con, rows=pa.table({"n": [1, 2]}), more=pa.table({"n": [3]})):
        con.execute("INSERT INTO t SELECT n FROM rows UNION ALL SELECT n FROM more")
        assert con.execute("SELECT n FROM rows ORDER BY n").fetchone() == (1,)  # left unread at the block's end
    assert sorted(n for (n,) in con.execute("SELECT n FROM t").fetchall()) == [1, 2, 3]
    assert _views(con) == 0
    with pytest.raises(duckdb.CatalogException):
        con.execute("SELECT * FROM rows")


def test_the_blocks_error_is_raised_and_the_frame_is_gone():
    con = _closed()
    with pytest.raises(duckdb.ConversionException):
        with registered(con, rows=pa.table({"n": ["not a number"]})):
            con.execute("INSERT INTO t SELECT n::INTEGER FROM rows")
    assert _views(con) == 0


def test_without_it_the_closed_connection_does_not_see_the_variable():
    con = _closed()
    rows = pa.table({"n": [1]})
    assert rows.num_rows == 1
    with pytest.raises(duckdb.CatalogException):  # a replacement scan would have found the local ``rows``
        con.execute("INSERT INTO t SELECT n FROM rows")
