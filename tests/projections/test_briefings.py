"""The briefing cache kept by the projector (real DuckDB file; records built here, no broker)."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone

import duckdb
import orjson
import pytest

from somnus.processors.knowledge.extraction import TraceExtractor, error_class
from somnus.processors.sessions.distiller import distill
from somnus.projections import api, queries, schema
from somnus.projections.writer import ReadModels, Topics, apply_batch, load_offsets
from somnus.sample import generate
from somnus.schemas.agents import load_agents
from somnus.schemas.codec import decode_trace, encode
from somnus.schemas.facts import FactAsserted, FactsExtracted
from tests.factories import Rec, SessionLog

TOPICS = Topics("traces", "episodes", "dead-letters", "facts")
AGENTS = load_agents()  # the built-in fleet: research-lead <- researcher, scraper; ops-lead <- deployer, support


@pytest.fixture(scope="module")
def records() -> list[Rec]:
    events = [decode_trace(orjson.dumps(e), 1 << 20) for e in generate(sessions=120, seed=4)]
    episodes = distill({}, events).episodes
    extracted = TraceExtractor().extract(episodes)
    eps = [Rec("episodes", 0, i, encode(ep)) for i, ep in enumerate(episodes)]
    facts = [Rec("facts", 0, i, encode(f)) for i, f in enumerate(extracted)]
    # interleave as the projector would read two topics
    out = []
    for i in range(max(len(eps), len(facts))):
        out += eps[i : i + 1] + facts[i : i + 1]
    return out


def _db(tmp_path, name):
    con = duckdb.connect(str(tmp_path / name))
    schema.init(con)
    return con


def _project(con, chunks, restart_each_batch=False, refresh_every=1):
    """Apply the chunks as batches; render stale briefings after every ``refresh_every`` batches and at the end."""
    seen = ReadModels(con, AGENTS)
    rendered = []
    for i, chunk in enumerate(chunks):
        if restart_each_batch:
            seen = ReadModels(con, AGENTS)
        apply_batch(con, TOPICS, chunk, load_offsets(con), 1 << 20, seen)
        if (i + 1) % refresh_every == 0:
            rendered.append(seen.briefings.refresh(con))
    rendered.append(seen.briefings.refresh(con))
    return seen, rendered


def test_every_agent_with_episodes_gets_a_briefing_with_its_lessons(tmp_path, records):
    con = _db(tmp_path, "a.duckdb")
    seen, _ = _project(con, [records])
    rows = dict(con.execute("SELECT agent, markdown FROM briefings").fetchall())
    agents_with_episodes = {a for (a,) in con.execute("SELECT DISTINCT agent FROM episodes").fetchall()}
    assert set(rows) == agents_with_episodes
    for agent, md in rows.items():
        assert md.startswith(f"## Session Briefing for {agent}\n")
        classes = {
            (tool, error_class(error))
            for tool, error in con.execute(
                "SELECT tool, error FROM lessons WHERE agent = ? AND tool IS NOT NULL", [agent]
            ).fetchall()
        }
        shown = [line for line in md.split("### Key Knowledge")[0].splitlines() if line.startswith("- [")]
        if classes:
            assert shown, agent
        named = [{c[1] for c in classes if f": {c[1]}" in line and c[0] in line.split(": ")[0]} for line in shown]
        tool_lines = [c for n in named for c in n]
        assert len(tool_lines) == len(set(tool_lines))  # no two lines share an error class
        assert len(md) <= AGENTS[agent].briefing_token_budget
    assert {a: b.markdown for a, b in seen.briefings.current.items()} == rows  # cache in step with the table


def test_default_fleet_briefings_serve_own_facts_and_strategies(tmp_path, records):
    """Issue 26: facts=[] in every default-fleet briefing and "Active Strategies" always empty."""
    con = _db(tmp_path, "own.duckdb")
    seen, _ = _project(con, [records])
    for agent, b in seen.briefings.current.items():
        own = con.execute(
            "SELECT count(*) FROM triples WHERE scope = ? AND predicate <> 'uses' AND valid_to IS NULL",
            [f"agent:{agent}"],
        ).fetchone()[0]
        if own:
            assert any(f.scope == f"agent:{agent}" for f in b.facts), (agent, b.markdown)
        repeated = con.execute(
            "SELECT count(*) FROM (SELECT tools FROM episodes WHERE agent = ? AND outcome = 'success' "
            "AND len(tools) > 0 GROUP BY tools HAVING count(*) >= 2)",
            [agent],
        ).fetchone()[0]
        if repeated:
            assert b.strategies >= 1 and "### Active Strategies" in b.markdown, (agent, b.markdown)
    assert any(b.strategies for b in seen.briefings.current.values())


def test_the_final_briefings_do_not_depend_on_batching_or_restarts(tmp_path, records):
    one = _db(tmp_path, "one.duckdb")
    _project(one, [records])
    many = _db(tmp_path, "many.duckdb")
    r = records
    _project(many, [r[:3], r[3:40], r[40:41], r[41:150], r[150:]], restart_each_batch=True)
    bursty = _db(tmp_path, "bursty.duckdb")  # rendering deferred over several batches
    _project(bursty, [r[:3], r[3:40], r[40:41], r[41:150], r[150:]], refresh_every=3)
    assert queries.table_checksums(one)["briefings"] == queries.table_checksums(many)["briefings"]
    assert queries.table_checksums(one)["briefings"] == queries.table_checksums(bursty)["briefings"]
    assert one.execute("SELECT count(*) FROM briefings_dirty").fetchone()[0] == 0


def _minor_fact(agent: str, n: int) -> Rec:
    """A low-confidence fact of ``agent``'s own scope, dated long before its other inputs."""
    fx = FactsExtracted(
        schema_version=1,
        episode_id=uuid.UUID(int=20_000 + n),
        agent=agent,
        observed_at=datetime(2001, 1, 1, tzinfo=timezone.utc),
        extractor="test/1",
        facts=[
            FactAsserted(
                source="minor.example.com",
                source_type="api",
                predicate="mirror",
                target=f"m{n}.example.com",
                target_type="host",
                confidence=0.3,
            )
        ],
    )
    return Rec("facts", 0, 200_000 + n, encode(fx))


