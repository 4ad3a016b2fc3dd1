"""somnus.processors.episodic.index.MemoryIndex on its own: the multi-key index, user and key masks,
LSH candidates against a brute-force oracle, removal (one and batched) and the determinism of every
order it returns. Recall's scoring over the index is tested in test_recall.py."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from somnus.processors.episodic import index as index_module
from somnus.processors.episodic.index import MemoryIndex, tokenize
from somnus.schemas.memory import MemoryKind, MemoryUnit

T0 = datetime(2024, 5, 15, 9, 0, tzinfo=timezone.utc)
WORDS = [
    "book",
    "flight",
    "paris",
    "refund",
    "invoice",
    "timeout",
    "host",
    "retry",
    "seat",
    "lisbon",
    "upgrade",
    "cancel",
]


def unit(
    mid: str,
    text: str = "book a flight to paris",
    *,
    agent: str = "a",
    scope: str | None = None,
    run: str = "r1",
    position: int = 0,
    at: datetime = T0,
    **kw: Any,
) -> MemoryUnit:
    return MemoryUnit(
        memory_id=mid,
        kind=kw.pop("kind", MemoryKind.EPISODE),
        agent=agent,
        scope=scope or f"agent:{agent}",
        run_id=run,
        position=position,
        occurred_at=at,
        perception=text,
        **kw,
    )


def brute_force_lsh(idx: MemoryIndex, sig: np.ndarray, scopes: set[str]) -> set[int]:
    """The LSH's definition: live memories in ``scopes`` with some band of ``rows`` hash values wholly
    equal to the query's."""
    s = idx.scheme
    out = set()
    for i, u in enumerate(idx.units):
        if not idx.alive.data[i] or u.scope not in scopes:
            continue
        eq = idx.signatures.data[i][: s.width] == sig[: s.width]
        if eq.reshape(s.bands, s.rows).all(axis=1).any():
            out.add(i)
    return out


# ---- the multi-key index ---------------------------------------------------------------------------


def test_lookup_by_every_key_in_capture_order_with_values_normalised() -> None:
    idx = MemoryIndex()
    idx.add(
        unit(
            "m1",
            goal="Book  A Flight",
            tools=["book_reservation", "search"],
            objects=["API.x.io"],
            people=["Ana Lima"],
            domains=["Travel"],
            mode="tool_use",
            success=True,
            run="s1",
        )
    )
    idx.add(
        unit("m2", "refund the invoice", tools=["search"], success=False, run="s2", kind=MemoryKind.MESSAGE, position=3)
    )
    idx.add(unit("m3", "cancel the seat", agent="b", tools=["search"], success=True, run="s3"))
    assert idx.lookup("tool", "search") == ["m1", "m2", "m3"]
    assert idx.lookup("tool", "book_reservation") == ["m1"]
    assert idx.lookup("goal", "book a   FLIGHT") == ["m1"]  # case and spaces folded
    assert idx.lookup("object", "api.X.IO") == ["m1"]
    assert idx.lookup("person", "ANA LIMA") == ["m1"]
    assert idx.lookup("domain", "travel") == ["m1"]
    assert idx.lookup("mode", "tool_use") == ["m1"]
    assert idx.lookup("success", True) == ["m1", "m3"]  # type: ignore[arg-type]
    assert idx.lookup("success", "false") == ["m2"]
    assert idx.lookup("run", "s2") == ["m2"]
    assert idx.lookup("agent", "b") == ["m3"]
    assert idx.lookup("kind", "episode") == ["m1", "m3"]
    assert idx.lookup("tool", "nothing") == []
    with pytest.raises(KeyError, match="unknown key 'colour'"):
        idx.lookup("colour", "red")


