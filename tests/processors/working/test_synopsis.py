"""somnus.processors.working.synopsis: the deterministic synopsis builder, its TTLs, refresh on access, isolation."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

import msgspec
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from somnus.importers import openai_chat
from somnus.processors.working import synopsis as syn
from somnus.processors.working.synopsis import (
    DEFAULT_BUILDER,
    SynopsisCache,
    build,
    refresh,
    stale_parts,
    synopsis_lines,
)
from somnus.schemas.codec import decode_trace
from somnus.schemas.events import SessionStarted, UserMessaged
from somnus.schemas.working_memory import MemoryKind, UserContext, UserIdentity, UserMemory, UserSynopsis

T0 = datetime(2024, 5, 15, 15, 0, tzinfo=timezone.utc)
TAU_BENCH = Path(__file__).resolve().parents[4] / "shared" / "datasets" / "tau-bench-airline" / "gpt-4o-airline.json"


def mem(
    text: str,
    at: timedelta = timedelta(0),
    kind: MemoryKind = MemoryKind.USER_MESSAGE,
    user: str = "u1",
    source: str | None = None,
) -> UserMemory:
    """A memory observed ``at`` before T0."""
    return UserMemory(
        user_id=user, kind=kind, text=text, observed_at=T0 - at, source_id=source or f"{user}:{text[:20]}"
    )


class Loader:
    def __init__(self, memories: list[UserMemory]) -> None:
        self.memories, self.calls = memories, 0

    def __call__(self, user_id: str) -> list[UserMemory]:
        self.calls += 1
        return self.memories


# ---- the pinned numbers ---------------------------------------------------------------------


def test_the_designs_numbers():
    assert syn.IDENTITY_TTL == timedelta(days=7)
    assert syn.CONTEXT_TTL == timedelta(hours=1)
    assert (syn.TOPIC_WINDOW, syn.TOPIC_HALF_LIFE, syn.GOAL_WINDOW) == (
        timedelta(days=30),
        timedelta(days=3),
        timedelta(days=7),
    )
    assert (syn.MAX_PREFERENCES, syn.MAX_TRAITS, syn.MAX_TOPICS, syn.MAX_GOALS, syn.MAX_PHRASE_CHARS) == (
        10,
        10,
        8,
        5,
        80,
    )


# ---- TTLs and refresh on access -------------------------------------------------------------


def synopsis_built_at(t: datetime) -> UserSynopsis:
    return UserSynopsis(
        user_id="u1",
        identity=UserIdentity(name="Old"),
        identity_built_at=t,
        context=UserContext(recent_topics=("old",)),
        context_built_at=t,
    )


@pytest.mark.parametrize(
    ("age", "stale"),
    [
        (timedelta(0), (False, False)),
        (timedelta(hours=1) - timedelta(microseconds=1), (False, False)),
        (timedelta(hours=1), (False, True)),  # exactly the TTL: expired
        (timedelta(days=7) - timedelta(microseconds=1), (False, True)),
        (timedelta(days=7), (True, True)),
    ],
)
def test_a_part_expires_when_its_age_reaches_its_ttl(age, stale):
    assert stale_parts(synopsis_built_at(T0), T0 + age) == stale


def test_no_synopsis_is_stale_in_both_parts():
    assert stale_parts(None, T0) == (True, True)


def test_a_fresh_synopsis_is_returned_as_is_without_loading():
    s = synopsis_built_at(T0)
    load = Loader([mem("My name is New.")])
    assert refresh(s, "u1", T0 + timedelta(minutes=59), load) is s
    assert load.calls == 0


def test_a_stale_context_is_rebuilt_and_the_identity_kept():
    s = synopsis_built_at(T0)
    load = Loader([mem("My name is New. I need to cancel reservation XYZ.", at=-timedelta(hours=1))])
    now = T0 + timedelta(hours=1)
    r = refresh(s, "u1", now, load)
    assert load.calls == 1
    assert (r.identity, r.identity_built_at) == (s.identity, T0)  # 7 days not up: the old name stays
    assert r.context_built_at == now and r.context.current_goals == ("cancel reservation XYZ",)


def test_a_stale_identity_is_rebuilt_with_the_context():
    s = synopsis_built_at(T0)
    now = T0 + timedelta(days=7)
    r = refresh(s, "u1", now, Loader([mem("My name is New.", at=-timedelta(days=7))]))
    assert (r.identity.name, r.identity_built_at, r.context_built_at) == ("New", now, now)


def test_a_synopsis_of_another_user_is_never_returned():
    s = synopsis_built_at(T0)
    r = refresh(s, "u2", T0, Loader([mem("My name is Zoe.", user="u2"), mem("My name is Mia.", user="u1")]))
    assert (r.user_id, r.identity.name) == ("u2", "Zoe")


def test_the_cache_refreshes_on_access_and_drops_the_least_recently_used():
    cache = SynopsisCache(max_users=2)
    loads = {u: Loader([mem(f"My name is {u.upper()}.", user=u)]) for u in ("a", "b", "c")}
    cache.get("a", T0, loads["a"])
    cache.get("b", T0, loads["b"])
    cache.get("a", T0 + timedelta(minutes=30), loads["a"])  # fresh: no load; a is now the most recent
    assert loads["a"].calls == 1
    cache.get("c", T0, loads["c"])  # b was least recently used
    assert (cache.peek("a") is not None, cache.peek("b"), len(cache)) == (True, None, 2)
    cache.get("a", T0 + timedelta(hours=1), loads["a"])  # context expired: reloaded
    assert loads["a"].calls == 2
    cache.invalidate("a")
    assert cache.peek("a") is None
    with pytest.raises(ValueError):
        SynopsisCache(max_users=0)


# ---- the identity ---------------------------------------------------------------------------


def test_the_newest_stated_name_wins():
    memories = [
        mem("Hi, my name is Mia Li.", at=timedelta(days=2)),
        mem("Please call me Mimi.", at=timedelta(days=1)),
        mem("my name is not important", at=timedelta(0)),
    ]  # lower case: not a name
    assert DEFAULT_BUILDER.identity(memories).name == "Mimi"
    # a stated name memory counts like any other, by recency
    assert DEFAULT_BUILDER.identity([*memories, mem("Mia", kind=MemoryKind.NAME)]).name == "Mia"


def test_preferences_are_phrased_by_their_verb_newest_first_and_distinct():
    memories = [
        mem("I prefer window seats. I don't like red-eye flights!", at=timedelta(days=3)),
        mem("I'd rather pay with a gift card; I love short layovers.", at=timedelta(days=2)),
        mem("Please always use my 7447 card. I hate waiting.", at=timedelta(days=1)),
        mem("I PREFER window seats", at=timedelta(hours=1)),  # the same preference again
        mem("aisle seats on long flights", kind=MemoryKind.PREFERENCE),
    ]
    assert DEFAULT_BUILDER.identity(memories).preferences == (
        "aisle seats on long flights",
        "prefers window seats",
        "dislikes waiting",
        "always use my 7447 card",
        "likes short layovers",
        "prefers pay with a gift card",
        "dislikes red-eye flights",
    )


def test_at_most_ten_preferences_the_newest():
    memories = [mem(f"I prefer option {i}.", at=timedelta(hours=20 - i)) for i in range(15)]
    assert DEFAULT_BUILDER.identity(memories).preferences == tuple(f"prefers option {i}" for i in range(14, 4, -1))


def test_traits_come_from_self_descriptions():
    memories = [
        mem("I'm a gold member and, as a frequent flyer, I want upgrades.", at=timedelta(days=1)),
        mem("I work as a nurse.", at=timedelta(0)),
        mem("vegetarian", kind=MemoryKind.TRAIT, at=timedelta(days=5)),
    ]
    assert DEFAULT_BUILDER.identity(memories).traits == ("nurse", "frequent flyer", "gold member", "vegetarian")


def test_agent_words_are_not_mined_for_identity():
    memories = [mem("My name is Agent Smith. I prefer formal language.", kind=MemoryKind.AGENT_MESSAGE)]
    assert DEFAULT_BUILDER.identity(memories) == UserIdentity()


def test_a_long_phrase_is_clipped():
    (p,) = DEFAULT_BUILDER.identity([mem("I prefer " + "very " * 40 + "long flights.")]).preferences
    assert len(p) <= 80 and p.endswith("…")


# ---- the context ----------------------------------------------------------------------------


def test_topics_weigh_each_memory_by_a_three_day_half_life():
    # "refund" in one memory now: 1.0; "baggage" in 3 memories 6 days old: 3 * 0.25 = 0.75
    memories = [mem("refund", source="a"), *(mem("baggage", at=timedelta(days=6), source=f"b{i}") for i in range(3))]
    assert DEFAULT_BUILDER.context(memories, T0).recent_topics == ("refund", "baggage")
    # 3 days old: 3 * 0.5 = 1.5 > 1.0
    memories = [mem("refund", source="a"), *(mem("baggage", at=timedelta(days=3), source=f"b{i}") for i in range(3))]
    assert DEFAULT_BUILDER.context(memories, T0).recent_topics == ("baggage", "refund")
    # two memories 3 days old weigh exactly one of now: a tie, broken alphabetically
    memories = [mem("zebra", source="a"), *(mem("apple", at=timedelta(days=3), source=f"b{i}") for i in range(2))]
    assert DEFAULT_BUILDER.context(memories, T0).recent_topics == ("apple", "zebra")


def test_a_word_counts_once_per_memory_and_old_memories_are_ignored():
    memories = [
        mem("seat seat seat seat", source="a"),
        mem("meal", source="b"),
        mem("meal", source="c"),
        mem("ancient", at=timedelta(days=30, seconds=1)),
        mem("boundary", at=timedelta(days=30)),
    ]
    assert DEFAULT_BUILDER.context(memories, T0).recent_topics == ("meal", "seat", "boundary")


def test_at_most_eight_topics():
    memories = [mem(" ".join(f"topic{chr(97 + j)}" for j in range(i + 1)), source=str(i)) for i in range(12)]
    assert DEFAULT_BUILDER.context(memories, T0).recent_topics == tuple(f"topic{chr(97 + j)}" for j in range(8))


def test_goals_are_recent_tasks_goals_and_stated_needs():
    memories = [
        mem("book a flight to Seattle", kind=MemoryKind.TASK, at=timedelta(days=2)),
        mem("by Friday", kind=MemoryKind.GOAL, at=timedelta(days=1)),
        mem("I need to change my seat. Also I want to add a bag.", at=timedelta(hours=2)),
        mem("I need to renew my passport", at=timedelta(days=7, seconds=1)),  # too old to be current
        mem("i need to CHANGE my seat", at=timedelta(hours=1)),
    ]
    assert DEFAULT_BUILDER.context(memories, T0).current_goals == (
        "CHANGE my seat",
        "add a bag",
        "by Friday",
        "book a flight to Seattle",
    )


def test_at_most_five_goals_the_newest():
    memories = [mem(f"goal {i}", kind=MemoryKind.GOAL, at=timedelta(hours=10 - i)) for i in range(8)]
    assert DEFAULT_BUILDER.context(memories, T0).current_goals == tuple(f"goal {i}" for i in range(7, 2, -1))


def test_a_memory_from_the_future_counts_as_now():
    memories = [
        mem("later", at=-timedelta(days=1), source="a"),
        mem("earlier", at=timedelta(days=3), source="b"),
        mem("earlier", at=timedelta(days=3), source="c"),
    ]
    # later: 1.0 (not 2.0 for a negative age); earlier: 2 * 0.5 = 1.0 -> a tie, alphabetical
    assert DEFAULT_BUILDER.context(memories, T0).recent_topics == ("earlier", "later")


def test_the_synopsis_reads_as_lines_most_stable_first():
    s = build("u1", [mem("My name is Mia. I prefer aisle seats. I'm a teacher. I need to rebook HAT030.")], T0)
    assert synopsis_lines(s) == [
        "name: Mia",
        "preferences: prefers aisle seats",
        "traits: teacher",
        "current goals: rebook HAT030",
        "recent topics: aisle, hat030, mia, rebook, seats, teacher",
    ]


# ---- isolation and determinism --------------------------------------------------------------

USERS = ["u1", "u2", "u3"]


@settings(max_examples=80, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(USERS), st.sampled_from(list(MemoryKind)), st.integers(0, 200), st.integers(0, 40 * 24)
        ),
        max_size=30,
    ),
    st.sampled_from(USERS),
)
def test_a_synopsis_is_built_only_from_its_users_memories(rows, user):
    memories = [
        UserMemory(
            user_id=u,
            kind=k,
            observed_at=T0 - timedelta(hours=h),
            source_id=f"{u}-{i}",
            text=f"My name is Secret{u.upper()}x{n}. I prefer secret{u}x{n}. I'm a secret{u}x{n}. "
            f"I need to secret{u}x{n}.",
        )
        for i, (u, k, n, h) in enumerate(rows)
    ]
    s = refresh(None, user, T0, lambda _: memories)
    text = " ".join(synopsis_lines(s)).casefold()
    for other in USERS:
        if other != user:
            assert f"secret{other}x" not in text
    # and the same memories in another order give the same synopsis
    assert refresh(None, user, T0, lambda _: list(reversed(memories))) == s


@settings(max_examples=50, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from(list(MemoryKind)), st.text(max_size=80), st.integers(0, 24 * 40)), max_size=15)
)
def test_memories_and_synopses_round_trip_through_json(rows):
    memories = [
        UserMemory(user_id="u1", kind=k, text=text, observed_at=T0 - timedelta(hours=h), source_id=str(i))
        for i, (k, text, h) in enumerate(rows)
    ]
    assert msgspec.json.decode(msgspec.json.encode(memories), type=list[UserMemory]) == memories
    s = build("u1", memories, T0)
    assert msgspec.json.decode(msgspec.json.encode(s), type=UserSynopsis) == s


def test_tau_bench_users_get_goals_from_their_own_words():
    if not TAU_BENCH.exists():
        pytest.skip(f"dataset missing: {TAU_BENCH}")
    events = [decode_trace(orjson.dumps(e), max_bytes=1_048_576) for e in openai_chat(TAU_BENCH, agent="airline")]
    first = events[0].session_id
    memories = [
        UserMemory(
            user_id="mia",
            kind=MemoryKind.USER_MESSAGE,
            text=e.payload.text,
            observed_at=e.ts,
            source_id=str(e.event_id),
        )
        for e in events
        if isinstance(e, UserMessaged) and e.session_id == first
    ]
    memories += [
        UserMemory(
            user_id="mia", kind=MemoryKind.TASK, text=e.payload.task, observed_at=e.ts, source_id=str(e.event_id)
        )
        for e in events
        if isinstance(e, SessionStarted) and e.session_id == first
    ]
    s = build("mia", memories, memories[-1].observed_at)
    assert "use my certificates first" in " ".join(s.context.current_goals)
    assert any("flight" == t for t in s.context.recent_topics)


def test_stored_memories_are_read_as_their_synopsis_kinds():
    # The memories table has the store's kinds (episode, message); a user's message must be mined as one.
    from somnus.processors.working.synopsis import stored_kind

    rows = [
        ("m1", "message", "my name is Zed Quinn, I prefer aisle seats", True),
        ("m2", "message", "My name is Agent Smith and I prefer speed", False),  # the agent's words: not the user
        ("e1", "episode", "rebook my flight to Lisbon", True),
    ]
    mems = [
        UserMemory(user_id="u1", kind=stored_kind(k, said), text=t, observed_at=T0, source_id=m)
        for m, k, t, said in rows
    ]
    assert [m.kind for m in mems] == [MemoryKind.USER_MESSAGE, MemoryKind.AGENT_MESSAGE, MemoryKind.TASK]
    s = build("u1", mems, T0)
    assert (s.identity.name, s.identity.preferences) == ("Zed Quinn", ("prefers aisle seats",))
    assert s.context.current_goals == ("rebook my flight to Lisbon",)
    assert stored_kind("preference", False) is MemoryKind.PREFERENCE
