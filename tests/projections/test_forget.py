"""Forget (issue 25 item 6), on a DuckDB file built through the projector's write path.

Two users' sessions of one agent (each session carries its user's marker in its task, messages,
tool arguments and errors: ``tests/projections/test_isolation.py``) are written with
``apply_batch``; a ``ForgetRequested`` for one user is then applied, before or after the data (a
replay reads the topics in parallel). Checked: the marker is in the file's bytes before (the scan
can see it) and in no row and no byte of the file or its WAL after; the other user's rows have the
same checksums as in a file where the forgotten user never was; later records of the user stay out.
"""

from __future__ import annotations

import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import duckdb
import msgspec
import orjson

from somnus.projections import forget, schema
from somnus.projections.writer import ReadModels, apply_batch, load_offsets
from somnus.schemas.agents import AgentSpec
from somnus.schemas.codec import encode
from somnus.schemas.forget import KIND_FORGET, ForgetRequested, ForgetSubject
from somnus.schemas.sealed import encode_key
from tests.factories import Rec
from tests.projections.test_isolation import T0, TOPICS, decode_events, marker, session_events, worker_records

AGENTS = {"aga": AgentSpec(name="aga")}
FORGOTTEN, KEPT = "up", "uq"  # users 0 and 1 of test_isolation's naming
NEEDLE = marker(0, 0)  # "mkapk": in every session of user up
OTHER = marker(0, 1)


def sessions(first: int, user: int, n: int) -> list[dict[str, Any]]:
    return [e for k in range(first, first + n) for e in session_events(k, 0, user, k % 3, k % 2 == 0, True, True)]


def records(raw: list[dict[str, Any]], base: int = 0) -> list[Rec]:
    """What the worker would publish for these trace events (its own processors), at offsets from ``base``."""
    stamp = int(max(e.ts for e in decode_events(raw)).timestamp() * 1000)
    out = [
        Rec("traces", 0, base + n, orjson.dumps(e), key=e["session_id"].encode(), timestamp=stamp)
        for n, e in enumerate(raw)
    ]
    out += worker_records(raw, base)
    # a dead letter of the first and of the last session: their original bytes name their user's marker
    out += [
        Rec(
            "dead-letters",
            0,
            base + n,
            orjson.dumps(raw[i]) + b"\xff",
            key=raw[i]["session_id"].encode(),
            headers=[
                ("somnus-reason", b"invalid: test"),
                ("somnus-source-topic", b"traces"),
                ("somnus-source-partition", b"0"),
                ("somnus-source-offset", str(base + i % len(raw)).encode()),
            ],
        )
        for n, i in enumerate((1, -2))
    ]
    return out


def forget_record(offset: int, user: str = FORGOTTEN, subject: ForgetSubject = ForgetSubject.USER) -> Rec:
    req = ForgetRequested(
        request_id=f"forget-{subject.value}-{user}",
        subject=subject,
        value=user,
        reason="test",
        at=T0 + timedelta(days=5),
    )
    # partition 1: the data's own facts records are numbered from 0 on partition 0 here
    return Rec("facts", 1, offset, encode(req), key=b"forget", headers=[("somnus-kind", KIND_FORGET)])


def apply(con: duckdb.DuckDBPyConnection, seen: ReadModels, recs: list[Rec]) -> None:
    apply_batch(con, TOPICS, recs, load_offsets(con), 1 << 20, seen)


