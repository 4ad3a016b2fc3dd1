"""The ``somnus`` command line."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console
from rich.table import Table

from somnus import broker as broker_mod
from somnus import procs
from somnus.config import Settings
from somnus.schemas.codec import encode as encode_event

app = typer.Typer(help="Somnus: memory for fleets of AI agents (Kafka -> Faust -> DuckDB).", no_args_is_help=True,
                  pretty_exceptions_enable=False)
broker_app = typer.Typer(help="The local single-node Kafka broker (KRaft).", no_args_is_help=True)
bench_app = typer.Typer(help="Benchmarks (see BENCHMARKS.md).", no_args_is_help=True)
token_app = typer.Typer(help="Bearer tokens for the HTTP reads (SECURITY.md).", no_args_is_help=True)
app.add_typer(broker_app, name="broker")
app.add_typer(bench_app, name="bench")
app.add_typer(token_app, name="token")
console = Console()
err = Console(stderr=True)

HomeOpt = typer.Option(None, "--home", help="State folder (SOMNUS_HOME).")
DbOpt = typer.Option(None, "--db", help="DuckDB file (SOMNUS_DB).")
BootOpt = typer.Option(None, "--bootstrap", help="Kafka bootstrap servers (KAFKA_BOOTSTRAP).")


def _settings(home: Optional[Path] = None, db: Optional[Path] = None, bootstrap: Optional[str] = None) -> Settings:
    return Settings.resolve(home=home, db_path=db, bootstrap=bootstrap)


def _fail(message: str, code: int = 1) -> None:
    err.print(f"[red]error:[/red] {message}")
    raise typer.Exit(code)


KeepBrokerOpt = typer.Option(False, "--keep-broker", help="Leave the local broker running if this run started it.")


def _keep_broker(keep: bool) -> None:
    """A run that starts the local broker stops it again (somnus.bench.isolated_pipeline) unless kept."""
    if keep:
        import os

        os.environ["SOMNUS_KEEP_BROKER"] = "1"


def _bootstrap(settings: Settings, start: bool = False) -> str:
    try:
        return broker_mod.bootstrap_for(settings, start_if_missing=start)
    except broker_mod.BrokerError as exc:
        _fail(str(exc))
        raise


def _event_time(settings: Settings, at: Optional[str], scope: str) -> Any:
    """The event time of a person's command about ``scope``: ``--at`` when given (UTC unless it says),
    else the scope's stream time (the newest event time of its agents: ``stream_time`` read), so a
    command on historical data is stamped in that data's time, as it would have been live. The wall
    clock only when the scope has no event yet."""
    from datetime import datetime, timezone

    from somnus.reads import ReadError, read

    if at:
        try:
            when = datetime.fromisoformat(at.replace("Z", "+00:00"))
        except ValueError:
            _fail(f"--at {at!r}: not an ISO 8601 time")
            raise
        return when if when.tzinfo is not None else when.replace(tzinfo=timezone.utc)
    if not Path(settings.db_path).exists():  # type: ignore[arg-type]
        got: dict[str, Any] = {"at": None}  # nothing projected yet: no event to be consistent with
    else:
        try:
            got = read(Path(settings.db_path), "stream_time", agents_dir=settings.agents_dir, scope=scope)  # type: ignore[arg-type]
        except ReadError as exc:
            _fail(str(exc))
            raise
    if got["at"] is None:
        err.print(f"[dim]{scope} has no event yet: stamped with the wall clock[/dim]")
        return datetime.now(timezone.utc)
    return datetime.fromisoformat(got["at"])


_AT_HELP = "Event time (ISO 8601; UTC unless it says); default: the stream time of the scope it concerns."


# ---- broker ------------------------------------------------------------------------------

@broker_app.command("fetch")
def broker_fetch(home: Optional[Path] = HomeOpt) -> None:
    """Resolve the Kafka jars from Maven Central into the cache (once)."""
    s = _settings(home)
    try:
        libs = broker_mod.fetch(s, quiet=True)  # Maven's own log only when it fails (in the error)
    except broker_mod.BrokerError as exc:
        _fail(str(exc))
        raise
    console.print(f"Kafka {broker_mod.KAFKA_VERSION} jars in {libs}")


@broker_app.command("start")
def broker_start(home: Optional[Path] = HomeOpt) -> None:
    """Start the local broker (free ports, formatted log dir) and wait until it accepts connections."""
    s = _settings(home)
    try:
        info = broker_mod.start(s)
    except broker_mod.BrokerError as exc:
        _fail(str(exc))
    console.print(f"broker running: pid {info.pid}, bootstrap {info.bootstrap}")


@broker_app.command("stop")
def broker_stop(home: Optional[Path] = HomeOpt) -> None:
    """Stop the local broker cleanly."""
    console.print("broker stopped" if broker_mod.stop(_settings(home)) else "no broker was running")


@broker_app.command("status")
def broker_status(home: Optional[Path] = HomeOpt, as_json: bool = typer.Option(False, "--json")) -> None:
    """Is the local broker running, and where?"""
    info = broker_mod.status(_settings(home))
    if as_json:
        print(json.dumps({"running": info is not None, **(info.__dict__ if info else {})}))
    elif info:
        console.print(f"running: pid {info.pid}, bootstrap {info.bootstrap}")
    else:
        console.print("not running")
        raise typer.Exit(3)


# ---- running -----------------------------------------------------------------------------

@app.command()
def up(detach: bool = typer.Option(False, "--detach", "-d", help="Return once started (a supervisor keeps them running)."),
       home: Optional[Path] = HomeOpt, db: Optional[Path] = DbOpt, bootstrap: Optional[str] = BootOpt) -> None:
    """Start the broker (unless one is configured), create the topics, and the worker and the projector
    under a supervisor that starts either again when it exits (somnus/supervisor.py)."""
    from somnus.projections.auth import ensure_operator_token
    from somnus.supervisor import serve

    s = _settings(home, db, bootstrap)
    ensure_operator_token(s.home)  # SOMNUS_HOME/token (0600): what the CLI sends to the projector
    boot = _bootstrap(s, start=True)
    from somnus.streams.topics import ensure_topics

    ensure_topics(s, boot)
    already = procs.running(s, "supervisor")
    if already is not None:
        console.print(f"somnus up: already running (supervisor pid {already}), logs in {s.run_dir}")
        return
    local = s.bootstrap is None  # the project's own broker: the supervisor watches it too
    if detach:
        procs.spawn(s, boot, "supervisor", extra_args=["--broker"] if local else [])
        deadline = time.monotonic() + 60
        while not all(procs.running(s, r) for r in ("projector", "worker", "supervisor")):
            if time.monotonic() > deadline or procs.running(s, "supervisor") is None:
                _fail(f"the supervisor did not start the worker and the projector; see {s.run_dir}/supervisor.log")
            time.sleep(0.1)
        console.print(f"somnus up: bootstrap {boot}, db {s.db_path}, logs in {s.run_dir}")
        return
    serve(s, boot, local, say=lambda m: console.print(f"[yellow]{m}[/yellow]"), started=lambda: console.print(
        f"somnus up: bootstrap {boot}, db {s.db_path}, logs in {s.run_dir} (Ctrl-C or somnus down stops)"))


@app.command()
def down(home: Optional[Path] = HomeOpt, db: Optional[Path] = DbOpt) -> None:
    """Stop the supervisor, the worker and the projector (the broker keeps running until `somnus broker stop`)."""
    s = _settings(home, db)
    was = {role: procs.running(s, role) is not None for role in ("worker", "projector")}
    if procs.stop(s, "supervisor", timeout_s=90.0):  # it stops its processes: nothing is started again
        console.print("supervisor: stopped")
    for role in ("worker", "projector"):
        console.print(f"{role}: {'stopped' if procs.stop(s, role) or was[role] else 'not running'}")


# ---- tokens ------------------------------------------------------------------------------

@token_app.command("create")
def token_create(agent: Optional[str] = typer.Option(None, "--agent", help="The agent whose scope chain it reads."),
                 user: Optional[str] = typer.Option(None, "--user", help="Only this user's memories of the agent."),
                 operator: bool = typer.Option(False, "--operator", help="Every route (SQL, whole-store reads)."),
                 label: str = typer.Option("", "--label", help="A note shown by `somnus token list`."),
                 home: Optional[Path] = HomeOpt) -> None:
    """Print a new token (stored hashed in SOMNUS_HOME; shown once): `export SOMNUS_TOKEN=$(somnus token create ...)`."""
    from somnus.projections.auth import TokenStore
    from somnus.agents import AgentFileError, load_agents

    s = _settings(home)
    if operator and (agent or user):
        _fail("an operator token reads everything: give --operator alone, or --agent [--user]")
    try:
        token, record = TokenStore(s.home).create(operator=operator, agent=agent, user=user, label=label)
    except ValueError as exc:
        _fail(str(exc))
    try:
        if agent and agent not in load_agents(s.agents_dir):
            err.print(f"[yellow]note:[/yellow] {agent!r} is not declared in the agents folder; the token reads "
                      "its own scope and global")
    except AgentFileError:
        pass
    err.print(f"token {record.id} for {record.principal().describe()}")
    print(token)


@token_app.command("list")
def token_list(home: Optional[Path] = HomeOpt, as_json: bool = typer.Option(False, "--json")) -> None:
    """The issued tokens (ids and scopes; the tokens themselves are not stored)."""
    import msgspec

    from somnus.projections.auth import TokenStore

    records = TokenStore(_settings(home).home).records()
    if as_json:
        print(json.dumps([{k: v for k, v in msgspec.to_builtins(r).items() if k != "sha256"} for r in records]))
        return
    table = Table("id", "reads", "created", "label")
    for r in records:
        table.add_row(r.id, r.principal().describe(), r.created_at, r.label)
    console.print(table)


@token_app.command("revoke")
def token_revoke(which: str = typer.Argument(..., help="A token id (from `somnus token list`) or the token."),
                 home: Optional[Path] = HomeOpt) -> None:
    """Revoke a token: refused from the next request on (the servers follow the store)."""
    from somnus.projections.auth import TokenStore

    try:
        gone = TokenStore(_settings(home).home).revoke(which)
    except ValueError as exc:
        _fail(str(exc))
    if not gone:
        _fail(f"no token matches {which!r} (ids have at least 6 characters)")
    for r in gone:
        console.print(f"revoked {r.id} ({r.principal().describe()})")


# ---- input -------------------------------------------------------------------------------

@app.command()
def publish(file: Path = typer.Argument(..., exists=True, dir_okay=False, help="JSON lines of v1 trace events."),
            home: Optional[Path] = HomeOpt, bootstrap: Optional[str] = BootOpt) -> None:
    """Publish trace events (one JSON object a line) to the traces topic, keyed by session_id."""
    from somnus.client import publish as do_publish

    s = _settings(home, None, bootstrap)
    boot = _bootstrap(s)
    from somnus.streams.topics import ensure_topics

    ensure_topics(s, boot)
    with file.open("rb") as f:
        lines = (line.rstrip(b"\n") for line in f if line.strip())
        n = do_publish(lines, boot, s.traces_topic)
    console.print(f"published {n} events to {s.traces_topic}")


@app.command("import")
def import_(paths: list[str] = typer.Argument(..., help="Files, directories or globs (quoted: 'runs/**/*.traj')."),
            fmt: str = typer.Option(..., "--format", help="openai-chat | swe-agent | locomo | v1"),
            agent: Optional[str] = typer.Option(None, "--agent", help="Agent name for the imported sessions."),
            results: Optional[Path] = typer.Option(
                None, "--results", exists=True, dir_okay=False,
                help="Outcomes by id: a SWE-bench results.json (resolved/unresolved ids) or a JSON map id -> outcome."),
            start: Optional[str] = typer.Option(
                None, "--start", help="ISO time of the first session that carries no time (default 2024-05-15T20:00:00Z)."),
            spacing: float = typer.Option(600.0, "--spacing", help="Seconds between the starts of such sessions, in file order."),
            out: Optional[Path] = typer.Option(None, "--out", help="Write v1 events here (JSON lines) instead of publishing."),
            home: Optional[Path] = HomeOpt, bootstrap: Optional[str] = BootOpt) -> None:
    """Turn transcripts of other tools into v1 trace events and publish them with one producer (or write
    them with --out). Many files, directories and globs in one call, with a progress bar."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

    from somnus.importers import FORMATS, ImportShapeError, expand_paths, import_run

    if fmt not in FORMATS:
        _fail(f"unknown --format {fmt!r}; choose one of: {', '.join(FORMATS)}")
    try:
        files = expand_paths(paths, fmt)
        run = import_run(start=start, spacing_s=spacing, results=results)
    except ImportShapeError as exc:
        _fail(str(exc))
    if out is not None:
        sink: Any = out.open("wb")
    else:
        from somnus.client import Publisher
        from somnus.streams.topics import ensure_topics

        s = _settings(home, None, bootstrap)
        boot = _bootstrap(s)
        ensure_topics(s, boot)
        sink = Publisher(boot, s.traces_topic)
    sessions: set[str] = set()
    pending: list[dict[str, Any]] = []
    n = 0
    try:
        with Progress("[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(),
                      TimeRemainingColumn(), console=err, transient=False) as bar:
            task = bar.add_task(f"importing {fmt}", total=len(files))
            for path in files:
                pending += FORMATS[fmt](path, agent=agent, run=run)
                if len(pending) >= IMPORT_CHUNK:  # one acknowledged send per chunk, not per file
                    n += _deliver(sink, pending, sessions)
                bar.advance(task)
            n += _deliver(sink, pending, sessions)
    except ImportShapeError as exc:
        _fail(str(exc))
    finally:
        sink.close()
    where = f"wrote {n} events to {out}" if out is not None else f"published {n} events to {s.traces_topic}"
    console.print(f"imported {len(sessions)} sessions from {len(files)} files: {where}")


