"""``somnus graph``: the health of the associative memory graph (nodes, edges, components, the
Fiedler value of its largest component), as text, ``--json``, or a figure (``--plot``)."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Optional

import typer

from somnus.cli.app import app
from somnus.cli.common import DbOpt, HomeOpt, JsonOpt, read, settings

# Live memories (not removed by sleep or a forget; compressed ones are nodes without edges, as in
# processors/sleep/report.py), the edges between memories, and each sleep run's Fiedler value.
LIVE_MEMORIES = """
    WITH forgotten AS (
        SELECT body->>'memory_id' AS memory_id, bool_or(body->>'reason' = 'removed') AS removed
        FROM memory_log WHERE kind = 'MemoryForgotten' GROUP BY 1)
    SELECT m.memory_id, f.memory_id IS NOT NULL AS compressed
    FROM memories m LEFT JOIN forgotten f USING (memory_id) WHERE f.removed IS NOT TRUE ORDER BY m.memory_id"""
EDGES = "SELECT a, b, weight FROM memory_edges"
FIEDLER_HISTORY = "SELECT run_at, fiedler FROM sleep_runs WHERE fiedler IS NOT NULL ORDER BY run_at"


@app.command()
def graph(
    plot: Optional[Path] = typer.Option(
        None, "--plot", help="Draw the degree distribution, the component sizes and the Fiedler trend here (PNG)."
    ),
    db: Optional[Path] = DbOpt,
    home: Optional[Path] = HomeOpt,
    as_json: bool = JsonOpt,
) -> None:
    """How integrated the associative memory graph is: memories, edges, components, the Fiedler value
    of the largest component (rising: memories inform each other; falling: the memory fragments)."""
    from somnus.plots import graph_figure, graph_health

    s = settings(home, db)
    health = graph_health(read(s, "sql", sql=LIVE_MEMORIES)["rows"], read(s, "sql", sql=EDGES)["rows"])
    history = [(datetime.fromisoformat(str(at)), float(v)) for at, v in read(s, "sql", sql=FIEDLER_HISTORY)["rows"]]
    if plot:
        graph_figure(health, history).savefig(plot)
        print(f"wrote {plot}")
    degrees = health.degrees
    summary = {
        "memories": health.nodes,
        "edges": health.edges,
        "components": health.components,
        "largest_component": health.largest_size,
        "fiedler": round(health.fiedler, 9),
        "fiedler_largest_component": round(health.fiedler_largest, 9),
        "mean_degree": round(sum(degrees) / len(degrees), 3) if degrees else 0.0,
        "max_degree": max(degrees, default=0),
        "isolated": sum(1 for d in degrees if d == 0),
        "sleep_runs": len(history),
    }
    if as_json:
        print(json.dumps(summary))
    elif not plot:
        print(
            f"{summary['memories']} memories, {summary['edges']} edges, {summary['components']} components "
            f"(largest {summary['largest_component']}, {summary['isolated']} isolated); degree mean "
            f"{summary['mean_degree']}, max {summary['max_degree']}; Fiedler value of the largest component "
            f"{summary['fiedler_largest_component']:.4g} (whole graph {summary['fiedler']:.4g}); "
            f"{summary['sleep_runs']} sleep runs so far"
        )
