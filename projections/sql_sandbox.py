"""Analysts' SQL (``POST /sql``, ``somnus sql``), sandboxed: one SELECT, on its own connection, for a limited time.

What may run is decided by DuckDB's own parser, never by matching text:

- one statement (``extract_statements``), of type SELECT, or EXPLAIN / EXPLAIN ANALYZE of one SELECT
  (the explained statement is cut out with DuckDB's tokenizer and parsed again: ``EXPLAIN ANALYZE
  DELETE ...`` is a DELETE and refused); EXPLAIN with an option list is refused;
- the SELECT's syntax tree (``json_serialize_sql``) reads only tables and views of the database
  (or its own CTEs), calls only the table functions in ``TABLE_FUNCTIONS`` and none of the scalar
  functions in ``DENIED_FUNCTIONS`` (they change a sequence, write the log, sleep, show a setting).
  DuckDB's own views over a table function not allowed (``duckdb_databases``: the file's path,
  ``pg_settings``) are refused too, found from their definitions. A name that is
  not in the catalog is refused before DuckDB would look for a file or a Python variable of that
  name (replacement scans: ``FROM '/etc/passwd'``).

How it runs (``SqlSandbox.run``): on a cursor of its own (DuckDB lets one process hold the file, so
the projector's analysts read through a cursor of the writer's database and see committed data),
in the calling thread, which the HTTP server keeps off its event loop; interrupted
(``connection.interrupt()``) after ``SOMNUS_SQL_TIMEOUT_S`` with an error that names the limit;
its sorts and hash tables held to ``SOMNUS_SQL_MEMORY_LIMIT`` (``operator_memory_limit``, set per
connection); its answer fetched a chunk at a time, at most ``MAX_ROWS`` rows and ``MAX_ANSWER_BYTES``
of values, within the same time (the answer is made into Python values and JSON outside DuckDB,
where neither the interrupt nor the memory limit reaches: ``range(10000000)`` took 26 s past a 10 s
limit, and 2 GB).

The database is hardened too, as far as DuckDB's settings, which are global to a database (checked
with ``duckdb_settings()``), leave the projector working:

- everywhere: ``enable_external_access = false`` (no file, network or extension access at all),
  extensions are neither installed nor loaded on demand, community extensions are refused, and the
  configuration is locked (``lock_configuration``) so no statement can undo this. The projector's
  writer hands its batches to SQL with ``con.register`` (``projections/frames.py``), not by a Python
  variable's name (replacement scans, which external access off turns off), so its own database is
  closed too (issue #25): a file stays out of reach even of a query the parser check let through;
- a file opened for reads alone (``somnus sql`` with no projector running: read-only) also gets a
  ``memory_limit`` and a ``threads`` cap (the projector's are the writer's too).

>>> import duckdb
>>> con = duckdb.connect()
>>> _ = con.execute("CREATE TABLE episodes AS SELECT 1 AS n")
>>> box = SqlSandbox(con, timeout_s=5)
>>> box.run("SELECT n + ? AS m FROM episodes", [1])
{'columns': ['m'], 'rows': [[2]]}
>>> try:
...     box.run("EXPLAIN ANALYZE DELETE FROM episodes")
... except SqlRefused as exc:
...     print(exc)
only a SELECT can be explained here, not DELETE
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable, Iterator
from typing import Any

import duckdb
from somnus.config import Settings

# Table functions a query may call: generators, JSON, and the catalog's own descriptions. The rest
# read files (read_csv, read_text, glob, parquet_*...), run other SQL (query, query_table), or show
# or change the engine's state (duckdb_secrets, checkpoint, enable_logging...).
TABLE_FUNCTIONS = frozenset(
    {
        "range",
        "generate_series",
        "unnest",
        "json_each",
        "json_tree",
        "duckdb_tables",
        "duckdb_views",
        "duckdb_columns",
        "duckdb_schemas",
        "duckdb_constraints",
        "duckdb_indexes",
        "duckdb_types",
        "duckdb_functions",
        "duckdb_keywords",
        "duckdb_sequences",
        "duckdb_dependencies",
        "pragma_table_info",
    }
)
# Scalar functions with an effect beyond their answer. (Pragmas and table functions are not callable
# in a SELECT's expressions; those with effects are named too, in case a version makes them so.)
DENIED_FUNCTIONS = frozenset(
    {
        "nextval",
        "setval",
        "setseed",
        "write_log",
        "sleep_ms",
        "pg_sleep",
        "import_database",
        "copy_database",
        "force_checkpoint",
        "checkpoint",
        "json_execute_serialized_sql",
        "enable_profile",
        "enable_profiling",
        "disable_profile",
        "disable_profiling",
        "enable_logging",
        "disable_logging",
        "truncate_duckdb_logs",
        "enable_checkpoint_on_shutdown",
        "disable_checkpoint_on_shutdown",
        "add_parquet_key",
        "getenv",
        "current_setting",  # the settings: the database's path, its temporary and secret directories
    }
)
# An answer's bounds: rows, and bytes of its values (strings and blobs by length, other values 8).
MAX_ROWS = 1_000_000
MAX_ANSWER_BYTES = 64 << 20
FETCH_ROWS = 2048  # rows fetched at once, then counted
# SHOW TABLES / SHOW ALL TABLES / SHOW DATABASES name these instead of a table.
SHOW_SPECIAL = frozenset({"tables", "__show_tables_expanded", "databases"})
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_SEARCH_PATH = ("main", "pg_catalog")  # where an unqualified name resolves (besides CTEs)


def one_row(con: duckdb.DuckDBPyConnection, sql: str, params: list[Any] | None = None) -> tuple[Any, ...]:
    """The row of a query that returns exactly one (an aggregate, a setting). Read to its end
    (fetchall, not fetchone): an unread result holds its transaction open on a long-lived cursor."""
    rows = con.execute(sql, params).fetchall() if params else con.execute(sql).fetchall()
    if not rows:
        raise LookupError(f"no row: {sql}")
    return rows[0]


class SqlRefused(ValueError):
    """The SQL is not one read-only query this sandbox runs; the message says why."""


class SqlTimeout(TimeoutError):
    """The query ran out of its time and was interrupted; the message names the limit."""


def value_bytes(value: Any) -> int:
    """About what ``value`` weighs in an answer: strings and blobs by length, containers by their items
    (iteratively: a deep list needs no deep stack), anything else 8."""
    total, stack = 0, [value]
    while stack:
        v = stack.pop()
        if isinstance(v, (str, bytes, bytearray, memoryview)):
            total += len(v)
        elif isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, (list, tuple)):
            stack.extend(v)
        else:
            total += 8
    return total


def _explained(text: str) -> tuple[str, str]:
    """Split ``EXPLAIN [ANALYZE] <statement>`` into its prefix and the statement explained."""
    found = duckdb.tokenize(text)
    words = [
        (off, text[off : (found[i + 1][0] if i + 1 < len(found) else len(text))].strip().upper())
        for i, (off, kind) in enumerate(found)
        if "comment" not in str(kind)
    ]
    if len(words) < 2 or words[0][1] != "EXPLAIN":
        raise SqlRefused("could not find the statement this EXPLAIN explains")
    rest = 1
    if words[1][1] in ("ANALYZE", "ANALYSE"):
        rest = 2
    elif words[1][1].startswith("("):
        raise SqlRefused("EXPLAIN with options is not allowed here: use EXPLAIN or EXPLAIN ANALYZE")
    if rest >= len(words):
        raise SqlRefused("EXPLAIN of nothing")
    return ("EXPLAIN ANALYZE " if rest == 2 else "EXPLAIN "), text[words[rest][0] :]


def statement(sql: str, parse: Callable[[str], list[Any]] = duckdb.extract_statements) -> tuple[str, str]:
    """``("", select)`` for one SELECT, ``("EXPLAIN [ANALYZE] ", select)`` for an EXPLAIN of one;
    ``SqlRefused`` for anything else, by DuckDB's parser (``parse``: a connection's ``extract_statements``).

    >>> statement("EXPLAIN ANALYZE SELECT 1")
    ('EXPLAIN ANALYZE ', 'SELECT 1')
    >>> try:
    ...     statement("EXPLAIN ANALYZE SET threads = 1")
    ... except SqlRefused as exc:
    ...     print(exc)
    only a SELECT can be explained here, not SET
    """
    try:
        statements = parse(sql)
    except duckdb.Error as exc:
        raise SqlRefused(str(exc)) from None
    if not statements:
        raise SqlRefused("no SQL statement given")
    if len(statements) > 1:
        raise SqlRefused(f"one statement at a time, got {len(statements)}")
    st = statements[0]
    if st.type == duckdb.StatementType.SELECT:
        return "", st.query
    if st.type != duckdb.StatementType.EXPLAIN:
        raise SqlRefused(f"only a SELECT query (or EXPLAIN of one) is allowed here, not {st.type.name}")
    prefix, inner = _explained(st.query)
    try:
        explained = parse(inner)
    except duckdb.Error as exc:
        raise SqlRefused(str(exc)) from None
    if len(explained) != 1 or explained[0].type != duckdb.StatementType.SELECT:
        got = explained[0].type.name if len(explained) == 1 else f"{len(explained)} statements"
        raise SqlRefused(f"only a SELECT can be explained here, not {got}")
    return prefix, explained[0].query


def _walk(tree: Any) -> Iterator[dict[str, Any]]:
    """Every object in a serialized syntax tree (iteratively: a deep tree needs no deep stack)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            yield node
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)


