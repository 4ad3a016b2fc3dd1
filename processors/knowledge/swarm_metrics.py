"""Swarm metrics: knowledge utilisation, delegation success, and scope promotion. Pure: no I/O, no clock.

**Utilisation.** A fact is *used* in a session when the session was served a briefing showing it
(``BriefingServed``) and a later tool call, agent message or delegation of that session *mentions*
one of the fact's entities. Mention, precisely: the text is NFKC-normalised and case-folded and cut
into word tokens (``\\w+``: letters, digits, underscore); the entity name likewise; the entity is
mentioned when its tokens occur as a contiguous run of the text's tokens, within one text fragment
(a tool call's fragments are the tool name and every key, string and number of its arguments; a
message has its text; a delegation its target agent and task). So ``book_reservation`` is mentioned
by a call of ``book_reservation`` but not by "book a reservation", and ``api.instantly.ai`` by the
argument ``https://API.instantly.ai/v1/leads``. Names with fewer than ``MIN_MENTION_CHARS`` word
characters (``<n>``, "s", "ai") are never matched, and the reading agent's own name does not count.
Each fact is used at most once per session (the first mention).

**Delegation success.** Per (delegator, delegatee) pair, from ``delegation_result`` events: the
success rate is successes / all results (a partial result is not a success). A pair with at least
``FAILING_MIN_RESULTS`` results and a success rate below ``FAILING_MAX_SUCCESS_RATE`` is *failing*.

**Scope promotion.** Uses are counted per statement (source, predicate, target) and per scope it
could move to:

- an agent-scoped statement (``agent:x``) can move to x's team (``team:<x.reportsTo>``; an agent
  without ``reportsTo`` has no team, so its facts stay private). It moves when the number of distinct
  team members who used the statement from their own agent scope reaches ``members`` of x's
  ``learningRate`` (each agent's setting governs its own copy: the copy whose owner's threshold is met
  first moves);
- a team-scoped statement (``team:L``) can move to ``global``. It moves when its users belong to at
  least ``teams`` distinct teams (a user's team is ``team:<its reportsTo>``; an agent without one is
  a team of its own), with the learning rate of the team's lead L (``moderate`` if L is not declared).

==============  ================================  ==================================
learningRate    agent -> team: distinct members   team -> global: distinct teams
==============  ================================  ==================================
conservative    3                                 3
moderate        2                                 2
aggressive      1                                 2 ("across teams" needs two)
==============  ================================  ==================================

A promotion is a ``FactPromoted`` event; the counters of the statement for that target scope are
dropped when it happens (by utilisation or by hand), and later uses of narrower copies no longer
count toward a scope the statement has already reached.

>>> import uuid
>>> from datetime import datetime, timezone
>>> from somnus.schemas.briefing import FactUsed
>>> from somnus.schemas.agents import AgentSpec
>>> fleet = {"lead": AgentSpec(name="lead"), "a": AgentSpec(name="a", reports_to="lead"),
...          "b": AgentSpec(name="b", reports_to="lead")}
>>> def used(agent):
...     return FactUsed(schema_version=1, agent=agent, session_id=f"s-{agent}", briefing_id="b", triple_id=f"t-{agent}",
...                     source="api:api.x.io", predicate="rate_limit", target="rate:10/s", scope=f"agent:{agent}",
...                     confidence=1.0, entity="api.x.io", seq=3, used_at=datetime(2024, 5, 1, tzinfo=timezone.utc))
>>> fold = PromotionFold()
>>> fold.apply(fleet, [used("a")])
[]
>>> [(p.from_scope, p.to_scope, p.users) for p in fold.apply(fleet, [used("b")])]
[('agent:a', 'team:lead', ['a', 'b'])]
"""

from __future__ import annotations

import re
import unicodedata
import uuid
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, NamedTuple

import msgspec

from somnus.processors.briefing.generator import entity_name
from somnus.processors.knowledge.triples import normalise_name
from somnus.schemas.briefing import (
    BRIEFING_SCHEMA_VERSION,
    BriefingServed,
    FactPromoted,
    FactUsed,
    PromotionReason,
    ServedFact,
)
from somnus.schemas.events import AgentMessaged, Delegated, DelegationReturned, Outcome, ToolCalled, TraceEvent
from somnus.schemas.facts import (
    FACTS_SCHEMA_VERSION,
    GLOBAL_SCOPE,
    FactAsserted,
    FactsExtracted,
    agent_scope,
    team_scope,
)
from somnus.schemas.agents import AgentSpec, LearningRate

