"""Working memory, user synopses and assembled context: the frozen types of issue 9.

Three groups:

- the **session buffer** (``processors/working/session_buffer.py``): ``BufferedMessage`` (one message of a
  session as the buffer keeps it), ``SessionSummary`` (one summarised batch in the extended
  buffer), ``WorkingMemoryState`` (one session's buffer: a Faust table value, keyed by
  ``somnus.processors.sessions.distiller.session_key``) and the events its fold emits, named in the past tense:
  ``MessagesSummarised``, ``SummariesMerged``, ``SummaryEvicted``;
- the **user synopsis** (``processors/working/synopsis.py``): ``UserMemory`` (what the builder reads),
  ``UserIdentity``, ``UserContext``, ``UserSynopsis``;
- the **assembled context** (``processors/briefing/context.py``): ``ContextCandidate`` (what a tier source
  returns), ``ContextItem`` and ``AssembledContext`` (what ``get_context`` returns).

Every record that can belong to a user carries ``user_id`` (None: the trace named no user).

>>> import msgspec
>>> from datetime import datetime, timezone
>>> t = datetime(2024, 5, 15, tzinfo=timezone.utc)
>>> s = WorkingMemoryState(agent="support", session_id="s1", user_id="u1", last_seq=0,
...     messages=(BufferedMessage(seq=0, ts=t, role="user", text="hi", tokens=5),), message_tokens=5)
>>> msgspec.json.decode(msgspec.json.encode(s), type=WorkingMemoryState) == s
True
"""

from __future__ import annotations

import uuid
from datetime import datetime
from enum import Enum
from typing import Annotated, Union

import msgspec
from msgspec import Meta

WORKING_MEMORY_SCHEMA_VERSION = 1

NonNegative = Annotated[int, Meta(ge=0)]

# Summary ids are derived from what they cover, so a replay or a redelivery re-creates the same id.
SUMMARY_NAMESPACE = uuid.UUID("3f0d6c2a-8e41-4b7a-9c5d-2a1e7f4b6c80")


def summary_id_for(agent: str, session_id: str, level: int, first_seq: int, last_seq: int) -> uuid.UUID:
    """The id of the summary of ``level`` covering seqs ``first_seq..last_seq`` of one session.

    >>> summary_id_for("a", "s", 0, 0, 9) == summary_id_for("a", "s", 0, 0, 9) != summary_id_for("a", "s", 1, 0, 9)
    True
    """
    return uuid.uuid5(SUMMARY_NAMESPACE, f"{agent}\x1f{session_id}\x1f{level}\x1f{first_seq}\x1f{last_seq}")


class Role(str, Enum):
    """Who said it: the trace event type a buffered message came from."""

    USER = "user"  # user_message
    AGENT = "agent"  # agent_message
    TOOL_CALL = "tool_call"
    TOOL_RESULT = "tool_result"


# ---- the session buffer -----------------------------------------------------------------


