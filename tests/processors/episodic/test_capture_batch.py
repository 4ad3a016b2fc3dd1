"""somnus.processors.episodic.capture / memory_index: the batched fold (``forget_all``, ``apply_all``, ``MemoryIndex.remove_many``,
``drop_edges_many``) leaves exactly the state the event-by-event fold leaves (a sleep run forgets a million
memories at once)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import msgspec
import numpy as np
from hypothesis import example, given, settings
from hypothesis import strategies as st

from somnus.processors.episodic.capture import MemoryState, apply, apply_all, capture, forget, forget_all
from somnus.schemas.memory import (
    MEMORY_SCHEMA_VERSION,
    ForgetReason,
    MemoryAccessed,
    MemoryEvent,
    MemoryForgotten,
    MemoryKind,
    MemoryLinked,
    MemoryUnit,
)

T0 = datetime(2024, 5, 15, 9, 0, tzinfo=timezone.utc)
WORDS = ["deploy", "billing", "helm", "timeout", "invoice", "retry", "staging", "refund"]


def build(
    spec: list[tuple[list[int], int, int, str]], links: list[tuple[int, int, float]], band_buffer: int | None = None
) -> MemoryState:
    """A fold of units (words, run, position, agent), then extra edges between stored memories;
    ``band_buffer``: the LSH's buffer size in band keys (small: many segments)."""
    units = [
        MemoryUnit(
            memory_id=f"m{k}",
            kind=MemoryKind.EPISODE,
            agent=agent,
            scope=f"agent:{agent}",
            run_id=f"r{run}",
            position=position,
            occurred_at=T0 + timedelta(minutes=7 * k),
            perception=" ".join(WORDS[w] for w in words),
            outcome="failure",
            success=False,
        )
        for k, (words, run, position, agent) in enumerate(spec)
    ]
    state = MemoryState()
    if band_buffer is not None:
        state.index.bands.buffer_keys = band_buffer
    capture(state, units, T0 + timedelta(days=1))
    ids = state.index.ids
    for a, b, w in links:
        if ids and a % len(ids) != b % len(ids):
            x, y = sorted((ids[a % len(ids)], ids[b % len(ids)]))
            apply(
                state,
                MemoryLinked(
                    schema_version=MEMORY_SCHEMA_VERSION,
                    a=x,
                    b=y,
                    weight=w,
                    shared=0.0,
                    goal=0.0,
                    temporal=0.0,
                    similarity=0.5,
                    formed_at=T0,
                ),
            )
    return state


def snapshot(state: MemoryState) -> tuple[Any, ...]:
    """Everything the fold holds, orders included (dicts keep insertion order)."""
    ix = state.index
    n = len(ix.ids)
    columns = tuple(col.data[:n].tobytes() for col in ix._rows)
    per = tuple(col.data.tobytes() for col in (ix.run_len, ix.run_live, ix.scope_live, ix.scope_len, ix.scope_runs))
    graph = [(a, list(nbrs.items())) for a, nbrs in ix.graph.items()]
    return (
        columns,
        per,
        graph,
        [list(m) for m in ix.run_members],
        ix.live,
        ix.live_len,
        list(ix.ids),
        dict(state.last_stored),
        len(ix.postings),
        _live_bands(ix),
    )


def _live_bands(ix: Any) -> list[tuple[int, int]]:
    """The LSH's (band key, memory) pairs of live memories, whatever the layout: a batch of removals
    drops the dead ones' keys at once, one removal leaves them to the next merge."""
    alive = ix.alive.data
    pairs = [(k, i) for keys, idx in ix.bands.segments for k, i in zip(keys.tolist(), idx.tolist()) if alive[i]]
    return sorted(pairs + [(k, i) for k, run in ix.bands.buffer.items() for i in run if alive[i]])


unit_spec = st.tuples(
    st.lists(st.integers(0, len(WORDS) - 1), min_size=2, max_size=6),
    st.integers(0, 5),
    st.integers(0, 4),
    st.sampled_from(["a", "b"]),
)
link_spec = st.tuples(st.integers(0, 40), st.integers(0, 40), st.floats(0.01, 1.0))
forget_spec = st.tuples(st.integers(0, 45), st.sampled_from([ForgetReason.REMOVED, ForgetReason.COMPRESSED]))


