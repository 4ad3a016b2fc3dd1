"""Isolation by construction (issue 25 item 4): random fleets written through the projector's write
path, then every read route of ``ReadService`` read as every (agent, user) principal.

A fleet (hypothesis): teams (a lead and its reports, a report reading another team through
``knowledgeScopes``), users, sessions of each agent for a user or for none. Every agent has a
private tool whose name is a near-duplicate of every other agent's (``inventory_lookup_service_<a>``:
3-gram Jaccard > 0.9, so aliasing would merge them) and shares the tool ``search`` with everyone;
every session carries its own marker ``mk<agent><user>k`` (in the task, the user's words, the
private tool's arguments and error) and a shared-class error from ``search`` naming the host
``10.<agent>.<user>.77`` (one error class fleet-wide: its first example is what an entity keeps).

The records are built by the worker's own processors (distiller, memory units, working memory, trace
extractor, NAc) and applied with ``somnus.projections.writer.apply_batch`` to a DuckDB file; promotion runs
on the snapshot the projector would publish (``promotion_inputs``) for the global owner and every
agent's; briefings are rendered by the projector's cache.

What each principal may see:

- out of scope: any text of another agent (its private tool, its markers, its hosts). Nothing here
  is promoted to a team or global scope, so every agent's data is its own; only what the semantic
  memory derived (concepts, patterns: ``knowledge-context``) may come from an agent the reader
  shares a team scope with (``somnus.processors.briefing.generator.covers``: the issue's "scope chain covers every
  agent it was derived from"), since a team's patterns are the team's;
- cross user: a user-bound principal (agent A + user U: every route read with ``user_id`` = U, as
  the guard forces it) sees on no route another user's markers or hosts, only U's and user-less
  sessions'; what is derived from several users (``knowledge-context``, ``rhythms``,
  ``oscillators``, the briefing) it gets empty (SECURITY.md, "Reads for one user"). An agent
  principal (no user) reads ``recall``, ``episodic-context`` and ``context`` for no user (user-less
  sessions' text only); its other routes answer for the agent (an agent token reads all of its
  users, issue 25 item 3), so they are checked for scope only.

The echo of the query (``query``) is left out of the check; the routes named in the operator list
(``sql``, ``tools``, ``predict``, ``memory``, ``summary``, ...) are not agent-scoped by design.
"""

from __future__ import annotations

import json
import tempfile
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import duckdb
import msgspec
import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from somnus.processors.knowledge.extraction import TraceExtractor
from somnus.processors.prediction.causal_links import learn, observations_from_episode
from somnus.processors.sessions.batch import memory_units
from somnus.processors.sessions.distiller import distill
from somnus.processors.working.session_buffer import DEFAULT_SETTINGS, encode_state, remember
from somnus.projections import schema
from somnus.projections.api import ReadService
from somnus.projections.semantic import promotion_inputs
from somnus.projections.writer import ReadModels, Topics, apply_batch, load_offsets
from somnus.schemas.agents import AgentSpec, scope_chain
from somnus.schemas.codec import Rejection, decode_trace, encode
from somnus.schemas.memory import KIND_UNITS
from somnus.schemas.semantic import KIND_PROMOTE, CallOutcome, PromotionRequested
from tests.factories import Rec, SessionLog

TOPICS = Topics("traces", "episodes", "dead-letters", "facts", "link-updates", "memory", "working-memory", "semantic")
T0 = datetime(2024, 6, 3, 8, tzinfo=timezone.utc)
AGENT_CODES = "abcdef"
USER_CODES = "pqr"  # users up, uq, ur; "n" marks a session of no user


def agent_name(i: int) -> str:
    return f"ag{AGENT_CODES[i]}"


def private_tool(i: int) -> str:
    return f"inventory_lookup_service_{AGENT_CODES[i]}"


def marker(i: int, u: int | None) -> str:
    return f"mk{AGENT_CODES[i]}{'n' if u is None else USER_CODES[u]}k"


def host(i: int, u: int | None) -> str:
    return f"10.{i + 1}.{0 if u is None else u + 1}.77"


