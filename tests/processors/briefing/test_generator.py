"""somnus.processors.briefing.generator: lessons by error class, what concerns the agent, strategies, the budget,
ages, input selection, cache invalidation."""

from __future__ import annotations

import doctest
import random
import uuid
from datetime import datetime, timedelta, timezone

import duckdb
import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import somnus.processors.briefing.generator
from somnus.processors.briefing.generator import (
    DEFAULT_BUDGET,
    KNOWLEDGE_TITLE,
    LESSONS_TITLE,
    MAX_FACTS,
    MAX_ITEM_CHARS,
    MAX_KNOWLEDGE,
    MAX_LESSONS,
    MAX_STRATEGIES,
    MAX_STRATEGY_STEPS,
    MIN_STRATEGY_SUPPORT,
    ROUND,
    SELF_EVIDENT_PREDICATES,
    STRATEGIES_TITLE,
    TASK_KIND_WORDS,
    EpisodeArrived,
    FactItem,
    KnowledgeItem,
    LessonItem,
    StrategyItem,
    TripleChanged,
    affected_agents,
    age_text,
    agents_to_regenerate,
    briefing_for,
    changes_of,
    covers,
    error_class,
    fact_line,
    lesson_line,
    one_line,
    priority_order,
    recurrence,
    render_briefing,
    select_facts,
    select_inputs,
    select_knowledge,
    select_lessons,
    select_strategies,
    task_kind,
)
from somnus.projections import schema
from somnus.schemas.agents import AgentSpec, LearningRate, load_agents

NOW = datetime(2024, 5, 16, 12, 0, tzinfo=timezone.utc)
DAY = timedelta(days=1)


def lesson(
    kind: str,
    text: str,
    days_ago: float = 1,
    times: int = 1,
    tool: str | None = None,
    recurrence: float = 0.0,
    first_days_ago: float | None = None,
    resolved: int = 0,
    resolution: str | None = None,
) -> LessonItem:
    return LessonItem(
        kind=kind,
        text=text,
        learned_at=NOW - timedelta(days=days_ago),
        times=times,
        tool=tool,
        recurrence=recurrence,
        resolved=resolved,
        resolution=resolution,
        first_at=None if first_days_ago is None else NOW - timedelta(days=first_days_ago),
    )


def fact(
    tid: str, source: str, predicate: str, target: str, conf: float, count: int = 1, scope: str = "agent:researcher"
) -> FactItem:
    return FactItem(
        triple_id=tid, source=source, predicate=predicate, target=target, scope=scope, confidence=conf, count=count
    )


def strategy(kind: str, tools: tuple[str, ...], times: int = 2, days_ago: float = 1) -> StrategyItem:
    return StrategyItem(task_kind=kind, tools=tools, times=times, latest=NOW - timedelta(days=days_ago))


LESSONS = [
    lesson("failure", "HTTP 403: Forbidden", 1, times=2, tool="http_get", recurrence=0.4, first_days_ago=3),
    lesson(
        "recovery",
        "HTTP 429: Too Many Requests",
        2,
        times=3,
        tool="http_get",
        recurrence=0.6,
        first_days_ago=6,
        resolved=3,
        resolution="exponential backoff",
    ),
    lesson("failure", "session ended in failure after <n> tool calls", 3, times=1, recurrence=0.9),
]
FACTS = [
    fact("t2", "tool:http_get", "calls", "api:r.jina.ai", 0.9, count=2),
    fact("t1", "api:api.instantly.ai", "rate_limit", "rate:10/s", 1.0, scope="team:research-lead"),
    fact("t3", "tool:http_get", "failed_with", "error:http 403: forbidden", 0.95),  # a lesson says it: left out
    fact("t4", "tool:http_get", "failed_with", "error:http 500: internal server error", 0.95),
]
KNOWLEDGE = [
    KnowledgeItem(
        text='"http_get_unreliable" (causal_pattern, confidence=0.75): calls fail',
        scope="global",
        score=0.75,
        name="http_get_unreliable",
        subjects=("http_get",),
    )
]
STRATEGIES = [
    strategy("summarise pricing", ("http_get", "summarize"), times=3),
    strategy("find pagination rules", ("web_search", "http_get"), times=2),
]


def full() -> somnus.processors.briefing.generator.Briefing:
    return render_briefing("researcher", LESSONS, FACTS, STRATEGIES, budget=100_000, now=NOW, knowledge=KNOWLEDGE)


def test_numbers_are_pinned():
    assert (MAX_LESSONS, MAX_FACTS, MAX_KNOWLEDGE, MAX_STRATEGIES, MAX_ITEM_CHARS) == (10, 20, 8, 5, 200)
    assert (MIN_STRATEGY_SUPPORT, MAX_STRATEGY_STEPS, TASK_KIND_WORDS, DEFAULT_BUDGET) == (2, 8, 3, 2000)
    assert ROUND == ("lesson", "lesson", "lesson", "knowledge", "knowledge", "strategy")
    assert SELF_EVIDENT_PREDICATES == {"uses"}
    assert AgentSpec(name="x").briefing_token_budget == DEFAULT_BUDGET


def test_the_whole_briefing_reads_as_designed():
    assert full().markdown == (
        "## Session Briefing for researcher\n"
        "\n"
        "### Recent Lessons\n"
        "- [recovery] http_get: HTTP 429: Too Many Requests; resolved by exponential backoff "
        "(3 times, first 6 days ago, last 2 days ago)\n"
        "- [failure] http_get: HTTP 403: Forbidden (twice, first 3 days ago, last 1 day ago)\n"
        "- [failure] session ended in failure after <n> tool calls (3 days ago)\n"
        "\n"
        "### Key Knowledge\n"
        '- http_get failed_with "http 500: internal server error" (confidence 0.95)\n'
        "- http_get calls r.jina.ai (confidence 0.90)\n"
        "- api.instantly.ai rate_limit 10/s (confidence 1.00)\n"
        '- "http_get_unreliable" (causal_pattern, confidence=0.75): calls fail\n'
        "\n"
        "### Active Strategies\n"
        "- summarise pricing: http_get -> summarize (worked 3 times, latest 1 day ago)\n"
        "- find pagination rules: web_search -> http_get (worked 2 times, latest 1 day ago)\n"
    )
    b = full()
    assert (b.lessons, len(b.facts), b.strategies) == (3, 3, 2)
    # t3 repeats the 403 lesson: not shown, counted as dropped
    assert (b.dropped_lessons, b.dropped_facts, b.dropped_strategies) == (0, 1, 0)
    assert b.chars == len(b.markdown) and b.agent == "researcher" and b.generated_at == NOW
    assert [f.triple_id for f in b.facts] == ["t4", "t2", "t1"]  # own facts first, then the team's
    assert [(f.source_name, f.target_name) for f in b.facts][2] == ("api.instantly.ai", "10/s")


