"""Builders of what tests feed Somnus: trace events as a runtime sends them, and Kafka records as the
projector sees them. One place, so a change of the envelope is made once."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

import orjson

from somnus.schemas.codec import decode_trace
from somnus.schemas.events import (
    AgentMessaged,
    Delegated,
    Delegation,
    DelegationResult,
    DelegationReturned,
    Message,
    Outcome,
    SessionEnd,
    SessionEnded,
    SessionStart,
    SessionStarted,
    ToolCall,
    ToolCalled,
    ToolResult,
    ToolReturned,
    TraceEvent,
    UserMessaged,
)

T0 = datetime(2026, 3, 1, 9, 0, tzinfo=timezone.utc)
TRACE_T0 = datetime(2024, 5, 15, 15, 0, tzinfo=timezone.utc)  # where a ``Trace`` starts unless told

# The payload each event type gets unless a test says otherwise (the fields its schema requires).
DEFAULT_PAYLOADS: dict[str, dict[str, Any]] = {
    "session_start": {"task": "t"},
    "session_end": {"outcome": "success"},
    "agent_message": {"text": "hi"},
}


def trace_event(
    session: str,
    seq: int,
    type_: str,
    at: datetime = T0,
    payload: dict[str, Any] | None = None,
    *,
    agent: str = "support",
    tag: str = "",
    **fields: Any,
) -> dict[str, Any]:
    """One trace event as JSON (``trace_event.v1.schema.json``): its payload is the type's default,
    updated with ``payload`` and ``fields``. The event id is a function of (session, seq, type, tag),
    so a redelivered event has the same id and a ``tag`` makes another event of the same seq.

    >>> e = trace_event("s1", 0, "session_start", task="book")
    >>> e["type"], e["payload"], e["ts"]
    ('session_start', {'task': 'book'}, '2026-03-01T09:00:00+00:00')
    """
    name = f"{session}/{seq}/{type_}" + (f"/{tag}" if tag else "")
    return {
        "event_id": str(uuid.uuid5(uuid.NAMESPACE_URL, name)),
        "schema_version": 1,
        "ts": at.isoformat(),
        "agent": agent,
        "session_id": session,
        "seq": seq,
        "type": type_,
        "payload": {**DEFAULT_PAYLOADS.get(type_, {}), **(payload or {}), **fields},
    }


class SessionLog:
    """One session's trace events as JSON (``trace_event``) with consecutive seqs. Each event is stamped
    with the session's clock, which then moves ``step_s`` seconds (or the ``dt`` that event is given).

    >>> log = SessionLog("s1", T0, step_s=30).add("session_start", {"task": "book"}).add("agent_message")
    >>> [(e["seq"], e["ts"][11:19]) for e in log.events]
    [(0, '09:00:00'), (1, '09:00:30')]
    """

    def __init__(self, session: str, at: datetime = T0, agent: str = "support", step_s: float = 1.0) -> None:
        self.session, self.at, self.agent, self.step_s = session, at, agent, step_s
        self.events: list[dict[str, Any]] = []

    def add(self, type_: str, payload: dict[str, Any] | None = None, dt: float | None = None) -> SessionLog:
        self.events.append(trace_event(self.session, len(self.events), type_, self.at, payload, agent=self.agent))
        self.at += timedelta(seconds=self.step_s if dt is None else dt)
        return self


def decoded_event(
    session: str, seq: int, type_: str, at: datetime = T0, payload: dict[str, Any] | None = None, **fields: Any
) -> TraceEvent:
    """``trace_event`` decoded as the worker decodes a record (``decode_trace``): a typed event."""
    out = decode_trace(orjson.dumps(trace_event(session, seq, type_, at, payload, **fields)), 1 << 20)
    assert isinstance(out, TraceEvent), out
    return out


class Trace:
    """One session's typed trace events with consecutive seqs. ``at`` is seconds since ``t0``; an event
    without one is stamped ``seq`` seconds after ``t0``. ``task`` and ``user_id`` are ``start``'s defaults.

    >>> t = Trace().start().call("lookup", "c1", id=7).fail("c1", error="not found").end(Outcome.FAILURE)
    >>> [type(e).__name__ for e in t.events], t.events[3].ts - t.events[0].ts
    (['SessionStarted', 'ToolCalled', 'ToolReturned', 'SessionEnded'], datetime.timedelta(seconds=3))
    """

    def __init__(
        self,
        agent: str = "support",
        session_id: str = "s1",
        *,
        t0: datetime = TRACE_T0,
        task: str = "refund order 1042",
        user_id: str | None = None,
    ) -> None:
        self.agent, self.session_id, self.t0 = agent, session_id, t0
        self.task, self.user_id = task, user_id
        self.events: list[TraceEvent] = []

    def _add(self, cls: type, payload: Any, at: float | None) -> Trace:
        seq = len(self.events)
        self.events.append(
            cls(
                event_id=uuid.uuid5(uuid.NAMESPACE_URL, f"{self.agent}/{self.session_id}/{seq}"),
                schema_version=1,
                ts=self.t0 + timedelta(seconds=seq if at is None else at),
                agent=self.agent,
                session_id=self.session_id,
                seq=seq,
                payload=payload,
            )
        )
        return self

    def start(self, task: str | None = None, at: float | None = None, **kw: Any) -> Trace:
        kw.setdefault("user_id", self.user_id)
        return self._add(SessionStarted, SessionStart(task=self.task if task is None else task, **kw), at)

    def user(self, text: str, at: float | None = None) -> Trace:
        return self._add(UserMessaged, Message(text=text), at)

    def say(self, text: str, at: float | None = None) -> Trace:
        return self._add(AgentMessaged, Message(text=text), at)

    def call(
        self, tool: str, call_id: str, at: float | None = None, args: dict[str, Any] | None = None, **more_args: Any
    ) -> Trace:
        return self._add(ToolCalled, ToolCall(tool=tool, call_id=call_id, args={**(args or {}), **more_args}), at)

    def result(self, call_id: str, ok: bool, tool: str | None = None, at: float | None = None, **kw: Any) -> Trace:
        return self._add(ToolReturned, ToolResult(call_id=call_id, ok=ok, tool=tool, **kw), at)

    def ok(self, call_id: str, at: float | None = None, tool: str | None = None) -> Trace:
        return self.result(call_id, True, tool, at)

    def fail(
        self,
        call_id: str,
        at: float | None = None,
        error: str | None = None,
        status: int | None = None,
        tool: str | None = None,
    ) -> Trace:
        return self.result(call_id, False, tool, at, error=error, http_status=status)

    def delegate(self, to: str, task: str = "help", at: float | None = None) -> Trace:
        return self._add(Delegated, Delegation(to_agent=to, task=task), at)

    def delegated(self, to: str, outcome: Outcome, at: float | None = None, summary: str | None = None) -> Trace:
        return self._add(DelegationReturned, DelegationResult(to_agent=to, outcome=outcome, summary=summary), at)

    def end(self, outcome: Outcome = Outcome.SUCCESS, at: float | None = None, reason: str | None = None) -> Trace:
        return self._add(SessionEnded, SessionEnd(outcome=outcome, reason=reason), at)


def session_bundle(session: str, at: datetime = T0, agent: str = "support") -> bytes:
    """A whole short session (start, one agent message, end) as one bundle record's value."""
    return orjson.dumps(
        [
            trace_event(session, 0, "session_start", at, agent=agent),
            trace_event(session, 1, "agent_message", at, agent=agent),
            trace_event(session, 2, "session_end", at, agent=agent),
        ]
    )


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