def test_a_briefing_whose_counts_change_but_not_its_text_is_rewritten(tmp_path, records):
    # Facts past the fact lines' cap change only the briefing's dropped_facts: the text and its as-of
    # time stay. That row must still be rewritten, or the table keeps the count of whichever render
    # came last with a different text, which depends on when the briefings were rendered (a replay
    # of the same topics then differed from the live file).
    extra = [_minor_fact("scraper", n) for n in range(30)]
    one = _db(tmp_path, "one.duckdb")
    _project(one, [records + extra])
    two = _db(tmp_path, "two.duckdb")
    _project(two, [records + extra[:-1], extra[-1:]])
    assert queries.table_checksums(one)["briefings"] == queries.table_checksums(two)["briefings"]
    dropped = "SELECT markdown, dropped_facts FROM briefings WHERE agent = 'scraper'"
    (md_one, dropped_one), (md_two, dropped_two) = one.execute(dropped).fetchone(), two.execute(dropped).fetchone()
    assert md_one == md_two and dropped_one == dropped_two > 0


def _facts(agent: str, scope: str | None, n: int, at: datetime) -> Rec:
    """A rate-limit fact stated by many calls (count 500: a fact seen once in a hundred sessions would
    not concern the next one, ``somnus.processors.briefing.generator.fact_relevance``)."""
    fx = FactsExtracted(
        schema_version=1,
        episode_id=uuid.UUID(int=10_000 + n),
        agent=agent,
        observed_at=at,
        extractor="test/1",
        facts=[
            FactAsserted(
                source="api.example.com",
                source_type="api",
                predicate="rate_limit",
                target="10/s",
                target_type="rate",
                confidence=0.95,
                scope=scope,
                count=500,
            )
        ],
    )
    return Rec("facts", 0, 100_000 + n, encode(fx))