@st.composite
def fleets(draw: Any) -> dict[str, Any]:
    teams = draw(st.integers(1, 2))
    members = [draw(st.integers(0, 2)) for _ in range(teams)]
    agents: dict[str, AgentSpec] = {}
    for t in range(teams):
        lead = len(agents)
        agents[agent_name(lead)] = AgentSpec(name=agent_name(lead))
        for _ in range(members[t]):
            if len(agents) < len(AGENT_CODES):
                agents[agent_name(len(agents))] = AgentSpec(name=agent_name(len(agents)), reports_to=agent_name(lead))
    names = list(agents)
    if teams == 2 and draw(st.booleans()):  # a report of team 0 also reads team 1's scope
        reader = next((n for n in names if agents[n].reports_to == names[0]), None)
        other = next(n for n in names if agents[n].reports_to is None and n != names[0])
        if reader is not None:
            agents[reader] = AgentSpec(name=reader, reports_to=names[0], knowledge_scopes=[f"team:{other}"])
    n_users = draw(st.integers(1, 3))
    sessions = draw(
        st.lists(
            st.tuples(
                st.integers(0, len(names) - 1),
                st.one_of(st.none(), st.integers(0, n_users - 1)),
                st.integers(0, 5),
                st.booleans(),
                st.booleans(),
                st.booleans(),
            ),
            min_size=len(names),
            max_size=14,
        )
    )
    # every agent has at least one ended session with both tools failing (so each writes knowledge)
    sessions += [(i, None if i % 2 else 0, 6, True, True, True) for i in range(len(names))]
    return {"agents": agents, "users": n_users, "sessions": sessions}


def session_events(
    n: int, i: int, u: int | None, day: int, private_fails: bool, search_fails: bool, ends: bool
) -> list[dict[str, Any]]:
    agent, mk = agent_name(i), marker(i, u)
    sid = f"s{n}-{mk}"
    t = T0 + timedelta(days=day, minutes=7 * n)
    log = SessionLog(sid, t, agent, step_s=20)
    add = log.add

    start: dict[str, Any] = {"task": f"review order {mk} stock", "metadata": {"mode": "conversation"}}
    if u is not None:
        start["user_id"] = f"u{USER_CODES[u]}"
    add("session_start", start)
    add("user_message", {"text": f"My name is {mk.capitalize()} and my code word is {mk}. I prefer {mk} tea."})
    add("tool_call", {"tool": private_tool(i), "call_id": "c1", "args": {"sku": mk}})
    add(
        "tool_result",
        {
            "call_id": "c1",
            "tool": private_tool(i),
            "ok": not private_fails,
            **({"error": f"timeout reaching {mk}.corp.example"} if private_fails else {"output": f"stock of {mk}: 4"}),
        },
    )
    add("tool_call", {"tool": "search", "call_id": "c2", "args": {"q": "order status"}})
    add(
        "tool_result",
        {
            "call_id": "c2",
            "tool": "search",
            "ok": not search_fails,
            **({"error": f"upstream 503 from {host(i, u)}"} if search_fails else {"output": "found"}),
        },
    )
    add("agent_message", {"text": f"Done with {mk}, see you."})
    if ends:
        add("session_end", {"outcome": "failure" if private_fails or search_fails else "success"})
    return log.events


def project(con: duckdb.DuckDBPyConnection, fleet: dict[str, Any]) -> ReadModels:
    return project_events(
        con, fleet["agents"], [e for n, s in enumerate(fleet["sessions"]) for e in session_events(n, *s)]
    )


def decode_events(raw: list[dict[str, Any]]) -> list[Any]:
    """The trace events the worker accepts (it dead-letters the others)."""
    decoded = [decode_trace(orjson.dumps(e), 1 << 20) for e in raw]
    return [e for e in decoded if not isinstance(e, Rejection)]


def worker_records(raw: list[dict[str, Any]], base: int = 0) -> list[Rec]:
    """What the worker would publish for these trace events (its own processors), at offsets from ``base``:
    episodes, facts, memory units, working memory and causal-link updates."""
    events = decode_events(raw)
    episodes = distill({}, events).episodes
    units = memory_units({}, events, episodes, frozenset())
    working = remember({}, events, DEFAULT_SETTINGS).states
    facts = TraceExtractor().extract(episodes)
    obs = [o for n, ep in enumerate(episodes) for o in observations_from_episode(ep, 0, n)]
    _, updates = learn({}, obs, per_link_rows=False)
    stamp = int(max(e.ts for e in events).timestamp() * 1000)
    out = [Rec("episodes", 0, base + n, encode(ep)) for n, ep in enumerate(episodes)]
    out += [Rec("facts", 0, base + n, encode(f)) for n, f in enumerate(facts)]
    out += [
        Rec("memory", 0, base + n, encode(units[j : j + 50]), headers=[("somnus-kind", KIND_UNITS)], timestamp=stamp)
        for n, j in enumerate(range(0, len(units), 50))
    ]
    out += [
        Rec("working-memory", 0, base + n, encode_state(wm), key=k.encode())
        for n, (k, wm) in enumerate(working.items())
    ]
    out.append(Rec("link-updates", 0, base, msgspec.json.encode(updates)))
    return out


