"""processors.briefing: priority order, budget trimming, ages, input selection, cache invalidation."""

from __future__ import annotations

import doctest
import random
import uuid
from datetime import datetime, timedelta, timezone

import duckdb
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import processors.briefing
from processors.briefing import (
    DEFAULT_BUDGET,
    KNOWLEDGE_TITLE,
    LESSONS_TITLE,
    MAX_FACTS,
    MAX_ITEM_CHARS,
    MAX_LESSONS,
    MAX_STRATEGIES,
    MAX_STRATEGY_STEPS,
    MIN_STRATEGY_SUPPORT,
    SELF_EVIDENT_PREDICATES,
    STRATEGIES_TITLE,
    TASK_KIND_WORDS,
    EpisodeArrived,
    FactItem,
    LessonItem,
    StrategyItem,
    TripleChanged,
    affected_agents,
    age_text,
    agents_to_regenerate,
    briefing_for,
    changes_of,
    fact_line,
    lesson_line,
    one_line,
    render_briefing,
    select_facts,
    select_inputs,
    select_lessons,
    select_strategies,
    strategy_line,
    task_kind,
)
from projections import schema
from somnus.agents import AgentSpec, load_agents

NOW = datetime(2024, 5, 16, 12, 0, tzinfo=timezone.utc)
DAY = timedelta(days=1)


def lesson(kind: str, text: str, days_ago: float = 1, times: int = 1) -> LessonItem:
    return LessonItem(kind=kind, text=text, learned_at=NOW - timedelta(days=days_ago), times=times)


def fact(tid: str, source: str, predicate: str, target: str, conf: float, count: int = 1,
         scope: str = "agent:researcher") -> FactItem:
    return FactItem(triple_id=tid, source=source, predicate=predicate, target=target, scope=scope,
                    confidence=conf, count=count)


def strategy(kind: str, tools: tuple[str, ...], times: int = 2, days_ago: float = 1) -> StrategyItem:
    return StrategyItem(task_kind=kind, tools=tools, times=times, latest=NOW - timedelta(days=days_ago))


LESSONS = [
    lesson("success", "succeeded using web_search -> http_get", days_ago=0.5),
    lesson("failure", "http_get failed with 'HTTP 403 Forbidden' and it was never resolved (2 attempts)", 1),
    lesson("recovery", "http_get: rate limit encountered; exponential backoff resolved it", 2, times=3),
    lesson("failure", "session ended in failure after 4 tool calls", 3),
]
FACTS = [
    fact("t2", "tool:http_get", "calls", "api:r.jina.ai", 0.9, count=2),
    fact("t1", "api:api.instantly.ai", "rate_limit", "rate:10/s", 1.0),
    fact("t3", "tool:http_get", "failed_with", "error:HTTP 403: Forbidden", 0.95),
]
STRATEGIES = [
    strategy("summarise pricing pages", ("http_get", "summarize"), times=3),
    strategy("find the pagination rules of", ("web_search", "http_get"), times=2),
]


def full() -> processors.briefing.Briefing:
    return render_briefing("researcher", LESSONS, FACTS, STRATEGIES, budget=100_000, now=NOW)


def test_numbers_are_pinned():
    assert (MAX_LESSONS, MAX_FACTS, MAX_STRATEGIES, MAX_ITEM_CHARS) == (10, 20, 5, 200)
    assert (MIN_STRATEGY_SUPPORT, MAX_STRATEGY_STEPS, TASK_KIND_WORDS, DEFAULT_BUDGET) == (2, 8, 6, 2000)
    assert SELF_EVIDENT_PREDICATES == {"uses"}
    assert AgentSpec(name="x").briefing_token_budget == DEFAULT_BUDGET


