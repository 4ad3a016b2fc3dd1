"""Benchmarks (BENCHMARKS.md): ``bench e2e | facts-query | predict | recall | capture | briefing | context |
sleep | scn | cli``. Each command is a thin call of its library function; ``bench cli`` is in ``bench_cli``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import typer

from somnus.cli.app import app
from somnus.cli.common import HomeOpt, KeepBrokerOpt, keep_broker

bench_app = typer.Typer(help="Benchmarks (see BENCHMARKS.md).", no_args_is_help=True)
app.add_typer(bench_app, name="bench")


def _log() -> Any:
    """Where a benchmark reports its progress: stderr."""
    from rich.console import Console

    return Console(stderr=True)


@bench_app.command("e2e")
def bench_e2e(
    events: int = typer.Option(100_000, "--events"),
    as_json: bool = typer.Option(False, "--json"),
    seed: int = typer.Option(7, "--seed"),
    partitions: int = typer.Option(4, "--partitions"),
    bundle: int = typer.Option(64, "--bundle", help="Max events per record (1 = one record per event)."),
    repeat: int = typer.Option(1, "--repeat", help="Runs; the figures are their medians."),
    workers: int = typer.Option(1, "--workers", min=1, help="Worker processes (as `somnus up --workers`)."),
    home: Optional[Path] = HomeOpt,
    keep_broker_: bool = KeepBrokerOpt,
) -> None:
    """Publish N synthetic events; time publish start -> projection committed; compare to raw consume."""
    keep_broker(keep_broker_)
    import statistics

    from somnus.bench import run_e2e

    runs = [
        run_e2e(events=events, seed=seed, partitions=partitions, bundle=bundle, home=home, log=_log(), workers=workers)
        for _ in range(repeat)
    ]
    result = dict(runs[0])
    for key in ("publish_s", "elapsed_s", "events_per_s", "raw_consume_per_s", "ratio", "facts_per_s"):
        result[key] = round(statistics.median(r[key] for r in runs), 3)
    if repeat > 1:
        result["runs"] = [
            {k: r[k] for k in ("events_per_s", "raw_consume_per_s", "ratio", "facts_per_s")} for r in runs
        ]
    if as_json:
        print(json.dumps(result))
    else:
        for k, v in result.items():
            print(f"{k}: {v}")


@bench_app.command("facts-query")
def bench_facts_query(
    triples: int = typer.Option(1_000_000, "--triples"),
    agents: int = typer.Option(200, "--agents"),
    teams: int = typer.Option(20, "--teams"),
    queries: int = typer.Option(1000, "--queries"),
    limit: int = typer.Option(50, "--limit"),
    repeat: int = typer.Option(1, "--repeat", help="Runs; the figures are their medians."),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Latency of the scope-chain fact query (KnowledgeStore.facts) with N triples in the store."""
    import statistics

    from somnus.bench import run_fact_query

    runs = [
        run_fact_query(triples=triples, agents=agents, teams=teams, queries=queries, limit=limit) for _ in range(repeat)
    ]
    result = dict(runs[0])
    for key in (
        "load_s",
        "p50_ms",
        "p95_ms",
        "p99_ms",
        "max_ms",
        "sql_p50_ms",
        "sql_p95_ms",
        "scan_p95_ms",
        "scan_over_top_p95",
    ):
        result[key] = round(statistics.median(r[key] for r in runs), 3)
    if repeat > 1:
        result["runs"] = [{k: r[k] for k in ("p50_ms", "p95_ms", "p99_ms")} for r in runs]
    if as_json:
        print(json.dumps(result))
    else:
        for k, v in result.items():
            print(f"{k}: {v}")


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
            print(f"{k}: {v}")


