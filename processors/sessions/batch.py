"""The distiller's batch without I/O: what ``somnus.processors.sessions.session_retention.sift`` admitted, applied round by
round to the distiller, working memory and memory units (the worker, ``somnus.streams.app``, does the I/O)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from somnus.processors.sessions.distiller import SessionState, abandon, distill, session_key
from somnus.processors.episodic.capture import episode_unit, message_unit
from somnus.processors.sessions.session_retention import Sifted, abandoned_reason, stamp_closed
from somnus.processors.working.session_buffer import remember
from somnus.schemas.events import SessionStarted
from somnus.schemas.memory import MemoryUnit


@dataclass
class Distilled:
    states: dict[str, SessionState] = field(default_factory=dict)
    wm_states: dict[str, Any] = field(default_factory=dict)
    episodes: list[Any] = field(default_factory=list)
    units: list[MemoryUnit] = field(default_factory=list)
    late_events: list[tuple[Any, str]] = field(default_factory=list)  # (event, dead-letter reason)
    duplicates: int = 0


def distill_rounds(prior: Mapping[str, SessionState], wm_prior: Mapping[str, Any] | None, sifted: Sifted,
                   partition_of: Mapping[str, int], not_episodic: frozenset[str], wm_settings: Any) -> Distilled:
    """The distiller, working memory and memory units over what ``sift`` admitted, round by round
    (``somnus.processors.sessions.session_retention.Round``), each round starting from the states the one before left."""
    out = Distilled()
    sessions, working = dict(prior), dict(wm_prior) if wm_prior is not None else None
    for rnd in sifted.rounds:
        for key in rnd.forget:
            sessions.pop(key, None)
            if working is not None:
                working.pop(key, None)
        got = distill(sessions, rnd.events)
        if rnd.abandon:  # open sessions idle for too long: closed after the round's events
            reason = abandoned_reason(sifted.idle_us)
            for key in rnd.abandon:
                marker, episode = abandon(got.states.get(key) or sessions[key], reason)
                got.states[key] = marker
                got.episodes.append(episode)
        stamp_closed(got.states, rnd.closing, partition_of)
        refused = {id(ev) for ev, _ in got.late_events}  # dead letters: remembered nowhere
        out.units += memory_units(sessions, [ev for ev in rnd.events if id(ev) not in refused] if refused
                                  else rnd.events, got.episodes, not_episodic)
        sessions.update(got.states)
        out.states.update(got.states)
        out.episodes += got.episodes
        out.late_events += got.late_events
        out.duplicates += got.duplicates
        if working is not None:
            wm = remember(working, rnd.events, wm_settings).states
            working.update(wm)
            out.wm_states.update(wm)
            for key in rnd.abandon:  # after the events the session had in the round
                if key in working:
                    working[key] = out.wm_states[key] = msgspec.structs.replace(working[key], closed=True)
    return out


def memory_units(prior: Mapping[str, SessionState], events: Sequence[Any], episodes: Sequence[Any],
                 not_episodic: frozenset[str]) -> list[MemoryUnit]:
    """Memory units of a batch: its episodes, and the messages of conversational sessions (those whose
    ``session_start`` metadata says ``"mode": "conversation"``), in batch order; none for agents whose
    file sets ``episodic: false``. A redelivered unit is recognised by its id when it is folded."""
    starts: dict[str, tuple[dict[str, Any], str | None]] = {
        key: (st.metadata, st.user_id) for key, st in prior.items() if not st.closed}
    out: list[MemoryUnit] = []
    for ev in events:
        if ev.agent in not_episodic:
            continue
        key = session_key(ev.agent, ev.session_id)
        if isinstance(ev, SessionStarted):
            starts[key] = (ev.payload.metadata, ev.payload.user_id)
            continue
        meta, user = starts.get(key, ({}, None))
        if meta.get("mode") == "conversation":
            unit = message_unit(ev, metadata=meta, user_id=user)
            if unit is not None:
                out.append(unit)
    out += [episode_unit(ep) for ep in episodes if ep.agent not in not_episodic]
    return out
