"""Deep sleep inside the memory fold: scheduled on stream time, or on demand, replayable.

The memory topic has one partition, so the episodic memory the fold holds before any record is the
same live and in a replay. Before it applies a units record, the fold advances the sleep clock to
the record's event time (``somnus.processors.sleep.schedule.advance``; cron ``SOMNUS_SLEEP_SCHEDULE``, default
``0 3 * * *``): every fire time passed runs a sleep at that time, over the state before the record.
The event time is bounded by the record's timestamp plus ``SOMNUS_MAX_CLOCK_SKEW_S``
(``somnus.processors.sleep.schedule.bounded_time``): units stamped ahead by a runtime's clock do not run the sleeps
of nights to come.
A ``SleepRequested`` record (``somnus sleep``) runs one at its ``at``. The watermark (the last run's
time) makes a run at or before it a no-op, so running twice changes nothing.

**A stream time per scope.** The fold also keeps, per memory scope (``agent:<name>``), the newest
(bounded) event time of its units (``SleepState.scopes``), and a run measures each memory's idle
time to its scope's stream time, never later than the run (``somnus.processors.sleep.scoring``: column
``stream_time``). So another dataset's newer events never make a scope's memories idle: a dataset
imported after a newer one is judged by its own time, not the other's.

A run's decisions (``somnus.processors.sleep.plan.plan_sleep``: protect, compress, prune, re-score, dream…) are
written to ``lifecycle_log`` and its report to ``sleep_runs`` in the transaction of the batch that
triggered it (a crash means the batch, run included, is redone identically); compressions and
prunings are applied to the memory index as ``MemoryForgotten`` events, appended to ``memory_log``
so the index rebuilt at start has them too. Promotion (phase 2) is a request on the semantic topic,
published by the projector after each committed run, scheduled or requested by ``somnus sleep``
(``take_scheduled``), with the topics the run abstracted; ``somnus consolidate`` publishes one too.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import gc
import logging
import weakref
from pathlib import Path
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime, timezone
from itertools import chain
from operator import attrgetter
from typing import Any, cast

import duckdb
import msgspec
import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from somnus.processors.episodic.capture import apply_all, forget_all
from somnus.processors.sleep.dreaming import message_keys, signature_vectors
from somnus.processors.working.session_buffer import content_words
from somnus.processors.sleep.plan import SleepInputs, fold_observations, plan_sleep
from somnus.processors.sleep.config import SCHEDULE_OFF, SleepConfig
from somnus.processors.sleep.schedule import SleepClock, advance, bounded_time, next_fire, require_aware
from somnus.projections.schema import refresh_facts_top
from somnus.schemas.lifecycle import (
    MemoryCompressed,
    PatternAbstracted,
    MemoryPruned,
    RetireReason,
    SleepCompleted,
    SleepTrigger,
    TripleRetired,
    decode_lifecycle,
)
from somnus.schemas.memory import ForgetReason
from somnus.projections.frames import registered

log = logging.getLogger("somnus.projector")


class SleepState(msgspec.Struct):
    clock: SleepClock = SleepClock()
    watermark: datetime | None = None
    fiedler_history: list[float] = []
    scopes: dict[str, datetime] = {}  # memory scope -> its stream time (newest bounded unit time)
    # agent -> [event time (µs), memory id] of the units captured since the last run, newest kept
    # (``captured_since``): phase A's observations even when their event time is before that run.
    captured: dict[str, list[tuple[int, str]]] = {}
    # ids of the patterns dream phase B abstracted so far: a later run abstracts only new ones (without
    # them every run abstracted every pattern again: the sample fleet's 662 over 27 runs were ~90 patterns)
    patterns: list[str] = []


def observe_scopes(
    scopes: dict[str, datetime], units: Sequence[Any], record_time: datetime | None, skew_s: float
) -> None:
    """Move each scope's stream time to the newest event time of its ``units`` (bounded by the record's
    time plus ``skew_s``, as the sleep clock is); never backwards.

    >>> from datetime import datetime, timezone
    >>> from types import SimpleNamespace as U
    >>> t = lambda d: datetime(2024, 5, d, tzinfo=timezone.utc)
    >>> scopes = {"agent:a": t(3)}
    >>> observe_scopes(scopes, [U(scope="agent:a", occurred_at=t(2)), U(scope="agent:b", occurred_at=t(9))], None, 0)
    >>> sorted((k, v.day) for k, v in scopes.items())
    [('agent:a', 3), ('agent:b', 9)]
    """
    newest: dict[str, datetime] = {}
    for u in units:
        at = newest.get(u.scope)
        if at is None or u.occurred_at > at:
            newest[u.scope] = u.occurred_at
    for scope, at in newest.items():
        at = bounded_time(at, record_time, skew_s).astimezone(timezone.utc)
        old = scopes.get(scope)
        if old is None or at > old:
            scopes[scope] = at


def note_captured(captured: dict[str, list[tuple[int, str]]], units: Sequence[Any], per_agent: int) -> None:
    """Remember the ``units`` arriving since the last run, the newest ``per_agent`` of each agent (by
    event time, then id). A record of units often spans days of event time (an import, a batch of
    sessions), and the run its fire times trigger happens before it is captured, so "created after
    the last run" by event time would never see most of its units: arrival is what counts.

    >>> from types import SimpleNamespace as U
    >>> from datetime import datetime, timezone
    >>> t = lambda d: datetime(2024, 5, d, tzinfo=timezone.utc)
    >>> got = {}
    >>> note_captured(got, [U(agent="a", memory_id=m, occurred_at=t(d)) for m, d in (("x", 3), ("y", 1), ("z", 2))], 2)
    >>> [m for _, m in got["a"]]
    ['z', 'x']
    """
    if per_agent <= 0:
        return
    changed: set[str] = set()
    for u in units:
        captured.setdefault(u.agent, []).append((int(u.occurred_at.timestamp() * 1_000_000), u.memory_id))
        changed.add(u.agent)
    for agent in changed:
        captured[agent] = sorted({(int(at), str(m)) for at, m in captured[agent]})[-per_agent:]


def load_state(con: duckdb.DuckDBPyConnection) -> SleepState:
    row = con.execute("SELECT state FROM sleep_state WHERE id = 1").fetchone()
    return msgspec.json.decode(row[0], type=SleepState) if row else SleepState()


class UnitColumns:
    """The fields of the fold's units that sleep reads, as Arrow columns over every row of the index
    (live or not), extended by the rows added since the last run: the index only appends units, so a
    run reads each unit once in all, not once per run (``memory_columns`` takes the live rows)."""

    _TYPES = {
        "agent": pa.string(),
        "outcome": pa.string(),
        "user": pa.bool_(),
        "mode": pa.string(),
        "tools": pa.list_(pa.string()),
        "objects": pa.list_(pa.string()),
        "domains": pa.list_(pa.string()),
    }

    def __init__(self) -> None:
        self._index: weakref.ref[Any] | None = None
        self._reset()

    def _reset(self) -> None:
        self.n = 0
        self.columns: dict[str, pa.Array] = {k: pa.array([], t) for k, t in self._TYPES.items()}
        self.size = np.zeros(0, np.int64)  # len(perception) + len(summary) + len(action) + 200

    def of(self, ix: Any) -> UnitColumns:
        """These columns for index ``ix``, up to date (rebuilt for another index)."""
        n = len(ix.units)
        if self._index is None or self._index() is not ix or n < self.n:
            self._index = weakref.ref(ix)
            self._reset()
        if n > self.n:
            new = ix.units[self.n : n]
            agent, outcome, user, perception, summary, action, tools, objects, domains, mode, _run = zip(
                *map(_UNIT_FIELDS, new)
            )

            def lengths(texts: Sequence[str]) -> np.ndarray:
                return np.fromiter(map(len, texts), dtype=np.int64, count=len(new))

            added = dict(
                agent=agent, outcome=outcome, user=user, mode=mode, tools=tools, objects=objects, domains=domains
            )
            self.columns = {
                k: pa.concat_arrays([self.columns[k], pa.array(added[k], t)]) for k, t in self._TYPES.items()
            }
            self.size = np.concatenate([self.size, lengths(perception) + lengths(summary) + lengths(action) + 200])
            self.n = n
        return self


def memory_columns(
    state: Any, scopes: Mapping[str, datetime] | None = None, units: UnitColumns | None = None
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The live memories of the fold as sleep's columns, and the associative graph as an edge list;
    with ``scopes`` (scope -> stream time), each memory's ``stream_time`` is its scope's. ``units``:
    the unit columns kept from the last run (a ``SleepJob``'s), else read anew."""
    ix = state.index
    n = len(ix.ids)
    live = np.flatnonzero(ix.alive.data[:n])
    cols = (units or UnitColumns()).of(ix)
    at = pa.array(live, pa.int64())
    ids = pa.array(ix.ids, pa.string())
    graph = ix.graph
    nodes = np.fromiter(graph, dtype=np.int64, count=len(graph))
    degrees = np.fromiter(map(len, graph.values()), dtype=np.int64, count=len(graph))
    degree = np.zeros(n, dtype=np.int64)  # len(graph.get(i, {})) of every memory
    inside = (nodes >= 0) & (nodes < n)
    degree[nodes[inside]] = degrees[inside]
    last = ix.last_access.data[live]
    agent, outcome, user, mode, tools, objects, domains = (
        cols.columns[k].take(at) for k in ("agent", "outcome", "user", "mode", "tools", "objects", "domains")
    )
    objects, domains = _message_topics(ix, live, agent, mode, tools, objects, domains)

    # Built through Arrow: a list column from Python lists costs polars a Series per row.
    frame = pl.from_arrow(
        pa.table(
            {
                "memory_id": ids.take(pa.array(live)),
                "agent": agent,
                "layer": pa.array(["hippocampus"] * len(live), pa.string()),
                "created_at": pa.array((ix.occurred.data[live] * 1e6).astype(np.int64), pa.timestamp("us", "UTC")),
                "last_access": pa.array((last * 1e6).astype(np.int64), pa.timestamp("us", "UTC"), mask=~(last > 0)),
                "access_count": pa.array(ix.access_count.data[live].astype(np.int64)),
                "importance": pa.array(ix.importance.data[live]),
                "outcome": outcome,
                "is_user_interaction": user,
                "edge_count": pa.array(degree[live]),
                "size_bytes": pa.array(cols.size[live]),
                "long_term": pa.array(ix.long_term.data[live]),
                "compressed": pa.array(ix.compressed.data[live]),
                "index_keys": _index_keys(tools, objects),
                "domain": _first_or_empty(domains),
                **({"stream_time": _scope_times(ix, live, scopes)} if scopes is not None else {}),
            }
        )
    )
    # Every edge once (a < b), in the graph's order: its keys, then each one's neighbours.
    a = np.repeat(nodes, degrees)
    b = np.fromiter(chain.from_iterable(graph.values()), dtype=np.int64, count=int(degrees.sum()))
    w = np.fromiter(chain.from_iterable(map(dict.values, graph.values())), dtype=np.float64, count=len(b))
    once = a < b
    edges = pl.from_arrow(
        pa.table(
            {
                "src": ids.take(pa.array(a[once])),
                "dst": ids.take(pa.array(b[once])),
                "weight": pa.array(w[once], pa.float64()),
            }
        )
    )
    return cast(pl.DataFrame, frame), cast(pl.DataFrame, edges)  # from_arrow of a table: a DataFrame