def project_events(
    con: duckdb.DuckDBPyConnection,
    agents: dict[str, AgentSpec],
    raw: list[dict[str, Any]],
    oscillators: Any = None,
    extra: list[Rec] | None = None,
) -> ReadModels:
    """Trace events (JSON objects) through the worker's processors and the projector's write path (with
    ``extra`` records after them, and the oscillators on when given their config); then promotion for
    the global owner and every agent's, and the briefings rendered."""
    records = worker_records(raw) + list(extra or [])
    last = max(e.ts for e in decode_events(raw))
    seen = ReadModels(con, agents, oscillators=oscillators)
    apply_batch(con, TOPICS, records, load_offsets(con), 1 << 20, seen)
    owners = ["global", *(f"agent:{a}" for a in agents)]
    promote = [
        Rec(
            "semantic",
            0,
            n,
            encode(
                msgspec.structs.replace(
                    promotion_inputs(con, owner=o, min_observations=1, min_confidence=0.0), at=last + timedelta(days=1)
                )
            ),
            key=o.encode(),
            headers=[("somnus-kind", KIND_PROMOTE)],
        )
        for n, o in enumerate(owners)
    ]
    apply_batch(con, TOPICS, promote, load_offsets(con), 1 << 20, seen)
    seen.briefings.refresh(con)
    return seen


def reads(svc: ReadService, agent: str, user: str | None, query: str, entities: list[str]) -> dict[str, Any]:
    """Every agent-facing read route of the service, as (agent, user): a user-bound principal reads
    each with ``user_id`` (the guard forces it); an agent principal without (``context`` with
    ``user_id`` None). The rendered briefing of an agent principal has a test of its own below."""
    mine: dict[str, Any] = {"user_id": user} if user is not None else {}
    got: dict[str, Any] = {
        "facts": svc.facts(agent, limit=500, **mine),
        "entities": svc.entities(agent, limit=500, **mine),
        "history": [svc.history(agent, entity=e, **mine) for e in entities],
        "recall": svc.recall(agent, query=query, k=50, record=False, **mine),
        "episodic_context": svc.episodic_context(agent, query=query, top_k=20, token_budget=100_000, **mine),
        "knowledge_context": svc.knowledge_context(agent, query=query, limit=100, **mine),
        "context": svc.context(agent, query=query, user_id=user, max_tokens=100_000),
        "rhythms": svc.rhythms(agent, **mine),
        "oscillators": svc.oscillators(agent, **mine),
        "advise": svc.advise(agent, task=query, **mine),
        "goals": svc.goals(agent, all=True, **mine),
        "wander": svc.wander(agent, steps=100, **mine),
    }
    if user is not None:
        got["briefing"] = svc.briefing(agent, **mine)
        got["inject"] = svc.inject(agent, prompt="P", **mine)
    for route in ("recall", "episodic_context", "context"):
        got[route].pop("query", None)  # the reader's own query, echoed
    got["advise"].pop("task")  # the same, as the task
    return got


def text_of(value: Any) -> str:
    return json.dumps(value, default=str, ensure_ascii=False)


def foreign(text: str, tokens: dict[str, set[str]], allowed: set[str]) -> list[str]:
    return sorted(tok for owner, toks in tokens.items() if owner not in allowed for tok in toks if tok in text)


def team_of(agents: dict[str, AgentSpec], reader: str) -> set[str]:
    """The reader and every agent it shares a scope narrower than global with."""
    mine = set(scope_chain(agents, reader)) - {"global"}
    return {a for a in agents if a == reader or mine & (set(scope_chain(agents, a)) - {"global"})}


