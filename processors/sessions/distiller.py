"""The episode distiller: a fold of trace events into per-session state; a finished session becomes an Episode.

Pure: no I/O, no clock. Replaying the same events gives byte-identical episodes. Events are applied
in arrival order (the worker puts each record's own events in ``seq`` order first: a record is never
split between batches). Redelivered events (``seq`` already applied) are ignored, so at-least-once
delivery gives exactly-once results. An event whose ``seq`` was skipped earlier (it arrived after a
higher one) is *out of order*: not applied, and returned in ``late_events`` for the dead-letter topic,
so that where batches happen to end never decides whether it is applied (``seq_verdict``).

Lessons come from what the trace states, no LLM:
- an error followed by a successful retry of the same tool is a *recovery* lesson; for a
  429 / rate limit resolved after a pause: "rate limit encountered; exponential backoff resolved it";
- an error never resolved by the end of the session is a *failure* lesson naming tool and error;
- a failed delegation, or a session that ends in failure with no tool error, is a *failure* lesson
  from the terminal state; a successful session yields a *success* lesson with its tool sequence.

>>> from somnus.schemas.events import SCHEMA_VERSION
>>> out = distill({}, [])
>>> out.episodes, out.states
([], {})
"""

from __future__ import annotations

import re
import uuid
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit

import msgspec

from somnus.schemas.causal import event_signature
from somnus.schemas.episodes import (
    CallSeen,
    Delegation,
    EpisodeDistilled,
    ErrorSeen,
    Lesson,
    LessonKind,
    episode_id_for,
)
from somnus.schemas.events import (
    SCHEMA_VERSION,
    AgentMessaged,
    Delegated,
    DelegationReturned,
    Outcome,
    SessionEnded,
    SessionStarted,
    ToolCalled,
    ToolReturned,
    TraceEvent,
    UserMessaged,
    type_name,
)

MAX_ERRORS = 50
MAX_LESSONS = 20
MAX_TOOLS = 64
MAX_TEXT = 300
MAX_CALLS = 1000
MAX_HOSTS = 8
MAX_SKIPPED = 16  # ranges of skipped seqs a session remembers (the oldest go first)
RECENT_IDS = 32  # event ids an open session remembers (the newest): a repeated id is applied once

APPLY, DUPLICATE, OUT_OF_ORDER = 0, 1, 2


def seq_verdict(last_seq: int, skipped: Iterable[tuple[int, int]], seq: int) -> int:
    """What an event with ``seq`` is to a session that applied up to ``last_seq`` and skipped the
    ``(lo, hi)`` ranges of seqs on the way: ``APPLY`` (beyond ``last_seq``), ``OUT_OF_ORDER`` (a seq
    skipped earlier: it arrived after a higher one), else ``DUPLICATE`` (applied already; also a seq
    in a range dropped past ``MAX_SKIPPED``).

    >>> seq_verdict(5, [(2, 3)], 6), seq_verdict(5, [(2, 3)], 3), seq_verdict(5, [(2, 3)], 4)
    (0, 2, 1)
    """
    if seq > last_seq:
        return APPLY
    return OUT_OF_ORDER if any(lo <= seq <= hi for lo, hi in skipped) else DUPLICATE


def id_key(ev: TraceEvent) -> int:
    """What a session remembers of an event's id: its two halves folded into 64 bits (compact in the state's
    JSON; both halves, as UUIDv7 ids of one millisecond share most of their first half)."""
    n = ev.event_id.int
    return (n >> 64) ^ (n & 0xFFFF_FFFF_FFFF_FFFF)


def event_verdict(last_seq: int, skipped: Iterable[tuple[int, int]], recent_ids: Iterable[int], ev: TraceEvent) -> int:
    """``seq_verdict``, after the id: an event whose id is one of the session's ``RECENT_IDS`` newest is a
    ``DUPLICATE`` whatever its seq (a runtime that sent one event twice under two seqs); it is applied
    once and counted. (The projector, which sees every event, projects each id once, and dead-letters an
    id that another session holds.)"""
    if recent_ids and id_key(ev) in recent_ids:
        return DUPLICATE
    return seq_verdict(last_seq, skipped, ev.seq)


def remember_id(recent_ids: list[int], ev: TraceEvent) -> list[int]:
    return [*recent_ids, id_key(ev)][-RECENT_IDS:]