def dream_inputs(
    state: Any,
    frame: pl.DataFrame,
    edges: pl.DataFrame,
    since: datetime | None,
    config: SleepConfig,
    captured: Sequence[str] = (),
    **kw: Any,
) -> SleepInputs:
    """A run's inputs with what dreaming needs, from the fold's own state: the memories created since
    the last run ``since``, and those ``captured`` since it whatever their event time, as phase A's
    observations (``fold_observations``), the memories' MinHash signatures as vectors
    (``signature_vectors``, asked for per agent), and the capture decisions' prediction errors for
    saturation."""
    ix = state.index

    def embed(ids: Sequence[str]) -> np.ndarray:
        rows = np.fromiter(map(ix.pos.__getitem__, ids), dtype=np.int64, count=len(ids))
        return signature_vectors(ix.signatures.data[rows], dtype=np.float64)  # what dreaming computes with

    errors = state.prediction_errors
    capture_errors = pl.DataFrame(
        {
            "observed_at": pa.array(
                np.fromiter((t for t, _ in errors), dtype=np.int64, count=len(errors)), pa.timestamp("us", "UTC")
            ),
            "prediction_error": np.fromiter((pe for _, pe in errors), dtype=np.float64, count=len(errors)),
        }
    )
    return SleepInputs(
        memories=frame,
        edges=edges,
        embed=embed,
        capture_errors=capture_errors,
        observations=fold_observations(frame, since, config.dream_observations_per_agent, captured=captured),
        **kw,
    )


