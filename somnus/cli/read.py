"""Reading the memory: ``sql``, ``checksum``, ``status``, ``inspect``, ``brief``, ``recall``, ``context``,
``predict``, ``rhythms``. Each sends one read to the running projector (HTTP, ``somnus.reads``) or
opens the file when none runs; a table fits the terminal, or is printed as ``--json`` / ``--csv``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import typer

from somnus.cli.app import app
from somnus.cli.common import BootOpt, CsvOpt, DbOpt, HomeOpt, JsonOpt, bootstrap, db_of, fail, note, read, settings
from somnus.cli.tables import one_of, show, show_many


@app.command("sql")
def sql_(
    query: str = typer.Argument(..., help="A read-only SELECT."),
    db: Optional[Path] = DbOpt,
    home: Optional[Path] = HomeOpt,
    as_json: bool = typer.Option(False, "--json", help="Print JSON rows."),
    as_csv: bool = CsvOpt,
) -> None:
    """Run a read-only query on the projections and print a table (or JSON rows, or CSV)."""
    from somnus.cli.common import sql

    one_of(as_json, as_csv)
    result = sql(settings(home, db), query)
    show(result["columns"], result["rows"], as_json=as_json, as_csv=as_csv)


@app.command()
def checksum(
    db: Optional[Path] = DbOpt,
    home: Optional[Path] = HomeOpt,
    tables: bool = typer.Option(False, "--tables", help="Also print each table's count:hash."),
    as_json: bool = JsonOpt,
) -> None:
    """Print one content checksum of all projections (order-independent; Kafka offsets excluded)."""
    res = read(settings(home, db), "checksum")
    if as_json:
        print(json.dumps(res))
        return
    print(res["checksum"])
    if tables:
        for t, v in sorted(res["tables"].items()):
            print(f"{t}\t{v}")


@app.command()
def status(
    home: Optional[Path] = HomeOpt,
    db: Optional[Path] = DbOpt,
    bootstrap_: Optional[str] = BootOpt,
    as_json: bool = JsonOpt,
    as_csv: bool = CsvOpt,
) -> None:
    """Per-topic lag, counts and dead letters."""
    from somnus.reads import status as run

    one_of(as_json, as_csv)
    s = settings(home, db, bootstrap_)
    res = run(s, lambda: bootstrap(s))  # Kafka's address only when no projector answers (it asks Kafka)
    if as_json:
        print(json.dumps(res))
        return
    lag = [[topic, n] for topic, n in res["lag"].items()]
    lag += [[f"{topic} (worker)", n] for topic, n in res["worker_lag"].items()]
    mem = res.get("memories") or {}
    counts = [
        [
            k,
            f"{v} ({mem['live']} live, {mem['compressed']} compressed, {mem['pruned']} pruned)"
            if k == "memories" and mem
            else v,
        ]  # an append-only table: pruned memories are rows
        for k, v in res["counts"].items()
    ]
    tables = [
        (f"somnus status ({'idle' if res['idle'] else 'busy'})", ["topic", "projection lag"], lag),
        ("projections", ["table", "rows"], counts),
    ]
    m = res.get("memory")
    if m and m["utilisation"]:
        tables.append(
            (
                "top agents by knowledge utilisation",
                ["agent", "sessions", "facts served", "facts used", "rate"],
                [
                    [u["agent"], u["sessions"], u["facts_served"], u["facts_used"], round(u["rate"], 2)]
                    for u in m["utilisation"]
                ],
            )
        )
    if m and m["delegations"]:
        tables.append(
            (
                "delegation pairs, lowest success first",
                ["delegator", "delegatee", "results", "success rate", "failing"],
                [
                    [
                        d["delegator"],
                        d["delegatee"],
                        d["results"],
                        round(d["success_rate"], 2),
                        "yes" if d["failing"] else "",
                    ]
                    for d in m["delegations"]
                ],
            )
        )
    show_many(tables, as_csv=as_csv)
    if as_csv:
        return
    print("processes: " + ", ".join(_process_lines(res["processes"])))
    if res["dead_letter_kinds"]:
        print(f"dead letters by kind: {res['dead_letter_kinds']}")
    if m:
        g, b = m["graph"], m["briefings"]
        print(
            f"episodes {m['episodes']}; graph: {g['entities']} entities, {g['active_triples']} active of "
            f"{g['triples']} triples; briefings cached for {b['agents']} agents ({b['non_empty']} non-empty, "
            f"newest as of {b['newest']}); last consolidation: {m['last_consolidation'] or 'never'}"
        )


def _process_lines(ps: dict[str, Any]) -> list[str]:
    shown = []
    for role in ("supervisor", "broker", "worker", "projector", "otlp", "mcp"):
        if role not in ps or role == "broker" and ps[role] is None:
            continue  # not the project's own broker; the OTLP receiver or MCP server when its port is 0
        line = f"{role} pid {ps[role]}" if ps[role] else f"{role} not running"
        sup = ps.get("supervised", {}).get(role)
        if sup and sup["restarts"]:
            line += f" ({sup['restarts']} restarts, last exit {sup['last_exit']} at {sup['last_exit_at']})"
        shown.append(line)
    return shown


@app.command()
def inspect(
    agent: str = typer.Argument(..., help="The agent whose memory to show."),
    db: Optional[Path] = DbOpt,
    home: Optional[Path] = HomeOpt,
    episodes: int = typer.Option(10, "--episodes", help="How many recent episodes."),
    facts: int = typer.Option(30, "--facts", help="How many facts (highest confidence first)."),
    as_json: bool = JsonOpt,
    as_csv: bool = CsvOpt,
) -> None:
    """What an agent knows: recent episodes and lessons, entities and facts in its scope chain."""
    from somnus.reads import ReadError, inspect_report, knowledge_store
    from somnus.schemas.agents import AgentFileError, load_agents

    one_of(as_json, as_csv)
    s = settings(home, db)
    try:
        agents = load_agents(s.agents_dir)
        report = inspect_report(knowledge_store(db_of(s), agents), agent, episodes, facts)
    except (AgentFileError, ReadError) as exc:
        fail(str(exc))
    if as_json:
        print(json.dumps(report, default=str))
        return
    if not as_csv:
        known = "" if agent in agents else " (not declared in the agents folder)"
        print(f"{agent}{known} reads: {' > '.join(report['scope_chain'])}")
    sections = (
        ("recent episodes", "episodes"),
        ("lessons", "lessons"),
        ("facts in scope", "facts"),
        ("entities in scope", "entities"),
    )
    show_many(
        [
            (title, list(report[key][0]) if report[key] else [], [list(r.values()) for r in report[key]])
            for title, key in sections
        ],
        as_csv=as_csv,
    )
    if not as_csv:
        print(f"briefing: {report['briefing'] or 'none cached (briefings are not built yet)'}")


@app.command()
def brief(
    agent: str = typer.Argument(..., help="The agent whose briefing to print."),
    db: Optional[Path] = DbOpt,
    home: Optional[Path] = HomeOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Print the agent's current cached briefing (what is injected before its next session)."""
    got = read(settings(home, db), "briefing", agent)
    if as_json:
        print(json.dumps(got))
    elif got["briefing"] is None or not got["briefing"]["markdown"]:
        note(f"{agent} has no briefing yet")
    else:
        print(got["briefing"]["markdown"], end="")