def test_the_whole_briefing_reads_as_designed():
    assert full().markdown == (
        "## Session Briefing for researcher\n"
        "\n"
        "### Recent Lessons\n"
        "- [failure] http_get failed with 'HTTP 403 Forbidden' and it was never resolved (2 attempts) (1 day ago)\n"
        "- [failure] session ended in failure after 4 tool calls (3 days ago)\n"
        "- [recovery] http_get: rate limit encountered; exponential backoff resolved it (3 times, latest 2 days ago)\n"
        "- [success] succeeded using web_search -> http_get (12 hours ago)\n"
        "\n"
        "### Key Knowledge\n"
        "- api.instantly.ai rate_limit 10/s (confidence 1.00)\n"
        '- http_get failed_with "HTTP 403: Forbidden" (confidence 0.95)\n'
        "- http_get calls r.jina.ai (confidence 0.90)\n"
        "\n"
        "### Active Strategies\n"
        "- summarise pricing pages: http_get -> summarize (worked 3 times, latest 1 day ago)\n"
        "- find the pagination rules of: web_search -> http_get (worked 2 times, latest 1 day ago)\n")
    b = full()
    assert (b.lessons, len(b.facts), b.strategies) == (4, 3, 2)
    assert (b.dropped_lessons, b.dropped_facts, b.dropped_strategies) == (0, 0, 0)
    assert b.chars == len(b.markdown) and b.agent == "researcher" and b.generated_at == NOW
    assert [f.triple_id for f in b.facts] == ["t1", "t3", "t2"]
    assert [(f.source_name, f.target_name) for f in b.facts][0] == ("api.instantly.ai", "10/s")


def test_lessons_failures_first_then_recoveries_then_successes_newest_first_within_a_kind():
    lessons = [lesson("success", "s new", 0.1), lesson("failure", "f old", 9), lesson("recovery", "r", 0.2),
               lesson("failure", "f new", 1), lesson("other", "o", 0.0)]
    b = render_briefing("a", lessons, [], [], 10_000, NOW)
    kinds = [line.split("]")[0] + "] " + line.split("] ")[1].split(" (")[0]
             for line in b.markdown.splitlines() if line.startswith("- [")]
    assert kinds == ["- [failure] f new", "- [failure] f old", "- [recovery] r", "- [success] s new", "- [other] o"]


def test_facts_by_confidence_then_count_then_triple_id():
    facts = [fact("b", "tool:x", "calls", "api:a", 0.9, 1), fact("a", "tool:x", "calls", "api:b", 0.9, 1),
             fact("c", "tool:x", "calls", "api:c", 0.9, 5), fact("d", "tool:x", "calls", "api:d", 0.95, 1)]
    b = render_briefing("a", [], facts, [], 10_000, NOW)
    assert [f.triple_id for f in b.facts] == ["d", "c", "a", "b"]


def test_strategies_by_times_then_recency():
    ss = [strategy("k1", ("a",), times=2, days_ago=1), strategy("k2", ("b",), times=4, days_ago=5),
          strategy("k3", ("c",), times=2, days_ago=0.5)]
    b = render_briefing("a", [], [], ss, 10_000, NOW)
    assert [line.split(":")[0] for line in b.markdown.splitlines() if line.startswith("- ")] == ["- k2", "- k3", "- k1"]


def test_section_limits_cap_the_lines_considered():
    lessons = [lesson("failure", f"lesson {i}", i) for i in range(MAX_LESSONS + 3)]
    facts = [fact(f"t{i:02d}", "tool:x", "calls", f"api:h{i}", 0.5) for i in range(MAX_FACTS + 3)]
    ss = [strategy(f"kind {i}", ("a", "b"), days_ago=i) for i in range(MAX_STRATEGIES + 3)]
    b = render_briefing("a", lessons, facts, ss, 100_000, NOW)
    assert (b.lessons, len(b.facts), b.strategies) == (MAX_LESSONS, MAX_FACTS, MAX_STRATEGIES)
    assert (b.dropped_lessons, b.dropped_facts, b.dropped_strategies) == (3, 3, 3)


# ---- the budget ----------------------------------------------------------------------------

TITLE_LEN = len("## Session Briefing for researcher") + 1


def item_lines() -> list[tuple[int, str]]:
    """(section, line) of the full briefing, in priority order."""
    lines = [(0, lesson_line(x, NOW)) for x in sorted(LESSONS, key=processors.briefing.lesson_order)]
    lines += [(1, fact_line(x)) for x in sorted(FACTS, key=processors.briefing.fact_order)]
    lines += [(2, strategy_line(x, NOW)) for x in sorted(STRATEGIES, key=processors.briefing.strategy_order)]
    return lines


