"""The sleep policy (``SleepConfig``), the memory layers and the constants the design fixes.

The lead maps ``SleepConfig.schedule`` to ``Settings`` / ``SOMNUS_SLEEP_SCHEDULE``; the retention
weights and thresholds are pinned by ``tests/processors/sleep/test_scoring.py``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from datetime import datetime, timezone

DEFAULT_SCHEDULE = "0 3 * * *"
SCHEDULE_ENV = "SOMNUS_SLEEP_SCHEDULE"
SCHEDULE_OFF = "off"  # no scheduled runs: sleep only on demand (SleepRequested, ``somnus sleep``)

HIPPOCAMPUS = "hippocampus"
ATL = "atl"
ANGULAR_GYRUS = "angular_gyrus"
SEMANTIC_LAYERS = (ATL, ANGULAR_GYRUS)

RETENTION_WEIGHTS = {"access": 0.30, "recency": 0.25, "graph": 0.20, "importance": 0.15, "outcome": 0.10}
ACCESS_SATURATION = 20  # accesses at which the access term reaches 1
EDGE_SATURATION = 10  # edges at which the graph term reaches 1
OUTCOME_VALUE = {"success": 1.0, "failure": 0.6, "partial": 0.5}  # anything else: 0
KEEP_THRESHOLD = 0.4
RESCORE_EPSILON = 0.05
COMPACT_KEY_MAX_CHARS = 40
US_PER_DAY = 86_400_000_000
EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
BIN_SIZES = {"hour": 24, "weekday": 7, "weekhour": 168}
# Lanczos steps the report may spend on a huge connected component (~0.1 s a step at 1M nodes and
# 5M edges): enough for well-connected memory graphs; a long chain reports an upper bound.
REPORT_LANCZOS_MAX_ITER = 300


@dataclass(frozen=True)
class LayerPolicy:
    max_age_days: float  # prune when not accessed for this long (and the recency half-life)
    compress_after_days: float  # compress when not accessed for this long


@dataclass(frozen=True)
class SleepConfig:
    """The sleep policy. The lead maps ``schedule`` to ``Settings`` / ``SOMNUS_SLEEP_SCHEDULE``."""

    schedule: str = DEFAULT_SCHEDULE
    schedule_tz: str = "UTC"  # the zone the cron expression is read in (DST handled by cronsim)
    hippocampus: LayerPolicy = LayerPolicy(max_age_days=7.0, compress_after_days=3.0)
    semantic: LayerPolicy = LayerPolicy(max_age_days=30.0, compress_after_days=14.0)
    keep_threshold: float = KEEP_THRESHOLD
    max_episodes: int | None = 50  # per agent unless the agent's spec says otherwise; None: no cap
    coverage_bins: tuple[str, ...] = ("hour", "weekday")
    bin_tz: str = "UTC"  # the zone of the SCN bins
    triple_retention_days: float = 90.0
    # A live triple neither reinforced nor retrieved for this many days of its scope's stream time is
    # retired (Maximus's stale-fact pruning; ``SOMNUS_FACT_RETIRE_DAYS``). 0: never.
    fact_retire_days: float = 90.0
    rescore_epsilon: float = RESCORE_EPSILON
    max_catch_up: int = 7  # a stream that jumps over many fire times runs only the last ones
    # The clock advances at most to a record's timestamp plus this (``bounded_time``): a runtime whose
    # clock runs ahead cannot run a month of sleeps now and then none for a month. 0: no bound.
    max_clock_skew_s: float = 300.0
    fixpoint_iterations: int = 20
    # Dream phase A routes at most this many of an agent's newest memories captured since the last run
    # (``plan.fold_observations``): its cost grows with their square.
    dream_observations_per_agent: int = 32

    def policy(self, layer: str) -> LayerPolicy:
        return self.hippocampus if layer == HIPPOCAMPUS else self.semantic

    def digest(self) -> str:
        blob = json.dumps(dataclasses.asdict(self), sort_keys=True, default=str).encode()
        return hashlib.blake2b(blob, digest_size=8).hexdigest()
