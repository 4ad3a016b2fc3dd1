"""Deep sleep: consolidation, pruning and dreaming as a windowed job on event time, replayable.

**When.** A cron schedule (default ``0 3 * * *``, ``SOMNUS_SLEEP_SCHEDULE``) evaluated on **stream
time**, never the wall clock: before the shell applies a memory-log record whose event time is
past a fire time ``f`` (``advance``), it runs sleep at ``now = f`` over the state folded from every
earlier record. The memory log has one partition, so live and replay see the same records before
the same trigger and reach the same decisions. Records that arrive late (event time before ``f``
but after the trigger) belong to the next window. On demand, a ``SleepRequested(at)`` runs at
``at``. The **watermark** (``SleepCompleted.watermark``, the last completed run's time) makes runs
idempotent: ``plan_sleep`` returns None for ``now <= watermark``.

**What.** A run is a deterministic sequence of decision events (``schemas/lifecycle.py``), planned
from the state as it was before the run, in a fixed order of phases:

1. ``hippocampus``: dream phase A (``processors/sleep/dreaming.py``) then, for episodes: protection,
   retention, compression, pruning (stale, temporal coverage, ``maxEpisodes``);
2. ``promotion`` (a callable of the shell, e.g. issue 7's promoter): before consolidation, so the
   source episodes still exist when cross-layer edges form;
3. ``consolidation``: the same rules for the ATL and Angular Gyrus layers (slower: 30-day max age),
   triple retention (closed more than 90 days ago: out of the live projection), dream phase B
   (connect, FSRS review, abstract);
4. ``refresh``: briefings (a callable of the shell), then the report (counts, Fiedler value and its
   trend, prediction-error saturation) in ``SleepCompleted``.

Each phase sees the effects of the earlier ones (applied to a working copy of the columns).

**Retention** (per memory, in [0, 1], rounded to 6 places)::

    0.30 access + 0.25 recency + 0.20 graph + 0.15 importance + 0.10 outcome
    access  = min(1, ln(1 + accesses) / ln(1 + 20))
    recency = 0.5 ^ (idle days / the layer's max age)          (idle: since last access, else creation)
    graph   = min(1, ln(1 + edges) / ln(1 + 10))               (live edges; a compressed memory's snapshot)
    outcome = success 1.0, failure 0.6 (mistakes teach), partial 0.5, none 0

Edges count only within a layer (each layer has its own associative graph; cross-layer edges
are another graph and are ignored here).

**Idle is measured in the memory's own stream time.** A memory's idle days run to
``min(now, stream_time)``, ``stream_time`` being the newest event time its scope has seen (the
optional column; the shell keeps one per scope, ``projections/sleep.py``). Each scope's memories
age only as its own stream moves: importing a dataset newer than another never makes the older
one's memories idle, and a scope with no event since the last run is left as it was. A memory
without a stream time (null) is measured to ``now``.

**Rules** (per layer: hippocampus max age 7 days, compress after 3 idle days; ATL and Angular
Gyrus 30 and 14):

- *protect*: user interactions and successes are never pruned; the first run that sees one
  emits ``MemoryProtected`` and the flag (``long_term``) is sticky;
- *compress*: idle >= compress-after and not compressed yet -> ``CompactMemory`` (<= 200 bytes:
  id, times, outcome, access count, index keys that fit, and the live edge count as a snapshot);
  its edges go;
- *prune (stale)*: idle >= max age, not protected, retention < 0.4 (well-linked and much-used
  memories resist);
- *temporal coverage*: pruning never empties an SCN bin (hour of day, then weekday, of the
  memory's event time) of an agent's layer that had a memory before the run: the best candidate
  of such a bin (highest retention, then smallest id) is kept;
- *maxEpisodes* (per agent, default 50): the lowest-retention unprotected episodes go first,
  bins' best memories last;
- pruning and compression remove edges, which lowers the neighbours' retention: the rules are
  iterated to a fixpoint (pruned set only grows), so a second run at the same time finds nothing.
- *re-score*: ``MemoryRescored`` when the retention moved by >= 0.05 (or was never stored).

**Crash and resume.** ``SleepPlan.events(start)`` yields the decisions from ``seq = start``; the
same pre-run state gives the same plan, so a resumed run emits exactly the remaining events. The
consumer applies a run only once its ``SleepCompleted`` is seen (``RunAssembler``), so the state a
resumed run plans from is still the pre-run state. ``apply_run`` is the reference fold.
``SleepPlan.encoded(start)`` is ``events(start)`` already encoded, as columns (type name, memory
id, JSON body): what a shell that stores millions of decisions reads, with no object per event.

Memory columns (a polars DataFrame, one row per live memory; ``MEMORY_COLUMNS``): memory_id,
agent, layer, created_at, last_access, access_count, importance, outcome, is_user_interaction,
edge_count, size_bytes, long_term; optional: compressed, retention, index_keys, domain,
stability, difficulty, last_review, last_rating, reviewed_access_count, contradicted, stream_time.
The graph is an edge list (src, dst[, weight]) of memory ids.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, NamedTuple
from zoneinfo import ZoneInfo

import msgspec
import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from somnus.processors.sleep import dreaming
from somnus.processors.episodic.graph_metrics import fiedler_trend, integration, simple_graph
from somnus.schemas.lifecycle import (
    COMPACT_MAX_BYTES,
    BriefingRefreshed,
    CompactMemory,
    DecisionCarried,
    FiedlerSummary,
    MemoriesConnected,
    MemoryCompressed,
    MemoryPromoted,
    MemoryProtected,
    MemoryPruned,
    MemoryRefined,
    MemoryRescored,
    ObservationClustered,
    ObservationCreated,
    ObservationHeld,
    PatternAbstracted,
    PatternSource,
    ProtectReason,
    PruneReason,
    ReviewScheduled,
    RunEvent,
    SaturationSummary,
    SleepCompleted,
    SleepPhase,
    SleepPhaseCompleted,
    SleepReport,
    SleepStarted,
    SleepTrigger,
    TripleRetired,
    compact_size,
    encode_lifecycle,
)
from cronsim import CronSim, CronSimError

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
    rescore_epsilon: float = RESCORE_EPSILON
    max_catch_up: int = 7  # a stream that jumps over many fire times runs only the last ones
    # The clock advances at most to a record's timestamp plus this (``bounded_time``): a runtime whose
    # clock runs ahead cannot run a month of sleeps now and then none for a month. 0: no bound.
    max_clock_skew_s: float = 300.0
    fixpoint_iterations: int = 20

    def policy(self, layer: str) -> LayerPolicy:
        return self.hippocampus if layer == HIPPOCAMPUS else self.semantic

    def digest(self) -> str:
        blob = json.dumps(dataclasses.asdict(self), sort_keys=True, default=str).encode()
        return hashlib.blake2b(blob, digest_size=8).hexdigest()


# --- schedule on stream time ----------------------------------------------------------------------


def validate_schedule(schedule: str) -> str:
    """The expression, if cron can read it (or ``off``); ``ValueError`` naming the problem otherwise."""
    if schedule.strip().lower() == SCHEDULE_OFF:
        return SCHEDULE_OFF
    try:
        CronSim(schedule, EPOCH)
    except CronSimError as exc:
        raise ValueError(f"invalid sleep schedule {schedule!r}: {exc}") from None
    return schedule


def fire_times(schedule: str, after: datetime, before: datetime, *, tz: str = "UTC",
               limit: int | None = None) -> tuple[list[datetime], int]:
    """Cron fire times ``f`` with ``after < f < before`` (UTC, ascending) and how many older ones were
    dropped by ``limit`` (only the last ``limit`` are kept: a catch-up after a long gap stays short).

    >>> from datetime import datetime, timezone
    >>> t = lambda d, h: datetime(2024, 5, d, h, tzinfo=timezone.utc)
    >>> [f.isoformat() for f in fire_times("0 3 * * *", t(1, 3), t(3, 4))[0]]
    ['2024-05-02T03:00:00+00:00', '2024-05-03T03:00:00+00:00']
    """
    _aware(after, "after")
    _aware(before, "before")
    zone = ZoneInfo(tz)
    out: list[datetime] = []
    dropped = 0
    # Walk backwards from ``before``: the newest fire times are the ones kept.
    for f in CronSim(schedule, before.astimezone(zone), reverse=True):
        if f <= after:
            break
        if f >= before:
            continue
        if limit is not None and len(out) >= limit:
            dropped += 1
            if dropped > 100_000:  # a huge gap of a frequent schedule: stop counting
                break
            continue
        out.append(f.astimezone(timezone.utc))
    out.reverse()
    return out, dropped


class SleepClock(msgspec.Struct, frozen=True):
    """The schedule's position in stream time: the last fire time handled (None before any event)."""

    last_fired: datetime | None = None


def bounded_time(event_time: datetime, record_time: datetime | None, skew_s: float) -> datetime:
    """``event_time``, at most ``record_time + skew_s`` (no bound without a record time or a skew).

    >>> from datetime import datetime, timezone
    >>> t = datetime(2024, 5, 1, 10, tzinfo=timezone.utc)
    >>> bounded_time(t.replace(day=30), t, 300.0).isoformat(), bounded_time(t, t.replace(day=2), 300.0) == t
    ('2024-05-01T10:05:00+00:00', True)
    """
    if record_time is None or skew_s <= 0:
        return event_time
    return min(event_time, record_time + timedelta(seconds=skew_s))