def kept_checksums(con: duckdb.DuckDBPyConnection) -> dict[str, str]:
    """A digest of the kept user's rows in each table that holds a user's rows (content columns only)."""
    sids = f"(SELECT session_id FROM episodes WHERE user_id = '{KEPT}')"
    where = {
        "events": f"session_id IN {sids}",
        "episodes": f"user_id = '{KEPT}'",
        "lessons": f"session_id IN {sids}",
        "memories": f"user_id = '{KEPT}'",
        "working_memory": f"user_id = '{KEPT}'",
        "knowledge_inputs": f"episode_id IN (SELECT episode_id FROM episodes WHERE user_id = '{KEPT}')",
        "causal_link_updates": f"episode_id IN (SELECT episode_id FROM episodes WHERE user_id = '{KEPT}')",
    }
    out = {}
    for table, cond in where.items():
        cols = ", ".join(schema.CONTENT_COLUMNS[table])
        n, digest = con.execute(
            f"SELECT count(*), md5(coalesce(string_agg(r, '|' ORDER BY r), '')) FROM "
            f"(SELECT ({cols})::VARCHAR AS r FROM {table} WHERE {cond})"
        ).fetchone()
        out[table] = f"{n}:{digest}"
    return out


def rows_with(con: duckdb.DuckDBPyConnection, text: str) -> dict[str, int]:
    """Rows of every table whose text (every column, as VARCHAR) contains ``text``."""
    tables = [t for (t,) in con.execute("SELECT table_name FROM duckdb_tables() WHERE NOT temporary").fetchall()]
    got = {}
    for t in tables:
        n = con.execute(f"SELECT count(*) FROM {t} x WHERE x::VARCHAR LIKE ?", [f"%{text}%"]).fetchone()[0]
        if n:
            got[t] = n
    return got


def file_hits(path: Path, text: str) -> int:
    return sum(p.read_bytes().count(text.encode()) for p in (path, Path(f"{path}.wal")) if p.exists())


def build(
    path: Path, first_forget: bool = False, forgotten_sessions: int = 3
) -> tuple[duckdb.DuckDBPyConnection, ReadModels]:
    con = duckdb.connect(str(path))
    schema.init(con)
    seen = ReadModels(con, AGENTS)
    if first_forget:
        apply(con, seen, [forget_record(0)])
    raw = sessions(0, 1, 3) + (sessions(3, 0, forgotten_sessions) if forgotten_sessions else [])
    apply(con, seen, records(raw))
    seen.briefings.refresh(con)
    return con, seen


def test_forget_removes_the_users_rows_and_bytes_and_keeps_the_others(tmp_path, monkeypatch):
    con, seen = build(tmp_path / "a.duckdb")
    con.execute("CHECKPOINT")
    assert rows_with(con, NEEDLE).keys() >= {
        "events",
        "episodes",
        "memories",
        "working_memory",
        "dead_letters",
        "memory_log",
    }
    assert file_hits(tmp_path / "a.duckdb", NEEDLE) > 0  # the scan sees the text when it is there
    before = kept_checksums(con)
    assert all(not v.startswith("0:") for v in before.values()), before

    apply(con, seen, [forget_record(0)])
    seen.briefings.refresh(con)

    assert rows_with(con, NEEDLE) == {}
    for table in ("episodes", "memories", "working_memory"):
        assert con.execute(f"SELECT count(*) FROM {table} WHERE user_id = ?", [FORGOTTEN]).fetchone()[0] == 0
    assert kept_checksums(con) == before
    assert NEEDLE not in seen.briefings.current["aga"].markdown
    assert con.execute("SELECT subject, value FROM forgotten").fetchall() == [("user", FORGOTTEN)]
    # the views over the tables the scrub made again still read them
    for view in ("entities", "facts_active", "sessions_current", "agent_outcomes", "tool_outcomes"):
        con.execute(f"SELECT count(*) FROM {view}").fetchone()
    assert con.execute("SELECT count(*) FROM sessions_current").fetchone()[0] == 3

    # the same user's later sessions (new offsets) are kept out, without rewriting the file (their rows
    # never commit); the other user's still come in
    later = records(sessions(10, 0, 2) + sessions(12, 1, 1), base=1000)
    scrubs, reloads = [], []
    monkeypatch.setattr(forget, "scrub", lambda *a: scrubs.append(a))
    monkeypatch.setattr(seen.memory, "reload", lambda *a: reloads.append(a))
    memories = con.execute("SELECT count(*) FROM memory_log").fetchone()[0]
    apply(con, seen, later)
    assert scrubs == []
    assert reloads == []  # the user's memory units were left out before the capture fold, not purged after
    assert con.execute("SELECT count(*) FROM memory_log").fetchone()[0] > memories  # the other user's came in
    assert rows_with(con, NEEDLE) == {}
    assert file_hits(tmp_path / "a.duckdb", NEEDLE) == 0
    assert con.execute("SELECT count(*) FROM episodes WHERE user_id = ?", [KEPT]).fetchone()[0] == 4