IMPORT_CHUNK = 20_000  # events per acknowledged send of `somnus import`


def _deliver(sink: Any, events: list[dict[str, Any]], sessions: set[str]) -> int:
    """Write events to a file (JSON lines) or send them with the open publisher, note their sessions,
    and empty the list; how many were delivered."""
    import orjson

    sessions.update(str(e.get("session_id")) for e in events)
    if hasattr(sink, "send"):
        n = sink.send(events) if events else 0
    else:
        sink.write(b"".join(orjson.dumps(e) + b"\n" for e in events))
        n = len(events)
    events.clear()
    return n


@app.command()
def sample(out: Path = typer.Argument(..., dir_okay=False, help="Where to write the JSON lines."),
           sessions: int = typer.Option(200, "--sessions"), seed: int = typer.Option(42, "--seed")) -> None:
    """Write seeded synthetic traces of the built-in fleet (several agents and teams)."""
    import orjson

    from somnus.sample import generate

    n = 0
    with out.open("wb") as f:
        for ev in generate(sessions=sessions, seed=seed):
            f.write(orjson.dumps(ev) + b"\n")
            n += 1
    console.print(f"wrote {n} events of {sessions} sessions to {out}")


# ---- reading -----------------------------------------------------------------------------

def _print_rows(result: dict[str, Any], title: str | None = None) -> None:
    table = Table(title=title, show_lines=False)
    for c in result["columns"]:
        table.add_column(str(c), overflow="fold")
    for row in result["rows"]:
        table.add_row(*["" if v is None else str(v) for v in row])
    console.print(table)


