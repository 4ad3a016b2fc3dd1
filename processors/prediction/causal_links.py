"""The NAc: causal links from actions to outcomes, learned with Rescorla-Wagner, and predictions.

Pure: no I/O, no clock. Same observations in the same order give byte-identical states and rows.

**Observations** come from episodes (``observations_from_episode``): every tool call with a result
gives two, one for its *call-level* link (the event signature: tool + normalised arguments, see
``somnus.schemas.causal.normalise_params``) and one for its *tool-level* link (every call of the tool: the
fallback when a call was never seen, and the exact per-tool counts). The outcome is readable:
``ok``, ``http:<status>`` (a failed call with a status, or an error text starting "HTTP 429"), or
``error:<error class>`` (``somnus.processors.knowledge.extraction.error_class``: ids, numbers, dates templated).
Valence: ok is positive; a rate limit (``is_rate_limit``) is neutral (wait and retry); other errors
are negative.

**Learning** (``learn``): the state of one event signature (``CausalLinkState``) holds, per outcome
seen, the strength V. An observation of outcome o updates every known outcome k of the event::

    V_k <- V_k + α_n (λ_k - V_k),   λ_k = 1 if k == o else 0,   α_n = max(α, 1/n)

where n is the number of observations of the event including this one. A new outcome starts at
V = 0 before its update. λ in {0, 1} makes V_k an estimate of P(k | event), and the V of an event
sum to 1. The ``1/n`` start (``running_mean_start``) makes the first 1/α observations an exact
running mean, so a call seen 3 times with 2 failures predicts 2/3, not 0.19 (what α = 0.1 from
V = 0 would give); from then on α is constant, so V keeps tracking a changing world (an API that
starts failing) with an effective memory of about 1/α observations. Without the start, this is
plain Rescorla-Wagner from V = 0.

**α** (``DEFAULT_ALPHA`` = 0.1, the ``moderate`` learning rate): with the running-mean start the
first 10 observations are averaged exactly; afterwards a change in the world is half absorbed after
ln 2 / α ≈ 7 observations, and the steady-state noise of V for a 50% outcome is
0.5·sqrt(α/(2-α)) ≈ 0.11. ``conservative`` is 0.05 (≈ 14 observations to half absorb, noise 0.08),
``aggressive`` 0.25 (≈ 2.4, noise 0.19). ``alphas_for(agents)`` maps each agent's ``learningRate``;
the α of the observing agent is used.

**Confidence** of a link is n / (n + 2), n the observations of its event (V_k is updated on every
one): 0.6 at 3 observations, the seed's default promotion bar (confidence 0.6, 3 observations).

**Exactly once**: each state keeps a high-water mark per source partition, ``hwm[p] = (offset,
index)`` of the last observation applied; an observation at or below it is a redelivery and is
skipped, so applying a batch twice changes nothing. Observations of one source partition must
therefore reach a key in source order (true when the NAc consumes them in the same order, or via a
topic keyed by event signature written in source order). The marks cannot recognise the same
episode published twice at two offsets (a distiller crash between its output and its changelog):
deduplicate episodes by ``episode_id`` before observing them, keeping the first offset.

**Order**: Rescorla-Wagner is order-dependent once n > 1/α (the running-mean start is not), so V
depends on how source partitions interleave; counts and observations do not. A replay that
re-interleaves partitions differently gives slightly different V (a replay of the same observation
stream gives identical V).

>>> import uuid
>>> from datetime import datetime, timezone
>>> from somnus.schemas.episodes import CallSeen, EpisodeDistilled
>>> from somnus.schemas.events import Outcome
>>> t = datetime(2024, 5, 15, 9, tzinfo=timezone.utc)
>>> ep = EpisodeDistilled(
...     episode_id=uuid.UUID(int=1), schema_version=1, agent="airline", session_id="s1", task="book",
...     goal=None, user_id=None, summary="", outcome=Outcome.FAILURE, started_at=t, ended_at=t,
...     duration_s=0.0, event_count=5, tool_calls=2, tools=[], errors=[], lessons=[], delegations=[],
...     first_event_id=uuid.UUID(int=2), last_event_id=uuid.UUID(int=3), calls=[
...         CallSeen(tool="book_reservation", ok=False, error="Error: payment amount does not add up"),
...         CallSeen(tool="book_reservation", ok=True)])
>>> states, rows = learn({}, observations_from_episode(ep, src_partition=0, src_offset=7))
>>> p = predict(states, "book_reservation", None)
>>> p.known, [(o.outcome, o.valence.value, round(o.strength, 3), o.observations) for o in p.outcomes]
(True, [('error:payment amount does not add up', 'negative', 0.5, 1), ('ok', 'positive', 0.5, 1)])
>>> learn(states, observations_from_episode(ep, src_partition=0, src_offset=7))  # redelivered: no change
({}, [])
>>> q = predict(states, "cancel_reservation", {"reservation_id": "X1"})
>>> q.known, q.basis, q.outcomes
(False, 'none', [])
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

import msgspec

from somnus.processors.sessions.distiller import is_rate_limit
from somnus.processors.knowledge.extraction import NO_MESSAGE, error_class
from somnus.processors.prediction.rhythms import DAY_NAMES, bins_of
from somnus.schemas.causal import (
    CausalLinkUpdated,
    LinkLevel,
    OutcomeObserved,
    PredictedOutcome,
    Prediction,
    ToolCount,
    Valence,
    event_signature,
    normalise_params,
    outcome_signature,
    tool_signature,
)
from somnus.schemas.episodes import CallSeen, EpisodeDistilled
from somnus.schemas.agents import AgentSpec, LearningRate

__all__ = [
    "ALPHA_BY_LEARNING_RATE",
    "CONFIDENCE_PRIOR",
    "DEFAULT_ALPHA",
    "MAX_CONTEXT_VALUES",
    "TOOL_FALLBACK_CONFIDENCE",
    "CausalLinkState",
    "OutcomeLink",
    "alphas_for",
    "confidence_of",
    "decode_link_state",
    "encode_link_state",
    "LinkSnapshot",
    "event_signature",
    "learn",
    "observations_from_episode",
    "outcome_of",
    "predict",
    "snapshots",
    "tool_counts",
    "tool_counts_from_states",
    "tool_signature",
    "valence_of",
]

ALPHA_BY_LEARNING_RATE: dict[LearningRate, float] = {
    LearningRate.CONSERVATIVE: 0.05,
    LearningRate.MODERATE: 0.1,
    LearningRate.AGGRESSIVE: 0.25,
}
DEFAULT_ALPHA = ALPHA_BY_LEARNING_RATE[LearningRate.MODERATE]
CONFIDENCE_PRIOR = 2.0  # confidence = n / (n + CONFIDENCE_PRIOR): 0.6 at 3 observations
TOOL_FALLBACK_CONFIDENCE = 0.5  # a never-seen call answered from its tool: confidence times this
MAX_CONTEXT_VALUES = 24  # distinct values kept per context key per link (24: every hour fits)
CONTEXT_KEYS = ("agent", "hour", "weekday")

_HTTP_CLASS = re.compile(r"^HTTP ([1-5]\d\d)\b")


# ---- observations -----------------------------------------------------------------------------


def outcome_of(call: CallSeen) -> str:
    """The readable outcome of a call with a result: ``ok``, ``http:<status>`` or ``error:<class>``.

    >>> outcome_of(CallSeen(tool="t", ok=False, error="HTTP 429: Too Many Requests", http_status=429))
    'http:429'
    >>> outcome_of(CallSeen(tool="t", ok=False, error="Error: flight HAT030 not available on date 2024-05-13"))
    'error:flight <id> not available on date <date>'
    """
    if call.ok:
        return "ok"
    if call.http_status is not None:
        return f"http:{call.http_status}"
    cls = error_class(call.error or NO_MESSAGE)
    m = _HTTP_CLASS.match(cls)
    return f"http:{m.group(1)}" if m else f"error:{cls}"


def valence_of(call: CallSeen) -> Valence:
    if call.ok:
        return Valence.POSITIVE
    if is_rate_limit(call.error or "", call.http_status):
        return Valence.NEUTRAL
    return Valence.NEGATIVE


def context_of(agent: str, at: datetime) -> dict[str, str]:
    """Context conditions of an observation: the agent, and the local hour and weekday of its time
    (the event's own offset; ``somnus.processors.prediction.rhythms.bins_of``)."""
    b = bins_of(at)
    return {"agent": agent, "hour": f"{b.hour:02d}", "weekday": DAY_NAMES[b.weekday]}


def observations_from_episode(ep: EpisodeDistilled, src_partition: int, src_offset: int) -> list[OutcomeObserved]:
    """Two observations (call level, tool level) per call with a result, in call order.

    A call without a result (``ok`` None) teaches nothing. A call whose arguments are unknown
    (``signature`` None: an episode from before signatures, or a result whose call was not seen)
    gives only its tool-level observation. ``observed_at`` is the call's time, else the episode's end."""
    out: list[OutcomeObserved] = []
    for index, call in enumerate(ep.calls):
        if call.ok is None:
            continue
        outcome = outcome_of(call)
        at = call.at or ep.ended_at
        tool_level = OutcomeObserved(
            event_signature=tool_signature(call.tool),
            level=LinkLevel.TOOL,
            tool=call.tool,
            outcome_signature=outcome_signature(outcome),
            outcome=outcome,
            valence=valence_of(call),
            agent=ep.agent,
            observed_at=at,
            context=context_of(ep.agent, at),
            episode_id=ep.episode_id,
            src_partition=src_partition,
            src_offset=src_offset,
            index=index,
        )
        if call.signature is not None:
            # the call-level observation: the same fields, keyed by the call's signature
            out.append(msgspec.structs.replace(tool_level, event_signature=call.signature, level=LinkLevel.CALL))
        out.append(tool_level)
    return out


# ---- state ------------------------------------------------------------------------------------


class OutcomeLink(msgspec.Struct, kw_only=True):
    """One causal link: this event -> this outcome."""

    outcome: str
    valence: Valence
    strength: float = 0.0  # V, in [0, 1]
    observations: int = 0  # times this outcome followed the event
    first_at: datetime | None = None  # event times of the first and last such observation
    last_at: datetime | None = None
    context: dict[str, list[str]] = {}  # context conditions seen with this outcome (sorted values)
    context_full: list[str] = []  # context keys that reached MAX_CONTEXT_VALUES (no longer complete)


class CausalLinkState(msgspec.Struct, kw_only=True):
    """Everything the NAc keeps about one event signature: the table value (key = event signature)."""

    event_signature: str
    level: LinkLevel
    tool: str
    observations: int = 0  # observations of the event (each updates every link)
    links: dict[str, OutcomeLink] = {}  # by outcome signature
    hwm: dict[int, tuple[int, int]] = {}  # source partition -> (offset, index) of the last applied observation


_state_encoder = msgspec.json.Encoder()
_state_decoder = msgspec.json.Decoder(CausalLinkState)


def encode_link_state(state: CausalLinkState) -> bytes:
    return _state_encoder.encode(state)


def decode_link_state(raw: bytes) -> CausalLinkState:
    return _state_decoder.decode(raw)


def confidence_of(event_observations: int) -> float:
    """The reliability of a link's strength, from the observations of its event.

    >>> [round(confidence_of(n), 3) for n in (0, 1, 3, 18)]
    [0.0, 0.333, 0.6, 0.9]
    """
    return event_observations / (event_observations + CONFIDENCE_PRIOR)


def alphas_for(agents: Mapping[str, AgentSpec]) -> dict[str, float]:
    """α of every declared agent, from its ``learningRate`` (conservative/moderate/aggressive)."""
    return {name: ALPHA_BY_LEARNING_RATE[spec.learning_rate] for name, spec in sorted(agents.items())}


# ---- learning ---------------------------------------------------------------------------------


def learn(
    prior: Mapping[str, CausalLinkState],
    observations: Sequence[OutcomeObserved],
    alpha: float = DEFAULT_ALPHA,
    *,
    alpha_by_agent: Mapping[str, float] | None = None,
    running_mean_start: bool = True,
    per_link_rows: bool = True,
) -> tuple[dict[str, CausalLinkState], list[CausalLinkUpdated]]:
    """Apply observations, in the order given, to the prior states of their event signatures.

    Returns the new state of every event signature that changed, and one ``CausalLinkUpdated`` per
    (applied observation, known outcome of its event); with ``per_link_rows=False``, one per applied
    observation (its outcome's link, with ``strengths`` of every link after it: what the stream carries). ``prior`` is not modified. Redeliveries (at
    or below their partition's high-water mark) are skipped. ``alpha_by_agent`` overrides ``alpha``
    for the agents it names; α = 0 with the running-mean start is a pure running mean."""
    for a in (alpha, *(alpha_by_agent or {}).values()):
        if not 0.0 <= a <= 1.0:
            raise ValueError(f"a learning rate must be within [0, 1], got {a}")
    work: dict[str, CausalLinkState] = {}
    changed: set[str] = set()
    updates: list[CausalLinkUpdated] = []
    for ob in observations:
        key = ob.event_signature
        state = work.get(key)
        if state is None:
            base = prior.get(key)
            state = (
                decode_link_state(encode_link_state(base))
                if base is not None
                else CausalLinkState(event_signature=key, level=ob.level, tool=ob.tool)
            )
            work[key] = state
        mark = state.hwm.get(ob.src_partition)
        if mark is not None and (ob.src_offset, ob.index) <= tuple(mark):
            continue  # redelivered
        state.hwm[ob.src_partition] = (ob.src_offset, ob.index)
        changed.add(key)
        state.observations += 1
        n = state.observations
        a = alpha_by_agent.get(ob.agent, alpha) if alpha_by_agent else alpha
        a_n = max(a, 1.0 / n) if running_mean_start else a
        seen = state.links.get(ob.outcome_signature)
        if seen is None:
            seen = state.links[ob.outcome_signature] = OutcomeLink(outcome=ob.outcome, valence=ob.valence)
        seen.observations += 1
        if seen.first_at is None or ob.observed_at < seen.first_at:
            seen.first_at = ob.observed_at
        if seen.last_at is None or ob.observed_at > seen.last_at:
            seen.last_at = ob.observed_at
        _note_context(seen, ob.context)
        confidence = confidence_of(n)
        observed_before = seen.strength
        for sig in sorted(state.links):
            link = state.links[sig]
            target = 1.0 if sig == ob.outcome_signature else 0.0
            before = link.strength
            link.strength = min(1.0, max(0.0, before + a_n * (target - before)))
            if not per_link_rows:
                continue
            updates.append(
                CausalLinkUpdated(
                    event_signature=key,
                    level=state.level,
                    tool=state.tool,
                    outcome_signature=sig,
                    outcome=link.outcome,
                    valence=link.valence,
                    agent=ob.agent,
                    episode_id=ob.episode_id,
                    observed_at=ob.observed_at,
                    src_partition=ob.src_partition,
                    src_offset=ob.src_offset,
                    index=ob.index,
                    target=target,
                    alpha=a_n,
                    strength_before=before,
                    strength=link.strength,
                    observations=link.observations,
                    event_observations=n,
                    confidence=confidence,
                )
            )
        if not per_link_rows:
            updates.append(
                CausalLinkUpdated(
                    event_signature=key,
                    level=state.level,
                    tool=state.tool,
                    outcome_signature=ob.outcome_signature,
                    # the observation's text: a state restored from the worker's table keeps none
                    outcome=ob.outcome,
                    valence=seen.valence,
                    agent=ob.agent,
                    episode_id=ob.episode_id,
                    observed_at=ob.observed_at,
                    src_partition=ob.src_partition,
                    src_offset=ob.src_offset,
                    index=ob.index,
                    target=1.0,
                    alpha=a_n,
                    strength_before=observed_before,
                    strength=seen.strength,
                    observations=seen.observations,
                    event_observations=n,
                    confidence=confidence,
                    strengths={sig: state.links[sig].strength for sig in sorted(state.links)},
                )
            )
    return {k: work[k] for k in sorted(changed)}, updates


def _note_context(link: OutcomeLink, context: Mapping[str, str]) -> None:
    for key in sorted(context):
        values = link.context.get(key)
        value = context[key]
        if values is None:
            link.context[key] = [value]
        elif value not in values:
            if len(values) >= MAX_CONTEXT_VALUES:
                if key not in link.context_full:
                    link.context_full.append(key)
                    link.context_full.sort()
                continue
            values.append(value)
            values.sort()


# ---- predicting -------------------------------------------------------------------------------


def predict(
    states: Mapping[str, CausalLinkState],
    tool: str,
    params: Mapping[str, Any] | None,
    context: Mapping[str, str] | None = None,
) -> Prediction:
    """What is likely to happen if ``tool`` is called with ``params``, most likely first.

    - this kind of call was seen: ``known`` True, ``basis`` "call";
    - ``params`` None asks about the tool as a whole: ``known`` True, ``basis`` "tool" when seen;
    - a never-seen call of a known tool: ``known`` False, ``basis`` "tool", the tool's outcomes with
      confidence times ``TOOL_FALLBACK_CONFIDENCE``: a hint, flagged as such;
    - a never-seen tool: ``known`` False, ``basis`` "none", no outcomes (no guess).

    ``context`` (e.g. ``{"agent": "airline", "hour": "09"}``) sets ``in_context`` on each outcome:
    True when every given value was seen with that outcome, False when one was not, None when a key
    is not recorded or its record is full. Outcomes are not re-weighted by context."""
    if params is None:
        sig, template, fallback = tool_signature(tool), None, False
        state = states.get(sig)
    else:
        template = normalise_params(params)
        sig, fallback = event_signature(tool, params), False
        state = states.get(sig)
        if state is None:
            state, fallback = states.get(tool_signature(tool)), True
    if state is None or state.observations == 0:
        return Prediction(
            tool=tool, event_signature=sig, known=False, basis="none", observations=0, outcomes=[], params=template
        )
    discount = TOOL_FALLBACK_CONFIDENCE if fallback else 1.0
    confidence = confidence_of(state.observations) * discount
    outcomes = [
        PredictedOutcome(
            outcome=link.outcome,
            valence=link.valence,
            strength=link.strength,
            confidence=confidence,
            observations=link.observations,
            in_context=None if context is None else _in_context(link, context),
        )
        for link in state.links.values()
    ]
    outcomes.sort(key=lambda o: (-o.strength, o.outcome))
    return Prediction(
        tool=tool,
        event_signature=sig,
        known=not fallback,
        basis="tool" if (fallback or params is None) else "call",
        observations=state.observations,
        outcomes=outcomes,
        params=template,
    )


def _in_context(link: OutcomeLink, context: Mapping[str, str]) -> bool | None:
    verdict: bool | None = True
    for key, value in context.items():
        values = link.context.get(key)
        if values is None:
            verdict = None
        elif value not in values:
            if key in link.context_full:
                verdict = None
            else:
                return False
    return verdict


# ---- exact counts -----------------------------------------------------------------------------


def tool_counts(observations: Iterable[OutcomeObserved]) -> dict[str, ToolCount]:
    """Exact calls (with a result) and errors per tool, from tool-level observations (commutative).

    Counts are not idempotent: give each observation once (e.g. rows deduplicated by coordinates)."""
    calls: dict[str, int] = {}
    errors: dict[str, int] = {}
    for ob in observations:
        if ob.level is not LinkLevel.TOOL:
            continue
        calls[ob.tool] = calls.get(ob.tool, 0) + 1
        if ob.outcome != "ok":
            errors[ob.tool] = errors.get(ob.tool, 0) + 1
    return {t: ToolCount(t, calls[t], errors.get(t, 0)) for t in sorted(calls)}


def tool_counts_from_states(states: Mapping[str, CausalLinkState]) -> dict[str, ToolCount]:
    """Exact calls and errors per tool, read from tool-level link states (protected by their
    high-water marks, so exactly once wherever the states are)."""
    out: dict[str, ToolCount] = {}
    for state in states.values():
        if state.level is not LinkLevel.TOOL:
            continue
        ok = sum(link.observations for link in state.links.values() if link.outcome == "ok")
        out[state.tool] = ToolCount(state.tool, state.observations, state.observations - ok)
    return {t: out[t] for t in sorted(out)}


# ---- the links as a flat view (promotion, inspection) ------------------------------------------


class LinkSnapshot(msgspec.Struct, frozen=True, kw_only=True):
    """One causal link as a flat record: the ``CausalLinkLike`` shape somnus.processors.semantic.promotion reads."""

    event_signature: str
    level: LinkLevel
    tool: str | None
    outcome_signature: str
    outcome: str
    valence: str
    strength: float
    confidence: float
    observation_count: int
    event_observations: int
    first_at: datetime | None
    last_at: datetime | None
    context_conditions: dict[str, list[str]]
    observation_times: list[datetime] = []  # from the rows with λ = 1, when given
    source_episode_ids: list[str] = []  # parallel to observation_times


def snapshots(states: Mapping[str, CausalLinkState], updates: Iterable[CausalLinkUpdated] = ()) -> list[LinkSnapshot]:
    """Every link of the given states, strongest first within an event, events in key order.

    ``updates`` (e.g. the stored ``CausalLinkUpdated`` rows of these events) supply each link's
    observation times and episodes: the rows with λ = 1 are its observations."""
    seen: dict[tuple[str, str], tuple[list[datetime], list[str]]] = {}
    for u in updates:
        if u.target == 1.0:
            times, episodes = seen.setdefault((u.event_signature, u.outcome_signature), ([], []))
            times.append(u.observed_at)
            episodes.append(str(u.episode_id))
    out = []
    for key in sorted(states):
        state = states[key]
        for sig, link in sorted(state.links.items(), key=lambda kv: (-kv[1].strength, kv[0])):
            times, episodes = seen.get((key, sig), ([], []))
            out.append(
                LinkSnapshot(
                    event_signature=key,
                    level=state.level,
                    tool=state.tool,
                    outcome_signature=sig,
                    outcome=link.outcome,
                    valence=link.valence.value,
                    strength=link.strength,
                    confidence=confidence_of(state.observations),
                    observation_count=link.observations,
                    event_observations=state.observations,
                    first_at=link.first_at,
                    last_at=link.last_at,
                    context_conditions={k: list(v) for k, v in sorted(link.context.items())},
                    observation_times=list(times),
                    source_episode_ids=list(episodes),
                )
            )
    return out
