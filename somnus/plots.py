"""Figures for the CLI (``somnus sleep --report --plot``, ``somnus rhythms --plot``, ``somnus graph
--plot``), one style: 9 x 6 inches, two rows. matplotlib (and numpy) are imported here only, and only
when a figure is drawn: the processors do no I/O and import no plotting library."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any, NamedTuple

from somnus.schemas.lifecycle import SleepReport


def history_figure(reports: Sequence[tuple[datetime, SleepReport]]) -> Any:
    """A matplotlib Figure of memory counts and the Fiedler value over sleep runs (oldest first).
    The caller saves it (``fig.savefig(path)``); matplotlib is imported here only."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    times = [t for t, _ in reports]
    fig = Figure(figsize=(9, 6))
    top, bottom = fig.subplots(2, 1, sharex=True)
    for name, values in (
        ("before", [r.memories_before for _, r in reports]),
        ("after", [r.memories_after for _, r in reports]),
        ("compressed", [r.compressed for _, r in reports]),
        ("pruned", [r.pruned for _, r in reports]),
    ):
        top.plot(times, values, marker="o", label=name)
    top.set_ylabel("memories")
    top.legend(loc="best")
    bottom.plot(times, [r.fiedler.largest_component for _, r in reports], marker="o", color="tab:purple")
    bottom.set_ylabel("Fiedler value (largest component)")
    bottom.set_xlabel("sleep run")
    fig.autofmt_xdate()
    fig.tight_layout()
    return fig


WEEKDAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")


def rhythm_grids(cells: Iterable[Sequence[Any]]) -> tuple[Any, Any]:
    """Weekday x hour grids (7 x 24, Monday first) from ``weekhour`` bins of one agent's temporal index
    (rows of kind, bin, count, successes): sessions started, and the success rate of the sessions that
    ended in each hour (NaN where none ended).

    >>> started, rate = rhythm_grids([("session_start", 9, 4, 0), ("session_end", 33, 4, 3)])
    >>> int(started[0, 9]), float(rate[1, 9]), bool(rate[0, 0] != rate[0, 0])
    (4, 0.75, True)
    """
    import numpy as np

    started = np.zeros((7, 24))
    ended = np.zeros((7, 24))
    succeeded = np.zeros((7, 24))
    for kind, weekhour, count, successes in cells:
        day, hour = divmod(int(weekhour), 24)
        if not 0 <= day < 7:
            continue  # not a weekhour bin
        if kind == "session_start":
            started[day, hour] += count
        elif kind == "session_end":
            ended[day, hour] += count
            succeeded[day, hour] += successes
    with np.errstate(invalid="ignore", divide="ignore"):
        rate = np.where(ended > 0, succeeded / np.where(ended > 0, ended, 1), np.nan)
    return started, rate


