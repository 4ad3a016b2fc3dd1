"""somnus.projections.sleep: ``memory_columns`` with the unit columns a ``SleepJob`` keeps from run to
run (``UnitColumns``, extended by the units captured since) gives what the earlier code, which read
every live unit each run, gave (kept here as the reference): on tool traces and chat messages
(whose objects and domains are filled in), as the fold grows and forgets between runs."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime, timedelta
from itertools import chain
from typing import Any, cast

import numpy as np
import orjson
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from somnus.importers import locomo
from somnus.processors.episodic.capture import apply, capture, episode_unit, forget, message_units
from somnus.processors.sessions.distiller import distill
from somnus.processors.sleep.dreaming import message_keys
from somnus.processors.working.session_buffer import content_words
from somnus.projections.memory import new_state
from somnus.projections.sleep import UnitColumns, _scope_times, memory_columns, session_domain
from somnus.sample import generate
from somnus.schemas.codec import decode_trace
from somnus.schemas.memory import ForgetReason
from tests.projections.test_sleep_conversation import _conversation

_FIELDS = ("agent", "outcome", "user_interaction", "perception", "summary", "action", "tools", "objects")
_MORE = ("domains", "mode", "run_id")


def _previous_topics(
    agent: Sequence[str],
    perception: Sequence[str],
    tools: Sequence[list[str]],
    objects: Sequence[list[str]],
    domains: Sequence[list[str]],
    mode: Sequence[str],
    run: Sequence[str],
) -> tuple[Sequence[list[str]], Sequence[list[str]]]:
    rows: dict[str, list[int]] = {}
    for i, (a, md, t, o, d) in enumerate(zip(agent, mode, tools, objects, domains, strict=True)):
        if md == "conversation" and not (t or o or d):
            rows.setdefault(a, []).append(i)
    if not rows:
        return objects, domains
    objects, domains = list(objects), list(domains)
    shared: dict[str, int] = {}
    for a in rows:
        for w in set(chain.from_iterable(content_words(perception[i]) for i in rows[a])):
            shared[w] = shared.get(w, 0) + 1
    for a in sorted(rows):
        texts = [perception[i] for i in rows[a]]
        for i, keys in zip(rows[a], message_keys(texts, shared=shared, agents=len(rows)), strict=True):
            objects[i], domains[i] = keys, [session_domain(a, run[i])]
    return objects, domains


def _previous_index_keys(tools: Sequence[list[str]], objects: Sequence[list[str]], first: int = 3) -> pa.ListArray:
    parts, owners = [], []
    for lists in (tools, objects):
        flat = pa.array(lists, pa.list_(pa.string()))
        lengths = pc.list_value_length(flat).to_numpy(zero_copy_only=False).astype(np.int64)
        owner = np.repeat(np.arange(len(lists)), lengths)
        kept = np.arange(len(owner)) - np.repeat(np.cumsum(lengths) - lengths, lengths) < first
        parts.append(flat.flatten().filter(pa.array(kept)))
        owners.append(owner[kept])
    owner = np.concatenate(owners)
    order = np.argsort(owner, kind="stable")
    offsets = np.concatenate(([0], np.cumsum(np.bincount(owner, minlength=len(tools)))))
    return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), pa.concat_arrays(parts).take(pa.array(order)))


def _previous_memory_columns(state: Any, scopes: dict[str, datetime] | None) -> pl.DataFrame:
    """The earlier ``memory_columns`` (its frame; the edges are unchanged), every live unit read."""
    ix = state.index
    n = len(ix.ids)
    live = np.flatnonzero(ix.alive.data[:n])
    units = [ix.units[i] for i in live.tolist()]
    ids = pa.array(ix.ids, pa.string())
    degree = np.zeros(n, dtype=np.int64)
    for node, nbrs in ix.graph.items():
        if 0 <= node < n:
            degree[node] = len(nbrs)
    last = ix.last_access.data[live]
    m = len(units)
    fields = [[getattr(u, f) for u in units] for f in _FIELDS + _MORE]
    agent, outcome, user, perception, summary, action, tools, objects, domains, mode, run = fields
    topic_objects, topic_domains = _previous_topics(agent, perception, tools, objects, domains, mode, run)
    size = [len(p) + len(s) + len(a) + 200 for p, s, a in zip(perception, summary, action, strict=True)]
    return cast(
        pl.DataFrame,
        pl.from_arrow(
            pa.table(
                {
                    "memory_id": ids.take(pa.array(live)),
                    "agent": pa.array(agent, pa.string()),
                    "layer": pa.array(["hippocampus"] * m, pa.string()),
                    "created_at": pa.array((ix.occurred.data[live] * 1e6).astype(np.int64), pa.timestamp("us", "UTC")),
                    "last_access": pa.array((last * 1e6).astype(np.int64), pa.timestamp("us", "UTC"), mask=~(last > 0)),
                    "access_count": pa.array(ix.access_count.data[live].astype(np.int64)),
                    "importance": pa.array(ix.importance.data[live]),
                    "outcome": pa.array(outcome, pa.string()),
                    "is_user_interaction": pa.array(user, pa.bool_()),
                    "edge_count": pa.array(degree[live]),
                    "size_bytes": pa.array(np.array(size, dtype=np.int64)),
                    "long_term": pa.array(ix.long_term.data[live]),
                    "compressed": pa.array(ix.compressed.data[live]),
                    "index_keys": _previous_index_keys(tools, topic_objects),
                    "domain": pa.array([d[0] if d else "" for d in topic_domains], pa.string()),
                    **({"stream_time": _scope_times(ix, live, scopes)} if scopes is not None else {}),
                }
            )
        ),
    )


def _units(tmp_path: Any) -> tuple[list[Any], list[Any]]:
    events = [decode_trace(orjson.dumps(e), 1 << 20) for e in generate(sessions=400, seed=11)]
    traces = [episode_unit(ep) for ep in distill({}, events).episodes]
    path = tmp_path / "conv.json"
    path.write_text(json.dumps([_conversation(3), _conversation(4)]))
    messages = message_units([decode_trace(orjson.dumps(e), 1 << 20) for e in locomo(path)])
    return traces, messages


def test_kept_unit_columns_give_the_previous_columns(tmp_path: Any) -> None:
    traces, messages = _units(tmp_path)
    assert traces and messages
    state = new_state()
    kept = UnitColumns()
    batches = [traces[: len(traces) // 2], messages[: len(messages) // 2], traces[len(traces) // 2 :]]
    batches.append(messages[len(messages) // 2 :])
    seen_messages = 0
    for k, batch in enumerate(batches):
        at = max(u.occurred_at for u in batch)
        capture(state, batch, at)
        ix = state.index
        for i in range(k, len(ix.ids), 9):  # some forgotten between runs
            if ix.alive.data[i]:
                for ev in forget(state, ix.ids[i], ForgetReason.REMOVED, at):
                    apply(state, ev)
        scopes = {u.scope: at - timedelta(hours=k) for u in batch}
        for scoped in (None, scopes):
            want = _previous_memory_columns(state, scoped)
            frame, edges = memory_columns(state, scoped, kept)
            fresh, fresh_edges = memory_columns(state, scoped)
            assert frame.equals(want) and frame.schema == want.schema, k
            assert fresh.equals(want) and fresh_edges.equals(edges)
        seen_messages += int((frame["domain"].str.starts_with("session-")).sum())
        assert kept.n == len(ix.units) and 0 < frame.height < len(ix.units)  # some forgotten
    assert seen_messages  # chat messages had their objects and domains filled in
    other = new_state()
    capture(other, traces[:50], max(u.occurred_at for u in traces[:50]))
    frame, _ = memory_columns(other, None, kept)  # another index: read anew
    assert frame.equals(_previous_memory_columns(other, None)) and kept.n == len(other.index.units)
