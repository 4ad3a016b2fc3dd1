"""somnus.projections.sql_sandbox: analysts' SQL may read the projections and nothing else, change nothing,
and run only for its time; the projector's other reads and its writer go on meanwhile."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path
from typing import Any

import duckdb
import pytest

from somnus.projections import api, queries, schema
from somnus.projections.sql_sandbox import SqlRefused, SqlSandbox, SqlTimeout, statement

LONG = "SELECT sum(hash(i)) FROM range(1000000000000) t(i)"  # hours of work: only the time limit ends it


def _projections(path: Path) -> duckdb.DuckDBPyConnection:
    """A projections file with a briefing and some events, held open read-write (the projector's writer)."""
    con = duckdb.connect(str(path))
    schema.init(con)
    con.execute(
        "INSERT INTO briefings VALUES ('support', 'b1', now(), 900, '# Briefing\n- check the invoice', 30, "
        "1, '[]', 0, 0, 0, 0)"
    )
    con.execute(
        "INSERT INTO events SELECT uuid(), 1, now(), 'support', 's' || i, i, 'tool_call', '{}', 0, i, 0 "
        "FROM range(100) t(i)"
    )
    return con


@pytest.fixture()
def writer(tmp_path: Path) -> duckdb.DuckDBPyConnection:
    con = _projections(tmp_path / "somnus.duckdb")
    yield con
    con.close()


def _state(con: duckdb.DuckDBPyConnection) -> tuple[str, dict[str, int], tuple[Any, ...]]:
    """What a refused statement must leave as it was: every projection's content, and the settings."""
    cur = con.cursor()
    settings = cur.execute(
        "SELECT current_setting('threads'), current_setting('memory_limit'), current_setting('enable_external_access')"
    ).fetchone()
    return queries.checksum(cur), queries.counts(cur), settings


# Each escape seen (issue 25) or at hand: the statement, and what its refusal says.
ESCAPES = {
    "explain analyze delete": ("EXPLAIN ANALYZE DELETE FROM briefings", "not DELETE"),
    "explain analyze create": ("EXPLAIN ANALYZE CREATE TABLE x AS SELECT 1", "not CREATE"),
    "explain analyze copy": ("EXPLAIN ANALYZE COPY (SELECT * FROM briefings) TO '{out}'", "not COPY"),
    "explain analyze set": ("EXPLAIN ANALYZE SET threads = 1", "not SET"),
    "explain with options": ("EXPLAIN (ANALYZE) DELETE FROM briefings", "EXPLAIN with options"),
    "explain analyze, comments": ("EXPLAIN /* x */ ANALYZE -- y\n DELETE FROM briefings", "not DELETE"),
    "read_text": ("SELECT content FROM read_text('/etc/passwd')", "read_text() is not allowed"),
    "read_csv": ("SELECT * FROM read_csv('/etc/passwd')", "read_csv() is not allowed"),
    "read_blob": ("SELECT * FROM read_blob('/etc/passwd')", "read_blob() is not allowed"),
    "glob": ("SELECT * FROM glob('/root/*')", "glob() is not allowed"),
    "file as a table": ("SELECT * FROM '/etc/passwd'", "no table or view named '/etc/passwd'"),
    "describe a file": ("DESCRIBE '/etc/passwd'", "no table or view named '/etc/passwd'"),
    "file in a subquery": ("SELECT (SELECT count(*) FROM read_text('/etc/passwd'))", "read_text() is not allowed"),
    "cte named like a file": (
        'SELECT * FROM (WITH "/etc/passwd" AS (SELECT 1) SELECT 1), "/etc/passwd"',
        "plain identifier",
    ),
    "sql in a string": ("SELECT * FROM query('DELETE FROM briefings')", "query() is not allowed"),
    "secrets": ("SELECT * FROM duckdb_secrets()", "duckdb_secrets() is not allowed"),
    # DuckDB's own views over functions a query may not call: the file's path, every setting
    "databases view": ("SELECT path FROM duckdb_databases", "view 'duckdb_databases' is not allowed"),
    "database list view": ("SELECT file FROM pragma_database_list", "it shows duckdb_databases()"),
    "settings view": ("SELECT * FROM pg_catalog.pg_settings", "it shows duckdb_settings()"),
    "settings view, qualified": ("SELECT * FROM system.pg_catalog.pg_settings", "it shows duckdb_settings()"),
    "a setting": ("SELECT current_setting('temp_directory')", "current_setting() is not allowed"),
    "sequence": ("SELECT nextval('s')", "nextval() is not allowed"),
    "log write": ("SELECT write_log('x')", "write_log() is not allowed"),
    "attach": ("ATTACH '{db}' AS other", "not ATTACH"),
    "install": ("INSTALL httpfs", "not LOAD"),
    "load": ("LOAD httpfs", "not LOAD"),
    "pragma": ("PRAGMA force_checkpoint", "not PRAGMA"),
    "pragma that sets": ("PRAGMA threads = 1", "not SET"),
    "set": ("SET enable_external_access = true", "not SET"),
    "reset": ("RESET threads", "not SET"),
    "copy": ("COPY briefings TO '{out}'", "not COPY"),
    "call": ("CALL pragma_version()", "not CALL"),
    "delete": ("DELETE FROM briefings", "not DELETE"),
    "create": ("CREATE TABLE x AS SELECT 1", "not CREATE"),
    "export": ("EXPORT DATABASE '{dir}'", "not EXPORT"),
    "multi-statement": ("SELECT 1; DELETE FROM briefings", "one statement at a time, got 2"),
    "select then set": ("SELECT 1; SET threads = 1", "one statement at a time, got 2"),
    "empty": ("  ;  ", "no SQL statement given"),
}


def _escape(name: str, tmp_path: Path) -> tuple[str, str]:
    sql, says = ESCAPES[name]
    return sql.format(out=tmp_path / "out.csv", db=tmp_path / "other.duckdb", dir=tmp_path / "export"), says


@pytest.mark.parametrize("name", sorted(ESCAPES))
def test_each_escape_is_refused_clearly_and_changes_nothing(writer, tmp_path, name):
    sql, says = _escape(name, tmp_path)
    box = SqlSandbox(writer, timeout_s=5)
    before = _state(writer)
    with pytest.raises(SqlRefused, match=says.replace("(", r"\(").replace(")", r"\)")):
        box.run(sql)
    assert _state(writer) == before
    assert writer.execute("SELECT count(*) FROM briefings").fetchone()[0] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["somnus.duckdb"] + (
        ["somnus.duckdb.wal"] if (tmp_path / "somnus.duckdb.wal").exists() else []
    )  # no file written


@pytest.mark.parametrize("name", sorted(ESCAPES))
def test_the_read_route_refuses_each_escape_with_a_bad_request(writer, tmp_path, name):
    sql, says = _escape(name, tmp_path)
    service = api.ReadService(writer.cursor(), {}, sandbox=SqlSandbox(writer, timeout_s=5))
    before = _state(writer)
    route = next(r for r in api.ROUTES if r.handler == "sql")
    with pytest.raises(api.BadRequest, match=says.replace("(", r"\(").replace(")", r"\)")):
        api.call(service, route, None, {"sql": sql})
    assert _state(writer) == before


@pytest.mark.parametrize(
    "sql,columns",
    [
        ("SELECT agent, markdown FROM briefings", ["agent", "markdown"]),
        ("FROM briefings SELECT count(*) AS n", ["n"]),
        ("WITH s AS (SELECT session_id FROM events) SELECT count(*) AS n FROM s", ["n"]),
        ("SELECT count(*) AS n FROM main.events e JOIN briefings b USING (agent)", ["n"]),
        ("SELECT * FROM range(3)", ["range"]),
        ("SELECT table_name FROM duckdb_tables() WHERE table_name = 'events'", ["table_name"]),
        ("SELECT count(*) AS n FROM information_schema.tables", ["n"]),
        ("SELECT count(*) AS n FROM pg_catalog.pg_class", ["n"]),  # a view over catalog functions only
        ("DESCRIBE briefings", None),
        ("SUMMARIZE events", None),
        ("SHOW TABLES", ["name"]),
        ("EXPLAIN SELECT * FROM events", ["explain_key", "explain_value"]),
        ("EXPLAIN ANALYZE SELECT count(*) FROM events", ["explain_key", "explain_value"]),
        ("SELECT ?::INTEGER + 1 AS x", ["x"]),
    ],
)
def test_reads_of_the_projections_still_work(writer, sql, columns):
    got = SqlSandbox(writer, timeout_s=5).run(sql, [41] if "?" in sql else None)
    assert got["rows"]
    if columns is not None:
        assert got["columns"] == columns


def test_statement_decides_by_the_parser_not_by_text():
    assert statement("select 1") == ("", "select 1")
    assert statement("  EXPLAIN   select 2") == ("EXPLAIN ", "select 2")
    assert statement("explain analyse /* c */ SELECT 3") == ("EXPLAIN ANALYZE ", "SELECT 3")
    with pytest.raises(SqlRefused, match="UPDATE"):
        statement("EXPLAIN ANALYZE UPDATE briefings SET markdown = ''")
    with pytest.raises(SqlRefused, match="Parser Error"):
        statement("SELEC 1")


def test_the_old_read_only_check_refuses_explain_analyze_of_a_write_too():
    with pytest.raises(queries.NotReadOnly, match="DELETE"):
        queries.check_read_only("EXPLAIN ANALYZE DELETE FROM briefings")
    queries.check_read_only("EXPLAIN ANALYZE SELECT 1")


def test_a_query_over_its_time_is_interrupted_with_an_error_naming_the_limit(writer):
    box = SqlSandbox(writer, timeout_s=1.0)
    t0 = time.monotonic()
    with pytest.raises(SqlTimeout, match=r"time limit of 1 s \(SOMNUS_SQL_TIMEOUT_S\)"):
        box.run(LONG)
    assert 0.9 <= time.monotonic() - t0 < 10
    with pytest.raises(SqlTimeout):
        box.run(f"EXPLAIN ANALYZE {LONG}")
    assert box.run("SELECT 1 AS one") == {"columns": ["one"], "rows": [[1]]}  # the sandbox is fine after


def test_the_writer_and_other_reads_go_on_while_a_query_runs_out_its_time(writer):
    box = SqlSandbox(writer, timeout_s=3.0)
    outcome: list[BaseException] = []

    def analyst() -> None:
        try:
            box.run(LONG)
        except BaseException as exc:  # noqa: BLE001 (the test looks at it)
            outcome.append(exc)

    thread = threading.Thread(target=analyst)
    thread.start()
    time.sleep(0.5)
    reader = writer.cursor()
    t0 = time.monotonic()
    for i in range(20):  # the writer commits batches; a reader sees each one
        writer.execute(
            "INSERT INTO events SELECT uuid(), 1, now(), 'support', 'new', ?, 'tool_call', '{}', 0, ?, 0", [i, 1000 + i]
        )
        assert reader.execute("SELECT count(*) FROM events").fetchone()[0] == 101 + i
    assert time.monotonic() - t0 < 2.5 and thread.is_alive()  # all while the long query ran
    thread.join(30)
    assert len(outcome) == 1 and isinstance(outcome[0], SqlTimeout)


def test_a_file_opened_for_reads_alone_is_locked_down_entirely(tmp_path):
    """``somnus sql`` with no projector: the file is opened read-only, and its database gets
    enable_external_access = false, a memory limit and a thread cap, all locked."""
    _projections(tmp_path / "somnus.duckdb").close()
    con = duckdb.connect(str(tmp_path / "somnus.duckdb"), read_only=True)
    try:
        box = SqlSandbox(con, timeout_s=5, memory_limit="256MB", threads=1)
        assert box.dedicated
        got = con.execute(  # (the sandbox's queries may not read settings: current_setting() is refused)
            "SELECT current_setting('enable_external_access') AS ext, current_setting('threads') AS t, "
            "current_setting('lock_configuration') AS locked, current_setting('memory_limit') AS mem"
        ).fetchall()
        assert got == [(False, 1, True, "244.1 MiB")]
        with pytest.raises(duckdb.Error, match="configuration has been locked"):
            con.execute("SET enable_external_access = true")
        with pytest.raises(duckdb.PermissionException):  # and DuckDB itself refuses files, whatever the checks
            con.execute("SELECT * FROM read_text('/etc/hostname')")
    finally:
        con.close()


def test_the_writers_database_is_hardened_and_its_writer_registers_its_frames(writer):
    import pyarrow as pa

    from somnus.projections.frames import registered

    SqlSandbox(writer, timeout_s=5)
    settings = dict(
        writer.execute(
            "SELECT name, value FROM duckdb_settings() WHERE name IN ('lock_configuration', 'autoload_known_extensions', "
            "'autoinstall_known_extensions', 'allow_community_extensions', 'enable_external_access')"
        ).fetchall()
    )
    assert settings == {
        "lock_configuration": "true",
        "autoload_known_extensions": "false",
        "autoinstall_known_extensions": "false",
        "allow_community_extensions": "false",
        "enable_external_access": "false",
    }
    frame = pa.table({"agent": ["x"]})
    with pytest.raises(duckdb.CatalogException):  # a Python variable's name is no table here (replacement scan)
        writer.execute("INSERT INTO briefings_dirty SELECT agent FROM frame")
    with registered(writer, frame=frame):  # how the writer hands a batch to SQL
        writer.execute("INSERT INTO briefings_dirty SELECT agent FROM frame")
    assert writer.execute("SELECT count(*) FROM briefings_dirty").fetchone()[0] == 1
    assert writer.execute("SELECT count(*) FROM duckdb_views() WHERE view_name = 'frame'").fetchone()[0] == 0
    SqlSandbox(writer, timeout_s=5)  # a second sandbox on a locked database sets nothing again


def test_the_projectors_connection_reads_no_file_even_past_the_parser_check(tmp_path):
    """Issue #25: the projector's own connection (``open_projections``), and any cursor of it such as the
    sandbox's, refuses ``read_text('/etc/passwd')`` in DuckDB itself: SQL run straight on it, as if the
    sandbox's syntax-tree check had been bypassed, reads no file, and no statement can turn that back on."""
    from somnus.projections.projector import open_projections

    con = asyncio.run(open_projections(tmp_path / "somnus.duckdb"))
    try:
        for cur in (con, con.cursor()):
            with pytest.raises(duckdb.PermissionException, match="disabled by configuration"):
                cur.execute("SELECT content FROM read_text('/etc/passwd')").fetchall()
            with pytest.raises(duckdb.CatalogException):  # a file name is no table: no file scan is tried
                cur.execute("SELECT * FROM '/etc/passwd'").fetchall()
            with pytest.raises(duckdb.Error, match="configuration has been locked"):
                cur.execute("SET enable_external_access = true")
        assert con.execute("SELECT current_setting('lock_configuration')").fetchone()[0] is True
        con.execute("INSERT INTO briefings_dirty VALUES ('still writes')")  # and the writer still writes
    finally:
        con.close()


def test_somnus_sql_without_a_projector_runs_in_the_sandbox(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from somnus.cli import app

    _projections(tmp_path / "somnus.duckdb").close()
    monkeypatch.setenv("SOMNUS_HOME", str(tmp_path))
    monkeypatch.setenv("SOMNUS_SQL_TIMEOUT_S", "1")
    monkeypatch.delenv("SOMNUS_DB", raising=False)
    runner = CliRunner()
    ok = runner.invoke(app, ["sql", "SELECT count(*) AS briefings_held FROM briefings"])
    assert ok.exit_code == 0, ok.output
    assert "briefings_held" in ok.output and "1" in ok.output
    for sql, says in [
        ("EXPLAIN ANALYZE DELETE FROM briefings", "DELETE"),
        ("SELECT current_setting('enable_external_access')", "current_setting"),
        ("SELECT content FROM read_text('/etc/passwd')", "read_text"),
        (LONG, "SOMNUS_SQL_TIMEOUT_S"),
    ]:
        got = runner.invoke(app, ["sql", sql])
        assert got.exit_code != 0 and says in " ".join(got.output.split()), got.output
    con = duckdb.connect(str(tmp_path / "somnus.duckdb"), read_only=True)
    assert con.execute("SELECT count(*) FROM briefings").fetchone()[0] == 1
    con.close()


def test_over_http_a_long_query_leaves_the_other_routes_answering(writer, tmp_path):
    """The projector's app: /sql runs in its own threads, so /summary answers while it runs."""
    from aiohttp.test_utils import TestClient, TestServer

    from somnus.projections import auth
    from somnus.projections.http import make_app

    service = api.ReadService(writer.cursor(), {}, sandbox=SqlSandbox(writer, timeout_s=3.0))
    token = auth.ensure_operator_token(tmp_path)
    headers = {"Authorization": f"Bearer {token}"}

    async def run() -> tuple[int, dict[str, Any], float, float]:
        app = make_app(service, api.all_routes(), tokens=auth.TokenStore(tmp_path))
        async with TestClient(TestServer(app, host="127.0.0.1")) as client:
            t0 = time.monotonic()
            long = asyncio.ensure_future(client.post("/sql", json={"sql": LONG}, headers=headers))
            await asyncio.sleep(0.5)
            t1 = time.monotonic()
            async with await client.get("/summary", headers=headers) as resp:
                assert resp.status == 200 and (await resp.json())["counts"]["briefings"] == 1
            summary_s = time.monotonic() - t1
            async with await long as resp:
                return resp.status, json.loads(await resp.text()), summary_s, time.monotonic() - t0

    status, body, summary_s, sql_s = asyncio.run(run())
    assert summary_s < 1.5  # answered during the query, not after it
    assert status == 400 and "SOMNUS_SQL_TIMEOUT_S" in body["error"]
    assert 2.5 < sql_s < 15


# ---- attacks (issue 25, 2026-11-27): each failed on the code before its fix -------------------------


def test_an_answer_is_bounded_in_rows_and_bytes_with_an_error_saying_so(writer):
    # the answer was fetched whole (fetchall) and made into JSON: SELECT i FROM range(10000000) took 2 GB
    # and 26 s (the time limit interrupts DuckDB, not the rows' conversion to Python)
    box = SqlSandbox(writer, timeout_s=5, max_rows=1000, max_bytes=10_000)
    assert len(box.run("SELECT i FROM range(1000) t(i)")["rows"]) == 1000
    with pytest.raises(SqlRefused, match="more than 1000 rows: add a LIMIT"):
        box.run("SELECT i FROM range(1001) t(i)")
    with pytest.raises(SqlRefused, match="larger than 10000 bytes after 1 rows"):
        box.run("SELECT repeat('x', 20000) AS s")
    with pytest.raises(SqlRefused, match="larger than 10000 bytes"):
        box.run("SELECT [repeat('x', 100)] AS l, {'k': repeat('y', 100)} AS s FROM range(100)")
    service = api.ReadService(writer.cursor(), {}, sandbox=box)
    route = next(r for r in api.ROUTES if r.handler == "sql")
    with pytest.raises(api.BadRequest, match="more than 1000 rows"):
        api.call(service, route, None, {"sql": "SELECT * FROM range(5000)"})
    assert box.run("SELECT 1 AS one") == {"columns": ["one"], "rows": [[1]]}  # the sandbox is fine after


def test_fetching_a_long_answer_is_held_to_the_time_limit_too(writer):
    box = SqlSandbox(writer, timeout_s=0.5, max_rows=10**9, max_bytes=10**12)
    t0 = time.monotonic()
    with pytest.raises(SqlTimeout, match="time limit of 0.5 s"):
        box.run("SELECT i FROM range(3000000) t(i)")  # DuckDB is done at once; its 3 million rows are not
    assert time.monotonic() - t0 < 3