# A live triple's last touch: its assertion, its last change in ``triple_history`` (reinforcements),
# or its last use by an agent it was served to (``fact_uses``: retrieval).
LIVE_TRIPLES_SQL = """
SELECT t.triple_id::VARCHAR AS triple_id, t.scope, t.valid_to,
       greatest(t.valid_from, coalesce(h.last, t.valid_from), coalesce(u.last, t.valid_from)) AS last_touched
FROM triples t
LEFT JOIN (SELECT triple_id::VARCHAR AS triple_id, max(changed_at) AS last FROM triple_history GROUP BY 1) h
  ON h.triple_id = t.triple_id::VARCHAR
LEFT JOIN (SELECT triple_id, max(used_at) AS last FROM fact_uses GROUP BY 1) u ON u.triple_id = t.triple_id::VARCHAR
WHERE t.valid_to IS NULL
ORDER BY 1
"""


def live_triples(con: duckdb.DuckDBPyConnection) -> pl.DataFrame:
    """The live triples with what fact retirement reads: triple_id, scope, valid_to (null), last_touched."""
    return pl.from_arrow(con.sql(LIVE_TRIPLES_SQL).to_arrow_table())  # type: ignore[return-value]


def retire_facts(con: duckdb.DuckDBPyConnection, retired: Sequence[Mapping[str, Any]]) -> set[str]:
    """Close the retired triples (``valid_to`` = the run's time) with a ``retired`` row in
    ``triple_history`` each (nothing is deleted), and refresh ``facts_top`` of their scopes; returns
    those scopes (the caller reloads the knowledge fold and the in-memory facts_top)."""
    if not retired:
        return set()
    frame = pa.Table.from_pylist([{"triple_id": r["triple_id"], "at": r["at"]} for r in retired])
    with registered(con, frame=frame):
        con.execute(
            "CREATE OR REPLACE TEMP TABLE _retired AS SELECT DISTINCT ON (r.triple_id) r.triple_id::UUID "
            "AS triple_id, r.at FROM frame r JOIN triples t ON t.triple_id = r.triple_id::UUID "
            "WHERE t.valid_to IS NULL ORDER BY r.triple_id, r.at"
        )
    con.execute(
        "INSERT INTO triple_history SELECT (SELECT coalesce(max(ordinal) + 1, 0) FROM triple_history) "
        "+ row_number() OVER (ORDER BY r.at, r.triple_id) - 1, r.triple_id, 'retired', "
        "coalesce(t.last_evidence, t.evidence), r.at, t.count, t.confidence "
        "FROM _retired r JOIN triples t USING (triple_id)"
    )
    con.execute("UPDATE triples SET valid_to = r.at FROM _retired r WHERE triples.triple_id = r.triple_id")
    scopes = {
        s
        for (s,) in con.execute(
            "SELECT DISTINCT t.scope FROM _retired r JOIN triples t USING (triple_id) ORDER BY 1"
        ).fetchall()
    }
    con.execute("DROP TABLE _retired")
    refresh_facts_top(con, sorted(scopes))
    return scopes


