"""somnus.projections.queries: the stream time of a scope (what a person's command is stamped with)."""

from __future__ import annotations

from datetime import datetime, timezone

import duckdb
import pytest

from somnus.projections import queries, schema
from somnus.schemas.agents import AgentSpec


def test_the_stream_time_of_a_scope_is_the_newest_event_of_its_agents(tmp_path):
    con = duckdb.connect(str(tmp_path / "s.duckdb"))
    schema.init(con)
    t = lambda d: datetime(2024, 5, d, 12, tzinfo=timezone.utc)  # noqa: E731
    for i, (agent, day) in enumerate((("a", 3), ("a", 5), ("b", 9), ("lead", 20), ("stranger", 1))):
        con.execute(
            "INSERT INTO events VALUES (uuid(), 1, ?, ?, 's', ?, 'session_start', '{}', 0, ?, 0)", [t(day), agent, i, i]
        )
    agents = {
        "lead": AgentSpec(name="lead"),
        "a": AgentSpec(name="a", reports_to="lead"),
        "b": AgentSpec(name="b", reports_to="lead"),
    }

    def at(scope: str) -> str | None:
        return queries.stream_time(con, agents, scope)["at"]

    assert at("agent:a") == t(5).isoformat()  # its own newest, whatever other agents did later
    assert at("team:lead") == t(9).isoformat()  # the team's members: a and b (the lead reports to nobody)
    assert at("global") == t(20).isoformat()
    assert at("agent:nobody") is None and at("team:nobody") is None
    with pytest.raises(ValueError, match="scope"):
        at("agent:")


def test_a_sleep_run_whose_promotion_request_is_not_folded_is_pending_work(tmp_path):
    """A sleep's promotion request waits until the pipeline has caught up (docs/design/scale-out.md,
    cause 3): until it is folded, ``somnus status`` must not call the pipeline idle."""
    con = duckdb.connect(str(tmp_path / "s.duckdb"))
    schema.init(con)
    at = datetime(2024, 5, 3, 3, tzinfo=timezone.utc)
    assert queries.summary(con)["pending_promotions"] == 0
    con.execute(
        "INSERT INTO sleep_runs (run_id, run_at, trigger) VALUES ('r1', ?, 'schedule'), ('r2', ?, 'schedule')", [at, at]
    )
    assert queries.summary(con)["pending_promotions"] == 2
    con.execute("INSERT INTO semantic_requests VALUES ('sleep:r1', 'global', ?, 7)", [at])
    assert queries.summary(con)["pending_promotions"] == 1
