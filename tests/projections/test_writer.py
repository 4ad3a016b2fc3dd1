"""The projector's write path against a real DuckDB file (no broker: records are built here)."""

from __future__ import annotations

import duckdb
import orjson
import pytest

from somnus.client import bundles
from somnus.processors.sessions.distiller import distill
from somnus.projections import queries, schema
from somnus.projections.writer import ReadModels, Topics, apply_batch, load_offsets
from somnus.sample import generate
from somnus.schemas.codec import decode_trace, encode
from tests.factories import Rec

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
    return apply_batch(con, TOPICS, records, stored, 1 << 20, ReadModels(con))


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
    h = [
        ("somnus-reason", b"schema: Expected `int`, got `str` - at `$.seq`"),
        ("somnus-source-topic", b"traces"),
        ("somnus-source-partition", b"3"),
        ("somnus-source-offset", b"17"),
        ("somnus-source-index", b"2"),
    ]
    res = _apply(con, [Rec("dead-letters", 0, 0, b"orig", b"k", h), Rec("dead-letters", 0, 1, b"orig", b"k", h)])
    assert res.dead_letters == 1
    row = con.execute("SELECT src_partition, src_offset, src_index, kind, original FROM dead_letters").fetchone()
    assert row == (3, 17, 2, "schema", b"orig")


@pytest.mark.parametrize(
    "sql",
    [
        "DELETE FROM events",
        "INSERT INTO events SELECT * FROM events",
        "CREATE TABLE x (a INT)",
        "SELECT 1; DROP TABLE events",
        "ATTACH 'x.db'",
        "",
    ],
)
def test_sql_is_read_only(tmp_path, sql):
    with pytest.raises(queries.NotReadOnly):
        queries.check_read_only(sql)


def test_select_is_allowed(tmp_path):
    con = _db(tmp_path)
    assert queries.run_sql(con, "SELECT count(*) AS n FROM events") == {"columns": ["n"], "rows": [[0]]}


# ---- no record stops the projector (apply_guarded) --------------------------------------------

ALL = Topics("traces", "episodes", "dead-letters", "facts", "link-updates", "memory", "working-memory", "semantic")
DEEP = b"[" * 100_000 + b"]" * 100_000
POISON_BY_TOPIC = {
    "episodes": [DEEP, b'{"episode_id": "\xff"}', b'{"nope": 1}'],
    "facts": [DEEP, b"[\xc3\x28]", b'{"episode_id": 42}'],
    "memory": [DEEP, b'["\\udc00"]', b'[{"kind": "episode"}]'],
    "link-updates": [DEEP, b"\xff", b'[{"event_signature": 1}]'],
    "semantic": [DEEP, b"\x80"],
    "working-memory": [DEEP, b'{"agent": 1}'],
}


def _guarded(con, records, topics=ALL):
    from somnus.projections.writer import apply_guarded

    return apply_guarded(con, topics, records, load_offsets(con), 1 << 20, ReadModels(con), 64, 300.0)


@pytest.mark.parametrize("topic", sorted(POISON_BY_TOPIC))
def test_a_poison_record_on_an_internal_topic_is_quarantined_and_later_records_are_projected(tmp_path, topic):
    from somnus.schemas.semantic import KIND_INGEST

    con = _db(tmp_path)
    good = _records(sessions=3)
    headers = [("somnus-kind", KIND_INGEST)] if topic == "semantic" else None
    poison = [Rec(topic, 7, i, v, b"k", headers) for i, v in enumerate(POISON_BY_TOPIC[topic])]
    res = _guarded(con, poison + good)
    assert res.episodes == 3 and res.quarantined == len(poison)
    rows = con.execute(
        "SELECT src_topic, src_offset, kind, reason, original, dlq_offset FROM dead_letters ORDER BY src_offset"
    ).fetchall()
    assert [(t, o) for t, o, *_ in rows] == [(topic, i) for i in range(len(poison))]
    assert all(dlq is None and reason.startswith(f"{kind}: ") for _, _, kind, reason, _, dlq in rows)
    assert rows[0][3].startswith("oversized: invalid ") and "JSON nested 100000 deep > limit 64" in rows[0][3]
    assert rows[0][4] == DEEP  # the original bytes (under MAX_ORIGINAL)
    assert load_offsets(con)[(topic, 7)] == len(poison)  # passed, never retried
    assert queries.summary(con)["quarantined"] == {topic: len(poison)}
    # a redelivery changes nothing
    before = queries.checksum(con)
    _guarded(con, poison + good)
    assert queries.checksum(con) == before


