"""The Maxim bridges as one pre-flight read: ``advise(agent, task, inputs)`` for a task about to start.

Associative recall feeding a decision (the Maxim seed's planning, fear, escalation and salience
bridges), over what the memory already holds: the agent's past episodes and the NAc's tool-level
causal links. Pure: no I/O, no clock; the same inputs give the same advice.

**Association.** A past episode is associated with the task by the Jaccard similarity of their
word sets (lower-cased words of 3+ letters, a few function words dropped): 1.0 for the same task,
0 for nothing in common. Episodes at or above ``AdviceConfig.min_similarity`` are the *related*
episodes; every item below is weighted by similarity, so the same task counts most.

- **planning**: the strategies (the ordered distinct tools of a session) of related episodes that
  succeeded, scored by the summed similarity of their successes; each with its success rate among
  the related episodes that used it.
- **risk** (the fear bridge): the tools used in related episodes whose NAc failure strength (the summed
  V of their negative outcomes, ``somnus.processors.prediction.causal_links``) reaches
  ``min_risk``, strongest first; each with its error classes (V per outcome), the exact calls and
  errors behind it, and the related episodes where it failed.
- **escalation**: the similarity-weighted failure rate of the related episodes; ask a human when it
  is above ``escalation_threshold`` with at least ``min_support`` related episodes.
- **salience**: the entities of related successful episodes that go with success: weighted success
  rate among the related episodes naming them above that of all related episodes (an entity in
  every one tells nothing), scored by summed similarity times that lift. The asking agent's own
  entity (``agent:<name>``, the subject of its facts) is left out.

Every item names its provenance: the episode ids and, where the memory holds them, memory ids.

>>> import uuid
>>> past = [PastEpisode(episode_id=str(uuid.UUID(int=i)), session_id=f"s{i}", task="book a flight to Paris",
...                     success=i != 2, tools=["search_flights", "book_reservation"], failed_tools=[],
...                     entities=["city:paris"] if i != 2 else ["city:lyon"]) for i in range(3)]
>>> links = {"book_reservation": ToolRisk(tool="book_reservation", calls=10, errors=4,
...                                       outcomes={"ok": 0.6, "error:payment amount does not add up": 0.4},
...                                       negative={"error:payment amount does not add up"})}
>>> a = advise("airline", "Book a flight to Paris", AdviceInputs(episodes=past, tools=links))
>>> [s.tools for s in a.planning], [(r.tool, round(r.strength, 2)) for r in a.risks]
([['search_flights', 'book_reservation']], [('book_reservation', 0.4)])
>>> a.escalation.escalate, round(a.escalation.failure_rate, 3), [s.entity for s in a.salience]
(False, 0.333, ['city:paris'])
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

import msgspec

__all__ = [
    "AdviceConfig",
    "AdviceInputs",
    "Advice",
    "Escalation",
    "PastEpisode",
    "Risk",
    "Salient",
    "Strategy",
    "ToolRisk",
    "advise",
    "similarity",
    "words_of",
]

_WORD = re.compile(r"[a-z][a-z0-9]{2,}")
# Function words that would relate any two requests ("I want to ... my ..."): not associations.
_STOP = frozenset(
    "the and for with from that this you your are was were have has had will would can could please "
    "want need like just also about into there their them they what when which who how its our "
    "not but all any one hello thanks thank".split()
)


class AdviceConfig(msgspec.Struct, frozen=True, kw_only=True):
    """The bars of the bridges (defaults: a related episode shares at least a fifth of its words)."""

    min_similarity: float = 0.2  # Jaccard of word sets: a related episode
    min_risk: float = 0.1  # NAc failure strength at which a tool is a risk
    escalation_threshold: float = 0.5  # weighted failure rate above which a human is asked
    min_support: int = 3  # related episodes needed before escalation can be advised
    top: int = 5  # items per list
    provenance: int = 10  # ids per item


class PastEpisode(msgspec.Struct, frozen=True, kw_only=True):
    """What advise reads of one past episode."""

    episode_id: str
    session_id: str
    task: str | None
    success: bool | None  # None: outcome unknown (neither success nor failure)
    tools: list[str]  # tools called, in first-call order
    failed_tools: list[str]  # tools with at least one failed call
    entities: list[str] = []  # entity ids the episode mentioned
    memory_ids: list[str] = []  # memories captured from its session
    words: frozenset[str] | None = None  # words_of(task), when the reader computed it once (else here)


class ToolRisk(msgspec.Struct, frozen=True, kw_only=True):
    """A tool's tool-level NAc links: V per outcome, which outcomes are negative, exact counts."""

    tool: str
    calls: int
    errors: int
    outcomes: dict[str, float]  # outcome -> V
    negative: set[str]  # outcomes of negative valence (a rate limit is neutral, not a failure)


