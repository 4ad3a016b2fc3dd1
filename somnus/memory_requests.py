"""What a person asks of the memory by hand: promote a fact, forget a subject, ingest knowledge,
consolidate, sleep, set or close a goal. Each is an event published to the topic whose fold applies it (the projector's),
never a write to the projections: a replay applies it again in the same place of the stream.

The CLI (``somnus promote`` etc.) resolves the event time and calls these; so can a runtime.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from somnus.config import Settings

KIND = "somnus-kind"  # the header that names a record's kind on the facts, memory and semantic topics


def _send(bootstrap: str, topic: str, records: list[tuple[bytes | None, bytes, Any]]) -> None:
    from somnus.client import publish_records

    publish_records([(key, value, [(KIND, kind)]) for key, value, kind in records], bootstrap, topic, partition=0)


def promote(s: Settings, bootstrap: str, moves: list[Any]) -> None:
    """Publish manual promotions (``processors.knowledge.swarm_metrics.manual_promotions``) to the facts topic."""
    from somnus.schemas.briefing import KIND_PROMOTION
    from somnus.schemas.codec import encode

    _send(bootstrap, s.facts_topic, [(m.source.encode(), encode(m), KIND_PROMOTION) for m in moves])


def forget(s: Settings, bootstrap: str, kind: str, value: str, reason: str | None, at: datetime) -> Any:
    """Publish a request to forget a user, an agent or a session (``projections/forget.py`` applies it)."""
    from somnus.schemas.codec import encode
    from somnus.schemas.forget import KIND_FORGET, ForgetRequested, ForgetSubject

    req = ForgetRequested(request_id=str(uuid.uuid4()), subject=ForgetSubject(kind), value=value, reason=reason, at=at)
    _send(bootstrap, s.facts_topic, [(b"forget", encode(req), KIND_FORGET)])
    return req


def ingest_knowledge(s: Settings, bootstrap: str, owner: str, source: str, concepts: list[Any], at: datetime) -> Any:
    """Publish concepts of a document for ``owner``'s semantic memory (DIRECT_INGESTION)."""
    from somnus.schemas.codec import encode
    from somnus.schemas.semantic import KIND_INGEST, KnowledgeIngested

    req = KnowledgeIngested(owner=owner, source=source, at=at, concepts=concepts)
    _send(bootstrap, s.semantic_topic, [(owner.encode(), encode(req), KIND_INGEST)])
    return req


def consolidate(
    s: Settings, bootstrap: str, owner: str, inputs: dict[str, Any], at: datetime, request_id: str | None = None
) -> Any:
    """Publish a promotion request for ``owner`` from a snapshot of its promotion inputs (``request_id``:
    the id the semantic fold runs it under once, e.g. a sleep run's)."""
    import msgspec

    from somnus.schemas.codec import encode
    from somnus.schemas.semantic import KIND_PROMOTE, PromotionRequested

    fields = {**inputs, "at": at.isoformat(), **({"request_id": request_id} if request_id is not None else {})}
    req = msgspec.convert(fields, PromotionRequested, strict=False)
    _send(bootstrap, s.semantic_topic, [(owner.encode(), encode(req), KIND_PROMOTE)])
    return req


def sleep(s: Settings, bootstrap: str, at: datetime, requested_by: str) -> None:
    """Publish a deep sleep (memory topic: hippocampus sleep). Once its run is committed, the projector
    publishes the global promotion it leads to, named for the run (as after a scheduled run), with
    the topics the run abstracted; the semantic fold runs it once, then consolidates the ATL and
    Angular Gyrus and adds them to the run's report. (A request published here, before the run,
    carried a snapshot without the run's topics, and they were never promoted.)"""
    from somnus.schemas.codec import encode
    from somnus.schemas.lifecycle import KIND_SLEEP, SleepRequested

    _send(bootstrap, s.memory_topic, [(None, encode(SleepRequested(at=at, requested_by=requested_by)), KIND_SLEEP)])


def set_goal(
    s: Settings,
    bootstrap: str,
    agent: str,
    text: str,
    at: datetime,
    user_id: str | None = None,
    set_by: str = "",
    goal_id: str | None = None,
) -> Any:
    """Publish a goal for ``agent`` on the memory topic (``projections/goals.py`` folds it and measures
    its forward prediction error); ``goal_id`` defaults to a new one."""
    from somnus.schemas.codec import encode
    from somnus.schemas.goals import KIND_GOAL_SET, GoalSet

    req = GoalSet(
        goal_id=goal_id or f"g-{uuid.uuid4().hex[:12]}", agent=agent, text=text, at=at, user_id=user_id, set_by=set_by
    )
    # its text may be a person's: sealed under a key of the goal's own, which a forget of the agent or
    # of the user deletes (docs/design/forget.md)
    from somnus.client import publish_sealed

    publish_sealed(
        agent.encode(),
        encode(req),
        [(KIND, KIND_GOAL_SET)],
        bootstrap,
        s.memory_topic,
        s.keys_topic,
        (agent, f"goal:{req.goal_id}"),
        user_id,
        partition=0,
    )
    return req


def close_goal(s: Settings, bootstrap: str, agent: str, goal_id: str, at: datetime, status: str = "done") -> Any:
    """Publish the closing of one of ``agent``'s goals (``done``: achieved, ``dropped``: abandoned)."""
    from somnus.schemas.codec import encode
    from somnus.schemas.goals import KIND_GOAL_CLOSED, GoalClosed, GoalStatus

    req = GoalClosed(goal_id=goal_id, agent=agent, at=at, status=GoalStatus(status))
    _send(bootstrap, s.memory_topic, [(agent.encode(), encode(req), KIND_GOAL_CLOSED)])
    return req
