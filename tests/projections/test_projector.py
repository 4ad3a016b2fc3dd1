"""The projector's start-up: waiting for a reader that holds the DuckDB file (a real second process)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time

import duckdb
import pytest

from somnus.projections.projector import connect_when_free

HOLD = """
import sys, time, duckdb
con = duckdb.connect(sys.argv[1], read_only=True)
print("held", flush=True)
time.sleep(float(sys.argv[2]))
con.close()
"""


def _hold(path, seconds: float) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(path), str(seconds)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


@pytest.fixture()
def db(tmp_path):
    path = tmp_path / "somnus.duckdb"
    duckdb.connect(str(path)).close()
    return path


def test_a_reader_holding_the_file_is_waited_for(db):
    proc = _hold(db, 1.0)
    try:
        with pytest.raises(duckdb.IOException):
            duckdb.connect(str(db))  # what the projector did before: it died here
        t0 = time.monotonic()
        con = asyncio.run(connect_when_free(db, timeout_s=30))
        assert time.monotonic() - t0 > 0.3
        con.execute("CREATE TABLE t AS SELECT 1 AS x")
        con.close()
    finally:
        proc.wait()


def test_a_holder_that_never_lets_go_is_still_an_error(db):
    proc = _hold(db, 5.0)
    try:
        with pytest.raises(duckdb.IOException, match="lock"):
            asyncio.run(connect_when_free(db, timeout_s=0.5))
    finally:
        proc.kill()
        proc.wait()


def test_the_projectors_database_is_held_to_its_memory_limit(tmp_path):
    """``Settings.db_memory_limit`` caps DuckDB's buffer pool (its default, 80% of RAM, let it keep every
    block of the file: issue #30), and the locked configuration keeps a query from raising it."""
    from somnus.projections.projector import open_projections

    con = asyncio.run(open_projections(tmp_path / "somnus.duckdb", memory_limit="128MB"))
    try:
        assert con.execute("SELECT current_setting('memory_limit')").fetchone()[0] == "122.0 MiB"
        with pytest.raises(duckdb.Error, match="configuration has been locked"):
            con.execute("SET memory_limit = '8GB'")
    finally:
        con.close()
