"""User synopses: who a user is and what they are up to, built from their memories and cached.

Pure: ``now`` is an argument.

A synopsis has two parts with their own time to live (MUXI's two-tier synopsis cache):

- **identity** (``IDENTITY_TTL``, 7 days): name, preferences, traits;
- **context** (``CONTEXT_TTL``, 1 hour): recent topics, current goals.

A part is stale when ``now - built_at >= ttl``; ``refresh`` rebuilds only the stale parts, on
access (``SynopsisCache.get``). Memories are read through a loader the caller passes in, called only
when a part is stale; the builder keeps only memories whose ``user_id`` is the user's, whatever
the loader returns.

The default builder (``ExtractiveSynopsisBuilder``, "extractive/1") is deterministic: rules over
the user's own words, no model.

- name: the latest "my name is X" / "call me X" / "name's X" (X: one to three capitalised words),
  or the latest ``name`` memory;
- preferences: clauses after "I prefer", "I'd rather", "I like", "I love", "I enjoy" (→ "prefers
  …", "likes …"), "I don't like", "I dislike", "I hate" (→ "dislikes …"), "please always/never"
  and "always/never use" (→ "always …", "never …"), and ``preference`` memories; newest first,
  case-insensitively distinct, at most ``MAX_PREFERENCES`` (10), each clipped to ``MAX_PHRASE_CHARS`` (80);
- traits: "I am a/an X", "I'm a/an X", "I work as (a/an) X" (X up to a comma or a conjunction),
  "as a/an X, I" and ``trait`` memories; newest first, distinct, at most ``MAX_TRAITS`` (10);
- recent topics: content words (``somnus.processors.working.session_buffer.content_words``) of the memories of
  the last ``TOPIC_WINDOW`` (30 days), each memory counting once per word with weight
  ``0.5 ** (age / TOPIC_HALF_LIFE)`` (half-life 3 days; a memory from the future counts as age 0);
  the ``MAX_TOPICS`` (8) heaviest words (ties: alphabetical);
- current goals: ``goal`` and ``task`` memories and "I need to / I want to / I'd like to / I'm
  trying to / my goal is to / help me X" clauses of the last ``GOAL_WINDOW`` (7 days), newest
  first, distinct, at most ``MAX_GOALS`` (5).

An LLM builder can stand in behind ``SynopsisBuilder`` (its output is cached the same way).

>>> from datetime import datetime, timedelta, timezone
>>> from somnus.schemas.working_memory import MemoryKind, UserMemory
>>> t = datetime(2024, 5, 15, tzinfo=timezone.utc)
>>> mems = [UserMemory(user_id="u1", kind=MemoryKind.USER_MESSAGE, observed_at=t, source_id="m1",
...     text="Hi, my name is Mia Li. I prefer window seats. I need to rebook my flight to Seattle.")]
>>> s = refresh(None, "u1", t, lambda user: mems)
>>> s.identity.name, s.identity.preferences, s.context.current_goals
('Mia Li', ('prefers window seats',), ('rebook my flight to Seattle',))
>>> refresh(s, "u1", t + timedelta(minutes=59), lambda user: []) is s   # both parts fresh: no rebuild
True
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime, timedelta
from typing import Protocol

import msgspec

from somnus.processors.working.session_buffer import clip, content_words
from somnus.schemas.working_memory import MemoryKind, UserContext, UserIdentity, UserMemory, UserSynopsis

IDENTITY_TTL = timedelta(days=7)
CONTEXT_TTL = timedelta(hours=1)
TOPIC_WINDOW = timedelta(days=30)
TOPIC_HALF_LIFE = timedelta(days=3)
GOAL_WINDOW = timedelta(days=7)
MAX_PREFERENCES = 10
MAX_TRAITS = 10
MAX_TOPICS = 8
MAX_GOALS = 5
MAX_PHRASE_CHARS = 80

MemoryLoader = Callable[[str], Iterable[UserMemory]]


class SynopsisBuilder(Protocol):
    """Builds the two parts of a synopsis from one user's memories (already filtered to the user)."""

    name: str

    def identity(self, memories: Sequence[UserMemory]) -> UserIdentity: ...

    def context(self, memories: Sequence[UserMemory], now: datetime) -> UserContext: ...