@pytest.mark.parametrize("topic", sorted(POISON_BY_TOPIC))
def test_a_sealed_poison_record_is_judged_by_its_plaintext(tmp_path, topic):
    """Opening sits inside the poison boundary: the same records sealed (``somnus.schemas.sealed``) are
    quarantined for what their plaintext is, on the first pass and on the record-by-record one."""
    from somnus.projections.writer import apply_guarded
    from somnus.schemas.sealed import encode_key, new_key, seal
    from somnus.schemas.semantic import KIND_INGEST

    def reasons(sealed: bool) -> list[str]:
        con = _db(tmp_path / str(sealed))
        seen = ReadModels(con)
        key = new_key("aga", "s1")
        seen.keys.apply(key.key_id.encode(), encode_key(key))
        headers = [("somnus-kind", KIND_INGEST)] if topic == "semantic" else None
        poison = [
            Rec(topic, 7, i, seal(key, v) if sealed else v, b"k", headers) for i, v in enumerate(POISON_BY_TOPIC[topic])
        ]
        res = apply_guarded(con, ALL, poison + _records(sessions=3), load_offsets(con), 1 << 20, seen, 64, 300.0)
        assert res.episodes == 3 and res.quarantined == len(poison) and res.shredded == 0
        return [r for (r,) in con.execute("SELECT reason FROM dead_letters ORDER BY src_offset").fetchall()]

    (tmp_path / "True").mkdir()
    (tmp_path / "False").mkdir()
    assert reasons(True) == reasons(False)


def test_a_record_its_fold_cannot_apply_is_quarantined_as_poison_and_the_rest_of_the_batch_is_applied(
    tmp_path, monkeypatch
):
    from somnus.projections.causal import CausalProjection

    con = _db(tmp_path)
    real = CausalProjection.write

    def fragile(self, con, bundles):
        if any(b"cursed" in b for b in bundles):
            raise ValueError("a fold that cannot apply this")
        return real(self, con, bundles)

    monkeypatch.setattr(CausalProjection, "write", fragile)
    good = _records(sessions=4)
    cursed = Rec("link-updates", 1, 0, b'[{"cursed": true}]')
    res = _guarded(con, good[:3] + [cursed] + good[3:])
    assert res.episodes == 4 and res.quarantined == 1
    (row,) = con.execute("SELECT src_topic, src_partition, src_offset, kind, reason FROM dead_letters").fetchall()
    assert row == ("link-updates", 1, 0, "schema", row[4]) and row[4].startswith("schema: invalid link updates: ")
    # decodable, but the fold raises: found by halves and quarantined as poison
    valid = Rec("link-updates", 1, 1, b"[]" if False else b'[{"cursed": 1}]'.replace(b"1}", b'1, "x": 0}'))
    monkeypatch.setattr("somnus.projections.writer._undecodable", lambda topics, rec, depth: None)
    more = _records(sessions=2, seed=9)
    more = [Rec(r.topic, r.partition, r.offset + 1000, r.value, r.key) for r in more]
    res = _guarded(con, more[:2] + [valid] + more[2:])
    assert res.episodes == 2
    kinds = con.execute("SELECT kind, reason FROM dead_letters WHERE src_offset = 1").fetchall()
    assert kinds == [("poison", "poison: ValueError while folding link-updates: a fold that cannot apply this")]


def test_an_event_id_is_projected_once_and_one_another_session_reuses_is_a_dead_letter(tmp_path):
    con = _db(tmp_path)
    base = {
        "event_id": "6f1c1a6e-7d0c-4a43-9a55-0c7f2d1f4b1e",
        "schema_version": 1,
        "ts": "2026-03-01T09:00:00Z",
        "agent": "support",
        "session_id": "s1",
        "seq": 0,
        "type": "agent_message",
        "payload": {"text": "hi"},
    }
    first = Rec("traces", 0, 0, orjson.dumps(base))
    again = Rec("traces", 0, 1, orjson.dumps({**base, "seq": 1}))  # a copy in its own session
    other = Rec("traces", 1, 0, orjson.dumps({**base, "session_id": "s2"}))  # another session reuses it
    res = _guarded(con, [first, again])
    assert (res.events, res.duplicate_events) == (1, 1)
    res = _guarded(con, [other, Rec("traces", 0, 2, orjson.dumps({**base, "seq": 2}))])
    assert (res.events, res.duplicate_events) == (0, 1)
    assert con.execute("SELECT count(*) FROM events").fetchone()[0] == 1
    ((kind, reason, idx),) = con.execute("SELECT kind, reason, src_index FROM dead_letters").fetchall()
    assert kind == "duplicate" and idx == 0
    assert reason == (
        "duplicate: event_id 6f1c1a6e-7d0c-4a43-9a55-0c7f2d1f4b1e already belongs to session 's1' of "
        "agent 'support'; this agent_message event of session 's2' of agent 'support' reuses it"
    )
    assert queries.summary(con)["duplicate_events"] == 2 and queries.summary(con)["quarantined"] == {}
    # in a bundle, the reused id's event (decoded again from its record: the sink keeps no event) is
    # the dead letter's original, at its index
    fresh = {**base, "event_id": "0d7c4b7e-9d43-4f7e-8a44-5f0c8c1f7e21", "session_id": "s3"}
    reused = {**base, "session_id": "s3", "seq": 1, "payload": {"text": "again"}}
    res = _guarded(con, [Rec("traces", 1, 1, orjson.dumps([fresh, reused]))])
    assert res.events == 1
    idx, original = con.execute("SELECT src_index, original FROM dead_letters WHERE src_offset = 1").fetchone()
    got = orjson.loads(original)
    assert idx == 1 and (got["session_id"], got["seq"], got["payload"]) == ("s3", 1, {"text": "again"})