def skip_to(last_seq: int, skipped: list[tuple[int, int]], seq: int) -> list[tuple[int, int]]:
    """``skipped`` after applying ``seq`` (> ``last_seq``): with ``(last_seq + 1, seq - 1)`` when that
    is not empty, at most ``MAX_SKIPPED`` ranges (the newest)."""
    if seq <= last_seq + 1:
        return skipped
    return [*skipped, (last_seq + 1, seq - 1)][-MAX_SKIPPED:]


def out_of_order_reason(ev: TraceEvent, last_seq: int) -> str:
    """The dead-letter reason of an event whose seq was skipped: it came after a higher one."""
    return (
        f"order: session {ev.session_id!r} of agent {ev.agent!r} had applied seq {last_seq} when this "
        f"{type_name(ev)} event with seq {ev.seq}, skipped earlier, arrived; a session's events "
        "must be published in seq order"
    )


def ended_reason(ev: TraceEvent, last_seq: int) -> str:
    """The dead-letter reason of an event that came after its session's end."""
    return (
        f"late: session {ev.session_id!r} of agent {ev.agent!r} had ended (seq {last_seq}); "
        f"this {type_name(ev)} event has seq {ev.seq}"
    )


class PendingCall(msgspec.Struct):
    tool: str
    ts: datetime
    index: int = -1  # position in SessionState.calls, -1 when past MAX_CALLS


class OpenError(msgspec.Struct):
    error: str
    http_status: int | None
    first_ts: datetime
    last_ts: datetime
    attempts: int
    index: int  # position in SessionState.errors


class SessionState(msgspec.Struct, kw_only=True, omit_defaults=True):
    """Everything the distiller keeps about one open (or just closed) session."""

    agent: str
    session_id: str
    last_seq: int = -1
    skipped: list[tuple[int, int]] = []  # ranges of seqs passed over (seq_verdict)
    recent_ids: list[int] = []  # id_key of the newest applied events of an open session (event_verdict)
    closed: bool = False
    outcome: Outcome | None = None
    event_count: int = 0
    started_at: datetime | None = None
    ended_at: datetime | None = None
    first_event_id: uuid.UUID | None = None
    last_event_id: uuid.UUID | None = None
    task: str = ""
    goal: str | None = None
    user_id: str | None = None
    first_user_text: str | None = None
    messages: int = 0
    tool_calls: int = 0
    tools: list[str] = []
    pending: dict[str, PendingCall] = {}
    open_errors: dict[str, OpenError] = {}
    errors: list[ErrorSeen] = []
    lessons: list[Lesson] = []
    delegations: list[Delegation] = []
    calls: list[CallSeen] = []
    calls_dropped: int = 0
    metadata: dict[str, Any] = {}
    # Set by the worker on a closed session's marker (somnus.processors.sessions.session_retention): the stream time of its
    # source partition right after the session ended (µs), and that partition.
    closed_clock: int | None = None
    partition: int | None = None


_state_encoder = msgspec.json.Encoder()
_state_decoder = msgspec.json.Decoder(SessionState)


def encode_state(state: SessionState) -> bytes:
    return _state_encoder.encode(state)


def decode_state(raw: bytes) -> SessionState:
    return _state_decoder.decode(raw)


def session_key(agent: str, session_id: str) -> str:
    """Table key of a session: agent and session id (two agents may share a session id)."""
    return f"{agent}\x1f{session_id}"


@dataclass
class DistillOutput:
    states: dict[str, SessionState] = field(default_factory=dict)  # new state of every touched session
    episodes: list[EpisodeDistilled] = field(default_factory=list)  # in the order their sessions ended
    ended_at: list[int] = field(default_factory=list)  # the place in the events of each episode's end
    duplicates: int = 0  # redelivered events (seq already applied)
    late: int = 0  # events for a session that had already ended, or out of order
    late_events: list[tuple[TraceEvent, str]] = field(default_factory=list)  # those, with the dead-letter reason