def test_lessons_tool_errors_first_by_recurrence_then_times_then_kind_and_recency():
    lessons = [
        lesson("failure", "no tool, likely", 0.1, recurrence=0.99),
        lesson("failure", "rare", 0.1, tool="t", recurrence=0.1),
        lesson("recovery", "likely", 5, tool="t", recurrence=0.8),
        lesson("failure", "likely too, seen more", 9, tool="u", recurrence=0.8, times=4),
        lesson("failure", "tie newer", 1, tool="v", recurrence=0.1),
        lesson("recovery", "tie", 0.5, tool="v", recurrence=0.1),
    ]
    b = render_briefing("a", lessons, [], [], 10_000, NOW)
    texts = [line.split("] ")[1].split(" (")[0] for line in b.markdown.splitlines() if line.startswith("- [")]
    assert texts == ["u: likely too, seen more", "t: likely", "t: rare", "v: tie newer", "v: tie", "no tool, likely"]


def test_facts_own_scope_first_then_confidence_count_triple_id():
    facts = [
        fact("b", "tool:x", "calls", "api:a", 0.9, 1),
        fact("a", "tool:x", "calls", "api:b", 0.9, 1),
        fact("c", "tool:x", "calls", "api:c", 0.9, 5),
        fact("d", "tool:x", "calls", "api:d", 0.95, 1),
        fact("g", "tool:x", "calls", "api:g", 1.0, 9, scope="global"),
    ]
    b = render_briefing("researcher", [], facts, [], 10_000, NOW)
    assert [f.triple_id for f in b.facts] == ["d", "c", "a", "b", "g"]


def test_key_knowledge_own_facts_own_knowledge_then_wider_facts_and_knowledge():
    facts = [
        fact("own", "tool:x", "calls", "api:a", 0.5),
        fact("team", "tool:x", "calls", "api:b", 1.0, scope="team:research-lead"),
    ]
    knowledge = [
        KnowledgeItem(text="wide", scope="global", score=0.99),
        KnowledgeItem(text="mine", scope="agent:researcher", score=0.1),
        "plain own line",
    ]
    b = render_briefing("researcher", [], facts, [], 10_000, NOW, knowledge)
    assert [x for x in b.markdown.splitlines() if x.startswith("- ")] == [
        "- x calls a (confidence 0.50)",
        "- plain own line",
        "- mine",
        "- x calls b (confidence 1.00)",
        "- wide",
    ]


def test_strategies_by_times_then_recency():
    ss = [
        strategy("k1", ("a",), times=2, days_ago=1),
        strategy("k2", ("b",), times=4, days_ago=5),
        strategy("k3", ("c",), times=2, days_ago=0.5),
    ]
    b = render_briefing("a", [], [], ss, 10_000, NOW)
    assert [line.split(":")[0] for line in b.markdown.splitlines() if line.startswith("- ")] == ["- k2", "- k3", "- k1"]


def test_section_limits_cap_the_lines_considered():
    lessons = [lesson("failure", f"lesson {i}", i, tool="x") for i in range(MAX_LESSONS + 3)]
    facts = [fact(f"t{i:02d}", "tool:x", "calls", f"api:h{i}", 0.5) for i in range(MAX_FACTS + 3)]
    ss = [strategy(f"kind {i}", ("a", "b"), days_ago=i) for i in range(MAX_STRATEGIES + 3)]
    b = render_briefing("a", lessons, facts, ss, 100_000, NOW)
    assert (b.lessons, len(b.facts), b.strategies) == (MAX_LESSONS, MAX_FACTS, MAX_STRATEGIES)
    assert (b.dropped_lessons, b.dropped_facts, b.dropped_strategies) == (3, 3, 3)


def test_no_two_lesson_lines_share_a_tool_and_error_class():
    """The issue's javac example: three line numbers, one class, one line."""
    rows = [
        lesson_row(
            "builder",
            "failure",
            f"shell failed with '/bin/bash: line {n}: javac: command not found'",
            NOW - timedelta(hours=h),
            tool="shell",
            error=f"/bin/bash: line {n}: javac: command not found",
        )
        for n, h in ((2784, 30), (3447, 20), (5226, 10))
    ]
    rows += [
        lesson_row(
            "builder",
            "recovery",
            "shell: 'HTTP 503 for /v1/jobs/8812' was resolved by retrying (1 failed attempt)",
            NOW - timedelta(hours=5),
            tool="shell",
            error="HTTP 503 for /v1/jobs/8812",
        ),
        lesson_row(
            "builder",
            "failure",
            "shell failed with 'HTTP 503 for /v1/jobs/9' and it was never resolved",
            NOW - timedelta(hours=1),
            tool="shell",
            error="HTTP 503 for /v1/jobs/9",
        ),
    ]
    got = select_lessons("builder", rows, NOW)
    assert [(x.tool, x.text, x.times, x.resolved) for x in got] == [
        ("shell", "command not found: javac", 3, 0),
        ("shell", "HTTP 503: for <path>", 2, 1),
    ]
    b = render_briefing("builder", got, [], [], 2000, NOW)
    lines = [x for x in b.markdown.splitlines() if x.startswith("- [")]
    assert lines == [
        "- [failure] shell: command not found: javac (3 times, first 1 day ago, last 10 hours ago)",
        "- [failure] shell: HTTP 503: for <path>; resolved by retrying 1 of 2 times (twice, first 5 hours ago, "
        "last 1 hour ago)",
    ]
    classes = [error_class(x.text) for x in got]
    assert len(classes) == len(set(classes))


def test_one_class_met_by_several_tools_is_one_line_naming_them_all():
    rows = [
        lesson_row(
            "airline",
            "failure",
            "x",
            NOW - timedelta(hours=h),
            tool=tool,
            error=f"Error: not enough seats on flight HAT{h:03d}",
        )
        for tool, h in (("update_reservation_flights", 5), ("book_reservation", 4), ("update_reservation_flights", 3))
    ]
    [got] = select_lessons("airline", rows, NOW)
    assert (got.tool, got.also, got.times) == ("update_reservation_flights", ("book_reservation",), 3)
    assert lesson_line(got, NOW) == (
        "- [failure] update_reservation_flights, book_reservation: not enough seats "
        "on flight <id> (3 times, first 5 hours ago, last 3 hours ago)"
    )
    # ... and a failed_with fact of that class (of either tool) is not said again; of two facts of
    # another class, only one is
    facts = [
        fact("f1", "tool:book_reservation", "failed_with", "error:not enough seats on flight <id>", 0.95),
        fact("f2", "tool:update_reservation_flights", "failed_with", "error:payment method not found", 0.95),
        fact("f3", "tool:book_reservation", "failed_with", "error:payment method not found", 0.9),
    ]
    b = render_briefing("airline", [got], facts, [], 2000, NOW)
    assert [f.triple_id for f in b.facts] == ["f2"]
    # nor is a NAc concept whose outcome is that class
    concept = KnowledgeItem(
        text='"book_reservation_unreliable" (causal_pattern, confidence=0.90): Calls to '
        "book_reservation tend to end in error:not enough seats on flight <id>",
        scope="global",
        score=0.9,
        subjects=("book_reservation",),
        error_classes=("not enough seats on flight <id>",),
    )
    other = msgspec.structs.replace(concept, text="another", error_classes=("card declined",))
    b = render_briefing("airline", [got], [], [], 2000, NOW, [concept, other])
    assert "book_reservation_unreliable" not in b.markdown and "- another" in b.markdown


