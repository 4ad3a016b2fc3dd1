"""Knowledge utilisation and promotion by use, folded from the facts topic (real DuckDB; no broker)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import duckdb
import msgspec

from somnus.projections import schema
from somnus.projections.writer import ReadModels, Topics, apply_batch, load_offsets
from somnus.schemas.agents import AgentSpec, LearningRate
from somnus.schemas.briefing import KIND_SERVED, BriefingServed, ServedFact
from somnus.schemas.codec import encode
from somnus.schemas.episodes import episode_id_for
from somnus.schemas.facts import EntityMention, FactAsserted, FactsExtracted
from tests.factories import Rec

TOPICS = Topics("traces", "episodes", "dead-letters", "facts")
T0 = datetime(2024, 6, 3, 9, tzinfo=timezone.utc)


def _fleet(rate: LearningRate) -> dict[str, AgentSpec]:
    return {
        "lead": AgentSpec(name="lead", learning_rate=rate),
        "a": AgentSpec(name="a", reports_to="lead", learning_rate=rate),
        "b": AgentSpec(name="b", reports_to="lead", learning_rate=rate),
        "c": AgentSpec(name="c", reports_to="lead", learning_rate=rate),
        "ops": AgentSpec(name="ops", learning_rate=rate),
    }


def _extracted(agent: str, session: str, at: datetime, assert_fact: bool) -> FactsExtracted:
    facts = (
        [
            FactAsserted(
                source="api.x.io",
                source_type="api",
                predicate="rate_limit",
                target="10/s",
                target_type="rate",
                confidence=0.95,
            )
        ]
        if assert_fact
        else []
    )
    return FactsExtracted(
        schema_version=1,
        episode_id=episode_id_for(agent, session),
        agent=agent,
        observed_at=at,
        extractor="trace/1",
        entities=[EntityMention(name="api.x.io", type="api"), EntityMention(name="http_get", type="tool")],
        facts=facts,
    )


def _served(con, agent: str, session: str, at: datetime) -> BriefingServed:
    tid = con.execute(
        "SELECT triple_id::VARCHAR FROM triples WHERE scope = ? AND predicate = 'rate_limit'", [f"agent:{agent}"]
    ).fetchone()[0]
    fact = ServedFact(
        triple_id=tid,
        source="api:api.x.io",
        predicate="rate_limit",
        target="rate:10/s",
        scope=f"agent:{agent}",
        confidence=0.95,
        source_name="api.x.io",
        target_name="10/s",
    )
    return BriefingServed(
        schema_version=1, briefing_id=f"b-{agent}", agent=agent, session_id=session, served_at=at, facts=[fact]
    )


def _run(tmp_path, rate: LearningRate, users: list[str]):
    con = duckdb.connect(str(tmp_path / f"{rate.value}-{len(users)}.duckdb"))
    schema.init(con)
    seen = ReadModels(con, _fleet(rate))
    off = [0]

    def send(value: bytes, headers=None) -> None:
        apply_batch(con, TOPICS, [Rec("facts", 0, off[0], value, headers=headers)], load_offsets(con), 1 << 20, seen)
        off[0] += 1

    for i, agent in enumerate(users + ["ops"]):  # each learns the fact in its own scope first
        send(encode(_extracted(agent, f"{agent}-learn", T0 + timedelta(hours=i), True)))
    for i, agent in enumerate(users):  # then is served a briefing showing it, and its next session acts on the API
        session = f"{agent}-next"
        send(encode(_served(con, agent, session, T0 + timedelta(days=1))), [("somnus-kind", KIND_SERVED)])
        send(encode(_extracted(agent, session, T0 + timedelta(days=1, hours=i), False)))
    return con


def test_a_fact_used_by_two_teammates_is_promoted_to_their_team_at_a_moderate_rate(tmp_path):
    con = _run(tmp_path, LearningRate.MODERATE, ["a", "b"])
    uses = con.execute("SELECT agent, entity FROM fact_uses ORDER BY agent").fetchall()
    assert uses == [("a", "api.x.io"), ("b", "api.x.io")]
    promoted = con.execute("SELECT reason, to_scope, users, threshold, learning_rate FROM promotions").fetchall()
    assert promoted == [("utilisation", "team:lead", ["a", "b"], 2, "moderate")]
    scopes = {r[0] for r in con.execute("SELECT scope FROM triples WHERE predicate = 'rate_limit'").fetchall()}
    assert "team:lead" in scopes and "global" not in scopes  # the team now holds it; ops (no team) does not


def test_thresholds_follow_the_learning_rate(tmp_path):
    assert con_promotions(_run(tmp_path, LearningRate.CONSERVATIVE, ["a", "b"])) == []  # needs 3 teammates
    assert con_promotions(_run(tmp_path, LearningRate.CONSERVATIVE, ["a", "b", "c"])) == ["team:lead"]
    assert con_promotions(_run(tmp_path, LearningRate.AGGRESSIVE, ["a"])) == ["team:lead"]  # one is enough


def con_promotions(con) -> list[str]:
    return [r[0] for r in con.execute("SELECT to_scope FROM promotions WHERE reason = 'utilisation'").fetchall()]


def test_the_fold_continues_after_a_restart_and_a_redelivered_use_counts_once(tmp_path):
    con = _run(tmp_path, LearningRate.CONSERVATIVE, ["a", "b"])
    state = dict(con.execute("SELECT statement, state FROM promotion_state").fetchall())
    assert len(state) == 1 and msgspec.json.decode(next(iter(state.values())))["tallies"]["team:lead"]["users"] == [
        "a",
        "b",
    ]
    seen = ReadModels(con, _fleet(LearningRate.CONSERVATIVE))  # a restarted projector
    n = load_offsets(con)[("facts", 0)]
    again = Rec("facts", 0, n, encode(_extracted("b", "b-next", T0 + timedelta(days=2), False)))  # re-emitted
    apply_batch(con, TOPICS, [again], load_offsets(con), 1 << 20, seen)
    assert con.execute("SELECT count(*) FROM fact_uses").fetchone()[0] == 2