def cost_of_first(n: int) -> int:
    """Characters of a briefing holding the first n lines in priority order."""
    titles = (LESSONS_TITLE, KNOWLEDGE_TITLE, STRATEGIES_TITLE)
    used, seen = TITLE_LEN, set()
    for section, line in item_lines()[:n]:
        if section not in seen:
            used += 1 + len(titles[section]) + 1
            seen.add(section)
        used += len(line) + 1
    return used


@pytest.mark.parametrize("n", range(0, 10))
@pytest.mark.parametrize("slack", [0, 1, -1])
def test_at_each_budget_the_briefing_is_the_longest_prefix_that_fits(n, slack):
    budget = cost_of_first(n) + slack
    b = render_briefing("researcher", LESSONS, FACTS, STRATEGIES, budget, NOW)
    expect = n if slack >= 0 else n - 1  # one character short drops the n-th line
    expect = max(expect, 0)
    assert len(b.markdown) <= budget
    shown = [line for line in b.markdown.splitlines() if line.startswith("- ")]
    assert shown == [line for _, line in item_lines()[:expect]]
    assert b.chars == (cost_of_first(expect) if expect else 0)


@pytest.mark.parametrize(("budget_of", "sections"), [
    (lambda: cost_of_first(9), {LESSONS_TITLE, KNOWLEDGE_TITLE, STRATEGIES_TITLE}),
    (lambda: cost_of_first(8), {LESSONS_TITLE, KNOWLEDGE_TITLE, STRATEGIES_TITLE}),
    (lambda: cost_of_first(7), {LESSONS_TITLE, KNOWLEDGE_TITLE}),  # strategies go first
    (lambda: cost_of_first(5), {LESSONS_TITLE, KNOWLEDGE_TITLE}),
    (lambda: cost_of_first(4), {LESSONS_TITLE}),  # then knowledge
    (lambda: cost_of_first(1), {LESSONS_TITLE}),  # lessons last
    (lambda: cost_of_first(1) - 1, set()),
    (lambda: 0, set()),
])
def test_strategies_are_trimmed_before_knowledge_and_knowledge_before_lessons(budget_of, sections):
    b = render_briefing("researcher", LESSONS, FACTS, STRATEGIES, budget_of(), NOW)
    assert {line for line in b.markdown.splitlines() if line.startswith("### ")} == sections
    if not sections:
        assert b.markdown == "" and b.chars == 0


def test_a_shorter_later_line_never_jumps_a_longer_earlier_one():
    # Room for the first lesson and a short fact, but not the second (long) lesson: the fact stays out.
    long_ = lesson("failure", "x" * 150, 1)
    short = lesson("failure", "short", 2)
    tiny = fact("t", "tool:a", "calls", "api:bcd", 0.9)
    first = render_briefing("a", [short], [], [], 10_000, NOW).chars
    budget = first + 60
    b = render_briefing("a", [long_, short], [tiny], [], budget, NOW)
    assert b.lessons == 0 and b.facts == [] and b.markdown == ""
    newer_short = lesson("failure", "short", 0.5)  # now the short lesson comes first
    b = render_briefing("a", [long_, newer_short], [tiny], [], budget, NOW)
    assert b.lessons == 1 and b.facts == [] and b.dropped_lessons == 1 and b.dropped_facts == 1


lesson_items = st.builds(LessonItem, kind=st.sampled_from(["failure", "recovery", "success", "other"]),
                         text=st.text(max_size=300),
                         learned_at=st.none() | st.integers(0, 10**7).map(lambda s: NOW - timedelta(seconds=s)),
                         times=st.integers(1, 5))
fact_items = st.builds(FactItem, triple_id=st.text("abcdef0123", min_size=1, max_size=6),
                       source=st.text(min_size=1, max_size=40), predicate=st.text(min_size=1, max_size=20),
                       target=st.text(min_size=1, max_size=150), scope=st.just("global"),
                       confidence=st.floats(0, 1), count=st.integers(1, 100))
strategy_items = st.builds(StrategyItem, task_kind=st.text(max_size=40),
                           tools=st.lists(st.text(min_size=1, max_size=20), min_size=1, max_size=8).map(tuple),
                           times=st.integers(2, 9),
                           latest=st.integers(0, 10**7).map(lambda s: NOW - timedelta(seconds=s)))


@settings(max_examples=200, deadline=None)
@given(st.lists(lesson_items, max_size=12), st.lists(fact_items, max_size=22), st.lists(strategy_items, max_size=6),
       st.integers(0, 6000))
