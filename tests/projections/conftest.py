"""Every database a projections test makes runs as the projector's does: external access off
(``sql_sandbox.harden``), so a write path that named a Python variable in its SQL (a replacement
scan) instead of registering its frame (``projections/frames.py``) fails here."""

from __future__ import annotations

from typing import Any

import duckdb
import pytest

from somnus.projections import schema


@pytest.fixture(autouse=True)
def external_access_off(monkeypatch: pytest.MonkeyPatch) -> None:
    init = schema.init

    def init_closed(con: duckdb.DuckDBPyConnection, *args: Any, **kwargs: Any) -> Any:
        out = init(con, *args, **kwargs)
        con.execute("SET enable_external_access = false")  # not locked: a test may still SET what it needs
        return out

    monkeypatch.setattr(schema, "init", init_closed)