MIN_MENTION_CHARS = 3  # word characters an entity name needs before a mention of it can count


class Threshold(NamedTuple):
    members: int  # agent -> team: distinct team members who used the statement
    teams: int  # team -> global: distinct teams whose members used it


PROMOTION_THRESHOLDS: dict[LearningRate, Threshold] = {
    LearningRate.CONSERVATIVE: Threshold(members=3, teams=3),
    LearningRate.MODERATE: Threshold(members=2, teams=2),
    LearningRate.AGGRESSIVE: Threshold(members=1, teams=2),
}
FAILING_MIN_RESULTS = 5  # results a pair needs before it can be called failing
FAILING_MAX_SUCCESS_RATE = 0.5  # below this success rate a pair is failing
PROMOTION_NAMESPACE = uuid.UUID("5c0f3e1a-8d2b-4a7c-9e61-2b7d4f0a9c13")
PROMOTION_EXTRACTOR = "promotion/1"


# ---- mentions ------------------------------------------------------------------------------

_TOKEN = re.compile(r"\w+")


def tokens(text: str) -> list[str]:
    """Word tokens of a text, NFKC-normalised and case-folded.

    >>> tokens("GET https://API.instantly.ai/v1 — Book_Reservation")
    ['get', 'https', 'api', 'instantly', 'ai', 'v1', 'book_reservation']
    """
    return _TOKEN.findall(unicodedata.normalize("NFKC", text).casefold())


def _needle(name: str) -> str | None:
    toks = tokens(name)
    if sum(len(t) for t in toks) < MIN_MENTION_CHARS:
        return None
    return " " + " ".join(toks) + " "


def _haystack(fragments: Iterable[str]) -> str:
    # "\0" cannot be part of a token, so a name never matches across two fragments.
    return " " + " \0 ".join(" ".join(tokens(f)) for f in fragments) + " "


def mentions(fragments: Iterable[str], name: str) -> bool:
    """Whether ``name`` is mentioned in any of ``fragments`` (see the module docstring).

    >>> mentions(["http_get", "https://api.instantly.ai/v1/leads"], "api.instantly.ai")
    True
    >>> mentions(["book a reservation"], "book_reservation"), mentions(["10 per s"], "10/s")
    (False, False)
    """
    needle = _needle(name)
    return needle is not None and needle in _haystack(fragments)


def _scalars(value: Any, out: list[str]) -> None:
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            out.append(v)
        elif isinstance(v, bool) or v is None:
            continue
        elif isinstance(v, (int, float)):
            out.append(str(v))
        elif isinstance(v, Mapping):
            for k, x in reversed(list(v.items())):
                stack.append(x)
                stack.append(str(k))
        elif isinstance(v, (list, tuple)):
            stack.extend(reversed(v))


def acting_fragments(event: TraceEvent) -> list[str] | None:
    """The texts of an event in which the agent acts (tool call, agent message, delegation); None for
    any other event (user messages, results: the agent did not write them)."""
    if isinstance(event, ToolCalled):
        out = [event.payload.tool]
        _scalars(event.payload.args, out)
        return out
    if isinstance(event, AgentMessaged):
        return [event.payload.text]
    if isinstance(event, Delegated):
        return [event.payload.to_agent, event.payload.task]
    return None


def event_from_row(row: Mapping[str, Any]) -> TraceEvent:
    """A typed event from a row of the ``events`` table (payload as JSON text or a dict)."""
    data = dict(row)
    if isinstance(data.get("payload"), (str, bytes)):
        data["payload"] = msgspec.json.decode(data["payload"])
    keep = ("event_id", "schema_version", "ts", "agent", "session_id", "seq", "type", "payload")
    return msgspec.convert({k: data[k] for k in keep}, TraceEvent, strict=False)


