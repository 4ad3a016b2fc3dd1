"""``somnus advise`` and ``somnus bench advise``: the pre-flight read from the command line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer


def advise_command(
    agent: str = typer.Option(..., "--agent", help="The agent about to start the task."),
    task: str = typer.Option(..., "--task", help="The task about to start, as its text."),
    db: Path | None = typer.Option(None, "--db", help="DuckDB file (SOMNUS_DB)."),
    home: Path | None = typer.Option(None, "--home", help="State folder (SOMNUS_HOME)."),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Before a task: strategies that worked, tools likely to fail, whether to ask a human, and the
    entities that mattered, from related past episodes (docs/concepts/advise.md)."""
    from rich.console import Console

    from somnus.config import Settings

    s = Settings.resolve(home=home, db_path=db)
    got = read_or_exit(Path(s.db_path or s.home / "somnus.duckdb"), "advise", agent, s.agents_dir, task=task)
    if as_json:
        print(json.dumps(got))
        return
    print_advice(Console(), got)


def read_or_exit(db: Path, handler: str, agent: str, agents_dir: Path | None, **params: Any) -> Any:
    """``somnus.reads.read``, or the error on stderr and exit status 1."""
    from rich.console import Console

    from somnus.reads import ReadError, read

    try:
        return read(db, handler, agent, agents_dir=agents_dir, **params)
    except ReadError as exc:
        Console(stderr=True).print(f"[red]error:[/red] {exc}")
        raise typer.Exit(1) from None


def print_advice(console: Any, got: dict[str, Any]) -> None:
    console.print(f"[bold]{got['agent']}[/bold]: {got['related']} related past episodes")
    esc = got["escalation"]
    console.print(("[red]ask a human[/red]: " if esc["escalate"] else "no escalation: ") + esc["reason"])
    for st in got["planning"]:
        console.print(
            f"strategy {' -> '.join(st['tools'])}: {st['successes']} of {st['attempts']} succeeded "
            f"(score {st['score']:.2f}; episodes {', '.join(st['episode_ids'][:3])})"
        )
    for r in got["risks"]:
        classes = "; ".join(f"{o} {v:.2f}" for o, v in r["error_classes"][:3])
        console.print(
            f"risk {r['tool']}: strength {r['strength']:.3f} ({r['errors']} of {r['calls']} calls "
            f"failed, {r['observed_rate']:.3f}); failed in {r['failed_in']} related episodes; {classes}"
        )
    for e in got["salience"]:
        console.print(f"salient {e['entity']}: {e['successes']} related successes (score {e['score']:.2f})")


def bench_advise_command(
    sessions: int = typer.Option(300, "--sessions", help="Sample-fleet sessions to load."),
    queries: int = typer.Option(500, "--queries"),
    seed: int = typer.Option(42, "--seed"),
    import_file: Path | None = typer.Option(
        None,
        "--import",
        exists=True,
        dir_okay=False,
        help="Load this file instead of the sample fleet (with --format).",
    ),
    fmt: str = typer.Option("openai-chat", "--format", help="Format of --import."),
    agent: str | None = typer.Option(None, "--agent", help="Agent of --import's sessions."),
    keep_db: Path | None = typer.Option(
        None, "--keep-db", dir_okay=False, help="Also write the loaded store here (new file)."
    ),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Latency of advise with a fleet's memory loaded (projected in process, no broker)."""
    from somnus.bench.advise import distilled, run_advise
    from somnus.importers import FORMATS, import_run

    episodes = None
    if import_file is not None:
        if fmt not in FORMATS:
            raise typer.BadParameter(f"unknown --format {fmt!r}; choose one of: {', '.join(FORMATS)}")
        episodes = distilled(list(FORMATS[fmt](import_file, agent=agent, run=import_run())))
    result = run_advise(sessions=sessions, queries=queries, seed=seed, episodes=episodes, keep_db=keep_db)
    print(json.dumps(result) if as_json else "\n".join(f"{k}: {v}" for k, v in result.items()))