def test_no_byte_of_the_forgotten_text_is_left_in_the_file(tmp_path):
    """Rows deleted leave bytes in freed blocks and in freed metadata (column statistics keep the first
    8 bytes of min and max strings): the scrub writes over both. The marker is shorter than 8 bytes
    and sits in the session ids (``s5-mkapk``), so statistics would show it."""
    con, seen = build(tmp_path / "b.duckdb")
    con.execute("CHECKPOINT")
    assert file_hits(tmp_path / "b.duckdb", NEEDLE) > 0  # the scan sees the text when it is there
    apply(con, seen, [forget_record(0)])
    assert rows_with(con, NEEDLE) == {}
    con.close()
    assert file_hits(tmp_path / "b.duckdb", NEEDLE) == 0


def test_a_replay_keeps_the_user_forgotten_whichever_comes_first(tmp_path):
    """The request read before the data (as a replay may), and after it, give the kept user's rows the
    same checksums as a file that never held the forgotten user."""
    never, _ = build(tmp_path / "never.duckdb", forgotten_sessions=0)
    expected = kept_checksums(never)
    first, _ = build(tmp_path / "first.duckdb", first_forget=True)
    after, seen = build(tmp_path / "after.duckdb")
    apply(after, seen, [forget_record(0)])
    for con, name in ((first, "first"), (after, "after")):
        assert rows_with(con, NEEDLE) == {}, name
        assert file_hits(tmp_path / f"{name}.duckdb", NEEDLE) == 0, name
        got = kept_checksums(con)
        # A kept memory's capture scores (prediction error, reasons) were decided while the forgotten
        # user's memories were in the index: equal whichever came first, not equal to a file without them.
        assert {k: v for k, v in got.items() if k != "memories"} == {
            k: v for k, v in expected.items() if k != "memories"
        }, name
    assert kept_checksums(first) == kept_checksums(after)


def test_a_copy_of_a_request_is_applied_once_and_another_user_is_untouched(tmp_path):
    con, seen = build(tmp_path / "c.duckdb")
    apply(con, seen, [forget_record(0), forget_record(1)])
    assert con.execute("SELECT count(*) FROM forgotten").fetchone()[0] == 1
    assert con.execute("SELECT count(*) FROM episodes WHERE user_id = ?", [KEPT]).fetchone()[0] == 3
    assert rows_with(con, OTHER)  # the other user's text is all still there


def test_forget_a_session_and_an_agent(tmp_path):
    con, seen = build(tmp_path / "s.duckdb")
    sid = con.execute(
        "SELECT session_id FROM episodes WHERE user_id = ? ORDER BY session_id LIMIT 1", [FORGOTTEN]
    ).fetchone()[0]
    apply(con, seen, [forget_record(0, sid, ForgetSubject.SESSION)])
    assert rows_with(con, sid) == {"forgotten": 1}  # the request's own row names the session (SECURITY.md)
    assert con.execute("SELECT count(*) FROM episodes WHERE user_id = ?", [FORGOTTEN]).fetchone()[0] == 2
    assert con.execute("SELECT count(*) FROM episodes WHERE user_id = ?", [KEPT]).fetchone()[0] == 3

    apply(con, seen, [forget_record(1, "aga", ForgetSubject.AGENT)])
    for table in (
        "events",
        "episodes",
        "lessons",
        "memories",
        "working_memory",
        "causal_link_updates",
        "temporal_bins",
        "dead_letters",
        "memory_log",
        "briefings",
    ):
        assert con.execute(f"SELECT count(*) FROM {table}").fetchone()[0] == 0, table
    assert rows_with(con, OTHER) == {} and rows_with(con, NEEDLE) == {"forgotten": 1}  # the session request
    assert file_hits(tmp_path / "s.duckdb", OTHER) == 0