def test_budget_properties(lessons, facts, strategies, budget):
    whole = render_briefing("a", lessons, facts, strategies, 10**7, NOW)
    b = render_briefing("a", lessons, facts, strategies, budget, NOW)
    assert len(b.markdown) == b.chars <= budget
    # No half lines: every line shown is a line of the whole briefing, in the same order.
    whole_lines = whole.markdown.splitlines()
    items = [x for x in whole_lines if x.startswith("- ")]
    shown = [x for x in b.markdown.splitlines() if x.startswith("- ")]
    assert shown == items[:len(shown)]  # a prefix of the priority order
    assert b.markdown.count("\n") == len(b.markdown.splitlines())  # each item text is one line
    if len(shown) < len(items):  # the next line would not have fitted
        at = [i for i, x in enumerate(whole_lines) if x.startswith("- ")][len(shown)]
        with_next = "\n".join(whole_lines[:at + 1]) + "\n"
        assert len(with_next) > budget
        assert render_briefing("a", lessons, facts, strategies, len(with_next), NOW).markdown == with_next
    # A larger budget never shows less.
    more = render_briefing("a", lessons, facts, strategies, budget + 50, NOW)
    assert [x for x in more.markdown.splitlines() if x.startswith("- ")][:len(shown)] == shown


@settings(max_examples=50, deadline=None)
@given(st.lists(lesson_items, max_size=8), st.lists(fact_items, max_size=8), st.lists(strategy_items, max_size=4),
       st.randoms(use_true_random=False))
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
    later = render_briefing("researcher", LESSONS, FACTS, STRATEGIES, 100_000, NOW + DAY)
    assert later.markdown != full().markdown and later.briefing_id != full().briefing_id
    other = render_briefing("scraper", LESSONS, FACTS, STRATEGIES, 100_000, NOW)
    assert other.briefing_id != full().briefing_id


# ---- text ----------------------------------------------------------------------------------

@pytest.mark.parametrize(("seconds", "text"), [
    (-30, "just now"), (0, "just now"), (59, "just now"), (60, "1 minute ago"), (119, "1 minute ago"),
    (120, "2 minutes ago"), (3599, "59 minutes ago"), (3600, "1 hour ago"), (86399, "23 hours ago"),
    (86400, "1 day ago"), (2 * 86400 - 1, "1 day ago"), (2 * 86400, "2 days ago"), (400 * 86400, "400 days ago"),
])
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


def test_fact_line_quotes_names_with_spaces_and_shows_two_decimals():
    assert fact_line(fact("t", "tool:book_reservation", "failed_with",
                          "error:payment amount does not add up", 0.955)) == \
        '- book_reservation failed_with "payment amount does not add up" (confidence 0.95)'  # 0.955 -> 0.95 (binary)


@pytest.mark.parametrize(("task", "kind"), [
    ("Ship release 2.4 to production", "ship release <n> to production"),
    ("refund order 1042", "refund order <n>"),
    ("Refund order 77", "refund order <n>"),
    ("Hi, I want to change my flight HAT030 tomorrow", "hi i want to change my"),
    ("", ""),
    (None, ""),
])
def test_task_kind(task, kind):
    assert task_kind(task) == kind


# ---- selecting the inputs ------------------------------------------------------------------

def lesson_row(agent: str, kind: str, text: str, at: datetime | None) -> dict:
    return {"episode_id": uuid.uuid4(), "agent": agent, "session_id": "s", "idx": 0, "kind": kind, "text": text,
            "tool": None, "error": None, "learned_at": at}


def test_select_lessons_merges_repeats_and_ignores_other_agents_and_the_future():
    rows = [lesson_row("a", "failure", "x broke", NOW - 3 * DAY), lesson_row("a", "failure", "x  broke", NOW - DAY),
            lesson_row("a", "failure", "x broke", NOW - 2 * DAY), lesson_row("b", "failure", "x broke", NOW),
            lesson_row("a", "failure", "from the future", NOW + timedelta(seconds=1)),
            lesson_row("a", "success", "worked", NOW), lesson_row("a", "recovery", "", NOW)]
    got = select_lessons("a", rows, NOW)
    assert got == [LessonItem(kind="failure", text="x broke", learned_at=NOW - DAY, times=3),
                   LessonItem(kind="success", text="worked", learned_at=NOW)]


