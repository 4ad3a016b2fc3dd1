"""Retrieval evaluations through the real pipeline: ``eval locomo``, ``eval foresight``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from somnus.cli.app import app
from somnus.cli.common import FORMATS_HELP, CsvOpt, HomeOpt, JsonOpt, KeepBrokerOpt, fail, keep_broker
from somnus.cli.tables import show

eval_app = typer.Typer(help="Retrieval evaluations through the real pipeline.", no_args_is_help=True)
app.add_typer(eval_app, name="eval")


@eval_app.command("locomo")
def eval_locomo(
    file: Path = typer.Argument(..., exists=True, dir_okay=False, help="LoCoMo JSON (locomo10 shape)."),
    k: int = typer.Option(20, "-k", help="Memories asked for per question."),
    sleep_schedule: str = typer.Option(
        "off",
        "--sleep-schedule",
        help="Scheduled sleep during the run (cron on stream time); off: the whole conversation is kept.",
    ),
    dev: Optional[int] = typer.Option(
        None,
        "--dev",
        min=0,
        help="The first N conversations are the development half, the rest held out: both reported.",
    ),
    without: Optional[str] = typer.Option(
        None, "--without", help="Signals left out of the fusion, comma-separated (e.g. graph)."
    ),
    home: Optional[Path] = HomeOpt,
    as_json: bool = JsonOpt,
    as_csv: bool = CsvOpt,
    keep_broker_: bool = KeepBrokerOpt,
) -> None:
    """Evidence recall@1/5/10/20 at turn level, overall and per category (1-4), via broker, worker and projector."""
    keep_broker(keep_broker_)
    from rich.console import Console

    from somnus.evaluation import evaluate_locomo_pipeline

    report = evaluate_locomo_pipeline(
        file,
        k=k,
        home=home,
        log=Console(stderr=True),
        sleep_schedule=sleep_schedule,
        dev=dev,
        without=[x.strip() for x in (without or "").split(",") if x.strip()],
    )
    if as_json:
        print(json.dumps(report))
        return
    rows = [["all", report["questions"], *(report[f"recall@{n}"] for n in (1, 5, 10, 20))]]
    rows += [[c, v["questions"], *(v[f"recall@{n}"] for n in (1, 5, 10, 20))] for c, v in report["by_category"].items()]
    for h in ("dev", "held_out") if dev is not None else ():
        part = report[h]
        rows.append([f"{h}: all", part["questions"], *(part[f"recall@{n}"] for n in (1, 5, 10, 20))])
        rows += [
            [f"{h}: {c}", v["questions"], *(v[f"recall@{n}"] for n in (1, 5, 10, 20))]
            for c, v in part["by_category"].items()
        ]
    show(
        ["category", "questions", "recall@1", "recall@5", "recall@10", "recall@20"],
        rows,
        "LoCoMo evidence recall (turn level)",
        as_csv=as_csv,
    )


@eval_app.command("foresight")
def eval_foresight(
    paths: list[str] = typer.Argument(..., help="Files, directories or globs, as `somnus import` takes them."),
    fmt: str = typer.Option(..., "--format", help=FORMATS_HELP),
    results: Optional[Path] = typer.Option(
        None, "--results", exists=True, dir_okay=False, help="Outcomes by id (as for `somnus import`)."
    ),
    agent: Optional[str] = typer.Option(None, "--agent", help="Agent name for the imported sessions."),
    start: Optional[str] = typer.Option(None, "--start", help="As for `somnus import`."),
    spacing: Optional[float] = typer.Option(None, "--spacing", help="As for `somnus import` (seconds)."),
    sessions: Optional[int] = typer.Option(None, "--sessions", help="Only the first N sessions by start time."),
    serve: bool = typer.Option(
        True, "--serve/--no-serve", help="Inject each briefing for its session (recorded, as a runtime does)."
    ),
    home: Optional[Path] = HomeOpt,
    as_json: bool = JsonOpt,
    as_csv: bool = CsvOpt,
) -> None:
    """Replay sessions through the pipeline and score the briefing given before each: foresight (learnable
    errors it named), relevance, duplicate lines, length against the budget (docs/foresight.md)."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

    from somnus.foresight import run_foresight
    from somnus.importers import ImportShapeError

    try:
        with Progress(
            "[progress.description]{task.description}",
            BarColumn(),
            MofNCompleteColumn(),
            TimeRemainingColumn(),
            console=Console(stderr=True),
            transient=False,
        ) as bar:
            task = bar.add_task("replaying sessions", total=None)
            report = run_foresight(
                paths,
                fmt,
                results=results,
                agent=agent,
                start=start,
                spacing_s=spacing,
                sessions=sessions,
                home=home,
                serve=serve,
                log=Console(stderr=True),
                progress=lambda done, total: bar.update(task, completed=done, total=total),
            )
    except ImportShapeError as exc:
        fail(str(exc))
    if as_json:
        print(json.dumps(report))
        return
    c = report["chars"]
    rows = [
        ["sessions", report["sessions"]],
        ["failed calls", report["failed_calls"]],
        ["learnable", report["learnable"]],
        ["foretold", report["foretold"]],
        ["foresight", report["foresight"]],
    ]
    rows += [[f"foresight ({k})", v["foresight"]] for k, v in report["foresight_by_session_index"].items()]
    rows += [
        ["relevance", report["relevance"]],
        ["duplicate lines", report["duplicate_lines"]],
        ["chars median / p95 / budget", f"{c['median']} / {c['p95']} / {c['budget']}"],
    ]
    show(["measure", "value"], rows, "foresight of the briefings", as_csv=as_csv)
