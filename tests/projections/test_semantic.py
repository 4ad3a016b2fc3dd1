"""The semantic fold in the projector (real DuckDB file; records built here, no broker)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import duckdb

from processors.promotion import CausalLinkView
from processors.statistics import CallOutcome
from projections import queries, schema
from projections.semantic import KIND_PROMOTE, PromotionRequested, SemanticProjection
from projections.writer import Seen, Topics, apply_batch, load_offsets
from schemas.codec import encode
from tests.records import Rec

TOPICS = Topics("traces", "episodes", "dead-letters", "facts", "link-updates", "memory", "working-memory", "semantic")
T0 = datetime(2024, 5, 1, tzinfo=timezone.utc)
SEMANTIC_TABLES = ("semantic_log", "semantic_requests", "concepts", "promotion_audit", "cross_layer_edges")


def _request(request_id: str | None) -> PromotionRequested:
    """A tool that failed 12 times in 20 calls, against a fleet base rate of 10% failures."""
    calls = [CallOutcome("pay", i % 5 >= 3 or i < 4, T0 + timedelta(hours=7 * i), f"e{i}", "a") for i in range(20)]
    failed = [c for c in calls if not c.ok]
    link = CausalLinkView(event_signature="sig-pay", tool="pay", outcome="error", valence="negative", strength=0.6,
                          confidence=0.9, observation_count=len(failed), observation_times=[c.at for c in failed],
                          source_episode_ids=[c.episode_id for c in failed], event_observations=len(calls),
                          base_rate=0.1)
    return PromotionRequested(owner="global", at=T0 + timedelta(days=7), links=[link], calls=calls,
                              request_id=request_id)


def _rec(offset: int, req: PromotionRequested) -> Rec:
    return Rec("semantic", 0, offset, encode(req), key=b"global", headers=[("somnus-kind", KIND_PROMOTE)])


def test_a_request_with_an_id_runs_once_however_often_it_is_published(tmp_path, monkeypatch):
    ran: list[str | None] = []
    real = SemanticProjection.promote

    def counted(self: SemanticProjection, req: PromotionRequested) -> list:
        ran.append(req.request_id)
        return real(self, req)

    monkeypatch.setattr(SemanticProjection, "promote", counted)
    con = duckdb.connect(str(tmp_path / "s.duckdb"))
    schema.init(con)
    seen = Seen(con)
    first = apply_batch(con, TOPICS, [_rec(0, _request("sleep:r1"))], load_offsets(con), 1 << 20, seen)
    assert first.semantic_events > 0
    assert con.execute("SELECT request_id, src_offset FROM semantic_requests").fetchall() == [("sleep:r1", 0)]
    before = queries.table_checksums(con)
    again = apply_batch(con, TOPICS, [_rec(1, _request("sleep:r1"))], load_offsets(con), 1 << 20, seen)
    assert again.semantic_events == 0
    # ... also after a restart (the ids are reloaded from the table)
    again = apply_batch(con, TOPICS, [_rec(2, _request("sleep:r1"))], load_offsets(con), 1 << 20, Seen(con))
    assert again.semantic_events == 0
    after = queries.table_checksums(con)
    for table in SEMANTIC_TABLES:
        assert after[table] == before[table], table
    # the copies were skipped, not run again (promotion of the same candidates is idempotent anyway);
    # a request without an id (somnus consolidate) and another id do run
    apply_batch(con, TOPICS, [_rec(3, _request(None)), _rec(4, _request("sleep:r2"))], load_offsets(con), 1 << 20,
                Seen(con))
    assert ran == ["sleep:r1", None, "sleep:r2"]
    assert con.execute("SELECT count(*) FROM semantic_requests").fetchone()[0] == 2