class SqlSandbox:
    """Runs analysts' SELECTs on cursors of ``con``'s database (see the module's docstring).

    ``con`` is the connection the sandbox draws its cursors from; make it in the thread that owns
    ``con`` (cursors are then made under a lock, from any thread).
    """

    def __init__(
        self,
        con: duckdb.DuckDBPyConnection,
        timeout_s: float = 10.0,
        memory_limit: str = "1GB",
        threads: int = 2,
        max_rows: int = MAX_ROWS,
        max_bytes: int = MAX_ANSWER_BYTES,
    ) -> None:
        self.timeout_s, self.memory_limit = float(timeout_s), memory_limit
        self.max_rows, self.max_bytes = max_rows, max_bytes
        self._base = con.cursor()
        self._lock = threading.Lock()
        self._running: set[duckdb.DuckDBPyConnection] = set()
        self.dedicated = harden(self._base, memory_limit, threads)
        self._shows = _refused_views(self._base)  # DuckDB's own views: fixed by its version, so read once

    @classmethod
    def from_settings(cls, con: duckdb.DuckDBPyConnection, settings: Any = None) -> SqlSandbox:
        """A sandbox with the limits of ``settings`` (default: resolved from the environment)."""
        s = settings or Settings.resolve()
        return cls(con, timeout_s=s.sql_timeout_s, memory_limit=s.sql_memory_limit, threads=s.sql_threads)

    def _cursor(self) -> duckdb.DuckDBPyConnection:
        with self._lock:
            cur = self._base.cursor()
        cur.execute(f"SET operator_memory_limit = '{_quoted(self.memory_limit)}'")
        return cur

    # ---- what may run ----
    def check(self, sql: str) -> str:
        """The statement to run for ``sql``, or ``SqlRefused`` saying why it may not run."""
        cur = self._cursor()
        try:
            prefix, select = statement(sql, cur.extract_statements)
            self._check_select(cur, select)
            return prefix + select
        finally:
            cur.close()

    def _check_select(self, cur: duckdb.DuckDBPyConnection, text: str) -> None:
        raw = one_row(cur, "SELECT json_serialize_sql(?::VARCHAR)", [text])[0]
        try:
            tree = json.loads(raw)
        except RecursionError:
            raise SqlRefused("the query is nested too deeply") from None
        if tree.get("error"):
            raise SqlRefused(f"{tree.get('error_type', 'parser')} error: {tree.get('error_message', '')}")
        if len(tree.get("statements", ())) != 1:
            raise SqlRefused("only one SELECT is allowed here")
        ctes: set[str] = set()
        tables: list[dict[str, Any]] = []
        for node in _walk(tree["statements"][0]):
            cte_map = node.get("cte_map")
            for entry in cte_map.get("map", ()) if isinstance(cte_map, dict) else ():
                name = str(entry.get("key", ""))
                if not _IDENTIFIER.match(name):
                    raise SqlRefused(f"a CTE's name must be a plain identifier, not {name!r}")
                ctes.add(name.lower())
            kind = node.get("type")
            if kind == "BASE_TABLE":
                tables.append(node)
            elif kind == "TABLE_FUNCTION":
                name = str((node.get("function") or {}).get("function_name", "")).lower()
                if name not in TABLE_FUNCTIONS:
                    raise SqlRefused(
                        f"table function {name}() is not allowed here (it reaches outside the "
                        f"projections); allowed: {', '.join(sorted(TABLE_FUNCTIONS))}"
                    )
            elif kind == "SHOW_REF" and node.get("table_name"):
                if str(node["table_name"]).strip('"').lower() not in SHOW_SPECIAL:
                    tables.append(node)
            if node.get("class") == "FUNCTION":
                name = str(node.get("function_name", "")).lower()
                if name in DENIED_FUNCTIONS or name.startswith("__internal"):
                    raise SqlRefused(
                        f"function {name}() is not allowed here (it changes state or reaches outside the projections)"
                    )
        if tables:
            known, catalogs = _catalog(cur)
            for ref in tables:
                _check_table(ref, known, catalogs, ctes, self._shows)

    # ---- running ----
    def run(self, sql: str, params: list[Any] | None = None) -> dict[str, Any]:
        """Run one read-only query (``?`` placeholders take ``params``) within the time limit;
        ``{"columns": [...], "rows": [[...], ...]}``."""
        statement = self.check(sql)
        cur = self._cursor()
        timed_out = threading.Event()

        def expire() -> None:
            timed_out.set()
            cur.interrupt()

        timer = threading.Timer(self.timeout_s, expire)
        timer.daemon = True
        with self._lock:
            self._running.add(cur)
        timer.start()
        try:
            rel = cur.execute(statement, params) if params else cur.execute(statement)
            columns = [d[0] for d in rel.description] if rel.description else []
            rows = self._fetch(rel, timed_out)
        except duckdb.InterruptException:
            if timed_out.is_set():
                raise self._timeout() from None
            raise
        finally:
            timer.cancel()
            with self._lock:
                self._running.discard(cur)
            cur.close()
        return {"columns": columns, "rows": [list(r) for r in rows]}

    def _timeout(self) -> SqlTimeout:
        return SqlTimeout(
            f"the query was interrupted after its time limit of {self.timeout_s:g} s (SOMNUS_SQL_TIMEOUT_S)"
        )

    def _fetch(self, rel: duckdb.DuckDBPyConnection, timed_out: threading.Event) -> list[Any]:
        """The answer's rows, a chunk at a time: ``SqlRefused`` past ``max_rows`` or ``max_bytes``, and
        ``SqlTimeout`` past the time limit (fetching and converting rows is not interrupted by DuckDB)."""
        rows: list[Any] = []
        size = 0
        while chunk := rel.fetchmany(FETCH_ROWS):
            rows += chunk
            size += value_bytes(chunk)
            if len(rows) > self.max_rows:
                raise SqlRefused(f"the answer has more than {self.max_rows} rows: add a LIMIT, or aggregate")
            if size > self.max_bytes:
                raise SqlRefused(
                    f"the answer is larger than {self.max_bytes} bytes after {len(rows)} rows: add a LIMIT, "
                    "select fewer columns or shorten long values"
                )
            if timed_out.is_set():
                raise self._timeout()
        return rows

    def interrupt(self) -> int:
        """Interrupt every query running now (a stopping server); how many there were."""
        with self._lock:
            running = list(self._running)
        for cur in running:
            cur.interrupt()
        return len(running)


