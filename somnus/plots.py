"""Figures for the CLI (``somnus sleep --report --plot out.png``). matplotlib is imported here only,
and only when a figure is drawn: the processors do no I/O and import no plotting library."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

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
    for name, values in (("before", [r.memories_before for _, r in reports]),
                         ("after", [r.memories_after for _, r in reports]),
                         ("compressed", [r.compressed for _, r in reports]),
                         ("pruned", [r.pruned for _, r in reports])):
        top.plot(times, values, marker="o", label=name)
    top.set_ylabel("memories")
    top.legend(loc="best")
    bottom.plot(times, [r.fiedler.largest_component for _, r in reports], marker="o", color="tab:purple")
    bottom.set_ylabel("Fiedler value (largest component)")
    bottom.set_xlabel("sleep run")
    fig.autofmt_xdate()
    fig.tight_layout()
    return fig