def test_a_class_resolved_every_time_is_a_recovery_that_says_what_resolved_it():
    rows = [
        lesson_row(
            "s",
            "recovery",
            f"http_get: rate limit encountered; exponential backoff resolved it (1 failed attempt, {n}s)",
            NOW - timedelta(hours=n),
            tool="http_get",
            error="HTTP 429: Too Many Requests",
        )
        for n in (1, 2)
    ]
    [got] = select_lessons("s", rows, NOW)
    assert (got.kind, got.times, got.resolved, got.resolution) == ("recovery", 2, 2, "exponential backoff")
    assert lesson_line(got, NOW) == (
        "- [recovery] http_get: HTTP 429: Too Many Requests; resolved by exponential "
        "backoff (twice, first 2 hours ago, last 1 hour ago)"
    )


def test_recurrence_ranks_a_class_that_keeps_happening_above_one_that_stopped():
    """Recency, not only frequency: 'old' was met 6 times long ago, 'now' 3 times lately."""
    rows, episodes = [], []
    for i in range(30):
        at = NOW - timedelta(hours=30 - i)
        eid = f"e{i}"
        episodes.append({"agent": "a", "episode_id": eid, "ended_at": at, "tools": ["t", "u"], "outcome": "failure"})
        if i < 6:
            rows.append(lesson_row("a", "failure", "t failed", at, tool="t", error="old problem", episode_id=eid))
        if i >= 27:
            rows.append(lesson_row("a", "failure", "u failed", at, tool="u", error="new problem", episode_id=eid))
    got = select_lessons("a", rows, NOW, episodes=episodes)
    assert [(x.tool, x.times) for x in got] == [("u", 3), ("t", 6)]  # the most recent first, though rarer
    assert got[0].recurrence > got[1].recurrence
    # By recency alone ('now' is newer) and by frequency alone ('old' is more frequent) the order would differ
    # from a class that is both frequent and recent, which ranks first:
    rows.append(
        lesson_row("a", "failure", "u failed", NOW - timedelta(minutes=1), tool="u", error="both", episode_id="e29")
    )
    for i in range(20, 29):
        rows.append(
            lesson_row(
                "a", "failure", "u failed", NOW - timedelta(hours=30 - i), tool="u", error="both", episode_id=f"e{i}"
            )
        )
    assert select_lessons("a", rows, NOW, episodes=episodes)[0].text == "both"


def test_recurrence_is_the_nac_rule_at_session_level():
    t = NOW
    sessions = [
        (f"s{i}", (t + timedelta(minutes=i), {"x"} if i % 2 else {"y"}, {("x", "boom")} if i % 2 else set()))
        for i in range(40)
    ]
    got = recurrence(sessions, alpha=0.1)[("x", "boom")]
    # x is used in every other session (P ~ 0.5, a Rescorla-Wagner estimate) and fails every time it is used.
    assert 0.4 < got < 0.6
    slower = recurrence(sessions, alpha=0.05)[("x", "boom")]
    assert slower != got  # the agent's learning rate matters
    assert recurrence([], 0.1) == {}


def test_the_agents_learning_rate_sets_the_recurrence():
    fleet = {"fast": AgentSpec(name="fast", learning_rate=LearningRate.AGGRESSIVE), "slow": AgentSpec(name="slow")}
    rows, eps = {}, {}
    for name in fleet:
        rows[name] = [
            lesson_row(
                name, "failure", "x", NOW - timedelta(hours=20 - i), tool="t", error="e", episode_id=f"{name}{i}"
            )
            for i in range(0, 20, 3)
        ]
        eps[name] = [
            {
                "agent": name,
                "episode_id": f"{name}{i}",
                "ended_at": NOW - timedelta(hours=20 - i),
                "tools": ["t"],
                "outcome": "failure",
            }
            for i in range(20)
        ]
    fast = select_inputs("fast", fleet, lessons=rows["fast"], triples=[], episodes=eps["fast"], now=NOW).lessons[0]
    slow = select_inputs("slow", fleet, lessons=rows["slow"], triples=[], episodes=eps["slow"], now=NOW).lessons[0]
    assert fast.recurrence != slow.recurrence


# ---- the budget ----------------------------------------------------------------------------

TITLE_LEN = len("## Session Briefing for researcher") + 1
TITLES = (LESSONS_TITLE, KNOWLEDGE_TITLE, STRATEGIES_TITLE)


def section_lines(b: somnus.processors.briefing.generator.Briefing) -> list[list[str]]:
    """The item lines of each section of a briefing."""
    out: list[list[str]] = [[], [], []]
    current = -1
    for line in b.markdown.splitlines():
        if line in TITLES:
            current = TITLES.index(line)
        elif line.startswith("- "):
            out[current].append(line)
    return out


def priority_lines(b: somnus.processors.briefing.generator.Briefing) -> list[tuple[int, str]]:
    """(section, line) of a briefing, in the budget's priority order."""
    sections = section_lines(b)
    taken = [0, 0, 0]
    out = []
    for i in priority_order([len(s) for s in sections]):
        out.append((i, sections[i][taken[i]]))
        taken[i] += 1
    return out


def cost_of_first(n: int) -> int:
    """Characters of a briefing holding the first n lines in priority order."""
    used, seen = TITLE_LEN, set()
    for section, line in priority_lines(full())[:n]:
        if section not in seen:
            used += 1 + len(TITLES[section]) + 1
            seen.add(section)
        used += len(line) + 1
    return used


def test_the_priority_order_interleaves_the_sections():
    assert list(priority_order([4, 3, 2])) == [0, 0, 0, 1, 1, 2, 0, 1, 2]
    assert list(priority_order([0, 1, 3])) == [1, 2, 2, 2]
    assert [s for s, _ in priority_lines(full())] == [0, 0, 0, 1, 1, 2, 1, 1, 2]


