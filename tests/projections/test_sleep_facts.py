"""Fact retirement during sleep (issue 29 item 6): a live triple neither reinforced nor used for 90
days of its scope's stream time is closed with a ``retired`` row in ``triple_history``, never
deleted, and leaves ``facts_top`` and the briefing. Event time only (the facts are of 2024; the wall
clock would retire every one of them)."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone

import duckdb
import pytest

from somnus.processors.briefing.generator import select_facts
from somnus.processors.sleep.config import SleepConfig
from somnus.projections import queries, schema
from somnus.projections.writer import ReadModels, Topics, apply_batch, load_offsets
from somnus.schemas.codec import encode
from somnus.schemas.facts import FACTS_SCHEMA_VERSION, FactAsserted, FactsExtracted
from somnus.schemas.lifecycle import KIND_SLEEP, SleepRequested
from somnus.schemas.memory import KIND_UNITS, MemoryKind, MemoryUnit
from tests.factories import Rec

TOPICS = Topics("traces", "episodes", "dead-letters", "facts", "link-updates", "memory")
T0 = datetime(2024, 3, 4, 10, tzinfo=timezone.utc)
DAY = timedelta(days=1)
AGENT = "support"


def fact(i: int, at: datetime, source: str, target: str) -> Rec:
    fx = FactsExtracted(
        schema_version=FACTS_SCHEMA_VERSION,
        episode_id=uuid.UUID(int=i + 1),
        agent=AGENT,
        observed_at=at,
        extractor="trace/1",
        facts=[
            FactAsserted(
                source=source,
                source_type="api",
                predicate="rate_limit",
                target=target,
                target_type="rate",
                confidence=0.9,
                functional=True,
            )
        ],
    )
    return Rec("facts", 0, i, encode(fx))


def units(offset: int, at: datetime) -> Rec:
    u = MemoryUnit(
        memory_id=f"u-{offset}",
        kind=MemoryKind.EPISODE,
        agent=AGENT,
        run_id=f"r-{offset}",
        occurred_at=at,
        perception=f"checked the api limits, pass {offset}",
        scope=f"agent:{AGENT}",
    )
    return Rec(
        "memory",
        0,
        offset,
        encode([u]),
        headers=[("somnus-kind", KIND_UNITS)],
        timestamp=int(at.timestamp() * 1000) + 1000,
    )


def sleep_at(offset: int, at: datetime) -> Rec:
    return Rec(
        "memory", 0, offset, encode(SleepRequested(at=at, requested_by="test")), headers=[("somnus-kind", KIND_SLEEP)]
    )


def project(tmp_path, name: str, batches, config: SleepConfig, restart_each_batch: bool = False):
    con = duckdb.connect(str(tmp_path / name))
    schema.init(con)
    seen = ReadModels(con, None, config)
    for batch in batches:
        if restart_each_batch:
            seen = ReadModels(con, None, config)
        apply_batch(con, TOPICS, batch, load_offsets(con), 1 << 20, seen)
    return con, seen


def history(con) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for target, change in con.execute(
        "SELECT t.target, h.change FROM triple_history h JOIN triples t USING (triple_id) ORDER BY h.ordinal"
    ).fetchall():
        out.setdefault(target, []).append(change)
    return out


def scenario(at_sleep: datetime):
    # "idle": asserted on day 0, never again. "kept": asserted on day 0, reinforced on day 60.
    return [
        [fact(0, T0, "api.idle.com", "1s"), fact(1, T0, "api.kept.com", "2s")],
        [fact(2, T0 + 60 * DAY, "api.kept.com", "2s")],
        [units(0, T0), units(1, at_sleep - DAY), sleep_at(2, at_sleep)],
    ]


def test_a_fact_idle_for_90_days_of_stream_time_is_retired_and_leaves_facts_top(tmp_path):
    at = T0 + 100 * DAY
    con, seen = project(tmp_path, "retire.duckdb", scenario(at), SleepConfig(schedule="off"))
    assert history(con) == {"rate:1s": ["asserted", "retired"], "rate:2s": ["asserted", "reinforced"]}
    rows = dict(con.execute("SELECT target, valid_to FROM triples").fetchall())
    assert rows["rate:1s"] == at and rows["rate:2s"] is None  # closed at the run's time, never deleted
    assert [t for (t,) in con.execute("SELECT target FROM facts_top").fetchall()] == ["rate:2s"]
    assert [f.target for f in seen.top_facts.best([f"agent:{AGENT}"], 10, 0.0)] == ["rate:2s"]
    body = con.execute("SELECT body FROM lifecycle_log WHERE kind = 'TripleRetired'").fetchall()
    assert len(body) == 1 and '"reason":"idle"' in body[0][0]
    report = con.execute("SELECT report->>'triples_retired' FROM sleep_runs").fetchone()[0]
    assert report == "1"
    # the briefing's facts (what render_many gives briefing_for: facts_top in memory, the scope chain's
    # facts active at the briefing's time) no longer hold the retired one
    chain = [f"agent:{AGENT}", "global"]
    rows = [f for s in chain for f in seen.top_facts.by_scope.get(s, ())]
    assert [f.source for f in select_facts(AGENT, {}, rows, at)] == ["api:api.kept.com"]


def test_event_time_not_the_wall_clock_decides(tmp_path):
    # 80 days of stream time: nothing is idle long enough, though both facts are years old by the wall clock
    con, _ = project(tmp_path, "young.duckdb", scenario(T0 + 80 * DAY), SleepConfig(schedule="off"))
    assert "retired" not in {c for changes in history(con).values() for c in changes}
    # switched off (SOMNUS_FACT_RETIRE_DAYS=0): never
    off, _ = project(tmp_path, "off.duckdb", scenario(T0 + 400 * DAY), SleepConfig(schedule="off", fact_retire_days=0))
    assert "retired" not in {c for changes in history(off).values() for c in changes}


def test_a_used_fact_is_not_idle(tmp_path):
    at = T0 + 100 * DAY
    batches = scenario(at)
    con, _ = project(tmp_path, "used.duckdb", batches[:2], SleepConfig(schedule="off"))
    (tid,) = con.execute("SELECT triple_id::VARCHAR FROM triples WHERE target = 'rate:1s'").fetchone()
    con.execute(
        "INSERT INTO fact_uses VALUES (?, 's1', 'b1', ?, 'api.idle.com', 'rate_limit', 'rate:1s', "
        "'agent:support', 0.9, NULL, ?, 0)",
        [AGENT, tid, T0 + 50 * DAY],
    )
    seen = ReadModels(con, None, SleepConfig(schedule="off"))
    apply_batch(con, TOPICS, batches[2], load_offsets(con), 1 << 20, seen)
    assert "retired" not in {c for changes in history(con).values() for c in changes}


def test_a_retired_fact_asserted_again_is_a_new_triple_live_and_after_a_restart(tmp_path):
    at = T0 + 100 * DAY
    again = [fact(3, at + DAY, "api.idle.com", "1s")]
    live, _ = project(tmp_path, "live.duckdb", [*scenario(at), again], SleepConfig(schedule="off"))
    restarted, _ = project(
        tmp_path, "restart.duckdb", [*scenario(at), again], SleepConfig(schedule="off"), restart_each_batch=True
    )
    got = live.execute("SELECT target, valid_to IS NULL FROM triples ORDER BY valid_from, target").fetchall()
    assert got == [("rate:1s", False), ("rate:2s", True), ("rate:1s", True)]
    a, b = queries.table_checksums(live), queries.table_checksums(restarted)
    for table in ("triples", "triple_history", "lifecycle_log"):
        assert a[table] == b[table], table


@pytest.mark.parametrize("days", [90.0])
def test_the_window_is_the_configured_one(days):
    assert SleepConfig().fact_retire_days == days
