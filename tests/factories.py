"""Builders of what tests feed Somnus: trace events as a runtime sends them, and Kafka records as the
projector sees them. One place, so a change of the envelope is made once."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import orjson

T0 = datetime(2026, 3, 1, 9, 0, tzinfo=timezone.utc)

# The payload each event type gets unless a test says otherwise (the fields its schema requires).
DEFAULT_PAYLOADS: dict[str, dict[str, Any]] = {
    "session_start": {"task": "t"},
    "session_end": {"outcome": "success"},
    "agent_message": {"text": "hi"},
}


def trace_event(session: str, seq: int, type_: str, at: datetime = T0, payload: dict[str, Any] | None = None, *,
                agent: str = "support", tag: str = "", **fields: Any) -> dict[str, Any]:
    """One trace event as JSON (``trace_event.v1.schema.json``): its payload is the type's default,
    updated with ``payload`` and ``fields``. The event id is a function of (session, seq, type, tag),
    so a redelivered event has the same id and a ``tag`` makes another event of the same seq.

    >>> e = trace_event("s1", 0, "session_start", task="book")
    >>> e["type"], e["payload"], e["ts"]
    ('session_start', {'task': 'book'}, '2026-03-01T09:00:00+00:00')
    """
    name = f"{session}/{seq}/{type_}" + (f"/{tag}" if tag else "")
    return {"event_id": str(uuid.uuid5(uuid.NAMESPACE_URL, name)), "schema_version": 1, "ts": at.isoformat(),
            "agent": agent, "session_id": session, "seq": seq, "type": type_,
            "payload": {**DEFAULT_PAYLOADS.get(type_, {}), **(payload or {}), **fields}}


def session_bundle(session: str, at: datetime = T0, agent: str = "support") -> bytes:
    """A whole short session (start, one agent message, end) as one bundle record's value."""
    return orjson.dumps([trace_event(session, 0, "session_start", at, agent=agent),
                         trace_event(session, 1, "agent_message", at, agent=agent),
                         trace_event(session, 2, "session_end", at, agent=agent)])


@dataclass
class Rec:
    """A Kafka record as the projector sees one, built in tests without a broker."""

    topic: str
    partition: int
    offset: int
    value: bytes | None
    key: bytes | None = None
    headers: list | None = None
    timestamp: int | None = None  # ms since the epoch, as Kafka stamps a record
