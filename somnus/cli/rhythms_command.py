"""``somnus rhythms --oscillators`` and ``somnus bench oscillators``: the SCN's coupled oscillators."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer


def show_oscillators(agent: str, db: Path, agents_dir: Path | None, anomaly_min: float | None, as_json: bool) -> None:
    """Per pattern of ``agent``: r, the coupling eigenvalues, locks, the next expected recurrence and the
    stored anomalies (the ``/agents/{agent}/oscillators`` route)."""
    from rich.console import Console

    from somnus.cli.advise_command import read_or_exit

    got = read_or_exit(db, "oscillators", agent, agents_dir, anomaly_min=anomaly_min)
    if as_json:
        print(json.dumps(got))
        return
    console = Console()
    if not got:
        console.print(f"no oscillators for {agent}: they run when SOMNUS_OSCILLATORS is set (docs/concepts/rhythms.md)")
    for p in got:
        eig = ", ".join(f"{v:.3f}" for v in p["coupling"]["eigenvalues"])
        console.print(
            f"[bold]{p['kind']}[/bold]: {p['events']} events, r {p['coherence']:.3f}, eigenvalues [{eig}], "
            f"locked {', '.join(p['locked']) or 'none'}, next {p['next_recurrence'] or '-'}"
        )
        for a in p["anomalies"]:
            console.print(f"  anomaly {a['anomaly']:.3f} at {a['at']} ({a['memory_id']})")


def bench_oscillators_command(
    sessions: int = typer.Option(2000, "--sessions"),
    repeat: int = typer.Option(3, "--repeat", help="Runs; the figure is their median."),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """CPU per observed event of the SCN's coupled oscillators (SOMNUS_OSCILLATORS), on the sample fleet."""
    from somnus.bench.oscillators import run_oscillators

    result: dict[str, Any] = run_oscillators(sessions=sessions, repeat=repeat)
    print(json.dumps(result) if as_json else "\n".join(f"{k}: {v}" for k, v in result.items()))
