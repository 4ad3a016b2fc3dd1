"""Arrow tables handed to the projector's SQL by an explicit name, never by a Python variable's name.

DuckDB's Python replacement scans (SQL naming a local variable that holds a DataFrame or an Arrow
table) need ``enable_external_access``, which the projector's database turns off because it also runs
analysts' SQL (``projections/sql_sandbox.py``). ``registered`` makes the name a view of this
connection for the statement's duration (``con.register`` / ``unregister``).

>>> import duckdb, pyarrow as pa
>>> con = duckdb.connect()
>>> with registered(con, rows=pa.table({"n": [1, 2]})):
...     con.execute("SELECT sum(n) FROM rows").fetchone()[0]
3
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import duckdb


@contextmanager
def registered(con: duckdb.DuckDBPyConnection, **frames: Any) -> Iterator[None]:
    """Each of ``frames`` (name -> Arrow table) readable by SQL on ``con`` under its name, until the block ends."""
    _finish(con)
    for name, frame in frames.items():
        con.register(name, frame)
    try:
        yield
    except BaseException:
        with contextlib.suppress(duckdb.Error):  # the block's own error is the one to raise
            _unregister(con, frames)
        raise
    _unregister(con, frames)


def _unregister(con: duckdb.DuckDBPyConnection, frames: dict[str, Any]) -> None:
    _finish(con)
    for name in frames:
        con.unregister(name)


def _finish(con: duckdb.DuckDBPyConnection) -> None:
    """Run an unread result of ``con.execute`` to its end: DuckDB 2.x refuses ``register`` and
    ``unregister`` while one is left (a ``fetchone()`` leaves one). Unlike ``abort()``, this never
    fails an open transaction. DuckDB 1.x has no such state."""
    complete = getattr(con, "complete", None)
    if complete is not None:
        complete()