_UNIT_FIELDS = attrgetter(
    "agent",
    "outcome",
    "user_interaction",
    "perception",
    "summary",
    "action",
    "tools",
    "objects",
    "domains",
    "mode",
    "run_id",
)


def _message_topics(
    ix: Any,
    live: np.ndarray,
    agent: pa.Array,
    mode: pa.Array,
    tools: pa.ListArray,
    objects: pa.ListArray,
    domains: pa.ListArray,
) -> tuple[pa.ListArray, pa.ListArray]:
    """Objects and domains for abstraction (the live rows'), with those of chat messages filled in: a
    conversation message with no tool, object or domain gets its most specific recurring words
    (``dreaming.message_keys``, over its agent's live messages, against every agent's) as objects and
    its session as domain,
    so a topic that comes back across sessions is abstracted like a key seen across domains."""

    def empty(lists: pa.ListArray) -> np.ndarray:
        return pc.fill_null(pc.list_value_length(lists), 0).to_numpy(zero_copy_only=False) == 0

    message = pc.fill_null(pc.equal(mode, "conversation"), False).to_numpy(zero_copy_only=False)
    found = np.flatnonzero(message & empty(tools) & empty(objects) & empty(domains))
    if not len(found):
        return objects, domains
    units = ix.units
    rows: dict[str, list[int]] = {}
    for i, a in zip(found.tolist(), agent.take(pa.array(found)).to_pylist(), strict=True):
        rows.setdefault(a, []).append(i)
    perception = {i: units[r].perception for i, r in zip(found.tolist(), live[found].tolist(), strict=True)}
    shared: dict[str, int] = {}  # word -> how many agents' messages use it
    for a in rows:
        for w in set(chain.from_iterable(content_words(perception[i]) for i in rows[a])):
            shared[w] = shared.get(w, 0) + 1
    changed: list[int] = []
    new_objects: list[list[str]] = []
    new_domains: list[list[str]] = []
    for a in sorted(rows):
        texts = [perception[i] for i in rows[a]]
        for i, keys in zip(rows[a], message_keys(texts, shared=shared, agents=len(rows)), strict=True):
            changed.append(i)
            new_objects.append(keys)
            new_domains.append([session_domain(a, units[int(live[i])].run_id)])
    at = np.arange(len(live), dtype=np.int64)
    at[changed] = len(live) + np.arange(len(changed))
    take = pa.array(at)
    return (
        pa.concat_arrays([objects, pa.array(new_objects, pa.list_(pa.string()))]).take(take),
        pa.concat_arrays([domains, pa.array(new_domains, pa.list_(pa.string()))]).take(take),
    )