def test_an_event_stamped_past_its_records_broker_time_plus_the_skew_is_not_projected(tmp_path):
    con = _db(tmp_path)
    at_ms = 1_772_355_600_000  # 2026-03-01T09:00:00Z, the record's broker time
    ev = {
        "event_id": "6f1c1a6e-7d0c-4a43-9a55-0c7f2d1f4b1e",
        "schema_version": 1,
        "ts": "2999-01-01T00:00:00Z",
        "agent": "support",
        "session_id": "s1",
        "seq": 0,
        "type": "agent_message",
        "payload": {"text": "hi"},
    }
    near = {**ev, "event_id": "6f1c1a6e-7d0c-4a43-9a55-0c7f2d1f4b1f", "ts": "2026-03-01T09:04:00Z"}
    res = _guarded(
        con,
        [
            Rec("traces", 0, 0, orjson.dumps(ev), timestamp=at_ms),
            Rec("traces", 0, 1, orjson.dumps(near), timestamp=at_ms),
        ],
    )
    assert res.events == 1
    assert con.execute("SELECT max(ts) FROM events").fetchone()[0].year == 2026


def test_a_multi_part_link_updates_record_writes_the_parts_whose_keys_are_held(tmp_path):
    """Several sessions' link updates in one record (``somnus.schemas.sealed.join_parts``, the worker's
    layout): each part opens with its own key, a forgotten session's part is left out, the rest written."""
    import uuid
    from datetime import datetime, timezone

    from somnus.projections.writer import apply_guarded
    from somnus.schemas.causal import CausalLinkUpdated
    from somnus.schemas.sealed import encode_key, join_parts, new_key, seal

    def update(episode: uuid.UUID, offset: int) -> CausalLinkUpdated:
        return CausalLinkUpdated(
            event_signature=f"{offset:064x}", level="call", tool="lookup", outcome_signature="error:Timeout",
            outcome="error:Timeout", valence="negative", agent="aga", episode_id=episode,
            observed_at=datetime(2026, 1, 1, tzinfo=timezone.utc), src_partition=0, src_offset=offset, index=0,
            target=1.0, alpha=0.5, strength_before=0.0, strength=0.5, observations=1, event_observations=1,
            confidence=0.5, strengths={"error:Timeout": 0.5},
        )  # fmt: skip

    con = _db(tmp_path)
    seen = ReadModels(con)
    kept, gone = new_key("aga", "s1"), new_key("aga", "s2")
    seen.keys.apply(kept.key_id.encode(), encode_key(kept))  # s2's key was deleted (forgotten)
    eps = [uuid.uuid4() for _ in range(3)]
    parts = [[update(eps[0], 0), update(eps[0], 1)], [update(eps[1], 2)], [update(eps[2], 3)]]
    value = join_parts([seal(kept, encode(parts[0])), seal(gone, encode(parts[1])), encode(parts[2])])
    res = apply_guarded(con, ALL, [Rec("link-updates", 0, 0, value)], load_offsets(con), 1 << 20, seen, 64, 300.0)
    got = con.execute("SELECT src_offset, episode_id FROM causal_link_updates ORDER BY src_offset").fetchall()
    assert got == [(0, eps[0]), (1, eps[0]), (3, eps[2])] and res.quarantined == 0
    # every part forgotten: the record is skipped as a forgotten one, not a dead letter
    res = apply_guarded(
        con, ALL, [Rec("link-updates", 0, 1, join_parts([seal(gone, encode(parts[1]))]))], load_offsets(con),
        1 << 20, seen, 64, 300.0,
    )  # fmt: skip
    assert res.shredded == 1 and res.quarantined == 0