def harden(con: duckdb.DuckDBPyConnection, memory_limit: str = "1GB", threads: int = 2) -> bool:
    """Close ``con``'s database to files, the network and extensions, then lock its configuration; a
    read-only database (opened for reads alone) also gets the memory and thread caps, which a writer's
    database keeps for its writer. True when the database is read-only.
    Nothing is set again on a database already locked."""

    # Read to their end (fetchall): an unread result holds its transaction, and the sandbox keeps this
    # cursor for the projector's life; on a database already locked nothing runs after these, and the
    # open transaction kept a forget's scrub from ever checkpointing (projections/read_cursor.py).
    def setting(name: str) -> Any:
        return one_row(con, "SELECT current_setting(?)", [name])[0]

    read_only = bool(
        one_row(con, "SELECT readonly FROM duckdb_databases() WHERE database_name = current_database()")[0]
    )
    if str(setting("lock_configuration")).lower() in ("true", "1"):
        return read_only
    statements = [
        "SET autoinstall_known_extensions = false",
        "SET autoload_known_extensions = false",
        "SET allow_community_extensions = false",
        "SET enable_external_access = false",
    ]
    if read_only:
        statements += [f"SET memory_limit = '{_quoted(memory_limit)}'", f"SET threads = {int(threads)}"]
    # Each sandbox cursor sets its own operator memory limit: the one setting left open.
    statements += ["SET allowed_configs = ['operator_memory_limit']", "SET lock_configuration = true"]
    for statement in statements:
        con.execute(statement)
    return read_only