def test_key_mask_is_and_across_keys_and_or_within_a_list() -> None:
    idx = MemoryIndex()
    for n, (tool, ok) in enumerate([("a", True), ("a", False), ("b", True), ("c", True)]):
        idx.add(unit(f"m{n}", tools=[tool], success=ok, run=f"s{n}"))
    assert idx.key_mask({}) is None
    assert idx.key_mask({"tool": "a"}).tolist() == [True, True, False, False]
    assert idx.key_mask({"tool": ["a", "b"], "success": True}).tolist() == [True, False, True, False]
    assert idx.key_mask({"tool": "zzz"}).tolist() == [False] * 4


def test_user_mask_shows_memories_of_no_user_and_the_readers_own() -> None:
    idx = MemoryIndex()
    for n, user in enumerate([None, "u1", "u2", "u1", None]):
        idx.add(unit(f"m{n}", user_id=user, run=f"s{n}"))
    assert idx.user_mask(None).tolist() == [True, False, False, False, True]
    assert idx.user_mask("u1").tolist() == [True, True, False, True, True]
    assert idx.user_mask("u2").tolist() == [True, False, True, False, True]
    assert idx.user_mask("stranger").tolist() == [True, False, False, False, True]


def test_a_memory_id_is_indexed_once() -> None:
    idx = MemoryIndex()
    idx.add(unit("m1"))
    with pytest.raises(ValueError, match="m1 is already indexed"):
        idx.add(unit("m1", "other text"))
    assert len(idx) == 1 and idx.ids == ["m1"]


def test_tokenize_keeps_identifiers_whole_and_drops_stop_words() -> None:
    assert tokenize("Booked HAT030 via api.x.io, didn't it?") == ["booked", "hat030", "via", "api.x.io"]
    assert tokenize("call book_reservation on D1:3") == ["call", "book_reservation", "d1:3"]
    assert tokenize("") == [] and tokenize("the and of") == []


# ---- LSH candidates --------------------------------------------------------------------------------


def test_an_identical_situation_is_found_with_similarity_one_and_only_in_the_scopes_asked() -> None:
    idx = MemoryIndex()
    idx.add(unit("m1", "refund the invoice after a timeout", run="s1"))
    idx.add(unit("m2", "refund the invoice after a timeout", agent="b", run="s2"))
    idx.add(unit("m3", "upgrade the seat to lisbon", run="s3"))
    probe = unit("q", "refund the invoice after a timeout", run="s9")
    got = idx.similar(probe)
    assert got[:2] == [(0, 1.0), (1, 1.0)]  # ties: older first
    assert [i for i, _ in idx.similar(probe, ["agent:b"])] == [1]
    assert idx.similar(probe, ["agent:nobody"]) == []
    assert idx.similar(probe, []) == []


texts = st.lists(st.sampled_from(WORDS), min_size=1, max_size=6).map(" ".join)


@st.composite
def corpora(draw: Any) -> tuple[list[MemoryUnit], list[int], str]:
    n = draw(st.integers(1, 25))
    units = [
        unit(
            f"m{k}",
            draw(texts),
            agent=draw(st.sampled_from("ab")),
            run=f"s{draw(st.integers(0, 4))}",
            position=k,
            at=T0 + timedelta(days=draw(st.integers(0, 20))),
            tools=draw(st.lists(st.sampled_from(["search", "refund"]), max_size=2)),
        )
        for k in range(n)
    ]
    removed = draw(st.lists(st.integers(0, n - 1), max_size=n))
    return units, removed, draw(texts)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(corpora(), st.sampled_from([None, ["agent:a"], ["agent:a", "agent:b"]]))
