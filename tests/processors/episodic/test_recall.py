"""somnus.processors.episodic.recall and somnus.processors.episodic.index: edge weights, spreading activation, BM25 and the
signals of hybrid retrieval, scopes, the relevance gate, the token budget, the episodic context."""

from __future__ import annotations

import math
import uuid
from datetime import datetime, timedelta, timezone
from typing import Any

import msgspec
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from somnus.processors.episodic import recall as R
from somnus.processors.episodic.capture import MemoryState, apply, capture
from somnus.processors.episodic.index import (
    STOP_WORDS,
    IndexConfig,
    MemoryIndex,
    Postings,
    fingerprint,
    ngram_fingerprints,
    tokenize,
    unit_text,
)
from somnus.processors.episodic.recall import (
    EdgeWeight,
    GatedHit,
    Hit,
    Recall,
    RecallConfig,
    Relevance,
    aggregate_scores,
    build_episodic_context,
    edge_weight,
    estimate_tokens,
    gate,
    importance_score,
    recall,
    relevance,
    spread_activation,
    temporal_proximity,
    time_hints,
    time_match,
    within_budget,
)
from somnus.schemas.agents import AgentSpec
from somnus.schemas.memory import MemoryAccessed, MemoryKind, MemoryUnit

T0 = datetime(2024, 5, 15, 9, 0, tzinfo=timezone.utc)
LEXICAL_ONLY = {"lexical": 1.0}
PLAIN_BM25 = RecallConfig(
    context_weight=0, window_weight=0, run_weight=0, person_boost=0, time_boost=0, weights=LEXICAL_ONLY
)


def unit(
    mid: str,
    text: str = "",
    *,
    agent: str = "a",
    run: str | None = None,
    position: int = 0,
    at: datetime = T0,
    **kw: Any,
) -> MemoryUnit:
    kw.setdefault("scope", f"agent:{agent}")
    return MemoryUnit(
        memory_id=mid,
        kind=kw.pop("kind", MemoryKind.EPISODE),
        agent=agent,
        run_id=run or mid,
        position=position,
        occurred_at=at,
        perception=text,
        **kw,
    )


def index_of(*units: MemoryUnit, **config: Any) -> MemoryIndex:
    ix = MemoryIndex(IndexConfig(**config))
    for u in units:
        ix.add(u)
    return ix


def ids(r: Recall) -> list[str]:
    return [h.memory_id for h in r.hits]


# ---- edges ------------------------------------------------------------------------------------------


def test_edge_weight_constants_are_the_designs():
    assert (R.EDGE_SHARED, R.EDGE_GOAL, R.EDGE_TEMPORAL) == (0.60, 0.25, 0.15)
    assert R.TEMPORAL_TAU_HOURS == 24.0
    assert (R.ASSOCIATION_LIMIT, R.ASSOCIATION_THRESHOLD) == (5, 0.5)


def test_edge_weight_parts():
    a = unit("a", objects=["cup", "kitchen table"], people=["Ana"], goal="fetch the cup from the kitchen", at=T0)
    b = unit("b", objects=["cup"], people=["ana", "bo"], goal="clean the kitchen", at=T0 + timedelta(hours=12))
    w = edge_weight(a, b)
    shared = 2 / 4  # {cup, ana} of {cup, kitchen table, ana, bo}
    goal = 1 / 4  # {kitchen} of {fetch, cup, kitchen, clean}
    temporal = math.exp(-12 / 24)
    assert w == EdgeWeight(
        weight=0.6 * shared + 0.25 * goal + 0.15 * temporal, shared=shared, goal=goal, temporal=temporal
    )


def test_edge_weight_without_goals_or_shared_things_is_temporal_only():
    a, b = unit("a", at=T0), unit("b", at=T0)
    assert edge_weight(a, b) == EdgeWeight(weight=0.15, shared=0.0, goal=0.0, temporal=1.0)
    assert temporal_proximity(T0, T0 + timedelta(days=7)) == pytest.approx(math.exp(-7))


def coffee_chain() -> tuple[list[MemoryUnit], dict[int, dict[int, float]]]:
    """The design's example: "made coffee at 9am yesterday" -> "found cup on kitchen table" -> "cleaned
    kitchen table last week", with edge weights 0.81 and 0.75. Which memories give those weights:
    the same objects (shared = 1.0 -> 0.60) and goals with 3 words in common of 5 (goal = 0.6 -> 0.15),
    plus, for 0.81, temporal proximity 0.4 (24 ln 2.5 = 22.0 hours apart -> 0.06), and for 0.75 a
    week apart (exp(-7) -> 0.0001)."""
    things = ["cup", "kitchen table"]
    coffee = unit("coffee", "made coffee", objects=things, goal="fetch cup kitchen table", at=T0)
    found = T0 + timedelta(hours=24 * math.log(2.5))
    cup = unit("cup", "found cup on kitchen table", objects=things, goal="fetch cup kitchen counter", at=found)
    table = unit(
        "table", "cleaned kitchen table", objects=things, goal="fetch cup kitchen sink", at=found + timedelta(days=7)
    )
    return [coffee, cup, table], {0: {1: 0.81}, 1: {0: 0.81, 2: 0.75}, 2: {1: 0.75}}


def two_places(x: float) -> str:
    """As the design prints activations: two decimals, halves rounded up."""
    from decimal import ROUND_HALF_UP, Decimal

    return str(Decimal(repr(x)).quantize(Decimal("0.01"), rounding=ROUND_HALF_UP))


def test_the_coffee_chain_memories_have_the_designs_edge_weights():
    (coffee, cup, table), graph = coffee_chain()
    first, second = edge_weight(coffee, cup), edge_weight(cup, table)
    assert (first.shared, first.goal, first.temporal) == pytest.approx((1.0, 0.6, 0.4))
    assert first.weight == pytest.approx(graph[0][1], abs=1e-12)
    assert second.weight == pytest.approx(graph[1][2], abs=2e-4) and second.temporal == pytest.approx(math.exp(-7))


def test_spreading_activation_reproduces_1_0_then_0_41_then_0_15():
    _, graph = coffee_chain()
    act = spread_activation(graph, {0: 1.0})
    assert act == pytest.approx({0: 1.0, 1: 1.0 * 0.5 * 0.81, 2: 1.0 * 0.5 * 0.81 * 0.5 * 0.75})  # 0.405, 0.151875
    assert [two_places(act[i]) for i in (0, 1, 2)] == ["1.00", "0.41", "0.15"]
    (coffee, cup, table), _ = coffee_chain()  # the same from the weights the formula gives those memories
    w1, w2 = edge_weight(coffee, cup).weight, edge_weight(cup, table).weight
    act = spread_activation({0: {1: w1}, 1: {0: w1, 2: w2}, 2: {1: w2}}, {0: 1.0})
    assert [act[1], act[2]] == pytest.approx([0.405, 0.151875], abs=2e-4)