def test_a_sleep_decision_naming_a_forgotten_memory_in_its_body_goes_with_it(tmp_path):
    """A pattern abstracted by a sleep run keeps its sources' ids in its body, not in ``memory_id``
    (``schemas.lifecycle.PatternAbstracted``), and its key is words of their text."""
    con, seen = build(tmp_path / "l.duckdb")
    gone, kept = (
        con.execute("SELECT memory_id FROM memories WHERE user_id = ? ORDER BY memory_id LIMIT 1", [u]).fetchone()[0]
        for u in (FORGOTTEN, KEPT)
    )

    def pattern(pid: str, source: str, key: str) -> str:
        return orjson.dumps(
            {
                "type": "pattern_abstracted",
                "run_id": "r1",
                "pattern_id": pid,
                "agent": "aga",
                "key": key,
                "domains": ["d"],
                "support": 2,
                "sources": [{"memory_id": source, "domain": "d"}],
            }
        ).decode()

    for seq, (pid, source, key) in enumerate((("p-gone", gone, NEEDLE), ("p-kept", kept, OTHER))):
        con.execute(
            "INSERT INTO lifecycle_log VALUES ('r1', ?, 'PatternAbstracted', NULL, ?, ?)",
            [seq, T0, pattern(pid, source, key)],
        )
    apply(con, seen, [forget_record(0)])
    assert [
        r
        for (r,) in con.execute(
            "SELECT body->>'$.pattern_id' FROM lifecycle_log WHERE kind = 'PatternAbstracted'"
        ).fetchall()
    ] == ["p-kept"]
    assert rows_with(con, NEEDLE) == {}
    apply(con, seen, [forget_record(1, "aga", ForgetSubject.AGENT)])
    assert con.execute("SELECT count(*) FROM lifecycle_log WHERE kind = 'PatternAbstracted'").fetchone()[0] == 0


def test_a_record_naming_a_forgotten_id_is_noticed_and_others_are_not(tmp_path):
    con, seen = build(tmp_path / "m.duckdb")
    eid = con.execute("SELECT episode_id::VARCHAR FROM episodes WHERE user_id = ? LIMIT 1", [FORGOTTEN]).fetchone()[0]
    kept_sid = con.execute("SELECT session_id FROM episodes WHERE user_id = ? LIMIT 1", [KEPT]).fetchone()[0]
    gone_sid = con.execute("SELECT session_id FROM episodes WHERE user_id = ? LIMIT 1", [FORGOTTEN]).fetchone()[0]
    apply(con, seen, [forget_record(0)])
    f = seen.forget
    assert f.mentions(Rec("facts", 0, 9, b'{"episode_id":"%s","agent":"aga"}' % eid.encode()))
    assert f.mentions(Rec("traces", 0, 9, b"{}", key=gone_sid.encode()))  # a session of the user's, by its key
    assert f.mentions(Rec("episodes", 0, 9, b'{"user_id":"%s"}' % FORGOTTEN.encode()))
    assert not f.mentions(Rec("traces", 0, 9, b'{"session_id":"%s"}' % kept_sid.encode(), key=kept_sid.encode()))
    assert not f.mentions(Rec("facts", 0, 9, b'{"episode_id":"%s"}' % str(uuid.uuid4()).encode()))
    # a new projector start loads the same (forgotten, forgotten_keys)
    again = forget.Forgetting(con)
    assert again.mentions(Rec("traces", 0, 9, b"{}", key=gone_sid.encode()))
    assert gone_sid not in str(con.execute("SELECT * FROM forgotten_keys").fetchall())


