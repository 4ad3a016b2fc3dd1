"""Trace events, schema v1: what agent runtimes publish to the ``traces`` topic.

The contract for runtimes in any language is ``trace_event.v1.schema.json`` beside this file;
these frozen types match it (tests/schemas/test_schema_contract.py proves it both ways).

The wire envelope (``event_id``, ``schema_version``, ``ts``, ``agent``, ``session_id``, ``seq``,
``type``) is the same for every event; ``type`` selects the payload type.

>>> import msgspec
>>> raw = (b'{"event_id":"6f1c1a6e-7d0c-4a43-9a55-0c7f2d1f4b1e","schema_version":1,'
...        b'"ts":"2024-05-15T15:00:00Z","agent":"support","session_id":"s1","seq":0,'
...        b'"type":"session_start","payload":{"task":"book a flight"}}')
>>> ev = msgspec.json.decode(raw, type=TraceEvent)
>>> type(ev).__name__, ev.payload.task
('SessionStarted', 'book a flight')
"""

from __future__ import annotations

import uuid
from datetime import datetime
from enum import Enum
from typing import Annotated, Any, Union, cast

import msgspec
from msgspec import Meta

SCHEMA_VERSION = 1

NonEmpty = Annotated[str, Meta(min_length=1)]
# An agent, session, tool, call or delegation name: the worker copies names into every output that
# mentions them (an episode lists each tool, each observation its agent), so one longer than this, in
# events within the size limit, could make a record no producer sends (a stalled worker, once)
MAX_NAME_CHARS = 1024
Name = Annotated[str, Meta(min_length=1, max_length=MAX_NAME_CHARS)]
OptionalName = Annotated[str, Meta(max_length=MAX_NAME_CHARS)] | None
Seq = Annotated[int, Meta(ge=0, le=2**63 - 1)]  # a BIGINT in the projections
AwareTime = Annotated[datetime, Meta(tz=True)]


class Outcome(str, Enum):
    SUCCESS = "success"
    FAILURE = "failure"
    PARTIAL = "partial"


# ---- payloads ---------------------------------------------------------------------------


class SessionStart(msgspec.Struct, frozen=True, omit_defaults=True):
    task: str
    goal: str | None = None
    user_id: OptionalName = None
    metadata: dict[str, Any] = {}


class Message(msgspec.Struct, frozen=True, omit_defaults=True):
    text: str


class ToolCall(msgspec.Struct, frozen=True, omit_defaults=True):
    tool: Name
    call_id: Name
    args: dict[str, Any] = {}


class ToolResult(msgspec.Struct, frozen=True, omit_defaults=True):
    call_id: Name
    ok: bool
    tool: OptionalName = None
    error: str | None = None
    http_status: Annotated[int, Meta(ge=100, le=599)] | None = None
    latency_ms: Annotated[float, Meta(ge=0)] | None = None
    output: str | None = None
    headers: dict[str, str] = {}


class Delegation(msgspec.Struct, frozen=True, omit_defaults=True):
    to_agent: Name
    task: str
    delegation_id: OptionalName = None


class DelegationResult(msgspec.Struct, frozen=True, omit_defaults=True):
    to_agent: Name
    outcome: Outcome
    delegation_id: OptionalName = None
    summary: str | None = None


class SessionEnd(msgspec.Struct, frozen=True, omit_defaults=True):
    outcome: Outcome
    reason: str | None = None


# ---- envelopes (one type per event kind, named in the past tense) -----------------------


class _Envelope(msgspec.Struct, frozen=True, tag_field="type", kw_only=True):
    event_id: uuid.UUID
    schema_version: Annotated[int, Meta(ge=1, le=SCHEMA_VERSION)]
    ts: AwareTime
    agent: Name
    session_id: Name
    seq: Seq


class SessionStarted(_Envelope, frozen=True, tag="session_start"):
    payload: SessionStart


class UserMessaged(_Envelope, frozen=True, tag="user_message"):
    payload: Message


class AgentMessaged(_Envelope, frozen=True, tag="agent_message"):
    payload: Message


class ToolCalled(_Envelope, frozen=True, tag="tool_call"):
    payload: ToolCall


class ToolReturned(_Envelope, frozen=True, tag="tool_result"):
    payload: ToolResult


class Delegated(_Envelope, frozen=True, tag="delegation"):
    payload: Delegation


class DelegationReturned(_Envelope, frozen=True, tag="delegation_result"):
    payload: DelegationResult


class SessionEnded(_Envelope, frozen=True, tag="session_end"):
    payload: SessionEnd


TraceEvent = Union[
    SessionStarted,
    UserMessaged,
    AgentMessaged,
    ToolCalled,
    ToolReturned,
    Delegated,
    DelegationReturned,
    SessionEnded,
]

EVENT_TYPES: dict[str, type] = {
    cast(str, cls.__struct_config__.tag): cls
    for cls in (
        SessionStarted,
        UserMessaged,
        AgentMessaged,
        ToolCalled,
        ToolReturned,
        Delegated,
        DelegationReturned,
        SessionEnded,
    )
}


def type_name(event: TraceEvent) -> str:
    """The wire ``type`` of an event, e.g. ``"tool_call"``."""
    return cast(str, type(event).__struct_config__.tag)  # every event's tag is its wire type
