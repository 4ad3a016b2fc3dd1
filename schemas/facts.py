"""Facts: what entity extraction makes of one episode (topic ``facts``, one partition, key = episode_id).

The ``facts`` topic is the knowledge graph's input log. It has a single partition on purpose: the
triple log is a fold over it in offset order, so replaying the topic rebuilds the same log byte for
byte, and the fold never depends on how partitions interleave. Every fact carries the event time of
its episode (``observed_at``); wall-clock time never decides ``valid_from`` / ``valid_to``.

Names here are as the extractor saw them; the knowledge fold normalises them and merges
near-duplicates (``processors/knowledge/triples.py``).

>>> import msgspec, uuid
>>> from datetime import datetime, timezone
>>> f = FactsExtracted(schema_version=1, episode_id=uuid.UUID(int=1), agent="support",
...     observed_at=datetime(2024, 5, 15, tzinfo=timezone.utc), extractor="trace/1",
...     entities=[EntityMention(name="book_reservation", type="tool")],
...     facts=[FactAsserted(source="support", source_type="agent", predicate="uses",
...                         target="book_reservation", target_type="tool", confidence=1.0)])
>>> msgspec.json.decode(msgspec.json.encode(f), type=FactsExtracted) == f
True
"""

from __future__ import annotations

import uuid
from datetime import datetime
from enum import Enum
from typing import Annotated, Any

import msgspec
from msgspec import Meta

FACTS_SCHEMA_VERSION = 1

NonEmpty = Annotated[str, Meta(min_length=1)]
Confidence = Annotated[float, Meta(ge=0.0, le=1.0)]


class EntityType(str, Enum):
    """The standard entity types; any other non-empty string is allowed as a custom type."""

    API = "api"
    TOOL = "tool"
    AGENT = "agent"
    ERROR = "error"
    CONCEPT = "concept"
    PROJECT = "project"
    CLIENT = "client"


class EntityMention(msgspec.Struct, frozen=True, omit_defaults=True):
    name: NonEmpty
    type: NonEmpty  # an EntityType value or a custom string
    attributes: dict[str, Any] = {}  # merged (union) into the entity's attributes


class FactAsserted(msgspec.Struct, frozen=True, omit_defaults=True, kw_only=True):
    """One triple ``source --predicate--> target`` as asserted by one episode.

    ``count`` is how many times the episode states it (e.g. the same error three times);
    ``scope`` None means the default, the asserting agent's private scope."""

    source: NonEmpty
    source_type: NonEmpty
    predicate: NonEmpty
    target: NonEmpty
    target_type: NonEmpty
    confidence: Confidence
    count: Annotated[int, Meta(ge=1)] = 1
    functional: bool | None = None  # a new predicate's kind, for the registry; None: registry decides
    scope: str | None = None  # "agent:<name>", "team:<lead>", "global"; None: "agent:<asserting agent>"


class FactsExtracted(msgspec.Struct, frozen=True, kw_only=True):
    schema_version: Annotated[int, Meta(ge=1, le=FACTS_SCHEMA_VERSION)]
    episode_id: uuid.UUID  # the evidence of every fact here
    agent: NonEmpty  # the asserting agent: createdBy, and the default scope
    observed_at: datetime  # the episode's end (event time): valid_from of new facts
    extractor: NonEmpty  # which extractor made these, e.g. "trace/1" or "llm/claude-3-5-haiku"
    entities: list[EntityMention] = []
    facts: list[FactAsserted] = []


def agent_scope(agent: str) -> str:
    return f"agent:{agent}"


def team_scope(lead: str) -> str:
    return f"team:{lead}"


GLOBAL_SCOPE = "global"