_CLAUSE = r"([^.!?;\n]+)"
# a trait is a short noun phrase: it ends at a comma or a conjunction
_SHORT_CLAUSE = r"([^,.!?;\n]+?)(?=\s+(?:and|but|so|because|who)\b|[,.!?;\n]|$)"
_NAME = re.compile(r"\b(?:[Mm]y name is|[Cc]all me|[Nn]ame's)\s+([A-Z][\w'-]*(?:\s+[A-Z][\w'-]*){0,2})")
_PREFERENCES = [
    (re.compile(r"\bI(?:'d| would)? (?:prefer|rather)\s+" + _CLAUSE, re.I), "prefers"),
    (re.compile(r"\bI (?:really )?(?:like|love|enjoy)\s+" + _CLAUSE, re.I), "likes"),
    (re.compile(r"\bI (?:don't|do not|really don't) like\s+" + _CLAUSE, re.I), "dislikes"),
    (re.compile(r"\bI (?:dislike|hate|can't stand)\s+" + _CLAUSE, re.I), "dislikes"),
    (re.compile(r"\b(?:please )?always\s+((?:use|send|book|reply|write|pay|call|keep)\b[^.!?;\n]*)", re.I), "always"),
    (re.compile(r"\b(?:please )?never\s+((?:use|send|book|reply|write|pay|call|share)\b[^.!?;\n]*)", re.I), "never"),
]
_TRAITS = [
    re.compile(r"\bI(?:'m| am) (?:a|an)\s+" + _SHORT_CLAUSE, re.I),
    re.compile(r"\bI work as (?:a |an )?" + _SHORT_CLAUSE, re.I),
    re.compile(r"\bas (?:a|an) ([^,.!?;\n]+), I\b", re.I),
]
_GOALS = re.compile(
    r"\b(?:I need to|I want to|I'd like to|I would like to|I(?:'m| am) trying to|"
    r"[Mm]y goal is to|[Hh]elp me)\s+" + _CLAUSE,
    re.I,
)


def stored_kind(kind: str, user_interaction: bool) -> MemoryKind:
    """The synopsis kind of a stored memory (a row of ``memories``: kind ``episode`` or ``message``,
    and whether the user said it). The store's kinds are not the synopsis's: a user's message is
    ``USER_MESSAGE`` (mined for name, preferences, traits and goals), an agent's ``AGENT_MESSAGE``
    (topics only), an episode ``TASK`` (its text is the session's task).

    >>> stored_kind("message", True), stored_kind("message", False), stored_kind("episode", True)
    (<MemoryKind.USER_MESSAGE: 'user_message'>, <MemoryKind.AGENT_MESSAGE: 'agent_message'>, <MemoryKind.TASK: 'task'>)
    """
    if kind == "message":
        return MemoryKind.USER_MESSAGE if user_interaction else MemoryKind.AGENT_MESSAGE
    if kind == "episode":
        return MemoryKind.TASK
    return MemoryKind(kind)  # already one of the synopsis's own kinds (name, preference, ...)


def _newest_first(memories: Iterable[UserMemory]) -> list[UserMemory]:
    return sorted(memories, key=lambda m: (m.observed_at, m.source_id), reverse=True)


def _phrase(text: str) -> str:
    return clip(" ".join(text.split()).strip(" ,:-"), MAX_PHRASE_CHARS)


def _distinct(phrases: Iterable[str], limit: int) -> tuple[str, ...]:
    out: dict[str, str] = {}
    for p in phrases:
        key = p.casefold()
        if p and key not in out:
            out[key] = p
            if len(out) == limit:
                break
    return tuple(out.values())