def test_a_scrub_that_finds_the_file_busy_runs_again_after_a_later_batch(tmp_path, monkeypatch):
    con, seen = build(tmp_path / "busy.duckdb")
    con.execute("CHECKPOINT")
    real = forget._checkpoint

    def busy(c: Any, wait_s: float = 0.0) -> None:
        raise forget.CheckpointBusy()

    monkeypatch.setattr(forget, "_checkpoint", busy)
    apply(con, seen, [forget_record(0)])
    assert rows_with(con, NEEDLE) == {}
    assert seen.forget.pending
    assert con.execute("SELECT count(*) FROM projection_meta WHERE key = ?", [forget.SCRUB_PENDING]).fetchone()[0]
    assert con.execute("SELECT count(*) FROM duckdb_tables() WHERE table_name LIKE '%forget_f%'").fetchone()[0] == 0
    monkeypatch.setattr(forget, "_checkpoint", real)
    apply(con, seen, records(sessions(20, 1, 1), base=2000))  # the kept user's: no purge, but the scrub is due
    assert not seen.forget.pending
    assert file_hits(tmp_path / "busy.duckdb", NEEDLE) == 0


def test_the_scrub_succeeds_while_the_read_api_serves(tmp_path):
    """The projector's serving state: its database hardened, the SQL sandbox and the read API on cursors
    of the writer's connection, every GET route read (each leaves its result as a route leaves it).
    Before the fix, the sandbox's cursor (``harden`` on a locked database) and the read API's cursor
    each held an unread result, so a transaction older than the scrub's dropped tables: CHECKPOINT
    failed for good, and the marker stayed in the file's free blocks (docs/design/forget.md)."""
    from somnus.projections import api
    from somnus.projections.sql_sandbox import SqlSandbox, harden

    path = tmp_path / "serving.duckdb"
    con, seen = build(path)
    harden(con)
    service = api.ReadService(
        con.cursor(),
        seen.agents,
        briefings=seen.briefings.current,
        episodic=seen.memory,
        semantic=seen.semantic,
        top_facts=seen.top_facts,
        sandbox=SqlSandbox(con),
    )
    params = {
        "sql": {"sql": "SELECT count(*) FROM episodes"},
        "history": {"entity": "search"},
        "predict": {"tool": "search"},
        "advise": {"task": "order tea"},
    }
    read = 0
    for route in api.all_routes():
        if (route.method == "GET" or route.handler == "sql") and route.handler != "kafka_positions":  # no broker
            query = {"query": "tea"} if "query" in {p[0] for p in route.params} else {}
            api.call(service, route, "aga", {**query, **params.get(route.handler, {})})
            read += 1
    assert read >= 15
    service.con.execute("SELECT agent FROM episodes").fetchone()  # a result left unread
    assert file_hits(path, NEEDLE) > 0
    apply(con, seen, [forget_record(0)])
    assert not seen.forget.pending  # scrubbed at once, not left for a retry
    assert file_hits(path, NEEDLE) == 0
    assert service.con.execute("SELECT count(*) FROM episodes WHERE user_id = ?", [KEPT]).fetchone()[0] == 3


# ---- crypto-shredding: sealed records (somnus.schemas.sealed) ---------------------------------------


