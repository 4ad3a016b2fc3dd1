"""The query planner: one ``get_context`` call assembles what an agent should see for a query. Pure.

It reads nothing itself: the session buffer, the user synopsis and every other tier (recall over
episodes and memory units, the knowledge context, the briefing, ...) come in as arguments; each
tier is a ``Tier`` whose ``search(query, agent, user_id, k)`` returns ranked ``ContextCandidate``s.
So the planner can be measured with synthetic tiers and run with the real ones unchanged.

The window (``max_tokens``, estimated with ``somnus.processors.working.session_buffer.estimate_tokens``):

1. **About the user**: the synopsis lines (``somnus.processors.working.synopsis.synopsis_lines``), most stable
   first, within ``synopsis_share`` (20%) of the window;
2. **Recent conversation**: the newest ``recent_messages`` (10) buffered messages, always
   included before any ranked memory, newest first within ``recent_share`` (40%) of the window and
   stopping at the first that does not fit (so it is a contiguous stretch), shown oldest first, one
   line each (whitespace collapsed; empty messages left out);
3. **Relevant memory**: the candidates of all tiers plus the buffer's own older messages and
   summaries (tier ``buffer``, ranked by the share of the query's content words they contain),
   fused by weighted reciprocal rank fusion: ``score = sum over the tiers that returned it of
   weight / (rrf_k + rank)`` with ``rrf_k`` = 60 and rank 1-based within the tier (each tier's
   candidates ordered by its score, ties by ``source_id``). Duplicates are merged before fitting:
   the same text after case-folding and keeping only ``\\w+`` words, or word sets with Jaccard >=
   ``dedup_jaccard`` (0.8); a merged item sums its contributions and names every tier. A candidate
   already in the recent conversation is dropped. Items are taken best first into what is left of
   the window (unused room of sections 1 and 2 included); one that does not fit is skipped and
   smaller ones may still go in. No single item takes more than ``max_item_share`` (25%) of the
   window: longer texts are clipped.

**Neutralised text**: every stored text in a line goes through ``somnus.processors.briefing.injection.one_line``
(one line, no marker brackets, no invisible characters), and every line starts with a header, a
label (``name: ``, ``- [tier] ``) or a role of ours: no stored text starts a line.

Every line's cost is ``estimate_tokens(line + "\\n")``; since the estimate is subadditive the whole
text never exceeds ``max_tokens``.

**User isolation**: a record is visible to a reader iff it belongs to no user or to that reader
(``visible_to``). Tiers receive ``user_id`` and must filter at their data layer; the planner
filters again, and also drops a buffer or a synopsis of another user. A reader with no
``user_id`` sees only records that belong to no user.

>>> from somnus.schemas.working_memory import ContextCandidate
>>> facts = Tier("knowledge", lambda q, agent, user, k: [
...     ContextCandidate(text="api.instantly.ai rate_limit 10/s", score=0.9, source_id="t1"),
...     ContextCandidate(text="secret of u2", score=0.8, source_id="t2", user_id="u2")])
>>> ctx = get_context("rate limit of instantly", "scraper", user_id="u1", max_tokens=100, tiers=[facts])
>>> print(ctx.text, end="")
## Relevant memory
- [knowledge] api.instantly.ai rate_limit 10/s
>>> ctx.filtered, ctx.tokens <= 100
(1, True)
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import msgspec

from somnus.processors.sessions.distiller import session_key
from somnus.processors.briefing.injection import one_line
from somnus.processors.working.synopsis import synopsis_lines
from somnus.processors.working.session_buffer import (
    CHARS_PER_TOKEN,
    clip,
    content_words,
    estimate_tokens,
    recent,
    summary_line,
)
from somnus.schemas.working_memory import (
    AssembledContext,
    BufferedMessage,
    ContextCandidate,
    ContextItem,
    SessionSummary,
    UserSynopsis,
    WorkingMemoryState,
)

SYNOPSIS_HEADER = "## About the user"
RECENT_HEADER = "## Recent conversation"
RANKED_HEADER = "## Relevant memory"
BUFFER_TIER = "buffer"


class ContextSource(Protocol):
    """A tier's search: the best ``k`` candidates for ``query`` that ``agent`` and ``user_id`` may see."""

    # positional-only: a tier's search is called positionally, whatever its parameters are named
    def __call__(self, query: str, agent: str, user_id: str | None, k: int, /) -> Sequence[ContextCandidate]: ...