@app.command()
def sql(query: str = typer.Argument(..., help="A read-only SELECT."), db: Optional[Path] = DbOpt,
        home: Optional[Path] = HomeOpt, as_json: bool = typer.Option(False, "--json", help="Print JSON rows.")) -> None:
    """Run a read-only query on the projections and print a table (or JSON rows)."""
    from somnus.reads import ReadError, sql as run

    s = _settings(home, db)
    try:
        result = run(Path(s.db_path), query)  # type: ignore[arg-type]
    except ReadError as exc:
        _fail(str(exc))
    if as_json:
        print(json.dumps([dict(zip(result["columns"], r)) for r in result["rows"]], default=str))
    else:
        _print_rows(result)


@app.command()
def checksum(db: Optional[Path] = DbOpt, home: Optional[Path] = HomeOpt,
             tables: bool = typer.Option(False, "--tables", help="Also print each table's count:hash."),
             as_json: bool = typer.Option(False, "--json")) -> None:
    """Print one content checksum of all projections (order-independent; Kafka offsets excluded)."""
    from somnus.reads import ReadError, checksum as run

    s = _settings(home, db)
    try:
        res = run(Path(s.db_path))  # type: ignore[arg-type]
    except ReadError as exc:
        _fail(str(exc))
    if as_json:
        print(json.dumps(res))
        return
    print(res["checksum"])
    if tables:
        for t, v in sorted(res["tables"].items()):
            print(f"{t}\t{v}")


@app.command()
def status(home: Optional[Path] = HomeOpt, db: Optional[Path] = DbOpt, bootstrap: Optional[str] = BootOpt,
           as_json: bool = typer.Option(False, "--json")) -> None:
    """Per-topic lag, counts and dead letters."""
    from somnus.reads import status as run

    s = _settings(home, db, bootstrap)
    res = run(s, _bootstrap(s))
    if as_json:
        print(json.dumps(res))
        return
    t = Table(title=f"somnus status ({'idle' if res['idle'] else 'busy'})")
    t.add_column("topic")
    t.add_column("projection lag", justify="right")
    for topic, lag in res["lag"].items():
        t.add_row(topic, str(lag))
    for topic, lag in res["worker_lag"].items():
        t.add_row(f"{topic} (worker)", str(lag))
    console.print(t)
    c = Table(title="projections")
    c.add_column("table")
    c.add_column("rows", justify="right")
    mem = res.get("memories") or {}
    for k, v in res["counts"].items():
        if k == "memories" and mem:  # an append-only table: pruned memories are rows, not memories
            c.add_row(k, f"{v} ({mem['live']} live, {mem['compressed']} compressed, {mem['pruned']} pruned)")
        else:
            c.add_row(k, str(v))
    console.print(c)
    ps = res["processes"]
    shown = []
    for role in ("supervisor", "broker", "worker", "projector"):
        if role == "broker" and ps[role] is None:
            continue  # not the project's own broker
        line = f"{role} pid {ps[role]}" if ps[role] else f"{role} not running"
        sup = ps.get("supervised", {}).get(role)
        if sup and sup["restarts"]:
            line += f" ({sup['restarts']} restarts, last exit {sup['last_exit']} at {sup['last_exit_at']})"
        shown.append(line)
    console.print("processes: " + ", ".join(shown))
    if res["dead_letter_kinds"]:
        console.print(f"dead letters by kind: {res['dead_letter_kinds']}")
    m = res.get("memory")
    if m:
        g, b = m["graph"], m["briefings"]
        console.print(f"episodes {m['episodes']}; graph: {g['entities']} entities, {g['active_triples']} active of "
                      f"{g['triples']} triples; briefings cached for {b['agents']} agents ({b['non_empty']} non-empty, "
                      f"newest as of {b['newest']}); last consolidation: {m['last_consolidation'] or 'never'}")
        if m["utilisation"]:
            _print_rows({"columns": ["agent", "sessions", "facts served", "facts used", "rate"],
                         "rows": [[u["agent"], u["sessions"], u["facts_served"], u["facts_used"],
                                   f"{u['rate']:.2f}"] for u in m["utilisation"]]}, "top agents by knowledge utilisation")
        if m["delegations"]:
            _print_rows({"columns": ["delegator", "delegatee", "results", "success rate", "failing"],
                         "rows": [[d["delegator"], d["delegatee"], d["results"], f"{d['success_rate']:.2f}",
                                   "yes" if d["failing"] else ""] for d in m["delegations"]]},
                        "delegation pairs, lowest success first")


@app.command()
def replay(to: Path = typer.Option(..., "--to", help="A new DuckDB file to rebuild into."),
           home: Optional[Path] = HomeOpt, bootstrap: Optional[str] = BootOpt,
           force: bool = typer.Option(False, "--force", help="Overwrite an existing file.")) -> None:
    """Rebuild every projection from offset 0 of every topic into a new file."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

    from somnus.projections.projector import Projector

    s = _settings(home, None, bootstrap)
    if to.exists():
        if not force:
            _fail(f"{to} exists; pass --force to overwrite it")
        to.unlink()
    boot = _bootstrap(s)
    proj = Projector(s, boot, db_path=to, serve=False)
    with Progress("[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(),
                  TimeRemainingColumn(), console=err, transient=False) as bar:
        task = bar.add_task("replaying", total=None)

        def progress(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        totals = asyncio.run(proj.run(until_end=True, on_progress=progress))
    console.print(f"replayed into {to}: {totals.events} events, {totals.episodes} episodes, "
                  f"{totals.lessons} lessons, {totals.dead_letters} dead letters")
    stages = sorted(proj.stage_s.items(), key=lambda kv: -kv[1])
    console.print("time by stage: " + ", ".join(f"{k} {v:.1f} s" for k, v in stages))


@app.command()
def inspect(agent: str = typer.Argument(..., help="The agent whose memory to show."),
            db: Optional[Path] = DbOpt, home: Optional[Path] = HomeOpt,
            episodes: int = typer.Option(10, "--episodes", help="How many recent episodes."),
            facts: int = typer.Option(30, "--facts", help="How many facts (highest confidence first)."),
            as_json: bool = typer.Option(False, "--json")) -> None:
    """What an agent knows: recent episodes and lessons, entities and facts in its scope chain."""
    from somnus.agents import AgentFileError, load_agents
    from somnus.reads import ReadError
    from somnus.projections.knowledge_store import KnowledgeStore

    s = _settings(home, db)
    try:
        agents = load_agents(s.agents_dir)
    except AgentFileError as exc:
        _fail(str(exc))
    store = KnowledgeStore.open(Path(s.db_path), agents)  # type: ignore[arg-type]
    try:
        report = inspect_report(store, agent, episodes, facts)
    except ReadError as exc:
        _fail(str(exc))
    if as_json:
        print(json.dumps(report, default=str))
        return
    known = "" if agent in agents else " [yellow](not declared in the agents folder)[/yellow]"
    console.print(f"[bold]{agent}[/bold]{known} reads: {' > '.join(report['scope_chain'])}")
    for title, rows in (("recent episodes", report["episodes"]), ("lessons", report["lessons"]),
                        ("facts in scope", report["facts"]), ("entities in scope", report["entities"])):
        if not rows:
            console.print(f"[dim]{title}: none[/dim]")
            continue
        cols = list(rows[0])
        _print_rows({"columns": cols, "rows": [[r[c] for c in cols] for r in rows]}, title)
    console.print(f"[dim]briefing: {report['briefing'] or 'none cached (briefings are not built yet)'}[/dim]")


def inspect_report(store: Any, agent: str, n_episodes: int, n_facts: int) -> dict[str, Any]:
    """The data ``somnus inspect`` shows (also its ``--json`` output)."""
    eps = store.sql("SELECT episode_id, ended_at, outcome, task, summary FROM episodes WHERE agent = ? "
                    "ORDER BY ended_at DESC, episode_id LIMIT ?", [agent, n_episodes])
    ids = [str(e["episode_id"]) for e in eps]
    lessons = store.sql(
        "SELECT kind, text, learned_at FROM lessons WHERE agent = ? AND episode_id::VARCHAR IN (SELECT unnest(?)) "
        "ORDER BY learned_at DESC, kind, text", [agent, ids]) if ids else []
    facts = [{"source": f.source, "predicate": f.predicate, "target": f.target, "scope": f.scope,
              "confidence": round(f.confidence, 3), "count": f.count, "since": f.valid_from}
             for f in store.facts(agent, limit=n_facts)]
    entities = [{"entity": e.entity_id, "name": e.name, "type": e.type, "facts": e.facts}
                for e in store.entities(agent, limit=n_facts)]
    return {"agent": agent, "scope_chain": store.scope_chain(agent),
            "episodes": [{"ended_at": e["ended_at"], "outcome": e["outcome"], "task": (e["task"] or "")[:60],
                          "summary": e["summary"]} for e in eps],
            "lessons": lessons, "facts": facts, "entities": entities, "briefing": _briefing_of(store, agent)}


def _briefing_of(store: Any, agent: str) -> str | None:
    rows = store.sql("SELECT markdown FROM briefings WHERE agent = ?", [agent])
    return rows[0]["markdown"] or None if rows else None


@app.command()
def brief(agent: str = typer.Argument(..., help="The agent whose briefing to print."),
          db: Optional[Path] = DbOpt, home: Optional[Path] = HomeOpt,
          as_json: bool = typer.Option(False, "--json")) -> None:
    """Print the agent's current cached briefing (what is injected before its next session)."""
    from somnus.reads import ReadError, read

    s = _settings(home, db)
    try:
        got = read(Path(s.db_path), "briefing", agent, agents_dir=s.agents_dir)  # type: ignore[arg-type]
    except ReadError as exc:
        _fail(str(exc))
    if as_json:
        print(json.dumps(got))
    elif got["briefing"] is None or not got["briefing"]["markdown"]:
        console.print(f"[dim]{agent} has no briefing yet[/dim]")
    else:
        print(got["briefing"]["markdown"], end="")


