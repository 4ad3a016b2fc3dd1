"""The knowledge graph end to end: tau-bench through the real broker, Faust worker and projector."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter

import pytest

from somnus.importers import openai_chat
from somnus.reads import knowledge_store
from somnus.schemas.agents import AgentSpec
from tests.pipeline import Pipeline
from tests.tau_bench import raw_tau_counts, tau_group

pytestmark = pytest.mark.integration


def test_tau_bench_errors_become_error_entities_linked_to_their_tools(pipeline_settings, tau_bench_path):
    raw_errors, raw_calls, _ = raw_tau_counts(tau_bench_path)
    assert sum(raw_errors.values()) == 73
    p = Pipeline(pipeline_settings)
    try:
        p.start_all()
        events = list(openai_chat(tau_bench_path, agent="airline"))
        p.publish(events)
        p.wait_idle()
        store = knowledge_store(p.s.db_path, {"airline": AgentSpec(name="airline")})  # via the projector
        failed = store.facts("airline", predicate="failed_with", limit=10_000)
        entities = {e.entity_id: e for e in store.entities("airline", limit=10_000)}
        got: Counter = Counter()
        classes: dict[tuple[str, str], set[str]] = {}
        for f in failed:
            tool = entities[f.source]
            error = entities[f.target]
            assert tool.type == "tool" and error.type == "error"
            key = (tool.name, tau_group(error.attributes["example"]))
            got[key] += f.count
            classes.setdefault(key, set()).add(f.target)
        assert got == raw_errors
        # one error entity per kind of error: never two for the same error of the same tool
        assert all(len(v) == 1 for v in classes.values()), classes
        for tool in ("update_reservation_flights", "book_reservation"):
            assert any(k[0] == tool for k in got)
        # every tool is one entity, and `airline uses tool` counts every call
        uses = {entities[f.target].name: f.count for f in store.facts("airline", predicate="uses", limit=1000)}
        assert uses == dict(raw_calls)
        names = [(e.type, e.name) for e in entities.values()]
        assert len(names) == len(set(names))
        # somnus inspect shows the same, readable and as JSON
        env = {**p.s.as_env(), "KAFKA_BOOTSTRAP": p.boot}
        out = subprocess.run(
            [sys.executable, "-m", "somnus.cli", "inspect", "airline", "--json"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert out.returncode == 0, out.stderr
        report = json.loads(out.stdout)
        assert report["scope_chain"] == ["agent:airline", "global"]
        assert len(report["episodes"]) == 10 and report["facts"] and report["entities"]
        text = subprocess.run(
            [sys.executable, "-m", "somnus.cli", "inspect", "airline"],
            env={**env, "COLUMNS": "300"},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert text.returncode == 0, text.stderr
        assert "facts in scope" in text.stdout and "tool:book_reservation" in text.stdout
    finally:
        p.stop_all()
