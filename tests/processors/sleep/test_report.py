"""somnus.processors.sleep.report: counts, bytes and the Fiedler value of a run."""

from __future__ import annotations

import doctest
import math

import pytest

from somnus.processors.sleep import report
from somnus.processors.sleep.config import (
    SleepConfig,
)
from somnus.schemas.lifecycle import (
    MemoryCompressed,
)
from tests.processors.sleep.memories import mem, of, run


def test_doctests() -> None:
    assert doctest.testmod(report).failed == 0


def test_report_counts_bytes_and_fiedler() -> None:
    rows = [mem(f"p{k}", idle=0.5) for k in range(5)] + [mem("old", idle=4.0), mem("stale", idle=30)]
    pairs = [(f"p{k}", f"p{k + 1}") for k in range(4)]
    plan = run(rows, pairs, config=SleepConfig(coverage_bins=()), inputs={"fiedler_history": (0.5, 0.45, 0.4)})
    r = plan.report
    assert (r.memories_before, r.memories_after, r.compressed, r.pruned, r.kept) == (7, 6, 1, 1, 5)
    assert r.bytes_before == 7 * 2500 and r.bytes_after == 5 * 2500 + of(plan, MemoryCompressed)[0].bytes_after
    assert r.per_layer == {"hippocampus": {"before": 7, "after": 6, "compressed": 1, "pruned": 1}}
    # survivors' live graph: the path p0..p4 (plus the compressed memory, isolated)
    assert r.fiedler.value == 0.0 and r.fiedler.components == 2 and r.fiedler.largest_size == 5
    assert r.fiedler.largest_component == pytest.approx(2 * (1 - math.cos(math.pi / 5)), rel=1e-6)
    assert r.fiedler.trend == "fragmenting"
    assert r.saturation.status == "insufficient"
    assert "6 of 7 memories kept" in r.narrative
    # the same report whether read before emitting (sizes computed on demand) or after (cached)
    fresh = run(rows, pairs, config=SleepConfig(coverage_bins=()), inputs={"fiedler_history": (0.5, 0.45, 0.4)})
    assert list(fresh.events())[-1].report == r == fresh.report