@app.command()
def promote(source: str = typer.Argument(..., help="Source entity (id such as tool:x, or name)."),
            predicate: str = typer.Argument(...), target: str = typer.Argument(..., help="Target entity."),
            to: str = typer.Option(..., "--to", help="team or global"),
            at: Optional[str] = typer.Option(None, "--at", help=_AT_HELP),
            db: Optional[Path] = DbOpt, home: Optional[Path] = HomeOpt, bootstrap: Optional[str] = BootOpt) -> None:
    """Promote a fact to its owners' team scope, or to global, by hand (an event on the facts topic).
    Each move is stamped with the stream time of the scope it comes from, unless --at is given."""
    from datetime import datetime, timezone

    from somnus.processors.knowledge.swarm_metrics import PromotionError, manual_promotions
    from somnus.projections.writer import KIND_PROMOTION
    from somnus.agents import AgentFileError, load_agents
    from somnus.reads import ReadError, sql as read_sql

    s = _settings(home, db, bootstrap)
    try:
        agents = load_agents(s.agents_dir)
        res = read_sql(Path(s.db_path), "SELECT source, predicate, target, scope, confidence, valid_to "  # type: ignore[arg-type]
                       "FROM facts_active WHERE predicate = ?", [predicate.strip().lower().replace(" ", "_")])
        rows = [dict(zip(res["columns"], r)) for r in res["rows"]]
        moves = manual_promotions(agents, rows, source, predicate, target, to, datetime.now(timezone.utc))
        # The same moves, each stamped with its source scope's stream time (or --at).
        events = [e for scope in sorted({m.from_scope for m in moves})
                  for e in manual_promotions(agents, rows, source, predicate, target, to, _event_time(s, at, scope))
                  if e.from_scope == scope]
    except (AgentFileError, ReadError, PromotionError) as exc:
        _fail(str(exc))
    from somnus.client import publish_records

    publish_records([(e.source.encode(), encode_event(e), [("somnus-kind", KIND_PROMOTION)]) for e in events],
                    _bootstrap(s), s.facts_topic, partition=0)
    for e in events:
        console.print(f"promoted {e.source} {e.predicate} {e.target}: {e.from_scope} -> {e.to_scope} "
                      f"at {e.promoted_at.isoformat()}", soft_wrap=True)