@settings(max_examples=60, deadline=None)
@given(
    st.lists(unit_spec, min_size=1, max_size=30),
    st.lists(link_spec, max_size=40),
    st.lists(forget_spec, max_size=40),
    st.lists(st.integers(0, 45), max_size=5),
)
def test_forget_all_and_apply_all_fold_like_forget_and_apply_one_by_one(spec, links, gone, accessed):
    one, batched = build(spec, links), build(spec, links)
    assert snapshot(one) == snapshot(batched)
    ids = one.index.ids
    pairs = [(ids[k] if k < len(ids) else f"unknown{k}", reason) for k, reason in gone]
    expected: list[MemoryEvent] = [ev for mid, reason in pairs for ev in forget(one, mid, reason, T0)]
    events = forget_all(batched, pairs, T0)
    assert events == expected
    # Other events between the forgetting ones end a batch: the order of the fold is kept.
    for k, at in enumerate(accessed):
        if ids:
            access = MemoryAccessed(
                schema_version=MEMORY_SCHEMA_VERSION,
                memory_id=ids[at % len(ids)],
                agent="a",
                query="q",
                rank=1,
                score=1.0,
                accessed_at=T0 + timedelta(hours=k),
            )
            events.insert(min(at, len(events)), access)
    for ev in events:
        apply(one, ev)
    apply_all(batched, events)
    assert snapshot(one) == snapshot(batched)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(unit_spec, min_size=1, max_size=30),
    st.lists(link_spec, max_size=60),
    st.lists(st.integers(0, 40), max_size=40),
)
def test_remove_many_and_drop_edges_many_are_remove_and_drop_edges_in_order(spec, links, rows):
    for method, batch in (("remove", "remove_many"), ("drop_edges", "drop_edges_many")):
        one, batched = build(spec, links), build(spec, links)
        n = len(one.index.ids)
        picked = [r % n for r in rows]  # repeats included: the second time is a no-op
        for r in picked:
            getattr(one.index, method)(r)
        getattr(batched.index, batch)(np.asarray(picked, dtype=np.int64) if batch == "remove_many" else picked)
        assert snapshot(one) == snapshot(batched), method


def test_a_batch_of_one_reason_at_a_time():
    state = build([([0, 1, 2], 0, 0, "a"), ([0, 1, 3], 0, 1, "a"), ([0, 1, 2, 3], 1, 0, "a")], [(0, 1, 0.5)])
    ids = state.index.ids
    events = forget_all(state, [(ids[0], ForgetReason.COMPRESSED), (ids[-1], ForgetReason.REMOVED)], T0)
    assert [type(e) for e in events] == [MemoryForgotten, MemoryForgotten]
    apply_all(state, events)
    ix = state.index
    assert ix.compressed.data[0] and ix.alive.data[0] and not ix.alive.data[len(ids) - 1]
    assert 0 not in ix.graph


