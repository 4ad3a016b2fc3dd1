"""Tables that fit the terminal, and the same rows as CSV or JSON.

A column keeps its natural width when the table fits; otherwise the widest columns give way first,
never below a readable floor (``MIN_WIDTH`` characters, or the header's width when shorter), and a
long cell wraps onto up to ``MAX_LINES`` lines, its end cut with ``…``. When even the floors do not
fit (too many columns for the terminal), each row is printed as ``column: value`` lines instead of a
table of squeezed columns. The width is the terminal's (``COLUMNS`` when set; 80 for a pipe).

>>> print(render(["tool", "error rate"], [["http_get", 0.25]], width=40), end="")
tool      error rate
────────  ──────────
http_get        0.25
>>> print(render(["text"], [["a rather long sentence about rate limits"]], width=12), end="")
text
────────────
a rather
long
sentence…
"""

from __future__ import annotations

import csv
import json
import shutil
import sys
import textwrap
from collections.abc import Iterable, Sequence
from typing import Any

GAP = "  "  # between columns
MIN_WIDTH = 10  # a column is not narrowed below this (or its natural width, when smaller)
MAX_LINES = 3  # lines a cell may wrap onto; the rest is cut with …
ELLIPSIS = "…"


def width() -> int:
    """The terminal's width: ``COLUMNS`` when set, else the terminal's, else 80."""
    return max(20, shutil.get_terminal_size((80, 24)).columns)


def text(value: Any) -> str:
    """A cell's text: None is empty, a float is shown with at most 4 decimals, the rest as str."""
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.4f}".rstrip("0").rstrip(".") if value == value else "nan"
    if isinstance(value, (dict, list)):
        return json.dumps(value, default=str)
    return " ".join(str(value).split()) if "\n" in str(value) or "\t" in str(value) else str(value)


def _numeric(rows: Sequence[Sequence[Any]], i: int) -> bool:
    vals = [r[i] for r in rows if r[i] is not None]
    return bool(vals) and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in vals)


def _fit(cell: str, w: int) -> list[str]:
    """``cell`` wrapped to ``w`` characters on at most ``MAX_LINES`` lines, the cut marked with …."""
    if len(cell) <= w:
        return [cell]
    lines = textwrap.wrap(cell, w, break_long_words=True, break_on_hyphens=False) or [""]
    if len(lines) > MAX_LINES:
        lines = lines[:MAX_LINES]
        last = lines[-1]
        lines[-1] = (last if len(last) < w else last[: w - 1]) + ELLIPSIS
    return lines


def widths(heads: Sequence[str], cells: Sequence[Sequence[str]], total: int) -> list[int] | None:
    """Each column's width so the table fits ``total`` characters, or None when the floors do not fit."""
    natural = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(heads)]
    floor = [min(n, MIN_WIDTH) for n in natural]
    budget = total - len(GAP) * (len(heads) - 1)
    if sum(floor) > budget:
        return None
    got = list(natural)
    while sum(got) > budget:  # narrow the widest column that may still give way, one character at a time
        i = max((j for j in range(len(got)) if got[j] > floor[j]), key=lambda j: got[j])
        got[i] -= 1
    return got


def render(
    columns: Sequence[Any], rows: Iterable[Sequence[Any]], title: str | None = None, width: int | None = None
) -> str:
    """The table as text that fits ``width`` (default: the terminal's)."""
    total = width or globals()["width"]()
    rows = [list(r) for r in rows]
    heads = [str(c) for c in columns]
    cells = [[text(v) for v in r] for r in rows]
    out = [title] if title else []
    ws = widths(heads, cells, total)
    if ws is None:
        return "\n".join(out + _records(heads, cells, total)) + "\n"
    right = [_numeric(rows, i) for i in range(len(heads))]

    def line(parts: list[list[str]]) -> list[str]:
        height = max(len(p) for p in parts)
        return [
            GAP.join(
                (p[k] if k < len(p) else "").rjust(w) if r else (p[k] if k < len(p) else "").ljust(w)
                for p, w, r in zip(parts, ws, right)
            ).rstrip()
            for k in range(height)
        ]

    out += line([_fit(h, w) for h, w in zip(heads, ws)])
    out.append(GAP.join("─" * w for w in ws))
    for r in cells:
        out += line([_fit(c, w) for c, w in zip(r, ws)])
    return "\n".join(out) + "\n"


def _records(heads: list[str], cells: list[list[str]], total: int) -> list[str]:
    """Rows as ``column: value`` lines (a table of more columns than the terminal holds)."""
    key = min(max(len(h) for h in heads), total // 3)
    out: list[str] = []
    for n, r in enumerate(cells, 1):
        out.append(f"── {n} " + "─" * max(0, total - 4 - len(str(n))))
        for h, c in zip(heads, r):
            body = _fit(c, total - key - 2) if c else [""]
            out.append(f"{_fit(h, key)[0].ljust(key)}  {body[0]}".rstrip())
            out += [" " * (key + 2) + b for b in body[1:]]
    return out


def write_csv(columns: Sequence[Any], rows: Iterable[Sequence[Any]]) -> None:
    """The rows as CSV on stdout (None as an empty field, nested values as JSON)."""
    w = csv.writer(sys.stdout, lineterminator="\n")
    w.writerow([str(c) for c in columns])
    for r in rows:
        w.writerow(["" if v is None else json.dumps(v, default=str) if isinstance(v, (dict, list)) else v for v in r])


def write_json(columns: Sequence[Any], rows: Iterable[Sequence[Any]]) -> None:
    """The rows as a JSON array of objects on stdout."""
    print(json.dumps([dict(zip([str(c) for c in columns], r)) for r in rows], default=str))


def show(
    columns: Sequence[Any],
    rows: Iterable[Sequence[Any]],
    title: str | None = None,
    *,
    as_csv: bool = False,
    as_json: bool = False,
) -> None:
    """Print the rows as a table that fits the terminal, or as CSV, or as JSON objects."""
    if as_csv:
        write_csv(columns, rows)
    elif as_json:
        write_json(columns, rows)
    else:
        sys.stdout.write(render(columns, rows, title))


def show_many(tables: Sequence[tuple[str, Sequence[Any], Sequence[Sequence[Any]]]], *, as_csv: bool = False) -> None:
    """Several titled tables: as text, one after another; as CSV, one block each, after a ``# title``
    line and separated by an empty line (a CSV reader takes one block at a time)."""
    for n, (title, columns, rows) in enumerate(tables):
        if as_csv:
            if n:
                print()
            print(f"# {title}")
            write_csv(columns, rows)
        elif rows:
            show(columns, rows, title)
        else:
            print(f"{title}: none")


def one_of(as_json: bool, as_csv: bool) -> None:
    """--json and --csv together is an error."""
    if as_json and as_csv:
        from somnus.cli.common import fail

        fail("give --json or --csv, not both")
