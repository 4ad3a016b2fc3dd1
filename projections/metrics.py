"""Prometheus metrics of the projector: what ``GET /metrics`` serves (docs/integrations/metrics.md).

The projector reports each batch and each briefing refresh to a ``ProjectorMetrics`` (the timing
hooks: ``batch_applied``, ``briefings_refreshed``); what is a position rather than an event (lag per
topic, stale briefings, dead letters by kind, the supervisor's restarts) is read when scraped, by
``collect`` of a ``ScrapeCollector`` given the functions that read it.

>>> from somnus.projections.writer import BatchResult
>>> m = ProjectorMetrics()
>>> m.batch_applied(BatchResult(events=3, episodes=1, timings={"decode": 0.01}), 0.02)
>>> m.registry.get_sample_value("somnus_projected_total", {"kind": "events"})
3.0
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"  # the text exposition format
# The dead-letter kinds the pipeline writes (docs/contract.md); any other is served as "other".
DEAD_LETTER_KINDS = frozenset(
    {"oversized", "undecodable", "schema", "poison", "late", "order", "future", "duplicate", "abandoned"}
)
# BatchResult fields counted per kind in somnus_projected_total.
KINDS = (
    "events",
    "episodes",
    "lessons",
    "dead_letters",
    "facts",
    "link_updates",
    "memory_events",
    "semantic_events",
    "duplicate_events",
    "quarantined",
    "skipped_invalid",
)
# Batches take milliseconds to seconds; a briefing refresh is bounded by REFRESH_BUDGET_S (0.25 s) per slice.
SECONDS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class ProjectorMetrics:
    """The projector's counters and histograms, in a registry of their own (not the process-global one:
    two projectors in one test process keep apart)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.projected = Counter(
            "somnus_projected", "Records projected, by kind (events, episodes, dead letters...).", ["kind"], registry=r
        )
        self.batches = Histogram(
            "somnus_projector_batch_seconds",
            "Seconds to apply one batch (rows and offsets, one transaction).",
            buckets=SECONDS,
            registry=r,
        )
        self.folds = Histogram(
            "somnus_projector_fold_seconds",
            "Seconds per batch spent in each fold / stage.",
            ["stage"],
            buckets=SECONDS,
            registry=r,
        )
        self.refreshes = Histogram(
            "somnus_briefing_refresh_seconds",
            "Seconds per briefing refresh (a slice of the stale briefings).",
            buckets=SECONDS,
            registry=r,
        )
        self.rendered = Counter("somnus_briefings_rendered", "Briefings a refresh changed.", registry=r)
        self.promotions_forced = Counter(
            "somnus_promotions_forced",
            "Sleep runs whose promotion request went before the pipeline caught up (its snapshot may differ).",
            registry=r,
        )
        for kind in KINDS:  # every kind present from the first scrape, at 0
            self.projected.labels(kind)
        self.clean_at = time.monotonic()  # when a scrape last found no briefing stale

    def batch_applied(self, res: Any, seconds: float) -> None:
        """One committed batch (a ``somnus.projections.writer.BatchResult``) and how long it took."""
        for kind in KINDS:
            n = getattr(res, kind, 0)
            if n:
                self.projected.labels(kind).inc(n)
        self.batches.observe(seconds)
        for stage, took in res.timings.items():
            self.folds.labels(stage).observe(took)

    def briefings_refreshed(self, seconds: float, changed: int) -> None:
        self.refreshes.observe(seconds)
        self.rendered.inc(changed)

    def staleness_s(self, stale: int, now: float | None = None) -> float:
        """Seconds the briefing cache has been behind: 0 when nothing is stale, else since the last scrape
        that found nothing stale (so at most one scrape interval too high).

        >>> m = ProjectorMetrics(); m.clean_at = 100.0
        >>> m.staleness_s(3, now=104.0), m.staleness_s(0, now=105.0), m.staleness_s(1, now=107.0)
        (4.0, 0.0, 2.0)
        """
        now = time.monotonic() if now is None else now
        if stale == 0:
            self.clean_at = now
            return 0.0
        return now - self.clean_at


class ScrapeCollector(Collector):
    """Positions read when scraped: ``lag()`` {topic: records}, ``stale()`` (stale briefings),
    ``dead_letters()`` {kind: rows}, ``restarts()`` {role: restarts}. A reader that fails leaves its
    metric out of this scrape (a scrape never fails for it); ``somnus_scrape_errors`` says which."""

    def __init__(
        self,
        metrics: ProjectorMetrics,
        lag: Callable[[], Mapping[str, int]],
        stale: Callable[[], int],
        dead_letters: Callable[[], Mapping[str, int]],
        restarts: Callable[[], Mapping[str, int]],
    ) -> None:
        self.metrics, self.lag, self.stale, self.dead_letters, self.restarts = (
            metrics,
            lag,
            stale,
            dead_letters,
            restarts,
        )

    def collect(self) -> Iterator[Any]:
        errors = GaugeMetricFamily(
            "somnus_scrape_errors", "1 when a metric could not be read in this scrape.", labels=["metric"]
        )
        for name, make in (
            ("lag", self._lag),
            ("briefings", self._briefings),
            ("dead_letters", self._dead),
            ("supervisor", self._restarts),
        ):
            try:
                yield from make()
                errors.add_metric([name], 0)
            except Exception:  # reported as a gauge, not a failed scrape
                errors.add_metric([name], 1)
        yield errors

    def _lag(self) -> Iterator[Any]:
        g = GaugeMetricFamily("somnus_projector_lag", "Records of each topic not yet projected.", labels=["topic"])
        for topic, n in sorted(self.lag().items()):
            g.add_metric([topic], n)
        yield g

    def _briefings(self) -> Iterator[Any]:
        stale = self.stale()
        yield GaugeMetricFamily("somnus_briefings_stale", "Briefings marked stale, not yet rendered.", value=stale)
        yield GaugeMetricFamily(
            "somnus_briefing_staleness_seconds",
            "Seconds the briefing cache has been behind (0 when nothing is stale).",
            value=self.metrics.staleness_s(stale),
        )

    def _dead(self) -> Iterator[Any]:
        c = CounterMetricFamily("somnus_dead_letters", "Dead letters stored, by kind.", labels=["kind"])
        kinds: dict[str, int] = {}
        for kind, n in self.dead_letters().items():
            # A kind is the reason's text before its first colon: a record written straight onto the
            # dead-letter topic may make it any text. A short word was served as itself before: a
            # million distinct words were a million series (and words of the record's text).
            label = kind if kind in DEAD_LETTER_KINDS else "other"
            kinds[label] = kinds.get(label, 0) + n
        for kind, n in sorted(kinds.items()):
            c.add_metric([kind], n)
        yield c

    def _restarts(self) -> Iterator[Any]:
        c = CounterMetricFamily("somnus_supervisor_restarts", "Restarts of each supervised process.", labels=["role"])
        for role, n in sorted(self.restarts().items()):
            c.add_metric([role], n)
        yield c


def supervisor_restarts(state_file: Path) -> dict[str, int]:
    """Restarts per role from the supervisor's state file (empty when no supervisor runs)."""
    try:
        state = json.loads(state_file.read_text())
    except FileNotFoundError:
        return {}
    return {role: int(info.get("restarts", 0)) for role, info in state.items() if isinstance(info, dict)}


def exposition(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)
