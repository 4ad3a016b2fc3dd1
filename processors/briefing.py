"""The briefing generator: a compact Markdown briefing per agent. Pure: no I/O, no clock.

A briefing has three sections, in priority order:

1. **Recent Lessons**: the agent's own lessons (``lessons`` table), failures first, then recoveries
   (an error and what resolved it), then successes; within a kind the most recent first. The same
   lesson learned again is one line ("3 times, latest 1 day ago"). Up to ``MAX_LESSONS``.
2. **Key Knowledge**: active facts of the agent's scope chain (``triples``), highest confidence
   first (then count, then triple id: the ``KnowledgeStore`` order). A statement held in several
   scopes of the chain (e.g. after a promotion) is one line: its highest confidence, shown from the
   widest scope holding it. A fact saying that the reading agent itself ``uses`` a tool
   (``SELF_EVIDENT_PREDICATES``) is left out: the agent knows its own tools. Up to ``MAX_FACTS``.
3. **Active Strategies**: what repeatedly worked. A strategy is the tool sequence (distinct tools in
   first-use order, the episode's ``tools``, up to ``MAX_STRATEGY_STEPS``) of the agent's successful
   episodes of one task kind (``task_kind``), shown when at least ``MIN_STRATEGY_SUPPORT`` successful
   episodes followed it; per task kind only the sequence that worked most often. Up to ``MAX_STRATEGIES``.

The budget (``briefingTokenBudget``, in characters (code points) of the Markdown) is filled in that priority
order, line by line, and stops at the first line that does not fit: the lines shown are always a
prefix of the priority order, so strategies are trimmed before knowledge and knowledge before
lessons, and no line is ever cut. (A single item's text is capped at ``MAX_ITEM_CHARS`` when its line
is built, before the budget is applied, so one huge lesson cannot crowd out everything else.) A
section's title is shown with its first line. With nothing to show, the briefing is empty ("").

Untrusted text (lessons and entity names come from tool output) is made single-line here
(``one_line``); the prompt injector (``processors/injection.py``) fences it off.

The bytes of a briefing are a function of its inputs and ``now`` only (ages are ``now`` minus the
lesson's time), so a replay that regenerates at the same event time rebuilds the same briefing.

>>> from datetime import datetime, timezone
>>> now = datetime(2024, 5, 16, 12, tzinfo=timezone.utc)
>>> b = render_briefing("researcher",
...     lessons=[LessonItem(kind="failure", text="http_get failed with 'HTTP 403'",
...                         learned_at=datetime(2024, 5, 15, 9, tzinfo=timezone.utc))],
...     facts=[FactItem(triple_id="t1", source="tool:http_get", predicate="calls", target="api:r.jina.ai",
...                     scope="agent:researcher", confidence=0.95, count=4)],
...     strategies=[], budget=2000, now=now)
>>> print(b.markdown, end="")
## Session Briefing for researcher
<BLANKLINE>
### Recent Lessons
- [failure] http_get failed with 'HTTP 403' (1 day ago)
<BLANKLINE>
### Key Knowledge
- http_get calls r.jina.ai (confidence 0.95)
>>> render_briefing("researcher", [], [], [], budget=2000, now=now).markdown
''
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timezone
from typing import Any

import msgspec

from processors.knowledge import normalise_name
from schemas.briefing import BRIEFING_SCHEMA_VERSION, BriefingGenerated, ServedFact
from schemas.facts import GLOBAL_SCOPE
from somnus.agents import AgentSpec, scope_chain

Briefing = BriefingGenerated  # what render_briefing returns; also the cache record

MAX_LESSONS = 10  # lesson lines considered (before the budget)
MAX_FACTS = 20  # fact lines considered
MAX_KNOWLEDGE = 8  # semantic-memory lines considered (the knowledge context's cap)
MAX_STRATEGIES = 5  # strategy lines considered
MAX_ITEM_CHARS = 200  # one item's text (lesson text, fact, strategy) is capped here, with an ellipsis
MIN_STRATEGY_SUPPORT = 2  # successful episodes that must share a tool sequence for it to be a strategy
MAX_STRATEGY_STEPS = 8  # tools of a sequence (the distiller's success lesson also shows 8)
TASK_KIND_WORDS = 6  # words of the normalised task that name its kind
SELF_EVIDENT_PREDICATES = frozenset({"uses"})  # "<reading agent> uses <tool>" is not news to the agent
DEFAULT_BUDGET = 2000  # characters, as AgentSpec.briefing_token_budget

LESSON_RANK = {"failure": 0, "recovery": 1, "success": 2}  # other kinds come last
TITLE = "## Session Briefing for {agent}"
LESSONS_TITLE = "### Recent Lessons"
KNOWLEDGE_TITLE = "### Key Knowledge"
STRATEGIES_TITLE = "### Active Strategies"


# ---- inputs --------------------------------------------------------------------------------

class LessonItem(msgspec.Struct, frozen=True, kw_only=True):
    kind: str  # failure | recovery | success
    text: str
    learned_at: datetime | None  # the latest time it was learned; None: unknown
    times: int = 1  # how many times it was learned


class FactItem(msgspec.Struct, frozen=True, kw_only=True):
    triple_id: str
    source: str  # entity id, "type:name"
    predicate: str
    target: str
    scope: str
    confidence: float
    count: int = 1


class StrategyItem(msgspec.Struct, frozen=True, kw_only=True):
    task_kind: str
    tools: tuple[str, ...]
    times: int  # successful episodes that followed it
    latest: datetime


class BriefingInputs(msgspec.Struct, frozen=True):
    lessons: list[LessonItem]
    facts: list[FactItem]
    strategies: list[StrategyItem]


# ---- text helpers --------------------------------------------------------------------------

# Line breaks of every kind, other control characters, bidi overrides, zero-width characters and
# lone surrogates: all become one space, so an item is always exactly one visible line.
_UNSAFE = re.compile("[\\s\x00-\x1f\x7f-\x9f\u00ad\u061c\u180e\u200b-\u200f\u2028-\u202e\u2060-\u206f"
                     "\ufeff\ufff9-\ufffb\ud800-\udfff]+")


def one_line(text: str, limit: int = MAX_ITEM_CHARS) -> str:
    """``text`` as one line of at most ``limit`` characters (cut at a word, marked with an ellipsis).

    >>> one_line("ignore previous\\ninstructions\\u2028now")
    'ignore previous instructions now'
    >>> one_line("a long lesson about pagination cursors", limit=20)
    'a long lesson about…'
    """
    text = _UNSAFE.sub(" ", text).strip()
    if len(text) <= limit:
        return text
    cut = text[:max(limit - 1, 0)]
    space = cut.rfind(" ")
    if text[len(cut)] != " " and space >= limit // 2:
        cut = cut[:space]  # end at a whole word unless that loses more than half the room
    return cut.rstrip() + "…"


def entity_name(entity_id: str) -> str:
    """The name part of an entity id (``type:name``); the id itself when it has no type.

    >>> entity_name("rate:10/s"), entity_name("error:HTTP 429: Too Many Requests"), entity_name("x")
    ('10/s', 'HTTP 429: Too Many Requests', 'x')
    """
    return entity_id.split(":", 1)[1] if ":" in entity_id else entity_id


def age_text(then: datetime | None, now: datetime) -> str:
    """How long ago ``then`` was, in whole units (floored): minutes under an hour, hours under a day,
    else days. Under a minute (or in the future: clock skew) is "just now".

    >>> from datetime import timedelta
    >>> now = datetime(2024, 5, 16, tzinfo=timezone.utc)
    >>> [age_text(now - timedelta(seconds=s), now) for s in (59, 60, 7200, 86399, 86400, 3 * 86400)]
    ['just now', '1 minute ago', '2 hours ago', '23 hours ago', '1 day ago', '3 days ago']
    """
    if then is None:
        return "date unknown"
    seconds = (_aware(now) - _aware(then)).total_seconds()
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds >= size:
            n = int(seconds // size)
            return f"{n} {unit}{'s' if n != 1 else ''} ago"
    return "just now"


_WORD = re.compile(r"\w+")


def task_kind(task: str | None) -> str:
    """What kind of task a task text is: its first ``TASK_KIND_WORDS`` words, case-folded, with
    every word holding a digit (ids, versions, amounts) as ``<n>`` (repeats collapsed).

    >>> task_kind("Ship release 2.4 to production, then tell #ops")
    'ship release <n> to production then'
    >>> task_kind("ship release 3.0 to production then") == task_kind("Ship release 2.4 to Production then")
    True
    """
    words: list[str] = []
    for w in _WORD.findall((task or "").casefold()):
        w = "<n>" if any(c.isdigit() for c in w) else w
        if not (w == "<n>" and words and words[-1] == "<n>"):
            words.append(w)
        if len(words) >= TASK_KIND_WORDS:
            break
    return " ".join(words)


def _aware(t: datetime) -> datetime:
    return t if t.tzinfo is not None else t.replace(tzinfo=timezone.utc)


def _registry(agents: Mapping[str, AgentSpec]) -> dict[str, AgentSpec]:
    return agents if isinstance(agents, dict) else dict(agents)


def _quoted(name: str) -> str:
    return f'"{name}"' if any(c.isspace() for c in name) else name


# ---- lines ---------------------------------------------------------------------------------

def lesson_line(lesson: LessonItem, now: datetime) -> str:
    kind = one_line(lesson.kind, 20)
    age = age_text(lesson.learned_at, now)
    when = age if lesson.times == 1 else f"{lesson.times} times, latest {age}"
    return f"- [{kind}] {one_line(lesson.text)} ({when})"


def fact_line(fact: FactItem) -> str:
    text = " ".join((_quoted(one_line(entity_name(fact.source), 120)), one_line(fact.predicate, 60),
                     _quoted(one_line(entity_name(fact.target), 120))))
    return f"- {one_line(text)} (confidence {fact.confidence:.2f})"


def strategy_line(strategy: StrategyItem, now: datetime) -> str:
    steps = " -> ".join(one_line(t, 60) for t in strategy.tools)
    text = one_line(f"{strategy.task_kind}: {steps}" if strategy.task_kind else steps)
    return f"- {text} (worked {strategy.times} times, latest {age_text(strategy.latest, now)})"


def lesson_order(lesson: LessonItem) -> tuple[Any, ...]:
    t = lesson.learned_at
    return (LESSON_RANK.get(lesson.kind, len(LESSON_RANK)), t is None, -_aware(t).timestamp() if t else 0.0,
            -lesson.times, lesson.kind, lesson.text)


def fact_order(fact: FactItem) -> tuple[Any, ...]:
    return (-fact.confidence, -fact.count, fact.triple_id)


def strategy_order(s: StrategyItem) -> tuple[Any, ...]:
    return (-s.times, -_aware(s.latest).timestamp(), s.task_kind, s.tools)


# ---- rendering -----------------------------------------------------------------------------

def render_briefing(agent: str, lessons: Sequence[LessonItem], facts: Sequence[FactItem],
                    strategies: Sequence[StrategyItem], budget: int, now: datetime,
                    knowledge: Sequence[str] = ()) -> Briefing:
    """The briefing of ``agent`` at ``now`` within ``budget`` characters (see the module docstring).

    Items are ordered here (any input order gives the same briefing) and cut to the section limits."""
    ordered_lessons = sorted(lessons, key=lesson_order)[:MAX_LESSONS]
    ordered_facts = sorted(facts, key=fact_order)[:MAX_FACTS]
    ordered_strategies = sorted(strategies, key=strategy_order)[:MAX_STRATEGIES]
    sections = [
        (LESSONS_TITLE, [lesson_line(x, now) for x in ordered_lessons]),
        # Consolidated knowledge (semantic memory: concepts and confirmed patterns) leads the section.
        (KNOWLEDGE_TITLE, [f"- {one_line(k)}" for k in knowledge[:MAX_KNOWLEDGE]] + [fact_line(x) for x in ordered_facts]),
        (STRATEGIES_TITLE, [strategy_line(x, now) for x in ordered_strategies]),
    ]
    title = TITLE.format(agent=one_line(agent, 100))
    out = [title]
    used = len(title) + 1
    shown = [0, 0, 0]
    full = False
    for i, (section_title, lines) in enumerate(sections):
        for line in lines:
            # The section's title (after a blank line) comes with its first line.
            cost = len(line) + 1 + (0 if shown[i] else len(section_title) + 2)
            if used + cost > budget:
                full = True
                break
            if not shown[i]:
                out += ["", section_title]
            out.append(line)
            used += cost
            shown[i] += 1
        if full:
            break
    markdown = "\n".join(out) + "\n" if sum(shown) else ""
    key = f"{agent}\x1f{markdown}".encode("utf-8", "surrogatepass")
    digest = hashlib.blake2b(key, digest_size=16).hexdigest()
    served = [ServedFact(triple_id=f.triple_id, source=f.source, predicate=f.predicate, target=f.target,
                         scope=f.scope, confidence=min(max(f.confidence, 0.0), 1.0),
                         source_name=entity_name(f.source) or f.source,
                         target_name=entity_name(f.target) or f.target)
              for f in ordered_facts[:max(0, shown[1] - min(len(knowledge), MAX_KNOWLEDGE))]]
    return BriefingGenerated(
        schema_version=BRIEFING_SCHEMA_VERSION, briefing_id=digest, agent=agent, generated_at=_aware(now),
        budget=max(budget, 0), markdown=markdown, chars=len(markdown), lessons=shown[0], facts=served,
        strategies=shown[2], dropped_lessons=len(lessons) - shown[0],
        dropped_facts=len(facts) + min(len(knowledge), MAX_KNOWLEDGE) - shown[1],
        dropped_strategies=len(strategies) - shown[2])


# ---- selecting the inputs from plain rows --------------------------------------------------

Row = Mapping[str, Any] | Any  # a dict (a DuckDB row with column names) or a struct with those attributes


def _get(row: Row, key: str, default: Any = None) -> Any:
    if type(row) is dict:  # the common case, without the slower ABC check
        return row.get(key, default)
    if isinstance(row, Mapping):
        return row.get(key, default)
    return getattr(row, key, default)


def _time(v: Any) -> datetime | None:
    if v is None:
        return None
    t = v if isinstance(v, datetime) else datetime.fromisoformat(str(v))
    return _aware(t)


def _tools(v: Any) -> list[str]:
    if v is None:
        return []
    if isinstance(v, (str, bytes)):
        v = msgspec.json.decode(v)
    return [str(t) for t in v]


def select_lessons(agent: str, rows: Iterable[Row], now: datetime) -> list[LessonItem]:
    """The agent's lessons known at ``now`` (rows of ``lessons``: agent, kind, text, learned_at),
    one item per distinct (kind, text) with how many times and when last it was learned."""
    now = _aware(now)
    seen: dict[tuple[str, str], LessonItem] = {}
    for r in rows:
        if _get(r, "agent") != agent:
            continue
        at = _time(_get(r, "learned_at"))
        if at is not None and at > now:
            continue  # not learned yet at `now`
        kind, text = str(_get(r, "kind")), one_line(str(_get(r, "text") or ""))
        if not text:
            continue
        old = seen.get((kind, text))
        if old is None:
            seen[(kind, text)] = LessonItem(kind=kind, text=text, learned_at=at)
        else:
            latest = old.learned_at if at is None or (old.learned_at is not None and old.learned_at >= at) else at
            seen[(kind, text)] = LessonItem(kind=kind, text=text, learned_at=latest, times=old.times + 1)
    return sorted(seen.values(), key=lesson_order)


def select_facts(agent: str, agents: Mapping[str, AgentSpec], rows: Iterable[Row], now: datetime) -> list[FactItem]:
    """Facts of the agent's scope chain active at ``now`` (rows of ``triples`` / ``facts_top``), one per
    statement (source, predicate, target): its highest confidence, from the widest scope holding it."""
    now = _aware(now)
    chain = scope_chain(_registry(agents), agent)
    rank = {s: i for i, s in enumerate(chain)}
    me = f"agent:{normalise_name(agent)}"
    best: dict[tuple[str, str, str], FactItem] = {}
    for r in rows:
        scope = _get(r, "scope")
        if scope not in rank:
            continue
        start, end = _time(_get(r, "valid_from")), _time(_get(r, "valid_to"))
        if (start is not None and start > now) or (end is not None and end <= now):
            continue
        source, predicate, target = str(_get(r, "source")), str(_get(r, "predicate")), str(_get(r, "target"))
        if source == me and predicate in SELF_EVIDENT_PREDICATES:
            continue
        item = FactItem(triple_id=str(_get(r, "triple_id")), source=source, predicate=predicate, target=target,
                        scope=scope, confidence=float(_get(r, "confidence")), count=int(_get(r, "count", 1) or 1))
        key = (source, predicate, target)
        old = best.get(key)
        if old is None:
            best[key] = item
            continue
        wide = item if (rank[item.scope], item.triple_id) > (rank[old.scope], old.triple_id) else old
        best[key] = msgspec.structs.replace(wide, confidence=max(old.confidence, item.confidence))
    return sorted(best.values(), key=fact_order)


def select_strategies(agent: str, rows: Iterable[Row], now: datetime) -> list[StrategyItem]:
    """Strategies from the agent's successful episodes ended by ``now`` (rows of ``episodes``: agent,
    task, outcome, tools, ended_at): per task kind, the tool sequence most successful episodes followed,
    when at least ``MIN_STRATEGY_SUPPORT`` did."""
    now = _aware(now)
    groups: dict[tuple[str, tuple[str, ...]], tuple[int, datetime]] = {}
    for r in rows:
        if _get(r, "agent") != agent or str(_get(r, "outcome")) != "success":
            continue
        ended = _time(_get(r, "ended_at"))
        tools = tuple(_tools(_get(r, "tools"))[:MAX_STRATEGY_STEPS])
        if ended is None or ended > now or not tools:
            continue
        key = (task_kind(_get(r, "task")), tools)
        times, latest = groups.get(key, (0, ended))
        groups[key] = (times + 1, max(latest, ended))
    per_kind: dict[str, StrategyItem] = {}
    for (kind, tools), (times, latest) in groups.items():
        if times < MIN_STRATEGY_SUPPORT:
            continue
        item = StrategyItem(task_kind=kind, tools=tools, times=times, latest=latest)
        old = per_kind.get(kind)
        if old is None or strategy_order(item) < strategy_order(old):
            per_kind[kind] = item
    return sorted(per_kind.values(), key=strategy_order)


def select_inputs(agent: str, agents: Mapping[str, AgentSpec], *, lessons: Iterable[Row], triples: Iterable[Row],
                  episodes: Iterable[Row], now: datetime) -> BriefingInputs:
    """Everything a briefing of ``agent`` at ``now`` needs, from plain rows of the ``lessons``,
    ``triples`` (or ``facts_top``) and ``episodes`` tables. Rows of other agents, of scopes outside the
    chain, and from after ``now`` are ignored, so the projector may pass a superset."""
    return BriefingInputs(lessons=select_lessons(agent, lessons, now),
                          facts=select_facts(agent, agents, triples, now),
                          strategies=select_strategies(agent, episodes, now))


def briefing_for(agent: str, agents: Mapping[str, AgentSpec], *, lessons: Iterable[Row], triples: Iterable[Row],
                 episodes: Iterable[Row], now: datetime, knowledge: Sequence[str] = ()) -> Briefing:
    """``select_inputs`` then ``render_briefing`` with the agent's budget (empty when briefings are off)."""
    spec = agents.get(agent)
    budget = DEFAULT_BUDGET if spec is None else (spec.briefing_token_budget if spec.briefing_enabled else 0)
    got = select_inputs(agent, agents, lessons=lessons, triples=triples, episodes=episodes, now=now)
    return render_briefing(agent, got.lessons, got.facts, got.strategies, budget, now, knowledge)