DERIVED_ROUTES = ("knowledge_context",)  # what semantic memory derived: a team's is the team's
USER_READS = (
    "context",
    "recall",
    "episodic_context",
    "wander",
    "goals",
)  # the routes an agent principal reads for no user
WITHHELD_ROUTES = ("knowledge_context", "rhythms", "oscillators")  # derived from several users: [] for one


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(fleets())
def test_no_principal_reads_another_agents_or_another_users_text(fleet):
    agents: dict[str, AgentSpec] = fleet["agents"]
    names = list(agents)
    users: list[int | None] = [None, *range(fleet["users"])]
    # what each agent's data, and each (agent, user)'s, would show
    by_agent = {
        agent_name(i): {private_tool(i)} | {marker(i, u) for u in users} | {host(i, u) for u in users}
        for i in range(len(names))
    }
    by_user = {(agent_name(i), u): {marker(i, u), host(i, u)} for i in range(len(names)) for u in users}
    query = " ".join(
        [
            "inventory lookup service search timeout upstream order stock code word tea",
            *(private_tool(i) for i in range(len(names))),
            *(f"{marker(i, u)} {host(i, u)}" for i in range(len(names)) for u in users),
        ]
    )
    with tempfile.TemporaryDirectory() as tmp:
        con = duckdb.connect(str(Path(tmp) / "fleet.duckdb"))
        schema.init(con)
        seen = project(con, fleet)
        svc = ReadService(
            con=con, agents=agents, episodic=seen.memory, semantic=seen.semantic, top_facts=seen.top_facts
        )
        entities = [e for (e,) in con.execute("SELECT entity_id FROM entities ORDER BY entity_id").fetchall()]
        shown_own = 0
        shown_by_route: dict[str, int] = {}
        for agent in names:
            for u in users:
                user = None if u is None else f"u{USER_CODES[u]}"
                got = reads(svc, agent, user, query, entities)
                for route, value in got.items():
                    text = text_of(value)
                    allowed = team_of(agents, agent) if route in DERIVED_ROUTES else {agent}
                    assert not foreign(text, by_agent, allowed), (agent, user, route, foreign(text, by_agent, allowed))
                    if route in USER_READS or user is not None:
                        reader_user = u if route == "context" or user is not None else None
                        mine = {(agent, reader_user), (agent, None)}
                        leak = foreign(
                            text, {f"{a}/{v}": toks for (a, v), toks in by_user.items()}, {f"{a}/{v}" for a, v in mine}
                        )
                        assert not leak, (agent, user, route, leak)
                    if user is not None:
                        own = marker(names.index(agent), u) in text
                        shown_by_route[route] = shown_by_route.get(route, 0) + own
                i = names.index(agent)
                facts = text_of(got["facts"])
                if user is None:
                    assert private_tool(i) in facts, (agent, "its own private tool is in its facts")
                else:  # what is derived from several users is withheld, with the reason
                    assert all(got[r] == [] for r in WITHHELD_ROUTES), (agent, user)
                    assert got["advise"]["withheld"] and got["advise"]["risks"] == got["advise"]["planning"] == []
                    assert got["briefing"]["briefing"] is None and got["briefing"]["withheld"]
                    assert got["inject"]["prompt"] == "P" and got["inject"]["briefing_id"] is None
                shown_own += marker(i, u) in got["context"]["text"]
        assert shown_own > 0  # the reads are not empty: principals do see their own users' text
        # ... and a user-bound principal finds its own user's text in its memories and its facts
        assert shown_by_route.get("recall", 0) > 0 and shown_by_route.get("facts", 0) > 0, shown_by_route