def triple_row(tid: str, source: str, predicate: str, target: str, scope: str, conf: float = 0.9,
               valid_from: datetime = NOW - 5 * DAY, valid_to: datetime | None = None, count: int = 1) -> dict:
    return {"triple_id": tid, "source": source, "predicate": predicate, "target": target, "scope": scope,
            "confidence": conf, "count": count, "valid_from": valid_from, "valid_to": valid_to}


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


def test_a_statement_in_several_scopes_is_one_fact_from_the_widest_scope_with_the_best_confidence():
    rows = [triple_row("private", "api:x", "rate_limit", "rate:5/s", "agent:researcher", conf=0.99),
            triple_row("promoted", "api:x", "rate_limit", "rate:5/s", "team:research-lead", conf=0.9),
            triple_row("global-other", "api:x", "rate_limit", "rate:6/s", "global", conf=0.5)]
    got = select_facts("researcher", FLEET, rows, NOW)
    assert [(f.triple_id, f.scope, f.confidence) for f in got] == [
        ("promoted", "team:research-lead", 0.99), ("global-other", "global", 0.5)]


def episode_row(agent: str, task: str, tools, outcome: str = "success", ended: datetime = NOW - DAY) -> dict:
    return {"agent": agent, "task": task, "outcome": outcome, "tools": tools, "ended_at": ended}


def test_select_strategies():
    rows = [
        episode_row("a", "refund order 1", ["crm_lookup", "http_post"], ended=NOW - 3 * DAY),
        episode_row("a", "Refund order 22", ["crm_lookup", "http_post"], ended=NOW - 2 * DAY),
        episode_row("a", "refund order 3", ["crm_lookup", "send_email"]),
        episode_row("a", "refund order 4", '["crm_lookup", "send_email"]'),  # JSON text, as over HTTP
        episode_row("a", "refund order 5", ["crm_lookup", "send_email"], outcome="failure"),
        episode_row("a", "refund order 6", ["crm_lookup", "send_email"], ended=NOW + DAY),
        episode_row("b", "refund order 7", ["crm_lookup", "send_email"]),
        episode_row("a", "answer the acme escalation", ["crm_lookup"]),  # once only: not a strategy
        episode_row("a", "answer the acme escalation", []),
        episode_row("a", "long", [f"t{i}" for i in range(12)]),
        episode_row("a", "long", [f"t{i}" for i in range(10)]),  # same first 8 steps
    ]
    got = select_strategies("a", rows, NOW)
    # Per task kind the sequence that worked most often (ties: the more recent); then ordered by
    # times, recency, task kind.
    assert got == [
        StrategyItem(task_kind="long", tools=tuple(f"t{i}" for i in range(MAX_STRATEGY_STEPS)), times=2,
                     latest=NOW - DAY),
        StrategyItem(task_kind="refund order <n>", tools=("crm_lookup", "send_email"), times=2, latest=NOW - DAY),
    ]


def test_briefing_for_uses_the_agents_budget_and_switch():
    lessons = [lesson_row(a, "failure", f"{a} broke " + "x" * 80, NOW - DAY) for a in ("researcher", "quiet")]
    fleet = dict(FLEET, researcher=AgentSpec(name="researcher", reports_to="research-lead", briefing_token_budget=60))
    assert briefing_for("researcher", fleet, lessons=lessons, triples=[], episodes=[], now=NOW).markdown == ""
    wide = briefing_for("researcher", FLEET, lessons=lessons, triples=[], episodes=[], now=NOW)
    assert wide.budget == 2000 and wide.lessons == 1
    assert briefing_for("quiet", FLEET, lessons=lessons, triples=[], episodes=[], now=NOW).markdown == ""
    stranger = briefing_for("stranger", FLEET, lessons=[lesson_row("stranger", "failure", "x", NOW)],
                            triples=[], episodes=[], now=NOW)
    assert stranger.budget == DEFAULT_BUDGET and stranger.lessons == 1