@example(([unit("m0", "book flight"), unit("m1", "book flight", run="s2")], [0], "book flight"), ["agent:a"])
def test_lsh_candidates_are_exactly_the_banded_matches_best_first_older_first(corpus: Any, scopes: Any) -> None:
    units, removed, query = corpus
    idx = MemoryIndex()
    for u in units:
        idx.add(u)
    for i in removed:
        idx.remove(i)
    sig = idx.text_signature(query)
    cands, sims = idx.similar_signature_arrays(sig, scopes)
    allowed = set(scopes) if scopes is not None else {u.scope for u in units}
    assert set(cands.tolist()) == brute_force_lsh(idx, sig, allowed)
    for i, sim in zip(cands.tolist(), sims.tolist()):  # the MinHash Jaccard estimate
        assert sim == pytest.approx(float(np.mean(idx.signatures.data[i] == sig)))
    order = list(zip((-sims).tolist(), cands.tolist()))
    assert order == sorted(order)  # most similar first, ties by index (older first)
    top = idx._similar(sig, idx.scheme.band_base(sig), idx._codes(scopes), top=3)
    assert top[0].tolist() == cands[:3].tolist()  # the partial selection agrees with the full order


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(corpora())
def test_the_same_units_give_the_same_index_in_any_build(corpus: Any) -> None:
    """One by one, or analysed ahead in a batch (``prepare``, as capture does): the same signatures,
    keys, lookups and similar lists, so a replay answers the same."""
    units, removed, query = corpus
    one, batch = MemoryIndex(), MemoryIndex()
    batch.prepare(units)
    for u in units:
        one.add(u)
        batch.add(u)
    for idx in (one, batch):
        idx.remove_many(removed)
    n = len(units)
    assert np.array_equal(one.signatures.data[:n], batch.signatures.data[:n])
    assert one.keys == batch.keys
    probe = unit("q", query, run="zz")
    assert one.similar(probe) == batch.similar(probe)
    for tool in ("search", "refund"):
        assert one.lookup("tool", tool) == batch.lookup("tool", tool)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=40), min_size=1, max_size=30),
    st.integers(1, 64),
)
@example([[7] * 5, [1], [2**32 - 1, 0, 3]], 1)  # a list longer than the chunk is a chunk of its own
def test_signatures_made_in_chunks_are_those_made_at_once(lists: list[list[int]], chunk: int) -> None:
    """The permuted hashes made ``chunk`` features at a time (the projector's peak memory) give every
    list the signature made from all rows at once, and that of the list on its own."""
    s = MemoryIndex().scheme
    hashes = np.array([h for hs in lists for h in hs], dtype=np.uint32)
    lens = np.array([len(hs) for hs in lists], dtype=np.int64)
    starts = np.cumsum(lens) - lens
    at_once = np.minimum.reduceat(hashes[:, None] * s.a + s.b, starts, axis=0)
    chunked = s.signatures(hashes, starts, chunk=chunk)
    assert chunked.dtype == at_once.dtype and np.array_equal(chunked, at_once)
    assert np.array_equal(s.signatures(hashes, starts), at_once)
    for k, hs in enumerate(lists):
        assert np.array_equal(chunked[k], s.signature(np.array(hs, dtype=np.uint32)))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(corpora(), st.integers(1, 5))
def test_units_analysed_in_chunks_are_analysed_as_in_one(corpus: Any, chunk: int) -> None:
    """``prepare`` analyses ``PREPARE_CHUNK`` units at a time (its transient memory): every unit's
    analysis (lengths, fingerprints and counts, signature, band keys) is the one of a single chunk."""
    units = corpus[0]
    whole, parts = MemoryIndex(), MemoryIndex()
    whole.prepare(units)
    saved = index_module.PREPARE_CHUNK
    index_module.PREPARE_CHUNK = chunk
    try:
        parts.prepare(units)
    finally:
        index_module.PREPARE_CHUNK = saved
    assert len(parts._prepared) == len(whole._prepared) == len({id(u) for u in units})
    for u in units:
        a, b = whole._prepared[id(u)], parts._prepared[id(u)]
        assert b.unit is u and (a.doc_len, a.fp_count) == (b.doc_len, b.fp_count)
        for x, y in ((a.fps, b.fps), (a.tf, b.tf), (a.sig, b.sig), (a.band_base, b.band_base)):
            assert x.dtype == y.dtype and np.array_equal(x, y)


# ---- removal ---------------------------------------------------------------------------------------