def test_spreading_activation_stops_after_three_hops_and_under_the_threshold():
    assert (R.ACTIVATION_DECAY, R.MAX_HOPS, R.MIN_ACTIVATION) == (0.5, 3, 0.05)
    line = {i: {} for i in range(6)}
    for i in range(5):
        line[i][i + 1] = line[i + 1][i] = 1.0
    act = spread_activation(line, {0: 1.0}, threshold=0.0)
    assert act == {0: 1.0, 1: 0.5, 2: 0.25, 3: 0.125}  # hop 4 is never taken
    assert spread_activation(line, {0: 1.0}) == {0: 1.0, 1: 0.5, 2: 0.25, 3: 0.125}
    assert spread_activation(line, {0: 0.3}) == {0: 0.3, 1: 0.15, 2: 0.075}  # 0.0375 < 0.05: not spread


def test_spreading_activation_keeps_the_strongest_path_and_weakens_with_query_similarity():
    graph = {0: {1: 0.2, 2: 1.0}, 1: {0: 0.2, 2: 1.0}, 2: {0: 1.0, 1: 1.0}}
    act = spread_activation(graph, {0: 1.0})
    assert act[1] == pytest.approx(0.25)  # 0 -> 2 -> 1 (0.5 * 0.5) beats 0 -> 1 (0.1)
    conditioned = spread_activation(graph, {0: 1.0}, query_similarity={0: 1.0, 1: 1.0, 2: 0.5}.__getitem__)
    assert conditioned[2] == pytest.approx(0.25)  # 1.0 * 0.5 * 1.0 * 0.5
    assert conditioned[1] == pytest.approx(0.125)  # 0 -> 2 -> 1: 0.25 * 0.5 * 1.0 * 1.0 beats direct 0.1
    assert spread_activation(graph, {0: 1.0}, query_similarity=lambda i: 0.0) == {0: 1.0}


def test_aggregated_scoring_is_0_6_self_plus_0_4_mean_of_neighbours():
    assert (R.AGGREGATE_SELF, R.AGGREGATE_NEIGHBOURS) == (0.6, 0.4)
    out = aggregate_scores({0: 1.0, 1: 0.5, 2: 0.2}, {0: {1: 1.0, 3: 1.0}, 1: {0: 1.0}})
    assert out == {0: pytest.approx(0.6 * 1.0 + 0.4 * (0.5 + 0.0) / 2), 1: pytest.approx(0.6 * 0.5 + 0.4 * 1.0), 2: 0.2}


def test_importance_is_0_3_recency_0_3_log_access_0_4_explicit():
    assert (R.IMPORTANCE_RECENCY, R.IMPORTANCE_ACCESS, R.IMPORTANCE_EXPLICIT) == (0.3, 0.3, 0.4)
    assert R.RECENCY_TAU_DAYS == 7.0
    assert float(importance_score(0.2, 4, 0.9)) == pytest.approx(0.3 * 0.2 + 0.3 * math.log(5) + 0.4 * 0.9)


# ---- text and fingerprints --------------------------------------------------------------------


def test_tokenize_lowercases_drops_punctuation_and_stop_words_and_keeps_identifiers():
    assert tokenize("The Book_Reservation call to api.x.io failed for HAT030 (D1:3)!") == [
        "book_reservation",
        "call",
        "api.x.io",
        "failed",
        "hat030",
        "d1:3",
    ]
    assert tokenize("I'm sure it's Caroline's") == ["sure", "caroline"]
    assert {"the", "and", "im", "dont"} <= STOP_WORDS
    assert tokenize("running dogs", stem=lambda w: w[:3]) == ["run", "dog"]
    assert tokenize("hat030 running", stem=lambda w: w[:3]) == ["hat030", "run"]  # identifiers are not stemmed


def blake48(text: str) -> int:
    import hashlib

    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=6).digest(), "big")


def rolling48(*words: str) -> int:
    """An n-gram's fingerprint by hand, in Python integers: the rolling hash (mod 2^64) of its words'
    blake2b fingerprints, plus the salt of n, times the mixer, top 48 bits."""
    m64 = (1 << 64) - 1
    roll = blake48(words[0])
    for w in words[1:]:
        roll = (roll * 0x9E3779B97F4A7C15 + blake48(w)) & m64
    salt = {2: 0x2545F4914F6CDD1D, 3: 0x94D049BB133111EB}[len(words)]
    return (((roll + salt) & m64) * 0xBF58476D1CE4E5B9 & m64) >> 16


def test_fingerprints_are_48_bit_blake2b_of_words_and_rolling_hashes_of_ngrams():
    # A word's fingerprint is its blake2b; an n-gram's is derived from its words' (vectorised in the
    # index; the definition changed from blake2b of the n-gram's text, which cost one hash per n-gram:
    # only equality matters, and the collision rate is the same 2^-48).
    assert fingerprint("kitchen") == blake48("kitchen") < 2**48
    assert fingerprint("kitchen table") == rolling48("kitchen", "table") < 2**48
    assert fingerprint("clean kitchen table") == rolling48("clean", "kitchen", "table")
    assert fingerprint("kitchen table") != fingerprint("table kitchen")
    uni, grams = ngram_fingerprints(["a", "b", "a", "c"])
    assert uni == {fingerprint("a"): 2, fingerprint("b"): 1, fingerprint("c"): 1}
    assert grams == {fingerprint(g): 1 for g in ("a b", "b a", "a c", "a b a", "b a c")}
    assert ngram_fingerprints(["a", "b", "a", "b"])[1] == {
        fingerprint("a b"): 2,
        fingerprint("b a"): 1,
        fingerprint("a b a"): 1,
        fingerprint("b a b"): 1,
    }
    with pytest.raises(ValueError):
        fingerprint("one two three four")


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.lists(st.sampled_from(["a", "b", "c", "dd", "e.f", "g_h"]), min_size=1, max_size=3),
        min_size=2,
        max_size=40,
        unique_by=tuple,
    )
)
def test_different_ngrams_have_different_fingerprints(grams):
    assert len({fingerprint(" ".join(g)) for g in grams}) == len(grams)


def test_postings_give_the_same_answers_whatever_the_segment_layout():
    rng = np.random.default_rng(3)
    docs = [{int(f): int(c) for f, c in zip(rng.integers(0, 50, 8), rng.integers(1, 4, 8))} for _ in range(300)]
    small, big = Postings(buffer_postings=7), Postings(buffer_postings=1 << 20)
    for i, d in enumerate(docs):
        small.add(i, d)
        big.add(i, d)
    assert len(small.segments) > 1 and not big.segments
    q = np.array(sorted({3, 7, 49, 1000}), dtype=np.uint64)

    def canon(p: Postings) -> list[tuple[int, int, float]]:
        pos, ix, tf = p.gather(q)
        return sorted(zip(pos.tolist(), ix.tolist(), tf.tolist()))

    assert canon(small) == canon(big)
    assert small.document_frequency(q).tolist() == big.document_frequency(q).tolist()
    assert len(small) == len(big) == sum(len(d) for d in docs)


