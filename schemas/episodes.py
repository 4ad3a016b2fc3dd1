"""Episodes: what the distiller makes of one finished session (topic ``episodes``).

Contract: ``episode.v1.schema.json`` beside this file.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from enum import Enum
from typing import Any

import msgspec

from somnus.schemas.events import Outcome

# Episode ids are derived from the session id, so a re-emitted episode has the same id.
EPISODE_NAMESPACE = uuid.UUID("0b5e7a52-3c0e-4f9b-9d0a-5f1e2c3d4b6a")


def episode_id_for(agent: str, session_id: str) -> uuid.UUID:
    """>>> str(episode_id_for("a", "s1")) == str(episode_id_for("a", "s1"))
    True
    """
    return uuid.uuid5(EPISODE_NAMESPACE, f"{agent}\x1f{session_id}")


class LessonKind(str, Enum):
    FAILURE = "failure"  # an error never resolved in the session
    RECOVERY = "recovery"  # an error resolved by a retry (e.g. backoff after a 429)
    SUCCESS = "success"  # a terminal success worth repeating


class Lesson(msgspec.Struct, frozen=True, omit_defaults=True):
    kind: LessonKind
    text: str
    tool: str | None = None
    error: str | None = None


class ErrorSeen(msgspec.Struct, frozen=True, omit_defaults=True):
    tool: str
    error: str
    http_status: int | None = None
    resolved: bool = False


class CallSeen(msgspec.Struct, frozen=True, omit_defaults=True):
    """One tool call as the session saw it, in call order: what knowledge extraction reads.

    ``hosts`` are the hosts of URL arguments; ``rate_headers`` keeps only ``Retry-After`` and
    ``X-RateLimit-*`` response headers (names lower-cased); ``at`` and ``signature`` are what the
    NAc and the SCN learn from (when and what kind of call)."""

    tool: str
    ok: bool | None = None  # None: no result arrived before the session ended
    error: str | None = None
    http_status: int | None = None
    hosts: list[str] = []
    rate_headers: dict[str, str] = {}
    # Added within v1 (optional, so older episodes still decode):
    at: datetime | None = None  # the call's event time (of its result, for a result without a call)
    signature: str | None = None  # somnus.schemas.causal.event_signature(tool, args); None: the args are unknown


class Delegation(msgspec.Struct, frozen=True, omit_defaults=True):
    to_agent: str
    task: str
    outcome: Outcome | None = None


class EpisodeDistilled(msgspec.Struct, frozen=True, kw_only=True):
    episode_id: uuid.UUID
    schema_version: int
    agent: str
    session_id: str
    task: str
    goal: str | None
    user_id: str | None
    summary: str
    outcome: Outcome
    started_at: datetime
    ended_at: datetime
    duration_s: float
    event_count: int
    tool_calls: int
    tools: list[str]
    errors: list[ErrorSeen]
    lessons: list[Lesson]
    delegations: list[Delegation]
    first_event_id: uuid.UUID
    last_event_id: uuid.UUID
    # Added within v1 (optional, so older episodes still decode):
    calls: list[CallSeen] = []  # every tool call in order, up to MAX_CALLS
    calls_dropped: int = 0  # calls past MAX_CALLS, counted but not listed
    metadata: dict[str, Any] = {}  # the session_start metadata (project, client, ...)