def _quoted(value: str) -> str:
    return str(value).replace("'", "''")


def _catalog(cur: duckdb.DuckDBPyConnection) -> tuple[set[tuple[str, str]], set[str]]:
    """Every (schema, name) of a table or view the database holds, and its catalogs' names (lower case)."""
    rows = cur.execute(
        "SELECT schema_name, table_name FROM duckdb_tables() UNION ALL "
        "SELECT schema_name, view_name FROM duckdb_views()"
    ).fetchall()
    catalogs = {r[0].lower() for r in cur.execute("SELECT database_name FROM duckdb_databases()").fetchall()}
    return {(s.lower(), n.lower()) for s, n in rows}, catalogs


def _refused_views(cur: duckdb.DuckDBPyConnection) -> dict[tuple[str, str], str]:
    """The system views that show a table function a query may not call (``duckdb_databases``: the
    file's path; ``pg_settings``: every setting), by that function."""
    functions = {
        r[0].lower()
        for r in cur.execute("SELECT function_name FROM duckdb_functions() WHERE function_type = 'table'").fetchall()
    }
    shows = {}
    internal = cur.execute("SELECT schema_name, view_name, sql FROM duckdb_views() WHERE internal").fetchall()
    for schema, view, sql in internal:
        # DuckDB's own definitions (not a query's text): the table functions they call
        called = sorted({f.lower() for f in _CALL.findall(sql or "")} & functions - TABLE_FUNCTIONS)
        if called:
            shows[(schema.lower(), view.lower())] = called[0]
    return shows