def test_merged_segments_drop_the_postings_of_removed_memories():
    ix = MemoryIndex(IndexConfig(buffer_postings=4))
    for i in range(12):
        ix.add(unit(f"m{i}", f"alpha beta gamma delta {i}"))
    ix.remove(ix.pos["m0"])
    for i in range(12, 40):
        ix.add(unit(f"m{i}", f"alpha beta gamma delta {i}"))
    ix.postings.flush()
    _, members, _ = ix.postings.gather(np.array([fingerprint("alpha")], dtype=np.uint64))
    assert 0 not in set(members.tolist()) and len(members) == 39


# ---- situation signatures and the LSH (datasketch's, computed faster) ----------------------------

SITUATION_WORDS = ["deploy", "billing", "helm", "timeout", "invoice", "refund", "retry", "staging"]


def situations(draw_words: list[list[str]], scopes: list[int], weeks: list[int], tools: list[int]) -> list[MemoryUnit]:
    return [
        unit(
            f"m{i}",
            " ".join(words),
            agent=f"a{sc}",
            at=T0 + timedelta(weeks=wk),
            tools=[["helm", "kubectl", "curl"][t]] if t < 3 else [],
            kind=MemoryKind.MESSAGE if i % 2 else MemoryKind.EPISODE,
            action="helm > kubectl > helm" if t == 1 else "",
            outcome="failure" if t == 2 else "",
        )
        for i, (words, sc, wk, t) in enumerate(zip(draw_words, scopes, weeks, tools))
    ]


situation_lists = st.integers(2, 30).flatmap(
    lambda n: st.tuples(
        st.lists(st.lists(st.sampled_from(SITUATION_WORDS), min_size=0, max_size=6), min_size=n, max_size=n),
        st.lists(st.integers(0, 2), min_size=n, max_size=n),
        st.lists(st.integers(0, 1), min_size=n, max_size=n),
        st.lists(st.integers(0, 3), min_size=n, max_size=n),
    )
)


def datasketch_minhash(features: list[str], num_perm: int = 64) -> Any:
    from datasketch import MinHash

    m = MinHash(num_perm=num_perm, seed=1)
    m.update_batch([f.encode() for f in features])
    return m


@settings(max_examples=40, deadline=None)
@given(situation_lists)
def test_signatures_are_datasketch_minhash_hash_values(drawn):
    from somnus.processors.episodic.index import situation_features

    units = situations(*drawn)
    single, batched = MemoryIndex(), MemoryIndex()
    batched.prepare(units)
    for u in units:
        expected = datasketch_minhash(situation_features(u, tokenize(unit_text(u)))).hashvalues
        np.testing.assert_array_equal(single._analyse(u).sig, expected)
        np.testing.assert_array_equal(batched._analyse(u).sig, expected)
    text = " ".join(units[0].perception.split()[::-1]) or "nothing"
    sig = single.signature_of_text(text)
    assert type(sig).__name__ == "MinHash" and sig == datasketch_minhash(sorted(set(tokenize(text))))


@settings(max_examples=40, deadline=None)
@given(situation_lists)
def test_a_prepared_batch_is_analysed_as_unit_by_unit(drawn):
    from somnus.projections.memory import stemmer

    units = situations(*drawn)
    units[0] = msgspec.structs.replace(units[0], perception="Caroline's running dogs, api.x.io D1:3 " * 3)
    for stem in (None, stemmer()):
        single, batched = MemoryIndex(IndexConfig(stem=stem)), MemoryIndex(IndexConfig(stem=stem))
        batched.prepare(units)
        for u in units:
            a, b = single._analyse(u), batched._analyse(u)
            assert single.tokenize(u.perception) == tokenize(u.perception, stem)
            assert (a.doc_len, a.fp_count) == (b.doc_len, b.fp_count)
            assert dict(zip(a.fps.tolist(), a.tf.tolist())) == dict(zip(b.fps.tolist(), b.tf.tolist()))
            np.testing.assert_array_equal(a.sig, b.sig)
            np.testing.assert_array_equal(a.band_base, b.band_base)


@pytest.mark.parametrize(("num_perm", "threshold"), [(64, 0.5), (64, 0.7), (64, 0.2), (64, 0.3), (32, 0.5)])
@settings(max_examples=25, deadline=None)
@given(drawn=situation_lists, removed=st.sets(st.integers(0, 29), max_size=5))
def test_lsh_candidates_are_minhash_lsh_query_results(num_perm, threshold, drawn, removed):
    """Every (num_perm, threshold) datasketch bands into 4 (the default, packed path), 8 and 2 rows
    (packed), 3 rows and 32 permutations (the general path): the candidates are exactly what
    MinHashLSH.query returns (live, in scope), and the similarities MinHash.jaccard."""
    from datasketch import MinHashLSH

    from somnus.processors.episodic.index import situation_features

    units = situations(*drawn)
    ix = MemoryIndex(IndexConfig(num_perm=num_perm, lsh_threshold=threshold))
    lsh = MinHashLSH(threshold=threshold, num_perm=num_perm)
    sketches = []
    for i, u in enumerate(units):
        ix.add(u)
        sketches.append(datasketch_minhash(situation_features(u, tokenize(unit_text(u))), num_perm))
        lsh.insert(i, sketches[-1])
        ix.bands.flush() if i % 7 == 3 else None  # segments and buffer both
    for i in sorted(removed):
        if i < len(units):
            ix.remove(i)
            lsh.remove(i)
    for q, scopes in [(units[0], [units[0].scope]), (units[-1], None), (units[1], ["agent:a0", "agent:a2", "none"])]:
        expected = sorted(
            (-sketches_q.jaccard(sketches[j]), j)
            for sketches_q in [datasketch_minhash(situation_features(q, tokenize(unit_text(q))), num_perm)]
            for j in lsh.query(sketches_q)
            if scopes is None or units[j].scope in scopes
        )
        assert ix.similar(q, scopes) == [(j, -s) for s, j in expected]


@settings(max_examples=25, deadline=None)
@given(situation_lists)
def test_band_key_collisions_never_add_a_candidate(drawn):
    """Band keys are 64-bit hashes of (scope, band): candidates are checked on the signatures (a band
    wholly equal, the scope one asked for). With every key colliding, the answers stay the same."""
    from somnus.processors.episodic.index import SignatureScheme

    class Colliding(SignatureScheme):
        def band_base(self, sigs: np.ndarray) -> np.ndarray:
            return np.zeros((*sigs.shape[:-1], self.bands), dtype=np.uint64)

        def scope_term(self, code: int) -> np.uint64:
            return np.uint64(0)

    units = situations(*drawn)
    honest, colliding = MemoryIndex(), MemoryIndex()
    colliding.scheme = Colliding(64, 0.5)
    for u in units:
        honest.add(u)
        colliding.add(u)
    everyone = colliding.bands.members(colliding.scheme.band_base(honest.signatures.data[0]))
    assert sorted(set(everyone.tolist())) == list(range(len(units)))  # every key holds every memory
    for q in units[:5]:
        for scopes in ([q.scope], None, ["agent:a1", "agent:a2"]):
            assert colliding.similar(q, scopes) == honest.similar(q, scopes)


