"""Asking the memory to change: ``promote``, ``consolidate``, ``sleep``; and ``replay`` into a new file.
The requests are events (``somnus.memory_requests``), applied by the projector's folds."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Optional

import typer

from somnus.cli.app import app
from somnus.cli.common import AT_HELP, BootOpt, DbOpt, HomeOpt, JsonOpt, bootstrap, event_time, fail, read, settings


@app.command()
def promote(
    source: str = typer.Argument(..., help="Source entity (id such as tool:x, or name)."),
    predicate: str = typer.Argument(...),
    target: str = typer.Argument(..., help="Target entity."),
    to: str = typer.Option(..., "--to", help="team or global"),
    at: Optional[str] = typer.Option(None, "--at", help=AT_HELP),
    db: Optional[Path] = DbOpt,
    home: Optional[Path] = HomeOpt,
    bootstrap_: Optional[str] = BootOpt,
) -> None:
    """Promote a fact to its owners' team scope, or to global, by hand (an event on the facts topic).
    Each move is stamped with the stream time of the scope it comes from, unless --at is given."""
    from datetime import timezone

    from somnus import memory_requests
    from somnus.cli.common import sql
    from somnus.processors.knowledge.swarm_metrics import PromotionError, manual_promotions
    from somnus.schemas.agents import AgentFileError, load_agents

    s = settings(home, db, bootstrap_)
    res = sql(
        s,
        "SELECT source, predicate, target, scope, confidence, valid_to FROM facts_active WHERE predicate = ?",
        [predicate.strip().lower().replace(" ", "_")],
    )
    rows = [dict(zip(res["columns"], r)) for r in res["rows"]]
    try:
        agents = load_agents(s.agents_dir)
        moves = manual_promotions(agents, rows, source, predicate, target, to, datetime.now(timezone.utc))
        # The same moves, each stamped with its source scope's stream time (or --at).
        events = [
            e
            for scope in sorted({m.from_scope for m in moves})
            for e in manual_promotions(agents, rows, source, predicate, target, to, event_time(s, at, scope))
            if e.from_scope == scope
        ]
    except (AgentFileError, PromotionError) as exc:
        fail(str(exc))
    memory_requests.promote(s, bootstrap(s), events)
    for e in events:
        print(
            f"promoted {e.source} {e.predicate} {e.target}: {e.from_scope} -> {e.to_scope} "
            f"at {e.promoted_at.isoformat()}"
        )


@app.command()
def consolidate(
    owner: str = typer.Option("global", "--owner", help="global, team:<lead> or agent:<name>"),
    at: Optional[str] = typer.Option(None, "--at", help=AT_HELP),
    db: Optional[Path] = DbOpt,
    home: Optional[Path] = HomeOpt,
    bootstrap_: Optional[str] = BootOpt,
) -> None:
    """Promote repeated experience to concepts now: statistician, randomness gate, promoter (an event),
    stamped with the owner's stream time unless --at is given."""
    from somnus import memory_requests

    s = settings(home, db, bootstrap_)
    when = event_time(s, at, owner)
    try:
        inputs = read(s, "promotion_inputs", owner=owner)
    except ValueError as exc:
        fail(str(exc))
    req = memory_requests.consolidate(s, bootstrap(s), owner, inputs, when)
    print(
        f"promotion requested for {owner} at {when.isoformat()}: {len(req.links)} candidate links, "
        f"{len(req.calls)} call outcomes"
    )


