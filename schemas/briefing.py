"""Briefings and swarm metrics: what the briefing generator, the prompt injector and scope promotion record.

- ``BriefingGenerated``: the cached briefing of one agent (compacted topic, key = agent). The newest
  record per agent is the cache; an empty ``markdown`` means "no briefing" (the injector is a no-op).
- ``BriefingServed``: a briefing was prepended to the system prompt of one session (key = agent or
  session). It names the facts the session was shown, which is what utilisation is counted against.
- ``FactUsed``: a session acted on a fact it was shown (a later tool call, message or delegation
  mentioned one of the fact's entities; ``processors/knowledge/swarm_metrics.py`` defines "mention").
- ``FactPromoted``: a statement moved to a wider scope, by utilisation or by hand (``somnus promote``).

Facts are named as the triple log names them: ``source`` / ``target`` are entity ids
(``type:normalised name``), ``scope`` is ``agent:<name>``, ``team:<lead>`` or ``global``.
Every time is event time (an argument of the processor), never the wall clock, so replays agree.

>>> import msgspec, uuid
>>> from datetime import datetime, timezone
>>> p = FactPromoted(schema_version=1, promotion_id=uuid.UUID(int=7), source="api:api.instantly.ai",
...     predicate="rate_limit", target="rate:10/s", from_scope="agent:scraper", to_scope="team:research-lead",
...     reason=PromotionReason.UTILISATION, promoted_at=datetime(2024, 5, 15, tzinfo=timezone.utc),
...     confidence=1.0, learning_rate="moderate", threshold=2, users=["researcher", "scraper"])
>>> msgspec.json.decode(msgspec.json.encode(p), type=FactPromoted) == p
True
"""

from __future__ import annotations

import uuid
from datetime import datetime
from enum import Enum
from typing import Annotated

import msgspec
from msgspec import Meta

BRIEFING_SCHEMA_VERSION = 1

NonEmpty = Annotated[str, Meta(min_length=1)]
AwareTime = Annotated[datetime, Meta(tz=True)]
Confidence = Annotated[float, Meta(ge=0.0, le=1.0)]
Count = Annotated[int, Meta(ge=0)]
Version = Annotated[int, Meta(ge=1, le=BRIEFING_SCHEMA_VERSION)]


class ServedFact(msgspec.Struct, frozen=True, kw_only=True):
    """One fact as a briefing showed it. ``source_name`` / ``target_name`` are the names that were
    printed (and that a later mention is matched against)."""

    triple_id: NonEmpty
    source: NonEmpty
    predicate: NonEmpty
    target: NonEmpty
    scope: NonEmpty
    confidence: Confidence
    source_name: NonEmpty
    target_name: NonEmpty


class BriefingGenerated(msgspec.Struct, frozen=True, kw_only=True):
    """The briefing of one agent, generated at ``generated_at`` (event time) within ``budget`` characters.

    ``briefing_id`` is a digest of (agent, markdown): the same briefing always has the same id.
    ``lessons`` / ``strategies`` count the lines shown, ``facts`` lists the facts shown (in order);
    ``dropped_*`` count the lines the budget (or the per-section limit) left out."""

    schema_version: Version
    briefing_id: NonEmpty
    agent: NonEmpty
    generated_at: AwareTime
    budget: Count
    markdown: str
    chars: Count
    lessons: Count
    facts: list[ServedFact] = []
    strategies: Count = 0
    dropped_lessons: Count = 0
    dropped_facts: Count = 0
    dropped_strategies: Count = 0


class BriefingServed(msgspec.Struct, frozen=True, kw_only=True):
    """A briefing was injected into the system prompt of ``session_id``."""

    schema_version: Version
    briefing_id: NonEmpty
    agent: NonEmpty
    session_id: NonEmpty
    served_at: AwareTime
    facts: list[ServedFact] = []


class FactUsed(msgspec.Struct, frozen=True, kw_only=True):
    """A session acted on a fact its briefing showed: event ``seq`` mentioned ``entity``.

    At most one per (session, triple): the first mention counts."""

    schema_version: Version
    agent: NonEmpty
    session_id: NonEmpty
    briefing_id: NonEmpty
    triple_id: NonEmpty
    source: NonEmpty
    predicate: NonEmpty
    target: NonEmpty
    scope: NonEmpty
    confidence: Confidence  # as the briefing showed it
    entity: NonEmpty  # the entity name that was mentioned
    seq: Count  # the trace event that mentioned it
    used_at: AwareTime


class PromotionReason(str, Enum):
    MANUAL = "manual"  # somnus promote
    UTILISATION = "utilisation"  # the learning rate's threshold was reached


class FactPromoted(msgspec.Struct, frozen=True, kw_only=True):
    """The statement ``source predicate target`` now also holds in ``to_scope`` (it came from ``from_scope``).

    For a promotion by utilisation, ``learning_rate`` / ``threshold`` say which setting decided it and
    ``users`` / ``teams`` are the distinct agents / teams whose use reached it (sorted); the counters
    of the statement for ``to_scope`` restart at zero after this event."""

    schema_version: Version
    promotion_id: uuid.UUID  # derived from the content: a re-emitted promotion has the same id
    source: NonEmpty
    predicate: NonEmpty
    target: NonEmpty
    from_scope: NonEmpty
    to_scope: NonEmpty
    reason: PromotionReason
    promoted_at: AwareTime
    confidence: Confidence
    learning_rate: str | None = None
    threshold: Annotated[int, Meta(ge=1)] | None = None
    users: list[str] = []
    teams: list[str] = []


KIND_PROMOTION = b"promotion"  # header somnus-kind on the facts topic: a FactPromoted (somnus promote)
KIND_SERVED = b"briefing-served"  # header somnus-kind on the facts topic: a BriefingServed (the projector)

# (no header on the facts topic: a FactsExtracted)
