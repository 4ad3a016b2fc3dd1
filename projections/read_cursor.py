"""The read API's cursor: every result is read to its end before ``execute`` returns.

DuckDB's Python ``execute`` streams its result, and the query's auto-commit transaction stays open
until the result is read to its end (or the cursor runs its next query). ``cur.execute(sql).fetchone()``
on a one-row result leaves it unread, so a long-lived cursor nearly always holds a transaction, and a
transaction older than a dropped table makes ``CHECKPOINT`` fail ("Cannot CHECKPOINT: there are other
write transactions active"): a forget's scrub (``projections/forget.py``) never finished on a serving
projector (docs/design/forget.md, "The live file's scrub").

>>> import duckdb
>>> con = duckdb.connect()
>>> cur = ReadCursor(con.cursor())
>>> cur.execute("SELECT range FROM range(3)").fetchone()
(0,)
>>> cur.fetchall()
[(1,), (2,)]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import duckdb


class ReadCursor:
    """A DuckDB cursor whose ``execute`` fetches the whole result (ending its transaction) and serves
    ``fetchone``/``fetchmany``/``fetchall``/``description`` from it; anything else is the cursor's own
    (``cursor()`` makes a raw one: its user closes it)."""

    def __init__(self, cur: duckdb.DuckDBPyConnection) -> None:
        self._cur = cur
        self._rows: list[Any] = []
        self._next = 0
        self.description: Any = None

    def execute(self, query: str, parameters: Sequence[Any] | dict[str, Any] | None = None) -> ReadCursor:
        res = self._cur.execute(query, parameters)
        self.description = res.description
        self._rows, self._next = res.fetchall(), 0
        return self

    def fetchone(self) -> Any:
        if self._next >= len(self._rows):
            return None
        self._next += 1
        return self._rows[self._next - 1]

    def fetchmany(self, size: int = 1) -> list[Any]:
        out = self._rows[self._next : self._next + size]
        self._next += len(out)
        return out

    def fetchall(self) -> list[Any]:
        out = self._rows[self._next :]
        self._next = len(self._rows)
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cur, name)