@pytest.mark.parametrize("n", range(0, 10))
@pytest.mark.parametrize("slack", [0, 1, -1])
def test_at_each_budget_the_briefing_is_the_longest_prefix_that_fits(n, slack):
    budget = cost_of_first(n) + slack
    b = render_briefing("researcher", LESSONS, FACTS, STRATEGIES, budget, NOW, KNOWLEDGE)
    expect = n if slack >= 0 else n - 1  # one character short drops the n-th line
    expect = max(expect, 0)
    assert len(b.markdown) <= budget
    chosen = priority_lines(full())[:expect]
    assert section_lines(b) == [[line for s, line in chosen if s == i] for i in range(3)]
    assert b.chars == (cost_of_first(expect) if expect else 0)


def test_every_section_gets_lines_before_any_section_gets_many():
    """Ten long lessons do not crowd out knowledge and strategies (issue 26)."""
    lessons = [
        lesson("failure", f"error class number {'x' * 100} {i}", 1, tool="t", recurrence=1 - i / 20) for i in range(10)
    ]
    facts = [fact(f"f{i}", "tool:t", "calls", f"api:h{i}", 0.9) for i in range(10)]
    ss = [strategy("kind", ("a", "b"), times=3)]
    b = render_briefing("researcher", lessons, facts, ss, 1000, NOW)
    assert b.lessons >= 3 and len(b.facts) >= 1 and b.strategies == 1 and b.chars <= 1000


def test_a_shorter_later_line_never_jumps_a_longer_earlier_one():
    # Room for the first lesson and a short fact, but not the second (long) lesson: the fact stays out.
    long_ = lesson("failure", "x" * 150, 1, tool="t", recurrence=0.9)
    short = lesson("failure", "short", 2, tool="t", recurrence=0.5)
    tiny = fact("t", "tool:a", "calls", "api:bcd", 0.9)
    first = render_briefing("a", [short], [], [], 10_000, NOW).chars
    budget = first + 60
    b = render_briefing("a", [long_, short], [tiny], [], budget, NOW)
    assert b.lessons == 0 and b.facts == [] and b.markdown == ""
    likelier_short = lesson("failure", "short", 2, tool="t", recurrence=0.95)  # now the short lesson comes first
    b = render_briefing("a", [long_, likelier_short], [tiny], [], budget, NOW)
    assert b.lessons == 1 and b.facts == [] and b.dropped_lessons == 1 and b.dropped_facts == 1


lesson_items = st.builds(
    LessonItem,
    kind=st.sampled_from(["failure", "recovery", "success", "other"]),
    text=st.text(max_size=300),
    tool=st.none() | st.text(min_size=1, max_size=30),
    learned_at=st.none() | st.integers(0, 10**7).map(lambda s: NOW - timedelta(seconds=s)),
    times=st.integers(1, 5),
    recurrence=st.floats(0, 1),
    resolved=st.integers(0, 5),
    resolution=st.none() | st.text(max_size=30),
)
fact_items = st.builds(
    FactItem,
    triple_id=st.text("abcdef0123", min_size=1, max_size=6),
    source=st.text(min_size=1, max_size=40),
    predicate=st.text(min_size=1, max_size=20),
    target=st.text(min_size=1, max_size=150),
    scope=st.sampled_from(["global", "agent:a"]),
    confidence=st.floats(0, 1),
    count=st.integers(1, 100),
)
strategy_items = st.builds(
    StrategyItem,
    task_kind=st.text(max_size=40),
    tools=st.lists(st.text(min_size=1, max_size=20), min_size=1, max_size=8).map(tuple),
    times=st.integers(2, 9),
    latest=st.integers(0, 10**7).map(lambda s: NOW - timedelta(seconds=s)),
)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(lesson_items, max_size=12),
    st.lists(fact_items, max_size=22),
    st.lists(strategy_items, max_size=6),
    st.integers(0, 6000),
)
def test_budget_properties(lessons, facts, strategies, budget):
    whole = render_briefing("a", lessons, facts, strategies, 10**7, NOW)
    b = render_briefing("a", lessons, facts, strategies, budget, NOW)
    assert len(b.markdown) == b.chars <= budget
    # No half lines: every line shown is a line of the whole briefing; what is shown is a prefix of
    # the priority order.
    order = priority_lines(whole)
    shown = sum(map(len, section_lines(b)))
    assert section_lines(b) == [[line for s, line in order[:shown] if s == i] for i in range(3)]
    assert b.markdown.count("\n") == len(b.markdown.splitlines())  # each item text is one line
    if shown < len(order):  # the next line would not have fitted
        bigger = render_briefing("a", lessons, facts, strategies, budget + len(order[shown][1]) + 100, NOW)
        assert sum(map(len, section_lines(bigger))) > shown
    # A larger budget never shows less.
    more = render_briefing("a", lessons, facts, strategies, budget + 50, NOW)
    assert all(m[: len(s)] == s for m, s in zip(section_lines(more), section_lines(b)))


@settings(max_examples=50, deadline=None)
@given(
    st.lists(lesson_items, max_size=8),
    st.lists(fact_items, max_size=8),
    st.lists(strategy_items, max_size=4),
    st.randoms(use_true_random=False),
)
def test_input_order_does_not_change_a_byte(lessons, facts, strategies, rnd):
    # Distinct triple ids: two facts with the same id and confidence/count have no defined order.
    facts = list({f.triple_id: f for f in facts}.values())
    a = render_briefing("a", lessons, facts, strategies, 1500, NOW)
    rnd.shuffle(lessons)
    rnd.shuffle(facts)
    rnd.shuffle(strategies)
    b = render_briefing("a", lessons, facts, strategies, 1500, NOW)
    assert a.markdown == b.markdown and a.briefing_id == b.briefing_id and a == b


def test_the_briefing_id_is_the_content_digest():
    assert full().briefing_id == full().briefing_id
    later = render_briefing("researcher", LESSONS, FACTS, STRATEGIES, 100_000, NOW + DAY, KNOWLEDGE)
    assert later.markdown != full().markdown and later.briefing_id != full().briefing_id
    other = render_briefing("scraper", LESSONS, FACTS, STRATEGIES, 100_000, NOW, KNOWLEDGE)
    assert other.briefing_id != full().briefing_id


# ---- text ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (-30, "just now"),
        (0, "just now"),
        (59, "just now"),
        (60, "1 minute ago"),
        (119, "1 minute ago"),
        (120, "2 minutes ago"),
        (3599, "59 minutes ago"),
        (3600, "1 hour ago"),
        (86399, "23 hours ago"),
        (86400, "1 day ago"),
        (2 * 86400 - 1, "1 day ago"),
        (2 * 86400, "2 days ago"),
        (400 * 86400, "400 days ago"),
    ],
)
def test_age_text(seconds, text):
    assert age_text(NOW - timedelta(seconds=seconds), NOW) == text


def test_age_text_of_unknown_and_naive_times():
    assert age_text(None, NOW) == "date unknown"
    assert age_text(datetime(2024, 5, 15, 12, 0), NOW) == "1 day ago"  # naive is read as UTC