def test_removing_a_memory_hides_it_everywhere_and_mends_its_run_and_graph() -> None:
    idx = MemoryIndex()
    for k in range(3):
        idx.add(unit(f"m{k}", "refund the invoice", run="s1", position=k, tools=["refund"], user_id="u1"))
    idx.link(0, 1, 0.5)
    idx.link(1, 2, 0.7)
    assert (idx.prev.data[2], idx.next.data[0]) == (1, 1)
    idx.remove(1)
    assert len(idx) == 2 and idx.lookup("tool", "refund") == ["m0", "m2"]
    assert 1 not in [i for i, _ in idx.similar(unit("q", "refund the invoice", run="s9"))]
    assert (idx.next.data[0], idx.prev.data[2]) == (2, 0)  # the run skips it
    assert (idx.prev.data[1], idx.next.data[1]) == (-1, -1)
    assert idx.graph == {}  # both its edges are gone, and so are the empty neighbour dicts
    assert idx.run_members[idx.runs["s1"]] == [(0, 0), (2, 2)]
    idx.remove(1)  # again: nothing changes
    assert len(idx) == 2


@st.composite
def removals(draw: Any) -> tuple[list[MemoryUnit], list[int], list[tuple[int, int, float]]]:
    units, _, _ = draw(corpora())
    n = len(units)
    rows = draw(st.lists(st.integers(0, n - 1), max_size=2 * n))  # repeats: removed once
    edges = draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1), st.floats(0.1, 1.0)), max_size=3 * n))
    return units, rows, [(a, b, w) for a, b, w in edges if a != b]


COLUMNS = ("alive", "live_scope", "prev", "next", "run_len", "run_live", "scope_live", "scope_len", "scope_runs")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(removals())
def test_remove_many_is_remove_one_by_one(case: Any) -> None:
    units, rows, edges = case
    one, many = MemoryIndex(), MemoryIndex()
    for idx in (one, many):
        for u in units:
            idx.add(u)
        for a, b, w in edges:
            idx.link(a, b, w)
    for i in rows:
        one.remove(i)
    many.remove_many(rows)
    for name in COLUMNS:
        col_one, col_many = getattr(one, name), getattr(many, name)
        assert np.array_equal(col_one.data[: col_one.n], col_many.data[: col_many.n]), name
    assert (one.live, one.graph, one.run_members) == (many.live, many.graph, many.run_members)
    assert one.live_len == pytest.approx(many.live_len)
    dead = set(rows)
    assert len(one) == len(units) - len(dead)
    assert all(dead.isdisjoint((i, *nbrs)) for i, nbrs in one.graph.items())


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 9), st.integers(0, 49)), max_size=40),
    st.lists(st.tuples(st.integers(0, 9), st.integers(50, 99)), max_size=40),
    st.one_of(st.none(), st.lists(st.booleans(), min_size=100, max_size=100)),
    st.booleans(),
)
def test_a_large_merge_in_place_is_the_merge_by_sort(rows_a, rows_b, alive, counts):
    """``_merge_in_place`` (large merges: b's memories all newer than a's) gives what ``_merge`` gives by
    sorting both by key, the dead memories' rows dropped."""

    def segment(rows: list[tuple[int, int]]) -> tuple[np.ndarray, ...]:
        rows = sorted(set(rows))  # a segment: (key, memory) ascending, each pair once
        keys = np.array([k for k, _ in rows], dtype=np.uint64)
        idx = np.array([i for _, i in rows], dtype=np.int32)
        return (keys, idx, (idx * 0.5).astype(np.float32)) if counts else (keys, idx)

    a, b = segment(rows_a), segment(rows_b)
    live = None if alive is None else np.array(alive)
    assert len(a[0]) + len(b[0]) < index_module.MERGE_IN_PLACE_ROWS  # _merge sorts
    got, want = index_module._merge_in_place(a, b, live), index_module._merge(a, b, live)
    assert [(c.dtype, c.tolist()) for c in got] == [(c.dtype, c.tolist()) for c in want]
