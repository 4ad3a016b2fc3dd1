"""No record stops ingest: a corpus of hostile trace records (and a poison record on each internal topic),
mixed with good sessions, through the real broker, worker and projector. Nothing exits, the lag drains,
every bad record is one dead letter with a reason, every good session's episode is projected; late
events after a run of undecodable records are still judged per session."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from datetime import datetime, timedelta, timezone
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from somnus.sample import generate
from somnus.schemas.codec import MAX_ORIGINAL
from somnus.streams.ordering import position_key
from somnus.streams.topics import ensure_topics_async
from tests.factories import trace_event
from tests.pipeline import Pipeline

pytestmark = pytest.mark.integration

TEN_MIB = 10 << 20
BOMB_LIMIT = 16 << 20


OBSERVATION = {
    "event_signature": "0123456789abcdef",
    "level": "call",
    "tool": "lookup",
    "outcome_signature": "fedcba9876543210",
    "outcome": "error:Timeout",
    "valence": "negative",
    "agent": "attacker",
    "observed_at": "2026-11-27T00:00:00Z",
    "episode_id": "00000000-0000-0000-0000-000000000001",
    "src_partition": 0,
    "src_offset": 0,
    "index": 0,
}


def _event(session: str, seq: int, kind: str, at: datetime, **payload: Any) -> dict[str, Any]:
    return trace_event(session, seq, kind, at, payload, agent="attacker")


def _corpus(now: datetime) -> dict[str, bytes]:
    """The hostile records of issue 25, each a whole Kafka record on the traces topic."""
    ok = orjson.dumps(_event("p", 0, "agent_message", now))
    deep_args = b'"args":{"a":' + b"[" * 900 + b"]" * 900 + b"}"
    call = orjson.dumps(_event("p", 1, "tool_call", now, tool="t", call_id="c"))
    return {
        "nested 1000 deep (2 KB)": b"[" * 1000 + b"]" * 1000,
        "nested 100000 deep": b"[" * 100_000 + b"]" * 100_000,
        "objects nested 100000 deep": b'{"a":' * 100_000 + b"1" + b"}" * 100_000,
        "invalid UTF-8 in a string": ok.replace(b'"hi"', b'"h\xff\xfei"'),
        "invalid UTF-8 in a key": ok.replace(b'"payload"', b'"pay\xc3\x28load"'),
        "lone high surrogate": ok.replace(b'"hi"', b'"\\ud800"'),
        "lone low surrogate in a key": ok.replace(b'"text"', b'"\\udc00"'),
        "float seq and arguments 900 deep": call.replace(b'"seq":1', b'"seq":1.0').replace(
            b'"call_id":"c"', b'"call_id":"c",' + deep_args
        ),
        "huge seq": ok.replace(b'"seq":0', b'"seq":' + b"9" * 30),
        "seq above a BIGINT": ok.replace(b'"seq":0', b'"seq":9223372036854775808'),
        "NaN": ok.replace(b'"seq":0', b'"seq":NaN'),
        "Infinity": ok.replace(b'"seq":0', b'"seq":Infinity'),
        "bundle of 2000 scalars": b"[" + b",".join(b"%d" % i for i in range(2000)) + b"]",
        "10 MiB record": b'{"agent":"' + b"x" * TEN_MIB + b'"}',
        "year 2999": orjson.dumps(_event("y2999", 0, "session_start", datetime(2999, 1, 1, tzinfo=timezone.utc))),
        "year 1 west of UTC": ok.replace(now.isoformat().encode(), b"0001-01-01T00:00:00+01:00"),
    }


async def _send(bootstrap: str, topic: str, records: list[tuple[Any, ...]]) -> list[tuple[int, int]]:
    """Send raw records (partition, value, headers[, key]) as they are; their (partition, offset)."""
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, acks="all", max_request_size=TEN_MIB + (1 << 20), compression_type="gzip"
    )
    await producer.start()
    try:
        futures = [
            await producer.send(topic, value, partition=partition, headers=headers, key=key[0] if key else None)
            for partition, value, headers, *key in records
        ]
        return [((m := await f).partition, m.offset) for f in futures]
    finally:
        await producer.stop()


async def _send_bomb(bootstrap: str, topic: str, partition: int, size: int) -> tuple[int, int]:
    """A compression bomb: one zstd record batch that expands to ``size`` bytes (~1 KB on the wire)."""
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, acks="all", max_request_size=size + (1 << 20), compression_type="zstd"
    )
    await producer.start()
    try:
        m = await (await producer.send(topic, b'{"agent":"' + b"a" * size + b'"}', partition=partition))
        return m.partition, m.offset
    finally:
        await producer.stop()


async def _allow_large_records(bootstrap: str, topic: str) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.alter_configs(
            [ConfigResource(ConfigResourceType.TOPIC, topic, configs={"max.message.bytes": str(TEN_MIB + (1 << 20))})]
        )
    finally:
        await admin.close()


# Hypothesis makes the rest of the corpus: random bytes, and JSON-ish records built from fragments of
# events and hostile pieces; one example, a list of records, goes through the pipeline once.
FRAGMENTS = [
    b"{",
    b"}",
    b"[",
    b"]",
    b",",
    b":",
    b'"',
    b"\\",
    b"\\u",
    b"d800",
    b"\xff",
    b"\xc3",
    b"NaN",
    b"1e999",
    b"-0",
    b"null",
    b'"seq"',
    b'"type"',
    b'"tool_call"',
    b'"payload"',
    b'"event_id"',
    b"\x00",
    b" ",
]
hostile_records = st.lists(
    st.one_of(
        st.binary(min_size=0, max_size=300),
        st.lists(st.sampled_from(FRAGMENTS), min_size=1, max_size=200).map(b"".join),
        st.recursive(
            st.none() | st.booleans() | st.integers() | st.text(max_size=20),
            lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
            max_leaves=30,
        ).map(lambda v: orjson.dumps(v, option=orjson.OPT_NON_STR_KEYS)),
    ),
    min_size=150,
    max_size=150,
)


@settings(
    max_examples=1, deadline=None, database=None, phases=[Phase.generate], suppress_health_check=list(HealthCheck)
)
@given(generated=hostile_records)
def test_no_record_stops_ingest_and_every_bad_record_is_one_dead_letter(pipeline_settings, generated):
    # Its own topics, group, state folder and DuckDB file at each call: on a failure Hypothesis runs the
    # example again to report it, and that second run, on the first's topics, failed otherwise and hid
    # the first run's failure. Batches past 16 MiB decompressed are unreadable (the 10 MiB record's is not).
    run = uuid.uuid4().hex[:10]
    home = pipeline_settings.home.parent / run
    s = dataclasses.replace(
        pipeline_settings,
        home=home / "home",
        db_path=home / "somnus.duckdb",
        topic_prefix=f"t{run}.",
        app_id=f"somnus-test-{run}",
        session_retention_s=3600.0,
        max_batch_bytes=BOMB_LIMIT,
    )
    now = datetime.now(timezone.utc).replace(microsecond=0)
    good = list(generate(sessions=40, seed=5))
    good_sessions = {(e["agent"], e["session_id"]) for e in good}
    corpus = _corpus(now)
    p = Pipeline(s)
    try:
        asyncio.run(_allow_large_records(p.boot, s.traces_topic))
        # values the worker cannot read on its tables' changelogs, restored when it starts: under a good
        # session's key, a position's, a signature's (the tables hold them as absent, and dead-letter them)
        agent, victim = sorted(good_sessions)[0]
        changelogs = {name: f"{s.app_id}-{name}-changelog" for name in ("sessions", "links", "working_memory")}
        asyncio.run(
            ensure_topics_async(p.boot, {changelogs["sessions"]: s.partitions, changelogs["links"]: s.partitions})
        )
        state_key = f"{agent}\x1f{victim}".encode()
        unreadable = {
            changelogs["sessions"]: [
                (0, b'{"closed":true,"partit', None, state_key),
                (0, b"seven", None, position_key(s.traces_topic, 1)),
            ],
            changelogs["links"]: [(0, b'{"strength":"strong"}', None, b"tool|lookup")],
            changelogs["working_memory"]: [(0, b"[" * 100_000, None, state_key)],
        }
        unreadable_at = {t: asyncio.run(_send(p.boot, t, records)) for t, records in unreadable.items()}
        p.start_all()
        # a poison record straight onto each internal topic first, so that good records follow it there
        internal = {
            s.episodes_topic: b"[" * 100_000,
            s.facts_topic: b'{"episode_id": "\xff"}',
            s.memory_topic: b'[{"kind": "episode"}]',
            # an observation whole but for its signature, which is not hex (it crashed the links agent)
            s.observations_topic: orjson.dumps([{**OBSERVATION, "event_signature": "support|lookup"}]),
            s.link_updates_topic: b"\x80" + b"[" * 5000,
        }
        internal_at = {
            topic: asyncio.run(
                _send(p.boot, topic, [(0, value, [("somnus-kind", b"units")] if topic == s.memory_topic else None)])
            )[0]
            for topic, value in internal.items()
        }
        # a compression bomb on the traces topic (the worker and the projector read it), on one the
        # projector reads, and on one the worker's NAc agent reads
        bombed = (s.traces_topic, s.facts_topic, s.observations_topic)
        bombs = [asyncio.run(_send_bomb(p.boot, t, 0, 3 * BOMB_LIMIT // 2)) for t in bombed]
        named = list(corpus.items())
        bad = asyncio.run(
            _send(p.boot, s.traces_topic, [(i % s.partitions, v, None) for i, (_, v) in enumerate(named)])
        )
        hyp = asyncio.run(_send(p.boot, s.traces_topic, [(i % s.partitions, v, None) for i, v in enumerate(generated)]))
        p.publish(good, bundle_max=8)
        # a session whose 30 tool names are 600 KB each, an event a record (each under the event limit):
        # copied into its episode, memory units and observations they made records of 9-78 MB, which the
        # worker's producer refused in its ticker, unseen, and the worker held them for ever
        long_names = [_event("long-names", 0, "session_start", now)]
        for i in range(30):
            call = _event("long-names", 2 * i + 1, "tool_call", now, tool=f"t{i}" + "x" * 600_000, call_id=f"c{i}")
            result = _event("long-names", 2 * i + 2, "tool_result", now, call_id=f"c{i}", ok=False, error="Error: x")
            long_names += [call, result]
        long_names.append(_event("long-names", 61, "session_end", now, outcome="failure"))
        p.publish(long_names, bundle_max=1)
        # Order checks per session, whatever else the partition holds: sessions that ended a day ago,
        # a session 3 hours later (their markers expire: retention 1 hour), 1,000 undecodable records,
        # then a late event of each old session: dead letters, not sessions started again.
        day = now - timedelta(days=1)
        old = [
            e
            for k in range(10)
            for e in (_event(f"old-{k}", 0, "session_start", day), _event(f"old-{k}", 1, "session_end", day))
        ]
        later = [_event("clock", 0, "session_start", day + timedelta(hours=3))]
        asyncio.run(_send(p.boot, s.traces_topic, [(0, orjson.dumps(e), None) for e in old + later]))
        asyncio.run(_send(p.boot, s.traces_topic, [(0, b"{undecodable %d" % i, None) for i in range(1000)]))
        late = asyncio.run(
            _send(
                p.boot,
                s.traces_topic,
                [
                    (0, orjson.dumps(_event(f"old-{k}", 5, "agent_message", day + timedelta(minutes=1))), None)
                    for k in range(10)
                ],
            )
        )
        # an event sent twice in its session under two seqs: applied once, counted; an event_id another
        # session holds: a dead letter (the projector sees every event)
        start, msg = _event("dupe", 0, "session_start", now), _event("dupe", 1, "agent_message", now)
        dupe = [start, msg, {**msg, "seq": 2}, _event("dupe", 3, "session_end", now)]
        reuse = [
            {**_event("reuser", 0, "session_start", now), "event_id": start["event_id"]},
            _event("reuser", 1, "session_end", now),
        ]
        reused_at = asyncio.run(_send(p.boot, s.traces_topic, [(1, orjson.dumps(e), None) for e in dupe + reuse]))[4]
        p.wait_idle(timeout_s=420)  # asserts that no process exited; lag reaches 0
        status = p.status()
        worker_log = p.log("worker")
        p.stop_all()
        assert "Crashed" not in worker_log, worker_log[-5000:]

        rows = p.query("SELECT src_topic, src_partition, src_offset, kind, reason, original FROM dead_letters")
        by_record: dict[tuple[str, int, int], list[tuple[str, str, bytes]]] = {}
        for t, part, off, kind, reason, original in rows:
            by_record.setdefault((t, part, off), []).append((kind, reason, original))
        dead = {k: v[0] for k, v in by_record.items()}
        # every named bad record: one dead letter (a bundle of 2,000 bad events too), with a reason
        for (name, _), at in zip(named, bad):
            got = by_record.get((s.traces_topic, *at), [])
            assert len(got) == 1, (name, got)
            assert got[0][1].split(":")[0] == got[0][0] and len(got[0][1]) > len(got[0][0]) + 2, (name, got)
        kinds = {name: dead[(s.traces_topic, *at)][0] for (name, _), at in zip(named, bad)}
        assert kinds["nested 100000 deep"] == kinds["nested 1000 deep (2 KB)"] == "oversized"
        assert kinds["invalid UTF-8 in a key"] == kinds["lone high surrogate"] == "undecodable"
        assert kinds["bundle of 2000 scalars"] == "schema" and kinds["year 2999"] == "future"
        assert dead[(s.traces_topic, *bad[[n for n, _ in named].index("bundle of 2000 scalars")])][1].startswith(
            "schema: 2000 of 2000 events of the bundle rejected: #0-#1999 "
        )
        ten = dead[(s.traces_topic, *bad[[n for n, _ in named].index("10 MiB record")])]
        assert ten[0] == "oversized" and len(ten[2]) == MAX_ORIGINAL and "keeps the first" in ten[1]
        # every hypothesis record: applied, or one dead letter with a reason (none of them is an event)
        for value, at in zip(generated, hyp):
            got = by_record.get((s.traces_topic, *at), [])
            assert len(got) == 1 and got[0][1], (value[:200], got)
        # each internal topic's poison record is quarantined (the observations one by the worker's NAc)
        for topic, at in internal_at.items():
            assert (topic, *at) in dead, (topic, at, sorted(k for k in dead if k[0] != s.traces_topic))
        assert status["quarantined"].keys() == {
            s.episodes_topic,
            s.facts_topic,
            s.memory_topic,
            s.link_updates_topic,
            changelogs["working_memory"],  # the projector reads it too
        }, status["quarantined"]
        # each unreadable table value is one dead letter, and the session it was under is distilled
        for topic, ats in unreadable_at.items():
            for at in ats:  # (the working memory's changelog: the projector's dead letter too)
                got = [(kind, reason) for kind, reason, _ in by_record.get((topic, *at), [])]
                assert [r for k, r in got if k == "poison" and "while restoring the table" in r], (topic, got)
        assert p.query(f"SELECT count(*) FROM episodes WHERE session_id = '{victim}'") == [(1,)]
        # each bomb is one dead letter naming its batch and the bound; ingest went on after it
        for topic, at in zip(bombed, bombs):
            got = by_record.get((topic, *at), [])
            assert len(got) == 1, (topic, at, got)
            kind, reason, _ = got[0]
            assert kind == "undecodable" and f"record batch at offsets {at[1]}-{at[1]}: " in reason, reason
            assert f"decompresses to more than {BOMB_LIMIT} bytes" in reason, reason
        # the late events of the forgotten sessions are dead letters, after 1,000 undecodable records
        for at in late:
            kind, reason, _ = dead[(s.traces_topic, *at)]
            assert kind == "late" and "may belong to a session already forgotten" in reason, reason
        assert p.query("SELECT count(*) FROM working_memory WHERE session_id LIKE 'old-%' AND NOT closed") == [(0,)]
        # every good session's episode is projected, and the good records on the internal topics after the
        # poison ones: facts, memories, causal links
        got = set(p.query("SELECT agent, session_id FROM episodes"))
        assert good_sessions <= got
        assert p.query("SELECT count(*) FROM triples")[0][0] > 0
        assert p.query("SELECT count(*) FROM memories")[0][0] > 0
        assert p.query("SELECT count(*) FROM causal_links")[0][0] > 0
        assert p.query("SELECT count(*) FROM events WHERE year(ts) > 2100 OR year(ts) < 1900") == [(0,)]
        assert p.query("SELECT event_count FROM episodes WHERE session_id = 'dupe'") == [(3,)]
        # each over-long tool name is one schema dead letter, with its reason; the session is distilled
        assert p.query("SELECT event_count FROM episodes WHERE session_id = 'long-names'") == [(32,)]
        long_dead = [r for _, _, _, kind, r, _ in rows if "`$.payload.tool`" in r and kind == "schema"]
        assert len(long_dead) == 30 and "length <= 1024" in long_dead[0], long_dead[:1]
        assert p.query("SELECT session_id, seq FROM duplicate_events") == [("dupe", 2)]
        assert status["duplicate_events"] == 1
        kind, reason, _ = dead[(s.traces_topic, *reused_at)]
        assert kind == "duplicate" and "already belongs to session 'dupe'" in reason, reason
    finally:
        p.stop_all()