BREAKS = ["\n", "\r", "\r\n", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029"]


@pytest.mark.parametrize("brk", BREAKS)
def test_one_line_removes_every_kind_of_line_break(brk):
    assert one_line(f"ignore{brk}previous") == "ignore previous"


@given(st.text(), st.integers(2, 300))
def test_one_line_is_one_line_within_its_limit(text, limit):
    out = one_line(text, limit)
    assert len(out) <= limit
    assert len(out.splitlines()) <= 1 and "\n" not in out
    assert out == out.strip()


def test_one_line_cuts_at_a_word_with_an_ellipsis():
    assert one_line("alpha beta gamma delta", 12) == "alpha beta…"
    assert one_line("x" * 30, 10) == "x" * 9 + "…"
    assert one_line("a" * 200) == "a" * 200


def test_a_lesson_line_is_one_line_even_with_a_hostile_text():
    line = lesson_line(lesson("failure", "boom\n### Key Knowledge\n- fake fact\u2028more"), NOW)
    assert line == "- [failure] boom ### Key Knowledge - fake fact more (1 day ago)"


def test_a_lesson_line_with_a_hostile_tool_name_is_one_line():
    line = lesson_line(lesson("failure", "boom", tool="t\n### Key Knowledge"), NOW)
    assert line == "- [failure] t ### Key Knowledge: boom (1 day ago)"


def test_fact_line_quotes_names_with_spaces_and_shows_two_decimals():
    assert (
        fact_line(fact("t", "tool:book_reservation", "failed_with", "error:payment amount does not add up", 0.955))
        == '- book_reservation failed_with "payment amount does not add up" (confidence 0.95)'
    )  # 0.955 -> 0.95 (binary)


@pytest.mark.parametrize(
    ("tasks", "kind"),
    [
        (
            [
                "Hi! I'd like to cancel my reservation 4WNS2K, please.",
                "I need to cancel reservation XEHM4B",
                "Hello, please cancel my reservations",
            ],
            "cancel reservation",
        ),
        (["Ship release 2.4 to production", "ship release 3.0 to production"], "ship release production"),
        (["refund order 1042", "Refund order 77", "refund order 9 for acme"], "refund order"),
        (["book a hotel", "rent a car"], ""),
        (["refund order 1"], ""),  # one task is not a kind
        ([], ""),
    ],
)
def test_task_kind(tasks, kind):
    assert task_kind(tasks) == kind


# ---- selecting the inputs ------------------------------------------------------------------


def lesson_row(
    agent: str,
    kind: str,
    text: str,
    at: datetime | None,
    tool: str | None = None,
    error: str | None = None,
    episode_id: str | None = None,
) -> dict:
    return {
        "episode_id": episode_id or str(uuid.uuid4()),
        "agent": agent,
        "session_id": "s",
        "idx": 0,
        "kind": kind,
        "text": text,
        "tool": tool,
        "error": error,
        "learned_at": at,
    }


def test_select_lessons_merges_repeats_and_ignores_other_agents_the_future_and_successes():
    rows = [
        lesson_row("a", "failure", "x broke", NOW - 3 * DAY),
        lesson_row("a", "failure", "x  broke", NOW - DAY),
        lesson_row("a", "failure", "x broke", NOW - 2 * DAY),
        lesson_row("b", "failure", "x broke", NOW),
        lesson_row("a", "failure", "from the future", NOW + timedelta(seconds=1)),
        lesson_row("a", "success", "succeeded using t", NOW),
        lesson_row("a", "recovery", "", NOW),
    ]
    [got] = select_lessons("a", rows, NOW)
    assert (got.kind, got.text, got.tool, got.times, got.learned_at, got.first_at) == (
        "failure",
        "x broke",
        None,
        3,
        NOW - DAY,
        NOW - 3 * DAY,
    )


def triple_row(
    tid: str,
    source: str,
    predicate: str,
    target: str,
    scope: str,
    conf: float = 0.9,
    valid_from: datetime = NOW - 5 * DAY,
    valid_to: datetime | None = None,
    count: int = 1,
) -> dict:
    return {
        "triple_id": tid,
        "source": source,
        "predicate": predicate,
        "target": target,
        "scope": scope,
        "confidence": conf,
        "count": count,
        "valid_from": valid_from,
        "valid_to": valid_to,
    }


FLEET = {
    "research-lead": AgentSpec(name="research-lead"),
    "researcher": AgentSpec(name="researcher", reports_to="research-lead"),
    "scraper": AgentSpec(name="scraper", reports_to="research-lead"),
    "ops-lead": AgentSpec(name="ops-lead"),
    "deployer": AgentSpec(name="deployer", reports_to="ops-lead"),
    "support": AgentSpec(name="support", reports_to="ops-lead", knowledge_scopes=["research-lead"]),
    "quiet": AgentSpec(name="quiet", reports_to="ops-lead", briefing_enabled=False),
}


def test_select_facts_reads_the_scope_chain_active_at_now():
    rows = [
        triple_row("own", "tool:http_get", "calls", "api:r.jina.ai", "agent:researcher"),
        triple_row("team", "api:x", "rate_limit", "rate:5/s", "team:research-lead"),
        triple_row("glob", "tool:y", "failed_with", "error:e", "global"),
        triple_row("other-agent", "tool:z", "calls", "api:z", "agent:scraper"),
        triple_row("other-team", "tool:z", "calls", "api:q", "team:ops-lead"),
        triple_row("closed", "api:x", "rate_limit", "rate:10/s", "team:research-lead", valid_to=NOW),
        triple_row("future", "tool:w", "calls", "api:w", "global", valid_from=NOW + DAY),
        triple_row("closes-later", "api:k", "rate_limit", "rate:1/s", "global", valid_to=NOW + DAY),
        triple_row("self-uses", "agent:researcher", "uses", "tool:http_get", "agent:researcher", conf=1.0),
        triple_row("other-uses", "agent:scraper", "uses", "tool:parse_html", "team:research-lead"),
        triple_row("self-other-predicate", "agent:researcher", "works_on", "project:atlas", "agent:researcher"),
    ]
    got = {f.triple_id for f in select_facts("researcher", FLEET, rows, NOW)}
    assert got == {"own", "team", "glob", "closes-later", "other-uses", "self-other-predicate"}
    # support reads team:research-lead through knowledgeScopes
    assert "team" in {f.triple_id for f in select_facts("support", FLEET, rows, NOW)}
    # With what the agent used: wider facts only about its entities (own facts always).
    used = {"tool:y", "api:k"}
    got = {f.triple_id for f in select_facts("researcher", FLEET, rows, NOW, used=used)}
    assert got == {"own", "glob", "closes-later", "self-other-predicate"}


def test_a_statement_in_several_scopes_is_one_fact_from_the_widest_scope_with_the_best_confidence():
    rows = [
        triple_row("private", "api:x", "rate_limit", "rate:5/s", "agent:researcher", conf=0.99),
        triple_row("promoted", "api:x", "rate_limit", "rate:5/s", "team:research-lead", conf=0.9),
        triple_row("global-other", "api:x", "rate_limit", "rate:6/s", "global", conf=0.5),
    ]
    got = select_facts("researcher", FLEET, rows, NOW)
    assert [(f.triple_id, f.scope, f.confidence) for f in got] == [
        ("promoted", "team:research-lead", 0.99),
        ("global-other", "global", 0.5),
    ]


def test_own_facts_are_served_first_and_wider_ones_only_where_they_concern_the_agent():
    """Issue 26: facts=[] in every default-fleet briefing; a billing agent briefed on airline tools."""
    triples = [
        triple_row("own", "tool:charge_card", "failed_with", "error:card declined", "agent:billing", 0.7),
        triple_row("own2", "agent:billing", "serves", "client:acme", "agent:billing", 0.9),
        triple_row("g1", "tool:book_reservation", "failed_with", "error:payment amount does not add up", "global", 1.0),
        triple_row("g2", "tool:charge_card", "calls", "api:stripe.example", "global", 0.95),
    ]
    eps = [episode_row("billing", "charge acme", ["charge_card"], episode_id="b1")]
    got = select_inputs("billing", {}, lessons=[], triples=triples, episodes=eps, now=NOW)
    assert [f.triple_id for f in got.facts] == ["g2", "own2", "own"]
    b = render_briefing("billing", got.lessons, got.facts, got.strategies, 2000, NOW, got.knowledge)
    assert [f.triple_id for f in b.facts] == ["own2", "own", "g2"]  # own first
    assert "book_reservation" not in b.markdown


def test_wider_knowledge_only_about_tools_the_agent_used_and_from_agents_its_chain_covers():
    items = [
        KnowledgeItem(text="mine", scope="agent:researcher", score=0.1),
        KnowledgeItem(text="about http_get", scope="global", score=0.9, subjects=("http_get",), agents=("researcher",)),
        KnowledgeItem(text="about http_get, provenance unknown", scope="global", score=0.9, subjects=("http_get",)),
        KnowledgeItem(text="about airline tools", scope="global", score=0.9, subjects=("book_reservation",)),
        KnowledgeItem(text="corr of two", scope="global", score=0.9, subjects=("http_get", "deploy")),
        KnowledgeItem(
            text="from the team",
            scope="team:research-lead",
            score=0.8,
            subjects=("http_get",),
            agents=("researcher", "scraper"),
        ),
        KnowledgeItem(
            text="from another team too",
            scope="global",
            score=0.8,
            subjects=("http_get",),
            agents=("researcher", "deployer"),
        ),
        KnowledgeItem(text="no subject, derived", scope="global", score=0.9),
        KnowledgeItem(text="ingested: http_get needs a token", scope="global", score=0.5, derived=False),
        KnowledgeItem(text="ingested: unrelated", scope="global", score=0.5, derived=False),
        KnowledgeItem(text="other agent's own", scope="agent:scraper", score=0.9),
        KnowledgeItem(text="other team", scope="team:ops-lead", score=0.9, subjects=("http_get",)),
        KnowledgeItem(
            text="in its own memory, from another team's data",
            scope="agent:researcher",
            score=0.9,
            agents=("researcher", "deployer"),
        ),
    ]
    got = select_knowledge("researcher", FLEET, items, tools={"http_get"}, entities={"tool:http_get"})
    assert [k.text for k in got] == ["mine", "about http_get", "from the team", "ingested: http_get needs a token"]
    assert covers(FLEET, "researcher", "scraper") and not covers(FLEET, "researcher", "deployer")
    assert covers(FLEET, "support", "scraper")  # support names research-lead in knowledgeScopes


def episode_row(
    agent: str, task: str, tools, outcome: str = "success", ended: datetime = NOW - DAY, episode_id: str | None = None
) -> dict:
    return {
        "agent": agent,
        "task": task,
        "outcome": outcome,
        "tools": tools,
        "ended_at": ended,
        "episode_id": episode_id or str(uuid.uuid4()),
    }


def test_select_strategies():
    rows = [
        episode_row("a", "refund order 1", ["crm_lookup", "http_post"], ended=NOW - 3 * DAY),
        episode_row("a", "Refund order 22", ["crm_lookup", "http_post"], ended=NOW - 2 * DAY),
        episode_row("a", "Hi! Please refund order 3", ["crm_lookup", "send_email"]),
        episode_row("a", "I need a refund for 4", '["crm_lookup", "send_email"]'),  # JSON text, as over HTTP
        episode_row("a", "refund order 5", ["crm_lookup", "send_email"], outcome="failure"),
        episode_row("a", "refund order 6", ["crm_lookup", "send_email"], ended=NOW + DAY),
        episode_row("b", "refund order 7", ["crm_lookup", "send_email"]),
        episode_row("a", "answer the acme escalation", ["crm_lookup"]),  # once only: not a strategy
        episode_row("a", "answer the acme escalation", []),
        episode_row("a", "long", [f"t{i}" for i in range(12)]),
        episode_row("a", "long", [f"t{i}" for i in range(10)]),  # same first 8 steps
    ]
    got = select_strategies("a", rows, NOW)
    # Every sequence that worked at least twice, named by the words its tasks share; by times, then
    # recency, then the longer sequence.
    assert got == [
        StrategyItem(
            task_kind="long", tools=tuple(f"t{i}" for i in range(MAX_STRATEGY_STEPS)), times=2, latest=NOW - DAY
        ),
        StrategyItem(task_kind="refund", tools=("crm_lookup", "send_email"), times=2, latest=NOW - DAY),
        StrategyItem(task_kind="refund order", tools=("crm_lookup", "http_post"), times=2, latest=NOW - 2 * DAY),
    ]


def test_strategies_need_two_successes_of_a_sequence_whatever_the_phrasing():
    """tau-bench: the first user message starts every task, greetings and ids differ."""
    tasks = [
        "Hi! I need to cancel my flights from MCO to CLT and get a refund, please.",
        "Hello. I'd like to cancel reservation 4WNS2K.",
        "hey, cancel my trip to Boston pls",
    ]
    tools = ["get_user_details", "get_reservation_details", "cancel_reservation"]
    rows = [episode_row("airline", t, tools, ended=NOW - timedelta(hours=i)) for i, t in enumerate(tasks)]
    [s] = select_strategies("airline", rows, NOW)
    assert (s.task_kind, s.tools, s.times) == ("cancel", tuple(tools), 3)
    assert select_strategies("airline", rows[:1], NOW) == []


def test_briefing_for_uses_the_agents_budget_and_switch():
    lessons = [lesson_row(a, "failure", f"{a} broke " + "x" * 80, NOW - DAY) for a in ("researcher", "quiet")]
    fleet = dict(FLEET, researcher=AgentSpec(name="researcher", reports_to="research-lead", briefing_token_budget=60))
    assert briefing_for("researcher", fleet, lessons=lessons, triples=[], episodes=[], now=NOW).markdown == ""
    wide = briefing_for("researcher", FLEET, lessons=lessons, triples=[], episodes=[], now=NOW)
    assert wide.budget == 2000 and wide.lessons == 1
    assert briefing_for("quiet", FLEET, lessons=lessons, triples=[], episodes=[], now=NOW).markdown == ""
    stranger = briefing_for(
        "stranger", FLEET, lessons=[lesson_row("stranger", "failure", "x", NOW)], triples=[], episodes=[], now=NOW
    )
    assert stranger.budget == DEFAULT_BUDGET and stranger.lessons == 1


def test_inputs_selected_from_duckdb_rows():
    """The row shapes the projector's tables really give (UUIDs, TIMESTAMPTZ, VARCHAR[])."""
    con = duckdb.connect()
    schema.init(con)
    con.execute(
        "INSERT INTO lessons VALUES (uuid(), 'researcher', 's1', 0, 'failure', "
        "'http_get failed with ''HTTP 404 /p/1''', 'http_get', 'HTTP 404 /p/1', ?)",
        [NOW - DAY],
    )
    con.execute(
        "INSERT INTO episodes (episode_id, agent, session_id, task, outcome, ended_at, tools) VALUES "
        "(uuid(), 'researcher', 's1', 'summarise pricing pages', 'success', ?, ['http_get', 'summarize']), "
        "(uuid(), 'researcher', 's2', 'summarise pricing pages', 'success', ?, ['http_get', 'summarize'])",
        [NOW - 2 * DAY, NOW - DAY],
    )
    con.execute(
        "INSERT INTO triples (triple_id, source, predicate, target, scope, confidence, count, evidence, "
        "valid_from, created_by, extractor) VALUES "
        "(uuid(), 'tool:http_get', 'calls', 'api:r.jina.ai', 'agent:researcher', 0.95, 3, uuid(), ?, "
        "'researcher', 'trace/1')",
        [NOW - 3 * DAY],
    )

    def rows(sql: str) -> list[dict]:
        rel = con.execute(sql)
        cols = [d[0] for d in rel.description]
        return [dict(zip(cols, r)) for r in rel.fetchall()]

    got = select_inputs(
        "researcher",
        FLEET,
        lessons=rows("SELECT * FROM lessons"),
        triples=rows("SELECT * FROM triples"),
        episodes=rows("SELECT * FROM episodes"),
        now=NOW,
    )
    b = render_briefing("researcher", got.lessons, got.facts, got.strategies, 2000, NOW)
    assert b.markdown.splitlines()[3:] == [
        "- [failure] http_get: HTTP 404: <path> (1 day ago)",
        "",
        KNOWLEDGE_TITLE,
        "- http_get calls r.jina.ai (confidence 0.95)",
        "",
        STRATEGIES_TITLE,
        "- summarise pricing pages: http_get -> summarize (worked 2 times, latest 1 day ago)",
    ]


# ---- cache invalidation --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "agents"),
    [
        (EpisodeArrived("researcher"), {"researcher"}),
        (EpisodeArrived("quiet"), set()),  # briefings off: nothing cached to invalidate
        (EpisodeArrived("stranger"), {"stranger"}),
        (TripleChanged("agent:scraper"), {"scraper"}),
        (TripleChanged("agent:stranger"), set()),  # not declared and not known
        (TripleChanged("team:research-lead"), {"researcher", "scraper", "support"}),  # support via knowledgeScopes
        (TripleChanged("team:ops-lead"), {"deployer", "support"}),  # quiet is off; the lead does not read its team
        (TripleChanged("team:nobody"), set()),
        (TripleChanged("global"), {"research-lead", "researcher", "scraper", "ops-lead", "deployer", "support"}),
    ],
)
def test_which_briefings_a_change_invalidates(change, agents):
    assert affected_agents(FLEET, change) == agents


