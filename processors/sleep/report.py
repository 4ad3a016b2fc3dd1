"""A run's report (``SleepReport``): counts per kind and per layer, bytes, the Fiedler value of the
associative graph after the run and its trend, and prediction-error saturation."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import polars as pl

from somnus.processors.episodic.graph_metrics import fiedler_trend, integration
from somnus.processors.sleep import dreaming
from somnus.processors.sleep.config import REPORT_LANCZOS_MAX_ITER
from somnus.processors.sleep.scoring import Columns
from somnus.schemas.lifecycle import FiedlerSummary, SaturationSummary, SleepReport


def build_report(
    c: Columns,
    fiedler_history: Sequence[float],
    capture_errors: pl.DataFrame | None,
    now_us: int,
    pruned: np.ndarray,
    compressed_now: np.ndarray,
    compact_bytes: int,
    counts: dict[str, int],
    promoted: int,
) -> SleepReport:
    """The report of a run over ``c`` (``fiedler_history``: earlier runs' values, oldest first;
    ``capture_errors``: observed_at, prediction_error of capture decisions, for saturation)."""
    survivors = ~pruned
    compressed_after = c.compressed | compressed_now
    # The graph after the run: survivors' edges between uncompressed ends (new connections included).
    node = np.full(c.n, -1, dtype=np.int64)
    node[survivors] = np.arange(int(survivors.sum()))
    keep = ~compressed_after & survivors
    live = keep[c.gi] & keep[c.gj]
    g = integration(
        int(survivors.sum()), node[c.gi[live]], node[c.gj[live]], c.gw[live], max_iter=REPORT_LANCZOS_MAX_ITER
    )
    trend = fiedler_trend([*fiedler_history, g.largest_component])
    fiedler = FiedlerSummary(
        value=round(g.value, 9),
        largest_component=round(g.largest_component, 9),
        components=g.components,
        largest_size=g.largest_size,
        nodes=g.nodes,
        edges=g.edges,
        slope=trend.slope,
        trend=trend.status,
    )
    if capture_errors is not None and capture_errors.height:
        ce = capture_errors
        t = ce["observed_at"]
        if isinstance(ce.schema["observed_at"], pl.Datetime) and ce.schema["observed_at"].time_zone is None:
            t = t.dt.replace_time_zone("UTC")
        sat = dreaming.pe_saturation(t.dt.epoch("us").to_numpy(), ce["prediction_error"].to_numpy(), now_us)
    else:
        sat = dreaming.pe_saturation(np.zeros(0, np.int64), np.zeros(0), now_us)
    saturation = SaturationSummary(
        mean_pe=sat.mean_pe,
        previous_mean_pe=sat.previous_mean_pe,
        samples=sat.samples,
        saturated=sat.saturated,
        status=sat.status,
    )
    sizes_after = np.where(survivors & ~compressed_now, c.size_bytes, 0)
    per_layer: dict[str, dict[str, int]] = {}
    for code, name in enumerate(c.layer_names):
        rows = c.layer_code == code
        per_layer[name] = {
            "before": int(rows.sum()),
            "after": int((rows & survivors).sum()),
            "compressed": int((rows & compressed_now).sum()),
            "pruned": int((rows & pruned).sum()),
        }
    after = int(survivors.sum())
    n_compressed = int(compressed_now.sum())
    narrative = (
        f"{after} of {c.n} memories kept ({n_compressed} compressed, {int(pruned.sum())} pruned, "
        f"{counts.get('protected', 0)} newly protected), {promoted} promoted; "
        f"largest component lambda2 {fiedler.largest_component:.4g} over {g.largest_size} memories "
        f"in {g.components} components, {fiedler.trend}; prediction error {saturation.status}."
    )
    return SleepReport(
        memories_before=c.n,
        memories_after=after,
        kept=after - n_compressed,
        compressed=n_compressed,
        pruned=int(pruned.sum()),
        protected=counts.get("protected", 0),
        promoted=promoted,
        rescored=counts.get("rescored", 0),
        reviewed=counts.get("reviewed", 0),
        triples_retired=counts.get("triples_retired", 0),
        clustered=counts.get("clustered", 0),
        held=counts.get("held", 0),
        created=counts.get("created", 0),
        connected=counts.get("connected", 0),
        abstracted=counts.get("abstracted", 0),
        bytes_before=int(c.size_bytes.sum()),
        bytes_after=int(sizes_after.sum()) + compact_bytes,
        per_layer=per_layer,
        fiedler=fiedler,
        saturation=saturation,
        narrative=narrative,
    )