def _first_or_empty(lists: pa.ListArray) -> pa.Array:
    """Per row, its list's first value, or "" for an empty (or null) list."""
    lengths = pc.fill_null(pc.list_value_length(lists), 0).to_numpy(zero_copy_only=False).astype(np.int64)
    starts = lists.offsets.to_numpy()[:-1].astype(np.int64) - int(lists.offsets[0].as_py())
    some = np.flatnonzero(lengths > 0)
    firsts = lists.flatten().take(pa.array(starts[some]))
    at = np.full(len(lists), len(some), dtype=np.int64)
    at[some] = np.arange(len(some))
    return pa.concat_arrays([firsts.cast(pa.string()), pa.array([""], pa.string())]).take(pa.array(at))


def session_domain(agent: str, session_id: str) -> str:
    """A conversation session as an abstraction domain: an opaque digest, not its id. Domains travel
    in plaintext on the semantic topic (``TopicView``) and stay in the concepts, where a session id
    (which may carry a user's words) would outlive a forget; co-occurrence needs only their equality.

    >>> session_domain("aga", "s-1") == session_domain("aga", "s-1") != session_domain("agb", "s-1")
    True
    """
    return "session-" + hashlib.blake2b(f"{agent}\x1f{session_id}".encode(), digest_size=8).hexdigest()