@app.command()
def recall(
    query: str = typer.Argument(..., help="What to recall."),
    agent: str = typer.Option(..., "--agent", help="The reading agent (its scope chain is searched)."),
    k: int = typer.Option(10, "-k"),
    explain: bool = typer.Option(False, "--explain", help="Per-signal scores."),
    db: Optional[Path] = DbOpt,
    home: Optional[Path] = HomeOpt,
    as_json: bool = JsonOpt,
    as_csv: bool = CsvOpt,
) -> None:
    """Recall memories: lexical (BM25), LSH similarity, graph activation, recency/importance, fused."""
    one_of(as_json, as_csv)
    got = read(settings(home, db), "recall", agent, query=query, k=k, explain="true" if explain else None)
    if as_json:
        print(json.dumps(got))
        return
    cols = ["rank", "score", "kind", "when", "refs", "text"] + (["signals"] if explain else [])
    rows = [
        [h["rank"], round(h["score"], 4), h["kind"], h["occurred_at"][:16], ",".join(h["refs"]), h["text"]]
        + ([" ".join(f"{n}={v:.3g}" for n, v in h["signals"].items() if v)] if explain else [])
        for h in got["hits"]
    ]
    show(cols, rows, f"recall for {agent}: {query}", as_csv=as_csv)