def _host_fact(agent: str, scope: str | None, n: int, at: datetime, host: str) -> Rec:
    fx = FactsExtracted(
        schema_version=1,
        episode_id=uuid.UUID(int=30_000 + n),
        agent=agent,
        observed_at=at,
        extractor="test/1",
        facts=[
            FactAsserted(
                source=host,
                source_type="api",
                predicate="requires",
                target="x-api-key",
                target_type="header",
                confidence=0.9,
                scope=scope,
            )
        ],
    )
    return Rec("facts", 0, 300_000 + n, encode(fx))


def test_a_team_fact_reaches_teammates_and_not_other_teams_and_unaffected_agents_are_skipped(tmp_path, records):
    con = _db(tmp_path, "t.duckdb")
    seen, _ = _project(con, [records])
    before = dict(con.execute("SELECT agent, briefing_id FROM briefings").fetchall())
    at = datetime(2030, 1, 1, tzinfo=timezone.utc)
    # scraper's private fact: only scraper's briefing is stale, and only it changes
    _project_with(con, seen, [_facts("scraper", None, 1, at)])
    assert con.execute("SELECT agent FROM briefings_dirty").fetchall() == [("scraper",)]
    assert [b.agent for b in seen.briefings.refresh(con)] == ["scraper"]
    # the same fact in the research team's scope: researcher and scraper (team members) are stale;
    # the fact concerns an API only scraper has called, so researcher's briefing does not show it
    _project_with(con, seen, [_facts("scraper", "team:research-lead", 2, at)])
    assert sorted(a for (a,) in con.execute("SELECT agent FROM briefings_dirty").fetchall()) == [
        "researcher",
        "scraper",
    ]
    seen.briefings.refresh(con)
    md = dict(con.execute("SELECT agent, markdown FROM briefings").fetchall())
    assert "api.example.com rate_limit 10/s" in md["scraper"] and "api.example.com" not in md["researcher"]
    # a team fact about an API researcher calls itself does reach it
    [(host,)] = con.execute(
        "SELECT target FROM triples WHERE scope = 'agent:researcher' AND predicate = 'calls' "
        "ORDER BY count DESC, target LIMIT 1"
    ).fetchall()
    _project_with(con, seen, [_host_fact("scraper", "team:research-lead", 3, at, host.removeprefix("api:"))])
    seen.briefings.refresh(con)
    md = dict(con.execute("SELECT agent, markdown FROM briefings").fetchall())
    line = f"{host.removeprefix('api:')} requires x-api-key"
    assert line in md["researcher"]
    for other in ("deployer", "support", "ops-lead"):
        if other in md:
            assert "api.example.com" not in md[other] and line not in md[other]
            assert (
                md[other] is not None
                and before[other]
                == con.execute("SELECT briefing_id FROM briefings WHERE agent = ?", [other]).fetchone()[0]
            )


def _project_with(con, seen, chunk):
    return apply_batch(con, TOPICS, chunk, load_offsets(con), 1 << 20, seen)


def test_inject_fences_the_cached_briefing_and_leaves_prompts_of_agents_without_one_alone(tmp_path, records):
    con = _db(tmp_path, "i.duckdb")
    seen, _ = _project(con, [records])
    live = api.ReadService(con, AGENTS, briefings=seen.briefings.current)
    cold = api.ReadService(con, AGENTS)  # as a reader with the file opened directly
    agent = next(iter(seen.briefings.current))
    for service in (live, cold):
        out = service.inject(agent, prompt="You are helpful.")
        assert out["prompt"].startswith("⟦BEGIN PRIOR EXPERIENCE ") and out["prompt"].endswith("\nYou are helpful.")
        assert out["briefing_id"] == seen.briefings.current[agent].briefing_id
        assert service.inject("nobody", prompt="P")["prompt"] == "P"
        assert service.briefing("nobody") == {"agent": "nobody", "briefing": None}
    assert live.briefing(agent) == cold.briefing(agent)
    with pytest.raises(api.BadRequest, match="prompt"):
        live.inject(agent)


