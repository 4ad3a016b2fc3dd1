"""Working memory: one session's recent messages, its summaries, and a token budget. Pure: no I/O, no clock.

Per session (table key ``somnus.processors.sessions.distiller.session_key(agent, session_id)``) the state holds:

- a **ring buffer** of the session's recent messages (``buffer_size``, 50 by default), fed by the
  session's ``user_message`` / ``agent_message`` / ``tool_call`` / ``tool_result`` events in seq
  order. When it holds more than ``buffer_size`` messages, the oldest ``summary_batch`` (10) are
  summarised into one entry of the extended buffer and dropped (``MessagesSummarised``, overflow;
  fewer when the batch would reach into the newest ``keep_recent``);
- an **extended buffer** of summaries, at most ``buffer_size * summary_multiplier`` (500); past
  that, the oldest summary is dropped (``SummaryEvicted``, capacity);
- a **token budget** (``max_tokens``, BioCortex's ``working_memory_max_tokens``): when the estimated
  tokens of messages plus summaries exceed it, the oldest part is compressed and the newest
  ``keep_recent`` (10) messages stay intact: first the oldest messages are summarised a batch at a
  time, then the oldest summaries are merged a batch at a time into one of a higher level
  (hierarchical compression), then the oldest summaries are dropped. If the newest messages alone
  exceed the budget they are still kept whole. ``max_tokens = -1`` means 60% of
  ``model_context_tokens``, clamped to [16,000, 600,000] (``resolve_max_tokens``).

Idempotent under redelivery: an event with ``seq <= last_seq`` changes nothing, and after
``session_end`` every event is late and ignored. A session's events are applied in arrival order
(the worker sorts each record's own events by seq), so any batching of the same events gives the
same states and the same output events; one that arrives after a higher seq is skipped, as the
distiller skips it (and dead-letters it).

**Tokens** are estimated, never counted by a tokenizer: ``estimate_tokens(text) = ceil(len(text) / 4)``
(characters, not bytes: the usual ~4 characters per token of English BPE vocabularies), plus
``MESSAGE_OVERHEAD_TOKENS`` (4) per message or summary for its framing. The estimate is
subadditive (the estimate of a concatenation never exceeds the sum of the parts' estimates),
which is what lets ``somnus.processors.briefing.context`` fit a window by adding up lines.

**The default summariser** (``extractive_summary``) is extractive and deterministic: SumBasic
(Nenkova & Vanderwende, 2005). Sentences are the first ``MAX_SENTENCES_PER_MESSAGE`` (4) within
the first 4 x ``MAX_SENTENCE_CHARS`` characters of each message, each clipped to
``MAX_SENTENCE_CHARS`` (200); content words are case-folded ``\\w+`` words
of 3+ characters, not digits only, not stop words. A word's weight is its share of all content
words; a sentence scores the mean weight of its distinct content words; the best sentence that
still fits ``MAX_SUMMARY_CHARS`` (600) is taken (ties: the earlier one) and the weights of its
words are squared so the next pick says something else. The picks are rendered in message order,
``role: sentence`` with `` | `` between messages. An LLM summariser can stand in behind the same
``Summariser`` signature (it must be deterministic, or replay no longer rebuilds the same state).

>>> from datetime import datetime, timezone
>>> from somnus.schemas.working_memory import BufferedMessage, Role, WorkingMemoryState
>>> t = datetime(2024, 5, 15, tzinfo=timezone.utc)
>>> cfg = WorkingMemorySettings(buffer_size=3, summary_batch=2, keep_recent=1)
>>> s = WorkingMemoryState(agent="support", session_id="s1")
>>> for i, text in enumerate(["I need to rebook flight HAT030.", "Which date?", "Tomorrow please.", "Done."]):
...     s, events = add(s, message(i, t, Role.USER if i % 2 == 0 else Role.AGENT, text), cfg)
>>> [m.text for m in s.messages], [type(e).__name__ for e in events]
(['Tomorrow please.', 'Done.'], ['MessagesSummarised'])
>>> summary_line(s.summaries[0])
'seq 0-1 (2 messages): user: I need to rebook flight HAT030. | agent: Which date?'
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

import msgspec

from somnus.processors.sessions.distiller import error_text, session_key
from somnus.schemas.events import (
    AgentMessaged,
    SessionEnded,
    SessionStarted,
    ToolCalled,
    ToolReturned,
    TraceEvent,
    UserMessaged,
)
from somnus.schemas.working_memory import (
    BufferedMessage,
    CompressionReason,
    MessagesSummarised,
    Role,
    SessionSummary,
    SummariesMerged,
    SummaryEvicted,
    WorkingMemoryEvent,
    WorkingMemoryState,
    summary_id_for,
)

CHARS_PER_TOKEN = 4
MESSAGE_OVERHEAD_TOKENS = 4  # role / separator framing of one message or summary in a prompt
MAX_MESSAGE_CHARS = 4000  # a buffered message keeps at most this much text (~1,000 tokens)
MAX_TASK_CHARS = 300
MAX_SUMMARY_CHARS = 600  # the body of one summary (~150 tokens)
MAX_SENTENCE_CHARS = 200
MAX_SENTENCES_PER_MESSAGE = 4  # the head of a long message (a tool output) carries its gist
MAX_SUMMARY_TOOLS = 8

AUTO_MAX_TOKENS = -1
AUTO_CONTEXT_SHARE = 0.6
AUTO_MIN_TOKENS = 16_000
AUTO_MAX_TOKENS_CAP = 600_000

ELLIPSIS = "…"


# ---- settings ---------------------------------------------------------------------------


def resolve_max_tokens(max_tokens: int, model_context_tokens: int) -> int:
    """The working-memory token budget; -1: 60% of the model's context, clamped to [16K, 600K].

    >>> resolve_max_tokens(-1, 200_000), resolve_max_tokens(-1, 8_000), resolve_max_tokens(-1, 2_000_000)
    (120000, 16000, 600000)
    >>> resolve_max_tokens(5000, 200_000)
    5000
    """
    if max_tokens == AUTO_MAX_TOKENS:
        return min(max(int(model_context_tokens * AUTO_CONTEXT_SHARE), AUTO_MIN_TOKENS), AUTO_MAX_TOKENS_CAP)
    if max_tokens <= 0:
        raise ValueError(f"working_memory_max_tokens must be positive or -1 (auto), got {max_tokens}")
    return max_tokens


class WorkingMemorySettings(msgspec.Struct, frozen=True, kw_only=True):
    """The working-memory knobs (the lead maps ``working_memory_max_tokens`` and the model's context
    size from ``somnus/config.py`` onto ``max_tokens`` and ``model_context_tokens``)."""

    buffer_size: int = 50
    summary_multiplier: int = 10
    summary_batch: int = 10  # messages (or summaries) compressed into one summary at a time
    keep_recent: int = 10  # newest messages the token budget never compresses
    max_tokens: int = AUTO_MAX_TOKENS
    model_context_tokens: int = 200_000

    def __post_init__(self) -> None:
        if self.buffer_size < 1:
            raise ValueError(f"buffer_size must be >= 1, got {self.buffer_size}")
        if self.summary_multiplier < 1:
            raise ValueError(f"summary_multiplier must be >= 1, got {self.summary_multiplier}")
        # A batch of 1 would never shrink the extended buffer when merging summaries.
        if not 2 <= self.summary_batch or self.summary_batch > max(self.buffer_size, 2):
            raise ValueError(f"summary_batch must be in [2, buffer_size], got {self.summary_batch}")
        if not 0 <= self.keep_recent <= self.buffer_size:
            raise ValueError(f"keep_recent must be in [0, buffer_size], got {self.keep_recent}")
        if self.model_context_tokens < 1:
            raise ValueError(f"model_context_tokens must be >= 1, got {self.model_context_tokens}")
        resolve_max_tokens(self.max_tokens, self.model_context_tokens)  # validates

    @property
    def summary_capacity(self) -> int:
        return self.buffer_size * self.summary_multiplier

    @property
    def token_budget(self) -> int:
        return resolve_max_tokens(self.max_tokens, self.model_context_tokens)


DEFAULT_SETTINGS = WorkingMemorySettings()


# ---- tokens and text --------------------------------------------------------------------


def estimate_tokens(text: str) -> int:
    """``ceil(len(text) / 4)``: cheap, pinned, subadditive.

    >>> estimate_tokens(""), estimate_tokens("abcd"), estimate_tokens("abcde")
    (0, 1, 2)
    """
    return (len(text) + CHARS_PER_TOKEN - 1) // CHARS_PER_TOKEN


def clip(text: str, max_chars: int) -> str:
    """``text`` cut to at most ``max_chars`` characters, at a space when one is in the second half.

    >>> clip("rate limit encountered", 12)
    'rate limit…'
    """
    if len(text) <= max_chars:
        return text
    if max_chars <= 1:
        return text[:max_chars]
    cut = text[: max_chars - 1]
    space = cut.rfind(" ")
    if space >= max_chars // 2:
        cut = cut[:space]
    return cut.rstrip() + ELLIPSIS


STOP_WORDS = frozenset(
    """