def test_known_undeclared_agents_read_their_own_scope_and_global():
    assert affected_agents(FLEET, TripleChanged("global"), known=["stranger"]) >= {"stranger"}
    assert affected_agents(FLEET, TripleChanged("agent:stranger"), known=["stranger"]) == {"stranger"}
    assert "stranger" not in affected_agents(FLEET, TripleChanged("team:ops-lead"), known=["stranger"])


def test_invalidation_agrees_with_the_scope_chain_for_the_built_in_fleet():
    from somnus.schemas.agents import scope_chain

    fleet = load_agents()
    scopes = {s for a in fleet for s in scope_chain(fleet, a)}
    for scope in scopes:
        assert affected_agents(fleet, TripleChanged(scope)) == {a for a in fleet if scope in scope_chain(fleet, a)}


def test_a_batch_regenerates_the_union_sorted_and_skips_the_rest():
    changes = changes_of(["scraper", "scraper"], ["agent:deployer", "team:research-lead", "agent:deployer"])
    assert changes == [EpisodeArrived("scraper"), TripleChanged("agent:deployer"), TripleChanged("team:research-lead")]
    assert agents_to_regenerate(FLEET, changes) == ["deployer", "researcher", "scraper", "support"]
    assert agents_to_regenerate(FLEET, []) == []