def test_a_budgeted_refresh_renders_an_agents_own_news_before_a_wide_change_backlog(tmp_path, records):
    con = _db(tmp_path, "b.duckdb")
    seen, _ = _project(con, [records])
    at = datetime(2030, 1, 1, tzinfo=timezone.utc)
    # a global fact makes every known agent stale; then scraper's own fact makes scraper urgent
    _project_with(con, seen, [_facts("researcher", "global", 3, at)])
    everyone = sorted(a for (a,) in con.execute("SELECT agent FROM briefings_dirty").fetchall())
    assert len(everyone) >= 4 and "scraper" in everyone and not seen.briefings.urgent
    _project_with(con, seen, [_facts("scraper", None, 4, at)])
    assert seen.briefings.urgent == {"scraper"}
    # after a batch the projector renders only the agents with news of their own
    snapshot = seen.briefings.urgent.copy()
    assert [b.agent for b in seen.briefings.refresh(con, urgent_only=True)] == ["scraper"]
    assert not seen.briefings.urgent and seen.briefings.refresh(con, urgent_only=True) == []
    assert sorted(a for (a,) in con.execute("SELECT agent FROM briefings_dirty").fetchall()) == [
        a for a in everyone if a != "scraper"
    ]
    # (again from the same state, with a budget instead)
    _project_with(con, seen, [_facts("scraper", None, 5, at)])
    assert seen.briefings.urgent == snapshot
    # a zero budget renders one chunk: with a chunk of one agent, that is scraper, not the first by name
    import somnus.projections.briefings as pb

    chunk, pb.REFRESH_CHUNK = pb.REFRESH_CHUNK, 1
    try:
        done = seen.briefings.refresh(con, budget_s=0.0)
    finally:
        pb.REFRESH_CHUNK = chunk
    assert [b.agent for b in done] == ["scraper"] and not seen.briefings.urgent
    left = sorted(a for (a,) in con.execute("SELECT agent FROM briefings_dirty").fetchall())
    assert left == [a for a in everyone if a != "scraper"]
    # the rest follows (an unbudgeted refresh renders all), and the result equals rendering at once
    seen.briefings.refresh(con)
    assert con.execute("SELECT count(*) FROM briefings_dirty").fetchone()[0] == 0
    ref = _db(tmp_path, "ref.duckdb")
    ref_seen, _ = _project(ref, [records])
    _project_with(ref, ref_seen, [_facts("researcher", "global", 3, at)])
    _project_with(ref, ref_seen, [_facts("scraper", None, 4, at)])
    _project_with(ref, ref_seen, [_facts("scraper", None, 5, at)])
    ref_seen.briefings.refresh(ref)
    assert queries.table_checksums(con)["briefings"] == queries.table_checksums(ref)["briefings"]


