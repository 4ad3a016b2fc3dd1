"""somnus.plots: the figures the CLI saves (sleep history, an agent's week, the memory graph's health)."""

from __future__ import annotations

import pytest

from tests.processors.sleep.memories import DAY, NOW, mem, run


def test_history_figure_draws_counts_and_fiedler() -> None:
    pytest.importorskip("matplotlib", reason="matplotlib not installed yet (the lead adds it)")
    from somnus.plots import history_figure

    plan = run([mem("m")])
    fig = history_figure([(NOW, plan.report), (NOW + DAY, plan.report)])
    top, bottom = fig.axes
    assert len(top.lines) == 4 and len(bottom.lines) == 1


def test_processors_import_no_plotting_library() -> None:
    import subprocess
    import sys

    code = (
        "import sys, somnus.processors.sleep.plan, somnus.processors.sleep.report; print('matplotlib' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_the_plot_helpers_doctests() -> None:
    import doctest

    import somnus.plots

    assert doctest.testmod(somnus.plots).failed == 0


PNG = b"\x89PNG\r\n\x1a\n"


def _store(path) -> None:
    """A projections file with a week of one agent's sessions, memories, edges and sleep runs."""
    import duckdb

    from somnus.projections import schema

    con = duckdb.connect(str(path))
    schema.init(con)
    # scraper: 3 sessions started Monday 9:00 (weekhour 9), 2 of 3 ended well; 1 on Wednesday 14:00
    con.executemany(
        "INSERT INTO temporal_bins VALUES ('scraper', ?, 'weekhour', ?, ?, ?, ?)",
        [
            ("session_start", 9, 3, 0, 0),
            ("session_end", 9, 3, 2, 1),
            ("session_start", 62, 1, 0, 0),
            ("session_end", 62, 1, 0, 1),
            ("tool_call", 9, 7, 7, 0),
        ],
    )
    for m in ("m1", "m2", "m3", "m4", "m5"):
        con.execute(
            "INSERT INTO memories (memory_id, kind, agent, scope, run_id, position, occurred_at, decided_at) "
            "VALUES (?, 'episode', 'scraper', 'agent:scraper', 'r', 0, now(), now())",
            [m],
        )
    con.executemany(
        "INSERT INTO memory_edges (a, b, weight, formed_at) VALUES (?, ?, ?, now())",
        [("m1", "m2", 0.9), ("m2", "m3", 0.8), ("m4", "m5", 0.7), ("m5", "pruned", 0.5)],
    )
    con.execute(
        'INSERT INTO memory_log VALUES (1, \'MemoryForgotten\', \'{"memory_id": "m5", "reason": "removed"}\', 0)'
    )
    con.executemany(
        "INSERT INTO sleep_runs (run_id, run_at, trigger, fiedler) VALUES (?, ?, 'schedule', ?)",
        [("s1", "2026-01-01 03:00:00+00", 0.5), ("s2", "2026-01-02 03:00:00+00", 1.0)],
    )
    con.close()


def test_rhythms_and_graph_plots_are_written_from_the_store(tmp_path) -> None:
    """somnus rhythms --plot and somnus graph --plot on a file (no projector): non-empty PNGs; the
    graph's numbers are those of its live memories (m5 was removed: its edges are not the graph's)."""
    pytest.importorskip("matplotlib")
    import json

    from typer.testing import CliRunner

    from somnus import cli

    db = tmp_path / "somnus.duckdb"
    _store(db)
    base = ["--db", str(db), "--home", str(tmp_path)]
    rhythms_png, graph_png = tmp_path / "week.png", tmp_path / "graph.png"
    done = CliRunner().invoke(cli.app, ["rhythms", "--agent", "scraper", "--plot", str(rhythms_png), *base])
    assert done.exit_code == 0, done.output
    shown = CliRunner().invoke(cli.app, ["graph", "--plot", str(graph_png), "--json", *base])
    assert shown.exit_code == 0, shown.output
    for png in (rhythms_png, graph_png):
        data = png.read_bytes()
        assert data.startswith(PNG) and len(data) > 10_000, png  # a drawn figure, not an empty canvas
    got = json.loads(shown.output.splitlines()[-1])
    assert got == {
        "memories": 4,
        "edges": 2,
        "components": 2,
        "largest_component": 3,
        "fiedler": 0.0,
        "fiedler_largest_component": got["fiedler_largest_component"],
        "mean_degree": 1.0,
        "max_degree": 2,
        "isolated": 1,
        "sleep_runs": 2,
    }  # m4: its one edge was to m5
    # the weighted path m1-m2-m3 (0.9, 0.8): lambda_2 = (3.4 - sqrt(3.4^2 - 4 * 2.16)) / 2
    assert abs(got["fiedler_largest_component"] - (3.4 - (3.4**2 - 4 * 2.16) ** 0.5) / 2) < 1e-6
    nobody = CliRunner().invoke(cli.app, ["rhythms", "--agent", "nobody", "--plot", str(tmp_path / "x.png"), *base])
    assert nobody.exit_code == 1 and not (tmp_path / "x.png").exists()


def test_the_rhythm_grids_place_each_bin_at_its_weekday_and_hour() -> None:
    from somnus.plots import rhythm_grids

    started, rate = rhythm_grids(
        [
            ("session_start", 9, 3, 0),
            ("session_end", 9, 3, 2),
            ("session_start", 6 * 24 + 23, 1, 0),
            ("tool_call", 10, 5, 5),
            ("session_start", 999, 1, 0),
        ]
    )
    assert started.shape == (7, 24) and started.sum() == 4  # the tool call and the bin out of range are not sessions
    assert started[0, 9] == 3 and started[6, 23] == 1
    assert abs(rate[0, 9] - 2 / 3) < 1e-12 and int((rate == rate).sum()) == 1  # NaN wherever no session ended