# ---- cache invalidation --------------------------------------------------------------------

class EpisodeArrived(msgspec.Struct, frozen=True):
    """A new episode of ``agent`` (its lessons and strategies may change)."""

    agent: str


class TripleChanged(msgspec.Struct, frozen=True):
    """A triple in ``scope`` was asserted, reinforced or closed (facts of that scope may change)."""

    scope: str


Change = EpisodeArrived | TripleChanged


def readers_by_scope(agents: Mapping[str, AgentSpec]) -> dict[str, frozenset[str]]:
    """Scope -> the declared agents whose scope chain holds it (the inverse of ``scope_chain``)."""
    out: dict[str, set[str]] = {}
    registry = _registry(agents)
    for name in registry:
        for scope in scope_chain(registry, name):
            out.setdefault(scope, set()).add(name)
    return {k: frozenset(v) for k, v in out.items()}


def affected_agents(agents: Mapping[str, AgentSpec], change: Change, *, known: Iterable[str] = (),
                    readers: Mapping[str, frozenset[str]] | None = None) -> set[str]:
    """The agents whose cached briefing ``change`` invalidates.

    A new episode invalidates its own agent's briefing; a triple changed in scope S invalidates every
    agent whose scope chain holds S (``agent:x``: x; ``team:L``: the agents reporting to L and those
    naming L in ``knowledgeScopes``; ``global``: everyone). ``known`` are agents that have data but no
    agent file (they read their own scope and global). Agents with ``briefingEnabled: false`` have no
    briefing and are never returned. ``readers`` is ``readers_by_scope(agents)``, precomputed per batch.

    >>> from somnus.agents import AgentSpec
    >>> fleet = {"lead": AgentSpec(name="lead"), "a": AgentSpec(name="a", reports_to="lead"),
    ...          "b": AgentSpec(name="b", reports_to="lead"), "x": AgentSpec(name="x", knowledge_scopes=["lead"])}
    >>> sorted(affected_agents(fleet, TripleChanged("team:lead")))
    ['a', 'b', 'x']
    >>> sorted(affected_agents(fleet, EpisodeArrived("a"))), sorted(affected_agents(fleet, TripleChanged("agent:b")))
    (['a'], ['b'])
    """
    if isinstance(change, EpisodeArrived):
        hit = {change.agent}
    else:
        index = readers if readers is not None else readers_by_scope(agents)
        hit = set(index.get(change.scope, frozenset()))
        if change.scope == GLOBAL_SCOPE:
            hit |= {k for k in known if k not in agents}
        elif change.scope.startswith("agent:"):
            name = change.scope[len("agent:"):]
            if name not in agents and name in (known if isinstance(known, (set, frozenset, dict)) else set(known)):
                hit.add(name)
    return {a for a in hit if a not in agents or agents[a].briefing_enabled}