def facts_used(served: BriefingServed, events: Iterable[TraceEvent]) -> list[FactUsed]:
    """The facts of ``served`` that its session acted on, in order of the first mention (then as served).

    ``events`` may hold other sessions' events (they are ignored) and come in any order (they are
    taken by ``seq``; a redelivered seq counts once)."""
    me = normalise_name(served.agent)
    names: list[tuple[ServedFact, list[tuple[str, str]]]] = []
    for fact in served.facts:
        cands: list[tuple[str, str]] = []
        for name in (fact.source_name, fact.target_name):
            needle = _needle(name)
            if needle is not None and normalise_name(name) != me and all(needle != c for _, c in cands):
                cands.append((name, needle))
        if cands:
            names.append((fact, cands))
    if not names:
        return []
    acts: dict[int, tuple[TraceEvent, str]] = {}
    for ev in events:
        if ev.session_id != served.session_id or ev.agent != served.agent or ev.seq in acts:
            continue
        fragments = acting_fragments(ev)
        if fragments is not None:
            acts[ev.seq] = (ev, _haystack(fragments))
    out: list[FactUsed] = []
    pending = names
    for seq in sorted(acts):
        ev, hay = acts[seq]
        rest = []
        for fact, cands in pending:
            hit = next((name for name, needle in cands if needle in hay), None)
            if hit is None:
                rest.append((fact, cands))
                continue
            out.append(
                FactUsed(
                    schema_version=BRIEFING_SCHEMA_VERSION,
                    agent=served.agent,
                    session_id=served.session_id,
                    briefing_id=served.briefing_id,
                    triple_id=fact.triple_id,
                    source=fact.source,
                    predicate=fact.predicate,
                    target=fact.target,
                    scope=fact.scope,
                    confidence=fact.confidence,
                    entity=hit,
                    seq=seq,
                    used_at=ev.ts,
                )
            )
        pending = rest
        if not pending:
            break
    return out


def facts_used_in_episode(served: BriefingServed, acted: Iterable[str], used_at: datetime) -> list[FactUsed]:
    """The facts of ``served`` whose source or target is an entity the session's episode acted on.

    ``acted`` are entity ids (``type:name``) of the session's own extraction (the tools it called,
    the APIs it reached, the errors it met, the agents it delegated to: ``somnus.processors.knowledge.extraction``):
    this is how the stream judges "acted on" without re-reading the session's events. (``facts_used``
    reads the events themselves, messages included; this is its structured subset.) The reading
    agent itself never counts; a fact counts once.

    >>> from datetime import datetime, timezone
    >>> from somnus.schemas.briefing import ServedFact
    >>> f = ServedFact(triple_id="t1", source="api:api.x.io", predicate="rate_limit", target="rate:10/s",
    ...                scope="agent:scraper", confidence=0.9, source_name="api.x.io", target_name="10/s")
    >>> s = BriefingServed(schema_version=1, briefing_id="b", agent="researcher", session_id="s1",
    ...                    served_at=datetime(2024, 5, 1, tzinfo=timezone.utc), facts=[f])
    >>> [u.entity for u in facts_used_in_episode(s, ["api:api.x.io", "tool:http_get"], s.served_at)]
    ['api.x.io']
    """
    ids = {
        i.split(":", 1)[0] + ":" + normalise_name(i.split(":", 1)[1]) if ":" in i else normalise_name(i) for i in acted
    }
    me = f"agent:{normalise_name(served.agent)}"
    out = []
    for fact in served.facts:
        hit = next((e for e in (fact.source, fact.target) if e != me and e in ids), None)
        if hit is None:
            continue
        out.append(
            FactUsed(
                schema_version=BRIEFING_SCHEMA_VERSION,
                agent=served.agent,
                session_id=served.session_id,
                briefing_id=served.briefing_id,
                triple_id=fact.triple_id,
                source=fact.source,
                predicate=fact.predicate,
                target=fact.target,
                scope=fact.scope,
                confidence=fact.confidence,
                entity=entity_name(hit),
                seq=0,
                used_at=used_at,
            )
        )
    return out


class Utilisation(msgspec.Struct, frozen=True):
    agent: str
    sessions: int  # sessions served a briefing with at least one fact
    facts_served: int  # (session, fact) pairs shown
    facts_used: int  # (session, fact) pairs acted on
    rate: float  # facts_used / facts_served