def distill(prior: Mapping[str, SessionState], events: Iterable[TraceEvent]) -> DistillOutput:
    """Apply a batch of events to the prior states of their sessions.

    ``prior`` is not modified; the states of touched sessions are returned in ``out.states``.
    Each session's events are applied in the order given (arrival order), and the episodes come in
    the order of the events that ended them (not of each session's first event in the batch, which
    depends on where the batch began): the result of a run of events, episodes' order included, is
    the same however it is cut into batches.
    """
    out = DistillOutput()
    by_session: dict[str, list[tuple[int, TraceEvent]]] = {}
    for i, ev in enumerate(events):
        by_session.setdefault(session_key(ev.agent, ev.session_id), []).append((i, ev))
    ended: list[tuple[int, EpisodeDistilled]] = []
    for key, evs in by_session.items():
        base = prior.get(key)
        first = evs[0][1]
        state = (
            decode_state(encode_state(base))
            if base is not None
            else SessionState(agent=first.agent, session_id=first.session_id)
        )
        for i, ev in evs:
            verdict = event_verdict(state.last_seq, state.skipped, state.recent_ids, ev)
            if verdict == DUPLICATE:
                out.duplicates += 1
                continue
            if verdict == OUT_OF_ORDER:
                out.late += 1
                out.late_events.append((ev, out_of_order_reason(ev, state.last_seq)))
                continue
            if state.closed:
                out.late += 1
                out.late_events.append((ev, ended_reason(ev, state.last_seq)))
                continue
            _apply(state, ev)
            if state.closed:
                ended.append((i, _episode(state)))
        out.states[key] = _compact(state) if state.closed else state
    ended.sort(key=lambda e: e[0])
    out.ended_at, out.episodes = [i for i, _ in ended], [ep for _, ep in ended]
    return out


def abandon(prior: SessionState, reason: str) -> tuple[SessionState, EpisodeDistilled]:
    """Close an open session that no event will end (``somnus.processors.sessions.session_retention``: idle for too long)
    as a failure with ``reason``, which its first new lesson states (whatever other failure lessons it
    has): its closed marker and its episode. ``prior`` is not modified; the episode ends at the
    session's last event, as it stands."""
    state = decode_state(encode_state(prior))
    last = f" (last tool: {state.tools[-1]})" if state.tools else ""
    _add_lesson(state, Lesson(kind=LessonKind.FAILURE, text=f"session {reason}; {state.tool_calls} tool calls{last}"))
    _close(state, Outcome.FAILURE, reason)
    return _compact(state), _episode(state)


def _apply(s: SessionState, ev: TraceEvent) -> None:
    s.skipped = skip_to(s.last_seq, s.skipped, ev.seq)
    s.recent_ids = remember_id(s.recent_ids, ev)
    s.last_seq = ev.seq
    s.event_count += 1
    if s.started_at is None or ev.ts < s.started_at:
        s.started_at = ev.ts
    if s.ended_at is None or ev.ts > s.ended_at:
        s.ended_at = ev.ts
    if s.first_event_id is None:
        s.first_event_id = ev.event_id
    s.last_event_id = ev.event_id
    # Each payload is read after the isinstance check on the event class, so mypy narrows it.
    if isinstance(ev, SessionStarted):
        start = ev.payload
        s.task, s.goal, s.user_id = start.task, start.goal, start.user_id
        s.metadata = dict(start.metadata)
    elif isinstance(ev, UserMessaged):
        s.messages += 1
        if s.first_user_text is None:
            s.first_user_text = ev.payload.text[:MAX_TEXT]
    elif isinstance(ev, AgentMessaged):
        s.messages += 1
    elif isinstance(ev, ToolCalled):
        called = ev.payload
        s.tool_calls += 1
        s.pending[called.call_id] = PendingCall(
            tool=called.tool,
            ts=ev.ts,
            index=_add_call(
                s,
                CallSeen(
                    tool=called.tool,
                    hosts=url_hosts(called.args),
                    at=ev.ts,
                    signature=event_signature(called.tool, called.args),
                ),
            ),
        )
        if called.tool not in s.tools and len(s.tools) < MAX_TOOLS:
            s.tools.append(called.tool)
    elif isinstance(ev, ToolReturned):
        result = ev.payload
        call = s.pending.pop(result.call_id, None)
        tool = result.tool or (call.tool if call else "unknown_tool")
        seen = CallSeen(
            tool=tool,
            ok=result.ok,
            error=None if result.ok else error_text(result.error, result.http_status),
            http_status=result.http_status,
            rate_headers=rate_headers(result.headers),
            at=ev.ts,
        )
        if call is not None and call.index >= 0:
            made = s.calls[call.index]  # what the call itself told: hosts, time, signature
            s.calls[call.index] = msgspec.structs.replace(seen, hosts=made.hosts, at=made.at, signature=made.signature)
        elif call is None:
            _add_call(s, seen)  # a result whose call we never saw
        if result.ok:
            _resolve(s, tool, ev.ts)
        else:
            _record_error(s, tool, error_text(result.error, result.http_status), result.http_status, ev.ts)
    elif isinstance(ev, Delegated):
        sent = ev.payload
        s.delegations.append(Delegation(to_agent=sent.to_agent, task=sent.task[:MAX_TEXT]))
    elif isinstance(ev, DelegationReturned):
        back = ev.payload
        for i in range(len(s.delegations) - 1, -1, -1):
            d = s.delegations[i]
            if d.to_agent == back.to_agent and d.outcome is None:
                s.delegations[i] = Delegation(to_agent=d.to_agent, task=d.task, outcome=back.outcome)
                break
        else:
            s.delegations.append(Delegation(to_agent=back.to_agent, task="", outcome=back.outcome))
        if back.outcome is Outcome.FAILURE:
            _add_lesson(
                s,
                Lesson(
                    kind=LessonKind.FAILURE,
                    text=f"delegation to {back.to_agent} failed"
                    + (f": {back.summary[:MAX_TEXT]}" if back.summary else ""),
                    tool=None,
                ),
            )
    elif isinstance(ev, SessionEnded):
        end = ev.payload
        _close(s, end.outcome, end.reason)