@pytest.mark.parametrize("max_episodes", [0, 2, 50])
def test_recent_inputs_fed_batch_by_batch_equal_the_newest_rows_of_the_tables(tmp_path, records, max_episodes):
    """The in-memory rows a briefing is rendered from are what the tables' windows give (limits from
    ``maxEpisodes``: 4x lessons, 1x episodes, 1x successful episodes), however the batches fell."""
    import msgspec

    from somnus.projections.briefings import RecentInputs

    fleet = {
        a: msgspec.structs.replace(s, max_episodes=max_episodes) if a == "researcher" else s for a, s in AGENTS.items()
    }
    con = _db(tmp_path, "r.duckdb")
    seen = ReadModels(con, fleet)
    for i in range(0, len(records), 17):
        apply_batch(con, TOPICS, records[i : i + 17], load_offsets(con), 1 << 20, seen)
    fed, loaded = seen.briefings.recent, RecentInputs(con, fleet)
    assert fed.lessons == loaded.lessons and fed.episodes == loaded.episodes and fed.successes == loaded.successes
    assert fed.episode_agent == loaded.episode_agent
    # ... and those are the tables' newest rows, in their order
    lessons = con.execute(
        "SELECT kind, text FROM lessons WHERE agent = 'researcher' ORDER BY learned_at DESC, episode_id, idx"
    ).fetchall()
    assert [(r["kind"], r["text"]) for r in fed.lessons.get("researcher", [])] == lessons[: 4 * max_episodes]
    wins = con.execute(
        "SELECT ended_at FROM episodes WHERE agent = 'researcher' AND outcome = 'success' "
        "ORDER BY ended_at DESC, episode_id"
    ).fetchall()
    assert [r["ended_at"] for r in fed.successes.get("researcher", [])] == [t for (t,) in wins][:max_episodes]
    every = con.execute(
        "SELECT ended_at FROM episodes WHERE agent = 'researcher' ORDER BY ended_at DESC, episode_id"
    ).fetchall()
    assert [r["ended_at"] for r in fed.episodes.get("researcher", [])] == [t for (t,) in every][:max_episodes]
    assert max_episodes == 0 or len(lessons) > 4 * 2 and len(wins) > 2  # the limit of 2 does cut
    other = con.execute("SELECT count(*) FROM lessons WHERE agent = 'scraper'").fetchone()[0]
    assert len(fed.lessons["scraper"]) == min(other, 200)


# ---- two unrelated agents' data ---------------------------------------------------------------

BILLING_TOOLS = ("lookup_invoice", "charge_card", "send_receipt")


def _billing_events(sessions: int = 40, agent: str = "billing") -> list[dict]:
    """A synthetic billing agent, unrelated to airline support: its own tools, errors and tasks."""
    out = []
    start = datetime(2024, 5, 15, 20, 0, tzinfo=timezone.utc)
    for n in range(sessions):
        sid = f"{agent}-{n}"
        t = start + timedelta(minutes=10 * n + 3)
        log = SessionLog(sid, t, agent, step_s=5)
        add = log.add

        add("session_start", {"task": f"Collect the overdue invoice INV-{1000 + n} for customer cus_{n:04d}"})
        for k, tool in enumerate(BILLING_TOOLS):
            add("tool_call", {"tool": tool, "call_id": f"c{k}", "args": {"invoice": f"INV-{1000 + n}"}})
            if tool == "charge_card" and n % 3 == 0:
                add(
                    "tool_result",
                    {
                        "call_id": f"c{k}",
                        "tool": tool,
                        "ok": False,
                        "error": f"card declined for customer cus_{n:04d} (code 51)",
                    },
                )
                break
            add("tool_result", {"call_id": f"c{k}", "tool": tool, "ok": True, "output": "ok"})
        add("session_end", {"outcome": "failure" if n % 3 == 0 else "success"})
        out += log.events
    return out