def sealed_records(raw: list[dict[str, Any]], ring: Any, base: int = 0) -> list[Rec]:
    """``records`` as the publisher and the worker seal them: each session's under a key of its own (made
    in ``ring``)."""
    from somnus.schemas.codec import decode_episode
    from somnus.schemas.memory import MemoryUnit
    from somnus.schemas.sealed import encode_key, new_key
    from somnus.streams.sealing import dead_letter_value, sealed, session_of_table_key, unit_records

    def key(agent: str, sid: str) -> Any:
        if ring.key_for(agent, sid) is None:
            k = new_key(agent, sid, None)
            ring.apply(k.key_id.encode(), encode_key(k))
        return ring.key_for(agent, sid)

    by_episode = {}
    out = []
    for rec in records(raw, base):
        value, headers = rec.value, rec.headers
        if rec.topic == "traces":
            ev = orjson.loads(rec.value)
            value, headers = sealed(key(ev["agent"], ev["session_id"]), rec.value, headers)
        elif rec.topic == "episodes":
            ep = decode_episode(rec.value)
            by_episode[str(ep.episode_id)] = (ep.agent, ep.session_id)
            value, headers = sealed(key(ep.agent, ep.session_id), rec.value)
        elif rec.topic == "facts":
            value, headers = sealed(key(*by_episode[orjson.loads(rec.value)["episode_id"]]), rec.value)
        elif rec.topic == "working-memory":
            value, headers = sealed(key(*session_of_table_key(rec.key)), rec.value)
        elif rec.topic == "dead-letters":
            trace = sealed(key("aga", rec.key.decode()), b"{}")[0]  # the dead record's source: its session's
            value, extra = dead_letter_value(ring, trace, rec.value, None)
            headers = [*rec.headers, *extra]
        elif rec.topic == "link-updates":  # one record per session, as the worker sends them
            groups: dict[Any, list[Any]] = {}
            for u in orjson.loads(rec.value):
                groups.setdefault(by_episode[u["episode_id"]], []).append(u)
            for n, (session, items) in enumerate(groups.items()):
                v, h = sealed(key(*session), orjson.dumps(items))
                out.append(Rec("link-updates", 0, rec.offset * 100 + n, v, headers=h))
            continue
        elif rec.topic == "memory":
            units = msgspec.json.decode(rec.value, type=list[MemoryUnit])
            for u in units:
                key(u.agent, u.run_id)
            for n, (v, h) in enumerate(unit_records(ring, units, 50)):
                out.append(
                    Rec("memory", 0, rec.offset * 100 + n, v, headers=[*rec.headers, *h], timestamp=rec.timestamp)
                )
            continue
        out.append(
            Rec(rec.topic, rec.partition, rec.offset, value, key=rec.key, headers=headers, timestamp=rec.timestamp)
        )
    return out


def test_sealed_records_project_as_plaintext_and_a_deleted_key_shreds_them(tmp_path):
    """With every key, sealed records give the rows plaintext gives; with the forgotten user's keys
    deleted (a replay after ``somnus forget``) its records are skipped and counted, not dead letters,
    its text is in no row and no byte, and the other user's rows keep their checksums."""
    from somnus.schemas.sealed import KeyRing

    ring = KeyRing()
    raw = sessions(0, 1, 3) + sessions(3, 0, 3)
    recs = sealed_records(raw, ring)
    assert not any(NEEDLE.encode() in (r.value or b"") for r in recs)

    plain, _ = build(tmp_path / "plain.duckdb")
    con = duckdb.connect(str(tmp_path / "sealed.duckdb"))
    schema.init(con)
    seen = ReadModels(con, AGENTS)
    seen.keys = ring
    apply(con, seen, recs)
    assert rows_with(con, NEEDLE).keys() >= {"events", "episodes", "memories", "working_memory", "dead_letters"}
    assert kept_checksums(con) == kept_checksums(plain)
    assert (
        con.execute("SELECT count(*) FROM dead_letters").fetchone()[0]
        == plain.execute("SELECT count(*) FROM dead_letters").fetchone()[0]
    )

    # the forgotten user's keys deleted (``somnus forget --user`` publishes their tombstones)
    users = {e["session_id"]: e["payload"].get("user_id") for e in raw if e["type"] == "session_start"}
    for kid, dk in list(ring.by_id.items()):
        ring.apply(
            kid.encode(),
            encode_key(
                dk.__class__(
                    key_id=kid, agent=dk.agent, session_id=dk.session_id, user_id=users.get(dk.session_id), key=dk.key
                )
            ),
        )
    doomed = ring.select("user", FORGOTTEN)
    assert doomed and len(doomed) < len(ring.by_id)
    for kid in doomed:
        ring.apply(kid.encode(), None)

    never, _ = build(tmp_path / "never.duckdb", forgotten_sessions=0)
    for with_request in (False, True):  # the key's deletion alone, then with the request in the replay too
        path = tmp_path / f"replay-{with_request}.duckdb"
        con = duckdb.connect(str(path))
        schema.init(con)
        seen = ReadModels(con, AGENTS)
        seen.keys = ring
        res = apply_batch(con, TOPICS, recs + ([forget_record(0)] if with_request else []), {}, 1 << 20, seen)
        assert res.shredded > 0 and res.quarantined == 0
        assert rows_with(con, NEEDLE) == {}
        got = kept_checksums(con)
        assert {k: v for k, v in got.items() if k != "memories"} == {
            k: v for k, v in kept_checksums(never).items() if k != "memories"
        }
        con.close()
        assert file_hits(path, NEEDLE) == 0