def test_regenerating_only_affected_agents_gives_the_same_cache_as_regenerating_all():
    """Skipping unaffected agents is safe: their briefing would not change."""
    rnd = random.Random(7)
    agents = sorted(a for a in FLEET if FLEET[a].briefing_enabled)
    scopes = ["global", "team:research-lead", "team:ops-lead"] + [f"agent:{a}" for a in agents]
    triples, lessons = [], []

    def cache() -> dict[str, str]:
        return {
            a: briefing_for(a, FLEET, lessons=lessons, triples=triples, episodes=[], now=NOW).markdown for a in agents
        }

    cached = cache()
    for i in range(40):
        if rnd.random() < 0.5:
            scope = rnd.choice(scopes)
            triples.append(triple_row(f"t{i}", f"tool:x{i}", "calls", f"api:h{i}", scope, conf=rnd.random()))
            change = TripleChanged(scope)
        else:
            agent = rnd.choice(agents)
            # a lesson about a tool some wider facts are about: those facts now concern the agent
            lessons.append(
                lesson_row(
                    agent, "failure", f"lesson {i}", NOW - DAY, tool=f"x{rnd.randrange(i + 1)}", error=f"error {i}"
                )
            )
            change = EpisodeArrived(agent)
        hit = affected_agents(FLEET, change)
        fresh = cache()
        for a in agents:
            if a not in hit:
                assert fresh[a] == cached[a], (change, a)
        cached = fresh