def advance(clock: SleepClock, event_time: datetime, config: SleepConfig = SleepConfig()
            ) -> tuple[SleepClock, list[datetime], int]:
    """Call before applying a record with ``event_time``: the runs due first (ascending), the new
    clock, and how many fire times were skipped by ``max_catch_up``. The first record starts the
    clock (no runs for the time before the stream began).

    >>> from datetime import datetime, timezone
    >>> t = lambda d, h: datetime(2024, 5, d, h, tzinfo=timezone.utc)
    >>> c, due, _ = advance(SleepClock(), t(1, 10))
    >>> c, due, _ = advance(c, t(2, 2)); due
    []
    >>> c, due, _ = advance(c, t(2, 5)); [d.hour for d in due], c.last_fired.isoformat()
    ([3], '2024-05-02T03:00:00+00:00')
    """
    _aware(event_time, "event_time")
    if clock.last_fired is None:
        return SleepClock(event_time.astimezone(timezone.utc)), [], 0
    if config.schedule == SCHEDULE_OFF:
        return clock, [], 0
    due, dropped = fire_times(config.schedule, clock.last_fired, event_time, tz=config.schedule_tz,
                              limit=config.max_catch_up)
    if not due:
        return clock, [], dropped
    return SleepClock(due[-1]), due, dropped


def _aware(ts: datetime, name: str) -> None:
    if ts.tzinfo is None or ts.utcoffset() is None:
        raise ValueError(f"{name} must be timezone-aware (event time), got naive {ts!r}")


def _us(ts: datetime) -> int:
    _aware(ts, "time")
    delta = ts - EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def _dt(us: int) -> datetime:
    return EPOCH + timedelta(microseconds=int(us))


def run_id_for(at: datetime) -> str:
    """One run per event time: ``sleep-20240515T030000Z`` (microseconds when there are any)."""
    at = at.astimezone(timezone.utc)
    return "sleep-" + (at.strftime("%Y%m%dT%H%M%S") + (f".{at.microsecond:06d}" if at.microsecond else "") + "Z")


# --- columns ----------------------------------------------------------------------------------------

_DT = pl.Datetime("us", "UTC")
MEMORY_COLUMNS: dict[str, tuple[Any, bool, Any]] = {
    # name: (dtype, required, default)
    "memory_id": (pl.String, True, None),
    "agent": (pl.String, True, None),
    "layer": (pl.String, True, None),  # hippocampus | atl | angular_gyrus
    "created_at": (_DT, True, None),  # event time of the memory (its SCN bins)
    "last_access": (_DT, True, None),  # null: never accessed
    "access_count": (pl.Int64, True, None),
    "importance": (pl.Float64, True, None),
    "outcome": (pl.String, True, None),  # success | failure | partial | ""
    "is_user_interaction": (pl.Boolean, True, None),
    "edge_count": (pl.Int64, True, None),  # the snapshot, for compressed memories; else live degree
    "size_bytes": (pl.Int64, True, None),
    "long_term": (pl.Boolean, True, None),  # protected (sticky)
    "compressed": (pl.Boolean, False, False),
    "retention": (pl.Float64, False, None),  # last stored score
    "index_keys": (pl.List(pl.String), False, []),  # the memory's key index fields, most telling first
    "domain": (pl.String, False, ""),  # for cross-domain abstraction
    "stability": (pl.Float64, False, None),  # FSRS state; null: never reviewed
    "difficulty": (pl.Float64, False, None),
    "last_review": (_DT, False, None),
    "last_rating": (pl.Int64, False, 0),
    "reviewed_access_count": (pl.Int64, False, 0),  # access_count at the last review
    "contradicted": (pl.Boolean, False, False),  # a contradiction since the last review
    "stream_time": (_DT, False, None),  # the newest event time of the memory's scope; null: the run's time
}
NULLABLE = {"last_access", "retention", "stability", "difficulty", "last_review", "stream_time"}


def memory_frame(frame: pl.DataFrame) -> pl.DataFrame:
    """Validate and normalise memory columns: types, defaults of optional columns, UTC datetimes
    (naive ones are read as UTC), sorted by memory_id (input order never matters)."""
    missing = [c for c, (_, req, _) in MEMORY_COLUMNS.items() if req and c not in frame.columns]
    if missing:
        raise ValueError(f"memory columns missing: {missing}")
    exprs = []
    for name, (dtype, _, default) in MEMORY_COLUMNS.items():
        if name not in frame.columns:
            exprs.append(pl.lit(default, dtype=dtype).alias(name) if default is not None or name in NULLABLE
                         else pl.lit(None, dtype=dtype).alias(name))
            continue
        col = pl.col(name)
        if dtype == _DT:
            src = frame.schema[name]
            if isinstance(src, pl.Datetime) and src.time_zone is None:
                col = col.dt.replace_time_zone("UTC")
            col = col.dt.convert_time_zone("UTC").dt.cast_time_unit("us")
        else:
            col = col.cast(dtype)
        if name not in NULLABLE and default is not None:
            col = col.fill_null(pl.lit(default, dtype=dtype))
        exprs.append(col.alias(name))
    out = frame.select(exprs)
    if out["memory_id"].n_unique() != out.height:
        raise ValueError("memory_id must be unique")
    for name in ("memory_id", "agent", "layer", "created_at", "access_count", "importance", "outcome",
                 "is_user_interaction", "edge_count", "size_bytes", "long_term"):
        if out[name].null_count():
            raise ValueError(f"memory column {name!r} has nulls")
    return out


class _Columns:
    """The run's working arrays, rows sorted by memory_id (so a row index is an id rank)."""

    def __init__(self, frame: pl.DataFrame, edges: pl.DataFrame | None, now_us: int, config: SleepConfig) -> None:
        order_col = "__row"
        with_order = memory_frame(frame).with_row_index(order_col).sort("memory_id")
        self.input_order = with_order[order_col].to_numpy()  # sorted row -> input row
        self.frame = with_order.drop(order_col)
        f = self.frame
        self.n = f.height
        self.ids = f["memory_id"]
        self.agents: list[str] = sorted(f["agent"].unique().to_list())
        self.agent_code = (f["agent"].rank("dense").cast(pl.Int64).to_numpy() - 1) if self.n else np.zeros(0, np.int64)
        layers, self.layer_names, self.layer_code = _categories(f["layer"])
        self.layer = layers
        self.group = self.agent_code * max(len(self.layer_names), 1) + self.layer_code
        self.n_groups = max(len(self.agents), 1) * max(len(self.layer_names), 1)
        self.is_hip = layers == HIPPOCAMPUS
        self.created_us = f["created_at"].dt.epoch("us").to_numpy().astype(np.int64)
        access = f["last_access"].dt.epoch("us").fill_null(f["created_at"].dt.epoch("us"))
        self.access_us = access.to_numpy().astype(np.int64)
        self.now_us = now_us
        # Each memory's own "now": its scope's stream time, never later than the run (module doc).
        stream = f["stream_time"].dt.epoch("us").fill_null(now_us).to_numpy().astype(np.int64)
        self.at_us = np.minimum(stream, now_us)
        self.idle_days = np.maximum(self.at_us - self.access_us, 0) / US_PER_DAY
        self.access_count = f["access_count"].to_numpy().astype(np.float64)
        self.importance = np.clip(f["importance"].to_numpy().astype(np.float64), 0.0, 1.0)
        outcome = _categories(f["outcome"])[0]
        self.outcome = outcome
        self.outcome_value = np.zeros(self.n)
        for name, value in OUTCOME_VALUE.items():
            self.outcome_value[outcome == name] = value
        self.user = f["is_user_interaction"].to_numpy().astype(bool)
        self.success = outcome == "success"
        self.long_term = f["long_term"].to_numpy().astype(bool)
        self.compressed = f["compressed"].to_numpy().astype(bool)
        self.edge_count = f["edge_count"].to_numpy().astype(np.int64)
        self.size_bytes = f["size_bytes"].to_numpy().astype(np.int64)
        self.stored = f["retention"].fill_null(np.nan).to_numpy().astype(np.float64)
        self.max_age = np.where(self.is_hip, config.hippocampus.max_age_days, config.semantic.max_age_days)
        self.compress_after = np.where(self.is_hip, config.hippocampus.compress_after_days,
                                       config.semantic.compress_after_days)
        local = f["created_at"].dt.convert_time_zone(config.bin_tz)
        hour = local.dt.hour().to_numpy().astype(np.int64)
        weekday = local.dt.weekday().to_numpy().astype(np.int64) - 1  # Monday 0, as the SCN counts
        by_kind = {"hour": hour, "weekday": weekday, "weekhour": weekday * 24 + hour}
        unknown = [k for k in config.coverage_bins if k not in by_kind]
        if unknown:
            raise ValueError(f"unknown coverage bins {unknown}; known: {sorted(by_kind)}")
        self.bins = [(by_kind[k], BIN_SIZES[k]) for k in config.coverage_bins]
        self.has_graph = edges is not None
        if edges is not None and self.n:
            # An end's row: its id's place among the (unique) ids, by one hash lookup; orphans out.
            ends = pl.concat([edges["src"].cast(pl.String), edges["dst"].cast(pl.String)]).to_arrow()
            at = pc.index_in(ends.cast(pa.string()), value_set=self.ids.to_arrow().cast(pa.string()))
            ok = at.is_valid().to_numpy(zero_copy_only=False)
            rows = pc.fill_null(at, 0).to_numpy().astype(np.int64)
            m = edges.height
            found = ok[:m] & ok[m:]
            i_ok, j_ok = rows[:m], rows[m:]
            w = edges["weight"].cast(pl.Float64).to_numpy() if "weight" in edges.columns else np.ones(len(i_ok))
            # Each layer has its own associative graph; an edge across layers (the cross-layer graph)
            # is not an association and does not count for retention.
            found &= self.layer_code[i_ok] == self.layer_code[j_ok]
            g = simple_graph(self.n, i_ok[found], j_ok[found], w[found])
            self.gi, self.gj, self.gw = g.i, g.j, g.w
        else:
            self.gi = np.zeros(0, np.int64)
            self.gj = np.zeros(0, np.int64)
            self.gw = np.zeros(0)

    def add_edges(self, i: np.ndarray, j: np.ndarray, w: np.ndarray) -> None:
        g = simple_graph(self.n, np.r_[self.gi, i], np.r_[self.gj, j], np.r_[self.gw, w])
        self.gi, self.gj, self.gw = g.i, g.j, g.w

    def degree(self, mask: np.ndarray) -> np.ndarray:
        """Edges of each node whose both ends are in ``mask``."""
        live = mask[self.gi] & mask[self.gj]
        return (np.bincount(self.gi[live], minlength=self.n) + np.bincount(self.gj[live], minlength=self.n))