def _add_call(s: SessionState, call: CallSeen) -> int:
    if len(s.calls) >= MAX_CALLS:
        s.calls_dropped += 1
        return -1
    s.calls.append(call)
    return len(s.calls) - 1


_URL = re.compile(r"https?://[^\s'\"<>]+", re.I)


def url_hosts(args: Any) -> list[str]:
    """Hosts of the URLs found anywhere in a tool call's arguments, in order of appearance.

    >>> url_hosts({"url": "https://API.instantly.ai/v1/leads?x=1", "n": 3, "more": ["see http://a.io/b"]})
    ['api.instantly.ai', 'a.io']
    """
    hosts: list[str] = []
    stack = deque([args])  # a queue (order of appearance): list.pop(0) made 500k arguments quadratic
    while stack and len(hosts) < MAX_HOSTS:
        v = stack.popleft()
        if isinstance(v, str):
            for m in _URL.finditer(v):
                try:
                    host = urlsplit(m.group(0)).hostname
                except ValueError:
                    continue
                if host and host not in hosts:
                    hosts.append(host)
        elif isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    return hosts[:MAX_HOSTS]


def rate_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The rate-limit headers of a response, names lower-cased.

    >>> rate_headers({"Retry-After": "2", "X-RateLimit-Limit": "10", "Content-Type": "json"})
    {'retry-after': '2', 'x-ratelimit-limit': '10'}
    """
    out = {}
    for k, v in headers.items():
        lk = k.lower()
        if lk == "retry-after" or lk.startswith("x-ratelimit") or lk.startswith("ratelimit"):
            out[lk] = str(v)[:MAX_TEXT]
    return out


def error_text(error: str | None, http_status: int | None) -> str:
    """A short, stable description of an error: 'HTTP 429: Too Many Requests'."""
    text = " ".join((error or "").split())[:MAX_TEXT]
    if http_status is not None and f"{http_status}" not in text[:12]:
        return f"HTTP {http_status}: {text}" if text else f"HTTP {http_status}"
    return text or "error (no message)"


_RATE_LIMIT = re.compile(r"\b429\b|rate.?limit|too many requests|throttl", re.I)


def is_rate_limit(error: str, http_status: int | None) -> bool:
    return http_status == 429 or bool(_RATE_LIMIT.search(error))


def _record_error(s: SessionState, tool: str, error: str, status: int | None, ts: datetime) -> None:
    open_ = s.open_errors.get(tool)
    if open_ is not None:
        open_.attempts += 1
        open_.last_ts = ts
        return
    if len(s.errors) >= MAX_ERRORS:
        return
    s.errors.append(ErrorSeen(tool=tool, error=error, http_status=status))
    s.open_errors[tool] = OpenError(
        error=error, http_status=status, first_ts=ts, last_ts=ts, attempts=1, index=len(s.errors) - 1
    )


def _resolve(s: SessionState, tool: str, ts: datetime) -> None:
    open_ = s.open_errors.pop(tool, None)
    if open_ is None:
        return
    e = s.errors[open_.index]
    s.errors[open_.index] = ErrorSeen(tool=e.tool, error=e.error, http_status=e.http_status, resolved=True)
    waited = (ts - open_.first_ts).total_seconds()
    retries = open_.attempts
    if is_rate_limit(open_.error, open_.http_status) and waited > 0:
        text = (
            f"{tool}: rate limit encountered; exponential backoff resolved it "
            f"({retries} failed attempt{'s' if retries != 1 else ''}, {waited:.0f}s)"
        )
    else:
        text = (
            f"{tool}: '{open_.error}' was resolved by retrying ({retries} failed attempt{'s' if retries != 1 else ''})"
        )
    _add_lesson(s, Lesson(kind=LessonKind.RECOVERY, text=text, tool=tool, error=open_.error))


def _close(s: SessionState, outcome: Outcome, reason: str | None) -> None:
    s.closed = True
    for tool, open_ in s.open_errors.items():
        _add_lesson(
            s,
            Lesson(
                kind=LessonKind.FAILURE,
                tool=tool,
                error=open_.error,
                text=f"{tool} failed with '{open_.error}' and it was never resolved "
                f"({open_.attempts} attempt{'s' if open_.attempts != 1 else ''})",
            ),
        )
    s.open_errors = {}
    if outcome is Outcome.FAILURE and not any(l.kind is LessonKind.FAILURE for l in s.lessons):
        last = f" (last tool: {s.tools[-1]})" if s.tools else ""
        why = f": {reason[:MAX_TEXT]}" if reason else ""
        _add_lesson(
            s,
            Lesson(
                kind=LessonKind.FAILURE, text=f"session ended in failure after {s.tool_calls} tool calls{last}{why}"
            ),
        )
    elif outcome is Outcome.SUCCESS and s.tools:
        _add_lesson(s, Lesson(kind=LessonKind.SUCCESS, text="succeeded using " + " -> ".join(s.tools[:8])))
    s.outcome = outcome


def _add_lesson(s: SessionState, lesson: Lesson) -> None:
    if len(s.lessons) < MAX_LESSONS and lesson not in s.lessons:
        s.lessons.append(lesson)


def _episode(s: SessionState) -> EpisodeDistilled:
    outcome = s.outcome
    assert outcome is not None and s.started_at is not None and s.ended_at is not None
    assert s.first_event_id is not None and s.last_event_id is not None
    task = s.task or s.first_user_text or ""
    duration = (s.ended_at - s.started_at).total_seconds()
    n_err = len(s.errors)
    unresolved = sum(not e.resolved for e in s.errors)
    summary = (
        f"{outcome.value}: {task[:120]}{'...' if len(task) > 120 else ''} | "
        f"{s.tool_calls} tool calls ({len(s.tools)} tools), {n_err} errors ({unresolved} unresolved), "
        f"{s.messages} messages, {len(s.delegations)} delegations, {duration:.0f}s"
    )
    return EpisodeDistilled(
        episode_id=episode_id_for(s.agent, s.session_id),
        schema_version=SCHEMA_VERSION,
        agent=s.agent,
        session_id=s.session_id,
        task=task,
        goal=s.goal,
        user_id=s.user_id,
        summary=summary,
        outcome=outcome,
        started_at=s.started_at,
        ended_at=s.ended_at,
        duration_s=duration,
        event_count=s.event_count,
        tool_calls=s.tool_calls,
        tools=list(s.tools),
        errors=list(s.errors),
        lessons=list(s.lessons),
        delegations=list(s.delegations),
        first_event_id=s.first_event_id,
        last_event_id=s.last_event_id,
        calls=list(s.calls),
        calls_dropped=s.calls_dropped,
        metadata=dict(s.metadata),
    )


def _compact(s: SessionState) -> SessionState:
    """A closed session keeps only what identifies it, so late or redelivered events are ignored."""
    return SessionState(
        agent=s.agent,
        session_id=s.session_id,
        last_seq=s.last_seq,
        skipped=s.skipped,
        closed=True,
        outcome=s.outcome,
        event_count=s.event_count,
        ended_at=s.ended_at,
        last_event_id=s.last_event_id,
        closed_clock=s.closed_clock,
        partition=s.partition,
    )