def test_the_docstring_examples_run():
    assert doctest.testmod(somnus.processors.briefing.generator).failed == 0


# ---- what earns a line ---------------------------------------------------------------------------


def test_that_a_session_failed_is_no_lesson_but_a_failed_delegation_is():
    rows = [
        lesson_row(
            "lead",
            "failure",
            f"session ended in failure after {n} tool calls (last tool: plan): reward 0",
            NOW - timedelta(hours=n),
        )
        for n in (1, 2, 3)
    ]
    rows += [
        lesson_row("lead", "failure", "session abandoned: no event for 600 s of stream time; 3 tool calls", NOW - DAY),
        lesson_row("lead", "failure", "delegation to support failed: no answer", NOW - DAY),
        lesson_row("lead", "failure", "delegation to support failed: no answer", NOW - 2 * DAY),
    ]
    got = select_lessons("lead", rows, NOW)
    assert [(x.text, x.times) for x in got] == [("delegation to support failed: no answer", 2)]


def test_at_most_two_lessons_without_a_tool_error():
    rows = [
        lesson_row("a", "failure", f"delegation to {name} failed", NOW - timedelta(hours=i))
        for i, name in enumerate(("alpha", "beta", "gamma", "delta"))
    ]
    rows.append(lesson_row("a", "failure", "x", NOW, tool="t", error="boom"))
    b = render_briefing("a", select_lessons("a", rows, NOW), [], [], 10_000, NOW)
    assert b.lessons == 3 and "t: boom" in b.markdown


def test_one_fact_line_per_pair_of_entities():
    facts = [
        fact("ab", "tool:a", "depends_on", "tool:b", 0.9),
        fact("ba", "tool:b", "depends_on", "tool:a", 0.65),
        fact("ac", "tool:a", "depends_on", "tool:c", 0.65),
    ]
    b = render_briefing("researcher", [], facts, [], 10_000, NOW)
    assert [f.triple_id for f in b.facts] == ["ab", "ac"]


def test_facts_are_ranked_by_how_likely_they_concern_the_next_session_and_rare_ones_left_out():
    """Of the agent's own facts, those about tools it uses most lead; a fact seen in few of its
    sessions (a client of one session in ten) is left out; a failed_with warning is kept."""
    eps = [
        episode_row(
            "a",
            "t",
            ["common", "rare"] if i % 10 == 0 else ["common"],
            outcome="failure",
            ended=NOW - timedelta(hours=i),
            episode_id=f"e{i}",
        )
        for i in range(20)
    ]
    triples = [
        triple_row("rare-dep", "tool:rare", "depends_on", "tool:other", "agent:a", conf=1.0),
        triple_row("common-dep", "tool:common", "depends_on", "tool:other", "agent:a", conf=0.65),
        triple_row("client", "agent:a", "serves", "client:acme", "agent:a", conf=0.9, count=2),
        triple_row("project", "agent:a", "works_on", "project:atlas", "agent:a", conf=0.9, count=18),
        triple_row("warn", "tool:rare", "failed_with", "error:disk full", "agent:a", conf=0.95),
        triple_row("team", "api:x", "requires", "header:key", "team:research-lead", conf=0.9),
        triple_row("own-api", "tool:common", "calls", "api:x", "agent:a", conf=0.95, count=40),
    ]
    got = select_inputs("a", {}, lessons=[], triples=triples, episodes=eps, now=NOW).facts
    assert [f.triple_id for f in got] == ["own-api", "common-dep", "project", "warn"]
    assert got[0].relevance == 1.0 and got[-1].relevance < 0.5
    # the team fact about api:x, which the agent calls in most sessions, concerns it
    fleet = {"a": AgentSpec(name="a", reports_to="research-lead")}
    got = select_inputs("a", fleet, lessons=[], triples=triples, episodes=eps, now=NOW).facts
    assert "team" in [f.triple_id for f in got]


def _polar(name: str, scope: str, v: float, score: float = 0.8) -> KnowledgeItem:
    tool, _, kind = name.rpartition("_")
    outcome = "succeed (ok)" if kind == "reliable" else "end in error:timeout"
    text = (
        f'"{name}" (causal_pattern, confidence={score:.2f}): Calls to {tool} tend to {outcome}: '
        f"seen 9 times (strength V={v:.2f})."
    )
    return KnowledgeItem(text=text, scope=scope, score=score, name=name, subjects=(tool,), agents=("researcher",))


@pytest.mark.parametrize(
    "ok_share, kept", [(0.8, "http_get_reliable"), (0.5, "http_get_reliable"), (0.3, "http_get_unreliable")]
)
def test_a_tool_is_either_reliable_or_unreliable_in_one_briefing(ok_share, kept):
    """Both concepts of a tool in one memory: the success share (V of "ok") decides which one line is
    shown; the rendered briefing never says both."""
    items = [
        _polar("http_get_reliable", "agent:researcher", ok_share),
        _polar("http_get_unreliable", "agent:researcher", 1 - ok_share, score=0.9),
        _polar("parse_html_unreliable", "agent:researcher", 0.6),
    ]
    got = select_knowledge("researcher", FLEET, items, tools={"http_get", "parse_html"}, entities=set())
    assert sorted(k.name for k in got) == sorted([kept, "parse_html_unreliable"])
    b = render_briefing("researcher", [], [], [], budget=4000, now=NOW, knowledge=got)
    assert f'"{kept}"' in b.markdown
    assert ('"http_get_reliable"' in b.markdown) != ('"http_get_unreliable"' in b.markdown)


def test_the_narrowest_scope_decides_a_tools_reliability():
    """The agent's own evidence says unreliable; the team's and global say reliable: one line, its own."""
    items = [
        _polar("http_get_unreliable", "agent:researcher", 0.7),
        _polar("http_get_reliable", "team:research-lead", 0.9, score=0.95),
        _polar("http_get_reliable", "global", 0.9, score=0.95),
        _polar("http_get_unreliable", "global", 0.1),
    ]
    got = select_knowledge("researcher", FLEET, items, tools={"http_get"}, entities=set())
    assert [(k.name, k.scope) for k in got] == [("http_get_unreliable", "agent:researcher")]
    # and with no readable strength, the more confident concept of the narrowest scope
    bare = [msgspec.structs.replace(k, text=k.name) for k in items[1:3]] + [
        msgspec.structs.replace(_polar("http_get_unreliable", "team:research-lead", 0.5, score=0.5), text="x")
    ]
    got = select_knowledge("researcher", FLEET, bare, tools={"http_get"}, entities=set())
    assert [(k.name, k.scope) for k in got] == [("http_get_reliable", "team:research-lead")]