@bench_app.command("predict")
def bench_predict(
    links: int = typer.Option(1_000_000, "--links"),
    queries: int = typer.Option(2000, "--queries"),
    repeat: int = typer.Option(1, "--repeat", help="Runs; the figures are their medians."),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Latency of predict (NAc causal links) with N links in the store."""
    from somnus.bench import run_predict

    _emit(
        _medians(
            [run_predict(links=links, queries=queries) for _ in range(repeat)], ("load_s", "p50_ms", "p95_ms", "p99_ms")
        ),
        as_json,
    )


@bench_app.command("recall")
def bench_recall(
    units: int = typer.Option(100_000, "--units"),
    queries: int = typer.Option(300, "--queries"),
    repeat: int = typer.Option(1, "--repeat", help="Runs; the figures are their medians."),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Recall latency (p50/p95/p99) and index memory with N memory units."""
    from somnus.bench import run_recall

    _emit(
        _medians(
            [run_recall(units=units, queries=queries) for _ in range(repeat)],
            ("build_s", "p50_ms", "p95_ms", "p99_ms", "rss_mib"),
        ),
        as_json,
    )


@bench_app.command("capture")
def bench_capture(
    sessions: int = typer.Option(40_000, "--sessions"),
    candidates: int = typer.Option(
        256, "--candidates", help="LSH candidates a unit is compared with (0: all of them)."
    ),
    compare: bool = typer.Option(
        True, "--compare/--no-compare", help="Also run unbounded in the same invocation, and their ratio."
    ),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Memory capture µs per unit as the store grows (sample episodes, in five equal parts)."""
    from somnus.bench import run_capture

    bounded = run_capture(sessions=sessions, candidates=candidates or None)
    if not compare or not candidates:
        _emit(bounded, as_json)
        return
    unbounded = run_capture(sessions=sessions, candidates=None)
    _emit(
        {
            "bounded": bounded,
            "unbounded": unbounded,
            "ratio_by_chunk": [
                round(b / u, 2) for b, u in zip(bounded["us_per_unit_by_chunk"], unbounded["us_per_unit_by_chunk"])
            ],
        },
        as_json,
    )


@bench_app.command("briefing")
def bench_briefing(
    agents: int = typer.Option(10_000, "--agents"),
    rate: float = typer.Option(1000.0, "--rate"),
    duration: float = typer.Option(60.0, "--duration"),
    read_rate: float = typer.Option(
        0.0,
        "--read-rate",
        help="Briefing reads per second (0: back to back, as fast as answered). "
        "A fleet reads one per session start: ~100/s at 1,000 events/s.",
    ),
    sleep_schedule: str = typer.Option(
        "off",
        "--sleep-schedule",
        help="Scheduled sleep during the run (cron on stream time). The sample fleet's clock runs "
        "thousands of times faster than the wall clock, so a nightly run would fire every few seconds.",
    ),
    home: Optional[Path] = HomeOpt,
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Briefing read p99 with N agents cached under ingest, and publish -> updated briefing latency."""
    from somnus.bench import run_briefing

    _emit(
        run_briefing(
            agents=agents,
            rate=rate,
            duration_s=duration,
            home=home,
            log=_log(),
            sleep_schedule=sleep_schedule,
            read_rate=read_rate,
        ),
        as_json,
    )


@bench_app.command("context")
def bench_context(
    units: int = typer.Option(100_000, "--units"),
    queries: int = typer.Option(200, "--queries"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Working-memory buffer add p99 and get_context p95 with N memory units behind recall."""
    from somnus.bench import run_context

    _emit(run_context(units=units, queries=queries), as_json)


@bench_app.command("sleep")
def bench_sleep(
    units: int = typer.Option(1_000_000, "--units"),
    agents: int = typer.Option(1000, "--agents"),
    repeat: int = typer.Option(1, "--repeat", help="Runs; the figures are their medians."),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """One deep sleep over N memory units captured by the memory fold: seconds, decisions, store bytes before/after."""
    from somnus.bench import run_sleep

    _emit(
        _medians(
            [run_sleep(units=units, agents=agents) for _ in range(repeat)],
            ("build_s", "sleep_s", "plan_apply_s", "write_s"),
        ),
        as_json,
    )


@bench_app.command("scn")
def bench_scn(
    memories: int = typer.Option(10_000, "--memories"), as_json: bool = typer.Option(False, "--json")
) -> None:
    """Bytes of the SCN temporal index for N episodes of the sample fleet."""
    from somnus.bench import run_scn_footprint

    _emit(run_scn_footprint(memories=memories), as_json)


@bench_app.command("cli")
def bench_cli(
    runs: int = typer.Option(7, "--runs", help="Runs of each command; the figures are medians."),
    sessions: int = typer.Option(40, "--sessions", help="Sample sessions projected before measuring."),
    baseline: Optional[list[str]] = typer.Option(
        None,
        "--baseline",
        help="NAME=FOLDER: another Somnus package folder (its parent on PYTHONPATH) "
        "measured interleaved with this one (repeatable).",
    ),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Start-to-exit time of `somnus --help`, `sql "select 1"`, `brief`, `recall` and `status` against a
    stack of its own (started on a temporary home and stopped after)."""
    from somnus.cli.bench_cli import run_cli_bench
    from somnus.cli.common import fail, note

    folders: dict[str, Path] = {}
    for b in baseline or []:
        name, _, folder = b.partition("=")
        if not name or not folder or not (Path(folder) / "somnus").is_dir():
            fail(f"--baseline {b!r}: give NAME=FOLDER, FOLDER holding a somnus package")
        folders[name] = Path(folder)
    _emit(run_cli_bench(runs=runs, sessions=sessions, baselines=folders, log=note), as_json)
