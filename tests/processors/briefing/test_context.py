"""somnus.processors.briefing.context: get_context — sections, fusion, dedup across tiers, window fitting, isolation.

Run as a module for the planner's benchmark with synthetic tiers: ``python -m tests.processors.briefing.test_context``.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from datetime import datetime, timedelta, timezone

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from somnus.processors.briefing.context import (
    DEFAULT_PLANNER,
    RANKED_HEADER,
    RECENT_HEADER,
    SYNOPSIS_HEADER,
    PlannerSettings,
    Tier,
    buffer_candidates,
    get_context,
    line_cost,
    visible_to,
)
from somnus.processors.working.session_buffer import WorkingMemorySettings, add, estimate_tokens, message
from somnus.schemas.working_memory import (
    AssembledContext,
    ContextCandidate,
    Role,
    UserContext,
    UserIdentity,
    UserSynopsis,
    WorkingMemoryState,
)

T0 = datetime(2024, 5, 15, 15, 0, tzinfo=timezone.utc)


def cand(text: str, score: float = 1.0, source_id: str | None = None, user_id: str | None = None) -> ContextCandidate:
    return ContextCandidate(text=text, score=score, source_id=source_id or text, user_id=user_id)


def tier(name: str, candidates: Sequence[ContextCandidate], weight: float = 1.0, k: int = 20) -> Tier:
    def search(query: str, agent: str, user_id: str | None, k: int) -> list[ContextCandidate]:
        return list(candidates)

    return Tier(name, search, weight, k)


def session(
    texts: Sequence[str],
    user_id: str | None = "u1",
    agent: str = "support",
    cfg: WorkingMemorySettings = WorkingMemorySettings(buffer_size=50, summary_batch=10),
) -> WorkingMemoryState:
    state = WorkingMemoryState(agent=agent, session_id="s1", user_id=user_id)
    for i, text in enumerate(texts):
        state, _ = add(state, message(i, T0 + timedelta(seconds=i), Role.USER if i % 2 == 0 else Role.AGENT, text), cfg)
    return state


def synopsis(user_id: str = "u1", name: str = "Mia") -> UserSynopsis:
    return UserSynopsis(
        user_id=user_id,
        identity=UserIdentity(name=name, preferences=("prefers aisle seats",)),
        identity_built_at=T0,
        context=UserContext(recent_topics=("refund", "baggage")),
        context_built_at=T0,
    )


def lines_of(ctx: AssembledContext) -> list[str]:
    return ctx.text.splitlines()


# ---- the pinned numbers ---------------------------------------------------------------------


def test_the_planners_numbers():
    p = DEFAULT_PLANNER
    assert (
        p.recent_messages,
        p.synopsis_share,
        p.recent_share,
        p.max_item_share,
        p.rrf_k,
        p.dedup_jaccard,
        p.buffer_weight,
        p.buffer_k,
    ) == (10, 0.2, 0.4, 0.25, 60, 0.8, 1.0, 20)
    assert Tier("x", lambda *a: []).weight == 1.0 and Tier("x", lambda *a: []).k == 20


@pytest.mark.parametrize(
    "kw", [{"synopsis_share": 1.5}, {"recent_share": -0.1}, {"dedup_jaccard": 2.0}, {"recent_messages": -1}]
)
def test_invalid_planner_settings_are_refused(kw):
    with pytest.raises(ValueError):
        PlannerSettings(**kw)


def test_max_tokens_must_be_positive_and_the_buffer_the_agents():
    with pytest.raises(ValueError):
        get_context("q", "support", max_tokens=0)
    with pytest.raises(ValueError, match="agent"):
        get_context("q", "support", buffer=session(["hi"], agent="other"))


# ---- sections -------------------------------------------------------------------------------


def test_the_sections_come_in_order_synopsis_recent_then_ranked():
    ctx = get_context(
        "baggage fee",
        "support",
        "u1",
        1000,
        buffer=session(["Hello", "Hi Mia"]),
        synopsis=synopsis(),
        tiers=[tier("recall", [cand("baggage fee is 35 dollars")])],
    )
    assert lines_of(ctx) == [
        SYNOPSIS_HEADER,
        "name: Mia",
        "preferences: prefers aisle seats",
        "recent topics: refund, baggage",
        RECENT_HEADER,
        "user: Hello",
        "agent: Hi Mia",
        RANKED_HEADER,
        "- [recall] baggage fee is 35 dollars",
    ]
    assert ctx.synopsis == ("name: Mia", "preferences: prefers aisle seats", "recent topics: refund, baggage")
    assert [i.text for i in ctx.recent] == ["user: Hello", "agent: Hi Mia"]
    assert ctx.tokens == estimate_tokens(ctx.text)


def test_the_recent_conversation_is_the_newest_ten_messages_oldest_first():
    buf = session([f"message {i}" for i in range(25)])
    ctx = get_context("", "support", "u1", 4000, buffer=buf)
    assert [i.text.split(": ")[1] for i in ctx.recent] == [f"message {i}" for i in range(15, 25)]
    assert [i.source_id for i in ctx.recent] == [f"support\x1fs1#seq{i}" for i in range(15, 25)]


def test_a_short_window_keeps_a_contiguous_newest_stretch_of_the_conversation():
    buf = session(["a" * 40, "b" * 40, "tiny", "c" * 40])  # "user: aaa..." lines cost 12 tokens each
    # 40% of 100 = 40 tokens: the header (6) + the newest (12) + "agent: tiny" (3) + "agent: bbb" (12) = 33;
    # "user: aaa" would need 45
    ctx = get_context("", "support", "u1", 100, buffer=buf)
    assert [i.text[-4:] for i in ctx.recent] == ["bbbb", "tiny", "cccc"]
    assert sum(i.tokens for i in ctx.recent) + line_cost(RECENT_HEADER) <= 40
    # and with 39 tokens of room the oldest of those three goes: a stretch never has holes
    ctx = get_context("", "support", "u1", 75, buffer=buf)  # 40% of 75 = 30
    assert [i.text[-4:] for i in ctx.recent] == ["tiny", "cccc"]


def test_the_synopsis_takes_at_most_a_fifth_of_the_window():
    prefs = tuple(f"pref {i}" * 5 for i in range(9))
    s = UserSynopsis(
        user_id="u1",
        identity=UserIdentity(name="Mia", preferences=prefs),
        identity_built_at=T0,
        context=UserContext(recent_topics=("refund",)),
        context_built_at=T0,
    )
    ctx = get_context("", "support", "u1", 200, synopsis=s)
    assert line_cost(SYNOPSIS_HEADER) + sum(map(line_cost, ctx.synopsis)) <= 40
    assert ctx.synopsis[0] == "name: Mia" and "recent topics: refund" in ctx.synopsis  # the long line is skipped


def test_no_item_takes_more_than_a_quarter_of_the_window():
    ctx = get_context("q", "support", None, 400, tiers=[tier("recall", [cand("word " * 1000)])])
    (item,) = ctx.ranked
    assert item.tokens <= 100 + 5 and item.text.endswith("…")  # 25% of 400, plus the line's "- [recall] "


# ---- fusion ---------------------------------------------------------------------------------


def test_scores_are_weighted_reciprocal_rank_fusion_with_k_sixty():
    a = tier("recall", [cand("alpha fact", 0.9), cand("bravo fact", 0.8), cand("charlie fact", 0.7)])
    b = tier("knowledge", [cand("delta fact", 5.0), cand("charlie fact", 1.0)], weight=0.5)
    ctx = get_context("q", "support", None, 4000, tiers=[a, b])
    scores = {i.text: i.score for i in ctx.ranked}
    assert scores == {
        "- [recall+knowledge] charlie fact": 1 / 63 + 0.5 / 62,
        "- [recall] alpha fact": 1 / 61,
        "- [recall] bravo fact": 1 / 62,
        "- [knowledge] delta fact": 0.5 / 61,
    }
    assert [i.text for i in ctx.ranked] == [
        "- [recall+knowledge] charlie fact",
        "- [recall] alpha fact",
        "- [recall] bravo fact",
        "- [knowledge] delta fact",
    ]


def test_a_tiers_order_is_its_scores_not_the_order_it_returned():
    cands = [cand("one fact", 0.1), cand("two fact", 0.9), cand("three fact", 0.9, source_id="a")]
    ctx = get_context("q", "support", None, 4000, tiers=[tier("recall", cands)])
    assert [i.source_id for i in ctx.ranked] == ["a", "two fact", "one fact"]  # ties by source_id
    shuffled = get_context("q", "support", None, 4000, tiers=[tier("recall", list(reversed(cands)))])
    assert shuffled == ctx


def test_a_tier_gives_at_most_k_candidates():
    nine = [cand(f"fact {i}", -i) for i in range(9)]
    ctx = get_context("q", "support", None, 4000, tiers=[tier("recall", nine, k=3)])
    assert [i.text for i in ctx.ranked] == ["- [recall] fact 0", "- [recall] fact 1", "- [recall] fact 2"]
    assert ctx.considered == 9


def test_equal_scores_keep_the_tier_order():
    ctx = get_context(
        "q",
        "support",
        None,
        4000,
        tiers=[tier("recall", [cand("from recall")]), tier("knowledge", [cand("from knowledge")])],
    )
    assert [i.tiers for i in ctx.ranked] == [("recall",), ("knowledge",)]


# ---- dedup across tiers ---------------------------------------------------------------------


def test_the_same_text_from_two_tiers_is_one_item_naming_both():
    ctx = get_context(
        "q",
        "support",
        None,
        4000,
        tiers=[
            tier("recall", [cand("Rate limit of api.x.io is 10/s", source_id="r1")]),
            tier("knowledge", [cand("rate LIMIT of api.x.io is 10/s!", source_id="k1")]),
            tier("briefing", [cand("  rate limit of api x io is 10 s ", source_id="b1")]),
        ],
    )
    (item,) = ctx.ranked
    assert (item.tiers, item.source_id, ctx.duplicates) == (("recall", "knowledge", "briefing"), "r1", 2)
    assert item.score == pytest.approx(3 / 61)


def test_near_duplicates_merge_at_a_jaccard_of_eight_tenths():
    five = "alpha bravo charlie delta echo"
    ctx = get_context(
        "q",
        "support",
        None,
        4000,
        tiers=[tier("recall", [cand(five)]), tier("knowledge", [cand("alpha bravo charlie delta")])],
    )
    assert len(ctx.ranked) == 1 and ctx.duplicates == 1  # 4/5 = 0.8
    nine = "alpha bravo charlie delta echo foxtrot golf hotel india"
    seven = "alpha bravo charlie delta echo foxtrot golf"
    ctx = get_context(
        "q", "support", None, 4000, tiers=[tier("recall", [cand(nine)]), tier("knowledge", [cand(seven)])]
    )
    assert len(ctx.ranked) == 2 and ctx.duplicates == 0  # 7/9 < 0.8


def test_what_the_recent_conversation_shows_is_not_repeated():
    buf = session(["I need a refund for reservation ABC123", "ok"])
    ctx = get_context(
        "refund",
        "support",
        "u1",
        4000,
        buffer=buf,
        tiers=[
            tier("recall", [cand("I need a refund for reservation ABC123", user_id="u1"), cand("refunds take 7 days")])
        ],
    )
    assert [i.text for i in ctx.ranked] == ["- [recall] refunds take 7 days"]
    assert ctx.duplicates == 1


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.frozensets(st.sampled_from("abcdefghijklmnop"), max_size=12), max_size=25),
    st.sampled_from([0.5, 0.8, 0.9, 1.0]),
)
def test_prefix_filtering_finds_exactly_the_earliest_near_duplicate(sets, threshold):
    from somnus.processors.briefing.context import _jaccard_at_least, _NearDuplicates

    def jaccard(a: frozenset[str], b: frozenset[str]) -> float:
        return len(a & b) / len(a | b) if a | b else 0.0

    index = _NearDuplicates(threshold)
    for i, s in enumerate(sets):
        brute = next((j for j in range(i) if sets[j] and s and jaccard(s, sets[j]) >= threshold - 1e-12), None)
        assert index.first_match(s, index.prefix(s)) == brute
        for j in range(i):
            expected = bool(s and sets[j]) and jaccard(s, sets[j]) >= threshold - 1e-12
            assert _jaccard_at_least(s, sets[j], threshold) == expected
        index.add(s, index.prefix(s))


# ---- the buffer as a tier -------------------------------------------------------------------


def test_older_messages_and_summaries_are_ranked_by_the_querys_words():
    cfg = WorkingMemorySettings(buffer_size=12, summary_batch=4, keep_recent=0)
    texts = [f"We talked about the {w} policy." for w in ["baggage", "refund", "seat", "meal"] * 4]
    buf = session(texts, cfg=cfg)
    assert len(buf.summaries) == 1 and len(buf.messages) == 12
    found = buffer_candidates(buf, "baggage refund", skip_newest=10, k=20)
    # the summary (seqs 0-3) holds both words; messages 4 and 5 (older than the newest 10) one each
    assert [(c.source_id.split("#")[1], c.score) for c in found] == [
        (f"summary:{buf.summaries[0].summary_id}", 1.0),
        ("seq5", 0.5),
        ("seq4", 0.5),
    ]
    assert all(c.user_id == "u1" for c in found)
    assert [c.source_id.split("#")[1] for c in buffer_candidates(buf, "", 10, 20)] == [
        "seq5",
        "seq4",
        f"summary:{buf.summaries[0].summary_id}",
    ]  # no query words: newest first (last seq)
    ctx = get_context("baggage refund", "support", "u1", 4000, buffer=buf)
    # messages 4 and 5 say what messages 8 and 9 of the recent conversation say: only the summary is new
    assert [(i.tiers, i.source_id) for i in ctx.ranked] == [
        (("buffer",), f"support\x1fs1#summary:{buf.summaries[0].summary_id}")
    ]
    assert ctx.duplicates == 2


# ---- window fitting -------------------------------------------------------------------------


def test_an_item_that_does_not_fit_is_skipped_and_smaller_ones_still_go_in():
    big, small = cand("big " * 60, 0.9), cand("small one", 0.5)
    ctx = get_context(
        "q", "support", None, 60, tiers=[tier("recall", [big, small])], settings=PlannerSettings(max_item_share=1.0)
    )
    assert [i.text for i in ctx.ranked] == ["- [recall] small one"] and ctx.dropped == 1


texts = st.text(alphabet=st.sampled_from("abc xyz.!é\n"), max_size=300)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    max_tokens=st.integers(1, 600),
    tier_texts=st.lists(st.lists(texts, max_size=8), max_size=4),
    buffer_texts=st.lists(texts, max_size=25),
    with_synopsis=st.booleans(),
)
def test_the_context_never_exceeds_the_window(max_tokens, tier_texts, buffer_texts, with_synopsis):
    tiers = [tier(f"t{i}", [cand(t, j, f"{i}-{j}") for j, t in enumerate(ts)]) for i, ts in enumerate(tier_texts)]
    ctx = get_context(
        "abc xyz",
        "support",
        "u1",
        max_tokens,
        tiers=tiers,
        buffer=session(buffer_texts, cfg=WorkingMemorySettings(buffer_size=12, summary_batch=3)),
        synopsis=synopsis() if with_synopsis else None,
    )
    assert ctx.tokens == estimate_tokens(ctx.text) <= max_tokens
    assert sum(map(line_cost, lines_of(ctx))) <= max_tokens
    assert len(ctx.ranked) + ctx.dropped + ctx.duplicates <= ctx.considered
    assert msgspec.json.decode(msgspec.json.encode(ctx), type=AssembledContext) == ctx
    assert ctx == get_context(
        "abc xyz",
        "support",
        "u1",
        max_tokens,
        tiers=tiers,
        buffer=session(buffer_texts, cfg=WorkingMemorySettings(buffer_size=12, summary_batch=3)),
        synopsis=synopsis() if with_synopsis else None,
    )


# ---- isolation ------------------------------------------------------------------------------


def test_visibility_is_no_user_or_the_reader():
    assert [visible_to(r, u) for r, u in [(None, None), (None, "u1"), ("u1", "u1"), ("u1", "u2"), ("u1", None)]] == [
        True,
        True,
        True,
        False,
        False,
    ]


def test_a_buffer_or_synopsis_of_another_user_is_left_out():
    ctx = get_context("q", "support", "u2", 4000, buffer=session(["secret of u1"]), synopsis=synopsis("u1"))
    assert ctx.text == "" and ctx.filtered == 2
    ctx = get_context("q", "support", None, 4000, buffer=session(["secret of u1"]), synopsis=synopsis("u1"))
    assert ctx.text == "" and ctx.filtered == 2
    ctx = get_context("q", "support", None, 4000, buffer=session(["nobody's"], user_id=None))
    assert [i.text for i in ctx.recent] == ["user: nobody's"]


USERS = [None, "u1", "u2", "u3"]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    reader=st.sampled_from(USERS),
    rows=st.lists(st.tuples(st.integers(0, 2), st.sampled_from(USERS), st.integers(0, 30)), max_size=40),
    buffer_user=st.sampled_from(USERS),
    synopsis_user=st.sampled_from(USERS[1:]),
    max_tokens=st.integers(50, 3000),
)
def test_no_path_leaks_another_users_memory(reader, rows, buffer_user, synopsis_user, max_tokens):
    def secret(user: str | None, n: int) -> str:
        return f"marker{user or 'nobody'}q{n} shared words about baggage"

    # tiers that ignore the user they are asked for: the planner alone must keep users apart
    tiers = [
        tier(f"tier{t}", [cand(secret(u, n), n, f"{t}-{i}", u) for i, (tt, u, n) in enumerate(rows) if tt == t])
        for t in range(3)
    ]
    buf = session(
        [secret(buffer_user, n) for n in range(15)],
        user_id=buffer_user,
        cfg=WorkingMemorySettings(buffer_size=8, summary_batch=3, keep_recent=2),
    )
    syn = UserSynopsis(
        user_id=synopsis_user,
        identity=UserIdentity(name=f"marker{synopsis_user}q0"),
        identity_built_at=T0,
        context=UserContext(),
        context_built_at=T0,
    )
    ctx = get_context("baggage", "support", reader, max_tokens, tiers=tiers, buffer=buf, synopsis=syn)
    for other in USERS:
        if other != reader and other is not None:
            assert f"marker{other}q" not in ctx.text
    assert all(visible_to(i.user_id, reader) for i in (*ctx.recent, *ctx.ranked))


# ---- benchmark --------------------------------------------------------------------------------


def bench(calls: int = 2000, seed: int = 7) -> None:
    """The planner's own cost with synthetic tiers (recall 20, knowledge 20, briefing 10 candidates of
    realistic length, a third of them duplicated across tiers), a full buffer (50 messages, 500
    summaries) and a synopsis: p50 / p95 of get_context over ``calls`` different queries."""
    import time

    import numpy as np

    from somnus.processors.working.session_buffer import message

    rng = random.Random(seed)
    vocab = [f"w{i}" for i in range(3000)] + ["baggage", "refund", "seat", "flight", "upgrade", "rate", "limit"]

    def sentence(n: int) -> str:
        return " ".join(rng.choice(vocab) for _ in range(n)) + "."

    pool = [sentence(rng.randint(8, 40)) for _ in range(5000)]
    cfg = WorkingMemorySettings()
    state = WorkingMemoryState(agent="support", session_id="s1", user_id="u1")
    for i in range(50 + 500 * 10):
        state, _ = add(state, message(i, T0, Role.USER, pool[i % len(pool)]), cfg)
    assert len(state.summaries) == 500

    queries = [sentence(6) for _ in range(calls)]

    def synthetic(name: str, n: int) -> Tier:
        # answers prepared ahead, so the timing is the planner's own: a small shared pool makes
        # some candidates recur across tiers
        answers = {}
        for q in queries:
            r = random.Random(f"{name}/{q}")
            answers[q] = [
                ContextCandidate(text=pool[j], score=1.0 - x / n, source_id=f"{name}:{j}", user_id="u1")
                for x, j in enumerate(r.sample(range(300), n))
            ]
        return Tier(name, lambda query, agent, user_id, k: answers[query])

    tiers = [synthetic("recall", 20), synthetic("knowledge", 20), synthetic("briefing", 10)]
    syn = synopsis()
    for q in queries[:50]:
        get_context(q, "support", "u1", 4000, tiers=tiers, buffer=state, synopsis=syn)
    wall, cpu = [], []
    for q in queries:
        w0, c0 = time.perf_counter_ns(), time.thread_time_ns()
        ctx = get_context(q, "support", "u1", 4000, tiers=tiers, buffer=state, synopsis=syn)
        cpu.append((time.thread_time_ns() - c0) / 1e6)
        wall.append((time.perf_counter_ns() - w0) / 1e6)
    w, c = np.array(wall), np.array(cpu)
    print(
        f"get_context (synthetic tiers, full buffer): {calls} calls; wall p50 {np.percentile(w, 50):.2f} ms, "
        f"p95 {np.percentile(w, 95):.2f} ms, p99 {np.percentile(w, 99):.2f} ms; thread CPU p50 "
        f"{np.percentile(c, 50):.2f} ms, p95 {np.percentile(c, 95):.2f} ms; last: {ctx.tokens} tokens, "
        f"{len(ctx.ranked)} ranked, {ctx.duplicates} duplicates, {ctx.dropped} dropped"
    )


if __name__ == "__main__":
    bench()
