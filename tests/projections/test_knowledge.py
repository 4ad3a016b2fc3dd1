"""somnus.projections.knowledge: the triple-log fold written by the projector (real DuckDB file, no broker)."""

from __future__ import annotations

import duckdb
import orjson
import pytest

from somnus.processors.knowledge.extraction import TraceExtractor
from somnus.processors.sessions.distiller import distill
from somnus.projections import queries, schema
from somnus.projections.knowledge_store import DuckDBBackend, KnowledgeStore
from somnus.projections.writer import ReadModels, Topics, apply_batch, load_offsets
from somnus.sample import generate
from somnus.schemas.agents import AgentSpec
from somnus.schemas.codec import decode_trace, encode
from tests.factories import Rec

TOPICS = Topics("traces", "episodes", "dead-letters", "facts")
KNOWLEDGE = ("knowledge_inputs", "entity_versions", "entity_aliases", "predicates", "triples", "triple_history")


@pytest.fixture(scope="module")
def facts_records() -> list[Rec]:
    events = [decode_trace(orjson.dumps(e), 1 << 20) for e in generate(sessions=150, seed=21)]
    extracted = TraceExtractor().extract(distill({}, events).episodes)
    return [Rec("facts", 0, i, encode(f)) for i, f in enumerate(extracted)]


def _project(tmp_path, name, chunks, reload_each_batch=True):
    con = duckdb.connect(str(tmp_path / name))
    schema.init(con)
    seen = ReadModels(con)
    for chunk in chunks:
        if reload_each_batch:
            seen = ReadModels(con)  # as a restarted projector: fold state loaded from the tables
        apply_batch(con, TOPICS, chunk, load_offsets(con), 1 << 20, seen)
    return con


def _sums(con):
    sums = queries.table_checksums(con)
    return {t: sums[t] for t in KNOWLEDGE}


def test_the_log_does_not_depend_on_batching_or_restarts(tmp_path, facts_records):
    one = _project(tmp_path, "one.duckdb", [facts_records], reload_each_batch=False)
    r = facts_records
    many = _project(tmp_path, "many.duckdb", [r[:7], r[7:8], r[8:60], r[60:61], r[61:]])
    assert _sums(one) == _sums(many)
    assert one.execute("SELECT count(*) FROM triples").fetchone()[0] > 50


def test_redelivered_and_re_extracted_facts_change_nothing(tmp_path, facts_records):
    con = _project(tmp_path, "p.duckdb", [facts_records])
    before = _sums(con)
    # the same records again (redelivery), and the same episodes re-extracted at new offsets
    again = [Rec("facts", 0, 10_000 + i, r.value) for i, r in enumerate(facts_records[:40])]
    seen = ReadModels(con)
    apply_batch(con, TOPICS, facts_records + again, {}, 1 << 20, seen)
    assert _sums(con) == before
    assert load_offsets(con)[("facts", 0)] == 10_040


def test_facts_top_holds_the_best_active_facts_of_each_scope(tmp_path, facts_records):
    con = _project(tmp_path, "p.duckdb", [facts_records[:50], facts_records[50:]])
    top = con.execute("SELECT * FROM facts_top ORDER BY triple_id").fetchall()
    schema.refresh_facts_top(con)
    assert con.execute("SELECT * FROM facts_top ORDER BY triple_id").fetchall() == top
    agents = {a: AgentSpec(name=a) for (a,) in con.execute("SELECT DISTINCT created_by FROM triples").fetchall()}
    store = KnowledgeStore(DuckDBBackend(con), agents)
    for agent in agents:
        best = con.execute(
            "SELECT triple_id::VARCHAR FROM triples WHERE valid_to IS NULL AND scope IN (?, 'global') "
            "ORDER BY confidence DESC, count DESC, triple_id LIMIT 10",
            [f"agent:{agent}"],
        ).fetchall()
        assert [f.triple_id for f in store.facts(agent, limit=10)] == [b[0] for b in best]


def test_history_names_the_episode_of_every_change(tmp_path, facts_records):
    con = _project(tmp_path, "p.duckdb", [facts_records])
    inputs = {r[0] for r in con.execute("SELECT episode_id FROM knowledge_inputs").fetchall()}
    changes = con.execute("SELECT change, episode_id FROM triple_history").fetchall()
    assert {c for c, _ in changes} >= {"asserted", "reinforced"}
    assert {e for _, e in changes} <= inputs
    n_facts = con.execute("SELECT sum(facts) FROM knowledge_inputs").fetchone()[0]
    asserted_or_reinforced = sum(1 for c, _ in changes if c != "superseded")
    assert asserted_or_reinforced == n_facts  # every fact of every episode left a trace


def test_the_in_memory_facts_top_answers_like_the_query(tmp_path, facts_records):
    from somnus.projections.knowledge_store import TopFacts

    con = _project(tmp_path, "p.duckdb", [facts_records[:60], facts_records[60:]])
    agents = {a: AgentSpec(name=a) for (a,) in con.execute("SELECT DISTINCT created_by FROM triples").fetchall()}
    top = TopFacts()
    top.refresh(con)
    sql = KnowledgeStore(DuckDBBackend(con), agents)
    cached = KnowledgeStore(DuckDBBackend(con), agents, top=top)
    for agent in agents:
        for limit, floor in ((5, 0.0), (50, 0.0), (200, 0.95)):
            assert cached.facts(agent, limit=limit, min_confidence=floor) == sql.facts(
                agent, limit=limit, min_confidence=floor
            )


def test_a_stretch_closed_twice_in_one_batch_keeps_its_last_closing(tmp_path):
    # A functional slot asserted at 08:48 (X), 08:56 (Z), then a late 08:52 (Y): the 08:48 triple is
    # closed first by Z at 08:56, then by Y at 08:52 (Y takes over the rest of its stretch). With both
    # closings in one batch, the UPDATE had two rows for one triple and DuckDB applied either: a replay
    # (other batches) then disagreed with the live projection on ``superseded_by`` and ``valid_to``.
    import uuid
    from datetime import datetime, timezone

    from somnus.schemas.facts import FACTS_SCHEMA_VERSION, FactAsserted, FactsExtracted

    def fx(i, minute, target):
        return FactsExtracted(
            schema_version=FACTS_SCHEMA_VERSION,
            episode_id=uuid.UUID(int=i + 1),
            agent="support",
            observed_at=datetime(2026, 1, 5, 8, minute, tzinfo=timezone.utc),
            extractor="trace/1",
            facts=[
                FactAsserted(
                    source="api.stripe.com",
                    source_type="api",
                    predicate="rate_limit",
                    target=target,
                    target_type="rate",
                    confidence=0.9,
                    functional=True,
                )
            ],
        )

    recs = [Rec("facts", 0, i, encode(f)) for i, f in enumerate([fx(0, 48, "1s"), fx(1, 56, "4s"), fx(2, 52, "2s")])]
    one = _project(tmp_path, "one.duckdb", [recs], reload_each_batch=False)
    rows = one.execute("SELECT target, valid_from, valid_to, superseded_by FROM triples").fetchall()
    by_target = {r[0]: r for r in rows}
    first, late = by_target["rate:1s"], by_target["rate:2s"]
    assert first[2] == late[1]  # 08:52, not 08:56
    assert one.execute("SELECT target FROM triples WHERE triple_id = ?", [first[3]]).fetchone()[0] == "rate:2s"
    many = _project(tmp_path, "many.duckdb", [[r] for r in recs])
    assert _sums(one) == _sums(many)