def test_inputs_selected_from_duckdb_rows():
    """The row shapes the projector's tables really give (UUIDs, TIMESTAMPTZ, VARCHAR[])."""
    con = duckdb.connect()
    schema.init(con)
    con.execute("INSERT INTO lessons VALUES "
                "(uuid(), 'researcher', 's1', 0, 'failure', 'http_get failed', NULL, NULL, ?)", [NOW - DAY])
    con.execute("INSERT INTO episodes (episode_id, agent, session_id, task, outcome, ended_at, tools) VALUES "
                "(uuid(), 'researcher', 's1', 'summarise pricing pages', 'success', ?, ['http_get', 'summarize']), "
                "(uuid(), 'researcher', 's2', 'summarise pricing pages', 'success', ?, ['http_get', 'summarize'])",
                [NOW - 2 * DAY, NOW - DAY])
    con.execute("INSERT INTO triples (triple_id, source, predicate, target, scope, confidence, count, evidence, "
                "valid_from, created_by, extractor) VALUES "
                "(uuid(), 'tool:http_get', 'calls', 'api:r.jina.ai', 'agent:researcher', 0.95, 3, uuid(), ?, "
                "'researcher', 'trace/1')", [NOW - 3 * DAY])

    def rows(sql: str) -> list[dict]:
        rel = con.execute(sql)
        cols = [d[0] for d in rel.description]
        return [dict(zip(cols, r)) for r in rel.fetchall()]

    got = select_inputs("researcher", FLEET, lessons=rows("SELECT * FROM lessons"),
                        triples=rows("SELECT * FROM triples"), episodes=rows("SELECT * FROM episodes"), now=NOW)
    b = render_briefing("researcher", got.lessons, got.facts, got.strategies, 2000, NOW)
    assert b.markdown.splitlines()[3:] == [
        "- [failure] http_get failed (1 day ago)", "", KNOWLEDGE_TITLE, "- http_get calls r.jina.ai (confidence 0.95)",
        "", STRATEGIES_TITLE, "- summarise pricing pages: http_get -> summarize (worked 2 times, latest 1 day ago)"]


# ---- cache invalidation --------------------------------------------------------------------

@pytest.mark.parametrize(("change", "agents"), [
    (EpisodeArrived("researcher"), {"researcher"}),
    (EpisodeArrived("quiet"), set()),  # briefings off: nothing cached to invalidate
    (EpisodeArrived("stranger"), {"stranger"}),
    (TripleChanged("agent:scraper"), {"scraper"}),
    (TripleChanged("agent:stranger"), set()),  # not declared and not known
    (TripleChanged("team:research-lead"), {"researcher", "scraper", "support"}),  # support via knowledgeScopes
    (TripleChanged("team:ops-lead"), {"deployer", "support"}),  # quiet is off; the lead does not read its team
    (TripleChanged("team:nobody"), set()),
    (TripleChanged("global"), {"research-lead", "researcher", "scraper", "ops-lead", "deployer", "support"}),
])
def test_which_briefings_a_change_invalidates(change, agents):
    assert affected_agents(FLEET, change) == agents


def test_known_undeclared_agents_read_their_own_scope_and_global():
    assert affected_agents(FLEET, TripleChanged("global"), known=["stranger"]) >= {"stranger"}
    assert affected_agents(FLEET, TripleChanged("agent:stranger"), known=["stranger"]) == {"stranger"}
    assert "stranger" not in affected_agents(FLEET, TripleChanged("team:ops-lead"), known=["stranger"])


def test_invalidation_agrees_with_the_scope_chain_for_the_built_in_fleet():
    from somnus.agents import scope_chain

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
        return {a: briefing_for(a, FLEET, lessons=lessons, triples=triples, episodes=[], now=NOW).markdown
                for a in agents}

    cached = cache()
    for i in range(40):
        if rnd.random() < 0.5:
            scope = rnd.choice(scopes)
            triples.append(triple_row(f"t{i}", f"tool:x{i}", "calls", f"api:h{i}", scope, conf=rnd.random()))
            change = TripleChanged(scope)
        else:
            agent = rnd.choice(agents)
            lessons.append(lesson_row(agent, "failure", f"lesson {i}", NOW - DAY))
            change = EpisodeArrived(agent)
        hit = affected_agents(FLEET, change)
        fresh = cache()
        for a in agents:
            if a not in hit:
                assert fresh[a] == cached[a], (change, a)
        cached = fresh


def test_the_docstring_examples_run():
    assert doctest.testmod(processors.briefing).failed == 0