@app.command()
def sleep(
    at: Optional[str] = typer.Option(
        None,
        "--at",
        help="Event time of the run (ISO 8601); default: the stream time (the newest event time of every agent).",
    ),
    report: bool = typer.Option(False, "--report", help="Print the latest runs' reports instead."),
    plot: Optional[Path] = typer.Option(None, "--plot", help="Draw memory counts and the Fiedler trend here."),
    runs: int = typer.Option(10, "--runs", help="How many runs --report / --plot show."),
    db: Optional[Path] = DbOpt,
    home: Optional[Path] = HomeOpt,
    bootstrap_: Optional[str] = BootOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Deep sleep now (hippocampus sleep, then promotion), or --report / --plot the runs so far. "Now" is
    the stream time (each memory is judged by its own scope's), unless --at is given."""
    from somnus import memory_requests

    s = settings(home, db, bootstrap_)
    if report or plot:
        _sleep_report(s, runs, plot, as_json, report)
        return
    when = event_time(s, at, "global")
    done = read(s, "sql", sql="SELECT state->>'watermark' FROM sleep_state WHERE id = 1")["rows"]
    last = datetime.fromisoformat(done[0][0].replace("Z", "+00:00")) if done and done[0][0] else None
    if last is not None and when <= last:  # the fold would do nothing: say so rather than "requested"
        print(
            f"nothing to do: the last sleep ran at {last.isoformat()}, and no event is newer than "
            f"{when.isoformat()} (give a later --at to run anyway)"
        )
        return
    # 1) hippocampus sleep (memory topic: a fold over one partition); 2) its promotion (semantic
    # topic), requested by the projector once the run is committed.
    memory_requests.sleep(s, bootstrap(s), when, requested_by="somnus sleep")
    print(f"sleep requested at {when.isoformat()} (the projector requests its promotion after the run)")


def _sleep_report(s: object, runs: int, plot: Optional[Path], as_json: bool, report: bool) -> None:
    import msgspec

    got = read(
        s,  # type: ignore[arg-type]
        "sql",
        sql="SELECT run_id, run_at, trigger, report FROM sleep_runs ORDER BY run_at DESC LIMIT ?",
        params=[runs],
    )
    rows = list(reversed(got["rows"]))
    if plot:
        from somnus.plots import history_figure
        from somnus.schemas.lifecycle import SleepReport

        reports = [(datetime.fromisoformat(str(r[1])), msgspec.json.decode(r[3], type=SleepReport)) for r in rows]
        if not reports:
            fail("no sleep run yet")
        history_figure(reports).savefig(plot)
        print(f"wrote {plot}")
    layers = _layer_reports(s, [r[0] for r in rows])
    if as_json:
        print(
            json.dumps(
                [
                    {
                        "run_id": r[0],
                        "at": str(r[1]),
                        "trigger": r[2],
                        "report": json.loads(r[3]),
                        "layers": layers.get(r[0], []),
                    }
                    for r in rows
                ]
            )
        )
    elif report:
        for r in rows:
            rep = json.loads(r[3])
            print(f"{r[0]} ({r[2]}): {rep['narrative']}")
            print("  dreaming: " + ", ".join(f"{k} {rep.get(k, 0)}" for k in _DREAM_PHASES))
            for name, c in sorted(rep.get("per_layer", {}).items()):
                print(
                    f"  {name}: {c.get('before', 0)} -> {c.get('after', 0)} "
                    f"({c.get('compressed', 0)} compressed, {c.get('pruned', 0)} pruned)"
                )
            for lay in layers.get(r[0], []):
                print(
                    f"  {lay['layer']}: {lay['before']} -> {lay['after']} (+{lay['added']} added, "
                    f"{lay['reinforced']} reinforced, {lay['removed']} decayed)"
                )


_DREAM_PHASES = ("clustered", "held", "created", "connected", "abstracted")


def _layer_reports(s: object, run_ids: list[str]) -> dict[str, list[dict[str, object]]]:
    """Each run's semantic layers (``sleep_layer_reports``): records before and after, and what the
    run added, reinforced and removed (decayed). The promotion fold writes them from another topic,
    so a run may have none yet."""
    if not run_ids:
        return {}
    got = read(
        s,  # type: ignore[arg-type]
        "sql",
        sql="SELECT run_id, layer, before, added, reinforced, removed, after "
        "FROM sleep_layer_reports WHERE list_contains(?, run_id) ORDER BY run_id, layer",
        params=[run_ids],
    )
    out: dict[str, list[dict[str, object]]] = {}
    for run_id, layer, *counts in got["rows"]:
        out.setdefault(run_id, []).append(
            {"layer": layer, **dict(zip(("before", "added", "reinforced", "removed", "after"), counts))}
        )
    return out


@app.command()
def replay(
    to: Path = typer.Option(..., "--to", help="A new DuckDB file to rebuild into."),
    home: Optional[Path] = HomeOpt,
    bootstrap_: Optional[str] = BootOpt,
    force: bool = typer.Option(False, "--force", help="Overwrite an existing file."),
) -> None:
    """Rebuild every projection from offset 0 of every topic into a new file."""
    import asyncio

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

    from somnus.projections.projector import Projector

    s = settings(home, None, bootstrap_)
    if to.exists():
        if not force:
            fail(f"{to} exists; pass --force to overwrite it")
        to.unlink()
    proj = Projector(s, bootstrap(s), db_path=to, serve=False)
    with Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        console=Console(stderr=True),
        transient=False,
    ) as bar:
        task = bar.add_task("replaying", total=None)
        totals = asyncio.run(
            proj.run(until_end=True, on_progress=lambda done, total: bar.update(task, completed=done, total=total))
        )
    print(
        f"replayed into {to}: {totals.events} events, {totals.episodes} episodes, "
        f"{totals.lessons} lessons, {totals.dead_letters} dead letters"
    )
    stages = sorted(proj.stage_s.items(), key=lambda kv: -kv[1])
    print("time by stage: " + ", ".join(f"{k} {v:.1f} s" for k, v in stages))