def test_a_pattern_and_its_concept_reach_only_readers_covering_their_agents(tmp_path):
    """A trend the statistician confirms in the global memory from agb's calls of its private tool
    (and the concept it becomes) is served to agb, not to aga of another team."""
    agents = {"aga": AgentSpec(name="aga"), "agb": AgentSpec(name="agb")}
    fleet = {
        "agents": agents,
        "users": 1,
        "sessions": [(i, None, d, False, False, True) for i in (0, 1) for d in (0, 1)],
    }
    con = duckdb.connect(str(tmp_path / "fleet.duckdb"))
    schema.init(con)
    seen = project(con, fleet)
    calls = [
        CallOutcome(
            private_tool(1), ok=k < 10 - 2 * d, at=T0 + timedelta(days=d, hours=k), episode_id=f"e{d}-{k}", agent="agb"
        )
        for d in range(6)
        for k in range(10)
    ]
    req = PromotionRequested(owner="global", at=T0 + timedelta(days=7), calls=calls)
    apply_batch(
        con,
        TOPICS,
        [Rec("semantic", 0, 100, encode(req), key=b"global", headers=[("somnus-kind", KIND_PROMOTE)])],
        load_offsets(con),
        1 << 20,
        seen,
    )
    svc = ReadService(con=con, agents=agents, episodic=seen.memory, semantic=seen.semantic, top_facts=seen.top_facts)
    names = {a: [e["name"] for e in svc.knowledge_context(a, limit=100)] for a in agents}
    assert f"stat:tool:{private_tool(1)}:success" in names["agb"]
    assert f"{private_tool(1)}_success_declining" in names["agb"]
    assert not [n for n in names["aga"] if private_tool(1) in n], names["aga"]


def test_the_rendered_briefing_shows_no_other_agents_text(tmp_path):
    """``briefing`` and ``inject`` (the rendered briefing, processors/briefing/generator.py) for a two-agent
    fleet of separate teams: neither briefing names the other's private tool or markers. Promotion
    for an agent owner reads that agent's data alone (``somnus.projections.semantic.promotion_inputs``), and
    Key Knowledge checks the provenance of every item, the agent's own memory's too."""
    agents = {"aga": AgentSpec(name="aga"), "agb": AgentSpec(name="agb")}
    fleet = {
        "agents": agents,
        "users": 1,
        "sessions": [(i, u, d, True, True, True) for i in (0, 1) for u in (None, 0) for d in range(3)],
    }
    con = duckdb.connect(str(tmp_path / "fleet.duckdb"))
    schema.init(con)
    svc = ReadService(con=con, agents=agents, briefings=project(con, fleet).briefings.current)
    for i, agent in enumerate(agents):
        other = 1 - i
        for text in (text_of(svc.briefing(agent)), svc.inject(agent, prompt="P")["prompt"]):
            assert private_tool(i) in text  # its own knowledge is there
            leaked = [tok for tok in (private_tool(other), marker(other, None), marker(other, 0)) if tok in text]
            assert not leaked, (agent, leaked)


def test_the_property_test_reads_every_agent_route():
    """A route added under ``/agents/{agent}`` must be read by ``reads`` above (or this fails): the
    property test is only as good as the routes it reads."""
    from somnus.projections.api import all_routes
    from somnus.projections.auth import whole_store

    read = {
        "facts",
        "entities",
        "history",
        "recall",
        "episodic_context",
        "knowledge_context",
        "context",
        "rhythms",
        "oscillators",
        "advise",
        "briefing",
        "inject",
        "goals",
        "wander",
    }
    assert {r.handler for r in all_routes() if not whole_store(r)} == read


def test_context_naming_another_users_session_reads_nothing_of_it(tmp_path):
    """Issue 25, 2026-11-27: ``context``'s ``session_id`` read that session's working memory whatever its
    user; its text was then filtered, but the answer named the session (and counted it filtered): a
    reader for one user learnt whether another user's session id exists. Now the session is read only
    when it is the reader's user's or of no user."""
    agents = {agent_name(0): AgentSpec(name=agent_name(0))}
    fleet = {"agents": agents, "users": 2, "sessions": [(0, 0, 1, True, True, True), (0, 1, 1, True, True, True)]}
    con = duckdb.connect(str(tmp_path / "fleet.duckdb"))
    schema.init(con)
    seen = project(con, fleet)
    svc = ReadService(con=con, agents=agents, episodic=seen.memory, semantic=seen.semantic, top_facts=seen.top_facts)
    sessions = dict(con.execute("SELECT user_id, session_id FROM working_memory WHERE user_id IS NOT NULL").fetchall())
    assert set(sessions) == {"up", "uq"}
    for reader, other in (("up", "uq"), ("uq", "up")):
        theirs = svc.context(agent_name(0), query="order stock", user_id=reader, session_id=sessions[other])
        assert theirs["session_id"] is None and theirs["filtered"] == 0 and theirs["recent"] == [], theirs
        own = svc.context(agent_name(0), query="order stock", user_id=reader, session_id=sessions[reader])
        assert own["session_id"] == sessions[reader] and own["recent"], own
    con.close()
