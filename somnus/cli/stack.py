"""Running the stack: ``up``, ``down``, the local broker, and the demo."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Optional

import typer

from somnus.cli.app import app
from somnus.cli.common import BootOpt, DbOpt, HomeOpt, bootstrap, db_of, fail, settings, sql
from somnus.cli.tables import show

broker_app = typer.Typer(help="The local single-node Kafka broker (KRaft).", no_args_is_help=True)
app.add_typer(broker_app, name="broker")


@broker_app.command("fetch")
def broker_fetch(home: Optional[Path] = HomeOpt) -> None:
    """Resolve the Kafka jars from Maven Central into the cache (once)."""
    from somnus import broker

    try:
        libs = broker.fetch(settings(home), quiet=True)  # Maven's own log only when it fails (in the error)
    except broker.BrokerError as exc:
        fail(str(exc))
    print(f"Kafka {broker.KAFKA_VERSION} jars in {libs}")


@broker_app.command("start")
def broker_start(home: Optional[Path] = HomeOpt) -> None:
    """Start the local broker (free ports, formatted log dir) and wait until it accepts connections."""
    from somnus import broker

    try:
        info = broker.start(settings(home))
    except broker.BrokerError as exc:
        fail(str(exc))
    print(f"broker running: pid {info.pid}, bootstrap {info.bootstrap}")


@broker_app.command("stop")
def broker_stop(home: Optional[Path] = HomeOpt) -> None:
    """Stop the local broker cleanly."""
    from somnus import broker

    print("broker stopped" if broker.stop(settings(home)) else "no broker was running")


@broker_app.command("status")
def broker_status(home: Optional[Path] = HomeOpt, as_json: bool = typer.Option(False, "--json")) -> None:
    """Is the local broker running, and where?"""
    from somnus import broker

    info = broker.status(settings(home))
    if as_json:
        print(json.dumps({"running": info is not None, **(info.__dict__ if info else {})}))
    elif info:
        print(f"running: pid {info.pid}, bootstrap {info.bootstrap}")
    else:
        print("not running")
        raise typer.Exit(3)


@app.command()
def up(
    detach: bool = typer.Option(False, "--detach", "-d", help="Return once started (a supervisor keeps them running)."),
    home: Optional[Path] = HomeOpt,
    db: Optional[Path] = DbOpt,
    bootstrap_: Optional[str] = BootOpt,
    workers: Optional[int] = typer.Option(
        None,
        "--workers",
        min=1,
        help="Worker processes (SOMNUS_WORKERS, default 1): Kafka splits the trace partitions among them.",
    ),
) -> None:
    """Start the broker (unless one is configured), create the topics, and the worker(s) and the projector
    under a supervisor that starts any of them again when it exits (somnus/supervisor.py)."""
    import dataclasses

    from somnus import procs
    from somnus.projections.auth import ensure_operator_token
    from somnus.streams.topics import ensure_topics
    from somnus.supervisor import serve

    s = settings(home, db, bootstrap_)
    if workers is not None:
        s = dataclasses.replace(s, workers=workers)  # and to the supervisor it starts: Settings.as_env
    if s.workers > s.partitions:
        print(
            f"somnus up: {s.workers} workers for {s.partitions} trace partitions: "
            f"{s.workers - s.partitions} will own none (SOMNUS_PARTITIONS)"
        )
    ensure_operator_token(s.home)  # SOMNUS_HOME/token (0600): what the CLI sends to the projector
    boot = bootstrap(s, start=True)
    ensure_topics(s, boot)
    already = procs.running(s, "supervisor")
    if already is not None:
        print(f"somnus up: already running (supervisor pid {already}), logs in {s.run_dir}")
        return
    local = s.bootstrap is None  # the project's own broker: the supervisor watches it too
    if detach:
        procs.spawn(s, boot, "supervisor", extra_args=["--broker"] if local else [])
        deadline = time.monotonic() + 60
        while not all(procs.running(s, r) for r in ("projector", "worker", "supervisor")):
            if time.monotonic() > deadline or procs.running(s, "supervisor") is None:
                procs.stop(s, "supervisor")  # and, with it, whatever it started: nothing is left running
                fail(f"the supervisor did not start the worker and the projector; see {s.run_dir}/supervisor.log")
            time.sleep(0.1)
        print(f"somnus up: bootstrap {boot}, db {s.db_path}, logs in {s.run_dir}")
        return
    serve(
        s,
        boot,
        local,
        say=lambda m: print(m, flush=True),
        started=lambda: print(
            f"somnus up: bootstrap {boot}, db {s.db_path}, logs in {s.run_dir} (Ctrl-C or somnus down stops)",
            flush=True,
        ),
    )


@app.command()
def down(home: Optional[Path] = HomeOpt, db: Optional[Path] = DbOpt) -> None:
    """Stop the supervisor, the worker, the projector, the OTLP receiver and the MCP server (the broker
    keeps running until `somnus broker stop`)."""
    from somnus import procs

    s = settings(home, db)
    # every worker whose pid file is there, however many `up --workers` started
    workers = sorted({"worker", *(p.stem for p in s.run_dir.glob("worker-*.pid"))})
    roles = (*workers, "projector", "otlp", "mcp")
    was = {role: procs.running(s, role) is not None for role in roles}
    if procs.stop(s, "supervisor", timeout_s=90.0):  # it stops its processes: nothing is started again
        print("supervisor: stopped")
    for role in roles:
        print(f"{role}: {'stopped' if procs.stop(s, role) or was[role] else 'not running'}")


DEMO_TABLES = (
    (
        "episodes by agent and outcome",
        "SELECT agent, outcome, count(*) AS episodes, round(avg(duration_s)) AS avg_s "
        "FROM episodes GROUP BY ALL ORDER BY agent, outcome",
    ),
    ("lessons", "SELECT kind, any_value(text) AS example, count(*) AS n FROM lessons GROUP BY kind ORDER BY n DESC"),
    (
        "most frequent failure lessons",
        "SELECT text, count(*) AS n FROM lessons WHERE kind = 'failure' GROUP BY text ORDER BY n DESC, text LIMIT 5",
    ),
    (
        "tools most likely to fail (NAc, exact counts)",
        "SELECT tool, calls, errors, round(error_rate, 3) AS error_rate "
        "FROM tool_outcomes ORDER BY error_rate DESC, tool LIMIT 5",
    ),
)


@app.command()
def demo(
    sessions: int = typer.Option(300, "--sessions"),
    seed: int = typer.Option(42, "--seed"),
    home: Optional[Path] = HomeOpt,
    keep: bool = typer.Option(False, "--keep", help="Leave the broker, worker and projector running."),
) -> None:
    """Set up, run the pipeline on the built-in synthetic fleet, and show what the memory made of it."""
    from somnus import broker, reads
    from somnus.client import publish
    from somnus.sample import generate

    s = settings(home)
    own_broker = s.bootstrap is None and broker.status(s) is None  # the demo starts it, so stops it
    up(detach=True, home=home, db=None, bootstrap_=None, workers=None)
    boot = bootstrap(s)
    n = publish(generate(sessions=sessions, seed=seed), boot, s.traces_topic)
    print(f"published {n} synthetic events of {sessions} sessions; waiting for the projections...")
    reads.wait_idle(s, boot)
    for title, query in DEMO_TABLES:
        got = sql(s, query)
        show(got["columns"], got["rows"], title)
    shown = reads.read(db_of(s), "briefing", "scraper", agents_dir=s.agents_dir)["briefing"]
    if shown and shown["markdown"]:
        print("the briefing scraper gets before its next session (somnus brief scraper):")
        print(shown["markdown"])
    print(
        f'database: {s.db_path}; try: somnus sql "SELECT * FROM episodes LIMIT 5", somnus inspect researcher, '
        'somnus predict --tool http_get, somnus recall "rate limit" --agent scraper'
    )
    if not keep:
        down(home, None)
        if own_broker and broker.stop(s):
            print("broker: stopped (--keep leaves the stack running)")