def _full_order(ix: Any, sig: np.ndarray, codes: list[int], newest: int | None = None) -> tuple[list[int], list[float]]:
    """The candidates as a plain sort would give them: all live in ``codes`` (only the ``newest`` highest
    if given) and banded, most equal hash values first, ties older first. From first principles: every
    live memory's signature is compared, the LSH's buckets are not read."""
    cands = [c for c in range(len(ix.ids)) if ix.live_scope.data[c] in codes]
    if not cands:
        return [], []
    same, banded = ix.scheme.match(ix.signatures.data[cands], sig)
    kept = [(int(s), c) for c, s, b in zip(cands, same.tolist(), banded.tolist()) if b]
    if newest is not None:
        kept = kept[-newest:]  # (64-bit band key collisions aside: the LSH's candidates are the banded ones)
    kept.sort(key=lambda sc: (-sc[0], sc[1]))
    return [c for _, c in kept], [s / ix.config.num_perm for s, _ in kept]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.lists(st.integers(0, 3), min_size=1, max_size=3),
            st.integers(0, 5),
            st.integers(0, 4),
            st.sampled_from(["a", "b"]),
        ),
        min_size=1,
        max_size=80,
    ),
    st.integers(0, 79),
    st.integers(1, 8),
    st.lists(st.integers(0, 80), max_size=10),
    st.sampled_from([0, 10**9]),
    st.sampled_from([0, 1024]),
)
def test_similar_top_k_and_bitmap_dedupe_equal_the_full_sort(spec, query_of, top, gone, ratio, by_sort):
    # _similar dedupes candidates with a bitmap when they are many (ratio 10**9: always; 0: never, a
    # sort) and takes the first ``top`` of a whole sort when they are few (by_sort 1024), else selects
    # them without sorting them all (by_sort 0): the result must be the plain full sort's, ties older
    # first.
    import somnus.processors.episodic.index as mi

    old, mi.BITMAP_DEDUPE_RATIO = mi.BITMAP_DEDUPE_RATIO, ratio
    old_by_sort, mi.TOP_BY_SORT = mi.TOP_BY_SORT, by_sort
    try:
        _check_similar(spec, query_of, top, gone)
    finally:
        mi.BITMAP_DEDUPE_RATIO = old
        mi.TOP_BY_SORT = old_by_sort


def _check_similar(spec: Any, query_of: int, top: int, gone: list[int]) -> None:
    # Few words, failures (always stored): many memories share a text, so ties run past ``top``.
    state = build(spec, [])
    ix = state.index
    twin = query_of % len(ix.ids)
    for g in gone:  # some removed: -1 in live_scope, still in the band postings
        if g % len(ix.ids) != twin and ix.alive.data[g % len(ix.ids)]:
            ix.remove(g % len(ix.ids))
    query = msgspec.structs.replace(ix.units[twin], memory_id="query")
    an = ix._analyse(query)
    for codes in ([ix.scopes[query.scope]], sorted(ix.scopes.values())):
        want_c, want_s = _full_order(ix, an.sig, codes)
        got_c, got_s = ix._similar(an.sig, an.band_base, codes)
        assert (got_c.tolist(), got_s.tolist()) == (want_c, want_s)
        got_c, got_s = ix._similar(an.sig, an.band_base, codes, top)
        assert (got_c.tolist(), got_s.tolist()) == (want_c[:top], want_s[:top])
    assert twin in want_c  # its twin at least


@settings(max_examples=80, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.lists(st.integers(0, 3), min_size=1, max_size=3),
            st.integers(0, 5),
            st.integers(0, 4),
            st.sampled_from(["a", "b"]),
        ),
        min_size=1,
        max_size=80,
    ),
    st.integers(0, 79),
    st.integers(1, 12),
    st.lists(st.integers(0, 80), max_size=25),
    st.sampled_from([14, 28, 70, 1 << 11]),
    st.sampled_from([None, 5]),
    st.booleans(),
)
@example([([0, 1], 0, 0, "a")] * 30, 0, 5, [27, 28], 1 << 11, None, False)  # dead in a run's tail: it widens
@example([([0, 1], 0, 0, "a")] * 30, 0, 5, [27, 28, 20], 14 * 8, 5, False)  # the same in segments
def test_newest_candidates_equal_a_brute_force_search_of_the_newest(
    spec, query_of, newest, gone, band_buffer, top, batched
):
    # Capture's bounded search reads the LSH newest first and only the tails of the buckets' runs;
    # whatever the segments' layout (band_buffer: from one band key per segment's worth to all in the
    # dict buffer) and however many are dead (removed one by one: their keys stay until a merge; in a
    # batch: dropped at once), it must compare exactly the ``newest`` highest live candidates in the
    # scopes, as a search of all of them cut to the newest does.
    state = build(spec, [], band_buffer)
    ix = state.index
    twin = query_of % len(ix.ids)
    if batched:
        ix.remove_many([g % len(ix.ids) for g in gone])
    else:
        for g in gone:
            if ix.alive.data[g % len(ix.ids)]:
                ix.remove(g % len(ix.ids))
    query = msgspec.structs.replace(ix.units[twin], memory_id="query")
    an = ix._analyse(query)
    import somnus.processors.episodic.index as mi

    for codes in ([ix.scopes[query.scope]], sorted(ix.scopes.values())):
        want_c, want_s = _full_order(ix, an.sig, codes, newest)
        for ratio, by_sort in ((mi.BITMAP_DEDUPE_RATIO, mi.TOP_BY_SORT), (0, 0), (10**9, 0)):
            # both ways of deduplicating (a sort, a bitmap), and of taking the first ``top``
            old = mi.BITMAP_DEDUPE_RATIO, mi.TOP_BY_SORT
            mi.BITMAP_DEDUPE_RATIO, mi.TOP_BY_SORT = ratio, by_sort
            try:
                got_c, got_s = ix._similar(an.sig, an.band_base, codes, top, newest)
            finally:
                mi.BITMAP_DEDUPE_RATIO, mi.TOP_BY_SORT = old
            assert (got_c.tolist(), got_s.tolist()) == (want_c[:top], want_s[:top])