def test_a_tampered_sealed_record_is_a_dead_letter_not_a_crash(tmp_path):
    from somnus.schemas.sealed import KeyRing

    ring = KeyRing()
    recs = [r for r in sealed_records(sessions(0, 1, 1), ring) if r.topic == "traces"]
    bad = recs[0]
    recs[0] = Rec(
        bad.topic,
        bad.partition,
        bad.offset,
        bad.value[:-1] + bytes([bad.value[-1] ^ 1]),
        key=bad.key,
        headers=bad.headers,
        timestamp=bad.timestamp,
    )
    con = duckdb.connect(str(tmp_path / "t.duckdb"))
    schema.init(con)
    seen = ReadModels(con, AGENTS)
    seen.keys = ring
    res = apply_batch(con, TOPICS, recs, {}, 1 << 20, seen)
    assert res.quarantined == 1 and res.shredded == 0
    (reason,) = con.execute("SELECT reason FROM dead_letters").fetchone()
    assert reason.startswith("undecodable: a sealed record that fails authentication"), reason


# ---- a sleep's topics (docs/design/forget.md, "Topic keys on the semantic topic") -------------------


def topic_request(con: duckdb.DuckDBPyConnection, offset: int, ring: Any = None) -> Rec:
    """A sleep's promotion request with three abstracted topics: the forgotten user's marker word from
    three of its memories, the kept user's from three of its, and a word of both users' memories;
    sealed with ``ring`` when given."""
    from somnus.projections.semantic import sealed_request
    from somnus.schemas.semantic import KIND_PROMOTE, PromotionRequested, TopicView

    topics = []
    mixed = [
        con.execute("SELECT memory_id FROM memories WHERE user_id = ? ORDER BY memory_id DESC LIMIT 1", [u]).fetchone()[
            0
        ]
        for u in (FORGOTTEN, KEPT)
    ]
    for user, word in ((FORGOTTEN, NEEDLE), (KEPT, OTHER), (None, "mixedword")):
        ids = (
            mixed
            if user is None
            else [
                m
                for (m,) in con.execute(
                    "SELECT memory_id FROM memories WHERE user_id = ? ORDER BY memory_id LIMIT 3", [user]
                ).fetchall()
            ]
        )
        topics.append(
            TopicView(
                pattern_id=f"p-{word}", agent="aga", key=word, domains=["d1", "d2", "d3"], support=3, source_ids=ids
            )
        )
    req = PromotionRequested(owner="global", at=T0 + timedelta(days=4), topics=topics, request_id=f"sleep:r{offset}")
    req = sealed_request(con, req, ring)
    return Rec("semantic", 0, offset, encode(req), key=b"global", headers=[("somnus-kind", KIND_PROMOTE)])


def session_ring(con: duckdb.DuckDBPyConnection) -> Any:
    """A key ring with a data key for each session the memories came from."""
    from somnus.schemas.sealed import KeyRing, new_key

    ring = KeyRing()
    for agent, run in con.execute("SELECT DISTINCT agent, run_id FROM memories").fetchall():
        k = new_key(agent, run, None)
        ring.apply(k.key_id.encode(), encode_key(k))
    return ring