class BufferedMessage(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """One message of a session as the ring buffer keeps it (text capped; ``tokens`` estimated once).

    ``gc=False`` here and below: these hold no reference cycles, so the cyclic garbage collector
    need not walk the ~1,000 objects of a full buffer."""

    seq: NonNegative
    ts: datetime
    role: Role
    text: str
    tokens: NonNegative
    tool: str | None = None  # tool_call / tool_result: the tool's name


class SessionSummary(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """One entry of the extended buffer: a batch of messages (level 0) or of summaries (level 1+)
    compressed into one extractive summary. ``text`` is the body; ``tokens`` counts the rendered
    line (``somnus.processors.working.session_buffer.summary_line``)."""

    summary_id: uuid.UUID
    level: NonNegative
    first_seq: NonNegative
    last_seq: NonNegative
    first_ts: datetime
    last_ts: datetime
    messages: NonNegative  # how many original messages it stands for
    tools: tuple[str, ...] = ()
    text: str
    tokens: NonNegative


class WorkingMemoryState(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """One session's working memory: the ring buffer of recent messages and the extended buffer of
    summaries, oldest first. A Faust table value keyed by ``session_key(agent, session_id)``;
    replaced, never mutated (``add`` returns a new state)."""

    agent: str
    session_id: str
    user_id: str | None = None
    task: str | None = None
    last_seq: int = -1  # the highest seq applied: an event at or below it is a redelivery
    closed: bool = False  # session_end seen: later events are late and ignored
    messages: tuple[BufferedMessage, ...] = ()
    summaries: tuple[SessionSummary, ...] = ()
    message_tokens: NonNegative = 0  # sum of messages[i].tokens, kept so the budget check is O(1)
    summary_tokens: NonNegative = 0  # sum of summaries[i].tokens
    summarised: NonNegative = 0  # messages ever folded into summaries
    evicted: NonNegative = 0  # summaries ever dropped (capacity or budget)

    @property
    def tokens(self) -> int:
        return self.message_tokens + self.summary_tokens


class CompressionReason(str, Enum):
    OVERFLOW = "overflow"  # the ring buffer went past its size
    TOKEN_BUDGET = "token_budget"  # the estimated tokens went past working_memory_max_tokens
    CAPACITY = "capacity"  # the extended buffer went past size x multiplier


class _WorkingMemoryEvent(msgspec.Struct, frozen=True, tag_field="type", kw_only=True):
    schema_version: int = WORKING_MEMORY_SCHEMA_VERSION
    agent: str
    session_id: str
    user_id: str | None
    at: datetime  # event time: the ts of the trace event that caused it
    reason: CompressionReason


class MessagesSummarised(_WorkingMemoryEvent, frozen=True, tag="messages_summarised"):
    """The oldest batch of buffered messages became one summary and left the ring buffer."""

    summary: SessionSummary


class SummariesMerged(_WorkingMemoryEvent, frozen=True, tag="summaries_merged"):
    """The oldest summaries were compressed into one of a higher level (token budget only)."""

    merged: tuple[uuid.UUID, ...]
    summary: SessionSummary


class SummaryEvicted(_WorkingMemoryEvent, frozen=True, tag="summary_evicted"):
    """The oldest summary left the extended buffer (capacity, or a budget merging could not meet)."""

    summary: SessionSummary


WorkingMemoryEvent = Union[MessagesSummarised, SummariesMerged, SummaryEvicted]


# ---- the user synopsis ------------------------------------------------------------------


class MemoryKind(str, Enum):
    """What a ``UserMemory`` is; the synopsis builder reads each kind differently."""

    USER_MESSAGE = "user_message"  # the user's own words: self-statements are mined
    AGENT_MESSAGE = "agent_message"  # only topics
    TASK = "task"  # an episode's task: a goal when recent
    GOAL = "goal"  # an episode's goal
    SUMMARY = "summary"  # a working-memory summary: only topics
    NAME = "name"  # a stated fact (e.g. from an LLM extractor): taken verbatim
    PREFERENCE = "preference"
    TRAIT = "trait"


class UserMemory(msgspec.Struct, frozen=True, kw_only=True):
    """One memory of a user, as the synopsis builder reads it. ``source_id`` breaks ties."""

    user_id: str
    kind: MemoryKind
    text: str
    observed_at: datetime
    source_id: str


class UserIdentity(msgspec.Struct, frozen=True, kw_only=True):
    """Slow-changing: cached for ``IDENTITY_TTL`` (7 days)."""

    name: str | None = None
    preferences: tuple[str, ...] = ()
    traits: tuple[str, ...] = ()


class UserContext(msgspec.Struct, frozen=True, kw_only=True):
    """Fast-changing: cached for ``CONTEXT_TTL`` (1 hour)."""

    recent_topics: tuple[str, ...] = ()
    current_goals: tuple[str, ...] = ()


class UserSynopsis(msgspec.Struct, frozen=True, kw_only=True):
    """A user's synopsis and when each part was built (``now`` of the build, not a wall clock)."""

    user_id: str
    identity: UserIdentity
    identity_built_at: datetime
    context: UserContext
    context_built_at: datetime
    builder: str = "extractive/1"


# ---- the assembled context --------------------------------------------------------------


class ContextCandidate(msgspec.Struct, frozen=True, kw_only=True):
    """What a tier source returns for a query: one piece of memory with the source's own score
    (higher is better; only the order within one source matters). ``source_id`` must be stable
    (it breaks ties); ``user_id`` None means the record belongs to no user."""

    text: str
    score: float
    source_id: str
    user_id: str | None = None
    observed_at: datetime | None = None


class ContextItem(msgspec.Struct, frozen=True, kw_only=True):
    """One line of the assembled context: ``text`` is the line as rendered (``user: ...`` in the recent
    conversation, ``- [recall+knowledge] ...`` in the ranked part); ``tiers``: every tier that returned
    it (duplicates merged); ``score``: its fused score (0 for the recent conversation, which is not ranked)."""

    tiers: tuple[str, ...]
    source_id: str
    text: str
    score: float
    tokens: NonNegative  # of its rendered line
    user_id: str | None = None


class AssembledContext(msgspec.Struct, frozen=True, kw_only=True):
    """What ``get_context`` returns: the rendered ``text`` (at most ``max_tokens`` estimated tokens)
    and its parts, with counts of what was left out and why."""

    query: str
    agent: str
    user_id: str | None
    max_tokens: int
    tokens: NonNegative  # estimate_tokens(text)
    text: str
    synopsis: tuple[str, ...]  # the synopsis lines included
    recent: tuple[ContextItem, ...]  # the recent conversation, oldest first
    ranked: tuple[ContextItem, ...]  # the rest, best first
    considered: NonNegative  # candidates returned by all tiers
    filtered: NonNegative  # candidates (and buffer / synopsis) of another user, dropped
    duplicates: NonNegative  # candidates merged into another or already in the recent conversation
    dropped: NonNegative  # ranked candidates that did not fit the window
