"""Semantic memory and promotion end to end: tau-bench through the real pipeline, `somnus consolidate`,
`somnus ingest-knowledge`, and a replay that rebuilds the same concepts and edges."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from somnus.importers import openai_chat
from somnus.reads import read
from somnus.schemas.episodes import episode_id_for
from tests.pipeline import Pipeline, wait_until
from tests.tau_bench import tau_group

pytestmark = pytest.mark.integration

SEMANTIC_TABLES = (
    "semantic_log",
    "concepts",
    "concept_relationships",
    "math_patterns",
    "cross_layer_edges",
    "promotion_audit",
)


def _failing_episodes(path, tool: str, min_observations: int = 3) -> tuple[set[str], set[str]]:
    """From the raw file: the episodes (ids as the distiller derives them) in which ``tool`` failed
    with a kind of error seen at least ``min_observations`` times (the candidates promotion takes),
    and the episodes in which it failed at all."""
    by_group: dict[str, set[str]] = {}
    calls: dict[str, int] = {}
    for t in json.loads(path.read_bytes()):
        names = {}
        episode = str(episode_id_for("airline", f"{path.stem}-task{t['task_id']}-trial{t['trial']}"))
        for m in t["traj"]:
            for tc in m.get("tool_calls") or []:
                names[tc["id"]] = tc["function"]["name"]
            if (
                m["role"] == "tool"
                and (m.get("content") or "").startswith("Error")
                and (m.get("name") or names[m["tool_call_id"]]) == tool
            ):
                group = tau_group(m["content"].strip())
                by_group.setdefault(group, set()).add(episode)
                calls[group] = calls.get(group, 0) + 1
    promoted = {e for g, eps in by_group.items() if calls[g] >= min_observations for e in eps}
    return promoted, {e for eps in by_group.values() for e in eps}


def test_unreliable_calls_become_concepts_derived_from_the_failing_episodes_and_replay_agrees(
    pipeline_settings, tau_bench_path, tmp_path
):
    p = Pipeline(pipeline_settings)
    db = p.s.db_path
    env = {**p.s.as_env(), "KAFKA_BOOTSTRAP": p.boot}
    cli = [sys.executable, "-m", "somnus.cli"]
    try:
        p.start_all()
        p.publish(list(openai_chat(tau_bench_path, agent="airline")))
        p.wait_idle()
        run = subprocess.run(
            cli + ["consolidate", "--at", "2024-05-20T00:00:00+00:00"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert run.returncode == 0, run.stderr
        doc = tmp_path / "kb.md"
        doc.write_text("## coffee mug\ncategory: object\nA container for hot drinks.\nIS_A: container\n")
        run = subprocess.run(cli + ["ingest-knowledge", str(doc)], env=env, capture_output=True, text=True, timeout=60)
        assert run.returncode == 0, run.stderr
        other = tmp_path / "kb2.md"  # another document naming the same concept differently: reinforced, not new
        other.write_text("## coffee_mug\nA mug.\n")
        subprocess.run(cli + ["ingest-knowledge", str(other)], env=env, capture_output=True, text=True, timeout=60)
        wait_until(
            lambda: (
                read(db, "sql", sql="SELECT count(*) FROM concepts WHERE name LIKE 'coffee%'")["rows"][0][0] >= 1
                and read(db, "sql", sql="SELECT max(reinforcement_count) FROM concepts WHERE name LIKE 'coffee%'")[
                    "rows"
                ][0][0]
                == 2
            ),
            timeout_s=60,
            what="the ingested concept, reinforced once",
        )
        p.wait_idle()
        for tool in ("book_reservation", "update_reservation_flights"):
            rows = read(
                db,
                "sql",
                sql="SELECT concept_id, provenance FROM concepts WHERE name = ?",
                params=[f"{tool}_unreliable"],
            )["rows"]
            assert rows, f"no concept about {tool}'s failures"
            concept_id = rows[0][0]
            derived = {
                r[0]
                for r in read(
                    db,
                    "sql",
                    sql=("SELECT target_id FROM cross_layer_edges WHERE source_id = ? AND edge_type = 'DERIVED_FROM'"),
                    params=[concept_id],
                )["rows"]
            }
            expected, failing = _failing_episodes(tau_bench_path, tool)
            assert derived == expected  # the episodes of every kind of failure that became a candidate
            assert derived <= failing
            instances = {
                r[0]
                for r in read(
                    db,
                    "sql",
                    sql=("SELECT source_id FROM cross_layer_edges WHERE target_id = ? AND edge_type = 'INSTANCE_OF'"),
                    params=[concept_id],
                )["rows"]
            }
            assert instances == derived
        gate = read(
            db,
            "sql",
            sql="SELECT DISTINCT reason FROM promotion_audit WHERE promoted AND "
            "pattern_name LIKE 'book_reservation → error:%'",
        )["rows"]
        assert gate and all("binomial" in r[0] for r in gate)  # failures passed on their counts
        assert read(db, "sql", sql="SELECT count(*) FROM concepts WHERE name LIKE 'coffee%'")["rows"][0][0] == 1
        known = read(db, "knowledge_context", "airline", agents_dir=p.s.agents_dir, query="book reservation fails")
        assert any("book_reservation_unreliable" in k["text"] for k in known)
        brief = read(db, "briefing", "airline", agents_dir=p.s.agents_dir)["briefing"]["markdown"]
        knowledge = brief.split("### Key Knowledge", 1)[1].splitlines()
        # the agent's own facts lead Key Knowledge (issue 26); concepts of wider scopes come after them
        assert knowledge[1].startswith("- ") and not knowledge[1].startswith('- "') and "(confidence " in knowledge[1]
        live = read(db, "checksum")["tables"]
        replay_db = tmp_path / "replayed.duckdb"
        run = subprocess.run(
            cli + ["replay", "--to", str(replay_db)], env=env, capture_output=True, text=True, timeout=300
        )
        assert run.returncode == 0, run.stderr
        replayed = json.loads(
            subprocess.run(
                cli + ["checksum", "--db", str(replay_db), "--tables", "--json"],
                env=env,
                capture_output=True,
                text=True,
                timeout=120,
            ).stdout
            or "{}"
        )
        for table in SEMANTIC_TABLES:
            assert replayed["tables"][table] == live[table], table
    finally:
        p.stop_all()
