"""Goals end to end: `somnus goal set` through the broker, the projector's goals fold, the read routes
over HTTP (`goal list`, `wander`, recall), `goal done`, and a replay that folds the same goals."""

from __future__ import annotations

import json

import pytest

from somnus.reads import read
from somnus.sample import generate
from tests.pipeline import Pipeline, wait_until

pytestmark = pytest.mark.integration


def test_a_goal_set_by_the_cli_is_measured_read_closed_and_replayed(pipeline_settings, tmp_path):
    p = Pipeline(pipeline_settings)
    db = p.s.db_path
    run = p.cli
    try:
        p.start_all()
        p.publish(list(generate(sessions=120, seed=5)))
        p.wait_idle()
        run("goal", "set", "extract the pricing table from the vendor site", "--agent", "scraper", "--id", "g1")
        run("goal", "set", "a goal no memory is near: quantum basket weaving", "--agent", "scraper", "--id", "g2")
        wait_until(
            lambda: read(db, "sql", sql="SELECT count(DISTINCT goal_id) FROM goals")["rows"][0][0] == 2,
            timeout_s=60,
            what="both goals folded",
        )
        goals = {g["goal_id"]: g for g in json.loads(run("goal", "list", "--agent", "scraper", "--json"))["goals"]}
        assert goals["g1"]["forward_pe"] < 0.8 and goals["g1"]["nearest_id"]
        assert goals["g2"]["forward_pe"] == 1.0 and goals["g2"]["nearest_id"] is None
        walk = json.loads(run("wander", "--agent", "scraper", "--seed", "4", "--json"))
        assert len(walk["steps"]) == 10 and walk["goals"] == ["g1", "g2"]
        assert any("goal_adjacent" in s["reasons"] for s in walk["steps"])
        assert walk == json.loads(run("wander", "--agent", "scraper", "--seed", "4", "--json"))
        run("goal", "done", "g1", "--agent", "scraper")
        wait_until(
            lambda: read(db, "sql", sql="SELECT count(*) FROM goals WHERE status = 'done'")["rows"][0][0] == 1,
            timeout_s=60,
            what="g1 closed",
        )
        assert [g["goal_id"] for g in json.loads(run("goal", "list", "--agent", "scraper", "--json"))["goals"]] == [
            "g2"
        ]
        live = read(db, "checksum")["tables"]["goals"]
        replay_db = tmp_path / "replayed.duckdb"
        run("replay", "--to", str(replay_db))
        replayed = json.loads(run("checksum", "--db", str(replay_db), "--json"))
        assert replayed["tables"]["goals"] == live
    finally:
        p.stop_all()