def test_band_keys_of_one_scope_never_reach_another():
    a = unit("a", "deploy billing helm", agent="x")
    b = unit("b", "deploy billing helm", agent="y")
    ix = index_of(a, b)
    assert [j for j, _ in ix.similar(a, ["agent:x"])] == [0] and [j for j, _ in ix.similar(a, ["agent:y"])] == [1]
    assert [j for j, _ in ix.similar(a)] == [0, 1] and ix.similar(a, ["agent:z"]) == []
    ix.remove(0)
    assert ix.similar(a, ["agent:x"]) == [] and [j for j, s in ix.similar(a)] == [1]


# ---- the multi-key index ------------------------------------------------------------------------


def test_multi_key_lookup_by_any_key():
    a = unit(
        "a",
        tools=["book_reservation"],
        objects=["api.x.io"],
        people=["Ana"],
        success=True,
        mode="tool_use",
        goal="Book a  flight",
        domains=["Travel"],
    )
    b = unit("b", tools=["cancel_reservation"], people=["bo"], success=False, mode="tool_use")
    ix = index_of(a, b)
    assert ix.lookup("tool", "book_reservation") == ["a"]
    assert ix.lookup("object", "API.X.IO") == ["a"]
    assert ix.lookup("person", "ana") == ["a"]
    assert ix.lookup("success", False) == ["b"]
    assert ix.lookup("mode", "tool_use") == ["a", "b"]
    assert ix.lookup("goal", "book a flight") == ["a"]
    assert ix.lookup("domain", "travel") == ["a"]
    with pytest.raises(KeyError):
        ix.lookup("colour", "red")
    ix.remove(ix.pos["a"])
    assert ix.lookup("mode", "tool_use") == ["b"]


# ---- BM25 and the lexical signal -------------------------------------------------------------------


def bm25_by_hand(docs: list[list[str]], query: list[str], i: int, k1: float = 0.9, b: float = 0.4) -> float:
    n = len(docs)
    avg = sum(map(len, docs)) / n
    score = 0.0
    for term in set(query):
        df = sum(term in d for d in docs)
        if not df:
            continue
        tf = docs[i].count(term)
        idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
        score += idf * tf * (k1 + 1) / (tf + k1 * (1 - b + b * len(docs[i]) / avg))
    return score


def test_bm25_matches_the_formula_with_k1_0_9_and_b_0_4():
    assert (R.BM25_K1, R.BM25_B) == (0.9, 0.4)
    texts = [
        "flight booking failed payment declined",
        "flight changed to later flight",
        "hotel booking confirmed",
        "payment refund issued",
    ]
    ix = index_of(*[unit(f"m{i}", t) for i, t in enumerate(texts)])
    r = recall(ix, "flight payment", "a", k=10, now=T0, config=PLAIN_BM25)
    docs = [tokenize(t) for t in texts]
    expected = {f"m{i}": bm25_by_hand(docs, ["flight", "payment"], i) for i in range(4)}
    got = {h.memory_id: h.signals["lexical"] for h in r.hits}
    assert got == pytest.approx({k: v for k, v in expected.items() if v > 0})
    assert ids(r) == sorted(got, key=lambda m: -got[m])


def test_bm25_statistics_come_from_the_readers_scopes_only():
    mine = [unit("m1", "rare word here", agent="a"), unit("m2", "common words", agent="a")]
    theirs = [unit(f"o{i}", "rare rare rare", agent="b") for i in range(20)]
    alone = index_of(*mine)
    crowded = index_of(*mine, *theirs)
    q = dict(k=5, now=T0, config=PLAIN_BM25)
    assert (
        recall(alone, "rare word", "a", **q).hits[0].signals == recall(crowded, "rare word", "a", **q).hits[0].signals
    )


def conversation(
    texts: list[tuple[str, str]], run: str = "s1", agent: str = "a", at: datetime = T0
) -> list[MemoryUnit]:
    return [
        unit(
            f"{run}-{i}",
            text,
            agent=agent,
            run=run,
            position=i + 1,
            at=at + timedelta(seconds=30 * i),
            kind=MemoryKind.MESSAGE,
            speaker=who,
            people=[who.lower()],
        )
        for i, (who, text) in enumerate(texts)
    ]


def test_a_stemming_reader_still_finds_the_people_a_query_names():
    # The projector stems ("melanie" -> "melani"); names are matched as written, and the name's
    # stemmed form leaves the lexical query as the unstemmed one does without a stemmer.
    from somnus.projections.memory import stemmer

    msgs = conversation([("Melanie", "we went camping at the beach"), ("Caroline", "camping sounds fun")])
    ix = index_of(*msgs, stem=stemmer())
    assert ix.tokenize("Melanie") == ["melani"]
    cfg = RecallConfig(context_weight=0, window_weight=0, run_weight=0, time_boost=0, weights=LEXICAL_ONLY)
    r = recall(ix, "Where has Melanie camped?", "a", now=T0, config=cfg)
    assert r.people == ["melanie"]
    got = {h.memory_id: h.signals["lexical"] for h in r.hits}
    assert got["s1-0"] == pytest.approx(2.0 * got["s1-1"])  # same BM25 for "camp", x 2 for hers


def test_context_gives_a_memory_half_its_run_neighbours_bm25():
    assert R.CONTEXT_WEIGHT == 0.5
    msgs = conversation(
        [
            ("ana", "what did you research lately"),
            ("bo", "adoption agencies mostly"),
            ("ana", "sounds great"),
            ("bo", "unrelated chatter about weather"),
        ]
    )
    ix = index_of(*msgs)
    cfg = RecallConfig(window_weight=0, run_weight=0, person_boost=0, time_boost=0, weights=LEXICAL_ONLY)
    got = {h.memory_id: h.signals["lexical"] for h in recall(ix, "research", "a", k=10, now=T0, config=cfg).hits}
    base = {
        h.memory_id: h.signals["lexical"] for h in recall(ix, "research", "a", k=10, now=T0, config=PLAIN_BM25).hits
    }
    assert set(base) == {"s1-0"}
    assert got == pytest.approx({"s1-0": base["s1-0"], "s1-1": 0.5 * base["s1-0"]})


def test_the_window_adds_half_the_bm25_of_a_memory_read_with_its_neighbours():
    assert R.WINDOW_WEIGHT == 0.5
    msgs = conversation([("ana", "alpha"), ("bo", "beta"), ("ana", "gamma")])
    ix = index_of(*msgs)
    cfg = RecallConfig(context_weight=0, run_weight=0, person_boost=0, time_boost=0, weights=LEXICAL_ONLY)
    got = {h.memory_id: h.signals["lexical"] for h in recall(ix, "beta", "a", k=10, now=T0, config=cfg).hits}
    n, df, avgdl = 3, 1, 1.0
    idf = math.log(1 + (n - df + 0.5) / (df + 0.5))

    def bm(tf: float, length: float, avg: float) -> float:
        return idf * tf * 1.9 / (tf + 0.9 * (0.6 + 0.4 * length / avg))

    assert got == pytest.approx(
        {
            "s1-1": bm(1, 1, avgdl) + 0.5 * bm(1, 3, 3 * avgdl),
            "s1-0": 0.5 * bm(1, 2, 3 * avgdl),
            "s1-2": 0.5 * bm(1, 2, 3 * avgdl),
        }
    )