@app.command()
def forget(user: Optional[str] = typer.Option(None, "--user", help="Forget this user's sessions and memories."),
           agent: Optional[str] = typer.Option(None, "--agent", help="Forget everything of this agent."),
           session: Optional[str] = typer.Option(None, "--session", help="Forget the sessions with this id."),
           reason: Optional[str] = typer.Option(None, "--reason", help="Why (kept with the request)."),
           verify: bool = typer.Option(False, "--verify", help="Check instead: no needle left (exit 1 if any)."),
           needle: list[str] = typer.Option([], "--needle", help="--verify: a text of the subject's to look for "
                                            "(repeatable; at least one)."),
           replay: bool = typer.Option(True, "--replay/--no-replay", help="--verify: also replay every topic "
                                       "into a fresh file (beside the DuckDB file, deleted after) and check it."),
           at: Optional[str] = typer.Option(None, "--at", help=_AT_HELP),
           db: Optional[Path] = DbOpt, home: Optional[Path] = HomeOpt, bootstrap: Optional[str] = BootOpt) -> None:
    """Forget a user, an agent or a session: a request on the facts topic that the projector applies
    (projections/forget.py). With --verify, look for the given texts in the DuckDB file's bytes (and
    WAL) and rows, count the subject's rows, do the same in a replay into a fresh file, and report the
    texts found in the topics as the projector reads them; exit 1 if anything is found. SECURITY.md, "Forget"."""
    import uuid

    from somnus.projections.forget import file_hits, topic_hits
    from somnus.schemas.forget import KIND_FORGET, ForgetRequested, ForgetSubject
    from somnus.client import publish_records
    from somnus.reads import ReadError, sql as read_sql

    named = [(k, v) for k, v in (("user", user), ("agent", agent), ("session", session)) if v]
    if len(named) != 1:
        _fail("name exactly one of --user, --agent, --session")
    kind, value = named[0]
    s = _settings(home, db, bootstrap)
    if not verify:
        scope = f"agent:{value}" if kind == "agent" else "global"
        req = ForgetRequested(request_id=str(uuid.uuid4()), subject=ForgetSubject(kind), value=value,
                              reason=reason, at=_event_time(s, at, scope))
        # the subject's sessions as projected (before the request removes them): their keys go too
        projected = _projected_sessions(s, kind, value)
        publish_records([(b"forget", encode_event(req), [("somnus-kind", KIND_FORGET)])], _bootstrap(s),
                        s.facts_topic, partition=0)
        console.print(f"forget requested: {kind} {value} at {req.at.isoformat()} (request {req.request_id})",
                      soft_wrap=True)
        from somnus.streams.keys import delete_keys, read_keys

        try:
            ring = asyncio.run(read_keys(_bootstrap(s), s.keys_topic, s))
        except RuntimeError as exc:  # no key topic: nothing was sealed (SECURITY.md, plaintext producers)
            _fail(f"{exc}: no data key to delete; the subject's records in Kafka stay readable")
        doomed = sorted(set(ring.select(kind, value)) | set(ring.select_sessions(projected)))
        n = asyncio.run(delete_keys(_bootstrap(s), s.keys_topic, doomed, s))
        console.print(f"data keys deleted: {n} (the subject's sealed records in Kafka can no longer be opened; "
                      f"{s.keys_topic} compacts them away)", soft_wrap=True)
        return
    if not needle:
        _fail("--verify needs at least one --needle: a text of the subject's to look for (the subject's own id "
              "stays in the `forgotten` table by design)")
    db_path = Path(s.db_path)  # type: ignore[arg-type]
    failed = [False]

    def report(found: Any, what: str) -> None:
        failed[0] |= bool(found)
        console.print(f"{'FOUND' if found else 'absent'}: {what}: {found or 0}", soft_wrap=True)

    def check(path: Path, query: Any) -> None:
        """The needles in ``path``'s bytes (+ WAL) and rows, and the subject's rows, through ``query``."""
        for n, hits in file_hits(path, needle).items():
            report(hits, f"{n!r} in the bytes of {path} (+ .wal)")
        tables = [r[0] for r in query("SELECT table_name FROM duckdb_tables() WHERE NOT temporary "
                                      "AND database_name = current_database()", [])]
        for n in needle:
            report({t: c for t in tables if (c := query(f"SELECT count(*) FROM {t} x WHERE contains(x::VARCHAR, ?)",
                                                           [n])[0][0])}, f"{n!r} in the rows of {path}")
        report(query(_FORGET_SUBJECT_ROWS[kind], [value] * 4)[0][0], f"rows of {kind} {value!r} in {path}")

    try:
        check(db_path, lambda q, ps: read_sql(db_path, q, ps)["rows"])
    except ReadError as exc:
        _fail(str(exc))
    if replay:
        import tempfile

        import duckdb

        from somnus.projections.projector import Projector

        with tempfile.TemporaryDirectory(dir=db_path.parent, prefix="forget-verify-") as tmp:
            fresh = Path(tmp) / "replay.duckdb"
            asyncio.run(Projector(s, _bootstrap(s), db_path=fresh, serve=False).run(until_end=True))
            con = duckdb.connect(str(fresh), read_only=True)
            try:
                check(fresh, lambda q, ps: con.execute(q, ps).fetchall())
            finally:
                con.close()
    from somnus.streams.keys import read_keys

    try:
        ring = asyncio.run(read_keys(_bootstrap(s), s.keys_topic, s))
    except RuntimeError as exc:  # no key topic: records are read as they are
        console.print(f"{exc}: no data keys", soft_wrap=True)
        ring = None
    else:
        report(len(ring.select(kind, value)), f"data keys of {kind} {value!r} on {s.keys_topic}")
    got = asyncio.run(topic_hits(_bootstrap(s), [*s.projected_topics, s.observations_topic], needle, s, ring))
    for n in needle:
        report(got.opened.get(n, {}), f"{n!r} in the Kafka topics as the project reads them (sealed records "
                                      "opened with the keys that remain)")
        report(got.raw.get(n, {}), f"{n!r} in the Kafka topics' raw record values")
        if got.keys.get(n):  # routing ids (session ids) are never sealed: SECURITY.md, "Forget"
            console.print(f"note: {n!r} is part of record keys (session ids, not sealed; they cannot be opened "
                          f"to anything): {got.keys[n]}", soft_wrap=True)
    if got.shredded:
        console.print(f"sealed records whose key is gone (unreadable): {got.shredded}", soft_wrap=True)
    raise typer.Exit(1 if failed[0] else 0)


def _projected_sessions(s: Any, kind: str, value: str) -> list[tuple[str, str]]:
    """``(agent, session_id)`` of the subject's sessions in the projections (none when they cannot be read):
    a user's keys made before its publisher saw the session's start do not name the user."""
    from somnus.reads import ReadError, sql as read_sql

    column = {"user": "user_id", "agent": "agent", "session": "session_id"}[kind]
    try:
        rows = read_sql(Path(s.db_path), f"SELECT DISTINCT agent, session_id FROM episodes WHERE {column} = ? UNION "
                                         f"SELECT agent, session_id FROM working_memory WHERE {column} = ?",
                        [value, value])["rows"]
    except (ReadError, OSError) as exc:
        console.print(f"(the projections could not be read for the subject's sessions: {exc}; the keys that "
                      "name the subject are deleted)", soft_wrap=True)
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


@app.command("ingest-knowledge")
def ingest_knowledge_cmd(file: Path = typer.Argument(..., exists=True, dir_okay=False, help="JSON or Markdown."),
                         owner: str = typer.Option("global", "--owner", help="global, team:<lead> or agent:<name>"),
                         at: Optional[str] = typer.Option(None, "--at", help=_AT_HELP),
                         db: Optional[Path] = DbOpt, home: Optional[Path] = HomeOpt,
                         bootstrap: Optional[str] = BootOpt) -> None:
    """Add concepts from a document to semantic memory (DIRECT_INGESTION; deduplicated by name), stamped
    with the owner's stream time unless --at is given."""
    from somnus.processors.semantic.concepts import KnowledgeFileError, parse_knowledge
    from somnus.projections.semantic import KIND_INGEST, KnowledgeIngested
    from somnus.client import publish_records

    fmt = "json" if file.suffix.lower() in (".json", ".jsonl") else "markdown"
    try:
        concepts = parse_knowledge(file.read_text(encoding="utf-8"), fmt)
    except KnowledgeFileError as exc:
        _fail(f"{file}: {exc}")
    s = _settings(home, db, bootstrap)
    req = KnowledgeIngested(owner=owner, source=file.name, at=_event_time(s, at, owner), concepts=concepts)
    publish_records([(owner.encode(), encode_event(req), [("somnus-kind", KIND_INGEST)])], _bootstrap(s),
                    s.semantic_topic, partition=0)
    console.print(f"published {len(concepts)} concepts from {file.name} for {owner} at {req.at.isoformat()}",
                  soft_wrap=True)


@app.command()
def consolidate(owner: str = typer.Option("global", "--owner", help="global, team:<lead> or agent:<name>"),
                at: Optional[str] = typer.Option(None, "--at", help=_AT_HELP),
                db: Optional[Path] = DbOpt, home: Optional[Path] = HomeOpt, bootstrap: Optional[str] = BootOpt) -> None:
    """Promote repeated experience to concepts now: statistician, randomness gate, promoter (an event),
    stamped with the owner's stream time unless --at is given."""
    import msgspec

    from somnus.projections.semantic import KIND_PROMOTE, PromotionRequested
    from somnus.client import publish_records
    from somnus.reads import ReadError, read

    s = _settings(home, db, bootstrap)
    when = _event_time(s, at, owner)
    try:
        got = read(Path(s.db_path), "promotion_inputs", owner=owner)  # type: ignore[arg-type]
    except (ValueError, ReadError) as exc:
        _fail(str(exc))
    req = msgspec.convert({**got, "at": when.isoformat()}, PromotionRequested, strict=False)
    publish_records([(owner.encode(), encode_event(req), [("somnus-kind", KIND_PROMOTE)])], _bootstrap(s),
                    s.semantic_topic, partition=0)
    console.print(f"promotion requested for {owner} at {when.isoformat()}: {len(req.links)} candidate links, "
                  f"{len(req.calls)} call outcomes", soft_wrap=True)