def rhythm_figure(agent: str, cells: Iterable[Sequence[Any]]) -> Any:
    """A matplotlib Figure of an agent's week (``somnus rhythms --plot``): heatmaps of weekday x local
    hour, sessions started and the success rate of sessions ended (``rhythm_grids``)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    started, rate = rhythm_grids(cells)
    fig = Figure(figsize=(9, 6))
    top, bottom = fig.subplots(2, 1, sharex=True)
    for ax, grid, title, cmap, limits in (
        (top, started, f"{agent}: sessions started ({int(started.sum())})", "viridis", (0, None)),
        (bottom, rate, "success rate of sessions ended (blank: none ended)", "RdYlGn", (0, 1)),
    ):
        image = ax.imshow(grid, aspect="auto", cmap=cmap, vmin=limits[0], vmax=limits[1], interpolation="nearest")
        fig.colorbar(image, ax=ax)
        ax.set_yticks(range(7), WEEKDAYS)
        ax.set_title(title)
    bottom.set_xticks(range(0, 24, 2))
    bottom.set_xlabel("local hour of the event")
    fig.tight_layout()
    return fig


class GraphHealth(NamedTuple):
    """The associative memory graph as sleep sees it (``processors/sleep/report.py``): live memories as
    nodes, edges between uncompressed ones."""

    nodes: int
    edges: int
    components: int
    largest_size: int
    fiedler: float  # lambda_2 of the whole graph (0 when it is disconnected)
    fiedler_largest: float  # lambda_2 of its largest component
    degrees: list[int]  # per node, edges (unweighted)
    component_sizes: list[int]  # largest first


def graph_health(memories: Iterable[Sequence[Any]], edges: Iterable[Sequence[Any]]) -> GraphHealth:
    """``memories``: rows of (memory id, compressed) of the live memories; ``edges``: rows of (a, b,
    weight). An edge with an end that is not a live, uncompressed memory is left out.

    >>> h = graph_health([("a", False), ("b", False), ("c", False), ("d", True)],
    ...                  [("a", "b", 1.0), ("b", "c", 1.0), ("c", "d", 1.0), ("a", "gone", 1.0)])
    >>> h.nodes, h.edges, h.components, h.largest_size, round(h.fiedler_largest, 6), h.degrees
    (4, 2, 2, 3, 1.0, [1, 2, 1, 0])
    """
    import numpy as np

    from somnus.processors.episodic.graph_metrics import connected_components, integration, simple_graph

    index: dict[str, int] = {}
    open_ends: set[str] = set()
    for memory_id, compressed in memories:
        index.setdefault(str(memory_id), len(index))
        if not compressed:
            open_ends.add(str(memory_id))
    kept = [(index[a], index[b], float(w)) for a, b, w in edges if a in open_ends and b in open_ends]
    i, j, w = (np.array([e[k] for e in kept], dtype=np.float64 if k == 2 else np.int64) for k in range(3))
    n = len(index)
    result = integration(n, i, j, w)
    g = simple_graph(n, i, j, w)
    sizes = np.bincount(connected_components(g), minlength=n) if n else np.zeros(0, np.int64)
    degrees = np.bincount(g.i, minlength=n) + np.bincount(g.j, minlength=n)
    return GraphHealth(
        n,
        result.edges,
        result.components,
        result.largest_size,
        result.value,
        result.largest_component,
        [int(d) for d in degrees],
        sorted((int(s) for s in sizes if s > 0), reverse=True),
    )


def graph_figure(health: GraphHealth, history: Sequence[tuple[datetime, float]] = ()) -> Any:
    """A matplotlib Figure of graph health (``somnus graph --plot``): the degree distribution, the
    component sizes, and the Fiedler value of the largest component over sleep runs (``history``,
    oldest first) with today's."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9, 6))
    degrees_ax, components_ax, trend_ax = fig.add_subplot(2, 2, 1), fig.add_subplot(2, 2, 2), fig.add_subplot(2, 1, 2)
    per_degree = [0] * (max(health.degrees, default=0) + 1)
    for d in health.degrees:
        per_degree[d] += 1
    degrees_ax.bar(range(len(per_degree)), per_degree, color="tab:blue")
    degrees_ax.set_xlabel("degree (edges of a memory)")
    degrees_ax.set_ylabel("memories")
    degrees_ax.set_title(f"{health.nodes} memories, {health.edges} edges")
    shown = health.component_sizes[:30]
    components_ax.bar(range(1, len(shown) + 1), shown, color="tab:orange")
    components_ax.set_xlabel("component (largest first" + (", 30 shown)" if len(health.component_sizes) > 30 else ")"))
    components_ax.set_ylabel("memories")
    components_ax.set_title(f"{health.components} components, largest {health.largest_size}")
    if history:
        times: Any = [t for t, _ in history]  # matplotlib draws datetimes; its stubs take numbers only
        trend_ax.plot(
            times,
            [v for _, v in history],
            marker="o",
            color="tab:purple",
            label="after each sleep run (its graph then)",
        )
        trend_ax.tick_params(axis="x", labelrotation=20)  # not autofmt_xdate: it hides the top row's labels
    trend_ax.axhline(
        health.fiedler_largest, color="tab:gray", linestyle="--", label=f"the graph now: {health.fiedler_largest:.4g}"
    )
    trend_ax.set_ylabel("Fiedler value (largest component)")
    trend_ax.set_xlabel("sleep run")
    trend_ax.legend(loc="best")
    fig.tight_layout()
    return fig