def utilisation(served: Iterable[BriefingServed], used: Iterable[FactUsed]) -> dict[str, Utilisation]:
    """Per agent, how much of what its briefings showed it acted on (records deduplicated by
    (session, triple)), for ``somnus status``: "top agents by knowledge utilisation"."""
    shown: dict[str, set[tuple[str, str]]] = {}
    for b in served:
        shown.setdefault(b.agent, set()).update((b.session_id, f.triple_id) for f in b.facts)
    acted: dict[str, set[tuple[str, str]]] = {}
    for u in used:
        acted.setdefault(u.agent, set()).add((u.session_id, u.triple_id))
    out = {}
    for agent in sorted(shown.keys() | acted.keys()):
        s, a = shown.get(agent, set()), acted.get(agent, set())
        out[agent] = Utilisation(
            agent=agent,
            sessions=len({x for x, _ in s}),
            facts_served=len(s),
            facts_used=len(a),
            rate=len(a & s) / len(s) if s else 0.0,
        )
    return out


# ---- delegation success --------------------------------------------------------------------


class DelegationTally(msgspec.Struct, frozen=True):
    delegator: str
    delegatee: str
    successes: int = 0
    partials: int = 0
    failures: int = 0

    @property
    def results(self) -> int:
        return self.successes + self.partials + self.failures

    @property
    def success_rate(self) -> float:
        return self.successes / self.results if self.results else 0.0

    @property
    def failing(self) -> bool:
        return self.results >= FAILING_MIN_RESULTS and self.success_rate < FAILING_MAX_SUCCESS_RATE


def delegation_results(events: Iterable[TraceEvent]) -> list[tuple[str, str, str]]:
    """(delegator, delegatee, outcome) of every ``delegation_result`` event, in input order."""
    return [
        (ev.agent, ev.payload.to_agent, ev.payload.outcome.value) for ev in events if isinstance(ev, DelegationReturned)
    ]


def tally_delegations(
    prior: Mapping[tuple[str, str], DelegationTally], results: Iterable[tuple[str, str, str]]
) -> dict[tuple[str, str], DelegationTally]:
    """Add (delegator, delegatee, outcome) results to the tallies (a new dict; ``prior`` is not changed).
    Exactly-once is the caller's: feed each ``delegation_result`` event once (e.g. by event id).

    >>> t = tally_delegations({}, [("ops", "deployer", "success"), ("ops", "deployer", "partial")])
    >>> t[("ops", "deployer")].success_rate
    0.5
    """
    out = dict(prior)
    field = {Outcome.SUCCESS.value: "successes", Outcome.PARTIAL.value: "partials", Outcome.FAILURE.value: "failures"}
    for delegator, delegatee, outcome in results:
        key = (delegator, delegatee)
        cur = out.get(key) or DelegationTally(delegator, delegatee)
        name = field[Outcome(outcome).value]
        out[key] = msgspec.structs.replace(cur, **{name: getattr(cur, name) + 1})
    return out


def failing_pairs(tallies: Mapping[tuple[str, str], DelegationTally]) -> list[DelegationTally]:
    """Failing pairs, worst first (lowest success rate, then most results, then names)."""
    return sorted(
        (t for t in tallies.values() if t.failing), key=lambda t: (t.success_rate, -t.results, t.delegator, t.delegatee)
    )


# ---- scope promotion -----------------------------------------------------------------------


class Tally(msgspec.Struct, frozen=True):
    """Uses of one statement toward one target scope since its counters last restarted."""

    users: list[str] = []  # distinct agents, sorted
    teams: list[str] = []  # their distinct teams, sorted
    sources: list[str] = []  # the scopes they used it from, sorted
    uses: int = 0
    confidence: float = 0.0  # the highest confidence shown


class StatementState(msgspec.Struct, frozen=True):
    """Everything promotion keeps about one statement: per target scope its tally, and the scopes it
    was promoted into. This is the value of the promotion table (key = ``statement_key``)."""

    tallies: dict[str, Tally] = {}
    promoted: list[str] = []


def statement_key(source: str, predicate: str, target: str) -> str:
    return f"{source}\x1f{predicate}\x1f{target}"


def team_of(agents: Mapping[str, AgentSpec], agent: str) -> str:
    """The team an agent belongs to for counting: ``team:<reportsTo>``, else its own ``agent:<name>``."""
    spec = agents.get(agent)
    if spec is not None and spec.reports_to is not None:
        return team_scope(spec.reports_to)
    return agent_scope(agent)