a about above after again against all also am an and any are aren as at be because been before being
below between both but by can cannot could couldn did didn do does doesn doing don down during each
few for from further had hadn has hasn have haven having he her here hers herself him himself his how
i if in into is isn it its itself just let me more most my myself no nor not now of off on once only
or other our ours ourselves out over own please same she should so some such than thank thanks that
the their theirs them themselves then there these they this those through to too under until up very
was wasn we were weren what when where which while who whom why will with won would wouldn yes you
your yours yourself yourselves ok okay sure hi hello hey would like could also just get got one
need want prefer name
""".split()
)

_WORD = re.compile(r"\w{3,}")
_SENTENCE_BREAK = re.compile(r"(?<=[.!?])\s+|\n+")


def content_words(text: str) -> list[str]:
    """Case-folded words of 3+ characters that are not digits only and not stop words, in order.

    >>> content_words("Hi! I need to REBOOK flight HAT030 on 05/20.")
    ['rebook', 'flight', 'hat030']
    """
    return [w for w in _WORD.findall(text.casefold()) if w not in STOP_WORDS and not w.isdigit()]


# ---- the summariser ---------------------------------------------------------------------


class Summariser(Protocol):
    """``(label, text)`` pairs, oldest first (label: a role, or "" for a summary) -> a summary body
    of at most ``max_chars`` characters. Must be deterministic (replay rebuilds the state)."""

    def __call__(self, parts: Sequence[tuple[str, str]], max_chars: int) -> str: ...


def extractive_summary(parts: Sequence[tuple[str, str]], max_chars: int = MAX_SUMMARY_CHARS) -> str:
    """SumBasic over the parts' leading sentences (see the module docstring).

    >>> parts = [("user", "My flight was cancelled. I need a refund."), ("agent", "Sorry to hear that.")]
    >>> extractive_summary(parts, 60)
    'user: My flight was cancelled. I need a refund.'
    """
    # (part index, label, sentence, distinct content words)
    sentences: list[tuple[int, str, str, tuple[str, ...]]] = []
    counts: dict[str, int] = {}
    for i, (label, text) in enumerate(parts):
        # Only the head is split: a summary has ~60 characters per message, the head is plenty.
        head = text[: MAX_SENTENCES_PER_MESSAGE * MAX_SENTENCE_CHARS].strip()
        for raw in _SENTENCE_BREAK.split(head, MAX_SENTENCES_PER_MESSAGE)[:MAX_SENTENCES_PER_MESSAGE]:
            raw = " ".join(raw.split())
            if not raw:
                continue
            sentence = clip(raw, MAX_SENTENCE_CHARS)
            words = tuple(dict.fromkeys(content_words(sentence)))
            for w in words:
                counts[w] = counts.get(w, 0) + 1
            sentences.append((i, label, sentence, words))
    if not sentences:
        return ""
    total = sum(counts.values()) or 1
    weight = {w: c / total for w, c in counts.items()}
    containing: dict[str, list[int]] = {}
    for j, (_, _, _, words) in enumerate(sentences):
        for w in words:
            containing.setdefault(w, []).append(j)

    weight_of = weight.__getitem__

    def score(j: int) -> float:
        words = sentences[j][3]
        return sum(map(weight_of, words)) / len(words) if words else 0.0

    scores = [score(j) for j in range(len(sentences))]
    # Cost of a sentence in the rendered body: its own text plus a "label: " prefix or a separator;
    # counted as if it opened a new segment (" | label: "), an upper bound, so the body always fits.
    cost = [len(s) + len(label) + 5 for _, label, s, _ in sentences]
    open_ = [j for j in range(len(sentences)) if cost[j] <= max_chars]
    chosen: list[int] = []
    room = max_chars
    while open_:
        best = open_[0]
        for j in open_:
            if scores[j] > scores[best]:  # strict: the earlier sentence wins a tie
                best = j
        chosen.append(best)
        room -= cost[best]
        touched: set[int] = set()
        for w in sentences[best][3]:
            weight[w] *= weight[w]
            touched.update(containing[w])
        for j in touched:
            scores[j] = score(j)
        open_ = [j for j in open_ if j != best and cost[j] <= room]
    chosen.sort()
    segments: list[str] = []
    last_part = -1
    for j in chosen:
        part, label, sentence, _ = sentences[j]
        if part == last_part:
            segments[-1] += " " + sentence
        else:
            segments.append(f"{label}: {sentence}" if label else sentence)
            last_part = part
    return clip(" | ".join(segments), max_chars)


# ---- messages ---------------------------------------------------------------------------

_args_encoder = msgspec.json.Encoder(order="sorted")


def message(seq: int, ts: datetime, role: Role, text: str, tool: str | None = None) -> BufferedMessage:
    """A buffered message: text clipped to ``MAX_MESSAGE_CHARS``, tokens estimated once."""
    text = clip(text, MAX_MESSAGE_CHARS)
    return BufferedMessage(
        seq=seq, ts=ts, role=role, text=text, tool=tool, tokens=estimate_tokens(text) + MESSAGE_OVERHEAD_TOKENS
    )


def message_from_event(ev: TraceEvent) -> BufferedMessage | None:
    """The buffered message of a trace event; None for events that are not messages.

    >>> import uuid
    >>> from datetime import datetime, timezone
    >>> from somnus.schemas.events import ToolCall
    >>> ev = ToolCalled(event_id=uuid.UUID(int=1), schema_version=1, ts=datetime(2024, 5, 15, tzinfo=timezone.utc),
    ...     agent="a", session_id="s", seq=3, payload=ToolCall(tool="get_user", call_id="c1", args={"b": 1, "a": "x"}))
    >>> message_from_event(ev).text
    'get_user({"a":"x","b":1})'
    """
    if isinstance(ev, UserMessaged):
        return message(ev.seq, ev.ts, Role.USER, ev.payload.text)
    if isinstance(ev, AgentMessaged):
        return message(ev.seq, ev.ts, Role.AGENT, ev.payload.text)
    if isinstance(ev, ToolCalled):
        call = ev.payload
        args = _args_encoder.encode(call.args).decode()
        return message(ev.seq, ev.ts, Role.TOOL_CALL, f"{call.tool}({args})", call.tool)
    if isinstance(ev, ToolReturned):
        p = ev.payload
        tool = p.tool or "tool"
        if p.ok:
            text = f"{tool}: {p.output}" if p.output else f"{tool}: ok"
        else:
            text = f"{tool} failed: {error_text(p.error, p.http_status)}"
        return message(ev.seq, ev.ts, Role.TOOL_RESULT, text, p.tool)
    return None


def message_label(m: BufferedMessage) -> str:
    """``user``, ``agent``, ``tool_call``, ``tool_result``: how a message is introduced in text."""
    return m.role.value


def summary_line(s: SessionSummary) -> str:
    """How a summary reads in a prompt: its seq range, size and tools, then its body."""
    tools = f"; tools: {', '.join(s.tools)}" if s.tools else ""
    plural = "message" if s.messages == 1 else "messages"
    return f"seq {s.first_seq}-{s.last_seq} ({s.messages} {plural}{tools}): {s.text}"


def _tools_of(names: Iterable[str | None]) -> tuple[str, ...]:
    return tuple(n for n in dict.fromkeys(names) if n)[:MAX_SUMMARY_TOOLS]


def _summary(
    state: WorkingMemoryState,
    level: int,
    first_seq: int,
    last_seq: int,
    first_ts: datetime,
    last_ts: datetime,
    messages: int,
    tools: tuple[str, ...],
    body: str,
) -> SessionSummary:
    s = SessionSummary(
        summary_id=summary_id_for(state.agent, state.session_id, level, first_seq, last_seq),
        level=level,
        first_seq=first_seq,
        last_seq=last_seq,
        first_ts=first_ts,
        last_ts=last_ts,
        messages=messages,
        tools=tools,
        text=body,
        tokens=0,
    )
    return msgspec.structs.replace(s, tokens=estimate_tokens(summary_line(s)) + MESSAGE_OVERHEAD_TOKENS)


# ---- the fold ---------------------------------------------------------------------------


def add(
    state: WorkingMemoryState,
    msg: BufferedMessage,
    settings: WorkingMemorySettings = DEFAULT_SETTINGS,
    summariser: Summariser = extractive_summary,
    at: datetime | None = None,
) -> tuple[WorkingMemoryState, list[WorkingMemoryEvent]]:
    """Append one message; summarise on overflow; evict past capacity; compress to the token budget.

    A message whose ``seq`` is not above ``state.last_seq`` (a redelivery), or any message after the
    session closed, returns ``state`` unchanged and no events. ``at`` (default: the message's ts)
    is the event time written on the output events.
    """
    if state.closed or msg.seq <= state.last_seq:
        return state, []
    at = msg.ts if at is None else at
    events: list[WorkingMemoryEvent] = []
    state = msgspec.structs.replace(
        state, last_seq=msg.seq, messages=state.messages + (msg,), message_tokens=state.message_tokens + msg.tokens
    )
    if len(state.messages) > settings.buffer_size:
        # never into the newest keep_recent (keep_recent <= buffer_size, so at least one goes)
        n = min(settings.summary_batch, len(state.messages) - settings.keep_recent)
        state = _summarise_oldest(state, n, CompressionReason.OVERFLOW, settings, summariser, at, events)
    if state.message_tokens + state.summary_tokens > settings.token_budget:
        state = _compress(state, settings, summariser, at, events)
    return state, events


def _summarise_oldest(
    state: WorkingMemoryState,
    n: int,
    reason: CompressionReason,
    settings: WorkingMemorySettings,
    summariser: Summariser,
    at: datetime,
    events: list[WorkingMemoryEvent],
) -> WorkingMemoryState:
    batch, rest = state.messages[:n], state.messages[n:]
    body = summariser([(message_label(m), m.text) for m in batch], MAX_SUMMARY_CHARS)
    summary = _summary(
        state,
        0,
        batch[0].seq,
        batch[-1].seq,
        batch[0].ts,
        batch[-1].ts,
        len(batch),
        _tools_of(m.tool for m in batch),
        clip(body, MAX_SUMMARY_CHARS),
    )
    state = msgspec.structs.replace(
        state,
        messages=rest,
        message_tokens=state.message_tokens - sum(m.tokens for m in batch),
        summaries=state.summaries + (summary,),
        summary_tokens=state.summary_tokens + summary.tokens,
        summarised=state.summarised + len(batch),
    )
    events.append(
        MessagesSummarised(
            agent=state.agent, session_id=state.session_id, user_id=state.user_id, at=at, reason=reason, summary=summary
        )
    )
    while len(state.summaries) > settings.summary_capacity:
        state = _evict_oldest(state, CompressionReason.CAPACITY, at, events)
    return state


def _evict_oldest(
    state: WorkingMemoryState, reason: CompressionReason, at: datetime, events: list[WorkingMemoryEvent]
) -> WorkingMemoryState:
    gone = state.summaries[0]
    events.append(
        SummaryEvicted(
            agent=state.agent, session_id=state.session_id, user_id=state.user_id, at=at, reason=reason, summary=gone
        )
    )
    return msgspec.structs.replace(
        state,
        summaries=state.summaries[1:],
        summary_tokens=state.summary_tokens - gone.tokens,
        evicted=state.evicted + 1,
    )


def _compress(
    state: WorkingMemoryState,
    settings: WorkingMemorySettings,
    summariser: Summariser,
    at: datetime,
    events: list[WorkingMemoryEvent],
) -> WorkingMemoryState:
    budget = settings.token_budget
    reason = CompressionReason.TOKEN_BUDGET
    # 1. the oldest messages, a batch at a time, never the newest keep_recent
    while state.tokens > budget and len(state.messages) > settings.keep_recent:
        n = min(settings.summary_batch, len(state.messages) - settings.keep_recent)
        state = _summarise_oldest(state, n, reason, settings, summariser, at, events)
    # 2. the oldest summaries, merged a batch at a time into one of a higher level
    while state.tokens > budget and len(state.summaries) >= 2:
        group = state.summaries[: settings.summary_batch]
        body = summariser([("", s.text) for s in group], MAX_SUMMARY_CHARS)
        merged = _summary(
            state,
            max(s.level for s in group) + 1,
            group[0].first_seq,
            group[-1].last_seq,
            group[0].first_ts,
            group[-1].last_ts,
            sum(s.messages for s in group),
            _tools_of(t for s in group for t in s.tools),
            clip(body, MAX_SUMMARY_CHARS),
        )
        state = msgspec.structs.replace(
            state,
            summaries=(merged,) + state.summaries[len(group) :],
            summary_tokens=state.summary_tokens - sum(s.tokens for s in group) + merged.tokens,
        )
        events.append(
            SummariesMerged(
                agent=state.agent,
                session_id=state.session_id,
                user_id=state.user_id,
                at=at,
                reason=reason,
                merged=tuple(s.summary_id for s in group),
                summary=merged,
            )
        )
    # 3. the oldest summaries, dropped; what is left over budget is the newest messages, kept whole
    while state.tokens > budget and state.summaries:
        state = _evict_oldest(state, reason, at, events)
    return state


def apply(
    state: WorkingMemoryState,
    ev: TraceEvent,
    settings: WorkingMemorySettings = DEFAULT_SETTINGS,
    summariser: Summariser = extractive_summary,
) -> tuple[WorkingMemoryState, list[WorkingMemoryEvent]]:
    """Apply one trace event of the state's session (idempotent: see ``add``)."""
    if state.closed or ev.seq <= state.last_seq:
        return state, []
    msg = message_from_event(ev)
    if msg is not None:
        return add(state, msg, settings, summariser)
    if isinstance(ev, SessionStarted):
        return msgspec.structs.replace(
            state, last_seq=ev.seq, user_id=ev.payload.user_id, task=clip(ev.payload.task, MAX_TASK_CHARS) or None
        ), []
    if isinstance(ev, SessionEnded):
        return msgspec.structs.replace(state, last_seq=ev.seq, closed=True), []
    return msgspec.structs.replace(state, last_seq=ev.seq), []  # delegations: not messages


@dataclass
class WorkingMemoryOutput:
    states: dict[str, WorkingMemoryState] = field(default_factory=dict)  # new state of every touched session
    events: list[WorkingMemoryEvent] = field(default_factory=list)
    duplicates: int = 0  # redelivered events (seq already applied)
    late: int = 0  # events after the session ended


def remember(
    prior: Mapping[str, WorkingMemoryState],
    events: Iterable[TraceEvent],
    settings: WorkingMemorySettings = DEFAULT_SETTINGS,
    summariser: Summariser = extractive_summary,
) -> WorkingMemoryOutput:
    """Apply a batch of trace events to the working memories of their sessions (``prior`` is not
    modified; states are frozen). Sessions in first-appearance order, each session's events in the order
    given (arrival order; an event whose seq is not above the last applied one is skipped)."""
    out = WorkingMemoryOutput()
    by_session: dict[str, list[TraceEvent]] = {}
    for ev in events:
        by_session.setdefault(session_key(ev.agent, ev.session_id), []).append(ev)
    for key, evs in by_session.items():
        state = prior.get(key)
        if state is None:
            state = WorkingMemoryState(agent=evs[0].agent, session_id=evs[0].session_id)
        for ev in evs:
            if state.closed:
                out.late += 1
                continue
            if ev.seq <= state.last_seq:
                out.duplicates += 1
                continue
            state, emitted = apply(state, ev, settings, summariser)
            out.events.extend(emitted)
        out.states[key] = state
    return out


def compact(state: WorkingMemoryState) -> WorkingMemoryState:
    """What a closed session keeps once its buffer is no longer wanted: enough to ignore late or
    redelivered events (``closed``, ``last_seq``) and its counters; no messages, no summaries."""
    return WorkingMemoryState(
        agent=state.agent,
        session_id=state.session_id,
        user_id=state.user_id,
        task=state.task,
        last_seq=state.last_seq,
        closed=True,
        summarised=state.summarised,
        evicted=state.evicted,
    )


def recent(state: WorkingMemoryState, n: int = 10) -> tuple[BufferedMessage, ...]:
    """The newest ``n`` buffered messages, oldest first."""
    return state.messages[-n:] if n > 0 else ()


_state_encoder = msgspec.json.Encoder()
_state_decoder = msgspec.json.Decoder(WorkingMemoryState)


def encode_state(state: WorkingMemoryState) -> bytes:
    """Canonical JSON bytes of a state (the Faust table's value serialiser)."""
    return _state_encoder.encode(state)


def decode_state(raw: bytes) -> WorkingMemoryState:
    return _state_decoder.decode(raw)
