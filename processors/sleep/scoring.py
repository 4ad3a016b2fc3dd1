"""Retention scores and the consolidation rules (protect, compress, prune) of one layer pass.

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
  emits ``MemoryProtected`` and the flag (``long_term``) is sticky (capture sets it already for
  those, for conversation messages of either side, and for much-recalled memories);
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

Memory columns (a polars DataFrame, one row per live memory; ``MEMORY_COLUMNS``): memory_id,
agent, layer, created_at, last_access, access_count, importance, outcome, is_user_interaction,
edge_count, size_bytes, long_term; optional: compressed, retention, index_keys, domain,
stability, difficulty, last_review, last_rating, reviewed_access_count, contradicted, stream_time.
The graph is an edge list (src, dst[, weight]) of memory ids.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta, timezone
from typing import Any, NamedTuple

import msgspec
import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from somnus.processors.episodic.graph_metrics import simple_graph
from somnus.processors.sleep.config import (
    ACCESS_SATURATION,
    BIN_SIZES,
    COMPACT_KEY_MAX_CHARS,
    EDGE_SATURATION,
    HIPPOCAMPUS,
    OUTCOME_VALUE,
    RETENTION_WEIGHTS,
    US_PER_DAY,
    SleepConfig,
)
from somnus.processors.sleep.schedule import from_us
from somnus.schemas.lifecycle import COMPACT_MAX_BYTES, CompactMemory, compact_size

# --- columns ----------------------------------------------------------------------------------------

DATETIME_US = pl.Datetime("us", "UTC")
MEMORY_COLUMNS: dict[str, tuple[Any, bool, Any]] = {
    # name: (dtype, required, default)
    "memory_id": (pl.String, True, None),
    "agent": (pl.String, True, None),
    "layer": (pl.String, True, None),  # hippocampus | atl | angular_gyrus
    "created_at": (DATETIME_US, True, None),  # event time of the memory (its SCN bins)
    "last_access": (DATETIME_US, True, None),  # null: never accessed
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
    "last_review": (DATETIME_US, False, None),
    "last_rating": (pl.Int64, False, 0),
    "reviewed_access_count": (pl.Int64, False, 0),  # access_count at the last review
    "contradicted": (pl.Boolean, False, False),  # a contradiction since the last review
    "stream_time": (DATETIME_US, False, None),  # the newest event time of the memory's scope; null: the run's time
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
            exprs.append(
                pl.lit(default, dtype=dtype).alias(name)
                if default is not None or name in NULLABLE
                else pl.lit(None, dtype=dtype).alias(name)
            )
            continue
        col = pl.col(name)
        if dtype == DATETIME_US:
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
    for name in (
        "memory_id",
        "agent",
        "layer",
        "created_at",
        "access_count",
        "importance",
        "outcome",
        "is_user_interaction",
        "edge_count",
        "size_bytes",
        "long_term",
    ):
        if out[name].null_count():
            raise ValueError(f"memory column {name!r} has nulls")
    return out


class Columns:
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
        self.compress_after = np.where(
            self.is_hip, config.hippocampus.compress_after_days, config.semantic.compress_after_days
        )
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
        return np.bincount(self.gi[live], minlength=self.n) + np.bincount(self.gj[live], minlength=self.n)


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


def retention_scores(
    access_count: np.ndarray,
    idle_days: np.ndarray,
    edges: np.ndarray,
    importance: np.ndarray,
    outcome_value: np.ndarray,
    max_age_days: np.ndarray | float,
) -> np.ndarray:
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
    score = (
        w["access"] * access
        + w["recency"] * recency
        + w["graph"] * graph
        + w["importance"] * np.clip(importance, 0.0, 1.0)
        + w["outcome"] * outcome_value
    )
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


def _coverage_rescue(c: Columns, alive: np.ndarray, cand: np.ndarray, retention: np.ndarray) -> np.ndarray:
    """Candidates kept so that no (agent, layer, bin) loses its last memory; bin kinds in order."""
    rescued = np.zeros(c.n, dtype=bool)
    for values, size in c.bins:
        key = c.group * size + values
        covered = np.zeros(c.n_groups * size, dtype=bool)
        covered[key[alive & (~cand | rescued)]] = True
        need = np.flatnonzero(cand & ~rescued & ~covered[key])
        rescued[_first_per_key(need, key, retention)] = True
    return rescued


def _over_capacity(
    c: Columns, members: np.ndarray, protected: np.ndarray, retention: np.ndarray, caps: np.ndarray
) -> np.ndarray:
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


def consolidate(
    c: Columns,
    active: np.ndarray,
    config: SleepConfig,
    *,
    pruned_before: np.ndarray | None = None,
    compressed_before: np.ndarray | None = None,
    refreshed: np.ndarray | None = None,
    extra_accesses: np.ndarray | None = None,
    caps: np.ndarray | None = None,
) -> Consolidated:
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
    rescore = survivors & (
        np.isnan(c.stored) | (np.abs(np.nan_to_num(c.stored, nan=0.0) - retention) >= config.rescore_epsilon - 1e-12)
    )
    return Consolidated(
        pruned,
        reason,
        prune_retention,
        compress & survivors,
        snapshot,
        retention,
        protect,
        rescore,
        iterations,
        converged,
    )


def compact_memory(
    memory_id: str,
    created_us: int,
    access_us: int,
    outcome: str,
    access_count: int,
    edge_count: int,
    keys: Sequence[str],
) -> CompactMemory:
    """The compact form: whole-second times, and as many index keys (each cut to 40 characters)
    as fit in ``COMPACT_MAX_BYTES``.

    >>> c = compact_memory("m" * 36, 0, 10**6, "success", 3, 4, ["k" * 100] * 10)
    >>> from somnus.schemas.lifecycle import compact_size
    >>> compact_size(c) <= 200, len(c.keys)
    (True, 1)
    """
    base = CompactMemory(
        memory_id=memory_id,
        created_at=from_us(created_us // 1_000_000 * 1_000_000),
        last_access=from_us(access_us // 1_000_000 * 1_000_000),
        outcome=outcome[:16],
        access_count=max(int(access_count), 0),
        edge_count=max(int(edge_count), 0),
    )
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
        return pl.DataFrame(schema={"triple_id": pl.String, "valid_to": DATETIME_US})
    valid_to = pl.col("valid_to")
    if isinstance(triples.schema["valid_to"], pl.Datetime) and triples.schema["valid_to"].time_zone is None:
        valid_to = valid_to.dt.replace_time_zone("UTC")
    cutoff = now.astimezone(timezone.utc) - timedelta(days=retention_days)
    return (
        triples.select(
            pl.col("triple_id").cast(pl.String),
            valid_to.dt.convert_time_zone("UTC").dt.cast_time_unit("us").alias("valid_to"),
        )
        .filter(pl.col("valid_to").is_not_null() & (pl.col("valid_to") < cutoff))
        .sort("triple_id")
    )


def idle_triples(
    triples: pl.DataFrame, now: datetime, retire_days: float, scope_times: Mapping[str, datetime] | None = None
) -> pl.DataFrame:
    """Live triples (``valid_to`` null) whose ``last_touched`` (last reinforcement or retrieval) is more
    than ``retire_days`` before their scope's stream time (``scope_times``, never later than ``now``;
    a scope not in it: ``now``): triple_id, last_touched, by triple_id. ``retire_days <= 0``: none.

    >>> from datetime import datetime, timezone
    >>> t = lambda d: datetime(2024, 1, 1, tzinfo=timezone.utc) + timedelta(days=d)
    >>> f = pl.DataFrame({"triple_id": ["a", "b", "c"], "scope": ["s", "s", "old"], "valid_to": [None, None, None],
    ...                   "last_touched": [t(0), t(20), t(0)]})
    >>> idle_triples(f, t(100), 90.0, {"old": t(50)})["triple_id"].to_list()  # "old" saw nothing for 50 days
    ['a']
    """
    empty = pl.DataFrame(schema={"triple_id": pl.String, "last_touched": DATETIME_US})
    if triples.height == 0 or retire_days <= 0:
        return empty
    now = now.astimezone(timezone.utc)
    scopes = triples["scope"].cast(pl.String).unique().sort().to_list()
    at = [min(now, (scope_times or {}).get(s, now).astimezone(timezone.utc)) for s in scopes]
    clock = pl.DataFrame({"scope": scopes, "__at": at}, schema={"scope": pl.String, "__at": DATETIME_US})
    touched = _utc(triples, "last_touched")
    return (
        triples.select(
            pl.col("triple_id").cast(pl.String),
            pl.col("scope").cast(pl.String),
            _utc(triples, "valid_to").alias("valid_to"),
            touched.alias("last_touched"),
        )
        .join(clock, on="scope", how="left")
        .filter(
            pl.col("valid_to").is_null()
            & pl.col("last_touched").is_not_null()
            & (pl.col("last_touched") < pl.col("__at") - pl.duration(microseconds=int(retire_days * US_PER_DAY)))
        )
        .select("triple_id", "last_touched")
        .sort("triple_id")
    )


def _utc(frame: pl.DataFrame, name: str) -> pl.Expr:
    col = pl.col(name)
    dtype = frame.schema[name]
    if isinstance(dtype, pl.Datetime) and dtype.time_zone is None:
        col = col.dt.replace_time_zone("UTC")
    if not isinstance(dtype, pl.Datetime):
        return col.cast(DATETIME_US)
    return col.dt.convert_time_zone("UTC").dt.cast_time_unit("us")