class ExtractiveSynopsisBuilder:
    """The default builder: deterministic rules over the user's own words (module docstring)."""

    name = "extractive/1"

    def identity(self, memories: Sequence[UserMemory]) -> UserIdentity:
        name: str | None = None
        preferences: list[str] = []
        traits: list[str] = []
        for m in _newest_first(memories):
            if m.kind is MemoryKind.NAME:
                name = name or _phrase(m.text) or None
            elif m.kind is MemoryKind.PREFERENCE:
                preferences.append(_phrase(m.text))
            elif m.kind is MemoryKind.TRAIT:
                traits.append(_phrase(m.text))
            elif m.kind is MemoryKind.USER_MESSAGE:
                if name is None:
                    found = _NAME.findall(m.text)
                    if found:
                        name = _phrase(found[-1])  # the last statement of the newest message
                hits: list[tuple[int, str]] = []
                for pattern, verb in _PREFERENCES:
                    hits.extend((x.start(), _phrase(f"{verb} {x.group(1)}")) for x in pattern.finditer(m.text))
                preferences.extend(p for _, p in sorted(hits, reverse=True))  # later in the message: newer
                found_traits = sorted((x.start(), _phrase(x.group(1))) for p in _TRAITS for x in p.finditer(m.text))
                traits.extend(t for _, t in reversed(found_traits))
        return UserIdentity(
            name=name, preferences=_distinct(preferences, MAX_PREFERENCES), traits=_distinct(traits, MAX_TRAITS)
        )

    def context(self, memories: Sequence[UserMemory], now: datetime) -> UserContext:
        weights: dict[str, float] = {}
        goals: list[str] = []
        for m in _newest_first(memories):
            age = max(now - m.observed_at, timedelta(0))
            if age > TOPIC_WINDOW:
                continue
            decay = 0.5 ** (age / TOPIC_HALF_LIFE)
            for w in dict.fromkeys(content_words(m.text)):
                weights[w] = weights.get(w, 0.0) + decay
            if age > GOAL_WINDOW:
                continue
            if m.kind in (MemoryKind.GOAL, MemoryKind.TASK):
                goals.append(_phrase(m.text))
            elif m.kind is MemoryKind.USER_MESSAGE:
                found = [x.group(1) for x in _GOALS.finditer(m.text)]
                goals.extend(_phrase(g) for g in reversed(found))
        topics = sorted(weights, key=lambda w: (-weights[w], w))[:MAX_TOPICS]
        return UserContext(recent_topics=tuple(topics), current_goals=_distinct(goals, MAX_GOALS))


DEFAULT_BUILDER = ExtractiveSynopsisBuilder()


def stale_parts(
    synopsis: UserSynopsis | None,
    now: datetime,
    identity_ttl: timedelta = IDENTITY_TTL,
    context_ttl: timedelta = CONTEXT_TTL,
) -> tuple[bool, bool]:
    """(identity stale, context stale): stale when ``now - built_at >= ttl``; no synopsis: both."""
    if synopsis is None:
        return True, True
    return now - synopsis.identity_built_at >= identity_ttl, now - synopsis.context_built_at >= context_ttl


def build(
    user_id: str, memories: Iterable[UserMemory], now: datetime, builder: SynopsisBuilder = DEFAULT_BUILDER
) -> UserSynopsis:
    """A fresh synopsis from the memories of ``user_id`` (any other user's memories are ignored)."""
    own = [m for m in memories if m.user_id == user_id]
    return UserSynopsis(
        user_id=user_id,
        identity=builder.identity(own),
        identity_built_at=now,
        context=builder.context(own, now),
        context_built_at=now,
        builder=builder.name,
    )


