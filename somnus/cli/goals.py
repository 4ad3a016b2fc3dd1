"""Goals and exploration: ``goal set | done | list`` and ``wander`` (docs/concepts/goals.md).

A goal is an event on the memory topic (``somnus.memory_requests.set_goal``); the projector measures
its forward prediction error as memories arrive. ``wander`` reads a walk over the agent's memories."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from somnus.cli.app import app
from somnus.cli.common import AT_HELP, BootOpt, DbOpt, HomeOpt, JsonOpt, bootstrap, event_time, fail, read, settings
from somnus.cli.tables import show

goal_app = typer.Typer(
    help="Goals an agent works towards, and how far its memories are from them.", no_args_is_help=True
)
app.add_typer(goal_app, name="goal")


@goal_app.command("set")
def goal_set(
    text: str = typer.Argument(..., help="The desired state, in a sentence."),
    agent: str = typer.Option(..., "--agent", help="The agent the goal is for."),
    user: Optional[str] = typer.Option(None, "--user", help="The user it is set for."),
    goal_id: Optional[str] = typer.Option(None, "--id", help="The goal's id (default: a new one)."),
    at: Optional[str] = typer.Option(None, "--at", help=AT_HELP),
    db: Optional[Path] = DbOpt,
    home: Optional[Path] = HomeOpt,
    bootstrap_: Optional[str] = BootOpt,
) -> None:
    """Set a goal (an event on the memory topic), stamped with the agent's stream time unless --at."""
    from somnus import memory_requests

    if not text.strip() or len(text) > 500:
        fail("a goal is a sentence: 1 to 500 characters")
    s = settings(home, db, bootstrap_)
    req = memory_requests.set_goal(
        s,
        bootstrap(s),
        agent,
        text.strip(),
        event_time(s, at, f"agent:{agent}"),
        user,
        set_by="somnus goal",
        goal_id=goal_id,
    )
    print(f"goal {req.goal_id} set for {agent} at {req.at.isoformat()}")


@goal_app.command("done")
def goal_done(
    goal_id: str = typer.Argument(..., help="The goal's id (somnus goal list)."),
    agent: str = typer.Option(..., "--agent"),
    dropped: bool = typer.Option(False, "--dropped", help="Abandoned rather than achieved."),
    at: Optional[str] = typer.Option(None, "--at", help=AT_HELP),
    db: Optional[Path] = DbOpt,
    home: Optional[Path] = HomeOpt,
    bootstrap_: Optional[str] = BootOpt,
) -> None:
    """Close a goal: achieved (default) or --dropped."""
    from somnus import memory_requests

    s = settings(home, db, bootstrap_)
    req = memory_requests.close_goal(
        s, bootstrap(s), agent, goal_id, event_time(s, at, f"agent:{agent}"), "dropped" if dropped else "done"
    )
    print(f"goal {goal_id} of {agent}: {req.status.value}")


@goal_app.command("list")
def goal_list(
    agent: str = typer.Option(..., "--agent"),
    user: Optional[str] = typer.Option(None, "--user"),
    all_: bool = typer.Option(False, "--all", help="Closed goals too."),
    db: Optional[Path] = DbOpt,
    home: Optional[Path] = HomeOpt,
    as_json: bool = JsonOpt,
) -> None:
    """The agent's goals with their forward prediction error (1: nothing it remembers is near)."""
    got = read(settings(home, db), "goals", agent, all="true" if all_ else None, user_id=user)
    if as_json:
        print(json.dumps(got))
        return
    rows = [
        [g["goal_id"], g["status"], f"{g['forward_pe']:.2f}", g["nearest_id"] or "", str(g["set_at"])[:16], g["text"]]
        for g in got["goals"]
    ]
    show(["goal", "status", "forward_pe", "nearest", "set", "text"], rows, f"goals of {agent}")


@app.command()
def wander(
    agent: str = typer.Option(..., "--agent", help="The agent whose memories are walked."),
    steps: int = typer.Option(10, "--steps"),
    seed: int = typer.Option(0, "--seed"),
    start: Optional[str] = typer.Option(None, "--start", help="A memory id to start from."),
    user: Optional[str] = typer.Option(None, "--user"),
    db: Optional[Path] = DbOpt,
    home: Optional[Path] = HomeOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Walk the memory graph by information gain (under-explored, uncertain, goal-adjacent, stale, random)."""
    got = read(settings(home, db), "wander", agent, steps=steps, seed=seed, start=start, user_id=user)
    if as_json:
        print(json.dumps(got))
        return
    rows = [
        [n, st["hop"], f"{st['gain']:.2f}", ",".join(st["reasons"]), st["memory_id"], st["text"]]
        for n, st in enumerate(got["steps"], 1)
    ]
    show(["step", "hop", "gain", "why", "memory", "text"], rows, f"wander for {agent} (seed {seed})")