def test_a_matching_run_multiplies_by_up_to_two_and_a_named_person_by_two():
    assert (R.RUN_WEIGHT, R.PERSON_BOOST) == (1.0, 1.0)
    s1 = conversation([("ana", "we adopted a dog"), ("bo", "adoption paperwork and dog food")], run="s1")
    s2 = conversation([("ana", "the dog barked"), ("bo", "cats are fine")], run="s2")
    ix = index_of(*s1, *s2)
    only_runs = RecallConfig(context_weight=0, window_weight=0, person_boost=0, time_boost=0, weights=LEXICAL_ONLY)
    plain = {h.memory_id: h.signals["lexical"] for h in recall(ix, "dog adoption", "a", now=T0, config=PLAIN_BM25).hits}
    boosted = {
        h.memory_id: h.signals["lexical"] for h in recall(ix, "dog adoption", "a", now=T0, config=only_runs).hits
    }
    assert boosted["s1-0"] == pytest.approx(plain["s1-0"] * 2.0)  # s1 is the best run: x (1 + 1.0)
    assert plain["s2-0"] < boosted["s2-0"] < 2 * plain["s2-0"]
    only_people = RecallConfig(context_weight=0, window_weight=0, run_weight=0, time_boost=0, weights=LEXICAL_ONLY)
    r = recall(ix, "What dog did Bo mention?", "a", now=T0, config=only_people)
    assert r.people == ["bo"]
    got = {h.memory_id: h.signals["lexical"] for h in r.hits}
    unnamed = {
        h.memory_id: h.signals["lexical"]
        for h in recall(ix, "What dog did mention?", "a", now=T0, config=PLAIN_BM25).hits
    }
    assert got["s1-1"] == pytest.approx(2.0 * unnamed["s1-1"])  # bo's: x 2; "bo" itself is not a search term
    assert got["s1-0"] == pytest.approx(unnamed["s1-0"])


def test_dates_named_by_the_query():
    assert time_hints("When did John sign with a team on 21 May, 2023?") == [R.TimeHint("day", 2023, 5, 21)]
    assert time_hints("October 25, 2022 and 2022-11-09") == [
        R.TimeHint("day", 2022, 10, 25),
        R.TimeHint("day", 2022, 11, 9),
    ]
    assert time_hints("the 8th December, 2023") == [R.TimeHint("day", 2023, 12, 8)]
    assert time_hints("What did he do in November 2022?") == [R.TimeHint("month", 2022, 11)]
    assert time_hints("plans for 2024") == [R.TimeHint("year", 2024)]
    assert time_hints("what did he say?") == []
    assert R.TIME_MATCH == {"day": 1.0, "month": 0.5, "year": 0.2} and R.TIME_BOOST == 1.0
    hints = time_hints("on 21 May, 2023")
    at = lambda *a: datetime(*a, tzinfo=timezone.utc)  # noqa: E731
    assert [time_match(hints, at(2023, 5, d)) for d in (20, 21, 22, 24)] == [1.0, 1.0, 1.0, 0.5]
    assert time_match(hints, at(2023, 7, 1)) == 0.2 and time_match(hints, at(2022, 5, 21)) == 0.0


def test_a_memory_from_a_named_date_is_boosted():
    old = unit("old", "signed with the team", at=datetime(2023, 1, 10, tzinfo=timezone.utc))
    new = unit("new", "signed with the team", at=datetime(2023, 5, 21, tzinfo=timezone.utc))
    ix = index_of(old, new)
    cfg = RecallConfig(context_weight=0, window_weight=0, run_weight=0, person_boost=0, weights=LEXICAL_ONLY)
    r = recall(ix, "Which team did he sign with on 21 May, 2023?", "a", now=T0, config=cfg)
    got = {h.memory_id: h.signals["lexical"] for h in r.hits}
    assert ids(r) == ["new", "old"] and got["new"] == pytest.approx(got["old"] * 2.0 / 1.2)  # named day / same year


def test_fingerprint_signal_is_the_jaccard_of_fingerprint_sets():
    ix = index_of(unit("m", "make coffee today"), unit("n", "tea"))
    h = recall(ix, "make coffee", "a", now=T0).hits[0]
    # query {make, coffee, "make coffee"}; memory {make, coffee, today, "make coffee", "coffee today", and the trigram}
    assert h.memory_id == "m" and h.signals["fingerprint"] == pytest.approx(3 / 6)


# ---- fusion, explanation, access ----------------------------------------------------------------


def test_fused_score_is_weighted_reciprocal_rank_and_every_hit_explains_itself():
    assert R.RRF_K == 10
    ix = index_of(
        unit("m1", "flight booking failed", importance=0.9), unit("m2", "flight to paris"), unit("m3", "hotel in paris")
    )
    cfg = RecallConfig(weights={"lexical": 1.0, "importance": 0.5})
    r = recall(ix, "paris flight", "a", now=T0, config=cfg)
    for h in r.hits:
        expected = sum(w / (10 + h.ranks[s]) for s, w in cfg.weights.items() if s in h.ranks)
        assert h.score == pytest.approx(expected)
        assert set(h.signals) == set(R.SIGNALS)
    assert [h.rank for h in r.hits] == [1, 2, 3]


def test_default_weights_are_pinned():
    assert R.DEFAULT_WEIGHTS == {
        "lexical": 1.0,
        "fingerprint": 0.02,
        "lsh": 0.02,
        "graph": 0.05,
        "importance": 0.02,
        "embedding": 0.2,
    }


def test_recall_reads_nothing_into_the_state_and_returns_access_events():
    ix = index_of(unit("m1", "flight booking failed"))
    before = ix.access_count.view.copy()
    r = recall(ix, "flight", "a", now=T0 + timedelta(days=1))
    assert (ix.access_count.view == before).all()
    assert r.accessed == [
        MemoryAccessed(
            schema_version=1,
            memory_id="m1",
            agent="a",
            query="flight",
            rank=1,
            score=round(r.hits[0].score, 9),
            accessed_at=T0 + timedelta(days=1),
        )
    ]
    state = MemoryState(index=ix)
    for _ in range(3):
        apply(state, r.accessed[0])
    assert ix.access_count.data[0] == 3 and ix.long_term.data[0]