def test_no_briefing_line_of_one_agent_comes_from_an_unrelated_agents_data(tmp_path, tau_bench_path):
    """Issue 26: airline (tau-bench) and billing share nothing; after the NAc, the statistician and a
    global promotion ran over both, neither briefing holds a line from the other's data."""
    import msgspec

    from somnus.importers import openai_chat
    from somnus.processors.prediction.causal_links import learn, observations_from_episode
    from somnus.projections.semantic import promotion_inputs
    from somnus.schemas.semantic import KIND_PROMOTE

    topics = Topics("traces", "episodes", "dead-letters", "facts", link_updates="link-updates", semantic="semantic")
    raw = list(openai_chat(tau_bench_path, agent="airline")) + _billing_events()
    events = sorted((decode_trace(orjson.dumps(e), 1 << 22) for e in raw), key=lambda e: (e.ts, e.agent, e.seq))
    episodes = sorted(distill({}, events).episodes, key=lambda ep: (ep.ended_at, ep.agent))
    extracted = TraceExtractor().extract(episodes)
    obs = [o for i, ep in enumerate(episodes) for o in observations_from_episode(ep, 0, i)]
    _, updates = learn({}, obs)
    recs = [Rec("episodes", 0, i, encode(ep)) for i, ep in enumerate(episodes)]
    recs += [Rec("facts", 0, i, encode(f)) for i, f in enumerate(extracted)]
    recs += [Rec("link-updates", 0, i // 500, encode(updates[i : i + 500])) for i in range(0, len(updates), 500)]
    con = _db(tmp_path, "two.duckdb")
    seen = ReadModels(con, AGENTS)
    apply_batch(con, topics, recs, load_offsets(con), 1 << 24, seen)
    at = max(ep.ended_at for ep in episodes)
    req = msgspec.structs.replace(promotion_inputs(con, "global"), at=at, request_id="test:global")
    apply_batch(
        con,
        topics,
        [Rec("semantic", 0, 0, encode(req), headers=[("somnus-kind", KIND_PROMOTE)])],
        load_offsets(con),
        1 << 24,
        seen,
    )
    seen.briefings.refresh(con)
    glob = seen.semantic.layers.get("global")
    assert glob is not None and len(glob.atl) > 0, "the global promotion learnt something from the two datasets"

    airline, billing = seen.briefings.current["airline"], seen.briefings.current["billing"]
    airline_words = {
        r[0] for r in con.execute("SELECT DISTINCT unnest(tools) FROM episodes WHERE agent = 'airline'").fetchall()
    }
    airline_words |= {
        error_class(e).split(" <")[0]
        for (e,) in con.execute("SELECT error FROM lessons WHERE agent = 'airline' AND error IS NOT NULL").fetchall()
    }
    assert {"book_reservation", "update_reservation_flights"} <= airline_words
    for line in billing.markdown.splitlines():
        assert not any(w in line for w in airline_words), line
    for line in airline.markdown.splitlines():
        assert not any(w in line for w in (*BILLING_TOOLS, "card declined", "invoice")), line
    # each still has its own: lessons, own facts, a strategy, and the global concepts about its own tools
    assert billing.lessons and billing.facts and billing.strategies and "charge_card: card declined" in billing.markdown
    assert airline.lessons and any(f.scope == "agent:airline" for f in airline.facts) and airline.strategies
    shown = [k.name for k in seen.semantic.layers["global"].atl if f'"{k.name}"' in airline.markdown]
    for name in shown:
        assert not any(t in name for t in BILLING_TOOLS)


def _learnt(raw: list[dict]) -> tuple[list[Rec], list[Rec]]:
    """Episode, fact and NAc link-update records of some events (the worker's output, built here)."""
    from somnus.processors.prediction.causal_links import learn, observations_from_episode

    events = sorted((decode_trace(orjson.dumps(e), 1 << 22) for e in raw), key=lambda e: (e.ts, e.agent, e.seq))
    episodes = sorted(distill({}, events).episodes, key=lambda ep: (ep.ended_at, ep.agent))
    extracted = TraceExtractor().extract(episodes)
    _, updates = learn({}, [o for i, ep in enumerate(episodes) for o in observations_from_episode(ep, 0, i)])
    recs = [Rec("episodes", 0, i, encode(ep)) for i, ep in enumerate(episodes)]
    recs += [Rec("facts", 0, i, encode(f)) for i, f in enumerate(extracted)]
    links = [Rec("link-updates", 0, i // 500, encode(updates[i : i + 500])) for i in range(0, len(updates), 500)]
    return recs, links


def test_knowledge_from_two_agents_data_is_for_readers_covering_both_even_when_it_arrives_first(tmp_path):
    """Issue 25 item 4: a global concept learnt from billing's and billing2's episodes (undeclared
    agents: no scope chain covers another's) is served to neither, nor to billing3, which uses the
    same tool but whose data it did not come from. Replayed with the concept before the episodes it
    names (billing3's briefing was rendered meanwhile, leaving it out: its provenance is not known
    yet), the final briefings are the same bytes."""
    import msgspec

    from somnus.projections.semantic import promotion_inputs
    from somnus.schemas.semantic import KIND_PROMOTE

    topics = Topics("traces", "episodes", "dead-letters", "facts", link_updates="link-updates", semantic="semantic")
    recs, links = _learnt(_billing_events(30) + _billing_events(30, agent="billing2"))
    third, _ = _learnt(_billing_events(6, agent="billing3"))
    third = [Rec(r.topic, 1, r.offset, r.value) for r in third]  # its own partition
    source = _db(tmp_path, "source.duckdb")  # where the promotion's inputs are read: billing and billing2 only
    apply_batch(source, topics, recs + links, load_offsets(source), 1 << 24, ReadModels(source, AGENTS))
    req = promotion_inputs(source, "global")
    req = msgspec.structs.replace(req, at=max(c.at for c in req.calls), request_id="test:two")
    semantic = Rec("semantic", 0, 0, encode(req), headers=[("somnus-kind", KIND_PROMOTE)])

    ref = _db(tmp_path, "ref.duckdb")
    ref_seen = ReadModels(ref, AGENTS)
    apply_batch(ref, topics, third + recs + links, load_offsets(ref), 1 << 24, ref_seen)
    apply_batch(ref, topics, [semantic], load_offsets(ref), 1 << 24, ref_seen)
    ref_seen.briefings.refresh(ref)
    concepts = [c for c in ref_seen.semantic.layers["global"].atl if c.properties.get("tool") == "charge_card"]
    assert concepts, "the promotion made a global concept about charge_card"
    for c in concepts:
        assert {ref_seen.briefings.recent.episode_agent[e] for e in c.source_episode_ids} == {"billing", "billing2"}
    for agent in ("billing", "billing2", "billing3"):
        md = ref_seen.briefings.current[agent].markdown
        assert "charge_card: card declined" in md  # its own lesson
        assert not any(f'"{c.name}"' in md for c in concepts), md

    # billing3 first, then the concept, then the episodes it names, in batches with renders between.
    late = _db(tmp_path, "late.duckdb")
    late_seen = ReadModels(late, AGENTS)
    apply_batch(late, topics, third, load_offsets(late), 1 << 24, late_seen)
    apply_batch(late, topics, [semantic], load_offsets(late), 1 << 24, late_seen)
    late_seen.briefings.refresh(late)
    assert late_seen.briefings.current["billing3"].markdown  # rendered meanwhile ...
    meanwhile = late_seen.briefings.current["billing3"].markdown
    assert not any(f'"{c.name}"' in meanwhile for c in concepts)  # ... without it
    rest = recs + links
    for i in range(0, len(rest), 25):
        apply_batch(late, topics, rest[i : i + 25], load_offsets(late), 1 << 24, late_seen)
        late_seen.briefings.refresh(late)
    assert not any(f'"{c.name}"' in late_seen.briefings.current["billing3"].markdown for c in concepts)
    assert queries.table_checksums(late)["briefings"] == queries.table_checksums(ref)["briefings"]


def test_a_statistical_pattern_names_its_recorded_source_agents():
    # A pattern has no episodes of its own: its agents come from the provenance recorded with it,
    # so the briefing can serve it to readers that cover those agents instead of to nobody.
    from datetime import datetime, timezone

    from somnus.processors.semantic.layers import MemoryLayers
    from somnus.projections.briefings import knowledge_items
    from somnus.schemas.semantic import MathCategory, MathRecord, PatternConfirmed

    m = MemoryLayers("team:ops")
    rec = MathRecord(
        math_id="m1",
        name="stat:tool:deploy:success",
        category=MathCategory.PATTERN,
        domain="tool_reliability",
        subjects=["deploy"],
        verbal="deploy succeeds less each week",
        query="SELECT 1",
        confidence=0.9,
        n_observations=40,
        source_agents=["a", "b"],
    )
    assert m.apply(PatternConfirmed(owner="team:ops", record=rec, at=datetime(2024, 5, 1, tzinfo=timezone.utc)))
    [item] = knowledge_items(m)
    assert item.agents == ("a", "b") and item.subjects == ("deploy",)
