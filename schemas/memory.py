"""Episodic memory: memory units, and the events of the memory log (capture, links, access, forgetting).

A ``MemoryUnit`` is a candidate memory: a finished episode (from the distiller) or, for
conversational traces, one message. It keeps the ids of the trace events it came from
(``source_event_ids``) and, when the source had its own ids for them (LoCoMo's ``dia_id``),
those too (``refs``). Its fields follow an episodic memory record: what was perceived and the
context, what was decided and done, and the outcome.

The memory log (one partition, folded in offset order by ``processors/episodic/capture.py``) holds:

- ``CaptureDecided``: what capture made of one unit: stored as a new memory, or merged into an
  existing one, with the reasons and the prediction error. It carries the unit, so the log alone
  rebuilds every memory and index: replay never decides again, it re-applies the decisions.
- ``MemoryLinked``: an association edge (both directions), with the parts of its weight.
- ``MemoryAccessed``: one memory returned by one recall. Reads never change state; this event does.
- ``MemoryForgotten``: a memory removed (or compressed); its edges go with it.
- ``MemoryUnlinked``: an edge removed by the consistency check (an end no longer exists).

>>> import uuid
>>> from datetime import datetime, timezone
>>> t = datetime(2023, 5, 8, 13, 56, tzinfo=timezone.utc)
>>> u = MemoryUnit(memory_id="m1", kind=MemoryKind.MESSAGE, agent="locomo-conv-26", scope="agent:locomo-conv-26",
...                run_id="conv-26-s1", position=3, occurred_at=t, perception="I went to a support group",
...                speaker="Caroline", people=["caroline"], refs=["D1:3"], source_event_ids=[uuid.UUID(int=7)])
>>> ev = CaptureDecided(schema_version=1, unit=u, action=CaptureAction.STORED, memory_id="m1",
...                     reasons=["user_interaction"], prediction_error=1.0, decided_at=t)
>>> msgspec.json.decode(msgspec.json.encode(ev), type=MemoryEvent) == ev
True
"""

from __future__ import annotations

import uuid
from datetime import datetime
from enum import Enum
from typing import Annotated, Union

import msgspec
from msgspec import Meta

MEMORY_SCHEMA_VERSION = 1

# Memory ids are derived from what the unit came from, so re-deriving a unit gives the same id.
MEMORY_NAMESPACE = uuid.UUID("3c8f4e2a-91d7-4b6e-a5f0-7e2d1c9b8a63")

Unit = Annotated[float, Meta(ge=0.0, le=1.0)]
Version = Annotated[int, Meta(ge=1, le=MEMORY_SCHEMA_VERSION)]


def memory_id_for(agent: str, kind: str, source: str) -> str:
    """A stable memory id: the same agent, kind and source key give the same id.

    >>> memory_id_for("a", "episode", "s1") == memory_id_for("a", "episode", "s1")
    True
    """
    return str(uuid.uuid5(MEMORY_NAMESPACE, f"{agent}\x1f{kind}\x1f{source}"))


class MemoryKind(str, Enum):
    EPISODE = "episode"  # a finished session, from the distiller
    MESSAGE = "message"  # one message of a conversational trace


class CaptureReason(str, Enum):
    """Why a unit became a memory (several may hold at once)."""

    USER_INTERACTION = "user_interaction"  # always recorded
    FAILURE = "failure"  # always recorded: mistakes teach
    GOAL_CHANGE = "goal_change"  # always recorded: the agent now pursues something else
    SURPRISE = "surprise"  # prediction error > 0.5: nothing similar is known
    RELATED = "related"  # prediction error 0.15-0.5: new, and linked to what it resembles
    SALIENCE = "salience"  # salience at or above the capture threshold
    CHECKPOINT = "checkpoint"  # the agent stored nothing for a while (event time)
    NEAR_DUPLICATE = "near_duplicate"  # prediction error < 0.15: merged into the existing memory


class CaptureAction(str, Enum):
    STORED = "stored"  # a new memory
    MERGED = "merged"  # folded into ``memory_id`` (its sources and refs join that memory)