@app.command()
def context(
    query: str = typer.Argument(..., help="The task or question at hand."),
    agent: str = typer.Option(..., "--agent"),
    user: Optional[str] = typer.Option(None, "--user"),
    session: Optional[str] = typer.Option(None, "--session"),
    max_tokens: int = typer.Option(4000, "--max-tokens"),
    db: Optional[Path] = DbOpt,
    home: Optional[Path] = HomeOpt,
    as_json: bool = JsonOpt,
) -> None:
    """One fitted context for a model (synopsis, recent conversation, recall, knowledge, briefing)."""
    got = read(
        settings(home, db), "context", agent, query=query, user_id=user, session_id=session, max_tokens=max_tokens
    )
    if as_json:
        print(json.dumps(got))
        return
    text = got["text"]
    # The text then, on a line of its own, the footer: a text always ends its last line, and stdout is
    # flushed first (to a pipe it is block-buffered, stderr is not: the footer came first or mid-line).
    print(text if not text or text.endswith("\n") else text + "\n", end="", flush=True)
    note(f"{got['tokens']} of {got['max_tokens']} tokens; session {got['session_id']}")


@app.command()
def predict(
    tool: str = typer.Option(..., "--tool", help="The tool about to be called."),
    agent: Optional[str] = typer.Option(None, "--agent", help="The calling agent (context)."),
    args: Optional[str] = typer.Option(None, "--args", help="The call's arguments, a JSON object."),
    db: Optional[Path] = DbOpt,
    home: Optional[Path] = HomeOpt,
    as_json: bool = JsonOpt,
    as_csv: bool = CsvOpt,
) -> None:
    """What is likely to happen if this call is made (NAc causal links learned from the stream)."""
    one_of(as_json, as_csv)
    got = read(settings(home, db), "predict", tool=tool, args=args, agent=agent)
    if as_json:
        print(json.dumps(got["outcomes"]))
        return
    if not got["known"] and not as_csv:
        note(
            f"never seen: {tool} with these arguments"
            + (
                " (the tool's outcomes below are a hint, at reduced confidence)"
                if got["outcomes"]
                else "; no prediction"
            )
        )
    if got["outcomes"] or as_csv:
        show(
            ["outcome", "valence", "strength", "confidence", "observations"],
            [
                [o["outcome"], o["valence"], round(o["strength"], 3), round(o["confidence"], 3), o["observations"]]
                for o in got["outcomes"]
            ],
            f"{tool} ({got['basis']} level)",
            as_csv=as_csv,
        )


@app.command()
def rhythms(
    agent: str = typer.Option(..., "--agent"),
    hours: str = typer.Option("9", "--hours", help="e.g. 8,9,10"),
    days: Optional[str] = typer.Option(None, "--days", help="weekdays, weekend or 0,1,... (Monday 0)"),
    db: Optional[Path] = DbOpt,
    home: Optional[Path] = HomeOpt,
    oscillators: bool = typer.Option(
        False,
        "--oscillators",
        help="The coupled oscillators instead: r, eigenvalues, next recurrence, anomalies (SOMNUS_OSCILLATORS).",
    ),
    anomaly_min: Optional[float] = typer.Option(None, "--anomaly-min", help="With --oscillators (default 0.25)."),
    plot: Optional[Path] = typer.Option(
        None,
        "--plot",
        help="Draw the agent's week here (PNG): weekday x hour heatmaps of sessions started and their success rate.",
    ),
    as_json: bool = JsonOpt,
    as_csv: bool = CsvOpt,
) -> None:
    """What usually happens for an agent at these local hours (SCN temporal bins), or --plot its week."""
    one_of(as_json, as_csv)
    s = settings(home, db)
    if plot:
        from somnus.plots import rhythm_figure

        cells = read(
            s,
            "sql",
            sql="SELECT kind, bin, count, successes FROM temporal_bins WHERE agent = ? AND "
            "bin_kind = 'weekhour' AND kind IN ('session_start', 'session_end')",
            params=[agent],
        )["rows"]
        if not cells:
            fail(f"{agent} has no session in the temporal index yet: nothing to plot")
        rhythm_figure(agent, cells).savefig(plot)
        print(f"wrote {plot}")
        return
    if oscillators:  # somnus/cli/rhythms_command.py
        from somnus.cli.rhythms_command import show_oscillators

        show_oscillators(agent, db_of(s), s.agents_dir, anomaly_min, as_json)
        return
    got = read(s, "rhythms", agent, hours=hours, days=days)
    if as_json:
        print(json.dumps(got))
        return
    show(
        ["kind", "count", "successes", "success rate"],
        [
            [
                k["kind"],
                k["count"],
                k["successes"],
                None if k.get("success_rate") is None else round(k["success_rate"], 2),
            ]
            for k in got
        ],
        f"{agent} around {hours}" + (f" on {days}" if days else ""),
        as_csv=as_csv,
    )
