"""The projector's write path against a real DuckDB file (no broker: records are built here)."""

from __future__ import annotations

import duckdb
import orjson
import pytest

from processors.distiller import distill
from tests.records import Rec
from projections import queries, schema
from projections.writer import Seen, Topics, apply_batch, load_offsets
from schemas.codec import decode_trace, encode
from somnus.client import bundles
from somnus.sample import generate

TOPICS = Topics("traces", "episodes", "dead-letters")




def _records(sessions: int = 30, seed: int = 1) -> list[Rec]:
    raws = [orjson.dumps(e) for e in generate(sessions=sessions, seed=seed)]
    traces = [Rec("traces", 0, i, v, k) for i, (k, v) in enumerate(bundles(raws, 4))]
    events = [decode_trace(r, 1 << 20) for r in raws]
    episodes = distill({}, events).episodes
    eps = [Rec("episodes", 0, i, encode(ep)) for i, ep in enumerate(episodes)]
    return traces + eps


def _db(tmp_path, name="p.duckdb"):
    con = duckdb.connect(str(tmp_path / name))
    schema.init(con)
    return con


def _apply(con, records):
    stored = load_offsets(con)
    return apply_batch(con, TOPICS, records, stored, 1 << 20, Seen(con))


def test_a_redelivered_batch_changes_nothing(tmp_path):
    con = _db(tmp_path)
    recs = _records()
    first = _apply(con, recs)
    assert first.events > 0 and first.episodes == 30
    before = queries.checksum(con)
    again = _apply(con, recs)
    assert (again.events, again.episodes, again.lessons) == (0, 0, 0)
    assert queries.checksum(con) == before
    assert load_offsets(con)[("traces", 0)] == max(r.offset for r in recs if r.topic == "traces") + 1


def test_an_episode_re_emitted_at_a_new_offset_is_projected_once(tmp_path):
    con = _db(tmp_path)
    recs = _records()
    _apply(con, recs)
    eps = [r for r in recs if r.topic == "episodes"]
    dup = [Rec("episodes", 0, 1000 + i, r.value) for i, r in enumerate(eps[:5])]
    res = _apply(con, dup)
    assert res.episodes == 0 and res.lessons == 0
    assert con.execute("SELECT count(*), count(DISTINCT episode_id) FROM episodes").fetchone() == (30, 30)
    assert load_offsets(con)[("episodes", 0)] == 1005


def test_checksum_ignores_row_order_and_kafka_coordinates_but_counts_duplicates(tmp_path):
    recs = _records()
    a = _db(tmp_path, "a.duckdb")
    _apply(a, recs)
    b = _db(tmp_path, "b.duckdb")
    traces = [r for r in recs if r.topic == "traces"]
    eps = [r for r in recs if r.topic == "episodes"]
    # other partition numbering and order, same content
    _apply(b, [Rec("traces", 1, i, r.value, r.key) for i, r in enumerate(reversed(traces))])
    _apply(b, [Rec("episodes", 2, i, r.value) for i, r in enumerate(reversed(eps))])
    assert queries.checksum(a) == queries.checksum(b)
    # a duplicated event row (e.g. a non-transactional write) must change the checksum
    a.execute("INSERT INTO events SELECT * FROM events LIMIT 1")
    assert queries.checksum(a) != queries.checksum(b)


def test_invalid_traces_are_skipped_not_projected(tmp_path):
    con = _db(tmp_path)
    res = _apply(con, [Rec("traces", 0, 0, b"{nope"), Rec("traces", 0, 1, b"[1,2]")])
    assert res.events == 0 and res.skipped_invalid == 3
    assert load_offsets(con)[("traces", 0)] == 2


def test_dead_letters_are_unique_by_source(tmp_path):
    con = _db(tmp_path)
    h = [("somnus-reason", b"schema: Expected `int`, got `str` - at `$.seq`"), ("somnus-source-topic", b"traces"),
         ("somnus-source-partition", b"3"), ("somnus-source-offset", b"17"), ("somnus-source-index", b"2")]
    res = _apply(con, [Rec("dead-letters", 0, 0, b"orig", b"k", h), Rec("dead-letters", 0, 1, b"orig", b"k", h)])
    assert res.dead_letters == 1
    row = con.execute("SELECT src_partition, src_offset, src_index, kind, original FROM dead_letters").fetchone()
    assert row == (3, 17, 2, "schema", b"orig")


@pytest.mark.parametrize("sql", ["DELETE FROM events", "INSERT INTO events SELECT * FROM events",
                                 "CREATE TABLE x (a INT)", "SELECT 1; DROP TABLE events", "ATTACH 'x.db'", ""])
def test_sql_is_read_only(tmp_path, sql):
    with pytest.raises(queries.NotReadOnly):
        queries.check_read_only(sql)


def test_select_is_allowed(tmp_path):
    con = _db(tmp_path)
    assert queries.run_sql(con, "SELECT count(*) AS n FROM events") == {"columns": ["n"], "rows": [[0]]}