def _categories(values: pl.Series) -> tuple[np.ndarray, list[str], np.ndarray]:
    """``values.to_numpy().astype(str)`` (no nulls), its distinct values sorted, and each row's place
    among them; only the distinct values become Python or numpy strings (they go through numpy as
    the rows would, so a value numpy changes, e.g. by trailing NULs, changes alike)."""
    if values.len() == 0:
        return np.zeros(0, dtype=str), [], np.zeros(0, np.int64)
    distinct = values.unique()
    text = distinct.to_numpy().astype(str)
    names = sorted(set(text.tolist()))
    sorted_names = np.asarray(names, dtype=str)
    at = pc.index_in(values.to_arrow().cast(pa.string()), value_set=distinct.to_arrow().cast(pa.string()))
    codes = np.searchsorted(sorted_names, text)[at.to_numpy().astype(np.int64)]
    return sorted_names[codes], names, codes


def retention_scores(access_count: np.ndarray, idle_days: np.ndarray, edges: np.ndarray, importance: np.ndarray,
                     outcome_value: np.ndarray, max_age_days: np.ndarray | float) -> np.ndarray:
    """The retention score (module doc), vectorised, rounded to 6 places.

    >>> import numpy as np
    >>> float(retention_scores(np.array([20]), np.array([0.0]), np.array([10]), np.array([1.0]), np.array([1.0]), 7)[0])
    1.0
    >>> float(retention_scores(np.array([0]), np.array([7.0]), np.array([0]), np.array([0.0]), np.array([0.0]), 7)[0])
    0.125
    """
    w = RETENTION_WEIGHTS
    access = np.minimum(1.0, np.log1p(np.asarray(access_count, dtype=np.float64)) / np.log1p(ACCESS_SATURATION))
    recency = 0.5 ** (np.asarray(idle_days, dtype=np.float64) / max_age_days)
    graph = np.minimum(1.0, np.log1p(np.asarray(edges, dtype=np.float64)) / np.log1p(EDGE_SATURATION))
    score = (w["access"] * access + w["recency"] * recency + w["graph"] * graph
             + w["importance"] * np.clip(importance, 0.0, 1.0) + w["outcome"] * outcome_value)
    return np.round(np.clip(score, 0.0, 1.0), 6)


class Consolidated(NamedTuple):
    """What one consolidation pass decided (arrays over the run's rows)."""

    pruned: np.ndarray  # bool: pruned in this pass
    reason: np.ndarray  # int8: 1 stale, 2 over capacity
    prune_retention: np.ndarray  # retention when pruned
    compress: np.ndarray  # bool: compressed in this pass
    snapshot: np.ndarray  # live edge count of a memory compressed now
    retention: np.ndarray  # final retention (survivors)
    protect: np.ndarray  # bool: becomes long-term now
    rescore: np.ndarray  # bool
    iterations: int
    converged: bool


def _first_per_key(rows: np.ndarray, key: np.ndarray, retention: np.ndarray) -> np.ndarray:
    """Per key, the row with the highest retention, ties to the smallest row (= smallest id)."""
    if len(rows) == 0:
        return rows
    order = rows[np.lexsort((rows, -retention[rows], key[rows]))]
    k = key[order]
    first = np.ones(len(order), dtype=bool)
    first[1:] = k[1:] != k[:-1]
    return order[first]


def _coverage_rescue(c: _Columns, alive: np.ndarray, cand: np.ndarray, retention: np.ndarray) -> np.ndarray:
    """Candidates kept so that no (agent, layer, bin) loses its last memory; bin kinds in order."""
    rescued = np.zeros(c.n, dtype=bool)
    for values, size in c.bins:
        key = c.group * size + values
        covered = np.zeros(c.n_groups * size, dtype=bool)
        covered[key[alive & (~cand | rescued)]] = True
        need = np.flatnonzero(cand & ~rescued & ~covered[key])
        rescued[_first_per_key(need, key, retention)] = True
    return rescued


def _over_capacity(c: _Columns, members: np.ndarray, protected: np.ndarray, retention: np.ndarray,
                   caps: np.ndarray) -> np.ndarray:
    """Episodes pruned so each agent keeps at most its cap (protected ones are never chosen;
    the best memory of each SCN bin goes last)."""
    counts = np.bincount(c.agent_code[members], minlength=len(c.agents))
    excess = np.where(caps >= 0, counts - caps, 0)
    out = np.zeros(c.n, dtype=bool)
    if not (excess > 0).any():
        return out
    representative = np.zeros(c.n, dtype=bool)
    rows = np.flatnonzero(members)
    for values, size in c.bins:
        representative[_first_per_key(rows, c.group * size + values, retention)] = True
    prunable = np.flatnonzero(members & ~protected & (excess[c.agent_code] > 0))
    # Worst first by the order coverage keeps the best by: retention, then id (the larger id is worse).
    order = prunable[np.lexsort((-prunable, retention[prunable], representative[prunable], c.agent_code[prunable]))]
    agent = c.agent_code[order]
    starts = np.flatnonzero(np.r_[True, agent[1:] != agent[:-1]]) if len(order) else np.zeros(0, np.int64)
    position = np.arange(len(order)) - np.repeat(starts, np.diff(np.r_[starts, len(order)]))
    out[order[position < excess[agent]]] = True
    return out


def consolidate(c: _Columns, active: np.ndarray, config: SleepConfig, *, pruned_before: np.ndarray | None = None,
                compressed_before: np.ndarray | None = None, refreshed: np.ndarray | None = None,
                extra_accesses: np.ndarray | None = None, caps: np.ndarray | None = None) -> Consolidated:
    """Protect, score, compress and prune the ``active`` rows, iterated to a fixpoint (module doc).

    ``pruned_before``/``compressed_before``: the state after earlier phases of the run;
    ``refreshed``/``extra_accesses``: memories that received evidence this run (accessed now).
    """
    n = c.n
    gone = np.zeros(n, dtype=bool) if pruned_before is None else pruned_before.copy()
    was_compressed = c.compressed if compressed_before is None else compressed_before
    idle = c.idle_days if refreshed is None else np.where(refreshed, 0.0, c.idle_days)
    accesses = c.access_count if extra_accesses is None else c.access_count + extra_accesses
    protected = c.user | c.success | c.long_term
    stale = active & (idle >= c.max_age)
    compressible = active & ~was_compressed & (idle >= c.compress_after)
    caps = caps if caps is not None else np.full(len(c.agents), -1, dtype=np.int64)
    pruned = np.zeros(n, dtype=bool)
    reason = np.zeros(n, dtype=np.int8)
    prune_retention = np.zeros(n)
    converged = False
    iterations = 0
    retention = np.zeros(n)
    compress = np.zeros(n, dtype=bool)
    snapshot = np.zeros(n, dtype=np.int64)
    for iterations in range(1, config.fixpoint_iterations + 1):
        alive = ~gone & ~pruned
        compress = compressible & alive
        if c.has_graph:
            live = c.degree(alive & ~(was_compressed | compress))
            snapshot = c.degree(alive & ~was_compressed)
            edges = np.where(was_compressed, c.edge_count, np.where(compress, snapshot, live))
        else:
            snapshot = c.edge_count
            edges = c.edge_count
        retention = retention_scores(accesses, idle, edges, c.importance, c.outcome_value, c.max_age)
        cand = stale & alive & ~protected & (retention < config.keep_threshold)
        stale_pruned = cand & ~_coverage_rescue(c, alive, cand, retention)
        members = active & c.is_hip & alive & ~stale_pruned
        cap_pruned = _over_capacity(c, members, protected, retention, caps)
        new = (stale_pruned | cap_pruned) & ~pruned
        if not new.any():
            converged = True
            break
        reason[new & stale_pruned] = 1
        reason[new & ~stale_pruned] = 2
        prune_retention[new] = retention[new]
        pruned |= new
    survivors = active & ~gone & ~pruned
    protect = survivors & (c.user | c.success) & ~c.long_term
    rescore = survivors & (np.isnan(c.stored) | (np.abs(np.nan_to_num(c.stored, nan=0.0) - retention)
                                                  >= config.rescore_epsilon - 1e-12))
    return Consolidated(pruned, reason, prune_retention, compress & survivors, snapshot, retention, protect,
                        rescore, iterations, converged)