def promotion_target(agents: Mapping[str, AgentSpec], scope: str) -> str | None:
    """Where a statement in ``scope`` can move: agent -> its team, team -> global; None otherwise."""
    if scope.startswith("agent:"):
        spec = agents.get(scope[len("agent:") :])
        return team_scope(spec.reports_to) if spec is not None and spec.reports_to is not None else None
    if scope.startswith("team:"):
        return GLOBAL_SCOPE
    return None


def learning_rate_of(agents: Mapping[str, AgentSpec], scope: str) -> LearningRate:
    """The setting that governs facts leaving ``scope``: the agent's (``agent:x``) or the team lead's
    (``team:L``); ``moderate`` when that agent is not declared."""
    name = scope.split(":", 1)[1] if ":" in scope else ""
    spec = agents.get(name)
    return spec.learning_rate if spec is not None else LearningRate.MODERATE


def promotion_id(
    source: str, predicate: str, target: str, from_scope: str, to_scope: str, reason: PromotionReason, at: datetime
) -> uuid.UUID:
    return uuid.uuid5(
        PROMOTION_NAMESPACE,
        "\x1f".join((source, predicate, target, from_scope, to_scope, reason.value, at.isoformat())),
    )


def _union(xs: list[str], x: str) -> list[str]:
    return xs if x in xs else sorted([*xs, x])


def count_use(
    state: StatementState | None, used: FactUsed, agents: Mapping[str, AgentSpec]
) -> tuple[StatementState, list[FactPromoted]]:
    """Count one use of a statement; promote it when a threshold is reached (then its tally restarts)."""
    st = state or StatementState()
    to = promotion_target(agents, used.scope)
    if to is None or to in st.promoted:
        return st, []
    cur = st.tallies.get(to, Tally())
    tally = Tally(
        users=_union(cur.users, used.agent),
        teams=_union(cur.teams, team_of(agents, used.agent)),
        sources=_union(cur.sources, used.scope),
        uses=cur.uses + 1,
        confidence=max(cur.confidence, used.confidence),
    )
    for source_scope in tally.sources:
        rate = learning_rate_of(agents, source_scope)
        threshold = PROMOTION_THRESHOLDS[rate]
        need, have = (
            (threshold.teams, len(tally.teams)) if to == GLOBAL_SCOPE else (threshold.members, len(tally.users))
        )
        if have >= need:
            reason = PromotionReason.UTILISATION
            event = FactPromoted(
                schema_version=BRIEFING_SCHEMA_VERSION,
                promotion_id=promotion_id(
                    used.source, used.predicate, used.target, source_scope, to, reason, used.used_at
                ),
                source=used.source,
                predicate=used.predicate,
                target=used.target,
                from_scope=source_scope,
                to_scope=to,
                reason=reason,
                promoted_at=used.used_at,
                confidence=tally.confidence,
                learning_rate=rate.value,
                threshold=need,
                users=tally.users,
                teams=tally.teams,
            )
            return apply_promotion(st, event), [event]
    return StatementState(tallies={**st.tallies, to: tally}, promoted=st.promoted), []


def apply_promotion(state: StatementState | None, promoted: FactPromoted) -> StatementState:
    """The state after a promotion (by utilisation or by hand): the target's tally restarts and the
    statement no longer counts toward that scope."""
    st = state or StatementState()
    return StatementState(
        tallies={k: v for k, v in st.tallies.items() if k != promoted.to_scope},
        promoted=_union(st.promoted, promoted.to_scope),
    )


class PromotionFold:
    """Scope promotion over the log of ``FactUsed`` and ``FactPromoted`` (manual ones, and replayed ones).

    State is per statement, so the log may be partitioned by ``statement_key`` (each partition folded
    on its own, in offset order). A ``FactPromoted`` in the input only resets counters (promotions
    this fold emits are applied at once); its output is the new ``FactPromoted`` events, in order.
    """

    def __init__(self, states: Mapping[str, StatementState] | None = None) -> None:
        self.states: dict[str, StatementState] = dict(states or {})

    def apply(self, agents: Mapping[str, AgentSpec], batch: Sequence[FactUsed | FactPromoted]) -> list[FactPromoted]:
        out: list[FactPromoted] = []
        for item in batch:
            key = statement_key(item.source, item.predicate, item.target)
            if isinstance(item, FactPromoted):
                self.states[key] = apply_promotion(self.states.get(key), item)
                continue
            self.states[key], events = count_use(self.states.get(key), item, agents)
            out.extend(events)
        return out