def test_a_topic_concept_of_a_forgotten_users_memories_goes_with_it(tmp_path):
    """A topic concept (its name is a word of the user's text) derived from the forgotten user's memories
    leaves every semantic table and the folded layers, also when kept memories share it (as a replay,
    where its sealed topic no longer opens); the kept user's own topic stays."""
    con, seen = build(tmp_path / "t.duckdb")
    apply(con, seen, [topic_request(con, 0)])
    names = {n for (n,) in con.execute("SELECT name FROM concepts WHERE category = 'topic'").fetchall()}
    assert names == {NEEDLE, OTHER, "mixedword"}  # all became concepts: the test below is not vacuous
    assert rows_with(con, NEEDLE).keys() >= {"concepts", "semantic_log", "promotion_audit"}
    apply(con, seen, [forget_record(0)])
    assert rows_with(con, NEEDLE) == {}
    assert {n for (n,) in con.execute("SELECT name FROM concepts WHERE category = 'topic'").fetchall()} == {OTHER}
    atl = seen.semantic.layers["global"].atl
    assert atl.find(NEEDLE) is None and atl.find(OTHER) is not None  # the fold was reloaded without it
    nxt = seen.semantic.next_ord
    assert nxt == con.execute("SELECT max(ord) + 1 FROM semantic_log").fetchone()[0]  # no ord reused
    con.execute("CHECKPOINT")
    assert file_hits(tmp_path / "t.duckdb", NEEDLE) == 0


def test_a_sleeps_topics_are_sealed_under_their_sources_keys(tmp_path):
    """Published, a topic's key word is not in the request's bytes; with every key it folds into a
    concept; with the forgotten user's keys deleted (a replay after the forget) it opens as nothing,
    and the kept user's topic still folds."""
    from somnus.schemas.sealed import KeyRing

    con, seen = build(tmp_path / "s.duckdb")
    ring = session_ring(con)
    rec = topic_request(con, 0, ring)
    assert NEEDLE.encode() not in rec.value and OTHER.encode() not in rec.value
    assert b"sealed_topics" in rec.value
    seen.keys = ring
    apply(con, seen, [rec])
    assert {n for (n,) in con.execute("SELECT name FROM concepts WHERE category = 'topic'").fetchall()} == {
        NEEDLE,
        OTHER,
        "mixedword",
    }

    con2, seen2 = build(tmp_path / "r.duckdb")
    forgotten = [
        (a, r)
        for a, r in con.execute("SELECT DISTINCT agent, run_id FROM memories WHERE user_id = ?", [FORGOTTEN]).fetchall()
    ]
    kept = KeyRing()
    for kid, dk in ring.by_id.items():
        if (dk.agent, dk.session_id) not in forgotten:
            kept.apply(kid.encode(), encode_key(dk))
    seen2.keys = kept
    apply(con2, seen2, [rec])
    assert {n for (n,) in con2.execute("SELECT name FROM concepts WHERE category = 'topic'").fetchall()} == {OTHER}
    assert seen2.semantic.forgotten_topics == 2 and seen2.semantic.rejected_topics == 0


def test_an_altered_sealed_topic_is_left_out_and_the_rest_of_the_request_runs(tmp_path):
    con, seen = build(tmp_path / "x.duckdb")
    ring = session_ring(con)
    rec = topic_request(con, 0, ring)
    req = msgspec.json.decode(rec.value)
    first = bytearray(msgspec.json.decode(msgspec.json.encode(req["sealed_topics"][0]), type=bytes))
    first[-1] ^= 1
    req["sealed_topics"][0] = bytes(first)
    seen.keys = ring
    apply(con, seen, [Rec("semantic", 0, 0, msgspec.json.encode(req), key=b"global", headers=rec.headers)])
    assert seen.semantic.rejected_topics == 1
    assert con.execute("SELECT count(*) FROM concepts WHERE category = 'topic'").fetchone()[0] == 2
