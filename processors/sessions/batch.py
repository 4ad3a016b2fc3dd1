"""The distiller's batch without I/O: what ``somnus.processors.sessions.session_retention.sift`` admitted, applied round by
round to the distiller, working memory and memory units (the worker, ``somnus.streams.app``, does the I/O)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence, Set
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


def distill_rounds(
    prior: Mapping[str, SessionState],
    wm_prior: Mapping[str, Any] | None,
    sifted: Sifted,
    partition_of: Mapping[str, int],
    not_episodic: frozenset[str],
    wm_settings: Any,
) -> Distilled:
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
        # Each episode at its place among the round's events: after the event that ended it, or before
        # the one whose stream time closed it as abandoned. In the order of the input, not of where the
        # batch was cut: the worker writes them on one-partition topics whose folds depend on it.
        ended: list[tuple[tuple[int, int], Any]] = [((i, 1), ep) for i, ep in zip(got.ended_at, got.episodes)]
        if rnd.abandon:  # open sessions idle for too long: closed after the round's events
            reason = abandoned_reason(sifted.idle_us)
            for key in rnd.abandon:
                marker, episode = abandon(got.states.get(key) or sessions[key], reason)
                got.states[key] = marker
                ended.append(((rnd.abandoned_at[key], 0), episode))
            ended.sort(key=lambda e: e[0])  # stable: the abandoned at one place in the order they closed
        stamp_closed(got.states, rnd.closing, partition_of)
        refused = {id(ev) for ev, _ in got.late_events}  # dead letters: remembered nowhere
        out.units += memory_units(
            sessions, rnd.events, [ep for _, ep in ended], not_episodic, [at for at, _ in ended], refused
        )
        sessions.update(got.states)
        out.states.update(got.states)
        out.episodes += [ep for _, ep in ended]
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


def memory_units(
    prior: Mapping[str, SessionState],
    events: Sequence[Any],
    episodes: Sequence[Any],
    not_episodic: frozenset[str],
    places: Sequence[tuple[int, int]] | None = None,
    refused: Set[int] = frozenset(),
) -> list[MemoryUnit]:
    """Memory units of a batch: its episodes, and the messages of conversational sessions (those whose
    ``session_start`` metadata says ``"mode": "conversation"``), in the order of the events that made
    them; none for agents whose file sets ``episodic: false``, nor for the events whose ``id`` is in
    ``refused`` (dead letters). ``places``: each episode's place among ``events``, ``(i, 1)`` after
    event i, ``(i, 0)`` before it (None: after them all). A redelivered unit is recognised by its id
    when it is folded."""
    starts: dict[str, tuple[dict[str, Any], str | None]] = {
        key: (st.metadata, st.user_id) for key, st in prior.items() if not st.closed
    }
    out: list[tuple[tuple[int, int], MemoryUnit]] = []
    for i, ev in enumerate(events):
        if ev.agent in not_episodic or id(ev) in refused:
            continue
        key = session_key(ev.agent, ev.session_id)
        if isinstance(ev, SessionStarted):
            starts[key] = (ev.payload.metadata, ev.payload.user_id)
            continue
        meta, user = starts.get(key, ({}, None))
        if meta.get("mode") == "conversation":
            unit = message_unit(ev, metadata=meta, user_id=user)
            if unit is not None:
                out.append(((i, 1), unit))
    after = [(len(events), 1)] * len(episodes) if places is None else places
    out += [(at, episode_unit(ep)) for at, ep in zip(after, episodes) if ep.agent not in not_episodic]
    out.sort(key=lambda u: u[0])  # stable: an event's message before the episode it ends
    return [unit for _, unit in out]
