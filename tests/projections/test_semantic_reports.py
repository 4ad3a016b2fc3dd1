"""``_report_layers`` writes in one statement what a statement per row wrote."""

from __future__ import annotations

import duckdb
from hypothesis import given, settings
from hypothesis import strategies as st

from somnus.projections import schema
from somnus.projections.semantic import LAYER_COUNTS, _report_layers

_counts = st.fixed_dictionaries({c: st.integers(0, 50) for c in LAYER_COUNTS})
_changes = st.dictionaries(st.sampled_from(["atl", "angular_gyrus"]), _counts, min_size=1)


def _per_row(con: duckdb.DuckDBPyConnection, runs: list) -> None:
    """The statement per (run, layer) of before."""
    for run_id, changes in runs:
        for layer, counts in changes.items():
            con.execute(
                f"INSERT OR REPLACE INTO sleep_layer_reports (run_id, layer, {', '.join(LAYER_COUNTS)}) "
                f"VALUES (?, ?, {', '.join('?' * len(LAYER_COUNTS))})",
                [run_id, layer, *(counts[c] for c in LAYER_COUNTS)],
            )


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["r1", "r2", "r3"]), _changes), max_size=5), st.booleans())
def test_one_statement_equals_a_statement_per_row(runs, earlier):
    tables = []
    for write in (_per_row, _report_layers):
        con = duckdb.connect()
        schema.init(con)
        if earlier:  # a row already there is replaced
            _per_row(con, [("r1", {"atl": dict.fromkeys(LAYER_COUNTS, 99)})])
        write(con, runs)
        tables.append(con.execute("SELECT * FROM sleep_layer_reports ORDER BY run_id, layer").fetchall())
        con.close()
    assert tables[0] == tables[1]