def test_capture_compares_only_the_newest_candidates():
    # Twelve identical failures (always stored): with a bound of 4, a thirteenth is compared with the
    # 4 newest, so its associations are among those 4; unbounded, ties go to the oldest.
    from somnus.processors.episodic.index import IndexConfig

    units = [
        MemoryUnit(
            memory_id=f"m{k}",
            kind=MemoryKind.EPISODE,
            agent="a",
            scope="agent:a",
            run_id="r0",
            position=k,
            occurred_at=T0 + timedelta(minutes=k),
            perception="deploy billing helm",
            outcome="failure",
            success=False,
        )
        for k in range(13)
    ]
    picked = {}
    for bound in (4, None):
        state = MemoryState.empty(IndexConfig(capture_candidates=bound))
        _, decisions = capture(state, units, T0 + timedelta(days=1))
        links = [d for d in decisions if isinstance(d, MemoryLinked) and "m12" in (d.a, d.b)]
        picked[bound] = sorted({d.a if d.b == "m12" else d.b for d in links})
    assert picked[4] == ["m10", "m11", "m8", "m9"]
    assert picked[None] == ["m0", "m1", "m2", "m3", "m4"]  # ASSOCIATION_LIMIT 5, ties older first


@settings(max_examples=40, deadline=None)
@given(st.lists(unit_spec, min_size=1, max_size=30), st.integers(1, 5))
def test_units_prepared_ahead_are_captured_as_when_each_record_prepares_its_own(spec, per_record):
    """The projector prepares every record of its batch at once (MemoryIndex.prepare); capture then
    analyses nothing again, and decides what it decides record by record."""
    units = [
        MemoryUnit(
            memory_id=f"m{k}",
            kind=MemoryKind.EPISODE,
            agent=agent,
            scope=f"agent:{agent}",
            run_id=f"r{run}",
            position=position,
            occurred_at=T0 + timedelta(minutes=7 * k),
            perception=" ".join(WORDS[w] for w in words),
            outcome="failure",
            success=False,
        )
        for k, (words, run, position, agent) in enumerate(spec)
    ]
    records = [units[i : i + per_record] for i in range(0, len(units), per_record)]
    alone, ahead = MemoryState(), MemoryState()
    alone_events = [ev for rec in records for ev in capture(alone, rec, T0 + timedelta(days=1))[1]]
    ahead.index.prepare(units)
    assert ahead.index.prepared(units) and not ahead.index.prepared([msgspec.structs.replace(units[0])])
    ahead_events = [ev for rec in records for ev in capture(ahead, rec, T0 + timedelta(days=1))[1]]
    assert ahead.index.prepared(units)  # left prepared for the caller's next records
    ahead.index.prepare(())
    assert msgspec.json.encode(ahead_events) == msgspec.json.encode(alone_events)
    assert snapshot(ahead) == snapshot(alone)