def test_recall_respects_scope_chains_and_filters():
    agents = {
        "lead": AgentSpec(name="lead"),
        "a": AgentSpec(name="a", reports_to="lead"),
        "b": AgentSpec(name="b", reports_to="lead"),
    }
    ix = index_of(
        unit("mine", "deploy billing", agent="a"),
        unit("theirs", "deploy billing", agent="b"),
        unit("team", "deploy billing runbook", agent="b", scope="team:lead"),
        unit("world", "deploy billing notes", agent="lead", scope="global", tools=["helm"]),
    )
    assert sorted(ids(recall(ix, "deploy billing", "a", now=T0, agents=agents))) == ["mine", "team", "world"]
    assert sorted(ids(recall(ix, "deploy billing", "stranger", now=T0, agents=agents))) == ["world"]
    assert ids(recall(ix, "deploy billing", "a", now=T0, agents=agents, filters={"tool": "helm"})) == ["world"]
    assert ids(recall(ix, "deploy billing", "b", now=T0, agents=agents)) == ["theirs", "team", "world"]


def test_graph_signal_reaches_memories_the_query_does_not_name():
    (coffee, cup, table), _ = coffee_chain()
    ix = index_of(coffee, cup, table)
    ix.link(0, 1, edge_weight(coffee, cup).weight)
    ix.link(1, 2, edge_weight(cup, table).weight)
    r = recall(ix, "made coffee", "a", now=T0)
    graph = {h.memory_id: h.signals["graph"] for h in r.hits}
    assert graph["cup"] == pytest.approx(0.5 * edge_weight(coffee, cup).weight)
    assert graph["table"] == pytest.approx(0.25 * edge_weight(coffee, cup).weight * edge_weight(cup, table).weight)


def test_removal_takes_a_memory_out_of_every_read():
    msgs = conversation([("ana", "alpha one"), ("bo", "alpha two"), ("ana", "alpha three")])
    ix = index_of(*msgs)
    ix.link(0, 1, 0.9)
    ix.remove(1)
    assert ix.graph == {} and ix.prev.data[2] == 0 and ix.next.data[0] == 2
    assert "s1-1" not in ids(recall(ix, "alpha", "a", now=T0)) and len(ix) == 2
    assert ix.lookup("run", "s1") == ["s1-0", "s1-2"]


def test_recall_is_deterministic_and_independent_of_postings_layout():
    texts = [
        f"{w1} {w2} {w3}"
        for w1 in ("deploy", "billing", "helm")
        for w2 in ("failed", "ok", "retry")
        for w3 in ("today", "monday", "later")
    ]
    a = index_of(*[unit(f"m{i}", t, run=f"r{i % 4}", position=i) for i, t in enumerate(texts)], buffer_postings=5)
    b = index_of(*[unit(f"m{i}", t, run=f"r{i % 4}", position=i) for i, t in enumerate(texts)])
    ra, rb = (recall(x, "billing failed on monday", "a", k=10, now=T0) for x in (a, b))
    assert [(h.memory_id, h.score, h.signals) for h in ra.hits] == [(h.memory_id, h.score, h.signals) for h in rb.hits]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.lists(st.sampled_from(["alpha", "beta", "gamma", "delta", "eps", "zeta"]), min_size=1, max_size=6),
        min_size=1,
        max_size=25,
    ),
    st.lists(st.sampled_from(["alpha", "beta", "gamma", "delta", "omega"]), min_size=1, max_size=3),
    st.integers(1, 8),
)
def test_property_hits_are_readable_ranked_and_layout_free(docs, query, buf):
    units = [
        unit(f"m{i:02d}", " ".join(d), run=f"r{i % 3}", position=i, agent="a" if i % 4 else "b")
        for i, d in enumerate(docs)
    ]
    small, big = index_of(*units, buffer_postings=buf), index_of(*units)
    rs, rb = (recall(x, " ".join(query), "a", k=10, now=T0) for x in (small, big))
    assert [(h.memory_id, h.score) for h in rs.hits] == [(h.memory_id, h.score) for h in rb.hits]
    assert all(h.unit.agent == "a" for h in rs.hits)
    scores = [h.score for h in rs.hits]
    assert scores == sorted(scores, reverse=True)


# ---- the gate, the budget, the episodic context -------------------------------------------------


def hit(u: MemoryUnit, fp: float = 0.0, rank: int = 1) -> Hit:
    return Hit(memory_id=u.memory_id, rank=rank, score=1.0, signals={"fingerprint": fp}, ranks={}, refs=[], unit=u)


def test_relevance_weights_and_gate():
    assert R.RELEVANCE_WEIGHTS == {"text": 0.5, "tool": 0.2, "domain": 0.15, "entity": 0.15}
    assert R.MIN_RELEVANCE == 0.05
    u = unit("m", tools=["book_reservation"], domains=["airline"], objects=["api.x.io"], success=True)
    q = set(tokenize("retry book_reservation on api.x.io"))
    assert relevance(u, 0.1, q) == Relevance(0.5 * 0.1 + 0.2 + 0.15, 0.1, 1.0, 0.0, 1.0)
    assert relevance(u, 0.1, q, domain_hint="Airline").domain == 1.0
    failed = unit("f", tools=["book_reservation"], success=False)
    weak = unit("w")
    hits = [hit(weak, 0.02, 1), hit(failed, 0.0, 2), hit(u, 0.1, 3)]
    gated = gate(hits, "retry book_reservation on api.x.io")
    assert [g.hit.memory_id for g in gated] == ["m", "f"]  # w: 0.01 < 0.05
    assert [g.hit.memory_id for g in gate(hits, "book_reservation", success_only=True)] == ["m"]
    assert [g.hit.memory_id for g in gate(hits, "x", min_relevance=0.0, top_k=2)] == ["m", "w"]  # 0.05, 0.01


def _episode(mid: str, task: str, tools: list[str], outcome: str = "success", **kw: Any) -> MemoryUnit:
    """A memory as the distiller's episodes are: the task, and a summary that repeats outcome and task."""
    return unit(
        mid,
        task,
        tools=tools,
        outcome=outcome,
        success=outcome == "success",
        summary=f"{outcome}: {task} | {len(tools) + 1} tool calls ({len(tools)} tools), 0 errors (0 unresolved), "
        "6 messages, 0 delegations, 45s",
        lessons=[f"succeeded using {' -> '.join(tools)}"],
        **kw,
    )


