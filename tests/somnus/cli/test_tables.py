"""somnus.cli.tables: tables fit the terminal without squeezed columns; CSV and JSON carry the same rows."""

from __future__ import annotations

import csv
import io
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from somnus.cli import tables
from somnus.cli.tables import MIN_WIDTH, render

LONG = "the rate limit of http_get was hit after 40 calls in a minute; waiting 60 s and retrying worked " * 2


def test_a_table_that_fits_keeps_its_natural_widths() -> None:
    got = render(["tool", "calls"], [["http_get", 12], ["search", 3]], width=80).splitlines()
    assert got == ["tool      calls", "────────  ─────", "http_get     12", "search        3"]


def test_a_long_text_wraps_and_is_cut_with_an_ellipsis_at_80_columns() -> None:
    got = render(
        ["rank", "score", "kind", "when", "text"], [[1, 0.9123, "lesson", "2024-05-17T05:10", LONG]], width=80
    ).splitlines()
    assert all(len(line) <= 80 for line in got)
    assert got[0].split() == ["rank", "score", "kind", "when", "text"]  # every header whole
    assert "2024-05-17T05:10" in got[2] and "lesson" in got[2]  # the short columns keep their width
    assert len(got) == 2 + tables.MAX_LINES and got[-1].endswith("…")


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.text(st.characters(codec="ascii", categories=["L", "N", "P", "Zs"]), max_size=60), min_size=1, max_size=9
    ).flatmap(
        lambda head: st.tuples(
            st.just(head), st.lists(st.lists(st.text(max_size=200), min_size=len(head), max_size=len(head)), max_size=5)
        )
    ),
    st.integers(40, 200),
)
def test_no_line_is_wider_than_the_terminal_and_no_column_is_squeezed(table, width) -> None:
    head, rows = table
    out = render(head, rows, width=width)
    assert all(len(line) <= width for line in out.splitlines())
    ws = tables.widths(head, [[tables.text(v) for v in r] for r in rows], width)
    if ws is not None:  # a table: each column at least its floor; else a record per row
        natural = [max([len(h)] + [len(tables.text(r[i])) for r in rows]) for i, h in enumerate(head)]
        assert all(w >= min(n, MIN_WIDTH) for w, n in zip(ws, natural))


def test_too_many_columns_for_the_terminal_print_a_record_per_row() -> None:
    head = [f"column_{i}" for i in range(12)]
    got = render(head, [[f"value {i}" for i in range(12)]], width=80)
    assert (
        "column_3   value 3" in got
        and "column_11  value 11" in got
        and all(len(line) <= 80 for line in got.splitlines())
    )


def test_csv_and_json_carry_every_row_whole(capsys: pytest.CaptureFixture[str]) -> None:
    rows = [[1, LONG, None, {"a": 1}], [2, "x,y", 0.5, [1, 2]]]
    tables.show(["n", "text", "v", "meta"], rows, as_csv=True)
    got = list(csv.reader(io.StringIO(capsys.readouterr().out)))
    assert got == [["n", "text", "v", "meta"], ["1", LONG, "", '{"a": 1}'], ["2", "x,y", "0.5", "[1, 2]"]]
    tables.show(["n", "text", "v", "meta"], rows, as_json=True)
    assert json.loads(capsys.readouterr().out)[0] == {"n": 1, "text": LONG, "v": None, "meta": {"a": 1}}


def test_the_width_is_the_columns_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    assert tables.width() == 80
    assert all(len(line) <= 80 for line in render(["a", "b"], [[LONG, LONG]]).splitlines())