def compact_memory(memory_id: str, created_us: int, access_us: int, outcome: str, access_count: int,
                   edge_count: int, keys: Sequence[str]) -> CompactMemory:
    """The compact form: whole-second times, and as many index keys (each cut to 40 characters)
    as fit in ``COMPACT_MAX_BYTES``.

    >>> c = compact_memory("m" * 36, 0, 10**6, "success", 3, 4, ["k" * 100] * 10)
    >>> from somnus.schemas.lifecycle import compact_size
    >>> compact_size(c) <= 200, len(c.keys)
    (True, 1)
    """
    base = CompactMemory(memory_id=memory_id, created_at=_dt(created_us // 1_000_000 * 1_000_000),
                         last_access=_dt(access_us // 1_000_000 * 1_000_000), outcome=outcome[:16],
                         access_count=max(int(access_count), 0), edge_count=max(int(edge_count), 0))
    size = compact_size(base)
    if size > COMPACT_MAX_BYTES:  # an id too long for the bound: keep a digest of it instead
        digest = "b2:" + hashlib.blake2b(memory_id.encode(), digest_size=16).hexdigest()
        base = msgspec.structs.replace(base, memory_id=digest)
        size = compact_size(base)
    kept: list[str] = []
    budget = COMPACT_MAX_BYTES - size - len(',"k":[]')
    for key in keys:
        key = key[:COMPACT_KEY_MAX_CHARS]
        cost = len(msgspec.json.encode(key)) + (1 if kept else 0)
        if cost > budget:
            break
        kept.append(key)
        budget -= cost
    return msgspec.structs.replace(base, keys=kept) if kept else base


# --- triples ---------------------------------------------------------------------------------------


def retire_triples(triples: pl.DataFrame, now: datetime, retention_days: float = 90.0) -> pl.DataFrame:
    """Live triples closed (``valid_to``) more than ``retention_days`` before ``now``, by triple_id."""
    if triples.height == 0:
        return pl.DataFrame(schema={"triple_id": pl.String, "valid_to": _DT})
    valid_to = pl.col("valid_to")
    if isinstance(triples.schema["valid_to"], pl.Datetime) and triples.schema["valid_to"].time_zone is None:
        valid_to = valid_to.dt.replace_time_zone("UTC")
    cutoff = now.astimezone(timezone.utc) - timedelta(days=retention_days)
    return (triples.select(pl.col("triple_id").cast(pl.String), valid_to.dt.convert_time_zone("UTC")
                           .dt.cast_time_unit("us").alias("valid_to"))
            .filter(pl.col("valid_to").is_not_null() & (pl.col("valid_to") < cutoff)).sort("triple_id"))


# --- the run ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SleepInputs:
    """Everything a run reads, as of the run's event time (the pre-run state)."""

    memories: pl.DataFrame
    edges: pl.DataFrame | None = None  # src, dst[, weight]: the associative graph(s)
    triples: pl.DataFrame | None = None  # triple_id, valid_to: the live triples
    vectors: np.ndarray | None = None  # L2-normalised, one row per memory in the order of ``memories``
    observations: pl.DataFrame | None = None  # observation_id, agent, observed_at: new since the last run
    observation_vectors: np.ndarray | None = None  # one row per observation, in its order
    capture_errors: pl.DataFrame | None = None  # observed_at, prediction_error (capture decisions)
    patterns: frozenset[str] = frozenset()  # ids of patterns already abstracted
    fiedler_history: tuple[float, ...] = ()  # earlier runs' largest-component Fiedler values, oldest first
    max_episodes: Mapping[str, int] = field(default_factory=dict)  # per agent (AgentSpec.max_episodes)


@dataclass(frozen=True)
class SleepView:
    """What the shell's phases (promotion, briefings) see: the state after phase 1."""

    run_id: str
    at: datetime
    memories: pl.DataFrame  # survivors, with ``compressed`` updated
    pruned: tuple[str, ...]  # ids pruned in phase 1

    def promoted(self, memory_id: str, agent: str, concept_id: str) -> MemoryPromoted:
        return MemoryPromoted(run_id=self.run_id, seq=0, at=self.at, memory_id=memory_id, agent=agent,
                              concept_id=concept_id)

    def briefing(self, agent: str) -> BriefingRefreshed:
        return BriefingRefreshed(run_id=self.run_id, seq=0, at=self.at, agent=agent)

    def carried(self, kind: str, payload: bytes) -> DecisionCarried:
        return DecisionCarried(run_id=self.run_id, seq=0, at=self.at, carried_kind=kind, payload=msgspec.Raw(payload))


Phase = Callable[[SleepView], Sequence[RunEvent]]


# --- decisions as columns ---------------------------------------------------------------------------
# A run over a million memories decides millions of events, and the shell stores them as rows
# (``SleepPlan.encoded``). The bulk kinds are therefore encoded column by column, never as one
# struct per event: each value's text is msgspec's (numbers: a whole column encoded at once, then
# cut at the commas; strings: quoted as msgspec quotes them) and the fields are joined in the
# struct's declared order, tag first. That is ``encode_lifecycle`` of each event, byte for byte
# (tests/processors/sleep/test_job_columns.py compares them on generated runs).

_ENCODER = msgspec.json.Encoder()
_ENCODE_CHUNK = 1 << 18  # rows encoded at once (an Arrow string array holds < 2 GiB)
_COMMA = ord(",")
_NEEDS_ESCAPE = r'[\x00-\x1f"\\]'  # what msgspec escapes in a string; anything else is copied as is


def _json_text(value: Any) -> str:
    return _ENCODER.encode(value).decode()


def _json_numbers(values: Sequence[Any]) -> pa.Array:
    """msgspec's JSON text of each number (int or float; None: null).

    >>> _json_numbers([1, 0.5, None, 1e-7, 2.0]).to_pylist()
    ['1', '0.5', 'null', '1e-7', '2.0']
    """
    n = len(values)
    if n == 0:
        return pa.array([], pa.string())
    inner = np.frombuffer(_ENCODER.encode(values), dtype=np.uint8)[1:-1]
    comma = inner == _COMMA
    at = np.flatnonzero(comma)
    if len(at) != n - 1:
        raise ValueError(f"{n} values are not {len(at) + 1} JSON numbers")
    data = inner[~comma]
    offsets = np.concatenate(([0], at - np.arange(n - 1), [len(data)]))
    return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(data)])


def _json_ints(values: np.ndarray | Sequence[int]) -> pa.Array:
    """msgspec's JSON text of each integer (a decimal: what Arrow's cast to string writes).

    >>> _json_ints(np.array([0, -12, 2**63 - 1])).to_pylist()
    ['0', '-12', '9223372036854775807']
    """
    return pa.array(np.asarray(values, dtype=np.int64)).cast(pa.string())


def _json_strings(values: pa.Array | pa.ChunkedArray, *, repeated: bool = False) -> pa.Array:
    """msgspec's JSON text of each string (no nulls): quoted, escaped where needed. ``repeated``:
    the texts of the distinct values are made once.

    >>> _json_strings(pa.array(["a", 'b"c'])).to_pylist() == ['"a"', '"b\\\\"c"']
    True
    """
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    values = values.cast(pa.string())
    if values.null_count:
        raise ValueError("JSON strings of a column with nulls")
    if repeated:  # few distinct values (agents, keys): quote each once
        codes = pc.dictionary_encode(values)
        return _json_strings(codes.dictionary).take(codes.indices)
    quoted = pc.binary_join_element_wise('"', values, '"', "")
    escape = pc.match_substring_regex(values, _NEEDS_ESCAPE)
    if pc.any(escape).as_py():
        rows = np.flatnonzero(escape.to_numpy(zero_copy_only=False))
        fixed = [_json_text(s) for s in values.take(pa.array(rows)).to_pylist()]
        quoted = pc.replace_with_mask(quoted, escape, pa.array(fixed, quoted.type))
    return quoted