def test_an_agents_own_past_task_is_found_by_its_text():
    refund = _episode("refund", "refund order 1042 for a damaged blender", ["get_order", "issue_refund"])
    flight = _episode(
        "flight",
        "Hi, I want to book a flight from New York to Seattle on May 20, economy please",
        ["search_flights", "book_reservation"],
        domains=["airline"],
    )
    failed = _episode("failed", "book a hotel room in Seattle", ["search_hotels"], outcome="failure")
    pizza = _episode("pizza", "order a pizza", ["place_order"])
    from somnus.projections.memory import stemmer

    ix = index_of(refund, flight, failed, pizza, stem=stemmer())
    for query, expected in (("refund order 1042", "refund"), ("book a flight", "flight")):
        r = recall(ix, query, "a", k=20, now=T0)
        # the whole-memory fingerprint alone is far under the gate (0.5 x Jaccard < 0.05) ...
        own = next(h for h in r.hits if h.memory_id == expected)
        assert 0.5 * own.signals["fingerprint"] < R.MIN_RELEVANCE
        # ... the task's text finds it, first
        ctx = build_episodic_context(ix, query, "a", now=T0)
        assert ctx.entries and ctx.entries[0].hit.memory_id == expected, ctx.text
        assert ctx.entries[0].relevance.task >= 0.4 and ctx.entries[0].relevance.score >= 0.2
        # a task sharing a word ranks below; one sharing none is not there
        assert all(g.relevance.score < ctx.entries[0].relevance.score for g in ctx.entries[1:])
    assert "pizza" not in build_episodic_context(ix, "book a flight", "a", now=T0).text
    # the result line says the outcome once, and not the task again
    assert (
        "result: success: 3 tool calls (2 tools)" in build_episodic_context(ix, "refund order 1042", "a", now=T0).text
    )
    # success_only, domain_hint and min_relevance are the caller's
    booked = build_episodic_context(ix, "book in Seattle", "a", now=T0)
    assert {g.hit.memory_id for g in booked.entries} == {"flight", "failed"}
    assert [
        g.hit.memory_id for g in build_episodic_context(ix, "book in Seattle", "a", now=T0, success_only=True).entries
    ] == ["flight"]
    hinted = build_episodic_context(ix, "book in Seattle", "a", now=T0, domain_hint="airline").entries
    assert hinted[0].hit.memory_id == "flight" and hinted[0].relevance.domain == 1.0
    assert build_episodic_context(ix, "book in Seattle", "a", now=T0, min_relevance=0.99).entries == []


def test_token_budget():
    assert R.CHARS_PER_TOKEN == 4 and estimate_tokens("x" * 9) == 3
    entries = ["a" * 40, "b" * 40, "c" * 40]  # 10 tokens each, + 1 for each newline after the first
    assert within_budget(entries, 21) == entries[:2]
    assert within_budget(entries, 20) == entries[:1]
    assert within_budget(entries, 5) == ["a" * 20]  # the first, cut to the budget
    assert within_budget(entries, 0) == [] and within_budget([], 100) == []


def test_build_episodic_context_renders_past_work_within_the_budget():
    ep = unit(
        "e1",
        "rebook the Paris flight after a payment failure",
        tools=["get_reservation", "book_reservation"],
        outcome="success",
        success=True,
        summary="rebooked on AF123",
        lessons=["check the card limit first"],
        objects=["api.x.io"],
    )
    other = unit("e2", "order pizza", tools=["order"], outcome="success", success=True)
    ix = index_of(ep, other)
    ctx = build_episodic_context(ix, "rebook a flight after payment failure", "a", now=T0)
    assert ctx.text.startswith("[1] task: rebook the Paris flight after a payment failure (relevance ")
    assert "result: success: rebooked on AF123" in ctx.text and "lessons: check the card limit first" in ctx.text
    assert "tools: get_reservation, book_reservation" in ctx.text and "order pizza" not in ctx.text
    assert [a.memory_id for a in ctx.accessed] == ["e1"]
    tiny = build_episodic_context(ix, "rebook a flight after payment failure", "a", now=T0, token_budget=10)
    assert estimate_tokens(tiny.text) <= 10 and tiny.text.startswith("[1] task: rebook")


# ---- the optional embedding model (arithmetic on a tiny random BERT) ------------------------------


def tiny_bert(seed: int = 0) -> tuple[dict[str, np.ndarray], list[str]]:
    rng = np.random.default_rng(seed)
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "hello", "world", "##s", "!"]
    h, inter, layers = 8, 16, 2
    w: dict[str, np.ndarray] = {
        "embeddings.word_embeddings.weight": rng.normal(size=(len(vocab), h)),
        "embeddings.position_embeddings.weight": rng.normal(size=(16, h)),
        "embeddings.token_type_embeddings.weight": rng.normal(size=(2, h)),
        "embeddings.LayerNorm.weight": rng.normal(size=h),
        "embeddings.LayerNorm.bias": rng.normal(size=h),
    }
    for i in range(layers):
        p = f"encoder.layer.{i}."
        for name, shape in [
            ("attention.self.query", (h, h)),
            ("attention.self.key", (h, h)),
            ("attention.self.value", (h, h)),
            ("attention.output.dense", (h, h)),
            ("intermediate.dense", (inter, h)),
            ("output.dense", (h, inter)),
        ]:
            w[p + name + ".weight"] = rng.normal(size=shape) * 0.3
            w[p + name + ".bias"] = rng.normal(size=shape[0]) * 0.1
        for ln in ("attention.output.LayerNorm", "output.LayerNorm"):
            w[p + ln + ".weight"] = 1 + 0.1 * rng.normal(size=h)
            w[p + ln + ".bias"] = 0.1 * rng.normal(size=h)
    return {k: v.astype(np.float32) for k, v in w.items()}, vocab


