"""Deep sleep end to end: `somnus sleep` through the broker, the projector's memory fold, reports,
plot, and a replay that reaches the same decisions."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from datetime import datetime, timedelta

import duckdb
import pytest

from somnus.reads import ReadError, read
from somnus.sample import generate
from tests.pipeline import Pipeline, wait_until

pytestmark = pytest.mark.integration

SLEEP_TABLES = (
    "lifecycle_log",
    "sleep_runs",
    "memory_log",
    "memories",
    "semantic_requests",
    "semantic_log",
    "concepts",
    "promotion_audit",
)


def test_sleep_on_demand_decides_reports_and_replays_the_same(pipeline_settings, tmp_path):
    # hourly: the sample fleet's eight hours pass several fire times (each then requests promotion)
    p = Pipeline(dataclasses.replace(pipeline_settings, sleep_schedule="0 * * * *"))
    db = p.s.db_path
    env = {**p.s.as_env(), "KAFKA_BOOTSTRAP": p.boot}
    cli = [sys.executable, "-m", "somnus.cli"]
    try:
        p.start_all()
        events = list(generate(sessions=600, seed=12))
        when = [datetime.fromisoformat(e["ts"].replace("Z", "+00:00")) for e in events]
        # The sleep clock starts at the first memory record and advances record by record, so a worker
        # that put every unit in one record would pass no fire time: the first hour first, then the
        # rest (at least one later record, 6+ fire times).
        first_hour = min(when) + timedelta(hours=1)
        p.publish([e for e, t in zip(events, when) if t < first_hour])
        p.wait_idle()
        p.publish([e for e, t in zip(events, when) if t >= first_hour])
        p.wait_idle()
        last = max(when)
        at = (last + timedelta(days=10)).isoformat()
        run = subprocess.run(cli + ["sleep", "--at", at], env=env, capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, run.stderr
        wait_until(
            lambda: (
                read(db, "sql", sql="SELECT count(*) FROM sleep_runs WHERE trigger = 'on_demand'")["rows"][0][0] == 1
            ),
            timeout_s=60,
            what="the on-demand sleep run",
        )
        p.wait_idle()
        scheduled = read(
            db, "sql", sql="SELECT 'sleep:' || run_id FROM sleep_runs WHERE trigger = 'schedule' ORDER BY run_at"
        )["rows"]
        assert len(scheduled) >= 3
        # phase 2 of each scheduled run: the projector's promotion request, run once by the semantic fold
        # (the on-demand run's too, requested by the projector after the run, named for it)
        wait_until(
            lambda: (
                read(
                    db,
                    "sql",
                    sql="SELECT request_id FROM semantic_requests WHERE request_id IN ("
                    "SELECT 'sleep:' || run_id FROM sleep_runs WHERE trigger = 'schedule') "
                    "ORDER BY requested_at",
                )["rows"]
                == scheduled
            ),
            timeout_s=60,
            what="a promotion request per scheduled run",
        )
        wait_until(
            lambda: (
                read(
                    db,
                    "sql",
                    sql="SELECT count(*) FROM semantic_requests WHERE request_id IN ("
                    "SELECT 'sleep:' || run_id FROM sleep_runs WHERE trigger = 'on_demand')",
                )["rows"][0][0]
                == 1
            ),
            timeout_s=60,
            what="the on-demand run's promotion request",
        )
        decided = dict(read(db, "sql", sql="SELECT kind, count(*) FROM lifecycle_log GROUP BY 1")["rows"])
        assert decided.get("SleepCompleted") and decided.get("MemoryCompressed", 0) + decided.get("MemoryPruned", 0) > 0
        report = json.loads(
            subprocess.run(
                cli + ["sleep", "--report", "--json"], env=env, capture_output=True, text=True, timeout=60
            ).stdout
        )
        assert report[-1]["trigger"] == "on_demand" and report[-1]["report"]["narrative"]
        # --report joins the semantic layers' part of each run (written by the promotion fold)
        run_id = report[-1]["run_id"]
        wait_until(
            lambda: (
                read(db, "sql", sql="SELECT count(*) FROM sleep_layer_reports WHERE run_id = ?", params=[run_id])[
                    "rows"
                ][0][0]
                == 2
            ),
            timeout_s=60,
            what="the run's layer report",
        )
        report = json.loads(
            subprocess.run(
                cli + ["sleep", "--report", "--json"], env=env, capture_output=True, text=True, timeout=60
            ).stdout
        )
        assert {x["layer"] for x in report[-1]["layers"]} == {"atl", "angular_gyrus"}
        text = subprocess.run(cli + ["sleep", "--report"], env=env, capture_output=True, text=True, timeout=60).stdout
        assert "  atl: " in text and "  angular_gyrus: " in text and "  dreaming: clustered " in text
        png = tmp_path / "sleep.png"
        plot = subprocess.run(cli + ["sleep", "--plot", str(png)], env=env, capture_output=True, text=True, timeout=120)
        assert plot.returncode == 0, plot.stderr
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        st = json.loads(
            subprocess.run(cli + ["status", "--json"], env=env, capture_output=True, text=True, timeout=60).stdout
        )
        assert st["memory"]["last_consolidation"] is not None
        live = read(db, "checksum")["tables"]
        replay_db = tmp_path / "replayed.duckdb"
        run = subprocess.run(
            cli + ["replay", "--to", str(replay_db)], env=env, capture_output=True, text=True, timeout=300
        )
        assert run.returncode == 0, run.stderr
        replayed = json.loads(
            subprocess.run(
                cli + ["checksum", "--db", str(replay_db), "--json"],
                env=env,
                capture_output=True,
                text=True,
                timeout=120,
            ).stdout
        )
        for table in SLEEP_TABLES:
            assert replayed["tables"][table] == live[table], table
        # a projector that died between a batch and its requests asks again at start (here: forget them),
        # for every run, the on-demand one included
        every = read(db, "sql", sql="SELECT 'sleep:' || run_id FROM sleep_runs ORDER BY run_at")["rows"]
        p.stop_all()
        con = duckdb.connect(str(db))
        con.execute("DELETE FROM semantic_requests")
        con.close()
        p.start_all()

        def asked_again() -> bool:
            try:
                return (
                    read(db, "sql", sql="SELECT request_id FROM semantic_requests ORDER BY requested_at")["rows"]
                    == every
                )
            except ReadError:  # the projector is still opening the file
                return False

        wait_until(asked_again, timeout_s=180, what="the promotion requests asked again at start")
    finally:
        p.stop_all()
