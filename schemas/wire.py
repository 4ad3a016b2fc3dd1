"""The wire contract: every topic Somnus writes, and the record types it carries by header kind.

A record's ``somnus-kind`` header (absent on most records) says which type its value is; the topics
are named by their ``Settings`` field (``traces_topic``...). ``tests/schemas/test_schema_contract.py``
checks that every topic of ``somnus.streams.topics.topic_specs`` and every ``KIND_*`` constant of the
schemas is here, and that each type round-trips through ``somnus.schemas.codec``.

Sealed records (``somnus.schemas.sealed``, crypto-shredding for ``somnus forget``): a record of one
session's text may travel sealed under that session's data key - its value the ``MAGIC``, nonce and
AES-GCM ciphertext of the value listed here, and a ``somnus-sealed`` header naming the key id. Opened,
it is the record listed here (``SEALED_TOPICS``). The keys are ``DataKey`` records of the key topic.

>>> [r.type_name for r in TOPICS["facts_topic"]]
['FactsExtracted', 'ForgetRequested', 'FactPromoted', 'BriefingServed']
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from somnus.schemas.briefing import KIND_PROMOTION, KIND_SERVED, BriefingServed, FactPromoted
from somnus.schemas.causal import CausalLinkUpdated, OutcomeObserved
from somnus.schemas.episodes import EpisodeDistilled
from somnus.schemas.events import TraceEvent
from somnus.schemas.facts import FactsExtracted
from somnus.schemas.forget import KIND_FORGET, ForgetRequested
from somnus.schemas.goals import KIND_GOAL_CLOSED, KIND_GOAL_SET, GoalClosed, GoalSet
from somnus.schemas.lifecycle import KIND_SLEEP, SleepRequested
from somnus.schemas.memory import KIND_ACCESS, KIND_UNITS, MemoryAccessed, MemoryUnit
from somnus.schemas.sealed import DataKey
from somnus.schemas.semantic import KIND_INGEST, KIND_PROMOTE, KnowledgeIngested, PromotionRequested
from somnus.schemas.working_memory import WorkingMemoryState

HEADER = "somnus-kind"


@dataclass(frozen=True)
class WireRecord:
    """One kind of record of a topic: its header kind (None: no header), its value's type (``bundle``:
    a JSON array of them), and who writes it."""

    kind: bytes | None
    type: Any
    writer: str
    bundle: bool = False

    @property
    def type_name(self) -> str:
        return getattr(self.type, "__name__", str(self.type))


TOPICS: dict[str, tuple[WireRecord, ...]] = {
    # agent runtimes (somnus.client): one event, or a bundle of one session's events
    "traces_topic": (WireRecord(None, TraceEvent, "agent runtimes (somnus.client)"),),
    "episodes_topic": (WireRecord(None, EpisodeDistilled, "the worker's distiller"),),
    # the original record's bytes, with somnus-reason and somnus-source-* headers (no type of ours)
    "dead_letter_topic": (),
    "facts_topic": (
        WireRecord(None, FactsExtracted, "the worker's extractor"),
        WireRecord(KIND_FORGET, ForgetRequested, "somnus forget"),
        WireRecord(KIND_PROMOTION, FactPromoted, "somnus promote"),
        WireRecord(KIND_SERVED, BriefingServed, "the projector (briefings served)"),
    ),
    "observations_topic": (WireRecord(None, OutcomeObserved, "the worker's distiller", bundle=True),),
    "link_updates_topic": (WireRecord(None, CausalLinkUpdated, "the worker's causal links", bundle=True),),
    "memory_topic": (
        WireRecord(KIND_UNITS, MemoryUnit, "the worker (episodic capture)", bundle=True),
        WireRecord(KIND_ACCESS, MemoryAccessed, "the projector (recall)", bundle=True),
        WireRecord(KIND_SLEEP, SleepRequested, "somnus sleep"),
        WireRecord(KIND_GOAL_SET, GoalSet, "somnus goal set, agent runtimes (somnus.client)"),
        WireRecord(KIND_GOAL_CLOSED, GoalClosed, "somnus goal done, agent runtimes (somnus.client)"),
    ),
    "semantic_topic": (
        WireRecord(KIND_INGEST, KnowledgeIngested, "somnus ingest"),
        WireRecord(KIND_PROMOTE, PromotionRequested, "somnus consolidate, the projector after a sleep run"),
    ),
    # the working-memory table's changelog (key: the session; a tombstone when it closes)
    "working_memory_topic": (WireRecord(None, WorkingMemoryState, "the worker's working memory"),),
    # the sessions' data keys, compacted (key: the key id; a tombstone from `somnus forget` deletes one)
    "keys_topic": (WireRecord(None, DataKey, "publishers (somnus.client), before their first sealed record"),),
}

# The topics whose records may be sealed with a session's data key (somnus.streams.sealing): their
# plaintext is the record listed in TOPICS; the others always travel as they are.
SEALED_TOPICS = frozenset(
    {
        "traces_topic",
        "episodes_topic",
        "dead_letter_topic",
        "facts_topic",
        "observations_topic",
        "link_updates_topic",
        "memory_topic",
        "working_memory_topic",
    }
)


def record_type(topic: str, kind: bytes | None) -> WireRecord | None:
    """The record of ``topic`` (a ``Settings`` field name) with header ``kind``, or None.

    >>> record_type("memory_topic", b"sleep").type_name
    'SleepRequested'
    """
    return next((r for r in TOPICS.get(topic, ()) if r.kind == kind), None)