def _scope_times(ix: Any, live: np.ndarray, scopes: Mapping[str, datetime]) -> pa.Array:
    """Each live memory's scope's stream time (null for a scope not seen), through the index's scope codes."""
    by_code: list[datetime | None] = [None] * len(ix.scopes)
    for name, code in ix.scopes.items():
        by_code[code] = scopes.get(name)
    return pa.array(by_code, pa.timestamp("us", "UTC")).take(pa.array(ix.scope_code.data[live].astype(np.int64)))


def _index_keys(tools: pa.ListArray, objects: pa.ListArray, first: int = 3) -> pa.ListArray:
    """Per memory, ``[*tools[:first], *objects[:first]]`` (its key index fields, most telling first),
    as an Arrow list column built column-wise."""
    parts, owners = [], []
    for flat in (tools, objects):
        lengths = pc.list_value_length(flat).to_numpy(zero_copy_only=False).astype(np.int64)
        owner = np.repeat(np.arange(len(flat)), lengths)
        kept = np.arange(len(owner)) - np.repeat(np.cumsum(lengths) - lengths, lengths) < first
        parts.append(flat.flatten().filter(pa.array(kept)))
        owners.append(owner[kept])
    owner = np.concatenate(owners)
    order = np.argsort(owner, kind="stable")  # by memory: its tools, then its objects
    offsets = np.concatenate(([0], np.cumsum(np.bincount(owner, minlength=len(tools)))))
    return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), pa.concat_arrays(parts).take(pa.array(order)))


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off for a run, back as it was after. A run over a million
    memories allocates millions of objects (rows, events) while the fold holds millions more, and
    each full collection that triggered would walk all of them (seconds each); a run makes no cycles."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


@functools.cache
def _openblas_threads() -> Any:
    """``openblas_set_num_threads_local`` of the OpenBLAS numpy's wheel loads (``numpy.libs``), or None
    (another BLAS, an older OpenBLAS, another platform: then nothing is limited)."""
    for lib in sorted((Path(np.__file__).parent.parent / "numpy.libs").glob("*openblas*.so*")):
        try:
            setter = ctypes.CDLL(str(lib)).openblas_set_num_threads_local
        except (OSError, AttributeError):
            continue
        setter.restype, setter.argtypes = ctypes.c_int, [ctypes.c_int]
        return setter
    return None


@contextlib.contextmanager
def _blas_single_threaded() -> Iterator[None]:
    """numpy's matrix products on one BLAS thread for a run, as they were after. Dreaming multiplies
    small matrices (tens of observations by hundreds of memories, 1,024 wide); on a busy 2-core machine
    OpenBLAS's threads waiting for each other made each product 10-25x slower than one thread alone
    (``somnus bench e2e``: phase A took 10.5 s of a run's 100,000 events, 63 ms a call). The products
    are the same: signature vectors are multiples of 1/8, so every sum is exact in any order."""
    setter = _openblas_threads()
    if setter is None:
        yield
        return
    before = setter(1)
    try:
        yield
    finally:
        setter(before)


LOG_COLUMNS = ("run_id", "seq", "kind", "memory_id", "decided_at", "body")
_TIMESTAMP = pa.timestamp("us", "UTC")
_FORGET_REASON = {MemoryPruned.__name__: ForgetReason.REMOVED, MemoryCompressed.__name__: ForgetReason.COMPRESSED}