@app.command()
def sleep(at: Optional[str] = typer.Option(None, "--at", help="Event time of the run (ISO 8601); default: the "
                                           "stream time (the newest event time of every agent)."),
          report: bool = typer.Option(False, "--report", help="Print the latest runs' reports instead."),
          plot: Optional[Path] = typer.Option(None, "--plot", help="Draw memory counts and the Fiedler trend here."),
          runs: int = typer.Option(10, "--runs", help="How many runs --report / --plot show."),
          db: Optional[Path] = DbOpt, home: Optional[Path] = HomeOpt, bootstrap: Optional[str] = BootOpt,
          as_json: bool = typer.Option(False, "--json")) -> None:
    """Deep sleep now (hippocampus sleep, then promotion), or --report / --plot the runs so far. "Now" is
    the stream time (each memory is judged by its own scope's), unless --at is given."""
    from datetime import datetime, timezone

    import msgspec

    from somnus.reads import ReadError, read

    s = _settings(home, db, bootstrap)
    if report or plot:
        try:
            got = read(Path(s.db_path), "sql", sql="SELECT run_id, run_at, trigger, report FROM sleep_runs "  # type: ignore[arg-type]
                       "ORDER BY run_at DESC LIMIT ?", params=[runs])
        except ReadError as exc:
            _fail(str(exc))
        rows = list(reversed(got["rows"]))
        if plot:
            from somnus.processors.sleep.job import history_figure
            from somnus.schemas.lifecycle import SleepReport

            reports = [(datetime.fromisoformat(str(r[1])), msgspec.json.decode(r[3], type=SleepReport)) for r in rows]
            if not reports:
                _fail("no sleep run yet")
            history_figure(reports).savefig(plot)
            console.print(f"wrote {plot}")
        if as_json:
            print(json.dumps([{"run_id": r[0], "at": str(r[1]), "trigger": r[2], "report": json.loads(r[3])}
                              for r in rows]))
        elif report:
            for r in rows:
                rep = json.loads(r[3])
                console.print(f"[bold]{r[0]}[/bold] ({r[2]}): {rep['narrative']}", soft_wrap=True)
        return
    from somnus.projections.semantic import KIND_PROMOTE, PromotionRequested
    from somnus.projections.sleep import KIND_SLEEP
    from somnus.schemas.lifecycle import SleepRequested
    from somnus.client import publish_records

    when = _event_time(s, at, "global")
    try:
        done = read(Path(s.db_path), "sql", sql="SELECT state->>'watermark' FROM sleep_state WHERE id = 1")["rows"]  # type: ignore[arg-type]
        inputs = read(Path(s.db_path), "promotion_inputs", owner="global")  # type: ignore[arg-type]
    except ReadError as exc:
        _fail(str(exc))
    last = datetime.fromisoformat(done[0][0].replace("Z", "+00:00")) if done and done[0][0] else None
    if last is not None and when <= last:  # the fold would do nothing: say so rather than "requested"
        console.print(f"nothing to do: the last sleep ran at {last.isoformat()}, and no event is newer than "
                      f"{when.isoformat()} (give a later --at to run anyway)", soft_wrap=True)
        return
    boot = _bootstrap(s)
    # 1) hippocampus sleep (memory topic: a fold over one partition), 2) promotion (semantic topic).
    publish_records([(None, encode_event(SleepRequested(at=when, requested_by="somnus sleep")),
                      [("somnus-kind", KIND_SLEEP)])], boot, s.memory_topic, partition=0)
    promote = msgspec.convert({**inputs, "at": when.isoformat()}, PromotionRequested, strict=False)
    publish_records([(b"global", encode_event(promote), [("somnus-kind", KIND_PROMOTE)])], boot, s.semantic_topic,
                    partition=0)
    console.print(f"sleep requested at {when.isoformat()} (then promotion: {len(promote.links)} candidate links)",
                  soft_wrap=True)


@app.command()
def recall(query: str = typer.Argument(..., help="What to recall."),
           agent: str = typer.Option(..., "--agent", help="The reading agent (its scope chain is searched)."),
           k: int = typer.Option(10, "-k"), explain: bool = typer.Option(False, "--explain", help="Per-signal scores."),
           db: Optional[Path] = DbOpt, home: Optional[Path] = HomeOpt,
           as_json: bool = typer.Option(False, "--json")) -> None:
    """Recall memories: lexical (BM25), LSH similarity, graph activation, recency/importance, fused."""
    from somnus.reads import ReadError, read

    s = _settings(home, db)
    try:
        got = read(Path(s.db_path), "recall", agent, agents_dir=s.agents_dir, query=query, k=k,  # type: ignore[arg-type]
                   explain="true" if explain else None)
    except ReadError as exc:
        _fail(str(exc))
    if as_json:
        print(json.dumps(got))
        return
    cols = ["rank", "score", "kind", "when", "refs", "text"] + (["signals"] if explain else [])
    rows = [[h["rank"], f"{h['score']:.4f}", h["kind"], h["occurred_at"][:16], ",".join(h["refs"]), h["text"][:80]]
            + ([" ".join(f"{n}={v:.3g}" for n, v in h["signals"].items() if v)] if explain else [])
            for h in got["hits"]]
    _print_rows({"columns": cols, "rows": rows}, f"recall for {agent}: {query}")


@app.command()
def context(query: str = typer.Argument(..., help="The task or question at hand."),
            agent: str = typer.Option(..., "--agent"), user: Optional[str] = typer.Option(None, "--user"),
            session: Optional[str] = typer.Option(None, "--session"),
            max_tokens: int = typer.Option(4000, "--max-tokens"),
            db: Optional[Path] = DbOpt, home: Optional[Path] = HomeOpt,
            as_json: bool = typer.Option(False, "--json")) -> None:
    """One fitted context for a model (synopsis, recent conversation, recall, knowledge, briefing)."""
    from somnus.reads import ReadError, read

    s = _settings(home, db)
    try:
        got = read(Path(s.db_path), "context", agent, agents_dir=s.agents_dir, query=query, user_id=user,  # type: ignore[arg-type]
                   session_id=session, max_tokens=max_tokens)
    except ReadError as exc:
        _fail(str(exc))
    if as_json:
        print(json.dumps(got))
    else:
        text = got["text"]
        # The text then, on a line of its own, the footer: a text always ends its last line, and stdout is
        # flushed first (to a pipe it is block-buffered, stderr is not: the footer came first or mid-line).
        print(text if not text or text.endswith("\n") else text + "\n", end="", flush=True)
        err.print(f"[dim]{got['tokens']} of {got['max_tokens']} tokens; session {got['session_id']}[/dim]")


@app.command()
def predict(tool: str = typer.Option(..., "--tool", help="The tool about to be called."),
            agent: Optional[str] = typer.Option(None, "--agent", help="The calling agent (context)."),
            args: Optional[str] = typer.Option(None, "--args", help="The call's arguments, a JSON object."),
            db: Optional[Path] = DbOpt, home: Optional[Path] = HomeOpt,
            as_json: bool = typer.Option(False, "--json")) -> None:
    """What is likely to happen if this call is made (NAc causal links learned from the stream)."""
    from somnus.reads import ReadError, read

    s = _settings(home, db)
    try:
        got = read(Path(s.db_path), "predict", tool=tool, args=args, agent=agent)  # type: ignore[arg-type]
    except ReadError as exc:
        _fail(str(exc))
    if as_json:
        print(json.dumps(got["outcomes"]))
        return
    if not got["known"]:
        console.print(f"[yellow]never seen[/yellow]: {tool} with these arguments"
                      + (" (the tool's outcomes below are a hint, at reduced confidence)" if got["outcomes"]
                         else "; no prediction"))
    if got["outcomes"]:
        _print_rows({"columns": ["outcome", "valence", "strength", "confidence", "observations"],
                     "rows": [[o["outcome"], o["valence"], f"{o['strength']:.3f}", f"{o['confidence']:.3f}",
                               o["observations"]] for o in got["outcomes"]]}, f"{tool} ({got['basis']} level)")