def _json_seconds(seconds: np.ndarray) -> pa.Array | None:
    """msgspec's JSON text of each whole-second UTC datetime ``_dt(s * 10**6)`` (a fixed 22 bytes,
    digits written column-wise); None when one is outside what ``datetime`` holds (the caller then
    builds them one by one, and fails as they do).

    >>> _json_seconds(np.array([0, 86_399])).to_pylist()
    ['"1970-01-01T00:00:00Z"', '"1970-01-01T23:59:59Z"']
    """
    s = np.asarray(seconds, dtype=np.int64)
    if len(s) and (s.min() < _MIN_SECONDS or s.max() > _MAX_SECONDS):
        return None
    t = s.astype("datetime64[s]")
    day = t.astype("datetime64[D]")
    month = t.astype("datetime64[M]")
    of_day = s - day.astype("datetime64[s]").astype(np.int64)
    out = np.empty((len(s), len(_SECONDS_TEMPLATE)), dtype=np.uint8)
    out[:] = np.frombuffer(_SECONDS_TEMPLATE, dtype=np.uint8)
    for at, value, width in ((1, t.astype("datetime64[Y]").astype(np.int64) + 1970, 4),
                             (6, month.astype(np.int64) % 12 + 1, 2),
                             (9, (day - month.astype("datetime64[D]")).astype(np.int64) + 1, 2),
                             (12, of_day // 3600, 2), (15, of_day // 60 % 60, 2), (18, of_day % 60, 2)):
        for k in range(width):
            out[:, at + width - 1 - k] = 48 + value // 10**k % 10
    offsets = np.arange(0, out.size + 1, out.shape[1], dtype=np.int32)
    return pa.Array.from_buffers(pa.string(), len(s), [None, pa.py_buffer(offsets), pa.py_buffer(out.ravel())])


_SECONDS_TEMPLATE = b'"0000-00-00T00:00:00Z"'
_MIN_SECONDS = -62_135_596_800  # 0001-01-01T00:00:00Z
_MAX_SECONDS = 253_402_300_799  # 9999-12-31T23:59:59Z


def _struct_rows(cls: type[msgspec.Struct], fields: Mapping[str, str | pa.Array]) -> pa.Array:
    """One JSON object per row as msgspec encodes ``cls`` (tag first, then the fields in declared
    order): ``fields`` holds each field's JSON text, one for every row (str) or one per row (array)."""
    config = cls.__struct_config__
    if config.omit_defaults or set(fields) != set(cls.__struct_fields__):
        raise ValueError(f"{cls.__name__}: texts of every field needed (and no omitted defaults)")
    parts: list[Any] = []
    text = "{"
    sep = ""
    if config.tag_field is not None:
        text += f"{_json_text(config.tag_field)}:{_json_text(config.tag)}"
        sep = ","
    for name, wire in zip(cls.__struct_fields__, cls.__struct_encode_fields__, strict=True):
        text += f"{sep}{_json_text(wire)}:"
        sep = ","
        value = fields[name]
        if isinstance(value, str):
            text += value
        else:
            parts += [text, value]
            text = ""
    parts.append(text + "}")
    return pc.binary_join_element_wise(*parts, "")


class _Segment:
    """A run of decisions of one kind: rows plus how to build the event of a row at a seq, and
    optionally how to encode rows ``[lo, hi)`` at once from ``seq`` on: ``(event type, memory ids,
    JSON bodies)``, what building and encoding each event gives."""

    def __init__(self, rows: Sequence[Any], build: Callable[[Any, int], RunEvent],
                 encode: Callable[[int, int, int], tuple[type, pa.Array, pa.Array]] | None = None) -> None:
        self.rows = rows
        self.build = build
        self.encode = encode

    def __len__(self) -> int:
        return len(self.rows)


class EncodedEvents(NamedTuple):
    """A run's events as columns (``SleepPlan.encoded``), one row per event in seq order: what
    ``type(ev).__name__``, ``getattr(ev, "memory_id", None)`` and ``encode_lifecycle(ev)`` give.
    Every event of a run has the plan's ``run_id`` and ``at``."""

    seq: pa.Array  # int64
    kind: pa.Array  # string: the event's type name
    memory_id: pa.Array  # string, null where the event names no memory
    body: pa.ChunkedArray  # string: the event's canonical JSON


class SleepPlan:
    """The decisions of one run, in order; events are built lazily from columns."""

    def __init__(self, run_id: str, at: datetime, segments: list[_Segment], report: Callable[[], SleepReport],
                 counts: dict[str, int]) -> None:
        self.run_id = run_id
        self.at = at
        self.segments = segments
        self._report = report
        self.counts = counts

    @property
    def report(self) -> SleepReport:
        """The run's report (built once, on first use: it needs the compact sizes, which emitting
        the events computes anyway)."""
        return self._report()

    def __len__(self) -> int:
        return sum(len(s) for s in self.segments)

    def events(self, start: int = 0) -> Iterator[RunEvent]:
        """The events with ``seq >= start``: a resumed run passes the next seq it has not emitted."""
        seq = 0
        for segment in self.segments:
            size = len(segment)
            if seq + size <= start:
                seq += size
                continue
            first = max(start - seq, 0)
            rows = segment.rows[first:] if first else segment.rows
            for offset, row in enumerate(rows, first):
                yield segment.build(row, seq + offset)
            seq += size

    def encoded(self, start: int = 0) -> EncodedEvents:
        """``events(start)`` as columns, encoded a chunk of rows at a time where a segment can (the
        bulk kinds: no event object per row), event by event elsewhere."""
        kinds: list[pa.Array] = []
        memory_ids: list[pa.Array] = []
        bodies: list[pa.Array] = []
        seq = 0
        for segment in self.segments:
            size = len(segment)
            first = max(start - seq, 0)
            if segment.encode is not None:
                for lo in range(first, size, _ENCODE_CHUNK):
                    hi = min(lo + _ENCODE_CHUNK, size)
                    cls, ids, body = segment.encode(lo, hi, seq + lo)
                    kinds.append(pa.repeat(pa.scalar(cls.__name__, pa.string()), hi - lo))
                    memory_ids.append(ids.cast(pa.string()))
                    bodies.append(body.cast(pa.string()))
            elif first < size:
                rows = segment.rows[first:] if first else segment.rows
                events = [segment.build(row, seq + offset) for offset, row in enumerate(rows, first)]
                kinds.append(pa.array([type(ev).__name__ for ev in events], pa.string()))
                memory_ids.append(pa.array([getattr(ev, "memory_id", None) for ev in events], pa.string()))
                bodies.append(pa.array([encode_lifecycle(ev) for ev in events], pa.binary()).cast(pa.string()))
            seq += size
        total = len(self)
        empty = pa.array([], pa.string())
        return EncodedEvents(pa.array(np.arange(min(start, total), total, dtype=np.int64)),
                             pa.concat_arrays(kinds) if kinds else empty,
                             pa.concat_arrays(memory_ids) if memory_ids else empty,
                             pa.chunked_array(bodies, pa.string()))


def _rows(frame: pl.DataFrame) -> list[tuple[Any, ...]]:
    return frame.rows()


def plan_sleep(inputs: SleepInputs, *, now: datetime, trigger: SleepTrigger = SleepTrigger.SCHEDULE,
               watermark: datetime | None = None, config: SleepConfig = SleepConfig(),
               promotion: Phase | None = None, refresh: Phase | None = None,
               input_offset: int | None = None) -> SleepPlan | None:
    """Plan the run at ``now`` (event time). None when ``now <= watermark``: that run is done."""
    _aware(now, "now")
    now = now.astimezone(timezone.utc)
    if watermark is not None and now <= watermark:
        return None
    run_id = run_id_for(now)
    now_us = _us(now)
    c = _Columns(inputs.memories, inputs.edges, now_us, config)
    n = c.n
    ids = c.ids.to_list()
    agents_of = c.frame["agent"].to_list()
    layer_of = c.layer.tolist()
    segments: list[_Segment] = []
    counts: dict[str, int] = {}
    texts = _RowTexts(c, run_id, now)

    def add(kind: str, rows: Sequence[Any], build: Callable[[Any, int], RunEvent],
            encode: Callable[[int, int, int], tuple[type, pa.Array, pa.Array]] | None = None) -> None:
        counts[kind] = counts.get(kind, 0) + len(rows)
        if len(rows):
            segments.append(_Segment(rows, build, encode))

    add("started", [None], lambda _r, seq: SleepStarted(
        run_id=run_id, seq=seq, at=now, trigger=trigger, schedule=config.schedule, previous=watermark,
        input_offset=input_offset, config=config.digest()))
    phase_sizes: list[int] = []

    def close_phase(phase: SleepPhase) -> None:
        decided = sum(len(s) for s in segments) - 1 - sum(phase_sizes) - len(phase_sizes)
        phase_sizes.append(decided)
        add("phase_completed", [decided], lambda d, seq: SleepPhaseCompleted(
            run_id=run_id, seq=seq, at=now, phase=phase, decisions=d))

    # ---- phase 1: hippocampus ----------------------------------------------------------------
    refreshed = np.zeros(n, dtype=bool)
    extra = np.zeros(n)
    phase_a = None
    if (inputs.observations is not None and inputs.observations.height and inputs.vectors is not None
            and inputs.observation_vectors is not None):
        vec = np.asarray(inputs.vectors)[c.input_order]
        pool = np.flatnonzero(c.is_hip)
        pool_edges = c.degree(~c.compressed) if c.has_graph else c.edge_count
        obs = inputs.observations
        obs_time = obs["observed_at"]
        if isinstance(obs.schema["observed_at"], pl.Datetime) and obs.schema["observed_at"].time_zone is None:
            obs_time = obs_time.dt.replace_time_zone("UTC")
        obs_us = obs_time.dt.epoch("us").to_numpy().astype(np.int64)
        phase_a = dreaming.dream_phase_a(
            [ids[r] for r in pool], [agents_of[r] for r in pool], vec[pool], pool_edges[pool],
            obs["observation_id"].cast(pl.String).to_list(), obs["agent"].cast(pl.String).to_list(), obs_us,
            np.asarray(inputs.observation_vectors))
        obs_time_of = dict(zip(obs["observation_id"].cast(pl.String).to_list(), obs_us.tolist(), strict=True))
        add("clustered", _rows(phase_a.clustered), lambda r, seq: ObservationClustered(
            run_id=run_id, seq=seq, at=now, observation_id=r[0], memory_id=r[1], agent=r[2],
            prediction_error=r[3], threshold=r[4]))
        add("held", _rows(phase_a.held), lambda r, seq: ObservationHeld(
            run_id=run_id, seq=seq, at=now, observation_id=r[0], nearest_id=r[1], agent=r[2],
            prediction_error=r[3], nearest_edges=r[4]))
        add("created", _rows(phase_a.created), lambda r, seq: ObservationCreated(
            run_id=run_id, seq=seq, at=now, observation_id=r[0], agent=r[1], observed_at=_dt(obs_time_of[r[0]]),
            prediction_error=r[2], nearest_id=r[3], surprise=r[4], linked=r[5]))
        add("refined", _rows(phase_a.refined), lambda r, seq: MemoryRefined(
            run_id=run_id, seq=seq, at=now, memory_id=r[0], agent=r[1], evidence=list(r[2]),
            mean_prediction_error=r[3]))
        if phase_a.refined.height:
            row_of = {mid: i for i, mid in enumerate(ids)}
            for mid, ev in zip(phase_a.refined["memory_id"].to_list(), phase_a.refined["evidence"].to_list(),
                               strict=True):
                refreshed[row_of[mid]] = True
                extra[row_of[mid]] += len(ev)
    # Dream phase B's new edges are decided now (emitted in phase 3) so that every retention of this
    # run already counts them: a re-plan on the applied state then finds nothing to change. Only
    # memories that stay uncompressed this run qualify (idle < compress-after), so nothing decided
    # below can invalidate them.
    connected = _connect(c, inputs, refreshed, watermark, now_us, ids)
    if connected.height:
        row_of = {mid: i for i, mid in enumerate(ids)}
        c.add_edges(np.array([row_of[x] for x in connected["a"].to_list()], dtype=np.int64),
                    np.array([row_of[x] for x in connected["b"].to_list()], dtype=np.int64),
                    connected["weight"].to_numpy())
    caps = np.array([inputs.max_episodes.get(a, config.max_episodes if config.max_episodes is not None else -1)
                     for a in c.agents], dtype=np.int64)
    caps = np.where(caps < 0, -1, caps)
    hip = consolidate(c, c.is_hip, config, refreshed=refreshed, extra_accesses=extra, caps=caps)
    pruned = hip.pruned.copy()
    compressed_now = hip.compress.copy()
    compacts = [_decision_segments(add, c, hip, run_id, now, ids, agents_of, layer_of, refreshed, texts)]
    close_phase(SleepPhase.HIPPOCAMPUS)

    # ---- phase 2: promotion -------------------------------------------------------------------
    promoted = _external(add, promotion, lambda: _view(c, run_id, now, pruned, c.compressed | compressed_now, ids),
                         run_id, now, "promoted")
    close_phase(SleepPhase.PROMOTION)

    # ---- phase 3: consolidation of ATL + Angular Gyrus, triples, dream phase B ----------------
    semantic_rows = ~c.is_hip
    sem = consolidate(c, semantic_rows, config, pruned_before=pruned,
                      compressed_before=c.compressed | compressed_now)
    compacts.append(_decision_segments(add, c, sem, run_id, now, ids, agents_of, layer_of, None, texts))
    pruned |= sem.pruned
    compressed_now |= sem.compress
    retired = retire_triples(inputs.triples, now, config.triple_retention_days) if inputs.triples is not None \
        else pl.DataFrame(schema={"triple_id": pl.String, "valid_to": _DT})
    add("triples_retired", retired.rows(), lambda r, seq: TripleRetired(
        run_id=run_id, seq=seq, at=now, triple_id=r[0], valid_to=r[1]))
    survivors = ~pruned
    compressed_after = c.compressed | compressed_now
    add("connected", connected.rows(), lambda r, seq: MemoriesConnected(
        run_id=run_id, seq=seq, at=now, a=r[0], b=r[1], agent=r[2], weight=r[3]))
    reviews, reviewed_rows = _reviews(c, survivors, now_us, extra)
    add("reviewed", _FrameRows(reviews), lambda r, seq: ReviewScheduled(
        run_id=run_id, seq=seq, at=now, memory_id=r[0], agent=r[1], rating=r[2], elapsed_days=r[3],
        retrievability=r[4], stability=r[5], difficulty=r[6], interval_days=r[7],
        due_at=_dt(now_us + r[7] * US_PER_DAY), reviewed_access_count=r[8]),
        texts.columnar(ReviewScheduled, reviewed_rows,
                       lambda rows, lo, hi: _review_fields(reviews.slice(lo, hi - lo), now_us)))
    patterns = _abstract(c, inputs, survivors)
    add("abstracted", patterns.rows(), lambda r, seq: PatternAbstracted(
        run_id=run_id, seq=seq, at=now, pattern_id=r[0], agent=r[1], key=r[2], domains=list(r[3]), support=r[4],
        sources=[PatternSource(m, d) for m, d in zip(r[5], r[6], strict=True)]))
    close_phase(SleepPhase.CONSOLIDATION)

    # ---- phase 4: refresh (briefings) and the report -----------------------------------------
    _external(add, refresh, lambda: _view(c, run_id, now, pruned, compressed_after, ids), run_id, now, "briefings")
    close_phase(SleepPhase.REFRESH)
    built: list[SleepReport] = []

    def report() -> SleepReport:
        if not built:
            compact_bytes = sum(compact.total() for compact in compacts)
            built.append(_report(c, inputs, now_us, pruned, compressed_now, compact_bytes, counts, promoted))
        return built[0]

    total = sum(len(s) for s in segments) + 1
    add("completed", [None], lambda _r, seq: SleepCompleted(
        run_id=run_id, seq=seq, at=now, watermark=now, decisions=total, report=report()))
    return SleepPlan(run_id, now, segments, report, counts)


class _Compacts:
    """The compact forms of one pass: built per event (``get``) or all at once as JSON texts
    (``texts``, for ``SleepPlan.encoded``); their sizes for the report."""

    def __init__(self, rows: list[int], build: Callable[[int], CompactMemory], columns: Callable[[], pa.Array]
                 ) -> None:
        self.rows = rows
        self.build = build
        self.columns = columns
        self.sizes: dict[int, int] = {}
        self._texts: pa.Array | None = None

    def get(self, row: int) -> CompactMemory:
        compact = self.build(row)
        self.sizes[row] = compact_size(compact)
        return compact

    def texts(self) -> pa.Array:
        """``encode(compact)`` of every row, in the rows' order."""
        if self._texts is None:
            self._texts = self.columns()
        return self._texts

    def total(self) -> int:
        if self._texts is not None:
            return int(pc.sum(pc.binary_length(self._texts)).as_py() or 0)
        return sum(self.sizes[r] if r in self.sizes else compact_size(self.build(r)) for r in self.rows)


class _RowTexts:
    """JSON texts the columnar encoders of one run share, each made once, on first use."""

    def __init__(self, c: _Columns, run_id: str, now: datetime) -> None:
        self.c = c
        self.run_id = _json_text(run_id)
        self.at = _json_text(now)
        self._ids: pa.Array | None = None
        self._id_texts: pa.Array | None = None
        self._agent_texts: pa.Array | None = None
        self._layer_texts: pa.Array | None = None

    @property
    def ids(self) -> pa.Array:
        if self._ids is None:
            self._ids = self.c.ids.to_arrow().cast(pa.string())
        return self._ids

    @property
    def id_texts(self) -> pa.Array:
        if self._id_texts is None:
            self._id_texts = _json_strings(self.ids)
        return self._id_texts

    def agents(self, rows: np.ndarray) -> pa.Array:
        if self._agent_texts is None:
            self._agent_texts = _json_strings(self.c.frame["agent"].to_arrow(), repeated=True)
        return self._agent_texts.take(pa.array(rows))

    def layers(self, rows: np.ndarray) -> pa.Array:
        if self._layer_texts is None:
            self._layer_texts = _json_strings(pa.array(self.c.layer_names, pa.string()))
        return self._layer_texts.take(pa.array(self.c.layer_code[rows]))

    def decision(self, rows: np.ndarray, seq: int, *, layer: bool = True) -> dict[str, str | pa.Array]:
        """The fields every decision about memory ``rows`` has (from ``seq`` on)."""
        fields: dict[str, str | pa.Array] = {
            "run_id": self.run_id, "seq": _json_ints(np.arange(seq, seq + len(rows))), "at": self.at,
            "memory_id": self.id_texts.take(pa.array(rows)), "agent": self.agents(rows)}
        if layer:
            fields["layer"] = self.layers(rows)
        return fields

    def columnar(self, cls: type, rows: np.ndarray, fields: Callable[[np.ndarray, int, int], dict[str, Any]]
                 ) -> Callable[[int, int, int], tuple[type, pa.Array, pa.Array]]:
        """A segment's encoder: events of ``cls`` about memory ``rows``; ``fields(rows, lo, hi)`` gives
        the texts of the fields beyond ``decision``'s for positions ``[lo, hi)``."""
        def encode(lo: int, hi: int, seq: int) -> tuple[type, pa.Array, pa.Array]:
            part = rows[lo:hi]
            texts = {**self.decision(part, seq, layer="layer" in cls.__struct_fields__), **fields(part, lo, hi)}
            return cls, self.ids.take(pa.array(part)), _struct_rows(cls, texts)

        return encode


_COMPACT_WIRE = dict(zip(CompactMemory.__struct_fields__, CompactMemory.__struct_encode_fields__, strict=True))


def _compact_texts(c: _Columns, rows: np.ndarray, access_us: np.ndarray, snapshot: np.ndarray, id_texts: pa.Array,
                   build: Callable[[int], CompactMemory]) -> pa.Array:
    """``encode(compact_memory(...))`` of each of ``rows`` (the arguments ``_decision_segments`` passes),
    column by column: fields in declared order, defaults omitted, keys while they fit. ``build(row)``
    makes the rare ones another way (an id too long for the bound: its digest)."""
    wire = {name: _json_text(w) for name, w in _COMPACT_WIRE.items()}
    m = len(rows)
    if m == 0:
        return pa.array([], pa.string())
    created = _json_seconds(c.created_us[rows] // 1_000_000)
    access = _json_seconds(access_us[rows] // 1_000_000)
    keys = c.frame["index_keys"].gather(rows).to_arrow()
    flat = keys.flatten()
    if created is None or access is None or flat.null_count:  # what compact_memory would fail on, as it does
        return pa.array([_json_text(build(int(r))) for r in rows], pa.string())
    outcomes, which = np.unique(c.outcome[rows], return_inverse=True)
    outcome = pa.array([f",{wire['outcome']}:{_json_text(o[:16])}" if o[:16] else "" for o in outcomes.tolist()],
                       pa.string()).take(pa.array(which.ravel()))

    def count(name: str, values: np.ndarray) -> pa.Array:  # a count, omitted when 0 (its default)
        values = np.maximum(values, 0)
        return pc.if_else(pa.array(values > 0), pc.binary_join_element_wise(
            f",{wire[name]}:", _json_ints(values), ""), "")

    base = pc.binary_join_element_wise(
        "{" + wire["memory_id"] + ":", id_texts.take(pa.array(rows)), f",{wire['created_at']}:", created,
        f",{wire['last_access']}:", access, outcome, count("access_count", c.access_count[rows].astype(np.int64)),
        count("edge_count", snapshot[rows].astype(np.int64)), "")
    size = pc.binary_length(base).to_numpy().astype(np.int64) + 1  # with its closing brace
    # Keys: cut to 40 characters, each costs its text (and a comma after the first); kept while the
    # running cost stays within what the bound leaves (costs are positive: the kept ones are a prefix).
    n_keys = pc.fill_null(pc.list_value_length(keys), 0).to_numpy().astype(np.int64)
    flat = flat.cast(pa.string())
    if len(flat) and pc.max(pc.utf8_length(flat)).as_py() > COMPACT_KEY_MAX_CHARS:  # characters, as str counts
        flat = pa.array([k[:COMPACT_KEY_MAX_CHARS] for k in flat.to_pylist()], pa.string())
    key_texts = _json_strings(flat, repeated=True)
    owner = np.repeat(np.arange(m), n_keys)
    starts = np.cumsum(n_keys) - n_keys
    cost = pc.binary_length(key_texts).to_numpy().astype(np.int64) + 1
    cost[starts[n_keys > 0]] -= 1
    running = np.cumsum(cost)
    running -= np.repeat(np.concatenate(([0], running))[starts], n_keys)  # from each row's first key
    budget = COMPACT_MAX_BYTES - size - len(',"k":[]')
    kept = running <= budget[owner]
    n_kept = np.bincount(owner[kept], minlength=m)
    offsets = np.concatenate(([0], np.cumsum(n_kept))).astype(np.int32)
    joined = pc.binary_join(pa.ListArray.from_arrays(pa.array(offsets), key_texts.filter(pa.array(kept))), ",")
    key_part = pc.if_else(pa.array(n_kept > 0), pc.binary_join_element_wise(
        f",{wire['keys']}:[", joined, "]", ""), "")
    texts = pc.binary_join_element_wise(base, key_part, "}", "")
    long = size > COMPACT_MAX_BYTES  # the id is replaced by its digest: built one by one
    if long.any():
        fixed = [_json_text(build(int(r))) for r in rows[long]]
        texts = pc.replace_with_mask(texts, pa.array(long), pa.array(fixed, texts.type))
    return texts


def _decision_segments(add: Callable[..., None], c: _Columns, d: Consolidated, run_id: str, now: datetime,
                       ids: list[str], agents_of: list[str], layer_of: list[str],
                       refreshed: np.ndarray | None, texts: _RowTexts) -> _Compacts:
    """Protected, compressed, pruned, rescored: each kind ordered by (agent, memory_id)."""

    def ordered(mask: np.ndarray) -> np.ndarray:
        rows = np.flatnonzero(mask)
        return rows[np.lexsort((rows, c.agent_code[rows]))]

    def protect_reasons(r: int) -> list[ProtectReason]:
        reasons = []
        if c.user[r]:
            reasons.append(ProtectReason.USER_INTERACTION)
        if c.success[r]:
            reasons.append(ProtectReason.SUCCESS)
        return reasons

    # The reasons' texts by (user interaction, success): [], [user], [success], [user, success].
    reason_texts = pa.array([_json_text([r for r, on in ((ProtectReason.USER_INTERACTION, u),
                                                        (ProtectReason.SUCCESS, s)) if on])
                             for s in (False, True) for u in (False, True)], pa.string())
    protected = ordered(d.protect)
    add("protected", protected.tolist(), lambda r, seq: MemoryProtected(
        run_id=run_id, seq=seq, at=now, memory_id=ids[r], agent=agents_of[r], layer=layer_of[r],
        reasons=protect_reasons(r)), texts.columnar(MemoryProtected, protected, lambda rows, lo, hi: {
            "reasons": reason_texts.take(pa.array(c.user[rows].astype(np.int64) + 2 * c.success[rows]))}))
    access_us = c.access_us if refreshed is None else np.where(refreshed, c.now_us, c.access_us)
    compressed = ordered(d.compress)
    compressed_rows = compressed.tolist()
    keys: dict[int, list[str] | None] = {}

    def compact_of(r: int) -> CompactMemory:
        if not keys:  # the index keys of every compressed row, on first use
            keys.update(zip(compressed_rows, c.frame["index_keys"].gather(compressed_rows).to_list(), strict=True))
        return compact_memory(ids[r], int(c.created_us[r]), int(access_us[r]), str(c.outcome[r]),
                              int(c.access_count[r]), int(d.snapshot[r]), keys[r] or [])

    compacts = _Compacts(compressed_rows, compact_of, lambda: _compact_texts(
        c, compressed, access_us, d.snapshot, texts.id_texts, compact_of))

    def compressed_event(r: int, seq: int) -> MemoryCompressed:
        compact = compacts.get(r)
        return MemoryCompressed(run_id=run_id, seq=seq, at=now, memory_id=ids[r], agent=agents_of[r],
                                layer=layer_of[r], compact=compact, bytes_before=int(c.size_bytes[r]),
                                bytes_after=compact_size(compact), retention=float(d.retention[r]))

    def compressed_fields(rows: np.ndarray, lo: int, hi: int) -> dict[str, Any]:
        compact = compacts.texts()[lo:hi]
        return {"compact": compact, "bytes_before": _json_ints(c.size_bytes[rows]),
                "bytes_after": _json_ints(pc.binary_length(compact).to_numpy()),
                "retention": _json_numbers(d.retention[rows].tolist())}

    add("compressed", compressed_rows, compressed_event,
        texts.columnar(MemoryCompressed, compressed, compressed_fields))
    prune_reasons = pa.array([_json_text(PruneReason.STALE), _json_text(PruneReason.OVER_CAPACITY)], pa.string())
    pruned = ordered(d.pruned)
    add("pruned", pruned.tolist(), lambda r, seq: MemoryPruned(
        run_id=run_id, seq=seq, at=now, memory_id=ids[r], agent=agents_of[r], layer=layer_of[r],
        reason=PruneReason.STALE if d.reason[r] == 1 else PruneReason.OVER_CAPACITY,
        retention=float(d.prune_retention[r]), idle_days=round(float(c.idle_days[r]), 6)),
        texts.columnar(MemoryPruned, pruned, lambda rows, lo, hi: {
            "reason": prune_reasons.take(pa.array((d.reason[rows] != 1).astype(np.int64))),
            "retention": _json_numbers(d.prune_retention[rows].tolist()),
            "idle_days": _json_numbers([round(x, 6) for x in c.idle_days[rows].tolist()])}))
    rescored = ordered(d.rescore)
    add("rescored", rescored.tolist(), lambda r, seq: MemoryRescored(
        run_id=run_id, seq=seq, at=now, memory_id=ids[r], agent=agents_of[r], layer=layer_of[r],
        retention=float(d.retention[r]), previous=None if np.isnan(c.stored[r]) else float(c.stored[r])),
        texts.columnar(MemoryRescored, rescored, lambda rows, lo, hi: {
            "retention": _json_numbers(d.retention[rows].tolist()),
            "previous": _json_numbers([None if x != x else x for x in c.stored[rows].tolist()])}))
    return compacts


def _view(c: _Columns, run_id: str, now: datetime, pruned: np.ndarray, compressed: np.ndarray,
          ids: list[str]) -> SleepView:
    frame = c.frame.with_columns(pl.Series("compressed", compressed)).filter(pl.Series(~pruned))
    return SleepView(run_id, now, frame, tuple(ids[r] for r in np.flatnonzero(pruned)))


def _external(add: Callable[..., None], phase: Phase | None, view: Callable[[], SleepView], run_id: str,
              now: datetime, kind: str) -> int:
    if phase is None:
        add(kind, [], lambda r, seq: r)
        return 0
    produced = list(phase(view()))
    for ev in produced:
        if getattr(ev, "run_id", None) != run_id:
            raise ValueError(f"a {kind} phase returned an event of another run: {ev!r}")
    add(kind, produced, lambda ev, seq: msgspec.structs.replace(ev, seq=seq, at=now))
    return sum(1 for ev in produced if isinstance(ev, MemoryPromoted))


def _connect(c: _Columns, inputs: SleepInputs, refreshed: np.ndarray, watermark: datetime | None, now_us: int,
             ids: list[str]) -> pl.DataFrame:
    """Dream phase B's connect step over the recently active memories (accessed or created since the
    watermark, else in the last day; refreshed by phase A) that stay uncompressed this run."""
    empty = pl.DataFrame(schema={"a": pl.String, "b": pl.String, "agent": pl.String, "weight": pl.Float64})
    if inputs.vectors is None or c.n == 0:
        return empty
    since = _us(watermark) if watermark is not None else now_us - US_PER_DAY
    idle = np.where(refreshed, 0.0, c.idle_days)
    eligible = ~c.compressed & (idle < c.compress_after)
    recent = np.flatnonzero(eligible & (refreshed | (c.access_us > since) | (c.created_us > since)))
    if len(recent) < 2:
        return empty
    in_recent = np.zeros(c.n, dtype=bool)
    in_recent[recent] = True
    both = in_recent[c.gi] & in_recent[c.gj]
    existing = {(ids[a], ids[b]) for a, b in zip(c.gi[both].tolist(), c.gj[both].tolist(), strict=True)}
    vec = np.asarray(inputs.vectors)[c.input_order]
    agents = c.frame["agent"].to_numpy()
    parts = []
    for code, _ in enumerate(c.layer_names):  # each layer has its own associative graph
        rows = recent[c.layer_code[recent] == code]
        if len(rows) > 1:
            parts.append(dreaming.connect_recent([ids[r] for r in rows], agents[rows], vec[rows], existing))
    return pl.concat(parts) if parts else empty


def _reviews(c: _Columns, survivors: np.ndarray, now_us: int, extra: np.ndarray) -> tuple[pl.DataFrame, np.ndarray]:
    """The reviews of the FSRS schedule (one row each, in event order), and the memory rows they are of."""
    f = c.frame
    stability = f["stability"].fill_null(np.nan).to_numpy().astype(np.float64)
    difficulty = f["difficulty"].fill_null(np.nan).to_numpy().astype(np.float64)
    last_review = f["last_review"].dt.epoch("us").fill_null(0).to_numpy().astype(np.int64)
    accesses = (c.access_count + extra).astype(np.int64)
    new_accesses = accesses - f["reviewed_access_count"].to_numpy().astype(np.int64)
    rows = np.flatnonzero(survivors)
    r = dreaming.review(stability[rows], difficulty[rows], last_review[rows], f["last_rating"].to_numpy()[rows],
                        new_accesses[rows], f["contradicted"].to_numpy().astype(bool)[rows], now_us)
    picked = rows[r.rows]
    order = np.lexsort((picked, c.agent_code[picked]))
    at = picked[order]
    return pl.DataFrame({
        "memory_id": c.ids.gather(at), "agent": f["agent"].gather(at), "rating": r.rating[order],
        "elapsed_days": np.round(r.elapsed_days[order], 6), "retrievability": np.round(r.retrievability[order], 6),
        "stability": np.round(r.stability[order], 6), "difficulty": np.round(r.difficulty[order], 6),
        "interval_days": r.interval_days[order], "reviewed_access_count": accesses[at]}), at


def _review_fields(reviews: pl.DataFrame, now_us: int) -> dict[str, Any]:
    """The texts of the ``ReviewScheduled`` fields a review row holds (``decision`` has the rest)."""
    fields: dict[str, Any] = {}
    for name in ("rating", "elapsed_days", "retrievability", "stability", "difficulty", "interval_days",
                 "reviewed_access_count"):
        column = reviews[name]
        fields[name] = (_json_ints(column.to_numpy()) if column.dtype.is_integer() and not column.null_count()
                        else _json_numbers(column.to_list()))
    intervals = reviews["interval_days"]
    distinct = intervals.unique().sort()  # a few: due dates made once each
    due = pa.array([_json_text(_dt(now_us + days * US_PER_DAY)) for days in distinct.to_list()], pa.string())
    fields["due_at"] = due.take(pa.array(distinct.search_sorted(intervals).to_numpy()))
    return fields


class _FrameRows(Sequence[tuple[Any, ...]]):
    """A frame's rows as tuples, made on first use (a columnar encoder never needs them)."""

    def __init__(self, frame: pl.DataFrame) -> None:
        self.frame = frame
        self._rows: list[tuple[Any, ...]] | None = None

    def _all(self) -> list[tuple[Any, ...]]:
        if self._rows is None:
            self._rows = self.frame.rows()
        return self._rows

    def __len__(self) -> int:
        return self.frame.height

    def __getitem__(self, k: Any) -> Any:
        return self._all()[k]

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        return iter(self._all())


def _abstract(c: _Columns, inputs: SleepInputs, survivors: np.ndarray) -> pl.DataFrame:
    f = c.frame.filter(pl.Series(survivors)).filter((pl.col("domain") != "") & (pl.col("index_keys").list.len() > 0))
    return dreaming.abstract_patterns(f, set(inputs.patterns))


def _report(c: _Columns, inputs: SleepInputs, now_us: int, pruned: np.ndarray, compressed_now: np.ndarray,
            compact_bytes: int, counts: dict[str, int], promoted: int) -> SleepReport:
    survivors = ~pruned
    compressed_after = c.compressed | compressed_now
    # The graph after the run: survivors' edges between uncompressed ends (new connections included).
    node = np.full(c.n, -1, dtype=np.int64)
    node[survivors] = np.arange(int(survivors.sum()))
    keep = ~compressed_after & survivors
    live = keep[c.gi] & keep[c.gj]
    g = integration(int(survivors.sum()), node[c.gi[live]], node[c.gj[live]], c.gw[live],
                    max_iter=REPORT_LANCZOS_MAX_ITER)
    trend = fiedler_trend([*inputs.fiedler_history, g.largest_component])
    fiedler = FiedlerSummary(value=round(g.value, 9), largest_component=round(g.largest_component, 9),
                             components=g.components, largest_size=g.largest_size, nodes=g.nodes, edges=g.edges,
                             slope=trend.slope, trend=trend.status)
    if inputs.capture_errors is not None and inputs.capture_errors.height:
        ce = inputs.capture_errors
        t = ce["observed_at"]
        if isinstance(ce.schema["observed_at"], pl.Datetime) and ce.schema["observed_at"].time_zone is None:
            t = t.dt.replace_time_zone("UTC")
        sat = dreaming.pe_saturation(t.dt.epoch("us").to_numpy(), ce["prediction_error"].to_numpy(), now_us)
    else:
        sat = dreaming.pe_saturation(np.zeros(0, np.int64), np.zeros(0), now_us)
    saturation = SaturationSummary(mean_pe=sat.mean_pe, previous_mean_pe=sat.previous_mean_pe, samples=sat.samples,
                                   saturated=sat.saturated, status=sat.status)
    sizes_after = np.where(survivors & ~compressed_now, c.size_bytes, 0)
    per_layer: dict[str, dict[str, int]] = {}
    for code, name in enumerate(c.layer_names):
        rows = c.layer_code == code
        per_layer[name] = {"before": int(rows.sum()), "after": int((rows & survivors).sum()),
                           "compressed": int((rows & compressed_now).sum()), "pruned": int((rows & pruned).sum())}
    after = int(survivors.sum())
    n_compressed = int(compressed_now.sum())
    narrative = (f"{after} of {c.n} memories kept ({n_compressed} compressed, {int(pruned.sum())} pruned, "
                 f"{counts.get('protected', 0)} newly protected), {promoted} promoted; "
                 f"largest component lambda2 {fiedler.largest_component:.4g} over {g.largest_size} memories "
                 f"in {g.components} components, {fiedler.trend}; prediction error {saturation.status}.")
    return SleepReport(
        memories_before=c.n, memories_after=after, kept=after - n_compressed, compressed=n_compressed,
        pruned=int(pruned.sum()), protected=counts.get("protected", 0), promoted=promoted,
        rescored=counts.get("rescored", 0), reviewed=counts.get("reviewed", 0),
        triples_retired=counts.get("triples_retired", 0), clustered=counts.get("clustered", 0),
        held=counts.get("held", 0), created=counts.get("created", 0), connected=counts.get("connected", 0),
        abstracted=counts.get("abstracted", 0), bytes_before=int(c.size_bytes.sum()),
        bytes_after=int(sizes_after.sum()) + compact_bytes,
        per_layer=per_layer, fiedler=fiedler, saturation=saturation, narrative=narrative)


# --- consuming a run: resume and apply -----------------------------------------------------------


class RunAssembler:
    """Collects a run's events (duplicates ignored by seq) and releases the run once complete.

    A consumer (the projector) feeds every lifecycle event; ``feed`` returns the runs that became
    complete (all seqs 0..n-1 present, ``SleepCompleted`` last), in order. ``next_seq(run_id)`` is
    where a crashed producer resumes (``SleepPlan.events(start=next_seq)``).
    """

    def __init__(self) -> None:
        self._runs: dict[str, dict[int, RunEvent]] = {}
        self.completed: set[str] = set()

    def feed(self, events: Iterable[RunEvent]) -> list[list[RunEvent]]:
        done: list[list[RunEvent]] = []
        for ev in events:
            if ev.run_id in self.completed:
                continue
            run = self._runs.setdefault(ev.run_id, {})
            run.setdefault(ev.seq, ev)
            end = next((e for e in run.values() if isinstance(e, SleepCompleted)), None)
            if end is not None and len(run) == end.decisions:
                done.append([run[s] for s in range(end.decisions)])
                self.completed.add(ev.run_id)
                del self._runs[ev.run_id]
        return done

    def next_seq(self, run_id: str) -> int:
        """The first seq not yet seen without a gap before it (0 for an unknown run)."""
        if run_id in self.completed:
            return -1
        run = self._runs.get(run_id, {})
        seq = 0
        while seq in run:
            seq += 1
        return seq


def apply_run(memories: pl.DataFrame, edges: pl.DataFrame | None, events: Sequence[RunEvent]
              ) -> tuple[pl.DataFrame, pl.DataFrame | None]:
    """The reference fold of one complete run over memory columns and the edge list (what the
    projector does in SQL). Not the hot path: used by tests and small tools."""
    frame = memory_frame(memories)
    updates: dict[str, dict[str, Any]] = {}
    removed: set[str] = set()
    unlinked: set[str] = set()
    new_rows: list[dict[str, Any]] = []
    new_edges: list[tuple[str, str, float]] = []
    for ev in events:
        if isinstance(ev, MemoryPruned):
            removed.add(ev.memory_id)
            unlinked.add(ev.memory_id)
        elif isinstance(ev, MemoryCompressed):
            updates.setdefault(ev.memory_id, {}).update(
                compressed=True, size_bytes=ev.bytes_after, edge_count=ev.compact.edge_count,
                retention=ev.retention, index_keys=list(ev.compact.keys))
            unlinked.add(ev.memory_id)
        elif isinstance(ev, MemoryProtected):
            updates.setdefault(ev.memory_id, {})["long_term"] = True
        elif isinstance(ev, MemoryRescored):
            updates.setdefault(ev.memory_id, {})["retention"] = ev.retention
        elif isinstance(ev, MemoryRefined):
            u = updates.setdefault(ev.memory_id, {})
            u["last_access"] = ev.at
            u["__accesses"] = u.get("__accesses", 0) + len(ev.evidence)
        elif isinstance(ev, ReviewScheduled):
            updates.setdefault(ev.memory_id, {}).update(
                stability=ev.stability, difficulty=ev.difficulty, last_review=ev.at, last_rating=ev.rating,
                reviewed_access_count=ev.reviewed_access_count, contradicted=False)
        elif isinstance(ev, MemoriesConnected):
            new_edges.append((ev.a, ev.b, ev.weight))
        elif isinstance(ev, ObservationCreated):
            new_rows.append({"memory_id": ev.observation_id, "agent": ev.agent, "layer": HIPPOCAMPUS,
                             "created_at": ev.observed_at, "last_access": None, "access_count": 0,
                             "importance": 0.5, "outcome": "", "is_user_interaction": False, "edge_count": 0,
                             "size_bytes": 0, "long_term": False})
    if updates:
        rows = frame.to_dicts()
        for row in rows:
            u = updates.get(row["memory_id"])
            if u:
                for k, v in u.items():
                    if k == "__accesses":
                        row["access_count"] += v
                    else:
                        row[k] = v
        frame = memory_frame(pl.DataFrame(rows, schema=frame.schema))
    frame = frame.filter(~pl.col("memory_id").is_in(sorted(removed)))
    if new_rows:
        frame = pl.concat([frame, memory_frame(pl.DataFrame(new_rows))], how="diagonal_relaxed")
        frame = memory_frame(frame)
    if edges is not None:
        weight = pl.col("weight").cast(pl.Float64) if "weight" in edges.columns else pl.lit(1.0).alias("weight")
        e = edges.select(pl.col("src").cast(pl.String), pl.col("dst").cast(pl.String), weight)
        gone = sorted(unlinked)
        e = e.filter(~pl.col("src").is_in(gone) & ~pl.col("dst").is_in(gone))
        if new_edges:
            e = pl.concat([e, pl.DataFrame(new_edges, schema=e.schema, orient="row")])
        edges = e
    return frame.sort("memory_id"), edges


# --- plotting (the CLI's ``--plot out.png``) --------------------------------------------------------


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
