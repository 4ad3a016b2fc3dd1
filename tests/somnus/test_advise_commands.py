"""``somnus advise``, ``somnus rhythms --oscillators`` and ``somnus bench advise`` on real DuckDB files."""

from __future__ import annotations

import json

import duckdb
import pytest
from typer.testing import CliRunner

from somnus import cli
from somnus.bench.advise import project, run_advise, sample_episodes
from tests.projections.test_oscillator_readings import daily_with_a_planted_anomaly
from tests.projections.test_oscillator_readings import project as project_units


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    eps = sample_episodes(120, seed=3)
    path = tmp_path_factory.mktemp("cli") / "fleet.duckdb"
    con = duckdb.connect(str(path))
    project(con, eps)
    con.close()
    return path, eps


def test_advise_prints_json_with_provenance_and_text(fleet, tmp_path):
    path, eps = fleet
    ep = next(e for e in eps if e.task)
    args = ["advise", "--agent", ep.agent, "--task", ep.task, "--db", str(path), "--home", str(tmp_path)]
    got = CliRunner().invoke(cli.app, [*args, "--json"])
    assert got.exit_code == 0, got.output
    advice = json.loads(got.output)
    assert advice["agent"] == ep.agent and advice["related"] >= 1
    assert str(ep.episode_id) in {i for s in advice["planning"] for i in s["episode_ids"]} | set(
        advice["escalation"]["episode_ids"]
    )
    text = CliRunner().invoke(cli.app, args)
    assert text.exit_code == 0 and "related past episodes" in text.output


def test_advise_without_a_task_is_a_clear_error(fleet, tmp_path):
    path, eps = fleet
    got = CliRunner().invoke(
        cli.app, ["advise", "--agent", eps[0].agent, "--task", " ", "--db", str(path), "--home", str(tmp_path)]
    )
    assert got.exit_code == 1 and "task" in got.output


def test_rhythms_oscillators_shows_the_planted_anomaly(tmp_path):
    project_units(tmp_path / "o.duckdb", daily_with_a_planted_anomaly()).close()
    got = CliRunner().invoke(
        cli.app,
        ["rhythms", "--agent", "nightly", "--oscillators", "--db", str(tmp_path / "o.duckdb"), "--home", str(tmp_path)],
    )
    assert got.exit_code == 0, got.output
    assert "eigenvalues" in got.output and "anomaly 1.000 at 2024-02-10T21:00:00" in got.output


def test_bench_advise_reports_latency_figures():
    got = run_advise(sessions=60, queries=40, seed=1)
    assert got["episodes"] == 60 and got["queries"] == 40
    assert 0 < got["p50_ms"] <= got["p95_ms"] <= got["p99_ms"] and got["cold_p50_ms"] > 0
    assert got["with_strategy"] > 0