@app.command()
def rhythms(agent: str = typer.Option(..., "--agent"), hours: str = typer.Option("9", "--hours", help="e.g. 8,9,10"),
            days: Optional[str] = typer.Option(None, "--days", help="weekdays, weekend or 0,1,... (Monday 0)"),
            db: Optional[Path] = DbOpt, home: Optional[Path] = HomeOpt,
            as_json: bool = typer.Option(False, "--json")) -> None:
    """What usually happens for an agent at these local hours (SCN temporal bins)."""
    from somnus.reads import ReadError, read

    s = _settings(home, db)
    try:
        got = read(Path(s.db_path), "rhythms", agent, agents_dir=s.agents_dir, hours=hours, days=days)  # type: ignore[arg-type]
    except ReadError as exc:
        _fail(str(exc))
    if as_json:
        print(json.dumps(got))
        return
    _print_rows({"columns": ["kind", "count", "successes", "success rate"],
                 "rows": [[k["kind"], k["count"], k["successes"],
                           "" if k.get("success_rate") is None else f"{k['success_rate']:.2f}"] for k in got]},
                f"{agent} around {hours}" + (f" on {days}" if days else ""))


# ---- demo and bench ----------------------------------------------------------------------

@app.command()
def demo(sessions: int = typer.Option(300, "--sessions"), seed: int = typer.Option(42, "--seed"),
         home: Optional[Path] = HomeOpt, keep: bool = typer.Option(False, "--keep", help="Leave the broker, worker and projector running.")) -> None:
    """Set up, run the pipeline on the built-in synthetic fleet, and show what the memory made of it."""
    from somnus.client import publish as do_publish
    from somnus.reads import sql as run_sql
    from somnus.reads import wait_idle
    from somnus.sample import generate

    s = _settings(home)
    own_broker = s.bootstrap is None and broker_mod.status(s) is None  # the demo starts it, so stops it
    up(detach=True, home=home, db=None, bootstrap=None)
    boot = _bootstrap(s)
    n = do_publish(generate(sessions=sessions, seed=seed), boot, s.traces_topic)
    console.print(f"published {n} synthetic events of {sessions} sessions; waiting for the projections...")
    wait_idle(s, boot)
    db = Path(s.db_path)  # type: ignore[arg-type]
    _print_rows(run_sql(db, "SELECT agent, outcome, count(*) AS episodes, round(avg(duration_s)) AS avg_s "
                            "FROM episodes GROUP BY ALL ORDER BY agent, outcome"), "episodes by agent and outcome")
    _print_rows(run_sql(db, "SELECT kind, any_value(text) AS example, count(*) AS n FROM lessons "
                            "GROUP BY kind ORDER BY n DESC"), "lessons")
    _print_rows(run_sql(db, "SELECT text, count(*) AS n FROM lessons WHERE kind = 'failure' "
                            "GROUP BY text ORDER BY n DESC, text LIMIT 5"), "most frequent failure lessons")
    _print_rows(run_sql(db, "SELECT tool, calls, errors, round(error_rate, 3) AS error_rate FROM tool_outcomes "
                            "ORDER BY error_rate DESC, tool LIMIT 5"), "tools most likely to fail (NAc, exact counts)")
    from somnus.reads import read

    shown = read(db, "briefing", "scraper", agents_dir=s.agents_dir)["briefing"]
    if shown and shown["markdown"]:
        console.print("[bold]the briefing scraper gets before its next session[/bold] (somnus brief scraper):")
        print(shown["markdown"])
    console.print(f"database: {db}; try: somnus sql \"SELECT * FROM episodes LIMIT 5\", somnus inspect researcher, "
                  "somnus predict --tool http_get, somnus recall \"rate limit\" --agent scraper")
    if not keep:
        down(home, None)
        if own_broker and broker_mod.stop(s):
            console.print("broker: stopped (--keep leaves the stack running)")


@bench_app.command("e2e")
def bench_e2e(events: int = typer.Option(100_000, "--events"), as_json: bool = typer.Option(False, "--json"),
              seed: int = typer.Option(7, "--seed"), partitions: int = typer.Option(4, "--partitions"),
              bundle: int = typer.Option(64, "--bundle", help="Max events per record (1 = one record per event)."),
              repeat: int = typer.Option(1, "--repeat", help="Runs; the figures are their medians."),
              home: Optional[Path] = HomeOpt, keep_broker: bool = KeepBrokerOpt) -> None:
    """Publish N synthetic events; time publish start -> projection committed; compare to raw consume."""
    _keep_broker(keep_broker)
    from somnus.bench import run_e2e

    import statistics

    runs = [run_e2e(events=events, seed=seed, partitions=partitions, bundle=bundle, home=home, log=err)
            for _ in range(repeat)]
    result = dict(runs[0])
    for key in ("publish_s", "elapsed_s", "events_per_s", "raw_consume_per_s", "ratio", "facts_per_s"):
        result[key] = round(statistics.median(r[key] for r in runs), 3)
    if repeat > 1:
        result["runs"] = [{k: r[k] for k in ("events_per_s", "raw_consume_per_s", "ratio", "facts_per_s")}
                          for r in runs]
    if as_json:
        print(json.dumps(result))
    else:
        for k, v in result.items():
            console.print(f"{k}: {v}")


@bench_app.command("facts-query")
def bench_facts_query(triples: int = typer.Option(1_000_000, "--triples"),
                      agents: int = typer.Option(200, "--agents"), teams: int = typer.Option(20, "--teams"),
                      queries: int = typer.Option(1000, "--queries"), limit: int = typer.Option(50, "--limit"),
                      repeat: int = typer.Option(1, "--repeat", help="Runs; the figures are their medians."),
                      as_json: bool = typer.Option(False, "--json")) -> None:
    """Latency of the scope-chain fact query (KnowledgeStore.facts) with N triples in the store."""
    import statistics

    from somnus.bench import run_fact_query

    runs = [run_fact_query(triples=triples, agents=agents, teams=teams, queries=queries, limit=limit)
            for _ in range(repeat)]
    result = dict(runs[0])
    for key in ("load_s", "p50_ms", "p95_ms", "p99_ms", "max_ms", "sql_p50_ms", "sql_p95_ms", "scan_p95_ms",
                "scan_over_top_p95"):
        result[key] = round(statistics.median(r[key] for r in runs), 3)
    if repeat > 1:
        result["runs"] = [{k: r[k] for k in ("p50_ms", "p95_ms", "p99_ms")} for r in runs]
    if as_json:
        print(json.dumps(result))
    else:
        for k, v in result.items():
            console.print(f"{k}: {v}")


def _medians(runs: list[dict[str, Any]], keys: tuple[str, ...]) -> dict[str, Any]:
    import statistics

    result = dict(runs[0])
    for key in keys:
        result[key] = round(statistics.median(r[key] for r in runs), 3)
    if len(runs) > 1:
        result["runs"] = [{k: r[k] for k in keys} for r in runs]
    return result


def _emit(result: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(result))
    else:
        for k, v in result.items():
            console.print(f"{k}: {v}")


eval_app = typer.Typer(help="Retrieval evaluations through the real pipeline.", no_args_is_help=True)
app.add_typer(eval_app, name="eval")


@eval_app.command("locomo")
def eval_locomo(file: Path = typer.Argument(..., exists=True, dir_okay=False, help="LoCoMo JSON (locomo10 shape)."),
                k: int = typer.Option(20, "-k", help="Memories asked for per question."),
                sleep_schedule: str = typer.Option(
                    "off", "--sleep-schedule",
                    help="Scheduled sleep during the run (cron on stream time); off: the whole conversation is kept."),
                home: Optional[Path] = HomeOpt, as_json: bool = typer.Option(False, "--json"),
                keep_broker: bool = KeepBrokerOpt) -> None:
    """Evidence recall@1/5/10/20 at turn level, overall and per category (1-4), via broker, worker and projector."""
    _keep_broker(keep_broker)
    from somnus.evaluation import evaluate_locomo_pipeline

    report = evaluate_locomo_pipeline(file, k=k, home=home, log=err, sleep_schedule=sleep_schedule)
    if as_json:
        print(json.dumps(report))
        return
    rows = [["all", report["questions"], *(report[f"recall@{n}"] for n in (1, 5, 10, 20))]]
    rows += [[c, v["questions"], *(v[f"recall@{n}"] for n in (1, 5, 10, 20))] for c, v in report["by_category"].items()]
    _print_rows({"columns": ["category", "questions", "recall@1", "recall@5", "recall@10", "recall@20"], "rows": rows},
                "LoCoMo evidence recall (turn level)")


