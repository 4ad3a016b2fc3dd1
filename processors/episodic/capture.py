"""Episodic memory: memory units, and the capture fold. Pure: no I/O, no clock (``now`` is an argument).

**Units.** ``episode_unit`` turns a distilled episode into a ``MemoryUnit``; ``message_unit`` turns
one message of a conversational trace into one (``message_units`` does a whole event list,
keeping each session's start metadata). Each keeps its source event ids, and a message keeps the
source's own id for it (the importer's ``message_refs``, e.g. LoCoMo's ``dia_id``).

**Capture** (``capture(state, units, now) -> (state, decisions)``) decides, for each unit in order:

- always stored: user interactions, failures, goal changes (the agent's goal differs from its
  last one), high salience (>= ``SALIENCE_THRESHOLD``), and periodic checkpoints (nothing stored
  for the agent in ``CHECKPOINT_INTERVAL`` of event time);
- otherwise by prediction error ``PE = 1 - max similarity`` to the agent's existing memories
  (situation signatures, ``processors/episodic/index.py``; of the LSH's candidates, the
  ``IndexConfig.capture_candidates`` = 256 most recent, so the search does not slow as memories
  accumulate): ``PE < 0.15`` merges the unit into the nearest memory (its sources and refs join
  it); ``0.15 <= PE <= 0.5`` stores it, related to what it resembles; ``PE > 0.5`` is a surprise:
  a new memory;
- a stored memory is linked to the most similar existing ones (``ASSOCIATION_LIMIT`` 5, similarity
  >= ``ASSOCIATION_THRESHOLD`` 0.5) by ``MemoryLinked`` edges (``processors/recall.edge_weight``).

Every decision is an event (``schemas/memory.py``) and the state changes only by ``apply``-ing
events, so folding the decision log rebuilds the same state without deciding again; deciding
again on the same units in the same order also gives the same decisions. A unit already decided
(redelivery) gives no decision.

>>> import uuid
>>> from datetime import datetime, timezone
>>> from somnus.schemas.memory import MemoryKind, MemoryUnit
>>> t = datetime(2024, 5, 15, 9, tzinfo=timezone.utc)
>>> def unit(i, text, **kw):
...     return MemoryUnit(memory_id=f"m{i}", kind=MemoryKind.MESSAGE, agent="a", scope="agent:a", run_id="s1",
...                       position=i, occurred_at=t, perception=text, **kw)
>>> state, decisions = capture(MemoryState(), [unit(1, "the deploy of billing failed on helm timeout"),
...                                            unit(2, "the deploy of billing failed on helm timeout")], now=t)
>>> [(d.action.value, d.reasons) for d in decisions]
[('stored', ['checkpoint', 'surprise']), ('merged', ['near_duplicate'])]
>>> state.index.refs[0], len(state.index)
([], 1)
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from operator import attrgetter
from typing import Any

from somnus.processors.episodic.index import IndexConfig, MemoryIndex
from somnus.processors.episodic.recall import ASSOCIATION_LIMIT, ASSOCIATION_THRESHOLD, edge_parts
from somnus.schemas.episodes import EpisodeDistilled, LessonKind
from somnus.schemas.events import AgentMessaged, Outcome, SessionStarted, TraceEvent, UserMessaged
from somnus.schemas.facts import agent_scope
from somnus.schemas.memory import (
    MEMORY_SCHEMA_VERSION,
    CaptureAction,
    CaptureDecided,
    CaptureReason,
    ForgetReason,
    MemoryAccessed,
    MemoryEvent,
    MemoryForgotten,
    MemoryKind,
    MemoryLinked,
    MemoryUnit,
    MemoryUnlinked,
    memory_id_for,
)
from somnus.processors.knowledge.extraction import error_class

MERGE_BELOW = 0.15  # PE below this: a near-duplicate, merged into the existing memory
SURPRISE_ABOVE = 0.5  # PE above this: a surprise, a new memory
SALIENCE_THRESHOLD = 0.7
CHECKPOINT_INTERVAL = timedelta(hours=1)
LONG_TERM_ACCESSES = 3  # a memory recalled this often becomes long-term
DEFAULT_IMPORTANCE = 0.5
MAX_TEXT = 2000  # characters of a message kept in its unit
PE_HISTORY_LIMIT = 100_000  # capture prediction errors the fold keeps (newest), for sleep's saturation
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)

# ---- units ------------------------------------------------------------------------------------

_DOMAIN_KEYS = ("domain", "project", "client", "customer")


def _importance(metadata: Mapping[str, Any]) -> float:
    value = metadata.get("importance")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return min(1.0, max(0.0, float(value)))
    return DEFAULT_IMPORTANCE


def _strings(value: Any) -> list[str]:
    if isinstance(value, str) and value.strip():
        return [value.strip()]
    if isinstance(value, list):
        return [v.strip() for v in value if isinstance(v, str) and v.strip()]
    return []


def _unique(items: Iterable[str]) -> list[str]:
    seen: dict[str, None] = {}
    for x in items:
        seen.setdefault(x, None)
    return list(seen)


def episode_unit(ep: EpisodeDistilled) -> MemoryUnit:
    """The memory unit of a finished episode.

    Perception: the task; context: goal and metadata; decision: the tools in first-use order (or the
    delegation); action: the call sequence; outcome and summary; lessons; objects: hosts and error
    texts; people: the user and delegated agents. Salience: 1.0 for a failure, 0.8 when the episode
    recovered from an error, 0.3 otherwise.
    """
    calls = [c.tool for c in ep.calls] or list(ep.tools)
    hosts = [h for c in ep.calls for h in c.hosts]
    errors = [error_class(e.error) for e in ep.errors]
    people = _unique([p.lower() for p in ([ep.user_id] if ep.user_id else []) + [d.to_agent for d in ep.delegations]])
    domains = _unique(d for k in _DOMAIN_KEYS for d in _strings(ep.metadata.get(k)))
    failure = ep.outcome is Outcome.FAILURE
    recovered = any(lesson.kind is LessonKind.RECOVERY for lesson in ep.lessons)
    mode = "delegation" if ep.delegations else ("tool_use" if ep.tool_calls else "conversation")
    context = " ".join(
        x
        for x in (
            ep.goal or "",
            " ".join(f"{k}={v}" for k, v in sorted(ep.metadata.items()) if isinstance(v, (str, int, float))),
        )
        if x
    )
    return MemoryUnit(
        memory_id=memory_id_for(ep.agent, MemoryKind.EPISODE.value, str(ep.episode_id)),
        kind=MemoryKind.EPISODE,
        agent=ep.agent,
        scope=agent_scope(ep.agent),
        run_id=ep.session_id,
        position=0,
        occurred_at=ep.ended_at,
        source_event_ids=_unique_ids([ep.first_event_id, ep.last_event_id]),
        perception=ep.task,
        context=context,
        decision=(f"delegate to {ep.delegations[0].to_agent}" if ep.delegations else " ".join(_unique(calls))),
        action=" > ".join(calls),
        outcome=ep.outcome.value,
        success=ep.outcome is Outcome.SUCCESS,
        goal=ep.goal,
        summary=ep.summary,
        lessons=[lesson.text for lesson in ep.lessons],
        tools=_unique(calls),
        objects=_unique([*hosts, *errors]),
        people=people,
        domains=domains,
        mode=mode,
        user_interaction=ep.user_id is not None,
        importance=_importance(ep.metadata),
        salience=1.0 if failure else (0.8 if recovered else 0.3),
        user_id=ep.user_id,
    )


def _unique_ids(ids: Sequence[Any]) -> list[Any]:
    out: list[Any] = []
    for i in ids:
        if i not in out:
            out.append(i)
    return out


def message_unit(
    event: TraceEvent, *, metadata: Mapping[str, Any] | None = None, user_id: str | None = None
) -> MemoryUnit | None:
    """The memory unit of one user or agent message (None for other events and empty texts).

    ``metadata``: the session's start metadata. An importer may put there ``speakers``
    (``{"user": name, "agent": name}``: who speaks as user and as agent), ``message_refs``
    (``{seq: the source's id of that message}``) and ``session_date`` (the source's date text).
    """
    if not isinstance(event, (UserMessaged, AgentMessaged)):
        return None
    text = event.payload.text.strip()
    if not text:
        return None
    meta = metadata or {}
    role = "user" if isinstance(event, UserMessaged) else "agent"
    speakers = meta.get("speakers")
    if not isinstance(speakers, dict):
        speakers = {}
    speaker = speakers.get(role) if isinstance(speakers.get(role), str) else None
    if speaker is None:
        speaker = (user_id or "user") if role == "user" else event.agent
    refs_map = meta.get("message_refs")
    if not isinstance(refs_map, dict):
        refs_map = {}
    ref = refs_map.get(str(event.seq))
    when = meta.get("session_date")
    return MemoryUnit(
        memory_id=memory_id_for(event.agent, MemoryKind.MESSAGE.value, str(event.event_id)),
        kind=MemoryKind.MESSAGE,
        agent=event.agent,
        scope=agent_scope(event.agent),
        run_id=event.session_id,
        position=event.seq,
        occurred_at=event.ts,
        source_event_ids=[event.event_id],
        refs=[ref] if isinstance(ref, str) else [],
        perception=text[:MAX_TEXT],
        context=" ".join(x for x in (f"{role} {speaker}", when if isinstance(when, str) else "") if x),
        people=[speaker.lower()],
        domains=_unique(d for k in _DOMAIN_KEYS for d in _strings(meta.get(k))),
        mode="conversation",
        speaker=speaker,
        user_interaction=role == "user",
        importance=_importance(meta),
        user_id=user_id,
    )


def message_units(events: Iterable[TraceEvent]) -> list[MemoryUnit]:
    """Units of every message in ``events`` (in order), with the metadata of their session's start
    when it is among them."""
    starts: dict[tuple[str, str], SessionStarted] = {}
    out: list[MemoryUnit] = []
    for ev in events:
        if isinstance(ev, SessionStarted):
            starts[(ev.agent, ev.session_id)] = ev
            continue
        start = starts.get((ev.agent, ev.session_id))
        u = message_unit(
            ev, metadata=start.payload.metadata if start else None, user_id=start.payload.user_id if start else None
        )
        if u is not None:
            out.append(u)
    return out


# ---- the capture fold -------------------------------------------------------------------------

# Enum values read once (a member's ``.value`` is a Python-level descriptor call, per decision).
_USER_INTERACTION = CaptureReason.USER_INTERACTION.value
_FAILURE = CaptureReason.FAILURE.value
_GOAL_CHANGE = CaptureReason.GOAL_CHANGE.value
_SALIENCE = CaptureReason.SALIENCE.value
_CHECKPOINT = CaptureReason.CHECKPOINT.value
_NEAR_DUPLICATE = CaptureReason.NEAR_DUPLICATE.value
_RELATED = CaptureReason.RELATED.value
_SURPRISE = CaptureReason.SURPRISE.value
_FAILURE_OUTCOME = Outcome.FAILURE.value


@dataclass
class MemoryState:
    """The fold's state: the index, and what capture remembers per agent."""

    index: MemoryIndex = field(default_factory=MemoryIndex)
    last_goal: dict[str, str] = field(default_factory=dict)  # agent -> its latest goal
    last_stored: dict[str, datetime] = field(default_factory=dict)  # agent -> event time of its latest memory
    decided: set[str] = field(default_factory=set)  # unit ids already decided (merged ones too)
    # Every capture decision's (event time in µs, prediction error), oldest decided first, the last
    # ``PE_HISTORY_LIMIT``: what sleep's saturation report reads (``processors/sleep/dreaming.py``).
    prediction_errors: deque[tuple[int, float]] = field(default_factory=lambda: deque(maxlen=PE_HISTORY_LIMIT))

    @classmethod
    def empty(cls, config: IndexConfig | None = None, embed: Any = None) -> MemoryState:
        return cls(index=MemoryIndex(config, embed))


def decide(state: MemoryState, unit: MemoryUnit, now: datetime) -> list[MemoryEvent]:
    """The capture decision for one unit, and its association edges (not yet applied)."""
    if unit.memory_id in state.decided:
        return []
    reasons: list[str] = []
    if unit.user_interaction:
        reasons.append(_USER_INTERACTION)
    if unit.success is False or unit.outcome == _FAILURE_OUTCOME:
        reasons.append(_FAILURE)
    last_goal = state.last_goal.get(unit.agent)
    if unit.goal and last_goal is not None and _goal_key(unit.goal) != last_goal:
        reasons.append(_GOAL_CHANGE)
    if unit.salience >= SALIENCE_THRESHOLD:
        reasons.append(_SALIENCE)
    last = state.last_stored.get(unit.agent)
    if last is None or unit.occurred_at - last >= CHECKPOINT_INTERVAL:
        reasons.append(_CHECKPOINT)
    # Best first (ties: older first); the index keeps the unit's analysis for apply's add.
    cands, sims = state.index.similar_arrays(
        unit, scopes=[unit.scope], top=ASSOCIATION_LIMIT, newest=state.index.config.capture_candidates
    )
    best = cands.tolist()
    best_sims = sims.tolist()
    nearest_sim = best_sims[0] if best else 0.0
    pe = 1.0 - nearest_sim
    nearest_id = state.index.ids[best[0]] if best else None
    if not reasons and pe < MERGE_BELOW and nearest_id is not None:
        return [
            CaptureDecided(
                schema_version=MEMORY_SCHEMA_VERSION,
                unit=unit,
                action=CaptureAction.MERGED,
                memory_id=nearest_id,
                reasons=[_NEAR_DUPLICATE],
                prediction_error=_r(pe),
                nearest_id=nearest_id,
                nearest_similarity=_r(nearest_sim),
                decided_at=now,
            )
        ]
    novelty = _SURPRISE if pe > SURPRISE_ABOVE else _RELATED if pe >= MERGE_BELOW else _NEAR_DUPLICATE
    out: list[MemoryEvent] = [
        CaptureDecided(
            schema_version=MEMORY_SCHEMA_VERSION,
            unit=unit,
            action=CaptureAction.STORED,
            memory_id=unit.memory_id,
            reasons=[*reasons, novelty],
            prediction_error=_r(pe),
            nearest_id=nearest_id,
            nearest_similarity=_r(nearest_sim),
            decided_at=now,
        )
    ]
    for j, sim in zip(best, best_sims):
        if sim < ASSOCIATION_THRESHOLD:  # best first: the rest are below too
            break
        other = state.index.units[j]
        weight, shared, goal, temporal = edge_parts(unit, other)  # = edge_weight(unit, other)
        a, b = sorted((unit.memory_id, other.memory_id))
        # shared, goal, temporal and sim are in [0, 1] by construction (never -0.0): _r is round there.
        out.append(
            MemoryLinked(
                schema_version=MEMORY_SCHEMA_VERSION,
                a=a,
                b=b,
                weight=_r(weight),
                shared=round(shared, 9),
                goal=round(goal, 9),
                temporal=round(temporal, 9),
                similarity=round(sim, 9),
                formed_at=now,
            )
        )
    return out


def _epoch_us(at: datetime) -> int:
    delta = at - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def _r(x: float) -> float:
    """Clamped to [0, 1] and rounded for the log (9 places): the persisted number and the applied one
    are the same. (Rounding first then clamping gives the same float, with fewer calls: this runs for
    every number of every decision.)"""
    r = round(x, 9)
    return r if 0.0 < r <= 1.0 else (1.0 if r > 1.0 else 0.0)


def _goal_key(goal: str) -> str:
    return " ".join(goal.lower().split())


def apply(state: MemoryState, event: MemoryEvent) -> None:
    """Fold one memory event into the state (the only way the state changes)."""
    ix = state.index
    if isinstance(event, CaptureDecided):
        u = event.unit
        state.decided.add(u.memory_id)
        state.prediction_errors.append((_epoch_us(u.occurred_at), event.prediction_error))
        if u.goal:
            state.last_goal[u.agent] = _goal_key(u.goal)
        if event.action is CaptureAction.MERGED:
            target = ix.pos.get(event.memory_id)
            if target is not None:
                ix.merge_into(target, u)
            return
        if u.memory_id in ix.pos:
            return
        row = ix.add(u)
        if u.user_interaction or u.success is True or u.kind is MemoryKind.MESSAGE:
            # protected from pruning: people, what worked, and what was said in a conversation (both
            # sides: what an agent told someone is part of the interaction as much as what it heard)
            ix.long_term.data[row] = True
        prev = state.last_stored.get(u.agent)
        state.last_stored[u.agent] = u.occurred_at if prev is None else max(prev, u.occurred_at)
    elif isinstance(event, MemoryLinked):
        a, b = ix.pos.get(event.a), ix.pos.get(event.b)
        if a is not None and b is not None and ix.alive.data[a] and ix.alive.data[b]:
            ix.link(a, b, event.weight)
    elif isinstance(event, MemoryAccessed):
        i = ix.pos.get(event.memory_id)
        if i is not None:
            ix.record_access(i, event.accessed_at.timestamp(), LONG_TERM_ACCESSES)
    elif isinstance(event, MemoryForgotten):
        i = ix.pos.get(event.memory_id)
        if i is not None:
            if event.reason is ForgetReason.REMOVED:
                ix.remove(i)
            else:
                ix.drop_edges(i)
                ix.compressed.data[i] = True
    elif isinstance(event, MemoryUnlinked):
        a, b = ix.pos.get(event.a), ix.pos.get(event.b)
        if a is not None and b is not None:
            ix.unlink(a, b)


def apply_all(state: MemoryState, events: Iterable[MemoryEvent]) -> None:
    """Fold events in order: the state ``apply`` gives one by one. Consecutive ``MemoryForgotten``
    events of one reason (a sleep run's prunings, its compressions) are applied as one batch."""
    batch: list[MemoryForgotten] = []
    for ev in events:
        if isinstance(ev, MemoryForgotten):
            if batch and ev.reason is not batch[0].reason:
                _forget_batch(state, batch)
                batch = []
            batch.append(ev)
            continue
        if batch:
            _forget_batch(state, batch)
            batch = []
        apply(state, ev)
    if batch:
        _forget_batch(state, batch)


_MEMORY_ID = attrgetter("memory_id")


def _forget_batch(state: MemoryState, events: Sequence[MemoryForgotten]) -> None:
    """``apply`` of MemoryForgotten events of one reason, batched."""
    ix = state.index
    rows = [i for i in map(ix.pos.get, map(_MEMORY_ID, events)) if i is not None]
    if events[0].reason is ForgetReason.REMOVED:
        ix.remove_many(rows)
        return
    ix.drop_edges_many(rows)
    ix.compressed.data[rows] = True


def capture(state: MemoryState, units: Sequence[MemoryUnit], now: datetime) -> tuple[MemoryState, list[MemoryEvent]]:
    """Decide and apply, unit by unit (a unit sees the memories of the units before it).

    The state is advanced in place and returned (an index of a million memories is not copied). The
    batch's units are analysed ahead, at once (tokens, fingerprints, signatures: ``MemoryIndex.prepare``);
    the decisions are those of ``decide`` and ``apply`` unit by unit, whatever the batching. Units a
    caller prepared ahead (the projector: every record of its batch at once, one vectorised pass
    instead of one per record) are not analysed again, and stay prepared."""
    out: list[MemoryEvent] = []
    index = state.index
    fresh = [u for u in units if u.memory_id not in state.decided]
    ahead = index.prepared(fresh)
    if not ahead:
        index.prepare(fresh)  # the batch's analyses, vectorised
    try:
        for u in units:
            events = decide(state, u, now)
            for ev in events:
                apply(state, ev)
            out.extend(events)
    finally:
        if not ahead:
            index.prepare(())
    return state, out


def replay(events: Iterable[MemoryEvent], state: MemoryState | None = None) -> MemoryState:
    """Rebuild the state from the memory log (in offset order), without deciding anything again."""
    st = state or MemoryState()
    for ev in events:
        apply(st, ev)
    return st


def forget(state: MemoryState, memory_id: str, reason: ForgetReason, now: datetime) -> list[MemoryEvent]:
    """The event that removes (or compresses) a memory; apply it to take effect."""
    if memory_id not in state.index.pos:
        return []
    return [MemoryForgotten(schema_version=MEMORY_SCHEMA_VERSION, memory_id=memory_id, reason=reason, forgotten_at=now)]


def forget_all(
    state: MemoryState, forgotten: Iterable[tuple[str, ForgetReason]], now: datetime
) -> list[MemoryForgotten]:
    """``forget`` of each (memory_id, reason), in order, as one list (apply them with ``apply_all``)."""
    pos = state.index.pos
    return [
        MemoryForgotten(schema_version=MEMORY_SCHEMA_VERSION, memory_id=memory_id, reason=reason, forgotten_at=now)
        for memory_id, reason in forgotten
        if memory_id in pos
    ]


def check_consistency(state: MemoryState, now: datetime) -> list[MemoryUnlinked]:
    """Edges with an end that is not a live memory (after a rebuild from rows, say); apply the
    returned events to repair the graph."""
    ix = state.index
    n = len(ix.ids)
    out: list[MemoryUnlinked] = []
    seen: set[tuple[int, int]] = set()
    for a in sorted(ix.graph):
        for b in sorted(ix.graph[a]):
            pair = (min(a, b), max(a, b))
            if pair in seen:
                continue
            seen.add(pair)
            if any(x >= n or not ix.alive.data[x] for x in pair) and max(pair) < n:
                ida, idb = sorted((ix.ids[pair[0]], ix.ids[pair[1]]))
                out.append(
                    MemoryUnlinked(schema_version=MEMORY_SCHEMA_VERSION, a=ida, b=idb, reason="orphan", unlinked_at=now)
                )
    return out