class AdviceInputs(msgspec.Struct, frozen=True, kw_only=True):
    episodes: Sequence[PastEpisode]
    tools: Mapping[str, ToolRisk]


class Strategy(msgspec.Struct, frozen=True, kw_only=True):
    tools: list[str]
    score: float  # summed similarity of the related successes that followed it
    successes: int
    attempts: int  # related episodes with the same tools
    success_rate: float
    best_similarity: float
    episode_ids: list[str]
    memory_ids: list[str]


class Risk(msgspec.Struct, frozen=True, kw_only=True):
    tool: str
    strength: float  # NAc: summed V of the tool's negative outcomes (≈ P(a call fails))
    error_classes: list[tuple[str, float]]  # negative outcomes and their V, strongest first
    calls: int  # exact calls and errors behind the links
    errors: int
    observed_rate: float
    relevance: float  # summed similarity of the related episodes that used the tool
    failed_in: int  # related episodes where it failed
    episode_ids: list[str]  # those episodes, most similar first
    memory_ids: list[str]


class Escalation(msgspec.Struct, frozen=True, kw_only=True):
    escalate: bool
    failure_rate: float  # similarity-weighted, over related episodes with a known outcome
    threshold: float
    related: int
    failures: int
    reason: str
    episode_ids: list[str]  # the related failures, most similar first
    memory_ids: list[str]


class Salient(msgspec.Struct, frozen=True, kw_only=True):
    entity: str
    score: float  # summed similarity of the related successes that mentioned it, times its lift
    successes: int
    seen_in: int  # related episodes (with an outcome) that mentioned it
    success_rate: float  # weighted, among those
    lift: float  # success_rate minus the related episodes' weighted success rate (> 0)
    episode_ids: list[str]
    memory_ids: list[str]


class Advice(msgspec.Struct, frozen=True, kw_only=True):
    agent: str
    task: str
    related: int
    planning: list[Strategy]
    risks: list[Risk]
    escalation: Escalation
    salience: list[Salient]


def words_of(text: str | None) -> frozenset[str]:
    """The words of a task that can associate it with another (lower case, 3+ letters, function words dropped).

    >>> sorted(words_of("I want to CHANGE my flight, please: flight HAT030"))
    ['change', 'flight', 'hat030']
    """
    return frozenset(w for w in _WORD.findall((text or "").lower()) if w not in _STOP)


def similarity(a: frozenset[str], b: frozenset[str]) -> float:
    """Jaccard of two word sets (0 when either is empty)."""
    if not a or not b:
        return 0.0
    return len(a & b) / len(a | b)


def advise(agent: str, task: str, inputs: AdviceInputs, config: AdviceConfig = AdviceConfig()) -> Advice:
    """The four bridges for ``task`` from ``inputs`` (``agent`` is echoed: the caller scopes the inputs)."""
    if not task or not task.strip():
        raise ValueError("a task is required: the text of the task about to start")
    want = words_of(task)
    related = sorted(
        ((similarity(want, words_of(ep.task) if ep.words is None else ep.words), ep) for ep in inputs.episodes),
        key=lambda pair: (-pair[0], pair[1].episode_id),
    )
    related = [(s, ep) for s, ep in related if s >= config.min_similarity and s > 0.0]
    return Advice(
        agent=agent,
        task=task,
        related=len(related),
        planning=_planning(related, config),
        risks=_risks(related, inputs.tools, config),
        escalation=_escalation(related, config),
        salience=_salience(related, config, exclude=f"agent:{agent}"),
    )


Related = Sequence[tuple[float, PastEpisode]]


def _ids(related: Related, config: AdviceConfig) -> tuple[list[str], list[str]]:
    episodes = [ep.episode_id for _, ep in related][: config.provenance]
    memories = [m for _, ep in related for m in ep.memory_ids][: config.provenance]
    return episodes, memories


