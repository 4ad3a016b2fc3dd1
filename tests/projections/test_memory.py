"""The episodic memory projection (projections/memory.py): a batch folded a chunk of records at a time."""

from __future__ import annotations

from datetime import timedelta

from somnus.projections import memory, queries
from tests.projections.test_sleep import _project, _records, units  # noqa: F401 (units: a fixture)

MEMORY_TABLES = ("memory_log", "memories", "memory_merges", "memory_edges", "lifecycle_log", "sleep_runs")


def test_a_batch_folded_in_chunks_writes_what_one_chunk_writes(tmp_path, units, monkeypatch):  # noqa: F811
    """``MEMORY_CHUNK`` bounds what a batch holds at once; the decisions, their order in the log and every
    table are the same however the batch is cut, a sleep run (scheduled and requested) included."""
    recs = _records(units, request_at=max(u.occurred_at for u in units) + timedelta(days=10))
    whole, _ = _project(tmp_path, "whole.duckdb", [recs])
    monkeypatch.setattr(memory, "MEMORY_CHUNK", 3)
    cut, _ = _project(tmp_path, "cut.duckdb", [recs])
    assert len(recs) > 3 * memory.MEMORY_CHUNK  # several chunks, a sleep request in the last
    a, b = queries.table_checksums(whole), queries.table_checksums(cut)
    assert all(a[t] == b[t] for t in MEMORY_TABLES), {t: (a[t], b[t]) for t in MEMORY_TABLES}
    assert int(a["memory_log"].split(":")[0]) > len(units) // 2
    order = "SELECT ord, kind, src_offset, md5(body::VARCHAR) FROM memory_log ORDER BY ord"
    assert whole.execute(order).fetchall() == cut.execute(order).fetchall()