@eval_app.command("foresight")
def eval_foresight(paths: list[str] = typer.Argument(..., help="Files, directories or globs, as `somnus import` takes them."),
                   fmt: str = typer.Option(..., "--format", help="openai-chat | swe-agent | otel | v1"),
                   results: Optional[Path] = typer.Option(None, "--results", exists=True, dir_okay=False,
                                                          help="Outcomes by id (as for `somnus import`)."),
                   agent: Optional[str] = typer.Option(None, "--agent", help="Agent name for the imported sessions."),
                   start: Optional[str] = typer.Option(None, "--start", help="As for `somnus import`."),
                   spacing: Optional[float] = typer.Option(None, "--spacing", help="As for `somnus import` (seconds)."),
                   sessions: Optional[int] = typer.Option(None, "--sessions", help="Only the first N sessions by start time."),
                   serve: bool = typer.Option(True, "--serve/--no-serve",
                                              help="Inject each briefing for its session (recorded, as a runtime does)."),
                   home: Optional[Path] = HomeOpt, as_json: bool = typer.Option(False, "--json")) -> None:
    """Replay sessions through the pipeline and score the briefing given before each: foresight (learnable
    errors it named), relevance, duplicate lines, length against the budget (docs/foresight.md)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

    from somnus.foresight import run_foresight
    from somnus.importers import ImportShapeError

    try:
        with Progress("[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(),
                      TimeRemainingColumn(), console=err, transient=False) as bar:
            task = bar.add_task("replaying sessions", total=None)
            report = run_foresight(paths, fmt, results=results, agent=agent, start=start, spacing_s=spacing,
                                   sessions=sessions, home=home, serve=serve, log=err,
                                   progress=lambda done, total: bar.update(task, completed=done, total=total))
    except ImportShapeError as exc:
        _fail(str(exc))
    if as_json:
        print(json.dumps(report))
        return
    c = report["chars"]
    rows = [["sessions", report["sessions"]], ["failed calls", report["failed_calls"]],
            ["learnable", report["learnable"]], ["foretold", report["foretold"]], ["foresight", report["foresight"]]]
    rows += [[f"foresight ({k})", v["foresight"]] for k, v in report["foresight_by_session_index"].items()]
    rows += [["relevance", report["relevance"]], ["duplicate lines", report["duplicate_lines"]],
             ["chars median / p95 / budget", f"{c['median']} / {c['p95']} / {c['budget']}"]]
    _print_rows({"columns": ["measure", "value"], "rows": rows}, "foresight of the briefings")


@bench_app.command("predict")
def bench_predict(links: int = typer.Option(1_000_000, "--links"), queries: int = typer.Option(2000, "--queries"),
                  repeat: int = typer.Option(1, "--repeat", help="Runs; the figures are their medians."),
                  as_json: bool = typer.Option(False, "--json")) -> None:
    """Latency of predict (NAc causal links) with N links in the store."""
    from somnus.bench import run_predict

    _emit(_medians([run_predict(links=links, queries=queries) for _ in range(repeat)],
                   ("load_s", "p50_ms", "p95_ms", "p99_ms")), as_json)


@bench_app.command("recall")
def bench_recall(units: int = typer.Option(100_000, "--units"), queries: int = typer.Option(300, "--queries"),
                 repeat: int = typer.Option(1, "--repeat", help="Runs; the figures are their medians."),
                 as_json: bool = typer.Option(False, "--json")) -> None:
    """Recall latency (p50/p95/p99) and index memory with N memory units."""
    from somnus.bench import run_recall

    _emit(_medians([run_recall(units=units, queries=queries) for _ in range(repeat)],
                   ("build_s", "p50_ms", "p95_ms", "p99_ms", "rss_mib")), as_json)


@bench_app.command("capture")
def bench_capture(sessions: int = typer.Option(40_000, "--sessions"),
                  candidates: int = typer.Option(256, "--candidates",
                                                 help="LSH candidates a unit is compared with (0: all of them)."),
                  compare: bool = typer.Option(True, "--compare/--no-compare",
                                               help="Also run unbounded in the same invocation, and their ratio."),
                  as_json: bool = typer.Option(False, "--json")) -> None:
    """Memory capture µs per unit as the store grows (sample episodes, in five equal parts)."""
    from somnus.bench import run_capture

    bounded = run_capture(sessions=sessions, candidates=candidates or None)
    if not compare or not candidates:
        _emit(bounded, as_json)
        return
    unbounded = run_capture(sessions=sessions, candidates=None)
    _emit({"bounded": bounded, "unbounded": unbounded,
           "ratio_by_chunk": [round(b / u, 2) for b, u in zip(bounded["us_per_unit_by_chunk"],
                                                               unbounded["us_per_unit_by_chunk"])]}, as_json)


@bench_app.command("briefing")
def bench_briefing(agents: int = typer.Option(10_000, "--agents"), rate: float = typer.Option(1000.0, "--rate"),
                   duration: float = typer.Option(60.0, "--duration"),
                   read_rate: float = typer.Option(
                       0.0, "--read-rate", help="Briefing reads per second (0: back to back, as fast as answered). "
                                                "A fleet reads one per session start: ~100/s at 1,000 events/s."),
                   sleep_schedule: str = typer.Option(
                       "off", "--sleep-schedule",
                       help="Scheduled sleep during the run (cron on stream time). The sample fleet's clock runs "
                            "thousands of times faster than the wall clock, so a nightly run would fire every few seconds."),
                   home: Optional[Path] = HomeOpt, as_json: bool = typer.Option(False, "--json")) -> None:
    """Briefing read p99 with N agents cached under ingest, and publish -> updated briefing latency."""
    from somnus.bench import run_briefing

    _emit(run_briefing(agents=agents, rate=rate, duration_s=duration, home=home, log=err,
                       sleep_schedule=sleep_schedule, read_rate=read_rate), as_json)


@bench_app.command("context")
def bench_context(units: int = typer.Option(100_000, "--units"), queries: int = typer.Option(200, "--queries"),
                  as_json: bool = typer.Option(False, "--json")) -> None:
    """Working-memory buffer add p99 and get_context p95 with N memory units behind recall."""
    from somnus.bench import run_context

    _emit(run_context(units=units, queries=queries), as_json)


@bench_app.command("sleep")
def bench_sleep(units: int = typer.Option(1_000_000, "--units"), agents: int = typer.Option(1000, "--agents"),
                repeat: int = typer.Option(1, "--repeat", help="Runs; the figures are their medians."),
                as_json: bool = typer.Option(False, "--json")) -> None:
    """One deep sleep over N memory units captured by the memory fold: seconds, decisions, store bytes before/after."""
    from somnus.bench import run_sleep

    _emit(_medians([run_sleep(units=units, agents=agents) for _ in range(repeat)],
                   ("build_s", "sleep_s", "plan_apply_s", "write_s")), as_json)


@bench_app.command("scn")
def bench_scn(memories: int = typer.Option(10_000, "--memories"), as_json: bool = typer.Option(False, "--json")) -> None:
    """Bytes of the SCN temporal index for N episodes of the sample fleet."""
    from somnus.bench import run_scn_footprint

    _emit(run_scn_footprint(memories=memories), as_json)


def main() -> None:
    procs.private_files()  # SOMNUS_HOME, the token, the broker's and the processes' files: private (0700 / 0600)
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