def _planning(related: Related, config: AdviceConfig) -> list[Strategy]:
    groups: dict[tuple[str, ...], list[tuple[float, PastEpisode]]] = {}
    for s, ep in related:
        if ep.tools:
            groups.setdefault(tuple(ep.tools), []).append((s, ep))
    out = []
    for tools, members in groups.items():
        wins = [(s, ep) for s, ep in members if ep.success is True]
        if not wins:
            continue
        known = [ep for _, ep in members if ep.success is not None]
        episodes, memories = _ids(wins, config)
        out.append(
            Strategy(
                tools=list(tools),
                score=sum(s for s, _ in wins),
                successes=len(wins),
                attempts=len(known),
                success_rate=len(wins) / len(known),
                best_similarity=wins[0][0],
                episode_ids=episodes,
                memory_ids=memories,
            )
        )
    out.sort(key=lambda st: (-st.score, -st.success_rate, st.tools))
    return out[: config.top]


def _risks(related: Related, tools: Mapping[str, ToolRisk], config: AdviceConfig) -> list[Risk]:
    relevance: dict[str, float] = {}
    failed: dict[str, list[tuple[float, PastEpisode]]] = {}
    for s, ep in related:
        for tool in ep.tools:
            relevance[tool] = relevance.get(tool, 0.0) + s
        for tool in ep.failed_tools:
            failed.setdefault(tool, []).append((s, ep))
    out = []
    for tool in sorted(relevance):
        links = tools.get(tool)
        if links is None:
            continue
        classes = sorted(
            ((o, v) for o, v in links.outcomes.items() if o in links.negative), key=lambda ov: (-ov[1], ov[0])
        )
        strength = sum(v for _, v in classes)
        if strength < config.min_risk:
            continue
        episodes, memories = _ids(failed.get(tool, []), config)
        out.append(
            Risk(
                tool=tool,
                strength=strength,
                error_classes=classes[: config.top],
                calls=links.calls,
                errors=links.errors,
                observed_rate=links.errors / links.calls if links.calls else 0.0,
                relevance=relevance[tool],
                failed_in=len(failed.get(tool, [])),
                episode_ids=episodes,
                memory_ids=memories,
            )
        )
    out.sort(key=lambda r: (-r.strength, -r.relevance, r.tool))
    return out[: config.top]


def _escalation(related: Related, config: AdviceConfig) -> Escalation:
    known = [(s, ep) for s, ep in related if ep.success is not None]
    weight = sum(s for s, _ in known)
    fails = [(s, ep) for s, ep in known if ep.success is False]
    rate = sum(s for s, _ in fails) / weight if weight else 0.0
    episodes, memories = _ids(fails, config)
    if len(known) < config.min_support:
        escalate, reason = False, f"{len(known)} related episodes with an outcome, fewer than {config.min_support}"
    else:
        escalate = rate > config.escalation_threshold
        reason = (
            f"{len(fails)} of {len(known)} related episodes failed (weighted rate {rate:.2f} "
            f"{'>' if escalate else '<='} {config.escalation_threshold:.2f})"
        )
    return Escalation(
        escalate=escalate,
        failure_rate=rate,
        threshold=config.escalation_threshold,
        related=len(known),
        failures=len(fails),
        reason=reason,
        episode_ids=episodes,
        memory_ids=memories,
    )


def _salience(related: Related, config: AdviceConfig, exclude: str) -> list[Salient]:
    known = [(s, ep) for s, ep in related if ep.success is not None]
    total = sum(s for s, _ in known)
    if not total:
        return []
    base = sum(s for s, ep in known if ep.success) / total
    found: dict[str, list[tuple[float, PastEpisode]]] = {}
    for s, ep in known:
        for entity in dict.fromkeys(ep.entities):
            if entity == exclude:  # the asking agent itself: the subject of its facts, not something to heed
                continue
            found.setdefault(entity, []).append((s, ep))
    out = []
    for entity, members in found.items():
        wins = [(s, ep) for s, ep in members if ep.success]
        rate = sum(s for s, _ in wins) / sum(s for s, _ in members)
        if not wins or rate - base <= 1e-12:  # in every related episode, or no likelier to succeed: no signal
            continue
        episodes, memories = _ids(wins, config)
        out.append(
            Salient(
                entity=entity,
                score=sum(s for s, _ in wins) * (rate - base),
                successes=len(wins),
                seen_in=len(members),
                success_rate=rate,
                lift=rate - base,
                episode_ids=episodes,
                memory_ids=memories,
            )
        )
    out.sort(key=lambda x: (-x.score, x.entity))
    return out[: config.top]