class ForgetReason(str, Enum):
    REMOVED = "removed"  # gone from every index
    COMPRESSED = "compressed"  # still recallable by its text, but its edges are dropped


class MemoryUnit(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One candidate memory, as the unit builders (``processors/episodic/capture.py``) derive it."""

    memory_id: str
    kind: MemoryKind
    agent: Annotated[str, Meta(min_length=1)]
    scope: str  # "agent:<agent>" unless the source says otherwise
    run_id: str  # the session it came from
    position: Annotated[int, Meta(ge=0)] = 0  # order within the run (the message's seq; 0 for an episode)
    occurred_at: datetime  # event time (an episode's end, a message's ts)
    source_event_ids: list[uuid.UUID] = []
    refs: list[str] = []  # the source's own ids for it (LoCoMo dia_id "D1:3")
    perception: str = ""  # what came in: the task, the message text
    context: str = ""  # the situation: goal, session date, metadata
    decision: str = ""  # what was decided: the plan (tools in first-use order), a delegation
    action: str = ""  # what was done: the call sequence
    outcome: str = ""  # success | failure | partial | "" (a message has none)
    success: bool | None = None
    goal: str | None = None
    summary: str = ""  # the result, in a sentence
    lessons: list[str] = []
    tools: list[str] = []
    objects: list[str] = []  # hosts, error classes, projects the memory involves
    people: list[str] = []  # users, speakers, delegated agents (normalised: lower case)
    domains: list[str] = []  # metadata domain / project / client
    mode: str = ""  # conversation | tool_use | delegation
    speaker: str | None = None  # who said it (messages), as written
    user_interaction: bool = False
    importance: Unit = 0.5  # explicit importance from the source (metadata ``importance``), else 0.5
    salience: Unit = 0.0
    user_id: str | None = None  # the user the memory belongs to (reads of another user never see it)


class CaptureDecided(msgspec.Struct, frozen=True, kw_only=True, tag="capture_decided"):
    schema_version: Version
    unit: MemoryUnit
    action: CaptureAction
    memory_id: str  # the new memory (the unit's id) or the merge target
    reasons: list[str]  # CaptureReason values, in the order the rules were checked
    prediction_error: Unit  # 1 - max similarity to the agent's existing memories
    nearest_id: str | None = None
    nearest_similarity: Unit = 0.0
    decided_at: datetime


class MemoryLinked(msgspec.Struct, frozen=True, kw_only=True, tag="memory_linked"):
    """An association edge between two memories, valid both ways; ``a`` < ``b``.

    ``weight = 0.60 shared + 0.25 goal + 0.15 temporal`` (``processors/recall.edge_weight``)."""

    schema_version: Version
    a: str
    b: str
    weight: Unit
    shared: Unit  # Jaccard of the objects and people of the two memories
    goal: Unit  # word Jaccard of their goals
    temporal: Unit  # exp(-hours apart / 24)
    similarity: Unit  # the situation similarity that made capture recall the older one
    formed_at: datetime


class MemoryAccessed(msgspec.Struct, frozen=True, kw_only=True, tag="memory_accessed"):
    schema_version: Version
    memory_id: str
    agent: str  # who recalled it
    query: str  # the query, cut to 200 characters
    rank: Annotated[int, Meta(ge=1)]
    score: float
    accessed_at: datetime


class MemoryForgotten(msgspec.Struct, frozen=True, kw_only=True, tag="memory_forgotten"):
    schema_version: Version
    memory_id: str
    reason: ForgetReason
    forgotten_at: datetime


class MemoryUnlinked(msgspec.Struct, frozen=True, kw_only=True, tag="memory_unlinked"):
    schema_version: Version
    a: str
    b: str
    reason: str  # "orphan": an end of the edge is not a live memory
    unlinked_at: datetime


MemoryEvent = Union[CaptureDecided, MemoryLinked, MemoryAccessed, MemoryForgotten, MemoryUnlinked]

# Records on the one-partition ``memory`` topic carry a ``somnus-kind`` header saying what they hold.
KIND_UNITS = b"units"  # a JSON array of MemoryUnit (from the worker)
KIND_ACCESS = b"access"  # a JSON array of MemoryAccessed (from recall)