class PromotionError(ValueError):
    """A manual promotion that cannot be made (no such active fact, or already in that scope)."""


def _matches(entity_id: str, given: str) -> bool:
    return entity_id == given or normalise_name(entity_name(entity_id)) == normalise_name(given)


def manual_promotions(
    agents: Mapping[str, AgentSpec],
    triples: Iterable[Any],
    source: str,
    predicate: str,
    target: str,
    to: str,
    at: datetime,
) -> list[FactPromoted]:
    """``somnus promote <source> <predicate> <target> --to team|global`` as events.

    ``triples`` are active rows of the triple log (dicts or ``Triple``); source and target may be given
    as entity ids or as names. ``--to team`` moves each agent-scoped copy to its owner's team (one event
    per team not holding it yet); ``--to global`` moves the widest copy (team before agent). ``at`` is
    the time of the command (it becomes event time)."""
    if to not in ("team", "global"):
        raise PromotionError(f"--to must be team or global, not {to!r}")

    def get(r: Any, k: str) -> Any:
        return r[k] if isinstance(r, Mapping) else getattr(r, k)

    pred = normalise_name(predicate).replace(" ", "_")
    copies = sorted(
        (str(get(r, "scope")), str(get(r, "source")), str(get(r, "target")), float(get(r, "confidence")))
        for r in triples
        if get(r, "valid_to") is None
        and get(r, "predicate") == pred
        and _matches(str(get(r, "source")), source)
        and _matches(str(get(r, "target")), target)
    )
    if not copies:
        raise PromotionError(f"no active fact {source!r} {predicate!r} {target!r}")
    held = {c[0] for c in copies}
    reason = PromotionReason.MANUAL
    moves: dict[str, tuple[str, str, str, float]] = {}
    if to == "team":
        for scope, s, t, conf in copies:
            dest = promotion_target(agents, scope) if scope.startswith("agent:") else None
            if dest is not None and dest not in held and dest not in moves:
                moves[dest] = (scope, s, t, conf)
        if not moves:
            raise PromotionError(
                f"{source!r} {predicate!r} {target!r}: no agent-scoped copy of an agent with a team "
                f"that is not already in its team (held in: {', '.join(sorted(held))})"
            )
    else:
        if GLOBAL_SCOPE in held:
            raise PromotionError(f"{source!r} {predicate!r} {target!r} is already global")
        teams_ = [c for c in copies if c[0].startswith("team:")]
        moves[GLOBAL_SCOPE] = (teams_ or copies)[0]
    return [
        FactPromoted(
            schema_version=BRIEFING_SCHEMA_VERSION,
            promotion_id=promotion_id(s, pred, t, scope, dest, reason, at),
            source=s,
            predicate=pred,
            target=t,
            from_scope=scope,
            to_scope=dest,
            reason=reason,
            promoted_at=at,
            confidence=min(max(conf, 0.0), 1.0),
        )
        for dest, (scope, s, t, conf) in sorted(moves.items())
    ]


def promoted_facts(promoted: FactPromoted) -> FactsExtracted:
    """The ``facts``-topic record that makes a promotion visible in the triple log: the statement
    asserted again in ``to_scope`` (by the owner of ``from_scope``, with the confidence it had), so the
    knowledge fold inserts it there. Entity ids are split at their first ":" into type and name (an
    entity type containing ":" would be split wrongly; the standard types and the extractor's do not)."""
    stype, sname = promoted.source.split(":", 1) if ":" in promoted.source else ("concept", promoted.source)
    ttype, tname = promoted.target.split(":", 1) if ":" in promoted.target else ("concept", promoted.target)
    owner = promoted.from_scope.split(":", 1)[1] if ":" in promoted.from_scope else "somnus"
    return FactsExtracted(
        schema_version=FACTS_SCHEMA_VERSION,
        episode_id=promoted.promotion_id,
        agent=owner or "somnus",
        observed_at=promoted.promoted_at,
        extractor=PROMOTION_EXTRACTOR,
        facts=[
            FactAsserted(
                source=sname,
                source_type=stype,
                predicate=promoted.predicate,
                target=tname,
                target_type=ttype,
                confidence=promoted.confidence,
                scope=promoted.to_scope,
            )
        ],
    )