def record_batch(codec: int, values: list[bytes], base: int) -> bytes:
    """One Kafka record batch (format v2) as the broker returns it in a fetch: ``values`` at offsets
    ``base`` onwards, compressed with ``codec`` (aiokafka's numbering: 0 none, 1 gzip, 2 snappy, 3 lz4,
    4 zstd)."""
    from aiokafka.record.default_records import DefaultRecordBatchBuilder

    b = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=codec,
        is_transactional=0,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=1 << 30,
    )
    for i, v in enumerate(values):
        b.append(i, timestamp=1_000 + i, key=None, value=v, headers=[])
    raw = bytearray(b.build())
    raw[:8] = base.to_bytes(8, "big")  # the base offset (outside the CRC)
    return bytes(raw)


def distilled_episode(
    calls: list[Any],
    *,
    agent: str = "airline",
    ended: datetime = T0,
    episode_id: uuid.UUID = uuid.UUID(int=7),
    session_id: str = "s1",
) -> Any:
    """An ``EpisodeDistilled`` of ``calls`` (``CallSeen``), successful, with nothing else in it."""
    from somnus.schemas.episodes import EpisodeDistilled
    from somnus.schemas.events import Outcome

    return EpisodeDistilled(
        episode_id=episode_id,
        schema_version=1,
        agent=agent,
        session_id=session_id,
        task="t",
        goal=None,
        user_id=None,
        summary="",
        outcome=Outcome.SUCCESS,
        started_at=ended,
        ended_at=ended,
        duration_s=0.0,
        event_count=1,
        tool_calls=len(calls),
        tools=[],
        errors=[],
        lessons=[],
        delegations=[],
        first_event_id=uuid.UUID(int=1),
        last_event_id=uuid.UUID(int=2),
        calls=calls,
    )