def refresh(
    synopsis: UserSynopsis | None,
    user_id: str,
    now: datetime,
    load: MemoryLoader,
    builder: SynopsisBuilder = DEFAULT_BUILDER,
    identity_ttl: timedelta = IDENTITY_TTL,
    context_ttl: timedelta = CONTEXT_TTL,
) -> UserSynopsis:
    """``synopsis`` with its stale parts rebuilt as of ``now`` (the same object when nothing is
    stale; ``load`` is called only when something is). A synopsis of another user is discarded."""
    if synopsis is not None and synopsis.user_id != user_id:
        synopsis = None
    identity_stale, context_stale = stale_parts(synopsis, now, identity_ttl, context_ttl)
    if not identity_stale and not context_stale:
        assert synopsis is not None
        return synopsis
    own = [m for m in load(user_id) if m.user_id == user_id]
    if synopsis is None:
        return build(user_id, own, now, builder)
    if identity_stale:
        synopsis = msgspec.structs.replace(
            synopsis, identity=builder.identity(own), identity_built_at=now, builder=builder.name
        )
    if context_stale:
        synopsis = msgspec.structs.replace(
            synopsis, context=builder.context(own, now), context_built_at=now, builder=builder.name
        )
    return synopsis


def synopsis_lines(synopsis: UserSynopsis) -> list[str]:
    """The synopsis as prompt lines, most stable first; empty parts are left out.

    >>> from datetime import datetime, timezone
    >>> t = datetime(2024, 5, 15, tzinfo=timezone.utc)
    >>> synopsis_lines(UserSynopsis(user_id="u1", identity=UserIdentity(name="Mia", traits=("teacher",)),
    ...     identity_built_at=t, context=UserContext(recent_topics=("flight", "refund")), context_built_at=t))
    ['name: Mia', 'traits: teacher', 'recent topics: flight, refund']
    """
    i, c = synopsis.identity, synopsis.context
    lines = [f"name: {i.name}"] if i.name else []
    if i.preferences:
        lines.append("preferences: " + "; ".join(i.preferences))
    if i.traits:
        lines.append("traits: " + "; ".join(i.traits))
    if c.current_goals:
        lines.append("current goals: " + "; ".join(c.current_goals))
    if c.recent_topics:
        lines.append("recent topics: " + ", ".join(c.recent_topics))
    return lines


class SynopsisCache:
    """Synopses by (user, view), refreshed on access when stale, at most ``max_users`` entries (least
    recently used dropped first). In-process; holds no clock: ``now`` comes with every call.

    A *view* names what the loader was allowed to read: the read API builds one synopsis per user and
    reading agent (``view`` = the agent), from that user's memories in the agent's scope chain only,
    so a user's memories with another agent never reach this one through the cache.

    >>> from datetime import datetime, timezone
    >>> cache = SynopsisCache()
    >>> calls = []
    >>> def load(user):
    ...     calls.append(user)
    ...     return []
    >>> t = datetime(2024, 5, 15, tzinfo=timezone.utc)
    >>> _ = cache.get("u1", t, load); _ = cache.get("u1", t, load); _ = cache.get("u1", t, load, view="support")
    >>> calls
    ['u1', 'u1']
    """

    def __init__(
        self,
        builder: SynopsisBuilder = DEFAULT_BUILDER,
        max_users: int = 10_000,
        identity_ttl: timedelta = IDENTITY_TTL,
        context_ttl: timedelta = CONTEXT_TTL,
    ) -> None:
        if max_users < 1:
            raise ValueError(f"max_users must be >= 1, got {max_users}")
        self.builder, self.max_users = builder, max_users
        self.identity_ttl, self.context_ttl = identity_ttl, context_ttl
        self._entries: OrderedDict[tuple[str, str], UserSynopsis] = OrderedDict()

    def get(self, user_id: str, now: datetime, load: MemoryLoader, view: str = "") -> UserSynopsis:
        key = (user_id, view)
        synopsis = refresh(
            self._entries.get(key), user_id, now, load, self.builder, self.identity_ttl, self.context_ttl
        )
        self._entries[key] = synopsis
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_users:
            self._entries.popitem(last=False)
        return synopsis

    def peek(self, user_id: str, view: str = "") -> UserSynopsis | None:
        """The cached synopsis, stale or not, without refreshing it."""
        return self._entries.get((user_id, view))

    def invalidate(self, user_id: str) -> None:
        """Drop every view of the user's synopsis."""
        for key in [k for k in self._entries if k[0] == user_id]:
            del self._entries[key]

    def __len__(self) -> int:
        return len(self._entries)