class SleepJob:
    """The sleep clock and the runs, for one memory fold."""

    def __init__(self, con: duckdb.DuckDBPyConnection, max_episodes: Mapping[str, int], config: SleepConfig) -> None:
        self.config = config
        self.max_episodes = dict(max_episodes)
        self.state = load_state(con)
        self.pending_rows: dict[str, list[dict[str, Any]]] = {"sleep_runs": []}
        self.pending_log: list[pa.Table] = []  # lifecycle_log rows (LOG_COLUMNS), a table per run
        self.pending_retired: list[dict[str, Any]] = []  # idle triples retired by the runs: triple_id, at
        self.retired_scopes: set[str] = set()  # scopes whose live facts the last ``write`` retired
        # Runs completed in the batch being written (scheduled or requested): (run_id, at). After the
        # batch commits the projector requests promotion for each (phase 2; ``take_scheduled``), with
        # the topics that run abstracted: a request published before its run could not carry them.
        self.scheduled: list[tuple[str, datetime]] = []
        self._next_fire: tuple[datetime | None, datetime | None] = (None, None)  # (after, the fire time next)
        self._units = UnitColumns()  # the fold's unit fields, read once each (``memory_columns``)

    def due(self, event_time: datetime) -> list[datetime]:
        """Advance the clock to a record's event time; the fire times passed (runs to do first)."""
        last = self.state.clock.last_fired
        if last is not None and self.config.schedule != SCHEDULE_OFF:
            # Most records come before the next fire time: answered without a cron walk per record
            # (it took 1.6 % of the projector's samples in `somnus bench e2e`, py-spy).
            if self._next_fire[0] != last:
                self._next_fire = (last, next_fire(self.config.schedule, last, tz=self.config.schedule_tz))
            upcoming = self._next_fire[1]
            require_aware(event_time, "event_time")
            if upcoming is not None and event_time <= upcoming:
                return []
        clock, due, dropped = advance(self.state.clock, event_time, self.config)
        if dropped:
            log.info("sleep: %d fire times skipped (catch-up limit %d)", dropped, self.config.max_catch_up)
        self.state.clock = clock
        return due

    def run(
        self,
        memory_state: Any,
        at: datetime,
        trigger: SleepTrigger,
        offset: int,
        con: duckdb.DuckDBPyConnection | None = None,
    ) -> list[Any]:
        """Plan and apply one run at ``at``; returns the MemoryForgotten events it applied. With ``con``
        (the batch's transaction), the live triples are read for fact retirement."""
        with _collector_paused(), _blas_single_threaded():
            return self._run(memory_state, at, trigger, offset, con)

    def observe(self, units: Sequence[Any], record_time: datetime | None) -> None:
        """Advance the stream times of the units' scopes (call after the runs the record makes due)."""
        observe_scopes(self.state.scopes, units, record_time, self.config.max_clock_skew_s)
        note_captured(self.state.captured, units, self.config.dream_observations_per_agent)

    def _run(
        self, memory_state: Any, at: datetime, trigger: SleepTrigger, offset: int, con: duckdb.DuckDBPyConnection | None
    ) -> list[Any]:
        frame, edges = memory_columns(memory_state, self.state.scopes, self._units)
        triples = live_triples(con) if con is not None and self.config.fact_retire_days > 0 else None
        captured = [m for agent in sorted(self.state.captured) for _, m in self.state.captured[agent]]
        plan = plan_sleep(
            dream_inputs(
                memory_state,
                frame,
                edges,
                self.state.watermark,
                self.config,
                captured=captured,
                max_episodes=self.max_episodes,
                triples=triples,
                scope_times=dict(self.state.scopes),
                fiedler_history=tuple(self.state.fiedler_history),
                patterns=frozenset(self.state.patterns),
            ),
            now=at,
            trigger=trigger,
            watermark=self.state.watermark,
            config=self.config,
            input_offset=offset,
        )
        if plan is None:
            return []
        # The run's lifecycle rows, as columns (no event object per decision: a run over a million
        # memories decides millions); every event of a run has its run_id and time.
        events = plan.encoded()
        n = len(events.seq)
        self.pending_log.append(
            pa.table(
                {
                    "run_id": pa.repeat(pa.scalar(plan.run_id, pa.string()), n),
                    "seq": events.seq,
                    "kind": events.kind,
                    "memory_id": events.memory_id,
                    "decided_at": pa.repeat(pa.scalar(plan.at, _TIMESTAMP), n),
                    "body": events.body,
                }
            )
        )
        # The prunings and compressions, in seq order, applied to the index as MemoryForgotten events.
        gone = pc.is_in(events.kind, value_set=pa.array(list(_FORGET_REASON), pa.string()))
        forgotten = forget_all(
            memory_state,
            zip(
                events.memory_id.filter(gone).to_pylist(),
                map(_FORGET_REASON.__getitem__, events.kind.filter(gone).to_pylist()),
            ),
            at,
        )
        apply_all(memory_state, forgotten)
        retired = pc.equal(events.kind, TripleRetired.__name__)
        for body in events.body.filter(retired).to_pylist():
            ev = decode_lifecycle(body.encode())
            if isinstance(ev, TripleRetired) and ev.reason is RetireReason.IDLE:
                self.pending_retired.append({"triple_id": ev.triple_id, "at": ev.at, "run_id": ev.run_id})
        if pc.any(pc.equal(events.kind, SleepCompleted.__name__)).as_py():
            r = plan.report  # the SleepCompleted event's report, at and watermark are the plan's
            self.pending_rows["sleep_runs"].append(
                {
                    "run_id": plan.run_id,
                    "run_at": plan.at,
                    "trigger": trigger.value,
                    "memories_before": r.memories_before,
                    "memories_after": r.memories_after,
                    "kept": r.kept,
                    "compressed": r.compressed,
                    "pruned": r.pruned,
                    "protected": r.protected,
                    "rescored": r.rescored,
                    "bytes_before": r.bytes_before,
                    "bytes_after": r.bytes_after,
                    "fiedler": r.fiedler.largest_component,
                    "report": msgspec.json.encode(r).decode(),
                }
            )
            self.state.watermark = plan.at
            self.state.captured = {}  # routed by this run's phase A
            self.scheduled.append((plan.run_id, plan.at))
            self.state.fiedler_history = [*self.state.fiedler_history, float(r.fiedler.largest_component)][-50:]
            abstracted = pc.equal(events.kind, PatternAbstracted.__name__)
            new = [
                cast(PatternAbstracted, decode_lifecycle(b.encode())).pattern_id
                for b in events.body.filter(abstracted).to_pylist()
            ]
            if new:
                self.state.patterns = sorted({*self.state.patterns, *new})
        return forgotten

    def write(self, con: duckdb.DuckDBPyConnection) -> None:
        """Write the runs' rows and the clock (caller's transaction)."""
        if self.pending_log:
            with registered(con, log_frame=pa.concat_tables(self.pending_log)):
                con.execute(
                    "INSERT INTO lifecycle_log SELECT run_id, seq, kind, memory_id, decided_at, body::JSON "
                    "FROM log_frame"
                )
        self.pending_log.clear()
        self.retired_scopes = retire_facts(con, self.pending_retired)
        self.pending_retired.clear()
        rows = self.pending_rows["sleep_runs"]
        if rows:
            with registered(con, frame=pa.Table.from_pylist(rows)):
                con.execute("INSERT INTO sleep_runs SELECT * EXCLUDE (report), report::JSON FROM frame")
        rows.clear()
        con.execute("INSERT OR REPLACE INTO sleep_state VALUES (1, ?)", [msgspec.json.encode(self.state).decode()])

    def reload(self, con: duckdb.DuckDBPyConnection) -> None:
        self.state = load_state(con)
        for rows in self.pending_rows.values():
            rows.clear()
        self.pending_log.clear()
        self.pending_retired.clear()
        self.retired_scopes = set()
        self.scheduled.clear()

    def take_scheduled(self) -> list[tuple[str, datetime]]:
        """The runs committed since the last call, scheduled or requested (call after the batch commits)."""
        runs, self.scheduled = self.scheduled, []
        return runs