def agents_to_regenerate(agents: Mapping[str, AgentSpec], changes: Iterable[Change], *,
                         known: Iterable[str] = ()) -> list[str]:
    """The union of ``affected_agents`` over a batch of changes, sorted. Agents not in it are skipped."""
    readers = readers_by_scope(agents)
    known = list(known)
    out: set[str] = set()
    for change in changes:
        out |= affected_agents(agents, change, known=known, readers=readers)
    return sorted(out)


def changes_of(episode_agents: Iterable[str], triple_scopes: Iterable[str]) -> list[Change]:
    """Changes from a projector batch: the agents of new episodes and the scopes of changed triples
    (asserted, reinforced or closed), deduplicated, in a stable order."""
    return ([EpisodeArrived(a) for a in sorted(set(episode_agents))]
            + [TripleChanged(s) for s in sorted(set(triple_scopes))])


__all__ = [
    "Briefing", "BriefingInputs", "Change", "EpisodeArrived", "FactItem", "LessonItem", "StrategyItem",
    "TripleChanged", "affected_agents", "age_text", "agents_to_regenerate", "briefing_for",
    "changes_of", "entity_name", "one_line", "readers_by_scope", "render_briefing", "select_facts",
    "select_inputs", "select_lessons", "select_strategies", "task_kind",
]
