"""``forget``: a request to forget a user, an agent or a session, and ``--verify`` that nothing is left."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import typer

from somnus.cli.app import app
from somnus.cli.common import AT_HELP, BootOpt, DbOpt, HomeOpt, bootstrap, event_time, fail, settings


@app.command()
def forget(
    user: Optional[str] = typer.Option(None, "--user", help="Forget this user's sessions and memories."),
    agent: Optional[str] = typer.Option(None, "--agent", help="Forget everything of this agent."),
    session: Optional[str] = typer.Option(None, "--session", help="Forget the sessions with this id."),
    reason: Optional[str] = typer.Option(None, "--reason", help="Why (kept with the request)."),
    verify: bool = typer.Option(False, "--verify", help="Check instead: no needle left (exit 1 if any)."),
    needle: list[str] = typer.Option(
        [], "--needle", help="--verify: a text of the subject's to look for (repeatable; at least one)."
    ),
    replay: bool = typer.Option(
        True,
        "--replay/--no-replay",
        help="--verify: also replay every topic "
        "into a fresh file (beside the DuckDB file, deleted after) and check it.",
    ),
    at: Optional[str] = typer.Option(None, "--at", help=AT_HELP),
    db: Optional[Path] = DbOpt,
    home: Optional[Path] = HomeOpt,
    bootstrap_: Optional[str] = BootOpt,
) -> None:
    """Forget a user, an agent or a session: a request on the facts topic that the projector applies
    (projections/forget.py). With --verify, look for the given texts in the DuckDB file's bytes (and
    WAL) and rows, count the subject's rows, do the same in a replay into a fresh file, and report the
    texts found in the topics as the projector reads them; exit 1 if anything is found. SECURITY.md, "Forget"."""
    import asyncio

    from somnus import memory_requests
    from somnus.projections.forget import file_hits
    from somnus.reads import ReadError
    from somnus.reads import sql as read_sql
    from somnus.streams.topics import topic_hits

    named = [(k, v) for k, v in (("user", user), ("agent", agent), ("session", session)) if v]
    if len(named) != 1:
        fail("name exactly one of --user, --agent, --session")
    kind, value = named[0]
    s = settings(home, db, bootstrap_)
    if not verify:
        scope = f"agent:{value}" if kind == "agent" else "global"
        when = event_time(s, at, scope)
        # the subject's sessions as projected (before the request removes them): their keys go too
        projected = _projected_sessions(s, kind, value)
        req = memory_requests.forget(s, bootstrap(s), kind, value, reason, when)
        print(f"forget requested: {kind} {value} at {req.at.isoformat()} (request {req.request_id})")
        from somnus.streams.keys import delete_keys, read_keys

        try:
            keyring = asyncio.run(read_keys(bootstrap(s), s.keys_topic, s))
        except RuntimeError as exc:  # no key topic: nothing was sealed (SECURITY.md, plaintext producers)
            fail(f"{exc}: no data key to delete; the subject's records in Kafka stay readable")
        doomed = sorted(set(keyring.select(kind, value)) | set(keyring.select_sessions(projected)))
        deleted = asyncio.run(delete_keys(bootstrap(s), s.keys_topic, doomed, s))
        print(
            f"data keys deleted: {deleted} (the subject's sealed records in Kafka can no longer be opened; "
            f"{s.keys_topic} compacts them away)"
        )
        return
    if not needle:
        fail(
            "--verify needs at least one --needle: a text of the subject's to look for (the subject's own id "
            "stays in the `forgotten` table by design)"
        )
    db_path = s.db
    failed = [False]

    def report(found: Any, what: str) -> None:
        failed[0] |= bool(found)
        print(f"{'FOUND' if found else 'absent'}: {what}: {found or 0}")

    def check(path: Path, query: Any) -> None:
        """The needles in ``path``'s bytes (+ WAL) and rows, and the subject's rows, through ``query``."""
        for n, hits in file_hits(path, needle).items():
            report(hits, f"{n!r} in the bytes of {path} (+ .wal)")
        tables = [
            r[0]
            for r in query(
                "SELECT table_name FROM duckdb_tables() WHERE NOT temporary AND database_name = current_database()", []
            )
        ]
        for n in needle:
            report(
                {
                    t: c
                    for t in tables
                    if (c := query(f"SELECT count(*) FROM {t} x WHERE contains(x::VARCHAR, ?)", [n])[0][0])
                },
                f"{n!r} in the rows of {path}",
            )
        report(query(_FORGET_SUBJECT_ROWS[kind], [value] * 4)[0][0], f"rows of {kind} {value!r} in {path}")

    try:
        check(db_path, lambda q, ps: read_sql(db_path, q, ps)["rows"])
    except ReadError as exc:
        fail(str(exc))
    if replay:
        import tempfile

        import duckdb

        from somnus.projections.projector import Projector

        with tempfile.TemporaryDirectory(dir=db_path.parent, prefix="forget-verify-") as tmp:
            fresh = Path(tmp) / "replay.duckdb"
            asyncio.run(Projector(s, bootstrap(s), db_path=fresh, serve=False).run(until_end=True))
            con = duckdb.connect(str(fresh), read_only=True)
            try:
                check(fresh, lambda q, ps: con.execute(q, ps).fetchall())
            finally:
                con.close()
    from somnus.streams.keys import read_keys

    ring: Any
    try:
        ring = asyncio.run(read_keys(bootstrap(s), s.keys_topic, s))
    except RuntimeError as exc:  # no key topic: records are read as they are
        print(f"{exc}: no data keys")
        ring = None
    else:
        report(len(ring.select(kind, value)), f"data keys of {kind} {value!r} on {s.keys_topic}")
    # the worker's other table changelogs too (the working memory's is projected): sessions, causal links
    tables = [f"{s.app_id}-sessions-changelog", f"{s.app_id}-links-changelog"]
    got = asyncio.run(
        topic_hits(bootstrap(s), [*s.projected_topics, s.observations_topic], needle, s, ring, optional=tables)
    )
    for n in needle:
        report(
            got.opened.get(n, {}),
            f"{n!r} in the Kafka topics as the project reads them (sealed records opened with the keys that remain)",
        )
        report(got.raw.get(n, {}), f"{n!r} in the Kafka topics' raw record values")
        if got.keys.get(n):  # routing ids (session ids) are never sealed: SECURITY.md, "Forget"
            print(
                f"note: {n!r} is part of record keys (session ids, not sealed; they cannot be opened "
                f"to anything): {got.keys[n]}"
            )
    if got.shredded:
        print(f"sealed records whose key is gone (unreadable): {got.shredded}")
    raise typer.Exit(1 if failed[0] else 0)


def _projected_sessions(s: Any, kind: str, value: str) -> list[tuple[str, str]]:
    """``(agent, session_id)`` of the subject's sessions in the projections (none when they cannot be read):
    a user's keys made before its publisher saw the session's start do not name the user."""
    from somnus.reads import ReadError
    from somnus.reads import sql as read_sql

    column = {"user": "user_id", "agent": "agent", "session": "session_id"}[kind]
    try:
        rows = read_sql(
            Path(s.db_path),
            f"SELECT DISTINCT agent, session_id FROM episodes WHERE {column} = ? UNION "
            f"SELECT agent, session_id FROM working_memory WHERE {column} = ?",
            [value, value],
        )["rows"]
    except (ReadError, OSError) as exc:
        print(
            f"(the projections could not be read for the subject's sessions: {exc}; the keys that "
            "name the subject are deleted)"
        )
        return []
    return [(a, sid) for a, sid in rows]


_FORGET_SUBJECT_ROWS = {  # rows that still name the subject (each query takes its value four times)
    "user": "SELECT (SELECT count(*) FROM episodes WHERE user_id = ?) + (SELECT count(*) FROM memories WHERE "
    "user_id = ?) + (SELECT count(*) FROM working_memory WHERE user_id = ?) + (SELECT count(*) FROM events "
    "WHERE type = 'session_start' AND payload->>'user_id' = ?)",
    "agent": "SELECT (SELECT count(*) FROM episodes WHERE agent = ?) + (SELECT count(*) FROM memories WHERE agent = ?) "
    "+ (SELECT count(*) FROM working_memory WHERE agent = ?) + (SELECT count(*) FROM events WHERE agent = ?)",
    "session": "SELECT (SELECT count(*) FROM episodes WHERE session_id = ?) + (SELECT count(*) FROM memories WHERE "
    "run_id = ?) + (SELECT count(*) FROM working_memory WHERE session_id = ?) + (SELECT count(*) FROM "
    "events WHERE session_id = ?)",
}