@dataclass(frozen=True)
class Tier:
    """A named source of ranked candidates and its weight in the fusion."""

    name: str
    search: ContextSource
    weight: float = 1.0
    k: int = 20


class PlannerSettings(msgspec.Struct, frozen=True, kw_only=True):
    recent_messages: int = 10  # MUXI: buffer.get_recent(10)
    synopsis_share: float = 0.2
    recent_share: float = 0.4
    max_item_share: float = 0.25
    rrf_k: int = 60  # the usual reciprocal-rank-fusion constant (Cormack et al., 2009)
    dedup_jaccard: float = 0.8
    buffer_weight: float = 1.0
    buffer_k: int = 20

    def __post_init__(self) -> None:
        for name in ("synopsis_share", "recent_share", "max_item_share", "dedup_jaccard"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {value}")
        if self.recent_messages < 0 or self.rrf_k < 0 or self.buffer_k < 0:
            raise ValueError("recent_messages, rrf_k and buffer_k must be >= 0")


DEFAULT_PLANNER = PlannerSettings()


def visible_to(record_user_id: str | None, reader_user_id: str | None) -> bool:
    """The one isolation rule: a record is visible iff it belongs to no user or to the reader.

    >>> visible_to(None, "u1"), visible_to("u1", "u1"), visible_to("u2", "u1"), visible_to("u1", None)
    (True, True, False, False)
    """
    return record_user_id is None or record_user_id == reader_user_id


def line_cost(line: str) -> int:
    """The tokens a line costs in the window (its text and its newline)."""
    return estimate_tokens(line + "\n")


_ANY_WORD = re.compile(r"\w+")


def _words(text: str) -> list[str]:
    return _ANY_WORD.findall(text.casefold())


def _jaccard_at_least(a: frozenset[str], b: frozenset[str], threshold: float) -> bool:
    la, lb = len(a), len(b)
    if not la or not lb or min(la, lb) < threshold * max(la, lb):  # the size ratio bounds the Jaccard
        return False
    inter = len(a & b)
    return inter >= threshold * (la + lb - inter)


def _prefix(words: frozenset[str], threshold: float) -> tuple[str, ...]:
    n = len(words)
    return tuple(sorted(words, key=hash)[: n - math.ceil(threshold * n - 1e-9) + 1])


@functools.lru_cache(maxsize=4096)  # bounded: ~20 MB at worst (long texts)
def _dedup_form(text: str, threshold: float) -> tuple[str, frozenset[str], tuple[str, ...]]:
    """A text's exact-duplicate key, word set and prefix. A memo of a pure function: summaries,
    facts and briefing lines come back on every call, and their words need reading only once."""
    words = _words(text)
    word_set = frozenset(words)
    return " ".join(words), word_set, _prefix(word_set, threshold)


class _NearDuplicates:
    """Word sets, found again by Jaccard >= ``threshold`` with prefix filtering (Bayardo et al., 2007):
    with the words of every set in one global order, two sets of Jaccard >= t share a word among
    the first ``n - ceil(t * n) + 1`` of each, so only sets sharing a prefix word are compared, and
    those exactly. The result does not depend on which order is used (every set of Jaccard >= t
    is a candidate whatever the order, and the earliest exact match wins), so the order is the
    cheapest one at hand: the process's string hash. Nothing here is persisted."""

    def __init__(self, threshold: float) -> None:
        self.threshold = threshold
        self.sets: list[frozenset[str]] = []
        self.by_prefix_word: dict[str, list[int]] = {}

    def prefix(self, words: frozenset[str]) -> tuple[str, ...]:
        return _prefix(words, self.threshold)

    def add(self, words: frozenset[str], prefix: tuple[str, ...]) -> int:
        """Remember a word set (with its ``prefix``); returns its index (insertion order)."""
        index = len(self.sets)
        self.sets.append(words)
        for w in prefix:
            self.by_prefix_word.setdefault(w, []).append(index)
        return index

    def first_match(self, words: frozenset[str], prefix: tuple[str, ...]) -> int | None:
        """The index of the earliest remembered set with Jaccard >= threshold, or None."""
        if not words:
            return None
        found = {i for w in prefix for i in self.by_prefix_word.get(w, ())}
        return next((i for i in sorted(found) if _jaccard_at_least(words, self.sets[i], self.threshold)), None)


@functools.lru_cache(maxsize=8192)  # a few sessions' summaries; ~40 MB at worst
def _content_set(text: str) -> frozenset[str]:
    # A memo of a pure function (outputs never depend on it): a session's summaries are searched on
    # every get_context call, and tokenising 500 of them each time would cost ~10 ms.
    return frozenset(content_words(text))


def buffer_candidates(buffer: WorkingMemoryState, query: str, skip_newest: int, k: int) -> list[ContextCandidate]:
    """The buffer as a tier: its summaries and the messages older than the newest ``skip_newest``,
    scored by the share of the query's content words they contain (a summary's tools count as its
    words; those with none are left out; a query without content words keeps them all, newest first)."""
    wanted = frozenset(content_words(query))
    older = buffer.messages[:-skip_newest] if skip_newest > 0 else buffer.messages
    scored: list[tuple[float, int, object]] = []  # (overlap, last seq, message or summary); seqs are unique
    for m in older:
        overlap = len(wanted & _content_set(m.text)) / len(wanted) if wanted else 0.0
        if overlap > 0.0 or not wanted:
            scored.append((overlap, m.seq, m))
    for sm in buffer.summaries:
        if wanted:
            words = _content_set(sm.text)
            if sm.tools:
                words = words | _content_set(" ".join(sm.tools))
            overlap = len(wanted & words) / len(wanted)
            if overlap == 0.0:
                continue
        else:
            overlap = 0.0
        scored.append((overlap, sm.last_seq, sm))
    scored.sort(key=lambda x: (-x[0], -x[1]))  # best overlap, then the newest
    key = session_key(buffer.agent, buffer.session_id)
    out = []
    for overlap, _, item in scored[:k]:
        if isinstance(item, BufferedMessage):
            out.append(
                ContextCandidate(
                    text=f"{item.role.value}: {item.text}",
                    score=overlap,
                    source_id=f"{key}#seq{item.seq}",
                    user_id=buffer.user_id,
                )
            )
        else:
            assert isinstance(item, SessionSummary)
            out.append(
                ContextCandidate(
                    text=summary_line(item),
                    score=overlap,
                    source_id=f"{key}#summary:{item.summary_id}",
                    user_id=buffer.user_id,
                )
            )
    return out


class _Group:
    """Candidates merged as duplicates: the first (best) one speaks for all, their scores add up."""

    __slots__ = ("score", "tiers", "first")

    def __init__(self, score: float, tier: str, first: ContextCandidate) -> None:
        self.score, self.tiers, self.first = score, [tier], first


def get_context(
    query: str,
    agent: str,
    user_id: str | None = None,
    max_tokens: int = 4000,
    *,
    tiers: Sequence[Tier] = (),
    buffer: WorkingMemoryState | None = None,
    synopsis: UserSynopsis | None = None,
    settings: PlannerSettings = DEFAULT_PLANNER,
) -> AssembledContext:
    """The context for ``query``: synopsis, recent conversation, then fused memory, within ``max_tokens``.

    ``buffer`` is the working memory of the agent's current session (it must be ``agent``'s);
    ``synopsis`` the user's (``somnus.processors.working.synopsis.SynopsisCache.get``). See the module docstring.
    """
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    if buffer is not None and buffer.agent != agent:
        raise ValueError(f"the buffer is agent {buffer.agent!r}'s, not {agent!r}'s")
    filtered = duplicates = dropped = considered = 0
    if synopsis is not None and synopsis.user_id != user_id:
        synopsis, filtered = None, filtered + 1
    if buffer is not None and not visible_to(buffer.user_id, user_id):
        buffer, filtered = None, filtered + 1
    item_chars = max(1, int(settings.max_item_share * max_tokens)) * CHARS_PER_TOKEN
    lines: list[str] = []
    used = 0

    # 1. about the user
    synopsis_shown: list[str] = []
    if synopsis is not None:
        room = int(settings.synopsis_share * max_tokens) - line_cost(SYNOPSIS_HEADER)
        for line in synopsis_lines(synopsis):
            line = clip(one_line(line), item_chars)
            if line_cost(line) <= room:
                synopsis_shown.append(line)
                room -= line_cost(line)
        if synopsis_shown:
            lines += [SYNOPSIS_HEADER, *synopsis_shown]
            used += line_cost(SYNOPSIS_HEADER) + sum(map(line_cost, synopsis_shown))

    # 2. the recent conversation: a contiguous newest stretch
    recent_items: list[ContextItem] = []
    seen_keys: set[str] = set()
    seen_sets: list[frozenset[str]] = []
    newest = recent(buffer, settings.recent_messages) if buffer is not None else ()
    if newest:
        assert buffer is not None
        key = session_key(buffer.agent, buffer.session_id)
        room = int(settings.recent_share * max_tokens) - line_cost(RECENT_HEADER)
        for m in reversed(newest):
            flat = one_line(m.text)  # one line per item, neutralised, as in the ranked part
            if not flat:
                continue  # an empty message says nothing
            line = f"{m.role.value}: {clip(flat, item_chars)}"
            cost = line_cost(line)
            if cost > room:
                break
            room -= cost
            recent_items.append(
                ContextItem(
                    tiers=(BUFFER_TIER,),
                    source_id=f"{key}#seq{m.seq}",
                    text=line,
                    score=0.0,
                    tokens=cost,
                    user_id=buffer.user_id,
                )
            )
            words = _words(m.text)  # a recalled copy of the message has no role prefix
            seen_keys.add(" ".join(words))
            seen_sets.append(frozenset(words))
        recent_items.reverse()
        if recent_items:
            lines += [RECENT_HEADER, *(i.text for i in recent_items)]
            used += line_cost(RECENT_HEADER) + sum(i.tokens for i in recent_items)

    # 3. every tier's candidates, fused
    contributions: list[tuple[float, int, str, ContextCandidate]] = []
    sources: list[tuple[str, float, int, list[ContextCandidate]]] = []
    if buffer is not None:
        sources.append(
            (
                BUFFER_TIER,
                settings.buffer_weight,
                settings.buffer_k,
                buffer_candidates(buffer, query, len(recent_items), settings.buffer_k),
            )
        )
    for tier in tiers:
        sources.append((tier.name, tier.weight, tier.k, list(tier.search(query, agent, user_id, tier.k))))
    for index, (name, weight, k, found) in enumerate(sources):
        considered += len(found)
        visible = [c for c in found if visible_to(c.user_id, user_id) and one_line(c.text)]
        filtered += sum(not visible_to(c.user_id, user_id) for c in found)
        visible.sort(key=lambda c: (-c.score, c.source_id))
        for rank, c in enumerate(visible[:k], 1):
            contributions.append((weight / (settings.rrf_k + rank), index, name, c))
    contributions.sort(key=lambda x: (-x[0], x[1], x[3].source_id))
    seen = _NearDuplicates(settings.dedup_jaccard)
    for word_set in seen_sets:
        seen.add(word_set, seen.prefix(word_set))
    near = _NearDuplicates(settings.dedup_jaccard)
    groups: list[_Group] = []
    by_key: dict[str, _Group] = {}
    for score, _, name, c in contributions:
        key, word_set, prefix = _dedup_form(c.text, settings.dedup_jaccard)
        if key in seen_keys or seen.first_match(word_set, prefix) is not None:
            duplicates += 1  # already in the recent conversation
            continue
        group = by_key.get(key)
        if group is None:
            match = near.first_match(word_set, prefix)
            group = groups[match] if match is not None else None
        if group is not None:
            duplicates += 1
            group.score += score
            if name not in group.tiers:
                group.tiers.append(name)
            by_key.setdefault(key, group)
            continue
        group = _Group(score, name, c)
        near.add(word_set, prefix)
        groups.append(group)
        by_key[key] = group
    groups.sort(key=lambda g: -g.score)  # stable: equal scores keep the contribution order

    room = max_tokens - used - line_cost(RANKED_HEADER)
    ranked: list[ContextItem] = []
    for g in groups:
        line = f"- [{'+'.join(g.tiers)}] {clip(one_line(g.first.text), item_chars)}"
        cost = line_cost(line)
        if cost > room:
            dropped += 1
            continue
        room -= cost
        ranked.append(
            ContextItem(
                tiers=tuple(g.tiers),
                source_id=g.first.source_id,
                text=line,
                score=g.score,
                tokens=cost,
                user_id=g.first.user_id,
            )
        )
    if ranked:
        lines += [RANKED_HEADER, *(i.text for i in ranked)]

    text = "".join(line + "\n" for line in lines)
    return AssembledContext(
        query=query,
        agent=agent,
        user_id=user_id,
        max_tokens=max_tokens,
        tokens=estimate_tokens(text),
        text=text,
        synopsis=tuple(synopsis_shown),
        recent=tuple(recent_items),
        ranked=tuple(ranked),
        considered=considered,
        filtered=filtered,
        duplicates=duplicates,
        dropped=dropped,
    )