def reference_bert(w: dict[str, np.ndarray], ids: list[int], heads: int) -> np.ndarray:
    """A plain, loop-based BERT forward pass in float64 to check the vectorised one against."""
    from math import erf, sqrt

    def ln(x: np.ndarray, g: np.ndarray, b: np.ndarray) -> np.ndarray:
        mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + 1e-12) * g + b

    w = {k: v.astype(np.float64) for k, v in w.items()}
    x = np.stack(
        [
            w["embeddings.word_embeddings.weight"][t]
            + w["embeddings.position_embeddings.weight"][j]
            + w["embeddings.token_type_embeddings.weight"][0]
            for j, t in enumerate(ids)
        ]
    )
    x = ln(x, w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"])
    n, h = x.shape
    dh = h // heads
    layer = 0
    while f"encoder.layer.{layer}.attention.self.query.weight" in w:
        p = f"encoder.layer.{layer}."
        lin = lambda v, name: v @ w[p + name + ".weight"].T + w[p + name + ".bias"]  # noqa: E731
        q, k, v = lin(x, "attention.self.query"), lin(x, "attention.self.key"), lin(x, "attention.self.value")
        ctx = np.zeros_like(x)
        for hd in range(heads):
            sl = slice(hd * dh, (hd + 1) * dh)
            for i in range(n):
                s = np.array([q[i, sl] @ k[j, sl] / sqrt(dh) for j in range(n)])
                a = np.exp(s - s.max()) / np.exp(s - s.max()).sum()
                ctx[i, sl] = sum(a[j] * v[j, sl] for j in range(n))
        x = ln(
            lin(ctx, "attention.output.dense") + x,
            w[p + "attention.output.LayerNorm.weight"],
            w[p + "attention.output.LayerNorm.bias"],
        )
        inter = lin(x, "intermediate.dense")
        inter = np.vectorize(lambda z: 0.5 * z * (1 + erf(z / sqrt(2))))(inter)
        x = ln(lin(inter, "output.dense") + x, w[p + "output.LayerNorm.weight"], w[p + "output.LayerNorm.bias"])
        layer += 1
    pooled = x.mean(0)
    return pooled / np.linalg.norm(pooled)


def test_minilm_arithmetic_matches_a_reference_bert():
    from somnus.processors.episodic.embedding import MiniLM

    weights, vocab = tiny_bert()
    model = MiniLM(weights, vocab, heads=2)
    assert model.tokenizer.tokenize("Hello, worlds!") == ["hello", "[UNK]", "world", "##s", "!"]
    ids_ = model.tokenizer.ids("Hello worlds!")
    assert ids_ == [2, 4, 5, 6, 7, 3]
    got = model.encode(["Hello worlds!"])[0]
    assert got.dtype == np.float32 and np.linalg.norm(got) == pytest.approx(1.0, abs=1e-5)
    np.testing.assert_allclose(got, reference_bert(weights, ids_, heads=2), atol=2e-5)
    # A text's vector does not depend on the other texts encoded with it.
    np.testing.assert_array_equal(model.encode(["hello", "Hello worlds!"])[1], got)


def test_an_index_with_an_embedder_adds_the_embedding_signal():
    vocab_vectors = {"flight": np.array([1.0, 0.0]), "plane": np.array([0.9, 0.1]), "pizza": np.array([0.0, 1.0])}

    def embed(texts: list[str]) -> np.ndarray:
        out = []
        for t in texts:
            v = sum((vocab_vectors.get(w, np.zeros(2)) for w in tokenize(t)), np.zeros(2))
            out.append(v / (np.linalg.norm(v) or 1.0))
        return np.array(out, dtype=np.float32)

    ix = MemoryIndex(embed=embed)
    ix.add(unit("p", "plane"))
    ix.add(unit("z", "pizza"))
    r = recall(ix, "flight", "a", now=T0)  # no word in common with either memory
    assert ids(r)[0] == "p" and r.hits[0].signals["embedding"] == pytest.approx(0.9 / math.hypot(0.9, 0.1), abs=1e-6)
    assert r.hits[0].signals["lexical"] == 0.0


def test_the_query_is_embedded_without_the_people_it_names():
    # A named person's words are left to the lexical signal (dropped from its query, their memories
    # boosted); embedded, the name would pull the query towards every turn that mentions the person.
    seen: list[str] = []

    def embed(texts: list[str]) -> np.ndarray:
        seen.extend(texts)
        return np.ones((len(texts), 2), dtype=np.float32) / math.sqrt(2)

    ix = MemoryIndex(embed=embed)
    for u in conversation([("Melanie", "we went camping at the beach"), ("Caroline", "camping sounds fun")]):
        ix.add(u)
    seen.clear()
    recall(ix, "Where did Melanie's family go camping?", "a", now=T0)
    assert seen == ["Where did family go camping?"]
    seen.clear()
    recall(ix, "Where did Bob go camping?", "a", now=T0)  # nobody the memories know: kept whole
    assert seen == ["Where did Bob go camping?"]


def test_recall_result_types_round_trip():
    ix = index_of(unit("m1", "flight"))
    r = recall(ix, "flight", "a", now=T0)
    raw = msgspec.json.encode(r.accessed)
    assert msgspec.json.decode(raw, type=list[MemoryAccessed]) == r.accessed
    assert isinstance(r.hits[0], Hit) and isinstance(gate(r.hits, "flight", min_relevance=0)[0], GatedHit)


def test_capture_then_recall_end_to_end():
    state, _ = capture(
        MemoryState(),
        conversation([("ana", "we adopted a puppy"), ("bo", "what breed"), ("ana", "a beagle named Max")]),
        now=T0,
    )
    r = recall(state.index, "What breed is Ana's puppy?", "a", now=T0, k=3)
    assert set(ids(r)) == {"s1-0", "s1-1", "s1-2"} and r.people == ["ana"]
    assert uuid.UUID(int=0) not in [h.unit.source_event_ids for h in r.hits]


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from([None, "u1", "u2", "u3"]),
            st.lists(
                st.sampled_from(["deploy", "billing", "helm", "timeout", "invoice", "refund"]), min_size=1, max_size=5
            ),
        ),
        min_size=1,
        max_size=25,
    ),
    st.sampled_from([None, "u1", "u2", "u4"]),
    st.sampled_from(["deploy billing", "refund invoice", "helm"]),
)
def test_no_recall_ever_returns_another_users_memory(items, reader, query):
    from datetime import datetime, timezone

    from somnus.processors.episodic.index import MemoryIndex
    from somnus.processors.episodic.recall import build_episodic_context, recall
    from somnus.schemas.memory import MemoryKind, MemoryUnit

    t = datetime(2024, 5, 15, tzinfo=timezone.utc)
    ix = MemoryIndex()
    for i, (user, words) in enumerate(items):
        ix.add(
            MemoryUnit(
                memory_id=f"m{i}",
                kind=MemoryKind.MESSAGE,
                agent="a",
                scope="agent:a",
                run_id=f"r{i % 3}",
                position=i,
                occurred_at=t,
                perception=" ".join(words),
                user_id=user,
            )
        )
    got = recall(ix, query, "a", k=50, now=t, user_id=reader)
    assert all(h.unit.user_id in (None, reader) for h in got.hits)
    visible = {f"m{i}" for i, (user, words) in enumerate(items) if user in (None, reader)}
    assert {h.memory_id for h in got.hits} <= visible
    ctx = build_episodic_context(ix, query, "a", now=t, user_id=reader)
    assert all(g.hit.unit.user_id in (None, reader) for g in ctx.entries)


def test_support_group_is_not_a_person_named_support():
    # The sample fleet's ops-lead delegates to the agent "support" (a person of its memories), and the
    # support agent's own messages are spoken by "support"; LoCoMo's Caroline joined a support group.
    delegated = unit("d", "escalate the acme ticket", agent="ops-lead", people=["support"])
    own = unit(
        "o",
        "the acme customer needs a refund",
        agent="support",
        kind=MemoryKind.MESSAGE,
        speaker="support",
        people=["support"],
    )
    joined = unit(
        "c",
        "Caroline went to the LGBTQ support group yesterday",
        agent="conv-26",
        kind=MemoryKind.MESSAGE,
        speaker="Caroline",
        people=["caroline"],
    )
    other = unit(
        "x",
        "Caroline painted a sunrise",
        agent="conv-26",
        kind=MemoryKind.MESSAGE,
        speaker="Caroline",
        people=["caroline"],
    )
    ix = index_of(delegated, own, joined, other)
    r = recall(ix, "When did Caroline join the support group?", "conv-26", now=T0)
    assert r.people == ["caroline"]  # not "support": only known from other agents' memories
    assert ids(r)[0] == "c"  # "support" still counts as a word of the query
    assert recall(ix, "the support group", "support", now=T0).people == []  # nor the reader itself
    assert recall(ix, "what did support say", "ops-lead", now=T0).people == ["support"]  # a person it delegated to