_CALL = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*\(")


def _check_table(
    ref: dict[str, Any],
    known: set[tuple[str, str]],
    catalogs: set[str],
    ctes: set[str],
    shows: dict[tuple[str, str], str] | None = None,
) -> None:
    name = str(ref.get("table_name", "")).lower()
    schema = str(ref.get("schema_name", "") or "").lower()
    catalog = str(ref.get("catalog_name", "") or "").lower()
    if not schema and not catalog and name in ctes:
        return
    if catalog and catalog not in catalogs:
        raise SqlRefused(f"no database named {catalog!r} here")
    if schema:  # `x.t` is schema x's table t, or (DuckDB tries both) database x's main.t
        candidates = [(schema, name)] + ([("main", name)] if not catalog and schema in catalogs else [])
    else:
        candidates = [(s, name) for s in _SEARCH_PATH]
    found = next((c for c in candidates if c in known), None)
    shown = (shows or {}).get(found) if found is not None else None
    if shown is not None:
        raise SqlRefused(
            f"view {ref.get('table_name')!r} is not allowed here: it shows {shown}(), which reaches outside "
            "the projections"
        )
    if found is None:
        raise SqlRefused(
            f"no table or view named {ref.get('table_name')!r} (only the projections' tables and "
            "views can be read here, not files)"
        )
